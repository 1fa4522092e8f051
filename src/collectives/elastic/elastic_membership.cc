#include "collectives/elastic/elastic_membership.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "common/config/config.h"
#include "common/logging.h"
#include "dtrain/common/error.h"
#include "report/launcher_link.h"

namespace dtrain::collectives {
namespace {

constexpr Duration kConnectTimeout(10000);

std::mutex g_mutex;
std::unique_ptr<report::LauncherLink> g_link;  // under g_mutex; reopened after an error
int64_t g_formed_version = 0;                  // the hosts version of this worker's membership
int64_t g_rolled_back_steps = 0;               // for the next join (NoteRolledBackSteps)

// The link to the launcher, connected as this worker (DTRAIN_NODE_RANK: its number in the job).
report::LauncherLink& Link(const std::string& address, const std::string& token) {
  if (!g_link) {
    const Config& config = ProcessConfig();
    nlohmann::json identity = {{"role", "worker"},
                               {"rank", std::max(config.requested_rank, 0)},
                               {"host", config.node_host},
                               {"pid", static_cast<int64_t>(::getpid())}};
    g_link = std::make_unique<report::LauncherLink>(address, token, identity, kConnectTimeout);
  }
  return *g_link;
}

int64_t IntegerField(const nlohmann::json& answer, const char* name, int64_t lo, int64_t hi) {
  const auto it = answer.find(name);
  if (it == answer.end() || !it->is_number_integer() || it->get<int64_t>() < lo ||
      it->get<int64_t>() > hi) {
    throw ProtocolError(std::string("the launcher's elastic assignment has no valid \"") + name +
                        "\"");
  }
  return it->get<int64_t>();
}

ElasticPlace Join(const CollectivesConfig& config) {
  report::LauncherLink& link = Link(config.report_address, config.report_token);
  link.Send({{"kind", "elastic_join"}, {"rolled_back_steps", g_rolled_back_steps}},
            kConnectTimeout);
  const nlohmann::json answer = link.Receive(config.elastic_timeout);
  if (answer.value("leave", false)) {
    throw RemovedFromJob("dtrain launch removed this worker from the elastic job: " +
                         answer.value("why", std::string("no reason given")));
  }
  ElasticPlace place;
  place.generation = static_cast<int>(IntegerField(answer, "generation", 1, 1 << 30));
  place.size = static_cast<int>(IntegerField(answer, "size", 1, 1 << 20));
  place.rank = static_cast<int>(IntegerField(answer, "rank", 0, place.size - 1));
  const int64_t version = IntegerField(answer, "hosts_version", 0, INT64_MAX);
  if (place.rank == 0) {
    // Every interface of the announced address's machine; the launcher tells the others the
    // address it sees this worker at.
    place.server =
        std::make_unique<RendezvousServer>(0, place.size, config.job_secret, Duration(10000),
                                           config.node_host, config.heartbeat_timeout);
    place.rendezvous_host = config.node_host.empty() ? "127.0.0.1" : config.node_host;
    place.rendezvous_port = place.server->port();
    link.Send({{"kind", "elastic_rendezvous"}, {"port", place.rendezvous_port}}, kConnectTimeout);
  } else {
    const auto host = answer.find("rendezvous_host");
    if (host == answer.end() || !host->is_string() || host->get<std::string>().empty() ||
        host->get<std::string>().size() > 255) {
      throw ProtocolError("the launcher's elastic assignment has no valid \"rendezvous_host\"");
    }
    place.rendezvous_host = host->get<std::string>();
    place.rendezvous_port =
        static_cast<uint16_t>(IntegerField(answer, "rendezvous_port", 1, 65535));
  }
  g_formed_version = version;
  g_rolled_back_steps = 0;  // counted in this membership's line
  return place;
}

}  // namespace

ElasticPlace JoinElasticMembership(const CollectivesConfig& config) {
  std::lock_guard<std::mutex> lock(g_mutex);
  try {
    ElasticPlace place = Join(config);
    DTRAIN_LOG(kConnections) << "elastic membership " << place.generation << ": rank " << place.rank
                             << " of " << place.size;
    return place;
  } catch (const RemovedFromJob&) {
    throw;
  } catch (...) {
    g_link.reset();  // a half-read answer must not be taken for the next one
    throw;
  }
}

void NoteRolledBackSteps(int64_t steps) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_rolled_back_steps += std::max<int64_t>(steps, 0);
}

HostsUpdate AskLauncherHostsUpdate(Duration timeout) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Config& config = ProcessConfig();
  try {
    report::LauncherLink& link = Link(config.report_address, config.report_token);
    link.Send({{"kind", "elastic_hosts"}}, timeout);
    const nlohmann::json answer = link.Receive(timeout);
    const int64_t version = IntegerField(answer, "hosts_version", 0, INT64_MAX);
    const int64_t added = IntegerField(answer, "added_version", 0, version);
    if (version == g_formed_version) return HostsUpdate::kNone;
    return added > g_formed_version ? HostsUpdate::kAdded : HostsUpdate::kRemoved;
  } catch (...) {
    g_link.reset();
    throw;
  }
}

}  // namespace dtrain::collectives
