#include "launcher/watch/local_job.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "launcher/run/output_merger.h"
#include "launcher/watch/process_description.h"
#include "launcher/watch/watch_loop.h"

namespace dtrain::launcher {
namespace {

// How long after the last worker's exit its first record may still be on its way to us.
constexpr Duration kJoinReportGrace{1000};
// How long after the scheduler ended the job a replacement that had joined may take to exit.
constexpr Duration kReplacementGrace{2000};

struct Child : WatchedProcess {
  using WatchedProcess::WatchedProcess;

  ProcessSpec planned;  // as the plan has it: `spec` is what SupervisorOptions::start_as made
  std::chrono::steady_clock::time_point started_at;  // of its current process
  bool replacement = false;  // its current process replaces a lost one (--max-restarts)
  size_t free_moves = 0;     // replacements moved to another host for a failed ssh (Replace)

  UniqueFd log;

  std::optional<NodeKey> Node() const override { return NodeKey{spec.role, spec.rank}; }

  std::string Who() const override { return DescribeProcess(spec, pid); }
};

class Supervisor : public JobWatch {
 public:
  Supervisor(const JobPlan& plan, const SupervisorOptions& options)
      : JobWatch(options),
        plan_(plan),
        settle_timer_(io_),
        join_timer_(io_),
        replacement_timer_(io_) {}

 private:
  // --- start ---

  bool CreateProcesses() override {
    if (!CreateOutputDirectory()) return false;
    for (const ProcessSpec& spec : plan_.processes) {
      auto c = std::make_unique<Child>(io_);
      c->planned = spec;
      c->spec = options().start_as ? options().start_as(spec) : spec;
      c->name = spec.Name();
      c->is_service = spec.role != Role::kWorker;
      bool ok = true;
      c->log = OpenLog(spec.LogFileName(), &ok);
      if (!ok) return false;
      Watch(c.get());
      children_.push_back(std::move(c));
    }
    return true;
  }

  void OnStarted(WatchedProcess* p, StartedProcess started) override {
    Child* c = static_cast<Child*>(p);
    c->started_at = std::chrono::steady_clock::now();
    const std::string prefix = std::string("[").append(c->spec.Name()).append("] ");
    c->out = MergePipe(c, std::move(started.stdout_read), prefix, false, c->log.get());
    c->err = MergePipe(c, std::move(started.stderr_read), prefix, true, c->log.get());
  }

  // --- events ---

  // The node the job fails for, as the process that saw it reports it (the scheduler, or a rank
  // of an allreduce job): the best witness of which process failed first (see StopForFailure).
  void OnFailureRecord(const FailureRecord& f) override {
    if (!blame_) blame_ = f.node;
  }

  // A member the scheduler lost by its silence (a host cut off, a process stopped) while its
  // process may still run: nothing else would end it, and no replacement starts while it runs.
  // Killed, it exits like any lost member, and OnExit replaces it or fails the job. A process
  // started since the silence began is already its replacement (its ssh to a cut-off host failed
  // first), and stays.
  void OnSilentMemberLost(const NodeKey& node, const std::string& cause, Duration silent) override {
    for (const auto& c : children_) {
      if (c->reaped || c->pid <= 0 || c->Node() != node) continue;
      if (std::chrono::steady_clock::now() - c->started_at < silent) continue;
      Say("the scheduler lost " + c->Who() + " (" + cause + "); killing its process");
      ::kill(c->pid, SIGKILL);
    }
  }

  void OnExit(WatchedProcess* p) override {
    Child* c = static_cast<Child*>(p);
    const ExitStatus& st = c->status;
    if (phase() == Phase::kRunning) {
      if (!st.succeeded()) {
        if (SchedulerEndedTheJob()) {
          // A replacement could not join (the scheduler is gone) and would fail 30 s later on
          // its connect deadline (issue 63's fault campaign): fail now, saying why.
          Say(c->Who() + " " + DescribeExit(c->spec, c->status) +
              " after the scheduler had ended the job; not replaced");
        } else if (MayReplace(*c) && Replace(c)) {
          return;
        }
        OnFailure(c);
      } else if (failures_.empty() && AllWorkersSucceeded()) {
        AfterTheWorkersSucceeded();
      } else if (c->spec.role == Role::kScheduler) {
        StopReplacementsLeftOut();
      }
      // A service that exits 0 while workers still run is not a failure: the scheduler may end
      // the job a moment before the workers' processes are gone.
    } else if (phase() == Phase::kWaitingForServices) {
      if (!st.succeeded()) {
        Say(c->Who() + " " + DescribeExit(c->spec, c->status) +
            " after the workers finished; stopping the job");
        set_exit_code(st.ShellCode());
        BeginStop();
      } else if (AllServicesReported()) {
        BeginStop();
      }
    }
  }

  // --max-restarts: a parameter-server worker's (or, with checkpoints, server's) failure, before
  // anything else failed, while restarts are left. The others wait for the replacement
  // (DTRAIN_RESTART_WAIT_MS).
  bool MayReplace(const Child& c) const {
    const bool replaceable =
        c.spec.role == Role::kWorker || (c.spec.role == Role::kServer && options().replace_servers);
    return replaceable && plan_.num_servers > 0 && failures_.empty() &&
           (restarts_ < options().max_restarts || MovesOnAsTheSameRestart(c));
  }

  // A replacement whose ssh failed (its host cut off or gone: the loss it replaces may be that
  // host's) is the same restart moving on to the next host, once per host of the hostfile.
  bool MovesOnAsTheSameRestart(const Child& c) const {
    return c.replacement && SshFailed(c.spec, c.status) && c.free_moves < options().hosts.size();
  }

  // The scheduler ended the job (every worker had finished) while replacements still run: one
  // that joined ends with the job in a moment; one that had not (its predecessor was killed after
  // finishing its part, issue 63's campaign) would wait out its 30 s connect deadline. After
  // kReplacementGrace each still running is stopped, and fails the job naming it (OnExit).
  void StopReplacementsLeftOut() {
    replacement_timer_.expires_after(kReplacementGrace);
    replacement_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || phase() != Phase::kRunning) return;
      for (const auto& c : children_) {
        if (!c->replacement || c->reaped || c->pid <= 0) continue;
        Say(c->Who() + " is still running " + std::to_string(kReplacementGrace.count()) +
            " ms after the scheduler ended the job: a replacement that could not join; stopping "
            "it");
        ::kill(c->pid, SIGKILL);
      }
    });
  }

  // The scheduler exited 0: every worker finished, and no replacement can join any more.
  bool SchedulerEndedTheJob() const {
    for (const auto& c : children_) {
      if (c->spec.role == Role::kScheduler && c->reaped && c->status.succeeded()) return true;
    }
    return false;
  }

  bool Replace(Child* c) {
    const bool same_restart = MovesOnAsTheSameRestart(*c);
    if (same_restart) {
      ++c->free_moves;
    } else {
      ++restarts_;
    }
    const std::string why = DescribeExit(c->spec, c->status);
    const std::string where = Relocate(c);
    Say(c->Who() + " " + why + "; starting a replacement with its rank" + where + " (restart " +
        std::to_string(restarts_) + " of " + std::to_string(options().max_restarts) +
        ", --max-restarts" + (same_restart ? ", the same restart on another host" : "") + ")");
    c->replacement = true;
    SetEnv(&c->planned.env, "DTRAIN_RESTART_COUNT", std::to_string(restarts_));
    c->spec = options().start_as ? options().start_as(c->planned) : c->planned;
    return StartAgain(c, why);
  }

  // A process whose ssh failed (code 255) moves to the next host of the hostfile whose ssh has not
  // failed (after its own, in the list's order, wrapping around); " on HOST (...)" for the
  // message, or "" when it stays.
  std::string Relocate(Child* c) {
    const std::vector<std::string>& hosts = options().hosts;
    if (hosts.empty() || !SshFailed(c->spec, c->status)) return "";
    const std::string failed = c->planned.host;
    failed_hosts_.insert(failed);
    const auto at = std::find(hosts.begin(), hosts.end(), failed);
    const size_t start = at == hosts.end() ? 0 : static_cast<size_t>(at - hosts.begin()) + 1;
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::string& next = hosts[(start + i) % hosts.size()];
      if (failed_hosts_.count(next)) continue;
      c->planned.host = next;
      return " on " + next + ", the next host of the hostfile (ssh to " + failed + " failed)";
    }
    return " on " + failed + " again (ssh failed to every host of the hostfile)";
  }

  // The first failure while the job runs. Its peers notice a dead process within milliseconds
  // and exit too, sometimes before the dead one's own exit reaches us (a remote process's exit
  // code travels back through ssh, and under load exits are reaped in any order), so exits are
  // collected for failure_settle before the job stops. The cause is, in order: the node a failure
  // record names (the scheduler's, or an allreduce rank's), if it has failed; the first that died
  // by a signal; the first.
  void OnFailure(Child* c) {
    failures_.push_back(c);
    if (failures_.size() > 1) return;
    if (options().failure_settle.count() <= 0) {
      StopForFailure();
      return;
    }
    settle_timer_.expires_after(options().failure_settle);
    settle_timer_.async_wait([this](const asio::error_code& ec) {
      if (!ec && phase() == Phase::kRunning) StopForFailure();
    });
  }

  // Every worker exited 0. In a parameter-server job that ends the job only if they were in it: a
  // worker that never reported to us never joined (its command made no dist kvstore), so the
  // scheduler still waits for its registration and the job did nothing. Such workers are named
  // and the job fails. Their records may trail their exit a little, so a worker not heard of is
  // looked at again after kJoinReportGrace before it is blamed.
  void AfterTheWorkersSucceeded() {
    if (plan_.num_servers == 0 || reports() == nullptr || WorkersNeverHeardOf().empty()) {
      WaitForServices();
      return;
    }
    join_timer_.expires_after(kJoinReportGrace);
    join_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || phase() != Phase::kRunning) return;
      const std::string missing = WorkersNeverHeardOf();
      if (missing.empty()) {
        WaitForServices();
        return;
      }
      Say(missing + " exited with code 0 without joining the job: the scheduler never heard of " +
          "it (a worker's command must use a dist kvstore, e.g. dtrain.kv.create(\"dist_sync\"); " +
          "-s 0 starts an allreduce job without servers); stopping the job");
      set_exit_code(1);
      BeginStop();
    });
  }

  // "worker 0 (pid 12) and worker 1 (pid 13)": workers that sent no record at all.
  std::string WorkersNeverHeardOf() {
    std::vector<std::string> names;
    for (auto& c : children_) {
      if (c->spec.role != Role::kWorker) continue;
      auto it = reports()->status().nodes().find(NodeKey{Role::kWorker, c->spec.rank});
      if (it == reports()->status().nodes().end() || it->second.last_heard_us == 0) {
        names.push_back(c->Who());
      }
    }
    std::string text;
    for (size_t i = 0; i < names.size(); ++i) {
      text += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    }
    return text;
  }

  void StopForFailure() {
    Child* cause = failures_.front();
    for (Child* f : failures_) {
      if (DiedBySignal(f->spec, f->status)) {
        cause = f;
        break;
      }
    }
    if (blame_) {
      for (Child* f : failures_) {
        if (f->spec.role == blame_->role && f->spec.rank == blame_->rank) {
          cause = f;
          break;
        }
      }
    }
    Say(cause->Who() + " " + DescribeExit(cause->spec, cause->status) + "; stopping the job");
    std::string others;
    for (Child* f : failures_) {
      if (f != cause)
        others += (others.empty() ? "" : ", ") + f->Who() + " " + DescribeExit(f->spec, f->status);
    }
    if (!others.empty()) Say("meanwhile " + others);
    set_exit_code(cause->status.ShellCode());
    BeginStop();
  }

  // --- teardown ---

  void SignalStop() override {
    settle_timer_.cancel();
    join_timer_.cancel();
    replacement_timer_.cancel();
    JobWatch::SignalStop();
  }

  const JobPlan& plan_;
  asio::steady_timer settle_timer_;  // first failure -> stop (OnFailure)
  asio::steady_timer join_timer_;    // workers not heard of -> blamed (AfterTheWorkersSucceeded)
  asio::steady_timer replacement_timer_;  // the job ended -> replacements left out stopped
  std::optional<NodeKey> blame_;          // from the first failure record
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<Child*> failures_;        // while running, in the order they were reported
  int restarts_ = 0;                    // replacements started (--max-restarts)
  std::set<std::string> failed_hosts_;  // hosts whose ssh failed (Relocate)
};

}  // namespace

int SuperviseLocalJob(const JobPlan& plan, const SupervisorOptions& options) {
  return Supervisor(plan, options).Run();
}

}  // namespace dtrain::launcher
