#include "collectives/gloo/pair_sockets.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace dtrain::collectives {
namespace {

bool IsConnectedTcp(int fd) {
  int type = 0, domain = 0;
  socklen_t length = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) {
    return false;
  }
  length = sizeof domain;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) != 0 ||
      (domain != AF_INET && domain != AF_INET6)) {
    return false;
  }
  sockaddr_storage peer{};
  socklen_t peer_length = sizeof peer;
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) == 0;
}

// Whether the socket's number still names the socket found.
bool StillThere(const PairSocket& socket) {
  struct stat st {};
  return ::fstat(socket.fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == socket.inode;
}

// What the kernel's autotuning may grow a send buffer to (4 MB where it cannot be read).
int AutotuneMaximum() {
  static const int bytes = [] {
    std::ifstream in("/proc/sys/net/ipv4/tcp_wmem");
    long least = 0, initial = 0, most = 0;
    if (in >> least >> initial >> most && most > 0 && most <= (1L << 30)) {
      return static_cast<int>(most);
    }
    return 4 << 20;
  }();
  return bytes;
}

}  // namespace

std::set<int> OpenSockets() {
  std::set<int> sockets;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return sockets;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) == 0 && S_ISSOCK(st.st_mode)) {
      sockets.insert(static_cast<int>(fd));
    }
  }
  ::closedir(dir);
  return sockets;
}

std::vector<PairSocket> NewTcpSockets(const std::set<int>& before) {
  std::vector<PairSocket> added;
  for (int fd : OpenSockets()) {
    struct stat st {};
    if (before.count(fd) || !IsConnectedTcp(fd) || ::fstat(fd, &st) != 0) continue;
    added.push_back({fd, st.st_ino});
  }
  return added;
}

std::vector<PairSocket> ConnectFullMesh(gloo::rendezvous::Context& context,
                                        gloo::rendezvous::Store& store,
                                        std::shared_ptr<gloo::transport::Device>& device) {
  const auto before = OpenSockets();
  context.connectFullMesh(store, device);
  return NewTcpSockets(before);
}

void WidenSendBuffers(const std::vector<PairSocket>& sockets) {
  const int wanted = AutotuneMaximum();
  for (const PairSocket& socket : sockets) {
    if (!StillThere(socket)) continue;
    int now = 0;
    socklen_t length = sizeof now;
    if (::getsockopt(socket.fd, SOL_SOCKET, SO_SNDBUF, &now, &length) != 0) continue;
    // The kernel reports twice what was asked (its bookkeeping).
    if (now >= wanted) continue;
    if (::setsockopt(socket.fd, SOL_SOCKET, SO_SNDBUFFORCE, &wanted, sizeof wanted) != 0) {
      ::setsockopt(socket.fd, SOL_SOCKET, SO_SNDBUF, &wanted, sizeof wanted);
    }
  }
}

void ShutDown(const std::vector<PairSocket>& sockets) {
  for (const PairSocket& socket : sockets) {
    if (StillThere(socket)) ::shutdown(socket.fd, SHUT_RDWR);
  }
}

}  // namespace dtrain::collectives
