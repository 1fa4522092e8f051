// The gloo rendezvous's protocol, as both sides speak it: rank 0's RendezvousServer
// (rendezvous_server.h) and every rank's RendezvousClient (rendezvous_client.h). Private to those
// two files.
//
// Wire format, both directions: u32 body length, then the body: u8 type/status and fields, strings
// as u32 length + bytes, all little-endian (collectives/byte_codec.h). Everything read off the
// socket is bounds-checked: a malformed request closes that connection (the server keeps serving
// the others), a malformed reply is a ProtocolError.
//
// A connection starts with kHello (i32 rank, and with a job secret the client's nonce); with a
// secret the server answers its nonce and proof, and the client's kProve (its proof, which binds
// its rank) must check out before any other request counts (auth/handshake.h). A refusal is
// kRefused and a reason, after which the server closes the connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "auth/handshake.h"
#include "collectives/byte_codec.h"

namespace dtrain::collectives::rendezvous_wire {

enum Request : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kCheck = 4,
  kLost = 5,
  kGoodbye = 6,
  kProve = 7,
  kHeartbeat = 8,
};
enum Status : uint8_t { kOk = 0, kMissing = 1, kRefused = 2 };
constexpr size_t kMaxProofChars = 64;
// The labels of the store's challenge-response (auth/handshake.h): rank 0 accepts, ranks connect.
constexpr auth::HandshakeLabels kLabels{"dtrain-rendezvous-server", "dtrain-rendezvous-client"};

// Limits on what a peer may make us allocate or store. Gloo's entries are a few hundred bytes per
// rank; these leave ample room and still stop a stray client from exhausting rank 0's memory.
constexpr uint32_t kMaxBody = 16u << 20;
constexpr size_t kMaxKey = 4096;
// How many of the keys a kCheck finds missing its reply names (it counts them all).
constexpr size_t kMissingKeysReported = 8;
// How much of a lost rank's reason a kLost reply carries.
constexpr size_t kMaxReasonChars = 512;

// `body` with its u32 length in front.
inline std::vector<char> Frame(ByteWriter& body) {
  ByteWriter frame;
  frame.U32(static_cast<uint32_t>(body.size()));
  frame.Raw(body.bytes().data(), body.size());
  return std::move(frame.bytes());
}

}  // namespace dtrain::collectives::rendezvous_wire
