// What the kernel gives two processes over loopback TCP: the bound that dtrain's 1x1 pushpull
// over plain TCP is held to, measured beside it (bench/loopback_stability.sh).
//
// One process sends rounds of --bytes to a second, which writes each piece back as soon as it has
// read it (at most --piece bytes), while the first reads the whole round back: both directions
// busy at once, as in a pipelined pushpull, but with no protocol, no merge and no copy of our own.
// Prints one JSON line: {"probe":"loopback_echo","bytes":..,"median_ms":..,"p90_ms":..,...}.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include "percentile.h"

namespace {

using dtrain::bench::Percentile;

using Clock = std::chrono::steady_clock;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "loopback_echo: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// False when the peer closed the connection.
bool ReadAll(int fd, char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::read(fd, data, size);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void Configure(int fd, const std::string& congestion) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!congestion.empty() && ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion.data(),
                                          static_cast<socklen_t>(congestion.size())) != 0) {
    Fail("TCP_CONGESTION " + congestion);
  }
}

// The echoing process: writes back what it reads, piece by piece, until the other end closes.
[[noreturn]] void Echo(const sockaddr_in& at, size_t piece, const std::string& congestion) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) != 0) {
    Fail("connect");
  }
  Configure(fd, congestion);
  std::vector<char> buffer(piece);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n <= 0 || !WriteAll(fd, buffer.data(), static_cast<size_t>(n))) ::_exit(0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loopback TCP echo: the kernel's bound for a pipelined pushpull between processes"};
  size_t bytes = 16 << 20;
  size_t piece = 256 << 10;
  double seconds = 1.0;
  std::string congestion = "cubic";
  app.add_option("--bytes", bytes, "bytes a round sends (and gets back)");
  app.add_option("--piece", piece, "the most the echoing process reads before writing back");
  app.add_option("--seconds", seconds, "how long to run rounds");
  app.add_option("--congestion", congestion,
                 "TCP congestion control (dtrain's default within a host); empty: the kernel's");
  CLI11_PARSE(app, argc, argv);
  if (bytes == 0 || piece == 0) {
    std::fprintf(stderr, "loopback_echo: --bytes and --piece must be positive\n");
    return 2;
  }

  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof at;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    Fail("listen on loopback");
  }
  const pid_t echo = ::fork();
  if (echo < 0) Fail("fork");
  if (echo == 0) Echo(at, piece, congestion);
  const int fd = ::accept(listener, nullptr, nullptr);
  if (fd < 0) Fail("accept");
  Configure(fd, congestion);

  // A writer thread sends each round while this thread reads it back.
  std::counting_semaphore<> round_asked{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    const std::vector<char> out(bytes, 1);
    for (;;) {
      round_asked.acquire();
      if (stop.load() || !WriteAll(fd, out.data(), out.size())) return;
    }
  });
  std::vector<char> in(bytes);
  std::vector<double> ms;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  bool broken = false;
  while (!broken && (Clock::now() < end || ms.size() < 10)) {
    const auto start = Clock::now();
    round_asked.release();
    broken = !ReadAll(fd, in.data(), in.size());
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  stop.store(true);
  round_asked.release();
  ::shutdown(fd, SHUT_RDWR);  // ends the writer's blocked write, if any, and the echo
  writer.join();
  ::close(fd);
  ::kill(echo, SIGKILL);
  ::waitpid(echo, nullptr, 0);
  if (broken) {
    std::fprintf(stderr, "loopback_echo: the echoing process closed the connection\n");
    return 1;
  }
  const nlohmann::json line = {{"probe", "loopback_echo"},
                               {"bytes", bytes},
                               {"piece", piece},
                               {"congestion", congestion.empty() ? "kernel default" : congestion},
                               {"iterations", ms.size()},
                               {"median_ms", Percentile(ms, 0.5)},
                               {"p90_ms", Percentile(ms, 0.9)},
                               {"min_ms", Percentile(ms, 0.0)}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}
