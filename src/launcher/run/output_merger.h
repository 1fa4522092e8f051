// Merging the output of many processes into the launcher's stdout and stderr, one whole line at a
// time, each line prefixed with the process it came from ("[worker 1] ").
//
// Bytes arrive in arbitrary pieces (whatever one read of a pipe returned); LineSplitter cuts them
// into lines, so lines of different processes never mix mid-line. A line with no newline for more
// than max_line bytes is passed on in pieces, each ending the output line, so that one process
// cannot make the launcher buffer without bound. A final line without a newline is ended at EOF.
//
// Threads: neither class is thread-safe; the launcher uses them on its one event-loop thread, which
// is also what keeps lines whole (each goes out in a single write). Writes block when the reader of
// the launcher's stdout does not keep up; that back-pressure reaches the children through their
// pipes, as it would without the launcher. A terminal or log that fails (EPIPE, disk full) is
// reported once and then skipped, so children are never stuck on a full pipe because of it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launcher {

inline constexpr size_t kMaxLineBytes = 64 * 1024;

class LineSplitter {
 public:
  using LineFn = std::function<void(std::string_view line)>;  // without the '\n'

  explicit LineSplitter(size_t max_line = kMaxLineBytes) : max_line_(max_line) {}

  // Calls emit for every line that `data` completes, and for every max_line bytes of a line that
  // is still not complete.
  void Append(std::string_view data, const LineFn& emit);
  // Calls emit for the incomplete last line, if there is one.
  void Finish(const LineFn& emit);

  size_t pending_bytes() const { return pending_.size(); }

 private:
  size_t max_line_;
  std::string pending_;
};

class OutputMerger {
 public:
  using StreamId = size_t;

  // The descriptors are not owned; they must stay open as long as the merger is used.
  OutputMerger(int stdout_fd, int stderr_fd, size_t max_line = kMaxLineBytes);

  // A new input stream whose lines go to stdout (to_stderr false) or stderr with `prefix` in
  // front, and, unprefixed, to log_fd unless it is -1 (not owned).
  StreamId AddStream(std::string prefix, bool to_stderr, int log_fd);

  // Bytes read from the stream; complete lines are written before this returns.
  void Write(StreamId id, std::string_view data);
  // The stream ended: its incomplete last line is written with a newline. Idempotent.
  void Close(StreamId id);

  // A message of the launcher itself, to stderr, unprefixed (it starts "dtrain launch: ").
  void LauncherLine(std::string_view line);

 private:
  struct Stream {
    std::string prefix;
    int terminal_fd;
    int log_fd;
    LineSplitter splitter;
    bool closed = false;
  };

  void Collect(const Stream& s, std::string_view line);
  void Flush(const Stream& s);
  // Writes all of data, or gives up on fd for good on the first hard error.
  void WriteAll(int fd, std::string_view data);

  int stdout_fd_;
  int stderr_fd_;
  size_t max_line_;
  std::vector<Stream> streams_;
  std::vector<int> failed_fds_;
  std::string terminal_buf_;  // what one Write/Close sends to the terminal
  std::string log_buf_;       // ... and to the log
};

}  // namespace dtrain::launcher
