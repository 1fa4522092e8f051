// The accepting side's bookkeeping for resending (PS_RESEND): what each logical stream from a peer
// has delivered, kept across the connections that carry it, and when that count is written back
// to the sender (which holds every message until it learns it arrived).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "dtrain/common/deadline.h"

namespace dtrain::transport {

// One logical stream from a peer as the accepting side counts it: how many of its messages have
// been handed to the node, and which connection carries it now. A connection that no longer
// carries it hands over nothing more, so a message resent on the new connection is never
// delivered twice.
struct Inbound {
  std::mutex mutex;
  uint64_t delivered = 0;
  const void* carrier = nullptr;  // the InStream reading it now
};

// When a connection writes its stream's count back on the acknowledgement channel. Each such
// acknowledgement wakes both sides (acknowledging every 1 MB message at once cost 80% of a 1 MB
// pushpull), so they are rare: kDelay after the first message not yet acknowledged, or at once
// when kBytes of bodies arrived since (bounding what the sender holds). Replies going back carry
// the count sooner where there are any (OutStream::reverse_delivered). Single-threaded: used on
// the connection's strand.
class AckSchedule {
 public:
  static constexpr Duration kDelay{20};
  static constexpr size_t kBytes = size_t{64} << 20;

  struct Decision {
    bool now = false;        // write the count now
    bool arm_timer = false;  // start the kDelay timer (none is running)
  };

  // A message with `body_bytes` of body was counted.
  Decision OnMessage(size_t body_bytes);
  // The timer fired (or was cancelled): the count is written now if the stream still runs.
  void OnTimer();

 private:
  bool armed_ = false;
  size_t unacked_bytes_ = 0;
};

}  // namespace dtrain::transport
