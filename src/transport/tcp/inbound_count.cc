#include "transport/tcp/inbound_count.h"

namespace dtrain::transport {

AckSchedule::Decision AckSchedule::OnMessage(size_t body_bytes) {
  Decision decision;
  unacked_bytes_ += body_bytes;
  if (unacked_bytes_ >= kBytes) {
    unacked_bytes_ = 0;
    decision.now = true;
  }
  if (!armed_) {
    armed_ = true;
    decision.arm_timer = true;
  }
  return decision;
}

void AckSchedule::OnTimer() {
  armed_ = false;
  unacked_bytes_ = 0;
}

}  // namespace dtrain::transport
