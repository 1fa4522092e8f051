#include "ps/roles.h"

#include <cstdlib>

#include "common/logging.h"
#include "dtrain/common/error.h"
#include "ps/node/node.h"
#include "ps/scheduler.h"
#include "ps/server.h"
#include "transport/tcp/tcp_transport.h"

namespace dtrain::ps {
namespace {

std::unique_ptr<transport::Transport> MakeTransport(const Config& config) {
  return std::make_unique<transport::TcpTransport>(transport::TcpOptions::FromConfig(config));
}

}  // namespace

int RunScheduler(const Config& config) {
  SetLogVerbosity(config.verbose);
  SetLogIdentity("scheduler");
  try {
    Scheduler scheduler(config, MakeTransport(config));
    scheduler.Listen();
    return scheduler.Run();
  } catch (const std::exception& e) {
    DTRAIN_LOG(kError) << e.what();
    return 1;
  }
}

int RunServer(const Config& config) {
  SetLogVerbosity(config.verbose);
  SetLogIdentity("server");
  try {
    Node node(config, Role::kServer, MakeTransport(config), Node::Options{});
    Server server(node, config);
    node.SetDataHandler([&server](transport::Message&& msg) { server.Handle(std::move(msg)); });
    node.SetWorkerFinishedHandler([&server](int rank) { server.OnWorkerFinished(rank); });
    node.SetWorkerReplacedHandler([&server](int rank) { server.OnWorkerReplaced(rank); });
    node.SetWorkerLostHandler([&server](int rank) { server.OnWorkerLost(rank); });
    node.SetBodyLimit([&server](const transport::Header& h) { return server.BodyLimit(h); });
    node.SetJoinedHandler([&server] { server.OnJoined(); });
    node.Start();
    const int code = node.WaitForTermination();
    if (code == 0) server.FinalCheckpoint();
    node.Shutdown();
    return code;
  } catch (const std::exception& e) {
    DTRAIN_LOG(kError) << e.what();
    return 1;
  }
}

std::optional<int> RunRoleIfService(const Config& config) {
  if (!config.role || *config.role == Role::kWorker) return std::nullopt;
  return *config.role == Role::kScheduler ? RunScheduler(config) : RunServer(config);
}

void RunRoleFromEnvironmentIfService() {
  const Config config = Config::FromEnvironment();
  SetLogVerbosity(config.verbose);
  if (const auto code = RunRoleIfService(config)) std::exit(*code);
}

}  // namespace dtrain::ps
