#include "report/reporter.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "common/config/config.h"
#include "common/logging.h"

namespace dtrain::report {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxQueuedBytes = size_t{64} << 20;
constexpr std::chrono::milliseconds kConnectTimeout(3000);
constexpr std::chrono::milliseconds kHelloTimeout(3000);
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
    const auto colon = address_.rfind(':');
    if (colon == std::string::npos) return Fail("DTRAIN_REPORT_ADDR is not host:port");
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* result = nullptr;
    if (::getaddrinfo(address_.substr(0, colon).c_str(), address_.substr(colon + 1).c_str(), &hints,
                      &result) != 0 ||
        result == nullptr) {
      return Fail("cannot resolve " + address_);
    }
    fd_ = ::socket(result->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = fd_ < 0 ? -1 : ::connect(fd_, result->ai_addr, result->ai_addrlen);
    ::freeaddrinfo(result);
    if (fd_ < 0) return Fail(std::strerror(errno));
    if (rc != 0 && errno != EINPROGRESS) return Fail(std::strerror(errno));
    if (!WaitFor(POLLOUT, kConnectTimeout)) return Fail("no answer within 3 s");
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) return Fail(std::strerror(error));
    nlohmann::json hello;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hello = identity_;
    }
    hello["kind"] = "hello";
    hello["token"] = token_;
    const auto t0 = std::chrono::system_clock::now();
    if (!WriteAll(hello.dump() + "\n")) return Fail("the launcher closed the connection");
    // The launcher answers with its clock: the offset, to within half the round trip.
    std::string reply;
    char c = 0;
    const auto give_up = Clock::now() + kHelloTimeout;
    while (reply.size() < 256) {
      if (!WaitFor(POLLIN,
                   std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now()))) {
        return Fail("no hello from the launcher");
      }
      if (::read(fd_, &c, 1) != 1) return Fail("the launcher refused this process");
      if (c == '\n') break;
      reply += c;
    }
    const auto t1 = std::chrono::system_clock::now();
    auto answer = nlohmann::json::parse(reply, nullptr, false);
    if (answer.is_object() && answer.contains("now_us") && answer["now_us"].is_number_integer()) {
      const int64_t middle = (SystemMicros(t0) + SystemMicros(t1)) / 2;
      offset_us_.store(answer["now_us"].get<int64_t>() - middle, std::memory_order_relaxed);
    }
    return true;
  }

  bool Fail(const std::string& why) {
    DTRAIN_LOG(kConnections) << "not reporting to the launcher at " << address_ << ": " << why;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    queue_.clear();
    queued_bytes_ = 0;
    idle_cv_.notify_all();
    return false;
  }

  bool WaitFor(short events, std::chrono::milliseconds timeout) {
    pollfd p{fd_, events, 0};
    const int ms = static_cast<int>(std::max<int64_t>(0, timeout.count()));
    int rc;
    do {
      rc = ::poll(&p, 1, ms);
    } while (rc < 0 && errno == EINTR);
    return rc == 1 && (p.revents & events) != 0;
  }

  bool WriteAll(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!WaitFor(POLLOUT, std::chrono::milliseconds(10000))) return false;
      } else {
        return false;
      }
    }
    return true;
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
  int fd_ = -1;  // the sender thread's
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
