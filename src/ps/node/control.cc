#include "ps/node/control.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "dtrain/common/error.h"

namespace dtrain::ps {

std::string NodeInfo::Name() const {
  std::string s = RoleName(role);
  if (role != Role::kScheduler) s.append(" ").append(std::to_string(rank));
  return s.append(" (").append(Address()).append(")");
}

const char* GroupName(Group g) {
  switch (g) {
    case Group::kWorkers:
      return "workers";
    case Group::kServers:
      return "servers";
    case Group::kAll:
      return "all";
  }
  return "unknown";
}

bool InGroup(Group g, Role role) {
  switch (g) {
    case Group::kWorkers:
      return role == Role::kWorker;
    case Group::kServers:
      return role == Role::kServer;
    case Group::kAll:
      return role != Role::kScheduler;
  }
  return false;
}

namespace control {
namespace {

using nlohmann::json;

json Parse(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw ProtocolError(std::string("malformed ") + what + " message");
  }
  return j;
}

template <typename T>
T Field(const json& j, const char* name, const char* what) {
  auto it = j.find(name);
  if (it == j.end()) throw ProtocolError(std::string(what) + " message lacks '" + name + "'");
  if constexpr (std::is_integral_v<T>) {
    // get<T> would convert booleans and fractions, and wrap numbers T cannot hold.
    bool fits = false;
    if (it->is_number_unsigned()) {
      fits = it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    } else if (it->is_number_integer()) {
      const int64_t v = it->get<int64_t>();
      const uint64_t max = static_cast<uint64_t>(std::numeric_limits<T>::max());
      fits = v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
             (v < 0 || static_cast<uint64_t>(v) <= max);
    }
    if (!fits) throw ProtocolError(std::string(what) + " message has a bad '" + name + "'");
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw ProtocolError(std::string(what) + " message has a bad '" + name + "'");
  }
}

Role ParseRole(const std::string& s) {
  if (auto role = RoleFromName(s)) return *role;
  throw ProtocolError("unknown role '" + s + "'");
}

uint16_t ParsePort(int64_t port) {
  if (port < 1 || port > 65535) throw ProtocolError("bad port " + std::to_string(port));
  return static_cast<uint16_t>(port);
}

}  // namespace

std::string EncodeRegistration(const Registration& r) {
  return json{
      {"role", RoleName(r.role)}, {"host", r.host}, {"port", r.port}, {"rank", r.requested_rank}}
      .dump();
}

Registration DecodeRegistration(const std::string& text) {
  json j = Parse(text, "register");
  Registration r;
  r.role = ParseRole(Field<std::string>(j, "role", "register"));
  r.host = Field<std::string>(j, "host", "register");
  if (r.host.empty() || r.host.size() > 255) throw ProtocolError("register message: bad host");
  r.port = ParsePort(Field<int64_t>(j, "port", "register"));
  int64_t rank = Field<int64_t>(j, "rank", "register");
  if (rank < -1 || rank > (1 << 20)) throw ProtocolError("register message: bad rank");
  r.requested_rank = static_cast<int>(rank);
  return r;
}

std::string EncodeNodeTable(const std::vector<NodeInfo>& nodes) {
  json list = json::array();
  for (const auto& n : nodes) {
    list.push_back({{"id", n.id},
                    {"role", RoleName(n.role)},
                    {"rank", n.rank},
                    {"host", n.host},
                    {"port", n.port}});
  }
  return json{{"nodes", list}}.dump();
}

std::vector<NodeInfo> DecodeNodeTable(const std::string& text) {
  json j = Parse(text, "node-table");
  auto list = Field<json>(j, "nodes", "node-table");
  if (!list.is_array()) throw ProtocolError("node-table message: 'nodes' is not a list");
  std::vector<NodeInfo> nodes;
  for (const auto& e : list) {
    if (!e.is_object()) throw ProtocolError("node-table message: bad entry");
    NodeInfo n;
    n.id = Field<int32_t>(e, "id", "node-table");
    n.role = ParseRole(Field<std::string>(e, "role", "node-table"));
    n.rank = Field<int32_t>(e, "rank", "node-table");
    n.host = Field<std::string>(e, "host", "node-table");
    n.port = ParsePort(Field<int64_t>(e, "port", "node-table"));
    if (n.id < 0 || n.rank < -1 || n.rank > (1 << 20)) {
      throw ProtocolError("node-table message: bad id or rank");
    }
    nodes.push_back(std::move(n));
  }
  return nodes;
}

std::string EncodeBarrier(Group group, uint64_t sequence, bool setup) {
  json j{{"group", static_cast<int>(group)}, {"seq", sequence}};
  if (setup) j["setup"] = true;
  return j.dump();
}

BarrierMessage DecodeBarrier(const std::string& text) {
  json j = Parse(text, "barrier");
  int g = Field<int>(j, "group", "barrier");
  if (g < 1 || g > 3) throw ProtocolError("barrier message: unknown group " + std::to_string(g));
  BarrierMessage b{static_cast<Group>(g), Field<uint64_t>(j, "seq", "barrier")};
  if (const auto it = j.find("setup"); it != j.end()) {
    // Field<bool> would take numbers: only a JSON boolean is one.
    if (!it->is_boolean()) throw ProtocolError("barrier message has a bad 'setup'");
    b.setup = it->get<bool>();
  }
  return b;
}

std::string EncodeRejoin(const Rejoin& r) {
  return json{{"workers", r.workers_barriers}, {"all", r.all_barriers}, {"setup", r.setup_barriers}}
      .dump();
}

Rejoin DecodeRejoin(const std::string& text) {
  json j = Parse(text, "rejoin");
  Rejoin r{Field<uint64_t>(j, "workers", "rejoin"), Field<uint64_t>(j, "all", "rejoin")};
  r.setup_barriers = Field<uint64_t>(j, "setup", "rejoin");
  if (r.setup_barriers > r.workers_barriers) {
    throw ProtocolError("rejoin message: more setup barriers than workers' barriers");
  }
  return r;
}

std::string EncodeFailure(const Failure& f) {
  return json{{"node", f.node}, {"name", f.name}, {"reason", f.reason}}.dump();
}

Failure DecodeFailure(const std::string& text) {
  json j = Parse(text, "node-failed");
  Failure f;
  f.node = Field<int32_t>(j, "node", "node-failed");
  f.name = Field<std::string>(j, "name", "node-failed");
  f.reason = Field<std::string>(j, "reason", "node-failed");
  return f;
}

}  // namespace control
}  // namespace dtrain::ps
