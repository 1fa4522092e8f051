// The sockets under a real two-rank gloo context in one process (loopback TCP, HashStore), and
// their send buffers after gloo's class-based halving-doubling has run on them.
#include "collectives/gloo/pair_sockets.h"

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

namespace dtrain::collectives {
namespace {

int SendBuffer(int fd) {
  int bytes = 0;
  socklen_t length = sizeof bytes;
  EXPECT_EQ(::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &length), 0);
  return bytes;
}

int ProcValue(const char* path, int field) {
  std::ifstream in(path);
  int value = 0;
  for (int i = 0; i <= field; ++i) in >> value;
  return value;
}

// Where WidenSendBuffers takes a buffer: autotuning's maximum, or without CAP_NET_ADMIN at most
// net.core.wmem_max (the kernel reports twice what it keeps).
int WidenedAtLeast() {
  return std::min(ProcValue("/proc/sys/net/ipv4/tcp_wmem", 2),
                  ProcValue("/proc/sys/net/core/wmem_max", 0));
}

// A TCP connection over loopback: {client end, server end}.
std::pair<int, int> LoopbackConnection() {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  EXPECT_EQ(::listen(listener, 1), 0);
  EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), length), 0);
  const int server = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  return {client, server};
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
  const std::vector<PairSocket> sockets = NewTcpSockets(before);
  // One connection between the two ranks: both of its ends are in this process.
  ASSERT_EQ(sockets.size(), 2u);
  for (const PairSocket& s : sockets) EXPECT_EQ(before.count(s.fd), 0u);

  // A halving-doubling allreduce of 4 KB: gloo sets each pair's SO_SNDBUF to its message size.
  std::vector<float> data[2] = {std::vector<float>(1024, 1.0f), std::vector<float>(1024, 2.0f)};
  std::thread second(
      [&] { gloo::AllreduceHalvingDoubling<float>(context[1], {data[1].data()}, 1024).run(); });
  gloo::AllreduceHalvingDoubling<float>(context[0], {data[0].data()}, 1024).run();
  second.join();
  EXPECT_EQ(data[0][0], 3.0f);
  EXPECT_EQ(data[1][1023], 3.0f);
  const int least = WidenedAtLeast();
  ASSERT_GT(least, 16384);
  for (const PairSocket& s : sockets) {
    EXPECT_LT(SendBuffer(s.fd), least) << "gloo left SO_SNDBUF alone";
  }
  WidenSendBuffers(sockets);
  for (const PairSocket& s : sockets) EXPECT_GE(SendBuffer(s.fd), least);
}

TEST(PairSockets, ShuttingDownEndsThePeersReadsAndSparesASocketThatTookTheNumberSince) {
  const auto before = OpenSockets();
  const auto [client, server] = LoopbackConnection();
  const std::vector<PairSocket> found = NewTcpSockets(before);
  ASSERT_EQ(found.size(), 2u);
  ShutDown({found[0]});
  char byte = 0;
  const int other = found[0].fd == client ? server : client;
  EXPECT_EQ(::recv(other, &byte, 1, 0), 0) << "the peer should read the end of the stream";
  ::close(client);
  ::close(server);

  // The numbers are free again; a new connection takes them.
  const auto [client2, server2] = LoopbackConnection();
  ASSERT_TRUE((client2 == client && server2 == server)) << "the kernel gave other numbers";
  WidenSendBuffers(found);  // not theirs: left alone
  ShutDown(found);
  EXPECT_EQ(::send(client2, "x", 1, MSG_NOSIGNAL), 1);
  EXPECT_EQ(::recv(server2, &byte, 1, 0), 1);
  EXPECT_EQ(byte, 'x');
  ::close(client2);
  ::close(server2);
}

TEST(PairSockets, ASocketThatIsGoneIsSkipped) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const auto before = OpenSockets();
  EXPECT_EQ(before.count(fds[0]), 1u);
  ::close(fds[0]);
  ::close(fds[1]);
  WidenSendBuffers({{fds[0], 1}, {fds[1], 1}});  // no crash, nothing to do
  // Unix sockets are not TCP: never counted as a pair's.
  int more[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, more), 0);
  EXPECT_TRUE(NewTcpSockets(before).empty());
  ::close(more[0]);
  ::close(more[1]);
}

}  // namespace
}  // namespace dtrain::collectives
