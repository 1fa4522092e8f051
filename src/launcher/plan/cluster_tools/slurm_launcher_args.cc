#include "launcher/plan/cluster_tools/slurm_launcher_args.h"

namespace dtrain::launcher {

std::vector<std::string> SrunCommand(const std::string& srun, const RoleTasks& tasks) {
  std::vector<std::string> argv = {srun,
                                   "--ntasks=" + std::to_string(tasks.count),
                                   "--distribution=arbitrary",
                                   "--overlap",
                                   "--overcommit",
                                   "--kill-on-bad-exit=1",
                                   "--label",
                                   "--export=ALL",
                                   "--job-name=dtrain-" + RolePlural(tasks.role)};
  const std::vector<std::string> task = CommandWithRankFrom(kSlurmRankExpression, tasks.argv);
  argv.insert(argv.end(), task.begin(), task.end());
  return argv;
}

std::string SlurmHostfile(const std::vector<std::string>& task_hosts) {
  std::string text;
  for (const std::string& h : task_hosts) text += h + "\n";
  return text;
}

std::vector<std::string> ExpandNodelistCommand(const std::string& scontrol,
                                               const std::string& nodelist) {
  return {scontrol, "show", "hostnames", nodelist};
}

}  // namespace dtrain::launcher
