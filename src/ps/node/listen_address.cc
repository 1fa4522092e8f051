#include "ps/node/listen_address.h"

#include <arpa/inet.h>

#include <atomic>

#include "common/logging.h"
#include "common/net_address.h"
#include "dtrain/common/error.h"

namespace dtrain::ps {
namespace {

bool IsIPv4(const std::string& host) {
  in_addr ignored{};
  return inet_pton(AF_INET, host.c_str(), &ignored) == 1;
}

void WarnOnceIfOpen(const Config& config, const std::string& listening) {
  if (!config.job_secret.empty() || IsLoopbackHost(listening)) return;
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  DTRAIN_LOG(kWarning) << "DTRAIN_JOB_SECRET is not set and this node listens on "
                       << (listening.empty() ? std::string("every interface") : listening)
                       << ": any process that can reach it can join or disturb the job. `dtrain "
                          "launch` sets a secret for you; a job started by hand sets the same one "
                          "on every node (e.g. `openssl rand -hex 32`)";
}

}  // namespace

uint16_t ListenForJob(transport::Transport& transport, const Config& config,
                      const std::string& announced, uint16_t port) {
  if (IsIPv4(announced)) {
    try {
      const uint16_t bound = transport.Listen(announced, port);
      WarnOnceIfOpen(config, announced);
      return bound;
    } catch (const Error& e) {
      DTRAIN_LOG(kConnections) << "cannot listen at the announced address (" << e.what()
                               << "); listening on every interface";
    }
  }
  const uint16_t bound = transport.Listen("", port);
  WarnOnceIfOpen(config, "");
  return bound;
}

}  // namespace dtrain::ps
