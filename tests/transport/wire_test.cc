// The wire codec: every command round-trips, and every malformed input is a ProtocolError (never a
// crash, an over-read or another exception), since DecodeHeader/DecodeMessage see untrusted bytes.
#include "transport/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype_checks.h"
#include "dtrain/common/error.h"

namespace dtrain::transport {
namespace {

constexpr Command kAllCommands[] = {
    Command::kHello,     Command::kBye,          Command::kRegister, Command::kNodeTable,
    Command::kReady,     Command::kStart,        Command::kBarrier,  Command::kBarrierDone,
    Command::kHeartbeat, Command::kNodeFailed,   Command::kFinish,   Command::kTerminate,
    Command::kAbort,     Command::kInit,         Command::kPush,     Command::kPull,
    Command::kPushPull,  Command::kSetOptimizer, Command::kCommand,
};

bool CarriesValues(Command c) {
  return c == Command::kInit || c == Command::kPush || c == Command::kPull ||
         c == Command::kPushPull || c == Command::kCommand;
}

// A message with every header field set to something distinctive; a body if the command has one.
Message MakeMessage(Command command, DType dtype = DType::kFloat32, size_t elements = 6) {
  Message msg;
  msg.header.command = command;
  msg.header.flags = kFlagResponse;
  msg.header.sender = 9;
  msg.header.recipient = 1;
  msg.header.request_id = 0x0102030405060708ull;
  msg.header.key = 0xfedcba9876543210ull;
  msg.header.part = 77;
  msg.header.dtype = dtype;
  msg.meta = std::string("{\"cmd\":\"") + std::string(CommandName(command)) + "\"}";
  if (CarriesValues(command)) {
    const size_t bytes = elements * DTypeSize(dtype);
    auto buffer = std::shared_ptr<char[]>(new char[bytes]);
    for (size_t i = 0; i < bytes; ++i) buffer[i] = static_cast<char>(i * 7 + 3);
    msg.body.data = buffer.get();
    msg.body.size = bytes;
    msg.body.owner = std::shared_ptr<void>(buffer, buffer.get());
  }
  return msg;
}

// Decodes from a heap block of exactly `bytes.size()` bytes, so that AddressSanitizer catches a
// read past the end that a std::string's spare capacity would hide.
Message DecodeExact(const std::string& bytes, const Limits& limits = {}) {
  std::unique_ptr<char[]> exact(new char[bytes.size() == 0 ? 1 : bytes.size()]);
  std::memcpy(exact.get(), bytes.data(), bytes.size());
  return DecodeMessage(exact.get(), bytes.size(), limits);
}

template <typename T>
void Poke(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// Expects a ProtocolError whose message contains `needle`.
void ExpectRejected(const std::string& bytes, const std::string& needle,
                    const Limits& limits = {}) {
  try {
    DecodeExact(bytes, limits);
    ADD_FAILURE() << "decoded a message that should be rejected (" << needle << ")";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

TEST(WireTest, HeaderIs64Bytes) {
  const WireHeader h = EncodeHeader(Header{}, 0, 0);
  EXPECT_EQ(h.size(), 64u);
  EXPECT_EQ(std::memcmp(h.data(), "DTRN", 4), 0);
}

TEST(WireTest, EveryCommandRoundTrips) {
  for (Command command : kAllCommands) {
    SCOPED_TRACE(std::string(CommandName(command)));
    EXPECT_TRUE(IsKnownCommand(static_cast<uint16_t>(command)));
    EXPECT_NE(CommandName(command), "unknown");
    const Message msg = MakeMessage(command);
    const std::string bytes = EncodeMessage(msg);
    ASSERT_EQ(bytes.size(), kWireHeaderSize + msg.meta.size() + msg.body.size);

    const Message back = DecodeExact(bytes);
    EXPECT_EQ(back.header.command, command);
    EXPECT_EQ(back.header.flags, msg.header.flags);
    EXPECT_EQ(back.header.sender, msg.header.sender);
    EXPECT_EQ(back.header.recipient, msg.header.recipient);
    EXPECT_EQ(back.header.request_id, msg.header.request_id);
    EXPECT_EQ(back.header.key, msg.header.key);
    EXPECT_EQ(back.header.part, msg.header.part);
    EXPECT_EQ(back.header.dtype, msg.header.dtype);
    EXPECT_EQ(back.meta, msg.meta);
    ASSERT_EQ(back.body.size, msg.body.size);
    if (msg.body.size > 0) {
      EXPECT_NE(back.body.data, msg.body.data);  // a copy, not a view of the input
      EXPECT_EQ(std::memcmp(back.body.data, msg.body.data, msg.body.size), 0);
      EXPECT_NE(back.body.owner, nullptr);
    }
    EXPECT_EQ(EncodeMessage(back), bytes);
  }
}

TEST(WireTest, EveryDTypeAndFlagRoundTrips) {
  for (int t = 0; t < kNumDTypes; ++t) {
    for (uint32_t flags : {0u, kFlagResponse, kFlagError, kFlagResponse | kFlagError}) {
      Message msg = MakeMessage(Command::kPushPull, static_cast<DType>(t), 5);
      msg.header.flags = flags;
      msg.header.sender = kNoNode;
      msg.header.recipient = kNoNode;
      const Message back = DecodeExact(EncodeMessage(msg));
      EXPECT_EQ(back.header.dtype, static_cast<DType>(t));
      EXPECT_EQ(back.header.flags, flags);
      EXPECT_EQ(back.header.is_response(), (flags & kFlagResponse) != 0);
      EXPECT_EQ(back.header.is_error(), (flags & kFlagError) != 0);
      EXPECT_EQ(back.header.sender, kNoNode);
      EXPECT_EQ(back.body.size, 5 * DTypeSize(static_cast<DType>(t)));
    }
  }
}

// A request's priority travels in bytes 46-47, every 16-bit value, and decodes as it was sent.
TEST(WireTest, PriorityRoundTrips) {
  for (int16_t priority :
       {int16_t{0}, int16_t{-1}, int16_t{-160}, int16_t{7}, int16_t{-32768}, int16_t{32767}}) {
    SCOPED_TRACE(priority);
    Message msg = MakeMessage(Command::kPushPull, DType::kFloat32, 5);
    msg.header.priority = priority;
    const std::string bytes = EncodeMessage(msg);
    int16_t on_wire = 0;
    std::memcpy(&on_wire, bytes.data() + 46, sizeof on_wire);
    EXPECT_EQ(on_wire, priority);
    const Message back = DecodeExact(bytes);
    EXPECT_EQ(back.header.priority, priority);
    EXPECT_EQ(EncodeMessage(back), bytes);
  }
}

TEST(WireTest, EmptyMetaAndBody) {
  Message msg;
  msg.header.command = Command::kPull;
  const std::string bytes = EncodeMessage(msg);
  EXPECT_EQ(bytes.size(), kWireHeaderSize);
  const Message back = DecodeExact(bytes);
  EXPECT_TRUE(back.meta.empty());
  EXPECT_TRUE(back.body.empty());
  EXPECT_EQ(back.body.data, nullptr);
}

TEST(WireTest, DecodeHeaderReportsLengths) {
  const Message msg = MakeMessage(Command::kPush);
  const std::string bytes = EncodeMessage(msg);
  const Frame f = DecodeHeader(bytes.data(), kWireHeaderSize, Limits{});
  EXPECT_EQ(f.meta_len, msg.meta.size());
  EXPECT_EQ(f.body_len, msg.body.size);
  EXPECT_EQ(f.header.key, msg.header.key);
}

TEST(WireTest, RejectsBadMagic) {
  std::string bytes = EncodeMessage(MakeMessage(Command::kHello));
  bytes[0] = 'X';
  ExpectRejected(bytes, "magic");
}

TEST(WireTest, RejectsOtherVersionsNamingTheVersion) {
  for (uint16_t version : {0, 1, 2, 4, 0xffff}) {  // 1: no compressed pushes, 2: no priority
    std::string bytes = EncodeMessage(MakeMessage(Command::kHello));
    Poke<uint16_t>(bytes, 4, version);
    ExpectRejected(bytes, "version " + std::to_string(version));
  }
}

TEST(WireTest, RejectsUnknownCommands) {
  for (uint16_t command : {0, 4, 9, 25, 31, 40, 0xffff}) {
    EXPECT_FALSE(IsKnownCommand(command));
    std::string bytes = EncodeMessage(MakeMessage(Command::kHello));
    Poke<uint16_t>(bytes, 6, command);
    ExpectRejected(bytes, "unknown command " + std::to_string(command));
  }
}

TEST(WireTest, RejectsUnknownFlags) {
  for (uint32_t flags : {1u << 3, 1u << 31, 0xffffffffu}) {
    std::string bytes = EncodeMessage(MakeMessage(Command::kHello));
    Poke<uint32_t>(bytes, 8, flags);
    ExpectRejected(bytes, "unknown flags");
  }
}

// The same-host body reference is valid in a header, but a self-contained message has no sender
// memory to refer to.
TEST(WireTest, RejectsRemoteBodyInASelfContainedMessage) {
  std::string bytes = EncodeMessage(MakeMessage(Command::kHello));
  Poke<uint32_t>(bytes, 8, kFlagRemoteBody);
  ExpectRejected(bytes, "remote body");
}

TEST(WireTest, RejectsNegativeNodeIds) {
  for (size_t offset : {12, 16}) {
    std::string bytes = EncodeMessage(MakeMessage(Command::kHello));
    Poke<int32_t>(bytes, offset, -2);
    ExpectRejected(bytes, "negative node id");
  }
}

TEST(WireTest, RejectsMetaOverTheLimit) {
  std::string bytes = EncodeMessage(MakeMessage(Command::kRegister));
  Poke<uint32_t>(bytes, 20, static_cast<uint32_t>(kMaxMetaBytes + 1));
  ExpectRejected(bytes, "meta of " + std::to_string(kMaxMetaBytes + 1) + " bytes exceeds");
  Poke<uint32_t>(bytes, 20, 0xffffffffu);
  ExpectRejected(bytes, "exceeds the limit");
}

TEST(WireTest, AcceptsMetaAtTheLimit) {
  Message msg = MakeMessage(Command::kNodeTable);
  msg.meta.assign(kMaxMetaBytes, 'm');
  EXPECT_EQ(DecodeExact(EncodeMessage(msg)).meta.size(), kMaxMetaBytes);
}

TEST(WireTest, RejectsBodyOverTheLimit) {
  const std::string bytes = EncodeMessage(MakeMessage(Command::kPush, DType::kFloat32, 8));
  Limits small;
  small.max_body_bytes = 31;
  ExpectRejected(bytes, "body of 32 bytes exceeds the limit of 31", small);
  small.max_body_bytes = 32;
  EXPECT_EQ(DecodeExact(bytes, small).body.size, 32u);

  // A huge announced body is refused before anything is allocated.
  std::string huge = bytes;
  Poke<uint64_t>(huge, 48, uint64_t{1} << 62);
  ExpectRejected(huge, "exceeds the limit");
}

TEST(WireTest, RejectsBodyOnCommandsWithoutValues) {
  for (Command command : kAllCommands) {
    if (CarriesValues(command)) continue;
    SCOPED_TRACE(std::string(CommandName(command)));
    Message msg = MakeMessage(command);
    std::string bytes = EncodeMessage(msg);
    bytes += std::string(8, '\0');
    Poke<uint64_t>(bytes, 48, 8);
    ExpectRejected(bytes, std::string(CommandName(command)) + " message carries a body");
  }
}

TEST(WireTest, RejectsBodyThatIsNotWholeElements) {
  for (int t = 0; t < kNumDTypes; ++t) {
    const DType dtype = static_cast<DType>(t);
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    std::string bytes = EncodeMessage(MakeMessage(Command::kPush, dtype, 4));
    bytes.push_back('x');
    const uint64_t body_len = 4 * DTypeSize(dtype) + 1;
    Poke<uint64_t>(bytes, 48, body_len);
    ExpectRejected(bytes, "not a whole number of " + std::string(DTypeName(dtype)));
  }
}

TEST(WireTest, RejectsUnknownDType) {
  for (uint8_t dtype : {4, 5, 0x80, 0xff}) {
    std::string bytes = EncodeMessage(MakeMessage(Command::kPull));
    Poke<uint8_t>(bytes, 44, dtype);
    ExpectRejected(bytes, "unknown dtype " + std::to_string(dtype));
  }
}

TEST(WireTest, RejectsNonZeroReservedBytes) {
  for (size_t offset : {56, 57, 60, 63}) {
    SCOPED_TRACE(offset);
    std::string bytes = EncodeMessage(MakeMessage(Command::kPush));
    bytes[offset] = 1;
    ExpectRejected(bytes, "reserved header bytes");
  }
}

// A compressed push: 20 float32 values as 2-bit codes (two 32-bit words).
Message CompressedPush(Compression type = Compression::kTwoBit, uint32_t elements = 20) {
  Message msg = MakeMessage(Command::kPush);
  msg.header.flags = 0;
  msg.header.compression = type;
  msg.header.threshold = type == Compression::kTwoBit ? 0.5f : 0.0f;
  msg.header.elements = elements;
  const size_t bytes = CompressedBytes(type, elements);
  auto buffer = std::shared_ptr<char[]>(new char[bytes]());
  msg.body.data = buffer.get();
  msg.body.size = bytes;
  msg.body.owner = std::shared_ptr<void>(buffer, buffer.get());
  return msg;
}

TEST(WireTest, CompressedPushesRoundTrip) {
  for (Compression type : {Compression::kTwoBit, Compression::kOneBit, Compression::kFp16}) {
    SCOPED_TRACE(std::string(CompressionName(type)));
    const Message back = DecodeExact(EncodeMessage(CompressedPush(type, 21)));
    EXPECT_EQ(back.header.compression, type);
    EXPECT_EQ(back.header.elements, 21u);
    EXPECT_EQ(back.body.size, CompressedBytes(type, 21));  // fp16: 42 bytes, not whole floats
  }
  EXPECT_EQ(DecodeExact(EncodeMessage(CompressedPush())).header.threshold, 0.5f);
  EXPECT_NE(Describe(CompressedPush()).find("compressed=2bitx20"), std::string::npos);
}

TEST(WireTest, RejectsCompressionThatDoesNotFit) {
  std::string bytes = EncodeMessage(CompressedPush());
  Poke<uint8_t>(bytes, 45, 9);
  ExpectRejected(bytes, "unknown compression 9");
  bytes = EncodeMessage(CompressedPush());
  Poke<uint32_t>(bytes, 60, 100);  // 100 values need 28 bytes, the body has 8
  ExpectRejected(bytes, "carries 8 bytes, not 28");
  bytes = EncodeMessage(CompressedPush());
  Poke<uint32_t>(bytes, 60, 0);
  ExpectRejected(bytes, "compressed push of 0 values");
  for (float threshold : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    bytes = EncodeMessage(CompressedPush());
    Poke<float>(bytes, 56, threshold);
    ExpectRejected(bytes, "compressed push");
  }
  Message pull = CompressedPush();
  pull.header.command = Command::kPull;
  pull.body = {};
  pull.header.elements = 0;
  bytes = EncodeMessage(pull);
  Poke<uint32_t>(bytes, 60, 20);
  ExpectRejected(bytes, "only float32 pushes are compressed");
  Message reply = CompressedPush();
  reply.header.flags = kFlagResponse;
  ExpectRejected(EncodeMessage(reply), "only float32 pushes are compressed");
  Message doubles = CompressedPush();
  doubles.header.dtype = DType::kFloat64;
  ExpectRejected(EncodeMessage(doubles), "only float32 pushes are compressed");
}

TEST(WireTest, EveryTruncationIsRejected) {
  for (Command command : {Command::kPush, Command::kRegister, Command::kHello}) {
    const std::string bytes = EncodeMessage(MakeMessage(command));
    for (size_t n = 0; n < bytes.size(); ++n) {
      SCOPED_TRACE(n);
      const std::string prefix = bytes.substr(0, n);
      ExpectRejected(prefix, "truncated");
      if (n < kWireHeaderSize) {
        std::unique_ptr<char[]> exact(new char[n + 1]);
        std::memcpy(exact.get(), prefix.data(), n);
        EXPECT_THROW(DecodeHeader(exact.get(), n, Limits{}), ProtocolError);
      }
    }
  }
}

TEST(WireTest, DecodeOfNothingIsRejected) {
  EXPECT_THROW(DecodeMessage(nullptr, 0, Limits{}), ProtocolError);
  EXPECT_THROW(DecodeHeader(nullptr, 0, Limits{}), ProtocolError);
}

TEST(WireTest, RejectsTrailingBytes) {
  for (size_t extra : {1, 4, 100}) {
    std::string bytes = EncodeMessage(MakeMessage(Command::kPush));
    bytes.append(extra, '\0');
    ExpectRejected(bytes, "trailing bytes");
  }
}

TEST(WireTest, RejectsLengthsThatOverflowWhenAdded) {
  // meta_len + body_len must not wrap around to look like the bytes that follow.
  std::string bytes = EncodeMessage(MakeMessage(Command::kPush));
  Poke<uint64_t>(bytes, 48, ~uint64_t{0} - 3);  // a multiple of 4 close to 2^64
  Limits unlimited;
  unlimited.max_body_bytes = ~size_t{0};
  ExpectRejected(bytes, "truncated", unlimited);
}

TEST(WireTest, DescribeNamesTheMessage) {
  const Message msg = MakeMessage(Command::kPush);
  const std::string text = Describe(msg);
  EXPECT_NE(text.find("push"), std::string::npos);
  EXPECT_NE(text.find("response"), std::string::npos);
  EXPECT_NE(text.find("key=" + std::to_string(msg.header.key)), std::string::npos);
  EXPECT_NE(text.find("body=24B"), std::string::npos);
}

// Random damage to valid messages: whatever the bytes, decoding either succeeds (and re-encodes to
// the same bytes) or throws ProtocolError. Under -DDTRAIN_SANITIZE=ON this also checks that no
// input makes the decoder read outside its buffer.
TEST(WireTest, RandomMutationsDecodeOrThrowProtocolError) {
  std::vector<std::string> seeds;
  for (Command command : kAllCommands) seeds.push_back(EncodeMessage(MakeMessage(command)));
  seeds.push_back(EncodeMessage(MakeMessage(Command::kPush, DType::kFloat64, 3)));
  seeds.push_back(EncodeMessage(MakeMessage(Command::kInit, DType::kFloat16, 1)));
  seeds.push_back(EncodeMessage(Message{}));

  std::mt19937_64 rng(20240607);
  auto uniform = [&rng](uint64_t n) {
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
  };
  int accepted = 0;
  int rejected = 0;
  constexpr int kMutations = 20000;
  for (int i = 0; i < kMutations; ++i) {
    std::string bytes = seeds[uniform(seeds.size())];
    const int rounds = 1 + static_cast<int>(uniform(3));
    for (int r = 0; r < rounds; ++r) {
      switch (uniform(6)) {
        case 0: {  // flip a few bits anywhere
          const int flips = 1 + static_cast<int>(uniform(4));
          for (int f = 0; f < flips && !bytes.empty(); ++f) {
            bytes[uniform(bytes.size())] ^= static_cast<char>(1u << uniform(8));
          }
          break;
        }
        case 1:  // corrupt meta_len: small shifts and wild values
          if (bytes.size() >= 24) {
            uint32_t v;
            std::memcpy(&v, bytes.data() + 20, 4);
            v = uniform(2) ? v + static_cast<uint32_t>(uniform(17)) - 8
                           : static_cast<uint32_t>(rng());
            Poke<uint32_t>(bytes, 20, v);
          }
          break;
        case 2:  // corrupt body_len
          if (bytes.size() >= 56) {
            uint64_t v;
            std::memcpy(&v, bytes.data() + 48, 8);
            v = uniform(2) ? v + uniform(33) - 16 : rng() >> uniform(64);
            Poke<uint64_t>(bytes, 48, v);
          }
          break;
        case 3:  // truncate
          bytes.resize(uniform(bytes.size() + 1));
          break;
        case 4:  // append junk
          for (uint64_t n = 1 + uniform(16); n > 0; --n) bytes.push_back(static_cast<char>(rng()));
          break;
        case 5:  // overwrite one header byte with a random value
          if (!bytes.empty())
            bytes[uniform(std::min<size_t>(bytes.size(), kWireHeaderSize))] =
                static_cast<char>(rng());
          break;
      }
    }
    try {
      const Message msg = DecodeExact(bytes);
      ++accepted;
      ASSERT_EQ(EncodeMessage(msg), bytes) << "mutation " << i << " decoded but does not re-encode";
    } catch (const ProtocolError&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "mutation " << i << " threw something other than ProtocolError: " << e.what();
    }
  }
  EXPECT_EQ(accepted + rejected, kMutations);
  EXPECT_GT(accepted, 0);  // some damage (in key, request id, meta text...) is still valid
  EXPECT_GT(rejected, kMutations / 2);
  RecordProperty("accepted", accepted);
  RecordProperty("rejected", rejected);
}

}  // namespace
}  // namespace dtrain::transport
