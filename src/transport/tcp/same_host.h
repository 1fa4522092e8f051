// Same-host fast path: bodies copied straight between two processes' memory.
//
// Over loopback TCP every byte is copied twice (sender into the kernel, kernel into the receiver)
// and pays for the TCP stack on the way. When both ends of a stream are processes on the same host
// (same kernel boot, same network and pid namespaces), the kernel confirms that the pid the sender
// names holds the connection, and the receiver may read that process's memory (checked with a
// probe at connection time), the sender writes only a descriptor (address,
// token) and the receiver pulls the body with one process_vm_readv (Linux cross-memory attach,
// as OpenMPI's shared-memory transport does for large messages): one copy, no TCP segments. The
// receiver acknowledges each token on the same connection so the sender knows when it may release
// the buffer.
//
// This is no Transport of its own but an option inside TcpTransport (TcpOptions::same_host_direct,
// DTRAIN_SAME_HOST, on by default): the TCP connection stays, the handshake decides per stream
// (direct=0|1 in the welcome), and control messages and bodies under 64 KiB still travel inline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::transport::same_host {

// What a connecting process says about itself: "dtrain-hello 1 <pid> <host-id> <probe-address>
// <probe-text>".
std::string EncodeHello();

// The two ends of an accepted TCP connection, IPv4 addresses and ports in host byte order.
struct ConnectionEnds {
  uint32_t peer_address = 0;  // the connecting side
  uint16_t peer_port = 0;
  uint32_t our_address = 0;  // ours (the accepted socket's local end)
  uint16_t our_port = 0;
};

// Parses a hello and decides whether we can read the sender's memory. The pid the hello names is
// not taken on its word: the kernel must say that this process holds the connecting end of
// `connection` (its socket's inode, from /proc/net/tcp, among the process's descriptors), and the
// probe must then read back exactly. Returns the sender's pid if so, 0 if not (or if the hello is
// malformed): the stream then carries bodies inline.
int ProbeHello(const std::string& hello, const ConnectionEnds& connection);

// True if process `pid` holds the socket at the connecting end of `connection`.
bool HoldsConnection(int pid, const ConnectionEnds& connection);

// Copies `size` bytes from address `remote` of process `pid` into `dst`. Returns false (errno set)
// if the memory cannot be read.
bool ReadRemote(int pid, uint64_t remote, char* dst, size_t size);

}  // namespace dtrain::transport::same_host
