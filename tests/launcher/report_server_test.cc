// ReportServer (launcher/status/report_server.h) on real loopback sockets: a member with the job's
// token is heard as the node its hello names; strangers, wrong tokens, oversized or malformed lines
// and random bytes are refused and logged, and never reach the job's status.
#include "launcher/status/report_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

namespace dtrain::launcher {
namespace {

using ::testing::HasSubstr;

// A client socket to 127.0.0.1:port whose reads give up after 5 s.
class Client {
 public:
  explicit Client(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { ::close(fd_); }

  bool connected() const { return connected_; }
  void Send(const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server closed it
      sent += static_cast<size_t>(n);
    }
  }
  // One line from the server, without its newline; "" when it closed (or after 5 s).
  std::string ReadLine() {
    std::string line;
    char c;
    while (::recv(fd_, &c, 1, 0) == 1) {
      if (c == '\n') return line;
      line += c;
    }
    return "";
  }
  // Whether the server closed the connection (within 5 s).
  bool Closed() {
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  int fd_;
  bool connected_ = false;
};

class ReportServerTest : public ::testing::Test {
 protected:
  ReportServerTest() : work_(asio::make_work_guard(io_)) {
    ReportChannel channel = ReportChannel::Open(/*loopback_only=*/true);
    port_ = channel.port;
    token_ = channel.token;
    server_ = std::make_unique<ReportServer>(
        io_, std::move(channel),
        [this](const NodeKey& from, const nlohmann::json& record) {
          std::lock_guard<std::mutex> lock(mutex_);
          records_.emplace_back(from, record);
          changed_.notify_all();
        },
        [this](const NodeKey& from, std::string_view line) {
          std::lock_guard<std::mutex> lock(mutex_);
          texts_.emplace_back(from, std::string(line));
          changed_.notify_all();
        },
        [this](const std::string& line) {
          std::lock_guard<std::mutex> lock(mutex_);
          said_ += line + "\n";
          changed_.notify_all();
        });
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ReportServerTest() override {
    asio::post(io_, [this] { server_->Stop(); });
    work_.reset();
    thread_.join();
  }

  std::string Hello(const std::string& role, int rank, const std::string& token) const {
    return nlohmann::json{{"kind", "hello"}, {"role", role}, {"rank", rank}, {"token", token}}
               .dump() +
           "\n";
  }

  // Waits (at most 10 s) until `done` holds under the lock.
  template <typename Pred>
  bool WaitFor(Pred done) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(10), done);
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::unique_ptr<ReportServer> server_;
  std::thread thread_;
  uint16_t port_ = 0;
  std::string token_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::pair<NodeKey, nlohmann::json>> records_;
  std::vector<std::pair<NodeKey, std::string>> texts_;
  std::string said_;
};

TEST_F(ReportServerTest, ElasticRequestsAreAnsweredOnTheirConnectionAsTheHellosNode) {
  std::vector<std::pair<NodeKey, std::string>> asked;  // under mutex_
  asio::post(io_, [this, &asked] {
    server_->set_on_request([this, &asked](const NodeKey& from, const std::string& peer,
                                           const nlohmann::json& request,
                                           ReportServer::ReplyFn reply) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        asked.emplace_back(from, peer);
        changed_.notify_all();
      }
      reply({{"kind", "answer"}, {"to", request["kind"]}});
      reply({{"kind", "second"}});  // answers queue: both arrive, in order
    });
  });
  Client c(port_);
  ASSERT_TRUE(c.connected());
  c.Send(Hello("worker", 3, token_));
  ASSERT_FALSE(c.ReadLine().empty());  // the hello's answer
  c.Send(R"({"kind":"elastic_hosts","role":"worker","rank":0})"
         "\n");
  const auto first = nlohmann::json::parse(c.ReadLine(), nullptr, false);
  EXPECT_EQ(first.value("to", ""), "elastic_hosts");
  EXPECT_EQ(nlohmann::json::parse(c.ReadLine(), nullptr, false).value("kind", ""), "second");
  std::lock_guard<std::mutex> lock(mutex_);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].first, (NodeKey{Role::kWorker, 3}));  // the hello's, not the record's
  EXPECT_EQ(asked[0].second, "127.0.0.1");
  // Requests are not records.
  for (const auto& [from, record] : records_) EXPECT_EQ(record["kind"], "hello");
}

TEST_F(ReportServerTest, AMemberIsHeardAsTheNodeItsHelloNames) {
  Client c(port_);
  ASSERT_TRUE(c.connected());
  // The hello and the first records in one write: nothing after the hello is lost.
  c.Send(Hello("worker", 1, token_) + R"({"kind":"progress","samples":5})" + "\n" +
         R"([{"name":"push","ph":"X"}])" + "\n");
  const nlohmann::json reply = nlohmann::json::parse(c.ReadLine(), nullptr, false);
  ASSERT_TRUE(reply.is_object());
  EXPECT_GT(reply.value("now_us", int64_t{0}), 0);
  // A record claiming another identity is still the hello's node's.
  c.Send(R"({"kind":"progress","role":"server","rank":0,"samples":6})"
         "\n");
  ASSERT_TRUE(WaitFor([&] { return records_.size() == 3 && texts_.size() == 1; }));
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [from, record] : records_) EXPECT_EQ(from, (NodeKey{Role::kWorker, 1}));
  EXPECT_EQ(records_[0].second["kind"], "hello");
  EXPECT_EQ(records_[1].second["samples"], 5);
  EXPECT_EQ(records_[2].second["samples"], 6);
  EXPECT_EQ(texts_[0].first, (NodeKey{Role::kWorker, 1}));
  EXPECT_EQ(texts_[0].second, R"([{"name":"push","ph":"X"}])");
  EXPECT_EQ(said_, "");
}

TEST_F(ReportServerTest, StrangersAreRefusedLoggedAndNeverHeard) {
  const std::string wrong_token(token_.size(), '0');
  const std::vector<std::pair<std::string, std::string>> strangers = {
      {Hello("worker", 0, wrong_token), "a hello without the job's token"},
      {Hello("wizard", 0, token_), "a hello without the job's token"},
      {"GET / HTTP/1.1\r\n\r\n", "a line that is not a JSON object"},
      {R"([{"name":"push"}])"
       "\n",
       "a line that is not a JSON object"},         // before a hello
      {std::string(5000, 'x'), "a line too long"},  // over 4 KiB, no hello
  };
  for (const auto& [bytes, why] : strangers) {
    Client c(port_);
    ASSERT_TRUE(c.connected());
    c.Send(bytes);
    EXPECT_TRUE(c.Closed()) << bytes.substr(0, 80);
    ASSERT_TRUE(WaitFor([&] { return said_.find(why) != std::string::npos; }))
        << "expected \"" << why << "\" for " << bytes.substr(0, 80) << "; said:\n"
        << said_;
  }
  // Five are said; the rest are refused without a word (a flood does not flood the output).
  EXPECT_THAT(said_, HasSubstr("(further ones are not reported)"));
  const std::string said_before = said_;
  Client quiet(port_);
  quiet.Send(Hello("worker", 0, token_.substr(1)));
  EXPECT_TRUE(quiet.Closed());
  std::lock_guard<std::mutex> lock(mutex_);
  EXPECT_EQ(said_, said_before);
  EXPECT_TRUE(records_.empty());
  EXPECT_TRUE(texts_.empty());
  EXPECT_THAT(said_, HasSubstr("ignoring a connection to the report port from 127.0.0.1:"));
}

TEST_F(ReportServerTest, RandomBytesNeverReachTheJob) {
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    std::string bytes(1 + rng() % 600, '\0');
    for (char& b : bytes) b = static_cast<char>(rng());
    if (i % 2) bytes += '\n';
    Client c(port_);
    ASSERT_TRUE(c.connected());
    c.Send(bytes);
  }
  // A member after the noise is still heard.
  Client member(port_);
  member.Send(Hello("server", 0, token_));
  EXPECT_FALSE(member.ReadLine().empty());
  ASSERT_TRUE(WaitFor([&] { return !records_.empty(); }));
  std::lock_guard<std::mutex> lock(mutex_);
  ASSERT_EQ(records_.size(), 1u);
  EXPECT_EQ(records_[0].first, (NodeKey{Role::kServer, 0}));
}

}  // namespace
}  // namespace dtrain::launcher
