// Reading what `qsub -sync y -terse` says about an array job.
//
// Every line is qsub's own (the tasks' output goes to files, see sge_launcher_args.h):
//
//   12.1-4:1                                   the job id (-terse), first
//   Job 12.3 exited with exit code 3.          a task ended (-sync y), as it happens
//   Job 12.2 exited because of signal SIGKILL
//   Unable to run job 12.1                     Grid Engine gave up on it (or it was deleted)
//
// Task N of the array is rank N-1 of its role.
#pragma once

#include <string>

#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher {

class QsubOutputParser : public LineFrontEndParser {
 public:
  explicit QsubOutputParser(std::string qdel) : qdel_(std::move(qdel)) {}

  std::optional<TaskFailure> FailureIn(std::string_view tool_line) override;
  // `qdel JOB` once the job id is known.
  std::vector<std::string> CancelCommand() const override;

  const std::string& job_id() const { return job_id_; }

 protected:
  void OnLine(std::string_view line, bool from_stderr, const Sink& sink) override {
    sink.tool_line(line, from_stderr);
  }

 private:
  std::string qdel_;
  std::string job_id_;
};

}  // namespace dtrain::launcher
