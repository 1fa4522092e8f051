#include "transport/tcp/same_host.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "common/host_id.h"

namespace dtrain::transport::same_host {
namespace {

std::string ReadLink(const char* path) {
  char buf[256];
  ssize_t n = readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string("?");
}

// A buffer the peer reads back during the handshake to prove it can read our memory.
struct Probe {
  Probe() {
    std::random_device rd;
    std::ostringstream s;
    s << std::hex << rd() << rd() << rd() << rd();
    text = s.str();
  }
  std::string text;
};

const Probe& TheProbe() {
  static const Probe probe;
  return probe;
}

}  // namespace

std::string EncodeHello() {
  const Probe& p = TheProbe();
  std::ostringstream s;
  s << "dtrain-hello 1 " << getpid() << " " << HostId() << " "
    << reinterpret_cast<uint64_t>(p.text.data()) << " " << p.text;
  return s.str();
}

namespace {

// The inode of the socket whose local end is (address, port) and remote end (remote, remote_port),
// from /proc/net/tcp (this network namespace's IPv4 sockets); 0 if there is none. The file prints
// addresses as the kernel stores them (network order read as a native u32) and ports in host order.
uint64_t SocketInode(uint32_t address, uint16_t port, uint32_t remote, uint16_t remote_port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the column names
  char want_local[32], want_remote[32];
  std::snprintf(want_local, sizeof want_local, "%08X:%04X", htonl(address), port);
  std::snprintf(want_remote, sizeof want_remote, "%08X:%04X", htonl(remote), remote_port);
  while (std::getline(table, line)) {
    std::istringstream in(line);
    std::string slot, local, rem, state, queues, timer, retransmits, uid, timeout;
    uint64_t inode = 0;
    if (!(in >> slot >> local >> rem >> state >> queues >> timer >> retransmits >> uid >> timeout >>
          inode)) {
      continue;
    }
    if (local == want_local && rem == want_remote) return inode;
  }
  return 0;
}

}  // namespace

bool HoldsConnection(int pid, const ConnectionEnds& c) {
  const uint64_t inode = SocketInode(c.peer_address, c.peer_port, c.our_address, c.our_port);
  if (inode == 0) return false;
  const std::string wanted = "socket:[" + std::to_string(inode) + "]";
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* fds = ::opendir(dir.c_str());
  if (fds == nullptr) return false;  // gone, or not ours to look at
  bool found = false;
  while (dirent* entry = ::readdir(fds)) {
    if (entry->d_name[0] == '.') continue;
    if (ReadLink((dir + "/" + entry->d_name).c_str()) == wanted) {
      found = true;
      break;
    }
  }
  ::closedir(fds);
  return found;
}

int ProbeHello(const std::string& hello, const ConnectionEnds& connection) {
  std::istringstream in(hello);
  std::string tag, host, text;
  int version = 0;
  long pid = 0;
  uint64_t address = 0;
  if (!(in >> tag >> version >> pid >> host >> address >> text)) return 0;
  if (tag != "dtrain-hello" || version != 1 || pid <= 0 || host != HostId()) return 0;
  if (text.empty() || text.size() > 256) return 0;
  if (!HoldsConnection(static_cast<int>(pid), connection)) return 0;
  std::string back(text.size(), '\0');
  if (!ReadRemote(static_cast<int>(pid), address, back.data(), back.size())) return 0;
  return back == text ? static_cast<int>(pid) : 0;
}

bool ReadRemote(int pid, uint64_t remote, char* dst, size_t size) {
  size_t done = 0;
  while (done < size) {
    iovec local{dst + done, size - done};
    iovec far{reinterpret_cast<void*>(remote + done), size - done};
    ssize_t n = process_vm_readv(pid, &local, 1, &far, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EFAULT;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace dtrain::transport::same_host
