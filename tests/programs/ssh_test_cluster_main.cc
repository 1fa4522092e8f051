// `ssh_test_cluster N`: the launcher tests' cluster of N emulated hosts (network namespaces, each
// with its own sshd: tests/launcher/ssh_test_cluster.h), for the benchmarks that run jobs across
// hosts over ssh (bench/elastic_bench.py --ssh-hosts). Builds it, prints one JSON line:
//   {"hosts": [address...], "netns": [name...], "ssh_opts": "-F ...", "interface": "dtb..."}
// and keeps it until its stdin ends (the caller closed it or died) or SIGINT/SIGTERM, then
// deletes everything it made (the namespaces, with whatever runs there). Exit 77 where no cluster
// can be made here (the reason on stderr), 1 when building one fails.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "launcher/ssh_test_cluster.h"

namespace {

volatile sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

}  // namespace

int main(int argc, char** argv) {
  using dtrain::launcher::testing::SshTestCluster;
  const int hosts = argc > 1 ? std::atoi(argv[1]) : 0;
  if (hosts < 1 || hosts > 16) {
    std::fprintf(stderr, "usage: ssh_test_cluster N (1 to 16 hosts)\n");
    return 2;
  }
  if (std::optional<std::string> why = SshTestCluster::WhyUnavailable()) {
    std::fprintf(stderr, "ssh_test_cluster: no cluster here: %s\n", why->c_str());
    return 77;
  }
  // Without SA_RESTART: a signal ends the read below, and the destructor tears the cluster down.
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<SshTestCluster> cluster;
  try {
    cluster = std::make_unique<SshTestCluster>(hosts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ssh_test_cluster: %s\n", e.what());
    return 1;
  }
  nlohmann::json out = {{"ssh_opts", cluster->ssh_opts()},
                        {"interface", cluster->interface_name()},
                        {"hosts", nlohmann::json::array()},
                        {"netns", nlohmann::json::array()}};
  for (int i = 0; i < cluster->size(); ++i) {
    out["hosts"].push_back(cluster->address(i));
    out["netns"].push_back(cluster->netns(i));
  }
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  char buffer[256];
  while (!g_stop && ::read(0, buffer, sizeof buffer) > 0) {
  }
  return 0;
}
