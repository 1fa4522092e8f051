// ByteWriter / ByteReader: little-endian fields in a byte buffer, for the rendezvous protocol and
// the engine's negotiation messages. The reader never reads past its span: a short or oversized
// field is a ProtocolError that says what was being read (input from other processes is
// untrusted).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain::collectives {

class ByteWriter {
 public:
  void U8(uint8_t v) { bytes_.push_back(v); }
  void U16(uint16_t v) { Raw(&v, sizeof(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void I32(int32_t v) { Raw(&v, sizeof(v)); }
  void I64(int64_t v) { Raw(&v, sizeof(v)); }
  void String(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Raw(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  std::vector<char>& bytes() { return bytes_; }
  size_t size() const { return bytes_.size(); }

 private:
  std::vector<char> bytes_;  // x86-64 and aarch64 are little-endian: fields are copied as they are
};

class ByteReader {
 public:
  // `what` names the input in errors ("reply from the rendezvous host 10.0.0.1:9000").
  ByteReader(std::span<const char> bytes, std::string what)
      : bytes_(bytes), what_(std::move(what)) {}

  uint8_t U8(const char* field) { return Fixed<uint8_t>(field); }
  uint16_t U16(const char* field) { return Fixed<uint16_t>(field); }
  uint32_t U32(const char* field) { return Fixed<uint32_t>(field); }
  int32_t I32(const char* field) { return Fixed<int32_t>(field); }
  int64_t I64(const char* field) { return Fixed<int64_t>(field); }

  // A u32-length-prefixed string of at most `max_length` bytes.
  std::string String(const char* field, size_t max_length) {
    const uint32_t n = U32(field);
    if (n > max_length)
      Fail(field, "length " + std::to_string(n) + " exceeds " + std::to_string(max_length));
    return Chars(field, n);
  }
  std::string Chars(const char* field, size_t n) {
    Need(field, n);
    std::string s(bytes_.data() + offset_, n);
    offset_ += n;
    return s;
  }

  size_t left() const { return bytes_.size() - offset_; }
  bool done() const { return offset_ == bytes_.size(); }
  void ExpectEnd() {
    if (!done()) Fail("end", std::to_string(left()) + " unexpected trailing bytes");
  }
  [[noreturn]] void Fail(const char* field, const std::string& why) const {
    throw ProtocolError("malformed " + what_ + ": " + field + ": " + why);
  }

 private:
  template <typename T>
  T Fixed(const char* field) {
    Need(field, sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return v;
  }
  void Need(const char* field, size_t n) const {
    if (n > left()) {
      Fail(field, "needs " + std::to_string(n) + " bytes, " + std::to_string(left()) + " left");
    }
  }

  std::span<const char> bytes_;
  std::string what_;
  size_t offset_ = 0;
};

}  // namespace dtrain::collectives
