#include "launcher/run/output_merger.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dtrain::launcher {
namespace {

// Emits `line` in pieces of at most max_line bytes (one piece when it fits), so that a long line
// is cut the same way whether it arrived in one read or in many.
void EmitInPieces(std::string_view line, size_t max_line, const LineSplitter::LineFn& emit) {
  while (line.size() > max_line) {
    emit(line.substr(0, max_line));
    line.remove_prefix(max_line);
  }
  emit(line);
}

}  // namespace

void LineSplitter::Append(std::string_view data, const LineFn& emit) {
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      pending_.append(data);
      // Strictly more than max_line: a line of exactly max_line bytes whose newline is still on
      // its way must not turn into a piece followed by an empty line.
      while (pending_.size() > max_line_) {
        emit(std::string_view(pending_).substr(0, max_line_));
        pending_.erase(0, max_line_);
      }
      return;
    }
    if (pending_.empty()) {
      EmitInPieces(data.substr(0, nl), max_line_, emit);
    } else {
      pending_.append(data.substr(0, nl));
      EmitInPieces(pending_, max_line_, emit);
      pending_.clear();
    }
    data.remove_prefix(nl + 1);
  }
}

void LineSplitter::Finish(const LineFn& emit) {
  if (pending_.empty()) return;
  EmitInPieces(pending_, max_line_, emit);
  pending_.clear();
}

OutputMerger::OutputMerger(int stdout_fd, int stderr_fd, size_t max_line)
    : stdout_fd_(stdout_fd), stderr_fd_(stderr_fd), max_line_(max_line) {}

OutputMerger::StreamId OutputMerger::AddStream(std::string prefix, bool to_stderr, int log_fd) {
  streams_.push_back(Stream{std::move(prefix), to_stderr ? stderr_fd_ : stdout_fd_, log_fd,
                            LineSplitter(max_line_)});
  return streams_.size() - 1;
}

void OutputMerger::Write(StreamId id, std::string_view data) {
  Stream& s = streams_.at(id);
  if (s.closed) return;
  s.splitter.Append(data, [&](std::string_view line) { Collect(s, line); });
  Flush(s);
}

void OutputMerger::Close(StreamId id) {
  Stream& s = streams_.at(id);
  if (s.closed) return;
  s.closed = true;
  s.splitter.Finish([&](std::string_view line) { Collect(s, line); });
  Flush(s);
}

void OutputMerger::LauncherLine(std::string_view line) {
  std::string text(line);
  text.push_back('\n');
  WriteAll(stderr_fd_, text);
}

// The line is copied at once: it may point into the splitter's buffer, which changes next.
void OutputMerger::Collect(const Stream& s, std::string_view line) {
  terminal_buf_.append(s.prefix);
  terminal_buf_.append(line);
  terminal_buf_.push_back('\n');
  if (s.log_fd >= 0) {
    log_buf_.append(line);
    log_buf_.push_back('\n');
  }
}

// All lines of one read go out in one write: whole lines, and few system calls under load.
void OutputMerger::Flush(const Stream& s) {
  if (!terminal_buf_.empty()) WriteAll(s.terminal_fd, terminal_buf_);
  if (!log_buf_.empty()) WriteAll(s.log_fd, log_buf_);
  terminal_buf_.clear();
  log_buf_.clear();
}

void OutputMerger::WriteAll(int fd, std::string_view data) {
  if (std::find(failed_fds_.begin(), failed_fds_.end(), fd) != failed_fds_.end()) return;
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Someone made the descriptor non-blocking (it may be shared with our parent): wait.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
      continue;
    }
    const int err = errno;
    failed_fds_.push_back(fd);
    if (fd != stderr_fd_) {
      std::string msg = "dtrain launch: warning: cannot write output to descriptor " +
                        std::to_string(fd) + ": " + std::strerror(err) + "; dropping it\n";
      (void)!::write(stderr_fd_, msg.data(), msg.size());
    }
    return;
  }
}

}  // namespace dtrain::launcher
