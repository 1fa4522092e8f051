#include "report/timeline.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <vector>

#include "common/config/config.h"
#include "common/logging.h"
#include "dtrain/common/error.h"
#include "report/reporter.h"

namespace dtrain::timeline {
namespace {

// Events are sent to the launcher in batches of at most this many.
constexpr size_t kBatch = 20000;

int ThreadId() {
  static std::atomic<int> next{1};
  thread_local const int id = next.fetch_add(1);
  return id;
}

// The "process" of this node in the merged trace: its node id (scheduler 0, server r 1 + r,
// worker r 1 + servers + r), which the launcher names.
int NodeId() {
  const Config& config = ProcessConfig();
  const int rank = std::max(config.requested_rank, 0);
  if (!config.role) return static_cast<int>(::getpid());
  switch (*config.role) {
    case Role::kScheduler:
      return 0;
    case Role::kServer:
      return 1 + rank;
    case Role::kWorker:
      return 1 + config.num_servers + rank;
  }
  return static_cast<int>(::getpid());
}

struct Event {
  const char* name;
  const char* category;
  int64_t ts;  // local microseconds
  int64_t dur;
  int tid;
  std::string args;
};

void Render(const Event& e, int64_t offset, int pid, std::string* out) {
  char head[256];
  std::snprintf(head, sizeof(head),
                "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,"
                "\"pid\":%d,\"tid\":%d",
                e.name, e.category, static_cast<long long>(e.ts + offset),
                static_cast<long long>(e.dur), pid, e.tid);
  *out += head;
  if (!e.args.empty()) {
    *out += ",\"args\":{";
    *out += e.args;
    *out += '}';
  }
  *out += '}';
}

// Whether spans record: read by every span, hence an atomic flag rather than a lock.
std::atomic<bool> g_recording{false};

class Recorder {
 public:
  Recorder() : path_(ProcessConfig().timeline_path), pid_(NodeId()) {
    std::atexit([] { Instance().AtExit(); });
    if (path_.empty()) return;
    g_recording.store(true);
    if (report::Enabled()) {
      // A batch goes with the reports each second; what is left goes at exit (below).
      report::AddPeriodic([this]() -> nlohmann::json {
        SendBatches(/*all=*/false);
        return nullptr;
      });
    }
  }

  static Recorder& Instance();

  void Start(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!path_.empty()) {
      throw InvalidArgument(
          "the timeline is on already (DTRAIN_TIMELINE or HOROVOD_TIMELINE=" + path_ + ")");
    }
    if (!started_path_.empty()) {
      throw InvalidArgument("the timeline is on already, started into " + started_path_ +
                            "; stop it first");
    }
    if (path.empty()) throw InvalidArgument("start_timeline needs a file path");
    started_path_ = path;
    events_.clear();
    g_recording.store(true);
  }

  void Stop() {
    std::string file;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (started_path_.empty()) return;
      file.swap(started_path_);
      g_recording.store(false);
    }
    WriteFile(file, /*offset=*/0);
  }

  void Add(Event event) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }

 private:
  // Events as one line of JSON, "[{...},{...}]", on the launcher's clock (the offset measured when
  // the reports connected); empty when there are none.
  std::string TakeBatch(int64_t offset) {
    std::vector<Event> taken;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (events_.empty()) return {};
      const size_t n = std::min(kBatch, events_.size());
      taken.assign(std::make_move_iterator(events_.begin()),
                   std::make_move_iterator(events_.begin() + n));
      events_.erase(events_.begin(), events_.begin() + n);
    }
    std::string line = "[";
    line.reserve(taken.size() * 128);
    for (size_t i = 0; i < taken.size(); ++i) {
      if (i) line += ',';
      Render(taken[i], offset, pid_, &line);
    }
    line += "]\n";
    return line;
  }

  void SendBatches(bool all) {
    do {
      std::string batch = TakeBatch(report::LauncherMicros(TimePoint{}));
      if (batch.empty()) return;
      report::SendLine(std::move(batch));
    } while (all);
  }

  void AtExit() {
    Stop();
    if (path_.empty()) return;
    if (report::Enabled()) {
      SendBatches(/*all=*/true);
      report::Flush(std::chrono::milliseconds(2000));
      return;
    }
    // No launcher: this process's own file, named so that processes sharing the path do not
    // overwrite each other.
    const Config& config = ProcessConfig();
    WriteFile(path_ + "." + (config.role ? RoleName(*config.role) : "process") + "-" +
                  std::to_string(config.requested_rank >= 0 ? config.requested_rank : ::getpid()) +
                  ".json",
              report::LauncherMicros(TimePoint{}));
  }

  // Every event recorded so far, as one trace file.
  void WriteFile(const std::string& file, int64_t offset) {
    std::ofstream out(file);
    out << "{\"traceEvents\":[\n";
    std::string batch;
    bool first = true;
    while (!(batch = TakeBatch(offset)).empty()) {
      // "[...]\n" -> its events, joined to the ones before
      out << (first ? "" : ",\n") << batch.substr(1, batch.size() - 3);
      first = false;
    }
    out << "\n],\"displayTimeUnit\":\"ms\"}\n";
    if (!out) DTRAIN_LOG(kWarning) << "cannot write the timeline " << file;
  }

  const std::string path_;    // the environment's timeline
  std::string started_path_;  // Start's, until Stop; guarded by mutex_
  const int pid_;
  std::mutex mutex_;
  std::vector<Event> events_;
};

Recorder& Recorder::Instance() {
  static Recorder* recorder = new Recorder();  // lives until exit: the exit handler uses it
  return *recorder;
}

int64_t Micros(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

void Args::Name(const char* name) {
  if (!text_.empty()) text_ += ',';
  text_ += '"';
  text_ += name;
  text_ += "\":";
}

Args& Args::Int(const char* name, int64_t value) {
  Name(name);
  text_ += std::to_string(value);
  return *this;
}

Args& Args::Str(const char* name, std::string_view value) {
  Name(name);
  text_ += '"';
  for (char c : value) {
    if (c == '"' || c == '\\') {
      text_ += '\\';
      text_ += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      text_ += ' ';
    } else {
      text_ += c;
    }
  }
  text_ += '"';
  return *this;
}

bool Enabled() {
  // The first call reads the environment (the Recorder's constructor sets the flag).
  static const bool constructed = (Recorder::Instance(), true);
  (void)constructed;
  return g_recording.load(std::memory_order_relaxed);
}

void Start(const std::string& path) { Recorder::Instance().Start(path); }

void Stop() { Recorder::Instance().Stop(); }

void Complete(const char* name, const char* category, TimePoint begin, TimePoint end, Args args) {
  if (!Enabled()) return;
  const int64_t ts = Micros(begin);
  Recorder::Instance().Add(Event{name, category, ts, std::max<int64_t>(0, Micros(end) - ts),
                                 ThreadId(), std::string(args.text())});
}

}  // namespace dtrain::timeline
