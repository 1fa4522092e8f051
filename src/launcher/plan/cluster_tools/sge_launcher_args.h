// The qsub command lines and job scripts of `dtrain launch --launcher sge`. Pure functions: a test
// checks every word.
//
// One array job per role (as the other cluster backends start one front end per role), submitted
// and waited for by one `qsub -sync y`:
//
//   qsub -sync y -terse -t 1-K -N dtrain-<role>s -S /bin/sh -cwd -V
//        -o DIR/<role>.$TASK_ID.out -e DIR/<role>.$TASK_ID.err SCRIPT
//
//   - array task i (SGE_TASK_ID, from 1) is rank i-1 of the role;
//   - the script sets the job's variables itself: qsub's -v cannot carry a value with a comma;
//     -V passes the rest of the launcher's environment (PATH, LD_LIBRARY_PATH, ...), as SGE users
//     pass it with `#$ -V`; -cwd runs the tasks in the launcher's directory;
//   - -terse: qsub's first line is the job id alone, which `qdel` needs to stop the job: when
//     qsub -sync y is interrupted it stops waiting, and the job would run on;
//   - the tasks' output goes to files in DIR (on a file system the nodes share with this host:
//     the current directory, as -cwd needs anyway) that the launcher reads as they grow.
//
// Grid Engine runs array tasks as slots free up: a role's tasks run together only when the queue
// has a slot for each (servers and workers together), which the nodes' start-up deadline
// (DTRAIN_START_TIMEOUT_MS) turns into a clear failure otherwise.
#pragma once

#include <string>
#include <vector>

#include "launcher/plan/cluster_tools/cluster_tool_plan.h"

namespace dtrain::launcher {

// The job script of one role: sets DTRAIN_NODE_RANK and the tasks' variables, then execs the
// command.
std::string SgeJobScript(const RoleTasks& tasks);

// `output_dir`: where the tasks' output files go; `script`: the job script's path.
std::vector<std::string> QsubCommand(const std::string& qsub, const RoleTasks& tasks,
                                     const std::string& output_dir, const std::string& script);

// The files QsubCommand makes task `task` (from 0) write: DIR/<role>.<task+1>.out / .err.
std::string SgeTaskOutputPath(const std::string& output_dir, Role role, int task, bool stderr_file);

}  // namespace dtrain::launcher
