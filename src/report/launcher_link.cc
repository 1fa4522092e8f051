#include "report/launcher_link.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dtrain/common/error.h"

namespace dtrain::report {
namespace {

// "2.5 s", for messages.
std::string SecondsText(Duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", Seconds(d));
  return text;
}

}  // namespace

LauncherLink::LauncherLink(const std::string& address, const std::string& token,
                           nlohmann::json identity, Duration timeout)
    : address_(address) {
  const Deadline deadline(timeout);
  const auto colon = address.rfind(':');
  if (colon == std::string::npos)
    throw PeerError("launcher address " + address + " is not host:port");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(), &hints,
                    &result) != 0 ||
      result == nullptr) {
    throw PeerError("cannot resolve the launcher's address " + address);
  }
  fd_ = ::socket(result->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int rc = fd_ < 0 ? -1 : ::connect(fd_, result->ai_addr, result->ai_addrlen);
  const int connect_errno = errno;
  ::freeaddrinfo(result);
  if (fd_ < 0 || (rc != 0 && connect_errno != EINPROGRESS)) {
    const std::string why = std::strerror(connect_errno);
    if (fd_ >= 0) ::close(fd_);
    throw PeerError("cannot connect to the launcher at " + address + ": " + why);
  }
  if (!WaitFor(POLLOUT, deadline)) {
    ::close(fd_);
    throw TimeoutError("the launcher at " + address + " did not answer within " +
                       SecondsText(timeout));
  }
  int error = 0;
  socklen_t len = sizeof(error);
  ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) {
    ::close(fd_);
    throw PeerError("cannot connect to the launcher at " + address + ": " + std::strerror(error));
  }
  identity["kind"] = "hello";
  identity["token"] = token;
  try {
    Send(identity, deadline.left());
    hello_reply_ = Receive(deadline.left(), 4096);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

LauncherLink::~LauncherLink() {
  if (fd_ >= 0) ::close(fd_);
}

bool LauncherLink::WaitFor(short events, const Deadline& deadline) {
  while (true) {
    pollfd p{fd_, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(deadline.left().count()));
    if (rc < 0 && errno == EINTR) continue;
    return rc == 1 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
  }
}

void LauncherLink::Write(const std::string& data, Duration timeout) {
  const Deadline deadline(timeout);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFor(POLLOUT, deadline)) {
        throw TimeoutError("the launcher at " + address_ + " read nothing for " +
                           SecondsText(timeout));
      }
    } else {
      throw PeerError("lost the connection to the launcher at " + address_);
    }
  }
}

nlohmann::json LauncherLink::Receive(Duration timeout, size_t max_bytes) {
  const Deadline deadline(timeout);
  size_t newline;
  while ((newline = pending_.find('\n')) == std::string::npos) {
    if (pending_.size() > max_bytes) {
      throw ProtocolError("the launcher at " + address_ + " sent a line over " +
                          std::to_string(max_bytes) + " bytes");
    }
    if (!WaitFor(POLLIN, deadline)) {
      throw TimeoutError("no answer from the launcher at " + address_ + " within " +
                         SecondsText(timeout));
    }
    char buffer[4096];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      throw PeerError("the launcher at " + address_ +
                      " closed the connection (a wrong DTRAIN_REPORT_TOKEN, or the job ended)");
    }
    pending_.append(buffer, static_cast<size_t>(n));
  }
  if (newline > max_bytes) {
    throw ProtocolError("the launcher at " + address_ + " sent a line over " +
                        std::to_string(max_bytes) + " bytes");
  }
  auto line = nlohmann::json::parse(pending_.begin(), pending_.begin() + newline, nullptr, false);
  pending_.erase(0, newline + 1);
  if (!line.is_object()) {
    throw ProtocolError("the launcher at " + address_ + " sent a line that is not a JSON object");
  }
  return line;
}

}  // namespace dtrain::report
