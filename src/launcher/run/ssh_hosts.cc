#include "launcher/run/ssh_hosts.h"

#include <string>

#include "common/config/config.h"
#include "dtrain/common/error.h"
#include "launcher/plan/forwarded_env.h"
#include "launcher/run/remote_command.h"
#include "launcher/run/setup_command.h"

namespace dtrain::launcher {
namespace {

// `ssh -G` reads configuration files only; it does not connect.
constexpr Duration kSshConfigTimeout{10000};

}  // namespace

std::map<std::string, std::string> SshHostnames(const std::vector<std::string>& ssh_options,
                                                const std::vector<std::string>& hosts,
                                                const std::string& source) {
  std::vector<std::vector<std::string>> queries;
  for (const std::string& h : hosts) queries.push_back(SshConfigQuery(ssh_options, h));
  const std::vector<SetupResult> results = RunSetupCommands(queries, kSshConfigTimeout);
  std::map<std::string, std::string> names;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string name = HostnameFromSshConfig(results[i].output);
    if (!results[i].succeeded() || name.empty()) {
      throw UsageError("ssh cannot use host '" + hosts[i] + "' from " + source + ": `ssh -G` " +
                       results[i].Describe(kSshConfigTimeout) +
                       " (check --ssh-opts and the ssh configuration)");
    }
    names[hosts[i]] = name;
  }
  return names;
}

ProcessSpec RunOverSsh(const LaunchOptions& options, const std::string& remote_dir,
                       ProcessSpec spec, const std::string& address) {
  if (!options.interface) SetEnv(&spec.env, "DMLC_NODE_HOST", address);
  // The job's secret, which `dtrain launch` has set (or checked) in its own environment.
  const std::string secret = JobSecretFromEnvironment(EnvReader(ProcessEnvironment()));
  const bool has_secret = !secret.empty();
  std::vector<EnvVar> env = ForwardedEnvironment(RemoteStart::kSsh);
  env.insert(env.end(), spec.env.begin(), spec.env.end());
  const std::string script =
      RemoteScript(remote_dir, env, spec.argv, options.kill_grace, has_secret);
  spec.argv = SshCommand(options.ssh_options, spec.host, script);
  spec.stdin_held_open = true;
  if (has_secret) spec.stdin_preamble = secret + "\n";
  spec.remote_via = "ssh";
  return spec;
}

}  // namespace dtrain::launcher
