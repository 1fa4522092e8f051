#include "common/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <memory>
#include <set>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

struct Interface {
  std::string name;
  std::string address;
  bool up = false;
  bool loopback = false;
};

std::vector<Interface> ListIPv4Interfaces() {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return {};
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> list(raw, freeifaddrs);
  std::vector<Interface> out;
  for (ifaddrs* a = raw; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text)) == nullptr) continue;
    out.push_back(
        {a->ifa_name, text, (a->ifa_flags & IFF_UP) != 0, (a->ifa_flags & IFF_LOOPBACK) != 0});
  }
  return out;
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string InterfaceAddress(const std::string& name) {
  std::set<std::string> names;
  for (const auto& i : ListIPv4Interfaces()) {
    if (i.name == name) return i.address;
    names.insert(i.name);
  }
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("DMLC_INTERFACE=" + name +
                    ": no such interface with an IPv4 address (this host has: " + known + ")");
}

std::string AnnounceAddress(const Config& config) {
  if (!config.node_host.empty()) return config.node_host;
  if (!config.interface.empty()) return InterfaceAddress(config.interface);
  if (IsLoopbackHost(config.scheduler_host)) return "127.0.0.1";
  for (const auto& i : ListIPv4Interfaces()) {
    if (i.up && !i.loopback) return i.address;
  }
  return "127.0.0.1";
}

}  // namespace dtrain
