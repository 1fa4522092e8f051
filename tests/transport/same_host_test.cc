// The same-host path's check of who is at the other end of a connection (same_host.h): the pid a
// hello names must hold the connecting socket, by the kernel's account, before its memory is read.
#include "transport/tcp/same_host.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dtrain::transport::same_host {
namespace {

// A listening socket on 127.0.0.1 and the connections accepted on it.
struct Listener {
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~Listener() { ::close(fd); }

  // Accepts one connection and says what its two ends are.
  ConnectionEnds Accept(int* accepted) {
    sockaddr_in peer{}, ours{};
    socklen_t len = sizeof peer;
    *accepted = ::accept(fd, reinterpret_cast<sockaddr*>(&peer), &len);
    len = sizeof ours;
    ::getsockname(*accepted, reinterpret_cast<sockaddr*>(&ours), &len);
    return {ntohl(peer.sin_addr.s_addr), ntohs(peer.sin_port), ntohl(ours.sin_addr.s_addr),
            ntohs(ours.sin_port)};
  }

  int fd = -1;
  uint16_t port = 0;
};

int ConnectTo(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ? fd : -1;
}

TEST(SameHost, TheProcessThatConnectedIsBelievedAndProbed) {
  Listener listener;
  const int client = ConnectTo(listener.port);
  ASSERT_GE(client, 0);
  int accepted = -1;
  const ConnectionEnds ends = listener.Accept(&accepted);
  EXPECT_TRUE(HoldsConnection(::getpid(), ends));
  EXPECT_EQ(ProbeHello(EncodeHello(), ends), ::getpid());
  ::close(client);
  ::close(accepted);
}

// A process that connects and names another process of the same user (here: this one, whose hello
// it copied, probe and all) gets no same-host path: the kernel says the connection is the child's.
TEST(SameHost, AHelloNamingAnotherProcessIsNotBelieved) {
  Listener listener;
  const pid_t child = ::fork();
  if (child == 0) {
    const int fd = ConnectTo(listener.port);
    ::pause();  // holds the connection until killed
    ::_exit(fd >= 0 ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  int accepted = -1;
  const ConnectionEnds ends = listener.Accept(&accepted);
  EXPECT_TRUE(HoldsConnection(child, ends));
  EXPECT_FALSE(HoldsConnection(::getpid(), ends));
  EXPECT_EQ(ProbeHello(EncodeHello(), ends), 0);  // names us, but the connection is the child's
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(accepted);
}

TEST(SameHost, AConnectionThatDoesNotExistIsNobodys) {
  ConnectionEnds nowhere{0x7f000001, 1, 0x7f000001, 2};
  EXPECT_FALSE(HoldsConnection(::getpid(), nowhere));
  EXPECT_EQ(ProbeHello(EncodeHello(), nowhere), 0);
}

}  // namespace
}  // namespace dtrain::transport::same_host
