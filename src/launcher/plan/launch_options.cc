#include "launcher/plan/launch_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>

namespace dtrain::launcher {
namespace {

constexpr int kMaxProcessesPerRole = 4096;
constexpr int64_t kMaxGraceMs = 3600 * 1000;

// The launcher sets these itself, per process; letting --env replace them would give processes a
// job layout that disagrees with the one the launcher started.
const std::set<std::string>& ReservedNames() {
  static const std::set<std::string> names = {"DMLC_ROLE",         "DMLC_PS_ROOT_URI",
                                              "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                                              "DMLC_NUM_WORKER",   "DTRAIN_NODE_RANK"};
  return names;
}

bool IsValidEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::optional<std::string> LauncherValue(const char* name) {
  // Raw read: `--env NAME` hands the launcher's value of any variable on, "" included.
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// "NAME:VALUE" -> {NAME, VALUE}; "NAME" -> {NAME, the launcher's own value}.
EnvVar ParseEnvArg(const std::string& flag, const std::string& arg, EnvGetter launcher_env) {
  const size_t colon = arg.find(':');
  std::string name = arg.substr(0, colon);
  if (!IsValidEnvName(name)) {
    throw UsageError(flag + " " + arg + ": '" + name +
                     "' is not a valid variable name (expected NAME or NAME:VALUE)");
  }
  if (ReservedNames().count(name)) {
    throw UsageError(flag + " " + arg + ": the launcher sets " + name +
                     " itself for every process; it cannot be overridden");
  }
  if (colon != std::string::npos) return {name, arg.substr(colon + 1)};
  std::optional<std::string> value = launcher_env(name.c_str());
  if (!value) {
    throw UsageError(flag + " " + name + ": " + name +
                     " is not set in the launcher's environment (pass a value: " + flag + " " +
                     name + ":VALUE)");
  }
  return {name, *value};
}

std::vector<EnvVar> ParseEnvArgs(const std::string& flag, const std::vector<std::string>& args,
                                 EnvGetter launcher_env) {
  std::vector<EnvVar> out;
  for (const std::string& a : args) out.push_back(ParseEnvArg(flag, a, launcher_env));
  return out;
}

LauncherKind ParseLauncher(const std::string& name) {
  for (LauncherKind k :
       {LauncherKind::kLocal, LauncherKind::kSsh, LauncherKind::kMpi, LauncherKind::kSlurm,
        LauncherKind::kSge, LauncherKind::kRay, LauncherKind::kSpark}) {
    if (name == LauncherName(k)) return k;
  }
  throw UsageError("--launcher " + name + ": unknown launcher '" + name +
                   "' (choose from local, ssh, mpi, slurm, sge, ray, spark, kubernetes)");
}

void CheckRange(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    throw UsageError(std::string(flag) + " must be between " + std::to_string(lo) + " and " +
                     std::to_string(hi) + " (got " + std::to_string(value) + ")");
  }
}

bool HasWhitespace(const std::string& s) { return s.find_first_of(" \t\n") != std::string::npos; }

std::vector<std::string> SplitWords(const std::string& s) {
  std::vector<std::string> words;
  size_t start = s.find_first_not_of(" \t\n");
  while (start != std::string::npos) {
    const size_t end = s.find_first_of(" \t\n", start);
    words.push_back(s.substr(start, end - start));
    start = s.find_first_not_of(" \t\n", end);
  }
  return words;
}

// CLI11 stops at an unknown flag and leaves it, and everything after it, in `remaining` instead
// of failing: checked first, so that `--image X -n 2` names --image rather than a missing -n.
void RejectUnknownOption(const std::vector<std::string>& rest) {
  if (!rest.empty() && rest.front() != "--" && rest.front().size() > 1 && rest.front()[0] == '-') {
    throw UsageError("unknown option '" + rest.front() +
                     "' (see dtrain launch --help; to pass flags to the workers, put the command "
                     "after `--`)");
  }
}

// The part of the command line CLI11 did not consume is the user command, possibly behind `--`.
std::vector<std::string> ExtractCommand(std::vector<std::string> rest) {
  RejectUnknownOption(rest);
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (rest.empty() ||
      (rest.size() == 1 && rest[0].find_first_not_of(" \t\n") == std::string::npos)) {
    throw UsageError(
        "no command given: name the workers' command after the options, e.g. "
        "`dtrain launch -n 2 -- python train.py`");
  }
  // The seeds' quoted spelling, `dtrain launch -n 2 "python train.py --x 1"`: one argument that
  // only a shell can split.
  if (rest.size() == 1 && HasWhitespace(rest[0])) return {"/bin/sh", "-c", rest[0]};
  return rest;
}

struct RawFlags {
  int num_workers = -1;  // -1: not given
  std::optional<int> num_servers;
  std::string launcher = "local";
  std::optional<std::string> hostfile, sync_dst_dir, interface, ssh_opts;
  std::vector<std::string> env_all, env_server, env_worker;
  std::optional<std::string> output_dir;
  bool autotune = false;
  std::optional<std::string> autotune_log_file;
  int64_t kill_grace_ms = 3000;
  int64_t service_grace_ms = 30000;
  int max_restarts = 0;
  std::optional<std::string> host_discovery_script;
  std::optional<int> min_np, max_np;
  std::optional<int64_t> elastic_timeout_s;
  std::optional<int> status_port;
  std::string status_host = "127.0.0.1";
  int64_t status_linger_s = 0;
  bool no_summary = false;
};

// Builds the CLI11 description of our flags. prefix_command(): parsing stops at the first argument
// that is not ours, which is where the user command starts.
std::unique_ptr<CLI::App> MakeParser(RawFlags* f) {
  auto app = std::make_unique<CLI::App>(
      "Start a distributed job here or on other hosts (--launcher): one scheduler, S servers and "
      "N workers running COMMAND (-s 0: N workers only, an allreduce job). Each process gets "
      "DMLC_ROLE, DMLC_PS_ROOT_URI/PORT, DMLC_NUM_SERVER/WORKER and DTRAIN_NODE_RANK; their "
      "output is merged, one prefixed line at a time. The first process to fail stops the whole "
      "job, and its exit code becomes the launcher's.",
      "dtrain launch");
  app->prefix_command();
  app->footer(
      "COMMAND: everything after `--`, or from the first argument that is not an option on\n"
      "(options after it are the command's). One quoted argument with spaces runs in /bin/sh -c.\n"
      "Example: dtrain launch -n 2 -s 1 --env OMP_NUM_THREADS:4 -- python train.py --kvstore "
      "dist_sync\n"
      "Over ssh: dtrain launch -n 2 -H hosts --launcher ssh --sync-dst-dir /tmp/job -- "
      "python train.py");
  app->add_option("-n,--num-workers", f->num_workers,
                  "number of workers (required, >= 1, except in an elastic job)");
  app->add_option("-s,--num-servers", f->num_servers,
                  "number of servers (default: N); 0: an allreduce job without servers");
  app->add_option("--launcher", f->launcher,
                  "where processes run: local (default), ssh, mpi, slurm, sge, ray or spark (an "
                  "elastic job's workers on a Ray cluster's nodes or in a Spark job's tasks, "
                  "with --host-discovery-script 'python3 -m dtrain.ray.discover' or "
                  "dtrain.spark.discover), or kubernetes (pods: its own options, `dtrain launch "
                  "--launcher kubernetes --help`)");
  app->add_option("-H,--hostfile", f->hostfile,
                  "the hosts, one a line: NAME or ADDRESS, optionally :SLOTS; # comments. ssh: "
                  "servers, then workers, cycle through them (one of each per host when there "
                  "are N hosts); the scheduler runs here");
  app->add_option("--sync-dst-dir", f->sync_dst_dir,
                  "ssh: first copy the current directory to DIR on every host (rsync -a), then "
                  "run there; without it, processes run in the current directory's path");
  app->add_option("--interface", f->interface,
                  "network interface whose address every node announces (DMLC_INTERFACE); "
                  "otherwise ssh nodes announce their hostfile address");
  app->add_option("--ssh-opts", f->ssh_opts,
                  "ssh: extra ssh arguments, split at spaces, that take precedence over the "
                  "launcher's (-T, BatchMode=yes, ConnectTimeout=10, ServerAliveInterval=5), e.g. "
                  "\"-F ./ssh_config -p 2222\". The hosts need dtrain at this launcher's path; "
                  "they get the launcher's DMLC_*, PS_*, DTRAIN_*, MXNET_*, HOROVOD_* and "
                  "OMP_NUM_THREADS; a remote process stops when its ssh connection ends");
  app->add_option("--env", f->env_all,
                  "NAME:VALUE sets NAME in every process; NAME passes the launcher's own value")
      ->allow_extra_args(false);
  app->add_option("--env-server", f->env_server, "as --env, for servers only")
      ->allow_extra_args(false);
  app->add_option("--env-worker", f->env_worker, "as --env, for workers only")
      ->allow_extra_args(false);
  app->add_option("--output-dir", f->output_dir,
                  "also write each process's output to DIR/<role>-<rank>.log");
  app->add_flag("--autotune", f->autotune,
                "allreduce mode: tune the fusion threshold and cycle time online, as Horovod's "
                "autotune (HOROVOD_AUTOTUNE=1 in every worker)");
  app->add_option("--autotune-log-file", f->autotune_log_file,
                  "with --autotune: rank 0 writes each sample and the values chosen there, as CSV "
                  "(HOROVOD_AUTOTUNE_LOG)");
  app->add_option("--kill-grace-ms", f->kill_grace_ms,
                  "time between SIGTERM and SIGKILL when stopping the job (default 3000)");
  app->add_option("--service-grace-ms", f->service_grace_ms,
                  "time the scheduler and servers get to exit by themselves after the workers "
                  "succeeded (default 30000)");
  app->add_option("--max-restarts", f->max_restarts,
                  "parameter-server jobs: replace a worker that fails (exits non-zero or dies) "
                  "by a new process with its rank, up to N times in all; the job waits for it "
                  "(DTRAIN_RESTART_WAIT_MS, 60000 by default) and it resumes where its rank was "
                  "(default 0: the first failure stops the job)");
  app->add_option("--host-discovery-script", f->host_discovery_script,
                  "an elastic allreduce job (-s 0, Horovod's elastic mode): run SCRIPT every "
                  "second; it prints the hosts that may run workers, one `HOST:SLOTS` a line. "
                  "Workers start on free slots (up to --max-np); a worker that fails retires its "
                  "slot and the others go on from their last commit (dtrain.torch.elastic). "
                  "--launcher local: this machine's names only; --launcher ssh: any host; "
                  "--launcher ray: the Ray nodes' addresses; --launcher spark: the addresses of "
                  "dtrain.spark.run_elastic's tasks");
  app->add_option(
      "--min-np", f->min_np,
      "elastic: the fewest workers to train with (default -n, else 1); below it the "
      "job waits --elastic-timeout for the discovery script to offer slots, then fails");
  app->add_option("--max-np", f->max_np, "elastic: the most workers (default -n, else no bound)");
  app->add_option("--elastic-timeout", f->elastic_timeout_s,
                  "elastic: seconds the job may wait for enough slots, or for a worker to join a "
                  "new membership (default 600, Horovod's)");
  app->add_option("--status-port", f->status_port,
                  "serve a live status page of the job at http://HOST:PORT/ (JSON at "
                  "/api/status); 0 picks a free port");
  app->add_option("--status-host", f->status_host,
                  "the address the status page listens on (default 127.0.0.1: this machine only)");
  app->add_option("--status-linger-s", f->status_linger_s,
                  "keep serving the status page this long after the job ended (default 0)");
  app->add_flag("--no-summary", f->no_summary, "no end-of-job summary");
  return app;
}

// --host-discovery-script and its companions. -n is optional: the defaults of --min-np and
// --max-np.
void ParseElastic(const RawFlags& f, LaunchOptions* o) {
  if (f.host_discovery_script->empty()) {
    throw UsageError("--host-discovery-script must not be empty");
  }
  if (f.num_servers.value_or(1) != 0) {
    throw UsageError(
        "--host-discovery-script starts an elastic allreduce job: add -s 0 (the "
        "workers of a parameter-server job are replaced with --max-restarts instead)");
  }
  if (f.num_workers != -1) CheckRange("-n/--num-workers", f.num_workers, 1, kMaxProcessesPerRole);
  const int n = std::max(f.num_workers, 0);
  o->min_np = f.min_np.value_or(n > 0 ? n : 1);
  o->max_np = f.max_np.value_or(n > 0 ? n : kMaxProcessesPerRole);
  CheckRange("--min-np", o->min_np, 1, kMaxProcessesPerRole);
  CheckRange("--max-np", o->max_np, 1, kMaxProcessesPerRole);
  if (o->min_np > o->max_np) {
    throw UsageError("--min-np " + std::to_string(o->min_np) + " is more than --max-np " +
                     std::to_string(o->max_np));
  }
  if (f.elastic_timeout_s) {
    CheckRange("--elastic-timeout", *f.elastic_timeout_s, 1, kMaxGraceMs / 1000);
    o->elastic_timeout = Duration(*f.elastic_timeout_s * 1000);
  }
  o->host_discovery_script = f.host_discovery_script;
}

}  // namespace

const char* LauncherName(LauncherKind kind) {
  switch (kind) {
    case LauncherKind::kLocal:
      return "local";
    case LauncherKind::kSsh:
      return "ssh";
    case LauncherKind::kMpi:
      return "mpi";
    case LauncherKind::kSlurm:
      return "slurm";
    case LauncherKind::kSge:
      return "sge";
    case LauncherKind::kRay:
      return "ray";
    case LauncherKind::kSpark:
      return "spark";
  }
  return "?";
}

std::string LaunchHelp() {
  RawFlags f;
  return MakeParser(&f)->help();
}

std::optional<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args,
                                             EnvGetter launcher_env) {
  if (launcher_env == nullptr) launcher_env = &LauncherValue;
  RawFlags f;
  std::unique_ptr<CLI::App> app = MakeParser(&f);
  try {
    // CLI11 consumes its argument vector from the back.
    app->parse(std::vector<std::string>(args.rbegin(), args.rend()));
  } catch (const CLI::CallForHelp&) {
    std::fputs(app->help().c_str(), stdout);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  RejectUnknownOption(app->remaining());

  LaunchOptions o;
  if (f.host_discovery_script) {
    ParseElastic(f, &o);
  } else {
    if (f.min_np || f.max_np || f.elastic_timeout_s) {
      throw UsageError(
          "--min-np, --max-np and --elastic-timeout belong to an elastic job: add "
          "--host-discovery-script SCRIPT (and -s 0)");
    }
    if (f.num_workers == -1) {
      throw UsageError(
          "-n/--num-workers is required (an elastic job takes "
          "--host-discovery-script instead)");
    }
    CheckRange("-n/--num-workers", f.num_workers, 1, kMaxProcessesPerRole);
  }
  o.num_workers = std::max(f.num_workers, 0);
  o.num_servers = f.num_servers.value_or(o.num_workers);
  CheckRange("-s/--num-servers", o.num_servers, 0, kMaxProcessesPerRole);
  o.launcher = ParseLauncher(f.launcher);
  o.env_all = ParseEnvArgs("--env", f.env_all, launcher_env);
  o.env_server = ParseEnvArgs("--env-server", f.env_server, launcher_env);
  o.env_worker = ParseEnvArgs("--env-worker", f.env_worker, launcher_env);
  if (f.autotune_log_file && !f.autotune) {
    throw UsageError("--autotune-log-file logs what --autotune does: add --autotune");
  }
  if (f.autotune) {
    o.env_worker.emplace_back("HOROVOD_AUTOTUNE", "1");
    if (f.autotune_log_file) {
      if (f.autotune_log_file->empty()) throw UsageError("--autotune-log-file must not be empty");
      const std::filesystem::path folder =
          std::filesystem::absolute(*f.autotune_log_file).parent_path();
      if (!std::filesystem::is_directory(folder)) {
        throw UsageError("--autotune-log-file " + *f.autotune_log_file + ": no folder " +
                         folder.string());
      }
      // Absolute: rank 0 may run in another directory (--sync-dst-dir, a cluster's task).
      o.env_worker.emplace_back("HOROVOD_AUTOTUNE_LOG",
                                std::filesystem::absolute(*f.autotune_log_file).string());
    }
  }
  if (f.output_dir && f.output_dir->empty()) throw UsageError("--output-dir must not be empty");
  if (f.hostfile && f.hostfile->empty()) throw UsageError("-H/--hostfile must not be empty");
  if (f.sync_dst_dir && f.sync_dst_dir->empty()) {
    throw UsageError("--sync-dst-dir must not be empty");
  }
  if (f.interface && f.interface->empty()) throw UsageError("--interface must not be empty");
  o.hostfile = f.hostfile;
  o.sync_dst_dir = f.sync_dst_dir;
  o.interface = f.interface;
  if (f.ssh_opts) o.ssh_options = SplitWords(*f.ssh_opts);
  o.output_dir = f.output_dir;
  CheckRange("--kill-grace-ms", f.kill_grace_ms, 0, kMaxGraceMs);
  CheckRange("--service-grace-ms", f.service_grace_ms, 0, kMaxGraceMs);
  o.kill_grace = Duration(f.kill_grace_ms);
  o.service_grace = Duration(f.service_grace_ms);
  CheckRange("--max-restarts", f.max_restarts, 0, 10000);
  o.max_restarts = f.max_restarts;
  if (o.max_restarts > 0 && o.num_servers == 0) {
    throw UsageError(
        "--max-restarts replaces workers of parameter-server jobs; an allreduce job (-s 0) "
        "cannot take a new rank in the middle of its collectives");
  }
  if (o.max_restarts > 0 && o.launcher != LauncherKind::kLocal &&
      o.launcher != LauncherKind::kSsh) {
    throw UsageError(std::string("--max-restarts works with --launcher local and ssh, which "
                                 "start each process themselves; --launcher ") +
                     LauncherName(o.launcher) + " starts them through its own tool");
  }
  if (o.launcher == LauncherKind::kRay && !o.host_discovery_script) {
    throw UsageError(
        "--launcher ray runs elastic jobs, on the Ray nodes that --host-discovery-script "
        "'python3 -m dtrain.ray.discover' lists; for a fixed-size job on Ray, use "
        "dtrain.ray.RayExecutor");
  }
  if (o.launcher == LauncherKind::kSpark && !o.host_discovery_script) {
    throw UsageError(
        "--launcher spark runs the elastic jobs of dtrain.spark.run_elastic, which starts it; "
        "for a fixed-size job on Spark, use dtrain.spark.run");
  }
  if (o.host_discovery_script) {
    if (o.launcher != LauncherKind::kLocal && o.launcher != LauncherKind::kSsh &&
        o.launcher != LauncherKind::kRay && o.launcher != LauncherKind::kSpark) {
      throw UsageError(
          std::string("--host-discovery-script works with --launcher local (this machine's "
                      "slots), ssh (any host's), ray (a Ray cluster's nodes) and spark (a Spark "
                      "job's tasks), which start "
                      "each worker themselves; --launcher ") +
          LauncherName(o.launcher) + " starts them through its own tool");
    }
    if (o.hostfile) {
      throw UsageError(
          "-H/--hostfile and --host-discovery-script: an elastic job's hosts are those the "
          "discovery script prints (a fixed list: a script that prints the hostfile)");
    }
    if (o.sync_dst_dir) {
      throw UsageError(
          "--sync-dst-dir and --host-discovery-script: hosts join an elastic job while it runs, "
          "so the directory cannot be copied before it starts; put the program on every host "
          "the script may offer");
    }
    if (o.max_restarts > 0) {
      throw UsageError(
          "--max-restarts and --host-discovery-script: an elastic job replaces "
          "nothing; its workers go on without a failed one, and new slots from the "
          "discovery script add workers");
    }
  }
  if (f.status_port) {
    CheckRange("--status-port", *f.status_port, 0, 65535);
    o.status_port = static_cast<uint16_t>(*f.status_port);
  }
  if (f.status_host.empty()) throw UsageError("--status-host must not be empty");
  o.status_host = f.status_host;
  CheckRange("--status-linger-s", f.status_linger_s, 0, kMaxGraceMs / 1000);
  o.status_linger = Duration(f.status_linger_s * 1000);
  o.summary = !f.no_summary;
  o.worker_command = ExtractCommand(app->remaining());
  return o;
}

}  // namespace dtrain::launcher
