#include "launcher/plan/cluster_tools/cluster_tool_plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "dtrain/common/error.h"
#include "launcher/plan/local_address.h"
#include "launcher/run/process_group.h"

namespace dtrain::launcher {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// The spec's environment as all of its role's tasks share it. BuildJobPlan puts the launcher's
// variables first and the user's --env after them, so the first DMLC_NODE_HOST is the launcher's
// (there is none with --interface, which sets DMLC_INTERFACE instead); a user's own stays.
std::vector<EnvVar> SharedEnv(const ProcessSpec& spec, const LaunchOptions& options) {
  std::vector<EnvVar> env;
  bool node_host_dropped = options.interface.has_value();
  for (const EnvVar& v : spec.env) {
    if (IsPerRankVariable(v.first)) continue;  // the task script sets DTRAIN_NODE_RANK
    if (v.first == "DMLC_NODE_HOST" && !node_host_dropped) {
      node_host_dropped = true;
      continue;
    }
    env.push_back(v);
  }
  return env;
}

}  // namespace

std::string RolePlural(Role role) { return std::string(RoleName(role)) + "s"; }

TaskPlan ToTaskPlan(const JobPlan& plan, const LaunchOptions& options) {
  TaskPlan out;
  for (const ProcessSpec& spec : plan.processes) {
    if (spec.role == Role::kScheduler) {
      out.scheduler = spec;
      continue;
    }
    if (out.roles.empty() || out.roles.back().role != spec.role) {
      RoleTasks tasks;
      tasks.role = spec.role;
      tasks.argv = spec.argv;
      tasks.env = SharedEnv(spec, options);
      out.roles.push_back(std::move(tasks));
    }
    ++out.roles.back().count;
  }
  return out;
}

std::vector<std::string> CommandWithRankFrom(const std::string& rank_expression,
                                             const std::vector<std::string>& argv) {
  std::vector<std::string> out = {
      "/bin/sh", "-c",
      "DTRAIN_NODE_RANK=" + rank_expression + "; export DTRAIN_NODE_RANK; exec \"$@\"",
      "dtrain-task"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::string SchedulerAddressFor(const std::vector<std::string>& hosts,
                                const LaunchOptions& options) {
  const std::string* other = nullptr;
  for (const std::string& h : hosts) {
    if (!IsThisMachine(h)) {
      other = &h;
      break;
    }
  }
  // Loopback keeps a one-machine job off the network (and working in containers without one).
  if (other == nullptr) return "127.0.0.1";
  return SchedulerAddressToward(*other, options.interface);
}

Placement PlaceOnClusterHosts(const std::vector<HostEntry>& hosts, const LaunchOptions& options,
                              const std::string& scheduler_address) {
  Placement p = PlaceOnHosts(hosts, options.num_servers, options.num_workers, scheduler_address);
  for (const HostEntry& h : hosts) {
    if (IsThisMachine(h.host)) p.addresses[h.host] = scheduler_address;
  }
  return p;
}

std::optional<std::string> FindProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) == 0) return program;
    return std::nullopt;
  }
  // Raw read: PATH is the system's, searched as execvp would; not one of dtrain's variables.
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
      return candidate;
    }
  }
  return std::nullopt;
}

std::vector<std::string> ParseHostnames(const std::string& output) {
  std::vector<std::string> hosts;
  std::istringstream in(output);
  for (std::string h; in >> h;) hosts.push_back(h);
  return hosts;
}

ScratchFile::ScratchFile(const std::string& dir, const std::string& name_prefix,
                         const std::string& contents) {
  std::string templ = (std::filesystem::path(dir) / (name_prefix + "XXXXXX")).string();
  UniqueFd fd(::mkostemp(templ.data(), O_CLOEXEC));
  if (fd.get() < 0) throw Error(Errno("cannot create a file in " + dir));
  path_ = templ;
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd.get(), contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string error = Errno("cannot write " + path_);
      ::unlink(path_.c_str());
      throw Error(error);
    }
    done += static_cast<size_t>(n);
  }
}

ScratchFile::~ScratchFile() { ::unlink(path_.c_str()); }

ScratchDirectory::ScratchDirectory(const std::string& parent, const std::string& name_prefix) {
  std::string templ = (std::filesystem::path(parent) / (name_prefix + "XXXXXX")).string();
  if (::mkdtemp(templ.data()) == nullptr) {
    throw Error(Errno("cannot create a directory in " + parent));
  }
  path_ = templ;
}

ScratchDirectory::~ScratchDirectory() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDirectory() {
  // Raw read: TMPDIR is the system's scratch folder (POSIX); not one of dtrain's variables.
  const char* dir = std::getenv("TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

std::string RequireProgram(const std::string& program, LauncherKind launcher,
                           const std::string& hint) {
  std::optional<std::string> path = FindProgram(program);
  if (!path) {
    throw UsageError(std::string("--launcher ") + LauncherName(launcher) + " needs " + program +
                     ", which is not in PATH (" + hint + ")");
  }
  return *path;
}

void RejectSshOnlyFlags(const LaunchOptions& options) {
  const std::string name = LauncherName(options.launcher);
  if (options.sync_dst_dir) {
    throw UsageError("--sync-dst-dir works with --launcher ssh only (with --launcher " + name +
                     ", put the job on a file system the nodes share)");
  }
  if (!options.ssh_options.empty()) {
    throw UsageError("--ssh-opts works with --launcher ssh only");
  }
}

std::string StartLine(const JobPlan& plan, const std::string& where) {
  auto count = [](int n, const char* noun) {
    return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
  };
  const std::string at = plan.scheduler_host + ":" + std::to_string(plan.scheduler_port);
  if (plan.num_servers == 0) {
    return "dtrain launch: starting " + count(plan.num_workers, "worker") + " " + where +
           " (allreduce job: no scheduler or servers; rendezvous at " + at + ")";
  }
  return "dtrain launch: starting 1 scheduler here (at " + at + "), " +
         count(plan.num_servers, "server") + " and " + count(plan.num_workers, "worker") + " " +
         where;
}

SupervisorOptions SupervisionFor(const LaunchOptions& options) {
  SupervisorOptions s;
  s.kill_grace = options.kill_grace;
  s.service_grace = options.service_grace;
  s.output_dir = options.output_dir;
  return s;
}

}  // namespace dtrain::launcher
