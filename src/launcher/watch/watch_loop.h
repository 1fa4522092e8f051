// The event loop that watches a job's local processes until the job ends: what SuperviseLocalJob
// (local_job.h) and SuperviseFrontEndJob (cluster_tool_job.h) share.
//
// A JobWatch starts its processes in one LocalProcessGroup, reads their pipes, reaps them, and
// runs the teardown that every way of ending a job goes through:
//   running -> (every worker reported a success) waiting for services -> stopping (SIGTERM, then
//   SIGKILL after kill_grace; give up after kill_timeout) -> draining the pipes (at most
//   drain_timeout) -> done.
// SIGINT, SIGTERM and SIGHUP stop the job with exit code 128 + signal; a second one while
// stopping sends SIGKILL at once. A process's exit is reported (OnExit) once, while the job runs,
// after its pipes ended or exit_report_delay after it was reaped, whichever comes first.
//
// What to do about an exit, how to signal the processes and what their output means is the
// subclass's: see the hooks below.
//
// Threads: everything happens on the thread that calls Run(), which must be the process's only
// thread while it runs (it forks). Run() installs handlers for SIGCHLD, SIGINT, SIGTERM and SIGHUP,
// ignores SIGPIPE and makes the process a child subreaper, for the call and beyond.
#pragma once

#include <sys/types.h>

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/plan/job_plan.h"
#include "launcher/run/output_merger.h"
#include "launcher/run/pipe_reader.h"
#include "launcher/run/process_group.h"
#include "launcher/status/report_sink.h"
#include "launcher/watch/local_job.h"

namespace dtrain::launcher {

// One process the watch starts and waits for. Subclasses add what their job needs to know.
struct WatchedProcess {
  explicit WatchedProcess(asio::io_context& io) : report_timer(io) {}
  virtual ~WatchedProcess() = default;

  // How the process is named in messages: "worker 1 (pid 42)", "mpirun (workers, pid 43)".
  virtual std::string Who() const = 0;
  // The node it is, when it is one (not a cluster tool's front end).
  virtual std::optional<NodeKey> Node() const { return std::nullopt; }

  ProcessSpec spec;         // what to start
  std::string name;         // "worker 1", "mpirun (workers)": in "cannot start NAME"
  bool is_service = false;  // the scheduler or a server: may end after the workers
  pid_t pid = 0;
  // spec.stdin_held_open: the write end, after spec.stdin_preamble; closed when the job stops.
  UniqueFd stdin_write;
  std::unique_ptr<PipeReader> out;
  std::unique_ptr<PipeReader> err;
  int open_streams = 0;
  bool reaped = false;
  bool reported = false;  // its exit has been taken into account (OnExit)
  ExitStatus status;
  asio::steady_timer report_timer;
};

class JobWatch {
 public:
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  // Prepares (CreateProcesses), starts every process in Watch() order, runs the event loop to the
  // end of the job and returns the launcher's exit code. 1 if CreateProcesses fails (nothing
  // started) or a process cannot be started (after stopping those already started).
  int Run();

 protected:
  enum class Phase {
    kRunning,             // the workers run
    kWaitingForServices,  // every worker exited 0; the scheduler and servers are finishing
    kStopping,            // SIGTERM (later SIGKILL) sent; waiting for the group to be empty
    kDraining,            // everything exited; reading what is left in the pipes
    kDone,
  };

  explicit JobWatch(const SupervisorOptions& options);
  virtual ~JobWatch();

  // --- hooks ---

  // Creates the processes (calling Watch for each) and whatever they write to; false (after a
  // message) to give up with exit code 1 before anything starts.
  virtual bool CreateProcesses() = 0;
  // `p` was just started: read its pipes (ReadPipe) and keep what else `started` holds (its
  // stdin, if held open, is p->stdin_write already).
  virtual void OnStarted(WatchedProcess* p, StartedProcess started) = 0;
  // After every process was started, before the event loop runs.
  virtual void OnAllStarted() {}
  // A process's exit, once, while the job runs (phase() is kRunning or kWaitingForServices).
  virtual void OnExit(WatchedProcess* p) = 0;
  // service_grace passed after the workers finished: by default, the services whose exit waits for
  // their pipes count as exited, and those still running are stopped with a warning.
  virtual void OnServiceGraceOver();
  // Sends the processes SIGTERM (or what stops them) at the start of the teardown. By default
  // every held stdin is closed and the whole group and the strays get SIGTERM.
  virtual void SignalStop();
  // Right before the SIGKILL.
  virtual void BeforeKill() {}
  // The job is over and the event loop about to stop: last output.
  virtual void OnFinish() {}
  // A process reported the node the job fails for (job_status.h); the first one is the cause.
  virtual void OnFailureRecord(const FailureRecord& failure) {}
  // The scheduler lost `node` by its silence for `silent` and waits for its replacement
  // (JobReports::set_on_silent_member_lost).
  virtual void OnSilentMemberLost(const NodeKey& node, const std::string& cause, Duration silent) {}
  // A process asked the launcher something (report_server.h: an "elastic_*" record) while the
  // job runs; `reply` answers it. By default, unanswered.
  virtual void OnRequest(const NodeKey& from, const std::string& peer_address,
                         const nlohmann::json& request, ReportServer::ReplyFn reply) {}

  // --- for the subclasses ---

  // Adds a process to start, in order. The subclass owns it; it must outlive Run().
  void Watch(WatchedProcess* p) { processes_.push_back(p); }
  // Creates options.output_dir if it is set; false after a message if that fails.
  bool CreateOutputDirectory();
  // Opens output_dir/file_name for a log (an empty fd without output_dir); on failure says so and
  // sets *ok to false.
  UniqueFd OpenLog(const std::string& file_name, bool* ok);
  // Reads one of p's pipes: on_data for every piece, then on_end and the watch's own bookkeeping.
  std::unique_ptr<PipeReader> ReadPipe(WatchedProcess* p, UniqueFd fd, PipeReader::DataFn on_data,
                                       std::function<void()> on_end);
  // ReadPipe into the merged output: a stream of its own, each line after `prefix`, on the
  // launcher's stderr or stdout, and also into `log_fd` (-1: none).
  std::unique_ptr<PipeReader> MergePipe(WatchedProcess* p, UniqueFd fd, const std::string& prefix,
                                        bool to_stderr, int log_fd);

  // Adds p while the job runs and starts it (an elastic job's new worker); false, after a message,
  // if it cannot be started (p then counts as gone).
  bool StartLater(WatchedProcess* p);
  // Starts p's spec again as a new process (a replacement; `why` says what ended the last one):
  // its old pipes are closed, its exit forgotten, OnStarted reads the new ones. False, after a
  // message, if it cannot be started.
  bool StartAgain(WatchedProcess* p, const std::string& why);
  // Takes p's exit into account (OnExit), once, while the job runs.
  void Report(WatchedProcess* p);
  // Every worker exited 0: gives the services service_grace (OnServiceGraceOver).
  void WaitForServices();
  // Starts the teardown (once): SignalStop, SIGKILL after kill_grace, then draining.
  void BeginStop();
  // Signals the whole group and the processes that left it.
  void SignalJob(int sig);

  bool AllWorkersSucceeded() const;
  bool AllServicesReported() const;
  bool AllReported() const;

  // "dtrain launch: TEXT" on the launcher's stderr.
  void Say(const std::string& text) { merger_.LauncherLine("dtrain launch: " + text); }

  Phase phase() const { return phase_; }
  // The job's reports; null when the processes do not report.
  JobReports* reports() { return reports_.get(); }
  void set_exit_code(int code) { exit_code_ = code; }
  const SupervisorOptions& options() const { return options_; }
  const std::vector<WatchedProcess*>& processes() const { return processes_; }

  // Declared first, destroyed last: the readers and timers refer to it.
  asio::io_context io_;
  OutputMerger merger_;

 private:
  void StartAll();
  // Keeps a started process's stdin (when held open) and writes its preamble.
  void HoldStdin(WatchedProcess* p, StartedProcess* started);
  void WaitForSignal();
  // After the job, while the status page lingers: reaps late descendants, stops at Ctrl-C.
  void WaitForInterruptWhileLingering();
  void ReapAll();
  void OnReaped(const ExitStatus& st);
  void OnStreamEnd(WatchedProcess* p);
  void OnInterrupt(int sig);
  void SendKill();
  void PollStopped();
  void BeginDrain();
  void Finish();
  WatchedProcess* Find(pid_t pid) const;
  bool AllStreamsEnded() const;

  SupervisorOptions options_;
  asio::signal_set signals_;
  asio::steady_timer service_timer_;
  asio::steady_timer kill_timer_;  // SIGTERM -> SIGKILL, then SIGKILL -> give up
  asio::steady_timer poll_timer_;
  asio::steady_timer drain_timer_;
  // Readers of replaced processes' pipes: their cancelled reads still complete on the loop.
  std::vector<std::unique_ptr<PipeReader>> retired_readers_;
  LocalProcessGroup group_;  // after merger_: its destructor's SIGKILL is the last word
  std::unique_ptr<JobReports> reports_;
  asio::steady_timer linger_timer_;  // the status page after the job (--status-linger-s)
  std::vector<WatchedProcess*> processes_;
  Phase phase_ = Phase::kRunning;
  bool sigkill_sent_ = false;
  int exit_code_ = 0;
};

}  // namespace dtrain::launcher
