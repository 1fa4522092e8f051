// Reading the output of `srun --label` back into its tasks' output.
//
// srun passes each task's output on line by line, as "RANK: text" (the rank right-aligned to the
// width of the largest, " 3: text" in a step of 10 or more), stdout lines on its stdout and stderr
// lines on its stderr. Its own lines start "srun: "; the one that matters says how a task ended:
//
//   srun: error: node-a: task 1: Exited with exit code 3
//   srun: error: node-a: tasks 0-1: Killed
//
// (a signal is written as strsignal() words: "Killed", "Segmentation fault (core dumped)").
#pragma once

#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher {

class SrunOutputParser : public LineFrontEndParser {
 public:
  std::optional<TaskFailure> FailureIn(std::string_view tool_line) override;

 protected:
  void OnLine(std::string_view line, bool from_stderr, const Sink& sink) override;
};

}  // namespace dtrain::launcher
