// Running a job's processes on this machine and watching them until the job ends.
//
// The supervisor starts the processes of a JobPlan in order (scheduler first) in one process group,
// merges their output (output_merger.h), and decides when the job is over:
//   - a process exits non-zero or by a signal while the job runs: that is the job's failure. Exits
//     are collected for failure_settle more (peers of a dead process fail right after it, and
//     may be reported first); the cause is the first of them that died by a signal (a code above
//     128 from an ssh client), else the first. One line names it on stderr, the whole group gets
//     SIGTERM, then SIGKILL after kill_grace, and the launcher exits with the cause's code (128 +
//     signal for a signal);
//   - with max_restarts, a failed worker of a parameter-server job (and with replace_servers, a
//     failed server) is replaced instead (below);
//   - the launcher gets SIGINT, SIGTERM or SIGHUP: the same teardown, exit 128 + that signal; a
//     second one while stopping sends SIGKILL at once;
//   - every worker exited 0: the scheduler and servers get service_grace to exit by themselves
//     (they are told the job ended); whatever still runs then is stopped with a warning and the
//     exit code is 0, unless one of them exits non-zero first (then its code). A plan without
//     services (an allreduce job, -s 0) ends there with 0.
// Grandchildren left in the group are stopped in every case. A process run through a client on
// another host (ProcessSpec::remote_via) is named with its host in every message. Every wait is
// bounded: after SIGKILL the supervisor waits kill_timeout for the processes to vanish, and after
// the last one it waits drain_timeout for pipes that an escaped grandchild still holds open.
//
// Threads: runs an asio event loop on the calling thread, which must be the process's only thread
// while it runs (it forks) and must outlive the children (see process_group.h). It installs
// handlers for SIGCHLD, SIGINT, SIGTERM and SIGHUP, ignores SIGPIPE, and makes the process a child
// subreaper, for the duration of the call and beyond; it is meant to be what the launcher process
// does, not a library call in a larger program.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/common/deadline.h"
#include "launcher/plan/job_plan.h"
#include "launcher/status/report_server.h"
#include "launcher/status/report_sink.h"

namespace dtrain::launcher {

struct SupervisorOptions {
  // Where the processes report (report_sink.h): the listening channel, already in their
  // environment (TellProcesses), and what to do with the reports. None: no reports.
  std::shared_ptr<ReportChannel> reports;
  ReportOptions report_options;
  Duration kill_grace{3000};      // SIGTERM -> SIGKILL
  Duration service_grace{30000};  // workers all done -> stop the services
  Duration failure_settle{500};   // first failure -> stop; 0: at once
  // A worker of a parameter-server job that fails while the job runs is started again with its
  // rank and DTRAIN_RESTART_COUNT=K (the K-th replacement of any worker), up to this many times
  // in all, instead of stopping the job; the scheduler's wait (DTRAIN_RESTART_WAIT_MS) bounds
  // how long the others wait for it.
  int max_restarts = 0;
  // Servers are replaced too (their checkpoints are on: DTRAIN_CHECKPOINT_DIR).
  bool replace_servers = false;
  // How a spec of the plan is started: the ssh backend makes it an ssh client that runs it on its
  // host. None: as it is. Called again for each replacement, whose spec may name another host.
  std::function<ProcessSpec(const ProcessSpec&)> start_as;
  // The hostfile's hosts, in order (ssh): a replacement for a process whose host failed (the ssh
  // client's own code 255: it cannot connect or log in, or the connection was lost) runs on the
  // next host of the list whose ssh has not failed, and the one that failed is passed over from
  // then on. Empty: replacements run where their process ran.
  std::vector<std::string> hosts;
  std::optional<std::string> output_dir;  // also write DIR/<role>-<rank>.log
  // After a process exits, how long its last output may take to arrive through the pipes before
  // its exit is reported anyway (a grandchild may hold the pipe open).
  Duration exit_report_delay{200};
  Duration kill_timeout{5000};   // after SIGKILL: give up on processes that do not vanish
  Duration drain_timeout{1000};  // after the last process: give up on pipes still open
  int stdout_fd = 1;
  int stderr_fd = 2;
};

// Runs the job to its end and returns the launcher's exit code (see above). Problems of the
// launcher itself (cannot create the output directory, fork fails) are reported on stderr and
// give exit code 1, after stopping whatever was already started.
int SuperviseLocalJob(const JobPlan& plan, const SupervisorOptions& options);

}  // namespace dtrain::launcher
