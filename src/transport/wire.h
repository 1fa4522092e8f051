// The wire format of a message: a 64-byte header, then `meta_len` bytes of meta, then `body_len`
// bytes of body. Integers are little-endian.
//
//   0  u32 magic "DTRN"  4 u16 version     6 u16 command     8 u32 flags
//  12  i32 sender       16 i32 recipient  20 u32 meta_len   24 u64 request_id
//  32  u64 key          40 u32 part       44 u8 dtype        45 u8 compression  46 i16 priority
//  48  u64 body_len     56 f32 threshold  60 u32 elements
//
// Compression (a compressed push only, else zero): the body holds `elements` float32 values
// packed as compression/codec.h says, and must be exactly that long.
//
// Everything read off the network is untrusted: DecodeHeader checks every field and every length
// against its limit before anyone allocates or reads a byte more.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/message.h"

namespace dtrain::transport {

constexpr uint32_t kWireMagic = 0x4e525444;  // "DTRN" read as little-endian u32
constexpr uint16_t kWireVersion = 3;         // 2: before the priority
constexpr size_t kWireHeaderSize = 64;
constexpr size_t kMaxMetaBytes = size_t{1} << 20;

using WireHeader = std::array<char, kWireHeaderSize>;

struct Limits {
  size_t max_body_bytes = size_t{1} << 32;
};

// The decoded header plus the lengths of what follows it.
struct Frame {
  Header header;
  uint32_t meta_len = 0;
  uint64_t body_len = 0;
};

WireHeader EncodeHeader(const Header& header, size_t meta_len, size_t body_len);

// Throws ProtocolError naming the offending field.
Frame DecodeHeader(const char* bytes, size_t size, const Limits& limits);

// Whole message to one contiguous buffer and back: used by tests, the fuzzer and the in-memory
// transport. DecodeMessage throws ProtocolError on anything malformed or truncated.
std::string EncodeMessage(const Message& msg);
Message DecodeMessage(const char* bytes, size_t size, const Limits& limits);

}  // namespace dtrain::transport
