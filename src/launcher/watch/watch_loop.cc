#include "launcher/watch/watch_loop.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

namespace dtrain::launcher {
namespace {

// How often the teardown looks whether the group is empty. SIGCHLD tells about our children,
// but not about grandchildren that init reaps.
constexpr Duration kStopPollInterval{20};

// A few bytes into a fresh pipe: they fit its buffer, so this never blocks. A reader that is gone
// already (EPIPE: SIGPIPE is ignored by the launcher) shows as that process's exit.
void WriteToPipe(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

JobWatch::JobWatch(const SupervisorOptions& options)
    : merger_(options.stdout_fd, options.stderr_fd),
      options_(options),
      signals_(io_),
      service_timer_(io_),
      kill_timer_(io_),
      poll_timer_(io_),
      drain_timer_(io_),
      linger_timer_(io_) {}

JobWatch::~JobWatch() = default;

int JobWatch::Run() {
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

  if (options_.reports) {
    try {
      reports_ =
          std::make_unique<JobReports>(io_, std::move(*options_.reports), options_.report_options,
                                       [this](const std::string& line) { Say(line); });
    } catch (const std::exception& e) {
      Say(e.what());
      return 1;
    }
    reports_->set_on_failure([this](const FailureRecord& f) {
      if (phase_ < Phase::kStopping) OnFailureRecord(f);
    });
    reports_->set_on_silent_member_lost(
        [this](const NodeKey& node, const std::string& cause, Duration silent) {
          if (phase_ == Phase::kRunning) OnSilentMemberLost(node, cause, silent);
        });
    reports_->set_on_request([this](const NodeKey& from, const std::string& peer_address,
                                    const nlohmann::json& request, ReportServer::ReplyFn reply) {
      if (phase_ < Phase::kStopping) OnRequest(from, peer_address, request, std::move(reply));
    });
  }
  if (!CreateProcesses()) return 1;
  StartAll();
  OnAllStarted();
  io_.run();
  return exit_code_;
}

// --- start ---

bool JobWatch::CreateOutputDirectory() {
  if (!options_.output_dir) return true;
  std::error_code ec;
  std::filesystem::create_directories(*options_.output_dir, ec);
  if (ec) {
    Say("cannot create the output directory " + *options_.output_dir + ": " + ec.message());
    return false;
  }
  return true;
}

UniqueFd JobWatch::OpenLog(const std::string& file_name, bool* ok) {
  if (!options_.output_dir) return UniqueFd();
  const std::string path = (std::filesystem::path(*options_.output_dir) / file_name).string();
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    Say("cannot open " + path + ": " + std::strerror(errno));
    *ok = false;
  }
  return fd;
}

void JobWatch::StartAll() {
  bool failed = false;
  for (WatchedProcess* p : processes_) {
    StartedProcess started;
    try {
      started = group_.Start(p->spec);
    } catch (const std::exception& e) {
      Say("cannot start " + p->name + ": " + e.what() + "; stopping the job");
      exit_code_ = 1;
      failed = true;
      break;
    }
    p->pid = started.pid;
    if (auto node = p->Node(); node && reports_) {
      reports_->status().ProcessStarted(*node, p->spec.host, p->pid, 0);
    }
    HoldStdin(p, &started);
    OnStarted(p, std::move(started));
  }
  // Processes never started count as gone, so that the teardown does not wait for them.
  for (WatchedProcess* p : processes_) {
    if (p->pid == 0) p->reaped = p->reported = true;
  }
  if (failed) BeginStop();
}

bool JobWatch::StartLater(WatchedProcess* p) {
  processes_.push_back(p);
  StartedProcess started;
  try {
    started = group_.Start(p->spec);
  } catch (const std::exception& e) {
    Say("cannot start " + p->name + ": " + e.what());
    p->reaped = p->reported = true;
    return false;
  }
  p->pid = started.pid;
  if (auto node = p->Node(); node && reports_) {
    reports_->status().ProcessStarted(*node, p->spec.host, p->pid, NowMicros());
  }
  HoldStdin(p, &started);
  OnStarted(p, std::move(started));
  return true;
}

bool JobWatch::StartAgain(WatchedProcess* p, const std::string& why) {
  p->report_timer.cancel();
  for (auto* reader : {&p->out, &p->err}) {
    if (!*reader) continue;
    (*reader)->Close();  // its end is counted now; p is reported already, so nothing follows
    retired_readers_.push_back(std::move(*reader));
  }
  StartedProcess started;
  try {
    started = group_.Start(p->spec);
  } catch (const std::exception& e) {
    Say("cannot start " + p->name + " again: " + e.what());
    return false;
  }
  p->pid = started.pid;
  p->reaped = p->reported = false;
  p->status = ExitStatus{};
  p->open_streams = 0;
  if (auto node = p->Node(); node && reports_) {
    reports_->status().ProcessRestarted(*node, why, p->pid, NowMicros());
    reports_->MarkTimeline("restart", node->Name() + " restarted: " + why);
  }
  HoldStdin(p, &started);
  OnStarted(p, std::move(started));
  return true;
}

std::unique_ptr<PipeReader> JobWatch::MergePipe(WatchedProcess* p, UniqueFd fd,
                                                const std::string& prefix, bool to_stderr,
                                                int log_fd) {
  const OutputMerger::StreamId id = merger_.AddStream(prefix, to_stderr, log_fd);
  return ReadPipe(
      p, std::move(fd), [this, id](std::string_view data) { merger_.Write(id, data); },
      [this, id] { merger_.Close(id); });
}

std::unique_ptr<PipeReader> JobWatch::ReadPipe(WatchedProcess* p, UniqueFd fd,
                                               PipeReader::DataFn on_data,
                                               std::function<void()> on_end) {
  auto reader = std::make_unique<PipeReader>(io_, std::move(fd), std::move(on_data),
                                             [this, p, on_end = std::move(on_end)] {
                                               on_end();
                                               OnStreamEnd(p);
                                             });
  ++p->open_streams;
  reader->Start();
  return reader;
}

// --- events ---

void JobWatch::WaitForSignal() {
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

void JobWatch::ReapAll() {
  while (std::optional<ExitStatus> st = group_.ReapOne()) OnReaped(*st);
}

void JobWatch::OnReaped(const ExitStatus& st) {
  WatchedProcess* p = Find(st.pid);
  if (p == nullptr) return;  // a grandchild we inherited as subreaper
  p->reaped = true;
  p->status = st;
  if (auto node = p->Node(); node && reports_) {
    reports_->status().ProcessExited(*node, st.succeeded(), st.Describe(), 0);
  }
  if (phase_ >= Phase::kStopping) return;
  if (p->open_streams == 0) {
    Report(p);
    return;
  }
  // Its last lines (a front end's: the tool's report on its tasks) are usually still in the
  // pipes; report the exit after them.
  p->report_timer.expires_after(options_.exit_report_delay);
  p->report_timer.async_wait([this, p](const asio::error_code& ec) {
    if (!ec) Report(p);
  });
}

void JobWatch::OnStreamEnd(WatchedProcess* p) {
  --p->open_streams;
  if (phase_ == Phase::kDraining) {
    if (AllStreamsEnded()) Finish();
    return;
  }
  if (p->open_streams == 0 && p->reaped) {
    p->report_timer.cancel();
    Report(p);
  }
}

void JobWatch::Report(WatchedProcess* p) {
  if (p->reported || phase_ >= Phase::kStopping) return;
  p->reported = true;
  OnExit(p);
}

void JobWatch::WaitForServices() {
  phase_ = Phase::kWaitingForServices;
  if (AllServicesReported()) {
    BeginStop();
    return;
  }
  service_timer_.expires_after(options_.service_grace);
  service_timer_.async_wait([this](const asio::error_code& ec) {
    if (!ec && phase_ == Phase::kWaitingForServices) OnServiceGraceOver();
  });
}

void JobWatch::OnServiceGraceOver() {
  // Services that exited but whose report waits for their pipes count as exited.
  for (WatchedProcess* p : processes_) {
    if (p->is_service && p->reaped) Report(p);
  }
  if (phase_ != Phase::kWaitingForServices) return;
  std::string running;
  for (WatchedProcess* p : processes_) {
    if (p->is_service && !p->reported) running += (running.empty() ? "" : ", ") + p->Who();
  }
  Say("warning: " + running + " still running " + std::to_string(options_.service_grace.count()) +
      " ms after the workers finished; stopping them");
  BeginStop();
}

void JobWatch::OnInterrupt(int sig) {
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

void JobWatch::BeginStop() {
  if (phase_ >= Phase::kStopping) return;
  phase_ = Phase::kStopping;
  service_timer_.cancel();
  for (WatchedProcess* p : processes_) p->report_timer.cancel();
  SignalStop();
  kill_timer_.expires_after(options_.kill_grace);
  kill_timer_.async_wait([this](const asio::error_code& ec) {
    if (!ec && phase_ == Phase::kStopping && !sigkill_sent_) SendKill();
  });
  PollStopped();
}

void JobWatch::SignalStop() {
  // EOF on a held stdin tells a remote guard to stop its process even if the signal below cannot
  // reach the process's client.
  for (WatchedProcess* p : processes_) p->stdin_write.reset();
  SignalJob(SIGTERM);
}

void JobWatch::HoldStdin(WatchedProcess* p, StartedProcess* started) {
  p->stdin_write = std::move(started->stdin_write);
  if (p->stdin_write.get() >= 0 && !p->spec.stdin_preamble.empty()) {
    WriteToPipe(p->stdin_write.get(), p->spec.stdin_preamble);
  }
}

void JobWatch::SendKill() {
  sigkill_sent_ = true;
  BeforeKill();
  SignalJob(SIGKILL);
  kill_timer_.expires_after(options_.kill_timeout);
  kill_timer_.async_wait([this](const asio::error_code& ec) {
    if (ec || phase_ != Phase::kStopping) return;
    std::string left;
    for (WatchedProcess* p : processes_) {
      if (!p->reaped) left += (left.empty() ? "" : ", ") + p->Who();
    }
    Say("warning: processes of the job still exist " +
        std::to_string(options_.kill_timeout.count()) + " ms after SIGKILL (" +
        (left.empty() ? "grandchildren" : left) + "); giving up on them");
    BeginDrain();
  });
}

void JobWatch::SignalJob(int sig) {
  group_.Signal(sig);
  group_.SignalStrays(sig);
}

void JobWatch::PollStopped() {
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

void JobWatch::BeginDrain() {
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
    for (WatchedProcess* p : processes_) {
      if (p->out) p->out->Close();
      if (p->err) p->err->Close();
    }
    Finish();
  });
}

void JobWatch::Finish() {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  drain_timer_.cancel();
  OnFinish();
  asio::error_code ignored;
  signals_.cancel(ignored);
  const Duration linger = reports_ ? reports_->Finish() : Duration(0);
  if (linger.count() <= 0) {
    io_.stop();
    return;
  }
  // Only the status page is left: serve it a while; Ctrl-C (or TERM, HUP) ends that at once.
  linger_timer_.expires_after(linger);
  linger_timer_.async_wait([this](const asio::error_code&) {
    reports_->Close();
    io_.stop();
  });
  WaitForInterruptWhileLingering();
}

void JobWatch::WaitForInterruptWhileLingering() {
  signals_.async_wait([this](const asio::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGCHLD) {
      // A late descendant (we are their subreaper) must not close the page early.
      ReapAll();
      WaitForInterruptWhileLingering();
      return;
    }
    linger_timer_.cancel();
  });
}

// --- queries ---

WatchedProcess* JobWatch::Find(pid_t pid) const {
  for (WatchedProcess* p : processes_) {
    if (p->pid == pid) return p;
  }
  return nullptr;
}

bool JobWatch::AllWorkersSucceeded() const {
  for (const WatchedProcess* p : processes_) {
    if (!p->is_service && !(p->reported && p->status.succeeded())) return false;
  }
  return true;
}

bool JobWatch::AllServicesReported() const {
  for (const WatchedProcess* p : processes_) {
    if (p->is_service && !p->reported) return false;
  }
  return true;
}

bool JobWatch::AllReported() const {
  for (const WatchedProcess* p : processes_) {
    if (!p->reported) return false;
  }
  return true;
}

bool JobWatch::AllStreamsEnded() const {
  for (const WatchedProcess* p : processes_) {
    if (p->open_streams > 0) return false;
  }
  return true;
}

}  // namespace dtrain::launcher
