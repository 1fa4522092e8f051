// Reaching hosts through ssh, as the ssh backend does for a hostfile's hosts (ssh_launcher.cc) and
// for the hosts an elastic job's discovery script offers while it runs (elastic_launcher.cc).
// remote_command.h has the commands themselves.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/plan/job_plan.h"
#include "launcher/plan/launch_options.h"

namespace dtrain::launcher {

// host as written ("alice@node-a", an alias of the ssh configuration) -> the name or address ssh
// connects to, which the other nodes use too. Runs `ssh -G` for every host at once (it reads
// configuration files, never connects), each for at most 10 s. Throws UsageError naming a host
// ssh cannot use and where it came from (`source`: "the hostfile").
std::map<std::string, std::string> SshHostnames(const std::vector<std::string>& ssh_options,
                                                const std::vector<std::string>& hosts,
                                                const std::string& source);

// Turns `spec`, placed on spec.host, into a local ssh client that runs it there in `remote_dir`:
// the forwarded environment (forwarded_env.h) first, the spec's own after it (so it wins); the
// job secret, if the launcher has one, goes through the session's stdin, never a command line.
// Unless --interface names one, the process announces `address`, its host's (DMLC_NODE_HOST).
ProcessSpec RunOverSsh(const LaunchOptions& options, const std::string& remote_dir,
                       ProcessSpec spec, const std::string& address);

}  // namespace dtrain::launcher
