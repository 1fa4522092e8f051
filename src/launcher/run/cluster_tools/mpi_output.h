// Reading the output of `mpirun --tag-output` (Open MPI 4) back into its tasks' output.
//
// mpirun forwards each piece its tasks write with a tag in front, "[1,3]<stdout>:" (job, rank,
// stream), and a tag again after every newline inside the piece. A piece that does not end with a
// newline is followed directly by the next tag, of any rank:
//
//   [1,0]<stdout>:x[1,1]<stdout>:x\n      rank 0 wrote "x", then rank 1 wrote "x\n"
//
// So a task's bytes run from a tag to the next newline or the next tag, and per task they are put
// back together into lines by the launcher (any tag-like text a task prints itself would be cut
// there; nothing else is). Lines without a tag are mpirun's own (its error reports).
//
// mpirun's report on the first task that failed spans lines ("Process name: [[9806,1],1]" then
// "Exit code:    3"), or is one line for a signal ("mpirun noticed that process rank 1 with PID 0
// on node vm exited on signal 9 (Killed)."); FailureIn recognises both. Before them, mpirun says
// that it aborts the job ("Per user-direction, the job has been aborted."): it is stopping its
// tasks by itself. That report is missing at times; the task's own last words are not: the
// wrapper of each task writes "dtrain-task-exit-status: N" when it fails (mpi_launcher_args.h),
// which arrives as a chunk of its own, is taken out of the task's output and reported.
#pragma once

#include <optional>
#include <string>

#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher {

class MpiOutputParser : public FrontEndParser {
 public:
  void Feed(std::string_view data, bool from_stderr, const Sink& sink) override;
  void Finish(bool from_stderr, const Sink& sink) override;
  std::optional<TaskFailure> FailureIn(std::string_view tool_line) override;
  bool StoppingByItself() const override { return aborting_; }

 private:
  struct Stream {
    std::string pending;       // bytes not passed on yet
    int rank = -1;             // the task whose bytes come next; -1 at the start of a line
    bool chunk_start = false;  // right after a tag: where a task's exit marker can be
  };
  // At the start of a chunk: whether it is a task's exit marker (taken out, reported), not one,
  // or cannot tell yet.
  enum class Marker { kNo, kTaken, kWait };
  Marker TakeExitMarker(Stream& s, const Sink& sink);
  void Parse(Stream& s, bool from_stderr, const Sink& sink);

  Stream streams_[2];
  int reported_rank_ = -1;  // from "Process name:", waiting for "Exit code:"
  bool aborting_ = false;   // mpirun aborts the job: it said so, or a task failed
};

}  // namespace dtrain::launcher
