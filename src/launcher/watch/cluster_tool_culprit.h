// Which failure a job run through cluster tools names as its cause (cluster_tool_job.h).
//
// When one process of a job fails, the others fail after it: the scheduler ends the job as soon as
// a worker's connection drops, so the servers and the other workers exit non-zero too. Locally the
// launcher sees the first exit first. Through mpirun, srun or qsub it does not: a tool reports a
// failed task only after it stopped the others, and the reports of two tools arrive in any order
// (mpirun's own "first process" is not always the first either). So the launcher collects what
// it sees for a few seconds and decides with this, in order of trust:
//   1. the node a failure record names (job_status.h): the scheduler's, which saw every
//      connection drop in order, or an allreduce rank's. The tools' report on that task gives the
//      exit code; without one, the record's cause is the message;
//   2. without a scheduler (-s 0), the task reported by the first tool that reported a failure or
//      said it was aborting;
//   3. then any task a tool reported, then a process here that failed (a tool exiting non-zero
//      without naming a task, the scheduler).
//
// Pure and single-threaded: the caller feeds what it sees, in the order it sees it, and asks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "launcher/status/job_status.h"
#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher {

class CulpritFinder {
 public:
  struct Verdict {
    std::string message;  // "worker 2 exited with code 9 (reported by mpirun)"
    int exit_code = 1;    // the launcher's exit code
  };

  explicit CulpritFinder(bool has_scheduler) : has_scheduler_(has_scheduler) {}

  // A failure record names the node the job fails for; the first one counts.
  void Blame(const FailureRecord& failure);
  // Front end `front_end` (any id the caller picks) reported a failure or said it was aborting.
  void FrontEndFailing(int front_end);
  // Front end `front_end`, which runs `tool` for `role`, reported a task's failure.
  void TaskFailed(int front_end, const std::string& tool, Role role, const TaskFailure& failure);
  // A process here failed: `message` names it ("scheduler (pid 42) exited with code 1").
  void ProcessFailed(const std::string& message, int exit_code);

  bool AnyFailure() const;
  // The verdict, once nothing still to come can change it; nullopt meanwhile.
  std::optional<Verdict> Certain() const;
  // The best verdict from what is known; nullopt when nothing failed.
  std::optional<Verdict> Best() const;

 private:
  struct Report {
    int front_end = 0;
    Role role = Role::kWorker;
    TaskFailure failure;
    std::string message;
  };
  const Report* ReportOn(Role role, int rank) const;
  const Report* FirstReportOf(int front_end) const;

  bool has_scheduler_;
  std::optional<FailureRecord> blame_;
  std::optional<int> first_failing_;
  std::vector<Report> reports_;
  std::optional<Verdict> process_failure_;
};

}  // namespace dtrain::launcher
