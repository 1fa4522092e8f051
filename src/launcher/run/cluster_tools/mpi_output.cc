#include "launcher/run/cluster_tools/mpi_output.h"

#include <signal.h>
#include <string.h>

#include <cctype>
#include <regex>

#include "launcher/plan/cluster_tools/mpi_launcher_args.h"

namespace dtrain::launcher {
namespace {

enum class TagMatch { kNone, kPartial, kComplete };

// Longer numbers are not a tag; this also bounds what a partial tag can hold back.
constexpr size_t kMaxDigits = 10;

// Whether s[i...] starts with `digits` then `stop`: advances i past them.
TagMatch MatchNumber(std::string_view s, size_t* i, char stop, long* value) {
  const size_t start = *i;
  *value = 0;
  while (*i < s.size() && std::isdigit(static_cast<unsigned char>(s[*i]))) {
    if (*i - start >= kMaxDigits) return TagMatch::kNone;
    *value = *value * 10 + (s[*i] - '0');
    ++*i;
  }
  if (*i == s.size()) return TagMatch::kPartial;
  if (*i == start || s[*i] != stop) return TagMatch::kNone;
  ++*i;
  return TagMatch::kComplete;
}

// Whether s[pos...] is "[JOB,RANK]<stdout>:" (or stderr, stddiag), or could still become one when
// more bytes arrive.
TagMatch MatchTag(std::string_view s, size_t pos, int* rank, size_t* length) {
  size_t i = pos;
  if (i >= s.size() || s[i] != '[') return TagMatch::kNone;
  ++i;
  long job = 0, r = 0;
  if (TagMatch m = MatchNumber(s, &i, ',', &job); m != TagMatch::kComplete) return m;
  if (TagMatch m = MatchNumber(s, &i, ']', &r); m != TagMatch::kComplete) return m;
  const std::string_view rest = s.substr(i);
  for (std::string_view name : {"<stdout>:", "<stderr>:", "<stddiag>:"}) {
    if (rest.size() < name.size()) {
      if (name.substr(0, rest.size()) == rest) return TagMatch::kPartial;
    } else if (rest.substr(0, name.size()) == name) {
      *rank = static_cast<int>(r);
      *length = i + name.size() - pos;
      return TagMatch::kComplete;
    }
  }
  return TagMatch::kNone;
}

std::string SignalDescription(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return "was killed by signal " + std::to_string(sig) + " (SIG" + (abbrev ? abbrev : "?") + ")";
}

}  // namespace

void MpiOutputParser::Parse(Stream& s, bool from_stderr, const Sink& sink) {
  for (;;) {
    if (s.rank < 0) {
      if (s.pending.empty()) return;
      if (s.pending[0] == '[') {
        int rank = 0;
        size_t length = 0;
        const TagMatch m = MatchTag(s.pending, 0, &rank, &length);
        if (m == TagMatch::kPartial) return;
        if (m == TagMatch::kComplete) {
          s.rank = rank;
          s.chunk_start = true;
          s.pending.erase(0, length);
          continue;
        }
      }
      // mpirun's own line.
      const size_t nl = s.pending.find('\n');
      if (nl == std::string::npos) {
        if (s.pending.size() <= kMaxLineBytes) return;
        sink.tool_line(std::string_view(s.pending).substr(0, kMaxLineBytes), from_stderr);
        s.pending.erase(0, kMaxLineBytes);
        continue;
      }
      sink.tool_line(std::string_view(s.pending).substr(0, nl), from_stderr);
      s.pending.erase(0, nl + 1);
      continue;
    }
    if (s.chunk_start) {
      const Marker m = TakeExitMarker(s, sink);
      if (m == Marker::kWait) return;
      if (m == Marker::kTaken) continue;
    }
    // A task's bytes: up to and with the next newline, or up to the next tag.
    size_t end = std::string::npos;
    bool wait = false;
    for (size_t i = 0; i < s.pending.size(); ++i) {
      if (s.pending[i] == '\n') {
        end = i + 1;
        break;
      }
      if (s.pending[i] != '[') continue;
      int rank = 0;
      size_t length = 0;
      const TagMatch m = MatchTag(s.pending, i, &rank, &length);
      if (m == TagMatch::kNone) continue;
      end = i;
      wait = m == TagMatch::kPartial;
      break;
    }
    if (end == std::string::npos) {
      sink.task_output(s.rank, from_stderr, s.pending);
      s.pending.clear();
      return;
    }
    if (end > 0) sink.task_output(s.rank, from_stderr, std::string_view(s.pending).substr(0, end));
    s.pending.erase(0, end);
    // A partial tag may still turn out to be the task's own text: keep the task until we know.
    if (wait) return;
    s.rank = -1;
  }
}

MpiOutputParser::Marker MpiOutputParser::TakeExitMarker(Stream& s, const Sink& sink) {
  const std::string_view marker = kMpiExitMarker;
  const std::string_view head = std::string_view(s.pending).substr(0, marker.size());
  if (head != marker.substr(0, head.size())) {
    s.chunk_start = false;
    return Marker::kNo;
  }
  const size_t nl = s.pending.find('\n');
  if (head.size() < marker.size() || nl == std::string::npos) {
    // The status has at most three digits.
    if (s.pending.size() <= marker.size() + 3) return Marker::kWait;
    s.chunk_start = false;
    return Marker::kNo;
  }
  const std::string digits = s.pending.substr(marker.size(), nl - marker.size());
  if (digits.empty() || digits.size() > 3 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    s.chunk_start = false;
    return Marker::kNo;
  }
  const int status = std::stoi(digits);
  s.pending.erase(0, nl + 1);
  s.chunk_start = false;
  const int task = s.rank;
  s.rank = -1;
  aborting_ = true;  // mpirun aborts a job one of whose tasks failed
  // A shell reports a child killed by signal N as 128 + N.
  if (status > 128 && status < 128 + NSIG) {
    sink.task_failure(TaskFailure{task, status, SignalDescription(status - 128)});
  } else {
    sink.task_failure(TaskFailure{task, status, "exited with code " + std::to_string(status)});
  }
  return Marker::kTaken;
}

void MpiOutputParser::Feed(std::string_view data, bool from_stderr, const Sink& sink) {
  Stream& s = streams_[from_stderr];
  s.pending.append(data);
  Parse(s, from_stderr, sink);
}

void MpiOutputParser::Finish(bool from_stderr, const Sink& sink) {
  Stream& s = streams_[from_stderr];
  Parse(s, from_stderr, sink);
  if (!s.pending.empty()) {
    if (s.rank >= 0) {
      sink.task_output(s.rank, from_stderr, s.pending);
    } else {
      sink.tool_line(s.pending, from_stderr);
    }
  }
  s.pending.clear();
  s.rank = -1;
  s.chunk_start = false;
}

std::optional<TaskFailure> MpiOutputParser::FailureIn(std::string_view tool_line) {
  static const std::regex process_name(R"(Process name: \[\[\d+,\d+\],(\d{1,9})\])");
  static const std::regex exit_code(R"(^\s*Exit code:\s+(\d{1,9}))");
  static const std::regex signal(
      R"(mpirun noticed that process rank (\d{1,9}) with PID \d+ on node \S+ )"
      R"(exited on signal (\d{1,3}))");
  const std::string line(tool_line);
  if (line.find("the job has been aborted") != std::string::npos ||
      line.find("mpirun noticed that process rank") != std::string::npos ||
      line.find("mpirun detected that one or more processes exited") != std::string::npos) {
    aborting_ = true;
  }
  std::smatch m;
  if (std::regex_search(line, m, process_name)) {
    reported_rank_ = std::stoi(m[1]);
    return std::nullopt;
  }
  if (reported_rank_ >= 0 && std::regex_search(line, m, exit_code)) {
    const int code = std::stoi(m[1]);
    const int rank = reported_rank_;
    reported_rank_ = -1;
    return TaskFailure{rank, code, "exited with code " + std::to_string(code)};
  }
  if (std::regex_search(line, m, signal)) {
    const int sig = std::stoi(m[2]);
    return TaskFailure{std::stoi(m[1]), 128 + sig, SignalDescription(sig)};
  }
  return std::nullopt;
}

}  // namespace dtrain::launcher
