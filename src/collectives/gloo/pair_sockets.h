// The TCP sockets under a gloo context's pairs: their send buffers, and shutting them down.
//
// Gloo's class-based algorithms (halving_doubling, ring_chunked) send through its TCP Pair::send,
// which sets SO_SNDBUF to the largest message the pair has sent so far. Setting SO_SNDBUF turns
// the kernel's autotuning off for good: after halving-doubling allreduces of 4 to 64 KB a pair's
// send buffer stayed at 64 KB, and allreduces of 256 KB to 16 MB through gloo's option-based
// algorithms on the same pairs then stalled 40 ms at a time on delayed acknowledgements (48-310
// ms instead of 0.3-13 ms; 2 ranks over loopback TCP, bench/allreduce_bench.sh). So after a
// class-based algorithm's first run the pairs' send buffers go back up to autotuning's maximum
// (net.ipv4.tcp_wmem's third value; without CAP_NET_ADMIN the kernel holds it to
// net.core.wmem_max). Gloo also keeps a pair's socket to itself, and a class-based algorithm's
// waits cannot be aborted: shutting the sockets down makes them fail, as a peer's crash would.
//
// A context's sockets are found as those the process had after connecting it and not before. A
// socket another thread opened meanwhile is counted too, which does it no harm while it lives:
// each is known by its inode as well, so that a number the kernel hands out again after it
// closed is left alone.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <sys/types.h>

#include <memory>
#include <set>
#include <vector>

namespace dtrain::collectives {

struct PairSocket {
  int fd = -1;
  ino_t inode = 0;
};

// The file descriptors of this process's sockets.
std::set<int> OpenSockets();

// The connected TCP sockets open now that were not in `before`.
std::vector<PairSocket> NewTcpSockets(const std::set<int>& before);

// Connects `context`'s full mesh over `device` (gloo's connectFullMesh, whose exceptions pass
// through) and returns the sockets that connecting it opened.
std::vector<PairSocket> ConnectFullMesh(gloo::rendezvous::Context& context,
                                        gloo::rendezvous::Store& store,
                                        std::shared_ptr<gloo::transport::Device>& device);

// Raises each socket's send buffer to autotuning's maximum where it is below.
void WidenSendBuffers(const std::vector<PairSocket>& sockets);

// Shuts each socket down both ways (the pairs' waits then fail).
void ShutDown(const std::vector<PairSocket>& sockets);

}  // namespace dtrain::collectives
