#include "collectives/gloo/gloo_setup.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "collectives/error_text.h"
#include "collectives/gloo/host_groups.h"
#include "collectives/gloo/pair_sockets.h"
#include "common/host_id.h"
#include "common/net_address.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

// Gloo writes to its sockets with writev, without MSG_NOSIGNAL: a write to a rank that just died
// would kill this process with SIGPIPE instead of failing the collective with a PeerError naming
// it. SIGPIPE is ignored unless the program installed a handler of its own.
void IgnoreSigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string ArrivedKey(int rank) { return "arrived/" + std::to_string(rank); }

void OpenStore(GlooMembership& m, const CollectivesConfig& config,
               std::unique_ptr<RendezvousServer> server) {
  if (!config.file_store_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.file_store_dir, ec);
    m.local_store = std::make_unique<gloo::rendezvous::FileStore>(config.file_store_dir);
    m.rendezvous = "DTRAIN_GLOO_FILE_STORE=" + config.file_store_dir;
  } else if (config.size == 1 && config.rendezvous_port == 0) {
    m.local_store = std::make_unique<gloo::rendezvous::HashStore>();
    m.rendezvous = "(none: a job of one)";
  } else {
    if (server) {
      m.server = std::move(server);
    } else if (config.rank == 0) {
      m.server = std::make_unique<RendezvousServer>(
          config.rendezvous_port, config.size, config.job_secret, Duration(10000),
          config.rendezvous_host, config.heartbeat_timeout);
    }
    m.client = std::make_unique<RendezvousClient>(config.rendezvous_host, config.rendezvous_port,
                                                  config.rank, config.connect_timeout,
                                                  config.job_secret, config.heartbeat_interval);
    m.rendezvous = m.client->endpoint();
  }
  gloo::rendezvous::Store& base =
      m.client ? static_cast<gloo::rendezvous::Store&>(*m.client) : *m.local_store;
  m.prefixed = std::make_unique<gloo::rendezvous::PrefixStore>("dtrain-gloo", base);
  m.store = std::make_unique<CappedStore>(*m.prefixed, config.connect_timeout);
}

// Everyone announces itself (hostname, address, host id) first, so that a rank that never comes is
// named in the error rather than surfacing as a missing gloo address.
void WaitForEveryone(GlooMembership& m, const CollectivesConfig& config) {
  gloo::rendezvous::Store& store = *m.store;
  const std::string me = Hostname() + "\n" + m.address + "\n" + HostId();
  store.set(ArrivedKey(config.rank), std::vector<char>(me.begin(), me.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < config.size; ++r) keys.push_back(ArrivedKey(r));
  try {
    store.wait(keys, config.connect_timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    for (int r = 0; r < config.size; ++r) {
      try {
        store.wait({keys[r]}, std::chrono::milliseconds(1));
      } catch (const std::exception&) {
        missing.push_back(r);
      }
    }
    throw TimeoutError("gloo rendezvous (" + m.rendezvous + "): rank " +
                       std::to_string(config.rank) + " waited " +
                       SecondsText(config.connect_timeout) + " (DTRAIN_CONNECT_TIMEOUT_MS) for " +
                       RankList(missing) + " of " + std::to_string(config.size) + " to arrive");
  }
}

// Every rank's "hostname\naddress\nhost id": hostnames give the local layout, both name ranks in
// errors; the host ids say whether they may share memory.
void LearnPeers(GlooMembership& m, const CollectivesConfig& config) {
  const int size = config.size;
  std::vector<std::string>& hostnames = m.hostnames;
  hostnames.resize(size);
  m.peers.resize(size);
  m.host_ids.resize(size);
  for (int r = 0; r < size; ++r) {
    const auto bytes = m.store->get(ArrivedKey(r));
    const std::string text(bytes.begin(), bytes.end());
    const size_t newline = text.find('\n');
    const size_t second = newline == std::string::npos ? newline : text.find('\n', newline + 1);
    hostnames[r] = text.substr(0, newline);
    const std::string address =
        newline == std::string::npos ? "" : text.substr(newline + 1, second - newline - 1);
    m.host_ids[r] = second == std::string::npos ? "" : text.substr(second + 1);
    m.peers[r] = "rank " + std::to_string(r) + " (" + hostnames[r] +
                 (address.empty() || address == hostnames[r] ? "" : ", " + address) + ")";
  }
  const HostLayout by_name = HostLayout::FromHostIds(hostnames, config.rank);
  m.local_rank = by_name.local_rank;
  m.local_size = static_cast<int>(by_name.mine().size());
}

}  // namespace

std::unique_ptr<GlooMembership> JoinGloo(const CollectivesConfig& config,
                                         std::unique_ptr<RendezvousServer> server) {
  IgnoreSigpipe();
  auto m = std::make_unique<GlooMembership>();
  gloo::transport::tcp::attr attr;
  if (!config.node_host.empty() || config.interface.empty()) {
    Config layout;
    layout.scheduler_host = config.rendezvous_host;
    layout.node_host = config.node_host;
    attr.hostname = AnnounceAddress(layout);
  } else {
    attr.iface = config.interface;
  }
  m->address = attr.hostname.empty() ? "interface " + attr.iface : attr.hostname;
  OpenStore(*m, config, std::move(server));
  WaitForEveryone(*m, config);
  try {
    m->device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(config.rank, config.size);
    context->setTimeout(config.collective_timeout);
    m->pair_sockets = ConnectFullMesh(*context, *m->store, m->device);
    m->context = std::move(context);
  } catch (const gloo::Exception& e) {
    throw PeerError("rank " + std::to_string(config.rank) +
                    " could not connect to the other gloo ranks (" + m->address + "): " + e.what());
  }
  LearnPeers(*m, config);
  return m;
}

}  // namespace dtrain::collectives
