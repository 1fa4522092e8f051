#include "launcher/plan/forwarded_env.h"

#include <set>

extern char** environ;

namespace dtrain::launcher {

bool IsForwarded(const std::string& name, RemoteStart how) {
  if (name == "DMLC_NODE_HOST" || name == "DMLC_NODE_PORT") return false;  // per machine
  // Over ssh the environment goes on the remote command line, visible to every user of both hosts;
  // the secret goes through the session's stdin instead (remote_command.h).
  if (name == "DTRAIN_JOB_SECRET" && how == RemoteStart::kSsh) return false;
  for (const char* prefix : {"DMLC_", "PS_", "DTRAIN_", "MXNET_", "HOROVOD_"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  if (name == "OMP_NUM_THREADS" || name == "KMP_AFFINITY") return true;
  if (how == RemoteStart::kSsh) return false;
  return name.rfind("NCCL_", 0) == 0 || name == "PATH" || name == "LD_LIBRARY_PATH" ||
         name == "PYTHONPATH";
}

std::vector<EnvVar> ForwardedEnvironment(RemoteStart how) {
  std::vector<EnvVar> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && IsForwarded(entry.substr(0, eq), how)) {
      env.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
    }
  }
  return env;
}

std::vector<std::string> ForwardedVariableNames(RemoteStart how) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const EnvVar& v : ForwardedEnvironment(how)) {
    if (seen.insert(v.first).second) names.push_back(v.first);
  }
  return names;
}

}  // namespace dtrain::launcher
