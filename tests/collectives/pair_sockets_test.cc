// The sockets under a real two-rank gloo context in one process (loopback TCP, HashStore), and
// their send buffers after gloo's class-based halving-doubling has run on them.
#include "collectives/gloo/pair_sockets.h"

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <thread>
#include <vector>

namespace dtrain::collectives {
namespace {

int SendBuffer(int fd) {
  int bytes = 0;
  socklen_t length = sizeof bytes;
  EXPECT_EQ(::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &length), 0);
  return bytes;
}

int AutotuneMaximum() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_wmem");
  int least = 0, initial = 0, most = 0;
  in >> least >> initial >> most;
  return most;
}

TEST(PairSockets, ConnectingAContextOpensTheSocketsFoundAndTheyAreWidenedAfterAClassBasedRun) {
  gloo::rendezvous::HashStore store;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  std::shared_ptr<gloo::Context> context[2];
  auto connect = [&](int rank) {
    auto c = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    c->setTimeout(std::chrono::seconds(30));
    c->connectFullMesh(store, device);
    context[rank] = c;
  };
  const auto before = OpenSockets();
  std::thread other([&] { connect(1); });
  connect(0);
  other.join();
  const std::vector<int> sockets = NewTcpSockets(before);
  // One connection between the two ranks: both of its ends are in this process.
  ASSERT_EQ(sockets.size(), 2u);
  for (int fd : sockets) EXPECT_EQ(before.count(fd), 0u);

  // A halving-doubling allreduce of 4 KB: gloo sets each pair's SO_SNDBUF to its message size.
  std::vector<float> data[2] = {std::vector<float>(1024, 1.0f), std::vector<float>(1024, 2.0f)};
  std::thread second(
      [&] { gloo::AllreduceHalvingDoubling<float>(context[1], {data[1].data()}, 1024).run(); });
  gloo::AllreduceHalvingDoubling<float>(context[0], {data[0].data()}, 1024).run();
  second.join();
  EXPECT_EQ(data[0][0], 3.0f);
  EXPECT_EQ(data[1][1023], 3.0f);
  const int most = AutotuneMaximum();
  ASSERT_GT(most, 0);
  for (int fd : sockets) EXPECT_LT(SendBuffer(fd), most) << "gloo left SO_SNDBUF alone";

  WidenSendBuffers(sockets);
  for (int fd : sockets) EXPECT_GE(SendBuffer(fd), most);
}

TEST(PairSockets, ASocketThatIsGoneIsSkipped) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const auto before = OpenSockets();
  EXPECT_EQ(before.count(fds[0]), 1u);
  ::close(fds[0]);
  ::close(fds[1]);
  WidenSendBuffers({fds[0], fds[1]});  // no crash, nothing to do
  // Unix sockets are not TCP: never counted as a pair's.
  int more[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, more), 0);
  EXPECT_TRUE(NewTcpSockets(before).empty());
  ::close(more[0]);
  ::close(more[1]);
}

}  // namespace
}  // namespace dtrain::collectives
