#include "launcher/run/setup_command.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "dtrain/common/error.h"

namespace dtrain::launcher {
namespace {

constexpr int kPollSliceMs = 20;

struct Running {
  pid_t pid = 0;
  UniqueFd fds[2];  // stdout, stderr
  bool reaped = false;
  SetupResult result;
};

bool AllDone(const std::vector<Running>& runs) {
  for (const Running& r : runs) {
    if (!r.reaped || r.fds[0].get() >= 0 || r.fds[1].get() >= 0) return false;
  }
  return true;
}

// Reads whatever is ready, for at most one slice; a read of 0 or an error ends that stream.
void ReadReady(std::vector<Running>* runs) {
  std::vector<pollfd> fds;
  std::vector<UniqueFd*> owners;
  std::vector<Running*> runs_of;
  for (Running& r : *runs) {
    for (UniqueFd& fd : r.fds) {
      if (fd.get() < 0) continue;
      fds.push_back({fd.get(), POLLIN, 0});
      owners.push_back(&fd);
      runs_of.push_back(&r);
    }
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kPollSliceMs));
    return;
  }
  if (::poll(fds.data(), fds.size(), kPollSliceMs) <= 0) return;
  char buf[4096];
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
    if (n > 0) {
      runs_of[i]->result.output.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      owners[i]->reset();
    }
  }
}

void ReapExited(LocalProcessGroup* group, std::vector<Running>* runs) {
  while (std::optional<ExitStatus> st = group->ReapOne()) {
    for (Running& r : *runs) {
      if (r.pid == st->pid) {
        r.reaped = true;
        r.result.status = *st;
      }
    }
  }
}

}  // namespace

std::string SetupResult::Describe(Duration timeout) const {
  if (timed_out) return "did not finish within " + std::to_string(timeout.count()) + " ms";
  std::string text = status.Describe();
  std::string out = output;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (!out.empty()) text += ": " + out.substr(out.rfind('\n') + 1);
  return text;
}

std::vector<SetupResult> RunSetupCommands(const std::vector<std::vector<std::string>>& commands,
                                          Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  LocalProcessGroup group;  // its destructor SIGKILLs whatever is left
  std::vector<Running> runs(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    ProcessSpec spec;
    spec.argv = commands[i];
    StartedProcess p = group.Start(spec);
    runs[i].pid = p.pid;
    runs[i].fds[0] = std::move(p.stdout_read);
    runs[i].fds[1] = std::move(p.stderr_read);
  }
  while (!AllDone(runs) && std::chrono::steady_clock::now() < deadline) {
    ReadReady(&runs);
    ReapExited(&group, &runs);
  }
  if (!AllDone(runs)) {
    group.Signal(SIGKILL);
    group.SignalStrays(SIGKILL);
    // SIGKILL cannot be ignored; a short bounded wait collects the exits.
    const auto reap_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (group.unreaped() > 0 && std::chrono::steady_clock::now() < reap_deadline) {
      ReapExited(&group, &runs);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (Running& r : runs) {
      if (!r.reaped || r.fds[0].get() >= 0 || r.fds[1].get() >= 0) r.result.timed_out = true;
    }
  }
  std::vector<SetupResult> results;
  for (Running& r : runs) results.push_back(std::move(r.result));
  return results;
}

}  // namespace dtrain::launcher
