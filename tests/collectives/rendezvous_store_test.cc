// The gloo rendezvous store over real loopback sockets, in one process.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "../integration/subprocess.h"
#include "collectives/gloo/rendezvous_client.h"
#include "collectives/gloo/rendezvous_server.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

using dtrain::testing::FreePort;

std::vector<char> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A raw connection to the server, to send what a well-behaved client would not.
class RawSocket {
 public:
  explicit RawSocket(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ~RawSocket() { Close(); }
  void Send(const std::vector<char>& bytes) {
    EXPECT_EQ(write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // A frame: u32 length, then the body.
  void SendFrame(const std::vector<char>& body) {
    std::vector<char> frame(4);
    const uint32_t n = static_cast<uint32_t>(body.size());
    std::memcpy(frame.data(), &n, 4);
    frame.insert(frame.end(), body.begin(), body.end());
    Send(frame);
  }
  // True when the server closed the connection (read returns 0 within a second).
  bool ClosedByServer() {
    timeval tv{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buffer[64];
    while (true) {
      ssize_t n = read(fd_, buffer, sizeof(buffer));
      if (n == 0) return true;
      if (n < 0) return false;
    }
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::vector<char> Hello(int32_t rank) {
  std::vector<char> body(5);
  body[0] = 1;
  std::memcpy(body.data() + 1, &rank, 4);
  return body;
}

TEST(RendezvousStore, ClientsShareKeysThroughRankZero) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 2);
  RendezvousClient a("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000));
  RendezvousClient b("127.0.0.1", static_cast<uint16_t>(port), 1, Duration(5000));
  a.set("k", Bytes("value"));
  b.wait({"k"});
  EXPECT_EQ(b.get("k"), Bytes("value"));
  // get waits for a key that another rank sets a little later, as gloo expects.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    b.set("late", Bytes("x"));
  });
  EXPECT_EQ(a.get("late"), Bytes("x"));
  later.join();
  EXPECT_TRUE(a.LostRanks(Duration(1000)).empty());
}

TEST(RendezvousStore, WaitTimesOutNamingTheMissingKeys) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 1);
  RendezvousClient a("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000));
  a.set("here", Bytes("1"));
  try {
    a.wait({"here", "missing/7"}, std::chrono::milliseconds(100));
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing/7"), std::string::npos) << e.what();
  }
}

// What `client` is told of lost ranks, asked every 10 ms until it is told of one (at most `tries`
// times): the server notes a loss on its own thread, a moment after it happens.
std::vector<LostRank> LostWithin(RendezvousClient& client, int tries) {
  std::vector<LostRank> lost;
  for (int i = 0; i < tries && lost.empty(); ++i) {
    lost = client.LostRanks(Duration(1000));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return lost;
}

TEST(RendezvousStore, ARankThatDisconnectsWithoutGoodbyeIsLost) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 3);
  RendezvousClient a("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000));
  {
    RendezvousClient clean("127.0.0.1", static_cast<uint16_t>(port), 1, Duration(5000));
  }  // says goodbye
  RawSocket crash(port);
  crash.SendFrame(Hello(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  crash.Close();
  const std::vector<LostRank> lost = LostWithin(a, 100);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].rank, 2);
  EXPECT_EQ(lost[0].why, "left the job (its connection closed)");
}

// A frozen process keeps its connection open: with heartbeats, its silence is what loses it, and
// ranks that keep sending heartbeats (while idle) are never lost.
TEST(RendezvousStore, ARankSilentPastTheHeartbeatTimeoutIsLostAndBusyRanksAreNot) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 3, "", Duration(10000), "",
                          /*heartbeat_timeout=*/Duration(600));
  RendezvousClient a("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000), "",
                     /*heartbeat_interval=*/Duration(100));
  RendezvousClient idle("127.0.0.1", static_cast<uint16_t>(port), 1, Duration(5000), "",
                        Duration(100));
  RawSocket frozen(port);  // says hello as rank 2, then nothing
  frozen.SendFrame(Hello(2));
  const std::vector<LostRank> lost = LostWithin(a, 300);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].rank, 2);
  EXPECT_NE(lost[0].why.find("sent nothing for"), std::string::npos) << lost[0].why;
  EXPECT_NE(lost[0].why.find("PS_HEARTBEAT_TIMEOUT"), std::string::npos) << lost[0].why;
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // well past the timeout
  EXPECT_EQ(a.LostRanks(Duration(1000)).size(), 1u);  // the idle rank's heartbeats keep it in
  frozen.Close();
}

TEST(RendezvousStore, MalformedInputClosesThatConnectionOnly) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 2);
  RendezvousClient good("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000));

  RawSocket huge(port);
  huge.Send({'\xff', '\xff', '\xff', '\x7f'});  // a 2 GB frame
  EXPECT_TRUE(huge.ClosedByServer());

  RawSocket bad_rank(port);
  bad_rank.SendFrame(Hello(99));
  EXPECT_TRUE(bad_rank.ClosedByServer());

  RawSocket unknown(port);
  unknown.SendFrame({42});
  EXPECT_TRUE(unknown.ClosedByServer());

  RawSocket short_key(port);
  short_key.SendFrame({2, '\x10', 0, 0, 0, 'a'});  // set: a key of 16 bytes with 1 present
  EXPECT_TRUE(short_key.ClosedByServer());

  RawSocket many_keys(port);
  many_keys.SendFrame({4, '\xff', '\xff', '\xff', '\xff'});  // check: 4 billion keys
  EXPECT_TRUE(many_keys.ClosedByServer());

  // The server still serves the well-behaved.
  good.set("still", Bytes("here"));
  EXPECT_EQ(good.get("still"), Bytes("here"));
}

TEST(RendezvousStore, NobodyListeningIsATimeoutNamingHostAndPort) {
  const int port = FreePort();
  try {
    RendezvousClient c("127.0.0.1", static_cast<uint16_t>(port), 1, Duration(300));
    FAIL() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(RendezvousStore, ThePortInUseIsReported) {
  const int port = FreePort();
  RendezvousServer first(static_cast<uint16_t>(port), 1);
  try {
    RendezvousServer second(static_cast<uint16_t>(port), 1);
    FAIL() << "two servers on one port";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(RendezvousStore, AClientLearnsWhenRankZeroIsGone) {
  const int port = FreePort();
  auto server = std::make_unique<RendezvousServer>(static_cast<uint16_t>(port), 2);
  RendezvousClient c("127.0.0.1", static_cast<uint16_t>(port), 1, Duration(5000));
  server.reset();
  EXPECT_THROW(c.LostRanks(Duration(1000)), PeerError);
}

// Rank 0 failing after a rank died must not make the others name rank 0: its server, going away,
// keeps answering who left until the ranks still connected have asked and gone.
TEST(RendezvousStore, AfterALossRankZeroAnswersTheOthersBeforeItGoes) {
  const int port = FreePort();
  auto server = std::make_unique<RendezvousServer>(static_cast<uint16_t>(port), 3);
  auto survivor = std::make_unique<RendezvousClient>("127.0.0.1", static_cast<uint16_t>(port), 2,
                                                     Duration(5000));
  RawSocket crash(port);
  crash.SendFrame(Hello(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  crash.Close();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread rank_zero_exits([&] { server.reset(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 is on its way out
  std::vector<LostRank> lost;
  std::string error;
  try {
    lost = survivor->LostRanks(Duration(1000));
  } catch (const Error& e) {
    error = e.what();  // rank 0 had gone: the survivor would name it
  }
  survivor.reset();  // says goodbye: rank 0 may go now
  rank_zero_exits.join();
  ASSERT_EQ(lost.size(), 1u) << error;
  EXPECT_EQ(lost[0].rank, 1);
}

constexpr char kSecret[] = "the-secret-of-this-job-0123";

// The error text of a client that says hello as rank 1 with `secret`; "" if it was admitted.
std::string HelloError(int port, const std::string& secret) {
  try {
    RendezvousClient c("127.0.0.1", static_cast<uint16_t>(port), 1, Duration(5000), secret);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RendezvousStoreAuth, ClientsWithTheSecretShareKeys) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 2, kSecret);
  RendezvousClient a("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000), kSecret);
  RendezvousClient b("127.0.0.1", static_cast<uint16_t>(port), 1, Duration(5000), kSecret);
  a.set("k", Bytes("v"));
  EXPECT_EQ(b.get("k"), Bytes("v"));
}

// A missing, wrong or one-sided secret is refused with the reason, and the refused client is no
// rank: its end is nobody's loss.
TEST(RendezvousStoreAuth, AMissingOrWrongSecretIsRefusedAndCountsAsNoRank) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 2, kSecret);
  EXPECT_NE(HelloError(port, "").find("requires DTRAIN_JOB_SECRET"), std::string::npos);
  EXPECT_NE(HelloError(port, "a-different-secret-0123").find("does not know this job's"),
            std::string::npos);
  RendezvousClient a("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000), kSecret);
  EXPECT_TRUE(a.LostRanks(Duration(2000)).empty());

  const int open_port = FreePort();
  RendezvousServer open(static_cast<uint16_t>(open_port), 2);
  EXPECT_NE(HelloError(open_port, kSecret).find("set there but not on rank 0"), std::string::npos);
}

// Until the proof checks out, no request is served: a store request before the hello, or after
// the hello without the proof, closes the connection.
TEST(RendezvousStoreAuth, NoRequestIsServedBeforeTheProof) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 2, kSecret);
  RawSocket no_hello(port);
  no_hello.SendFrame({5});  // kLost
  EXPECT_TRUE(no_hello.ClosedByServer());

  RawSocket no_proof(port);
  std::vector<char> hello = Hello(1);
  const std::string nonce(64, 'a');
  const uint32_t n = static_cast<uint32_t>(nonce.size());
  hello.insert(hello.end(), reinterpret_cast<const char*>(&n),
               reinterpret_cast<const char*>(&n) + 4);
  hello.insert(hello.end(), nonce.begin(), nonce.end());
  no_proof.SendFrame(hello);
  no_proof.SendFrame({5});  // kLost, instead of the proof
  EXPECT_TRUE(no_proof.ClosedByServer());

  RendezvousClient a("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000), kSecret);
  EXPECT_TRUE(a.LostRanks(Duration(2000)).empty());
}

// A connection that says nothing is dropped at the hello deadline; a rank that has said hello is
// kept however quiet it is.
TEST(RendezvousStoreAuth, ASilentConnectionIsDroppedAtTheHelloDeadline) {
  const int port = FreePort();
  RendezvousServer server(static_cast<uint16_t>(port), 2, kSecret, Duration(200));
  RendezvousClient member("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000), kSecret);
  RawSocket silent(port);
  EXPECT_TRUE(silent.ClosedByServer());  // waits up to 1 s
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  member.set("still", Bytes("here"));
  EXPECT_EQ(member.get("still"), Bytes("here"));
  EXPECT_TRUE(member.LostRanks(Duration(2000)).empty());
}

// The address a socket listening on `port` is bound to, as /proc/net/tcp gives it (hex, host byte
// order of the kernel: 127.0.0.1 reads 0100007F); "" if none listens there.
std::string ListeningAddress(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the column names
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const auto colon = local.find(':');
    if (colon == std::string::npos || state != "0A") continue;  // 0A: LISTEN
    if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) return local.substr(0, colon);
  }
  return "";
}

// Rank 0 listens on the address the job announces for it (DMLC_PS_ROOT_URI), not on every
// interface; with no address, on every interface as before.
TEST(RendezvousStore, ListensOnTheAnnouncedAddressOnly) {
  const int port = FreePort();
  {
    RendezvousServer server(static_cast<uint16_t>(port), 1, "", Duration(10000), "127.0.0.1");
    EXPECT_EQ(ListeningAddress(port), "0100007F");
    RendezvousClient client("127.0.0.1", static_cast<uint16_t>(port), 0, Duration(5000), "");
    EXPECT_TRUE(client.LostRanks(Duration(1000)).empty());
  }
  const int other = FreePort();
  RendezvousServer anywhere(static_cast<uint16_t>(other), 1);
  EXPECT_EQ(ListeningAddress(other), "00000000");
}

}  // namespace
}  // namespace dtrain::collectives
