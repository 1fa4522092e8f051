// Running a job whose servers and workers a cluster tool starts (mpirun, srun, qsub) while the
// scheduler runs here, and watching it until it ends.
//
// Each role is started by one "front end": a local client process of the tool (`mpirun -np K`,
// `srun --ntasks K`, `qsub -sync y -t 1-K`) that starts that role's K tasks wherever the cluster
// puts them, multiplexes their output into its own, waits for them and reports how they ended.
// One front end per role (not one for the whole job) lets each task's rank in its role be the
// tool's own task number, and lets each role get its own variables and placement options.
//
// The launcher watches the scheduler and the front ends as the supervisor watches local processes
// (local_job.h; both are a JobWatch, watch_loop.h), with the same outcomes, messages and exit
// codes:
//   - a task fails (its front end's parser recognises the tool's report) or a process exits
//     non-zero while the job runs: one line names it ("worker 1 exited with code 3 (reported by
//     mpirun)"), everything here gets SIGTERM, the tools' cancel commands run (qdel), SIGKILL
//     follows after kill_grace, and the launcher exits with the task's code. A process here that
//     fails while front ends run (the scheduler, which ends the job the moment a worker's
//     connection drops) is named only if no front end names a task within a few seconds;
//   - SIGINT, SIGTERM or SIGHUP: the same teardown, exit 128 + signal;
//   - the workers' front ends exit 0: the scheduler and the servers' front end get service_grace
//     to end by themselves, then are stopped with a warning; exit 0.
// Output: the parser splits a front end's output back into its tasks' output and the tool's own
// lines; the terminal gets "[worker 1] ..." as for a local job, and the tool's own lines as
// "[mpirun workers] ...". Tasks whose output the tool writes to files (qsub -o) are read as the
// files grow. --output-dir gets <role>-<rank>.log per task and <tool>-<role>s.log for the tool.
//
// Threads and process: as SuperviseLocalJob (single-threaded event loop; signal handlers,
// subreaper).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/plan/job_plan.h"
#include "launcher/run/output_merger.h"
#include "launcher/watch/local_job.h"

namespace dtrain::launcher {

// A task that ended badly, as the tool reported it.
struct TaskFailure {
  int task = 0;             // the task's number in its front end: its rank in its role
  int exit_code = 1;        // as a shell reports it: the code, or 128 + signal
  std::string description;  // "exited with code 3", "was killed by signal 9 (SIGKILL)"
};

// How one cluster tool writes its tasks' output and reports on them. All calls happen on the
// launcher's event-loop thread, in the order the bytes arrived.
class FrontEndParser {
 public:
  struct Sink {
    // A piece of task `task`'s stdout (to_stderr false) or stderr: any bytes, not whole lines.
    std::function<void(int task, bool to_stderr, std::string_view bytes)> task_output;
    // A whole line of the tool's own, without its '\n'.
    std::function<void(std::string_view line, bool to_stderr)> tool_line;
    // A task's failure that its own output reported (not shown to the user).
    std::function<void(const TaskFailure& failure)> task_failure;
  };

  virtual ~FrontEndParser() = default;
  // Bytes the front end wrote on its stdout (from_stderr false) or stderr.
  virtual void Feed(std::string_view data, bool from_stderr, const Sink& sink) = 0;
  // That stream ended: pass on what is still held back.
  virtual void Finish(bool from_stderr, const Sink& sink) = 0;
  // The task failure that a line of the tool's reports, if it reports one. May keep state (a
  // report spread over several lines, the job id).
  virtual std::optional<TaskFailure> FailureIn(std::string_view tool_line) = 0;
  // A command that stops what the tool started where stopping the tool itself does not (qdel
  // JOB); empty when there is none.
  virtual std::vector<std::string> CancelCommand() const { return {}; }
  // Whether the tool's output says it is already stopping its tasks by itself; it then gets no
  // SIGTERM (Open MPI 4's mpirun can crash when one arrives in the middle of its own abort), only
  // the SIGKILL at the end of the kill grace if it has not exited by then.
  virtual bool StoppingByItself() const { return false; }
};

// A FrontEndParser for tools that write whole lines (srun --label, qsub): subclasses look at one
// line at a time.
class LineFrontEndParser : public FrontEndParser {
 public:
  void Feed(std::string_view data, bool from_stderr, const Sink& sink) final;
  void Finish(bool from_stderr, const Sink& sink) final;

 protected:
  // A line without its '\n'; pass it on as a task's (with a '\n') or as the tool's.
  virtual void OnLine(std::string_view line, bool from_stderr, const Sink& sink) = 0;

 private:
  LineSplitter splitters_[2];
};

// One role's tasks, started by one local process of a tool.
struct FrontEnd {
  std::string tool;  // "mpirun", "srun", "qsub": in messages and in the prefix of its own lines
  Role role = Role::kWorker;
  int num_tasks = 0;
  std::vector<std::string> argv;
  std::vector<EnvVar> env;  // set on top of the launcher's environment
  std::unique_ptr<FrontEndParser> parser;

  // Task output that the tool writes to files instead of passing it through (qsub -o/-e). A file
  // is read from the moment it appears; the files must be on a file system this host sees.
  struct TaskFile {
    int task = 0;
    bool to_stderr = false;
    std::string path;
  };
  std::vector<TaskFile> task_files;

  // "mpirun (workers)"
  std::string Name() const;
};

struct FrontEndJob {
  std::optional<ProcessSpec> scheduler;  // none in an allreduce job (-s 0)
  std::vector<FrontEnd> front_ends;      // started in this order: the servers' before the workers'
};

// Runs the job to its end and returns the launcher's exit code (see above). Problems of the
// launcher itself (cannot create the output directory, fork fails) are reported on stderr and give
// exit code 1, after stopping whatever was already started. Only stdout_fd, stderr_fd, the graces,
// the timeouts and output_dir of `options` are used.
int SuperviseFrontEndJob(FrontEndJob job, const SupervisorOptions& options);

}  // namespace dtrain::launcher
