#include "launcher/plan/local_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "dtrain/common/error.h"
#include "common/net_address.h"
#include "launcher/run/process_group.h"

namespace dtrain::launcher {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::vector<std::string> LocalIPv4Addresses() {
  std::vector<std::string> out;
  ifaddrs* raw = nullptr;
  if (::getifaddrs(&raw) != 0) return out;
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> list(raw, ::freeifaddrs);
  for (ifaddrs* a = raw; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text)) != nullptr) out.push_back(text);
  }
  return out;
}

// The port the kernel picks for a TCP socket bound to port 0 of `address` (host order).
uint16_t KernelChosenPort(in_addr_t address, const std::string& failure) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw Error(Errno("cannot create a socket"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(address);
  socklen_t len = sizeof(addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw Error(Errno(failure));
  }
  return ntohs(addr.sin_port);
}

// The kernel's range for the local ports of outgoing connections (ip_local_port_range).
std::pair<int, int> EphemeralPortRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768, high = 60999;
  in >> low >> high;
  return {low, high};
}

// A port of `address` that can be bound now, chosen below the ephemeral range: a port the kernel
// picks (bind to 0) can be taken, between the pick and the job's bind, by any outgoing connection
// on the machine, which draws its local port from that same range; one below it can only be taken
// by a process that names it. Falls back to the kernel's choice.
uint16_t PortBelowEphemeralRange(in_addr_t address, const std::string& failure) {
  const int low = EphemeralPortRange().first;
  if (low > 12000) {
    std::random_device seed;
    std::mt19937 rng(seed());
    std::uniform_int_distribution<int> pick(10000, low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (fd.get() < 0) break;
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(address);
      addr.sin_port = htons(static_cast<uint16_t>(pick(rng)));
      if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        return ntohs(addr.sin_port);
      }
    }
  }
  return KernelChosenPort(address, failure);
}

}  // namespace

bool IsThisMachine(const std::string& host) {
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return true;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) {
    const std::string full(name);
    if (host == full || host == full.substr(0, full.find('.'))) return true;
  }
  for (const std::string& a : LocalIPv4Addresses()) {
    if (host == a) return true;
  }
  return false;
}

std::string LocalAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  if (rc != 0) {
    throw UsageError("cannot resolve host '" + host + "' here (" + ::gai_strerror(rc) +
                     "), so the scheduler's address is unknown; pass --interface");
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (fd.get() < 0 || ::connect(fd.get(), found->ai_addr, found->ai_addrlen) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    throw UsageError(Errno("no route from here to host '" + host + "'"));
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

std::string SchedulerAddressToward(const std::string& host,
                                   const std::optional<std::string>& interface) {
  if (!interface) return LocalAddressToward(host);
  try {
    return InterfaceAddress(*interface);
  } catch (const ConfigError& e) {
    throw UsageError("--interface " + *interface + ": " + e.what());
  }
}

uint16_t PickFreePort() { return PortBelowEphemeralRange(INADDR_ANY, "cannot find a free port"); }

uint16_t PickFreeLoopbackPort() {
  return PortBelowEphemeralRange(INADDR_LOOPBACK, "cannot find a free port on 127.0.0.1");
}

}  // namespace dtrain::launcher
