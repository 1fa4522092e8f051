#include "launcher/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "launcher/output_merger.h"
#include "launcher/pipe_reader.h"
#include "launcher/process_group.h"

namespace dtrain::launcher {
namespace {

// How often the teardown looks whether the group is empty. SIGCHLD tells about our children,
// but not about grandchildren that init reaps.
constexpr Duration kStopPollInterval{20};

enum class Phase {
  kRunning,             // the workers run
  kWaitingForServices,  // every worker exited 0; the scheduler and servers are finishing
  kStopping,            // SIGTERM (later SIGKILL) sent; waiting for the group to be empty
  kDraining,            // everything exited; reading what is left in the pipes
  kDone,
};

struct Child {
  explicit Child(asio::io_context& io) : report_timer(io) {}

  ProcessSpec spec;
  pid_t pid = 0;
  UniqueFd log;
  std::unique_ptr<PipeReader> out;
  std::unique_ptr<PipeReader> err;
  int open_streams = 0;
  bool reaped = false;
  bool reported = false;  // its exit has been taken into account (see Report)
  ExitStatus status;
  asio::steady_timer report_timer;

  bool is_service() const { return spec.role != Role::kWorker; }
  std::string Who() const { return spec.Name() + " (pid " + std::to_string(pid) + ")"; }
};

class Supervisor {
 public:
  Supervisor(const JobPlan& plan, const SupervisorOptions& options)
      : plan_(plan),
        options_(options),
        signals_(io_),
        service_timer_(io_),
        kill_timer_(io_),
        poll_timer_(io_),
        drain_timer_(io_),
        merger_(options.stdout_fd, options.stderr_fd) {}

  int Run() {
    // A closed stdout must give EPIPE (and the merger drops that output), not kill the launcher.
    ::signal(SIGPIPE, SIG_IGN);
    // Orphaned grandchildren come to us, so we reap them and the group empties promptly even where
    // PID 1 does not reap (containers).
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    // Installed before the first fork, so no SIGCHLD and no Ctrl-C is missed. A mask inherited
    // from our parent could block them, and a blocked SIGCHLD would leave us waiting forever.
    sigset_t watched;
    sigemptyset(&watched);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) {
      signals_.add(sig);
      sigaddset(&watched, sig);
    }
    ::pthread_sigmask(SIG_UNBLOCK, &watched, nullptr);
    WaitForSignal();

    if (!CreateChildren()) return 1;
    StartAll();
    io_.run();
    return exit_code_;
  }

 private:
  // --- start ---

  bool CreateChildren() {
    if (options_.output_dir) {
      std::error_code ec;
      std::filesystem::create_directories(*options_.output_dir, ec);
      if (ec) {
        Say("cannot create the output directory " + *options_.output_dir + ": " + ec.message());
        return false;
      }
    }
    for (const ProcessSpec& spec : plan_.processes) {
      auto c = std::make_unique<Child>(io_);
      c->spec = spec;
      if (options_.output_dir) {
        const std::string path =
            (std::filesystem::path(*options_.output_dir) / spec.LogFileName()).string();
        c->log.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        if (c->log.get() < 0) {
          Say("cannot open " + path + ": " + std::strerror(errno));
          return false;
        }
      }
      children_.push_back(std::move(c));
    }
    return true;
  }

  void StartAll() {
    bool failed = false;
    for (auto& c : children_) {
      StartedProcess p;
      try {
        p = group_.Start(c->spec);
      } catch (const std::exception& e) {
        Say("cannot start " + c->spec.Name() + ": " + e.what() + "; stopping the job");
        exit_code_ = 1;
        failed = true;
        break;
      }
      c->pid = p.pid;
      Child* child = c.get();
      const std::string prefix = "[" + c->spec.Name() + "] ";
      c->out = MakeReader(child, std::move(p.stdout_read), prefix, false);
      c->err = MakeReader(child, std::move(p.stderr_read), prefix, true);
    }
    // Processes never started count as gone, so that the teardown does not wait for them.
    for (auto& c : children_) {
      if (c->pid == 0) c->reaped = c->reported = true;
    }
    if (failed) BeginStop();
  }

  std::unique_ptr<PipeReader> MakeReader(Child* c, UniqueFd fd, const std::string& prefix,
                                         bool to_stderr) {
    const OutputMerger::StreamId id = merger_.AddStream(prefix, to_stderr, c->log.get());
    auto reader = std::make_unique<PipeReader>(
        io_, std::move(fd), [this, id](std::string_view data) { merger_.Write(id, data); },
        [this, id, c] {
          merger_.Close(id);
          OnStreamEnd(c);
        });
    ++c->open_streams;
    reader->Start();
    return reader;
  }

  // --- events ---

  void WaitForSignal() {
    signals_.async_wait([this](const asio::error_code& ec, int sig) {
      if (ec || phase_ == Phase::kDone) return;
      if (sig == SIGCHLD) {
        ReapAll();
      } else {
        OnInterrupt(sig);
      }
      if (phase_ != Phase::kDone) WaitForSignal();
    });
  }

  void ReapAll() {
    while (std::optional<ExitStatus> st = group_.ReapOne()) OnReaped(*st);
  }

  void OnReaped(const ExitStatus& st) {
    Child* c = Find(st.pid);
    if (c == nullptr) return;  // a grandchild we inherited as subreaper
    c->reaped = true;
    c->status = st;
    if (phase_ >= Phase::kStopping) return;
    if (c->open_streams == 0) {
      Report(c);
      return;
    }
    // Its last lines are usually still in the pipes; report the exit after them.
    c->report_timer.expires_after(options_.exit_report_delay);
    c->report_timer.async_wait([this, c](const asio::error_code& ec) {
      if (!ec) Report(c);
    });
  }

  void OnStreamEnd(Child* c) {
    --c->open_streams;
    if (phase_ == Phase::kDraining) {
      if (AllStreamsEnded()) Finish();
      return;
    }
    if (c->open_streams == 0 && c->reaped) {
      c->report_timer.cancel();
      Report(c);
    }
  }

  // Takes a process's exit into account, once, while the job is still running.
  void Report(Child* c) {
    if (c->reported || phase_ >= Phase::kStopping) return;
    c->reported = true;
    const ExitStatus& st = c->status;
    if (phase_ == Phase::kRunning) {
      if (!st.succeeded()) {
        Say(c->Who() + " " + st.Describe() + "; stopping the job");
        exit_code_ = st.ShellCode();
        BeginStop();
      } else if (AllWorkersSucceeded()) {
        WaitForServices();
      }
      // A service that exits 0 while workers still run is not a failure: the scheduler may end
      // the job a moment before the workers' processes are gone.
    } else if (phase_ == Phase::kWaitingForServices) {
      if (!st.succeeded()) {
        Say(c->Who() + " " + st.Describe() + " after the workers finished; stopping the job");
        exit_code_ = st.ShellCode();
        BeginStop();
      } else if (AllServicesReported()) {
        BeginStop();
      }
    }
  }

  void WaitForServices() {
    phase_ = Phase::kWaitingForServices;
    if (AllServicesReported()) {
      BeginStop();
      return;
    }
    service_timer_.expires_after(options_.service_grace);
    service_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || phase_ != Phase::kWaitingForServices) return;
      // Services that exited but whose report waits for their pipes count as exited.
      for (auto& c : children_) {
        if (c->is_service() && c->reaped) Report(c.get());
      }
      if (phase_ != Phase::kWaitingForServices) return;
      std::string running;
      for (auto& c : children_) {
        if (c->is_service() && !c->reported) running += (running.empty() ? "" : ", ") + c->Who();
      }
      Say("warning: " + running + " still running " +
          std::to_string(options_.service_grace.count()) +
          " ms after the workers finished; stopping them");
      BeginStop();
    });
  }

  void OnInterrupt(int sig) {
    if (phase_ == Phase::kRunning || phase_ == Phase::kWaitingForServices) {
      Say("interrupted; stopping the job");
      exit_code_ = 128 + sig;
      BeginStop();
    } else if (phase_ == Phase::kStopping && !sigkill_sent_) {
      Say("interrupted again; killing the job");
      SendKill();
    }
  }

  // --- teardown ---

  void BeginStop() {
    if (phase_ >= Phase::kStopping) return;
    phase_ = Phase::kStopping;
    service_timer_.cancel();
    for (auto& c : children_) c->report_timer.cancel();
    SignalJob(SIGTERM);
    kill_timer_.expires_after(options_.kill_grace);
    kill_timer_.async_wait([this](const asio::error_code& ec) {
      if (!ec && phase_ == Phase::kStopping && !sigkill_sent_) SendKill();
    });
    PollStopped();
  }

  void SendKill() {
    sigkill_sent_ = true;
    SignalJob(SIGKILL);
    kill_timer_.expires_after(options_.kill_timeout);
    kill_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || phase_ != Phase::kStopping) return;
      std::string left;
      for (auto& c : children_) {
        if (!c->reaped) left += (left.empty() ? "" : ", ") + c->Who();
      }
      Say("warning: processes of the job still exist " +
          std::to_string(options_.kill_timeout.count()) + " ms after SIGKILL (" +
          (left.empty() ? "grandchildren" : left) + "); giving up on them");
      BeginDrain();
    });
  }

  void SignalJob(int sig) {
    group_.Signal(sig);
    group_.SignalStrays(sig);
  }

  void PollStopped() {
    ReapAll();
    if (group_.unreaped() == 0 && !group_.HasMembers()) {
      BeginDrain();
      return;
    }
    poll_timer_.expires_after(kStopPollInterval);
    poll_timer_.async_wait([this](const asio::error_code& ec) {
      if (!ec && phase_ == Phase::kStopping) PollStopped();
    });
  }

  void BeginDrain() {
    if (phase_ != Phase::kStopping) return;
    phase_ = Phase::kDraining;
    kill_timer_.cancel();
    poll_timer_.cancel();
    if (AllStreamsEnded()) {
      Finish();
      return;
    }
    drain_timer_.expires_after(options_.drain_timeout);
    drain_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || phase_ != Phase::kDraining) return;
      // Closing calls OnStreamEnd, and the last one calls Finish.
      for (auto& c : children_) {
        if (c->out) c->out->Close();
        if (c->err) c->err->Close();
      }
      Finish();
    });
  }

  void Finish() {
    if (phase_ == Phase::kDone) return;
    phase_ = Phase::kDone;
    drain_timer_.cancel();
    asio::error_code ignored;
    signals_.cancel(ignored);
    io_.stop();
  }

  // --- queries ---

  Child* Find(pid_t pid) {
    for (auto& c : children_) {
      if (c->pid == pid) return c.get();
    }
    return nullptr;
  }

  bool AllWorkersSucceeded() const {
    for (const auto& c : children_) {
      if (!c->is_service() && !(c->reported && c->status.succeeded())) return false;
    }
    return true;
  }

  bool AllServicesReported() const {
    for (const auto& c : children_) {
      if (c->is_service() && !c->reported) return false;
    }
    return true;
  }

  bool AllStreamsEnded() const {
    for (const auto& c : children_) {
      if (c->open_streams > 0) return false;
    }
    return true;
  }

  void Say(const std::string& text) { merger_.LauncherLine("dtrain launch: " + text); }

  const JobPlan& plan_;
  SupervisorOptions options_;
  // Declared first, destroyed last: the readers and timers below refer to it.
  asio::io_context io_;
  asio::signal_set signals_;
  asio::steady_timer service_timer_;
  asio::steady_timer kill_timer_;  // SIGTERM -> SIGKILL, then SIGKILL -> give up
  asio::steady_timer poll_timer_;
  asio::steady_timer drain_timer_;
  OutputMerger merger_;
  LocalProcessGroup group_;  // after merger_: its destructor's SIGKILL is the last word
  std::vector<std::unique_ptr<Child>> children_;
  Phase phase_ = Phase::kRunning;
  bool sigkill_sent_ = false;
  int exit_code_ = 0;
};

}  // namespace

int SuperviseLocalJob(const JobPlan& plan, const SupervisorOptions& options) {
  return Supervisor(plan, options).Run();
}

}  // namespace dtrain::launcher
