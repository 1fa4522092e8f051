// Messages: what nodes of a job say to each other.
//
// A message is a fixed header (command, sender, request id, key and part of the value it concerns,
// element type), an optional `meta` text (JSON for control messages, an error text for failed
// requests) and an optional binary `body` (the values). On the wire the header is 64 bytes in a
// versioned layout, see wire.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "compression/codec.h"
#include "dtrain/common/dtype.h"

namespace dtrain::transport {

using NodeId = int32_t;
constexpr NodeId kNoNode = -1;
constexpr NodeId kSchedulerId = 0;

enum class Command : uint16_t {
  // Connection management.
  kHello = 1,  // first message on every connection: who is sending
  kBye = 2,    // the sender closes this connection on purpose; EOF after it is not a failure
  // PS_RESEND: request_id = how many messages the sender has received on the stream that comes
  // back the other way (tcp_transport.h); written just before a message, never delivered.
  kAck = 3,
  // Job control, between nodes and the scheduler.
  kRegister = 10,     // node -> scheduler: role, address (meta: JSON)
  kNodeTable = 11,    // scheduler -> node: ids, roles, ranks, addresses of every node (meta: JSON)
  kReady = 12,        // node -> scheduler: connected to the peers it needs
  kStart = 13,        // scheduler -> node: every node is ready
  kBarrier = 14,      // node -> scheduler: arrived at a barrier (meta: group)
  kBarrierDone = 15,  // scheduler -> node: everyone in the group arrived
  kHeartbeat = 16,    // node <-> scheduler: still alive
  kNodeFailed = 17,   // scheduler -> node: a node died or was cut off (meta: JSON naming it)
  kFinish = 18,       // worker -> scheduler: this worker is done with the job
  kTerminate = 19,    // scheduler -> node: the job is over, exit cleanly
  kAbort = 20,        // scheduler -> node: the job failed and must stop (meta: reason)
  // Replacing a lost member (DTRAIN_RESTART_WAIT_MS, scheduler.h).
  kRejoin = 21,         // scheduler -> replacement, before its node table: barriers completed
  kNodeReplaced = 22,   // scheduler -> peers of a replacement: who it is (meta: one-node table)
  kReplacedReady = 23,  // peer -> scheduler: connected to the replacement (meta: its id)
  kReplacementStarted = 24,  // scheduler -> workers: a server's replacement started (meta: id)
  // Data, between workers and servers.
  kInit = 32,          // create a slot (meta: JSON with shape/offset); body: initial value
  kPush = 33,          // body: this worker's contribution to the slot
  kPull = 34,          // ask for the slot's value
  kPushPull = 35,      // push, then the value once the push is applied
  kSetOptimizer = 36,  // meta: JSON optimizer description
  kCommand = 37,       // meta: JSON for server-side commands; body: opaque bytes (optimizer state)
  // Row-sparse values of a matrix's slot (ps/row_sparse_body.h: ids, then rows).
  kPushRows = 38,  // body: row ids and this worker's contribution to those rows
  kPullRows = 39,  // body: row ids; the reply: those rows of the slot's value
};

bool IsKnownCommand(uint16_t raw);
// The requests for a slot's value between workers and servers (push, pull, pushpull, and their
// row forms), and their replies.
bool IsValueCommand(Command c);
std::string_view CommandName(Command c);

// Header flags.
constexpr uint32_t kFlagResponse = 1u << 0;  // this answers request `request_id`
constexpr uint32_t kFlagError = 1u << 1;     // the request failed; meta holds the reason
// The body is not on the wire: a 16-byte descriptor (sender address, token) follows the meta and
// the receiver copies the body straight out of the sender's memory (same-host fast path of the TCP
// transport, see same_host.h). Only the TCP transport sets or accepts it.
constexpr uint32_t kFlagRemoteBody = 1u << 2;
constexpr uint32_t kKnownFlags = kFlagResponse | kFlagError | kFlagRemoteBody;
// Set by the receiving transport, never on the wire (the decoder refuses it there): the body was
// longer than the receiver's BodyLimit allowed for this message, so it was read and dropped without
// being stored; the message arrives without it and its meta says why.
constexpr uint32_t kFlagBodyRefused = 1u << 3;

struct Header {
  Command command = Command::kHello;
  uint32_t flags = 0;
  NodeId sender = kNoNode;
  NodeId recipient = kNoNode;
  uint64_t request_id = 0;
  uint64_t key = 0;
  uint32_t part = 0;
  DType dtype = DType::kFloat32;
  // A compressed push (compression/codec.h): the body holds `elements` float32 values packed
  // with `compression` at `threshold`. kNone for every other message.
  Compression compression = Compression::kNone;
  float threshold = 0;
  uint32_t elements = 0;
  // The sender's order of urgency: of the messages waiting to be written on a connection, the
  // highest priority goes first (equal ones in the order they were sent; which may overtake which:
  // OutStream::PlaceInLine). The KVStore passes MXNet's push/pull `priority` (-layer index: layers
  // nearest the input first), clamped to 16 bits; a server's reply keeps its request's header,
  // and so its priority: a server writes the values its workers need first first.
  int16_t priority = 0;

  bool is_response() const { return (flags & kFlagResponse) != 0; }
  bool is_error() const { return (flags & kFlagError) != 0; }
};

// Bytes of a message body. `owner` keeps `data` alive (a pooled buffer, an Array's memory, ...).
struct Body {
  std::shared_ptr<void> owner;
  char* data = nullptr;
  size_t size = 0;

  bool empty() const { return size == 0; }
};

struct Message {
  Header header;
  std::string meta;
  Body body;
};

// "push key=3 part=0 from 5 to 1 req=77 body=4096B" for PS_VERBOSE=2 and error messages.
std::string Describe(const Message& msg);

}  // namespace dtrain::transport
