// Which failure a job run through cluster tools names as its cause (batch_job.h).
//
// When one process of a job fails, the others fail after it: the scheduler ends the job as soon as
// a worker's connection drops, so the servers and the other workers exit non-zero too. Locally the
// launcher sees the first exit first. Through mpirun, srun or qsub it does not: a tool reports a
// failed task only after it stopped the others, and the reports of two tools arrive in any order
// (mpirun's own "first process" is not always the first either). So the launcher collects what
// it sees for a few seconds and decides with this, in order of trust:
//   1. in a job with a scheduler, the node the scheduler says it stops the job for ("dtrain
//      scheduler: worker 2 (...) failed: ...; stopping the job"): it saw every connection drop
//      in order. The tools' report on that task gives the exit code; without one, the
//      scheduler's words are the message;
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

#include "common/config.h"
#include "launcher/batch_job.h"

namespace dtrain::launcher {

// The node a scheduler's output line says it stops the job for (src/ps/scheduler.cc: "dtrain
// scheduler: worker 2 (host:port) failed: <reason>; stopping the job"); nullopt for other lines.
struct SchedulerBlame {
  Role role = Role::kWorker;
  int rank = 0;
  std::string reason;
};
std::optional<SchedulerBlame> ParseSchedulerBlame(std::string_view line);

class CulpritFinder {
 public:
  struct Verdict {
    std::string message;  // "worker 2 exited with code 9 (reported by mpirun)"
    int exit_code = 1;    // the launcher's exit code
  };

  explicit CulpritFinder(bool has_scheduler) : has_scheduler_(has_scheduler) {}

  // A line of the scheduler's output; remembers the node it stops the job for, if it names one.
  void SchedulerLine(std::string_view line);
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
  using Blame = SchedulerBlame;

  const Report* ReportOn(Role role, int rank) const;
  const Report* FirstReportOf(int front_end) const;

  bool has_scheduler_;
  std::optional<Blame> blame_;
  std::optional<int> first_failing_;
  std::vector<Report> reports_;
  std::optional<Verdict> process_failure_;
};

}  // namespace dtrain::launcher
