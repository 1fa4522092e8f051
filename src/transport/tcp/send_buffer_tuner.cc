#include "transport/tcp/send_buffer_tuner.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <fstream>

#include "common/logging.h"

namespace dtrain::transport {

size_t NextSendBuffer(size_t current, double rate, double min_rtt_us, const SendBufferLimits& lim) {
  if (rate <= 0 || min_rtt_us <= 0) return 0;  // nothing measured yet
  // A long round trip gets as much again, so that the buffer still doubles per look there.
  const double room = rate * (min_rtt_us + std::max(lim.budget_us, min_rtt_us)) / 1e6;
  const double wanted = std::clamp(room, static_cast<double>(lim.floor),
                                   static_cast<double>(std::max(lim.ceiling, lim.floor)));
  const auto target = static_cast<size_t>(wanted);
  if (current == 0) return target < lim.ceiling / 2 ? target : 0;
  const double moved = std::abs(wanted - static_cast<double>(current)) / current;
  return moved > 0.25 ? target : 0;
}

size_t SendBufferCeiling() {
  static const size_t ceiling = [] {
    size_t wmem_max = 0;
    std::ifstream("/proc/sys/net/core/wmem_max") >> wmem_max;  // 0 where unreadable or garbled
    return 2 * (wmem_max > 0 ? wmem_max : 212992);             // else Linux's default
  }();
  return ceiling;
}

SendBufferTuner::SendBufferTuner(int fd) : fd_(fd) {
  limits_.ceiling = SendBufferCeiling();
  Resize(limits_.floor, 0, 0);
}

bool SetSendBuffer(int fd, size_t bytes) {
  const int half = static_cast<int>(std::min<size_t>(bytes / 2, INT32_MAX));
  return ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &half, sizeof half) == 0;
}

void SendBufferTuner::Resize(size_t bytes, double rate, uint32_t min_rtt_us) {
  if (!SetSendBuffer(fd_, bytes)) return;
  DTRAIN_LOG(kConnections) << "send buffer " << bytes << " bytes (sending "
                           << static_cast<uint64_t>(rate) << " B/s while busy, smallest round trip "
                           << min_rtt_us << " us)";
  current_ = bytes;
}

void SendBufferTuner::AfterWrite(size_t bytes) {
  since_check_ += bytes;
  if (since_check_ < kCheckBytes) return;
  since_check_ = 0;
  tcp_info info{};
  socklen_t length = sizeof info;
  if (::getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
      length < offsetof(tcp_info, tcpi_busy_time) + sizeof info.tcpi_busy_time) {
    return;  // an old kernel without these counts: the buffer stays as it is
  }
  if (!started_ || info.tcpi_busy_time < busy_ || info.tcpi_bytes_acked < acked_) {
    started_ = true;
    acked_ = info.tcpi_bytes_acked;
    busy_ = info.tcpi_busy_time;
    return;
  }
  const uint64_t busy_us = info.tcpi_busy_time - busy_;
  if (busy_us < kMinBusyUs) return;  // too little to measure: wait for more
  const double rate = static_cast<double>(info.tcpi_bytes_acked - acked_) * 1e6 / busy_us;
  acked_ = info.tcpi_bytes_acked;
  busy_ = info.tcpi_busy_time;
  const size_t next =
      NextSendBuffer(current_, rate, static_cast<double>(info.tcpi_min_rtt), limits_);
  if (next != 0) Resize(next, rate, info.tcpi_min_rtt);
}

}  // namespace dtrain::transport
