#include "launcher/plan/cluster_tools/sge_launcher_args.h"

#include <filesystem>

#include "launcher/run/remote_command.h"

namespace dtrain::launcher {

std::string SgeJobScript(const RoleTasks& tasks) {
  std::string s = "#!/bin/sh\n";
  s += "# dtrain launch: the " + RolePlural(tasks.role) + " of one job, array task i is " +
       RoleName(tasks.role) + " i-1.\n";
  s += "DTRAIN_NODE_RANK=$((${SGE_TASK_ID:?} - 1))\nexport DTRAIN_NODE_RANK\n";
  for (const EnvVar& v : tasks.env) {
    s += v.first + "=" + ShellQuote(v.second) + "\nexport " + v.first + "\n";
  }
  s += "exec " + ShellJoin(tasks.argv) + "\n";
  return s;
}

std::vector<std::string> QsubCommand(const std::string& qsub, const RoleTasks& tasks,
                                     const std::string& output_dir, const std::string& script) {
  const std::string role = RoleName(tasks.role);
  const std::string base = (std::filesystem::path(output_dir) / role).string();
  return {qsub,   "-sync",
          "y",    "-terse",
          "-t",   "1-" + std::to_string(tasks.count),
          "-N",   "dtrain-" + RolePlural(tasks.role),
          "-S",   "/bin/sh",
          "-cwd", "-V",
          "-o",   base + ".$TASK_ID.out",
          "-e",   base + ".$TASK_ID.err",
          script};
}

std::string SgeTaskOutputPath(const std::string& output_dir, Role role, int task,
                              bool stderr_file) {
  return (std::filesystem::path(output_dir) /
          (std::string(RoleName(role)) + "." + std::to_string(task + 1) +
           (stderr_file ? ".err" : ".out")))
      .string();
}

}  // namespace dtrain::launcher
