#include "report/reporter.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "common/config/config.h"
#include "common/logging.h"
#include "report/launcher_link.h"

namespace dtrain::report {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxQueuedBytes = size_t{64} << 20;
constexpr std::chrono::milliseconds kConnectTimeout(3000);
constexpr std::chrono::milliseconds kWriteTimeout(10000);
constexpr std::chrono::seconds kPeriod(1);

int64_t SystemMicros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// Records the launcher must get even when the queue is full.
bool Essential(const std::string& kind) {
  return kind == "failure" || kind == "error" || kind == "summary" || kind == "state";
}

class Reporter {
 public:
  Reporter() : address_(ProcessConfig().report_address), token_(ProcessConfig().report_token) {
    const Config& config = ProcessConfig();
    identity_ = {{"role", config.role ? RoleName(*config.role) : "process"},
                 {"rank", std::max(config.requested_rank, 0)},
                 {"host", HostName()},
                 {"pid", static_cast<int64_t>(::getpid())}};
  }

  bool enabled() const { return !address_.empty(); }

  void SetIdentity(const std::string& role, int rank, const std::string& host) {
    std::lock_guard<std::mutex> lock(mutex_);
    identity_["role"] = role;
    identity_["rank"] = rank;
    if (!host.empty()) identity_["host"] = host;
  }

  void Send(nlohmann::json record) {
    if (!enabled() || !record.is_object()) return;
    const bool essential = Essential(record.value("kind", ""));
    std::unique_lock<std::mutex> lock(mutex_);
    EnqueueLocked(LineLocked(std::move(record)), essential);
  }

  void SendLine(std::string line) {
    if (!enabled()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    EnqueueLocked(std::move(line), /*essential=*/false);
  }

  int AddPeriodic(std::function<nlohmann::json()> provider) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int id = next_id_++;
    periodic_[id] = std::move(provider);
    if (enabled()) StartLocked();
    return id;
  }

  void RemovePeriodic(int id) {
    std::lock_guard<std::mutex> lock(mutex_);
    periodic_.erase(id);
  }

  void Flush(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!started_) return;
    cv_.notify_one();
    idle_cv_.wait_for(lock, timeout, [&] { return failed_ || (queue_.empty() && !writing_); });
  }

  int64_t LauncherMicros(std::chrono::system_clock::time_point local) const {
    return SystemMicros(local) + offset_us_.load(std::memory_order_relaxed);
  }

 private:
  static std::string HostName() {
    std::string host = ProcessConfig().node_host;
    if (!host.empty()) return host;
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    return name;
  }

  // Queues one line for the sender; past kMaxQueuedBytes only essential records are kept.
  void EnqueueLocked(std::string line, bool essential) {
    if (failed_) return;
    if (queued_bytes_ + line.size() > kMaxQueuedBytes && !essential) {
      ++dropped_;
      return;
    }
    queued_bytes_ += line.size();
    queue_.push_back(std::move(line));
    StartLocked();
    cv_.notify_one();
  }

  void StartLocked() {
    if (started_) return;
    started_ = true;
    std::thread([this] { Run(); }).detach();
    std::atexit([] { report::Flush(std::chrono::milliseconds(1000)); });
  }

  // Connects and says hello; false (logged once) when the launcher cannot be reached.
  bool Connect() {
    nlohmann::json identity;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      identity = identity_;
    }
    const auto t0 = std::chrono::system_clock::now();
    try {
      link_ =
          std::make_unique<LauncherLink>(address_, token_, std::move(identity), kConnectTimeout);
    } catch (const std::exception& e) {
      return Fail(e.what());
    }
    // The launcher answers with its clock: the offset, to within half the round trip.
    const auto t1 = std::chrono::system_clock::now();
    const nlohmann::json& answer = link_->hello_reply();
    if (answer.contains("now_us") && answer["now_us"].is_number_integer()) {
      const int64_t middle = (SystemMicros(t0) + SystemMicros(t1)) / 2;
      offset_us_.store(answer["now_us"].get<int64_t>() - middle, std::memory_order_relaxed);
    }
    return true;
  }

  bool Fail(const std::string& why) {
    DTRAIN_LOG(kConnections) << "not reporting to the launcher at " << address_ << ": " << why;
    link_.reset();
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    queue_.clear();
    queued_bytes_ = 0;
    idle_cv_.notify_all();
    return false;
  }

  bool WriteAll(const std::string& data) {
    try {
      link_->Write(data, kWriteTimeout);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  void Run() {
    if (!Connect()) return;
    auto next_period = Clock::now();
    while (true) {
      std::deque<std::string> batch;
      std::vector<std::function<nlohmann::json()>> providers;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait_until(lock, next_period, [&] { return !queue_.empty(); });
        batch.swap(queue_);
        queued_bytes_ = 0;
        writing_ = true;
        if (Clock::now() >= next_period) {
          next_period = Clock::now() + kPeriod;
          for (auto& [id, p] : periodic_) providers.push_back(p);
          if (dropped_ > 0) {
            DTRAIN_LOG(kConnections) << "dropped " << dropped_ << " records for the launcher";
            dropped_ = 0;
          }
        }
      }
      std::string data;
      for (auto& line : batch) data += line;
      if (!providers.empty()) {
        data += MakeLine({{"kind", "heartbeat"}});
        for (auto& p : providers) {
          nlohmann::json record;
          try {
            record = p();
          } catch (const std::exception&) {
            continue;
          }
          if (record.is_object()) data += MakeLine(std::move(record));
        }
      }
      if (!data.empty() && !WriteAll(data)) {
        Fail("the connection was lost");
        return;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      writing_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  std::string MakeLine(nlohmann::json record) {
    std::lock_guard<std::mutex> lock(mutex_);
    return LineLocked(std::move(record));
  }

  // `record` with this process's identity and the launcher's time, as one line of text.
  std::string LineLocked(nlohmann::json record) const {
    for (const auto& [k, v] : identity_.items()) record[k] = v;
    record["t_us"] = LauncherMicros(std::chrono::system_clock::now());
    return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }

  const std::string address_;
  const std::string token_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  nlohmann::json identity_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  uint64_t dropped_ = 0;
  bool started_ = false;
  bool writing_ = false;
  bool failed_ = false;
  std::map<int, std::function<nlohmann::json()>> periodic_;
  int next_id_ = 1;
  std::unique_ptr<LauncherLink> link_;  // the sender thread's
  std::atomic<int64_t> offset_us_{0};
};

Reporter& Instance() {
  static Reporter* reporter = new Reporter();  // lives until exit: the sender thread uses it
  return *reporter;
}

}  // namespace

bool Enabled() { return Instance().enabled(); }
void Send(nlohmann::json record) { Instance().Send(std::move(record)); }
void SendLine(std::string line) { Instance().SendLine(std::move(line)); }
void SetIdentity(const std::string& role, int rank, const std::string& host) {
  Instance().SetIdentity(role, rank, host);
}
int AddPeriodic(std::function<nlohmann::json()> provider) {
  return Instance().AddPeriodic(std::move(provider));
}
void RemovePeriodic(int id) { Instance().RemovePeriodic(id); }
void Flush(std::chrono::milliseconds timeout) { Instance().Flush(timeout); }
int64_t LauncherMicros(std::chrono::system_clock::time_point local) {
  return Instance().LauncherMicros(local);
}

}  // namespace dtrain::report
