#include "launcher/plan/cluster_tools/mpi_launcher_args.h"

#include <map>
#include <set>

namespace dtrain::launcher {

std::vector<std::string> MpirunCommand(const MpirunRequest& request) {
  std::vector<std::string> argv = {request.mpirun, "--tag-output", "--bind-to", "none"};
  if (request.as_root) argv.push_back("--allow-run-as-root");
  if (request.hostfile) {
    argv.insert(argv.end(), {"--hostfile", *request.hostfile});
    if (request.tasks.role == Role::kServer) argv.insert(argv.end(), {"--map-by", "node"});
  } else {
    argv.push_back("--oversubscribe");
  }
  argv.insert(argv.end(), {"-np", std::to_string(request.tasks.count)});
  std::set<std::string> seen;
  auto pass = [&](const std::string& name) {
    if (seen.insert(name).second) argv.insert(argv.end(), {"-x", name});
  };
  for (const std::string& name : request.forwarded) pass(name);
  for (const EnvVar& v : request.tasks.env) pass(v.first);
  const std::vector<std::string> task = MpiTaskCommand(request.tasks.argv);
  argv.insert(argv.end(), task.begin(), task.end());
  return argv;
}

std::vector<std::string> MpiTaskCommand(const std::vector<std::string>& argv) {
  std::vector<std::string> out = {
      "/bin/sh", "-c",
      "DTRAIN_NODE_RANK=${OMPI_COMM_WORLD_RANK:?}; export DTRAIN_NODE_RANK; \"$@\"; s=$?; "
      "[ \"$s\" -eq 0 ] || echo \"" +
          std::string(kMpiExitMarker) + "$s\" >&2; exit \"$s\"",
      "dtrain-task"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::string OpenMpiHostfile(const std::vector<HostEntry>& hosts) {
  std::vector<std::string> order;
  std::map<std::string, int> slots;
  for (const HostEntry& h : hosts) {
    if (slots.count(h.host) == 0) order.push_back(h.host);
    slots[h.host] += h.slots;
  }
  std::string text = "# written by dtrain launch --launcher mpi\n";
  for (const std::string& h : order) text += h + " slots=" + std::to_string(slots[h]) + "\n";
  return text;
}

}  // namespace dtrain::launcher
