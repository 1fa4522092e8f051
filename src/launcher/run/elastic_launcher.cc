// `dtrain launch -s 0 --host-discovery-script S`: an elastic allreduce job (elastic_job.h) on the
// hosts the script offers. --launcher local runs every worker on this machine; --launcher ssh runs
// each on its host through ssh, as the ssh backend does (ssh_launcher.cc), a host's address looked
// up with `ssh -G` when the script first offers it. --launcher ray runs each on a Ray node, through
// a proxy process here (python/dtrain/ray/_node_exec.py) that has Ray run it there; --launcher
// spark in one of dtrain.spark.run_elastic's tasks, through python/dtrain/spark/_node_exec.py.
#include <arpa/inet.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "dtrain/common/error.h"
#include "launcher/plan/local_address.h"
#include "launcher/run/backends.h"
#include "launcher/run/process_group.h"
#include "launcher/run/ssh_hosts.h"
#include "launcher/status/report_setup.h"
#include "launcher/watch/elastic_job.h"

namespace dtrain::launcher {
namespace {

class ThisMachine : public ElasticHosts {
 public:
  std::optional<std::string> Refuse(const std::string& host) override {
    if (IsThisMachine(host)) return std::nullopt;
    return "which is not this machine: --launcher local runs workers here only (--launcher ssh "
           "reaches other hosts)";
  }
  ProcessSpec Place(const ProcessSpec& worker, const std::string&) override { return worker; }
};

// Each worker announces its host's address (unless --interface names one) and reports to this
// machine's address on the route to it: the report channel listens on every interface.
class SshHosts : public ElasticHosts {
 public:
  SshHosts(const LaunchOptions& options, std::string remote_dir, uint16_t report_port)
      : options_(options), remote_dir_(std::move(remote_dir)), report_port_(report_port) {}

  std::optional<std::string> Refuse(const std::string& host) override {
    if (known_.count(host)) return std::nullopt;
    try {
      Known k;
      k.address = SshHostnames(options_.ssh_options, {host}, "the host discovery script").at(host);
      k.launcher_address = SchedulerAddressToward(k.address, options_.interface);
      known_[host] = std::move(k);
      return std::nullopt;
    } catch (const std::exception& e) {
      return std::string("which this launcher cannot use: ") + e.what();
    }
  }

  ProcessSpec Place(const ProcessSpec& worker, const std::string& host) override {
    const Known& k = known_.at(host);
    ProcessSpec spec = worker;
    spec.host = host;
    SetEnv(&spec.env, "DTRAIN_REPORT_ADDR",
           k.launcher_address + ":" + std::to_string(report_port_));
    return RunOverSsh(options_, remote_dir_, std::move(spec), k.address);
  }

 private:
  struct Known {
    std::string address;           // what ssh connects to, and the worker announces
    std::string launcher_address;  // this machine's, on the route to it
  };
  const LaunchOptions options_;
  const std::string remote_dir_;
  const uint16_t report_port_;
  std::map<std::string, Known> known_;
};

// The nodes of an engine that runs the workers for us, named by address: a Ray cluster's
// (`python3 -m dtrain.ray.discover` prints them) or a Spark job's tasks (dtrain.spark.discover's).
// Each worker is a local proxy, `python3 -m dtrain.ENGINE._node_exec --node ADDRESS -- ARGV`,
// which has the engine run ARGV there with the worker's variables (a Ray actor with that node's
// affinity; a free task of run_elastic's on that host); it stops the worker when its stdin closes
// (the launcher ended) or it is signalled, and exits with the worker's code (1, naming the node,
// when the engine lost it). The python3 on PATH must import dtrain and the engine's package.
class EngineNodes : public ElasticHosts {
 public:
  EngineNodes(const LaunchOptions& options, uint16_t report_port, std::string engine)
      : options_(options), report_port_(report_port), engine_(std::move(engine)) {}

  std::optional<std::string> Refuse(const std::string& host) override {
    in_addr v4{};
    in6_addr v6{};
    if (::inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
        ::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
      return std::nullopt;
    }
    return "which is not an address: --launcher " + engine_ +
           " takes addresses, as `python3 -m dtrain." + engine_ + ".discover` prints them";
  }

  ProcessSpec Place(const ProcessSpec& worker, const std::string& host) override {
    ProcessSpec spec = worker;
    spec.host = host;
    SetEnv(&spec.env, "DMLC_NODE_HOST", host);
    SetEnv(&spec.env, "DTRAIN_REPORT_ADDR",
           SchedulerAddressToward(host, options_.interface) + ":" + std::to_string(report_port_));
    spec.argv = {"python3", "-m", "dtrain." + engine_ + "._node_exec", "--node", host, "--"};
    spec.argv.insert(spec.argv.end(), worker.argv.begin(), worker.argv.end());
    spec.remote_via = engine_;
    spec.stdin_held_open = true;
    return spec;
  }

 private:
  const LaunchOptions options_;
  const uint16_t report_port_;
  const std::string engine_;
};

}  // namespace

// One worker's spec is the template of all; the layout variables a worker would read its rank and
// the job's size from are left out (the launcher tells it both when a membership forms), its
// number names it (DTRAIN_NODE_RANK, set per worker).
int RunElasticJob(const LaunchOptions& options) {
  const bool ssh = options.launcher == LauncherKind::kSsh;
  const bool engine =
      options.launcher == LauncherKind::kRay || options.launcher == LauncherKind::kSpark;
  LaunchOptions one = options;
  one.num_workers = 1;
  JobPlan plan =
      BuildJobPlan(one, PlaceLocally(0, 1), SelfExecutablePath(), PickFreeLoopbackPort());
  SupervisorOptions supervision;
  supervision.kill_grace = options.kill_grace;
  supervision.output_dir = options.output_dir;
  SetUpReports(options, &plan, &supervision, /*other_hosts=*/ssh || engine);
  ProcessSpec worker = plan.processes.front();
  std::vector<EnvVar> env;
  for (EnvVar& v : worker.env) {
    if (!IsPerRankVariable(v.first) && v.first != "DMLC_NUM_WORKER") env.push_back(std::move(v));
  }
  env.push_back({"DTRAIN_ELASTIC", "1"});
  env.push_back({"DTRAIN_ELASTIC_TIMEOUT_S",
                 std::to_string(static_cast<int64_t>(Seconds(options.elastic_timeout)))});
  worker.env = std::move(env);
  ElasticOptions elastic;
  elastic.discovery_script = *options.host_discovery_script;
  elastic.min_np = options.min_np;
  elastic.max_np = options.max_np;
  elastic.timeout = options.elastic_timeout;
  if (ssh) {
    std::error_code ec;
    const std::string cwd = std::filesystem::current_path(ec).string();
    if (ec) throw Error("cannot get the current directory: " + ec.message());
    elastic.hosts = std::make_shared<SshHosts>(options, cwd, supervision.reports->port);
  } else if (engine) {
    elastic.hosts = std::make_shared<EngineNodes>(options, supervision.reports->port,
                                                  LauncherName(options.launcher));
  } else {
    elastic.hosts = std::make_shared<ThisMachine>();
  }
  const std::string where = ssh                                        ? "through ssh"
                            : options.launcher == LauncherKind::kRay   ? "on Ray's nodes"
                            : options.launcher == LauncherKind::kSpark ? "in Spark's tasks"
                                                                       : "on this machine";
  std::fprintf(stderr,
               "dtrain launch: elastic allreduce job %s: %d to %d workers on the slots that `%s` "
               "offers\n",
               where.c_str(), options.min_np, options.max_np, elastic.discovery_script.c_str());
  return SuperviseElasticJob(worker, supervision, elastic);
}

}  // namespace dtrain::launcher
