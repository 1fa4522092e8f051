#include "transport/wire.h"

#include <bit>
#include <cstring>
#include <memory>

#include "common/buffer_pool.h"
#include "common/dtype_checks.h"
#include "compression/codec.h"
#include "dtrain/common/error.h"

namespace dtrain::transport {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; add byte swapping for this host");

namespace {

template <typename T>
void Put(WireHeader& out, size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

template <typename T>
T Get(const char* bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes + offset, sizeof(T));
  return value;
}

bool CarriesValues(Command c) {
  return IsValueCommand(c) || c == Command::kInit ||
         c == Command::kCommand;  // commands: opaque state bytes
}

}  // namespace

bool IsValueCommand(Command c) {
  return c == Command::kPush || c == Command::kPull || c == Command::kPushPull ||
         c == Command::kPushRows || c == Command::kPullRows;
}

bool IsKnownCommand(uint16_t raw) {
  switch (static_cast<Command>(raw)) {
    case Command::kHello:
    case Command::kBye:
    case Command::kAck:
    case Command::kRegister:
    case Command::kNodeTable:
    case Command::kReady:
    case Command::kStart:
    case Command::kBarrier:
    case Command::kBarrierDone:
    case Command::kHeartbeat:
    case Command::kNodeFailed:
    case Command::kFinish:
    case Command::kTerminate:
    case Command::kAbort:
    case Command::kRejoin:
    case Command::kNodeReplaced:
    case Command::kReplacedReady:
    case Command::kReplacementStarted:
    case Command::kInit:
    case Command::kPush:
    case Command::kPull:
    case Command::kPushPull:
    case Command::kSetOptimizer:
    case Command::kCommand:
    case Command::kPushRows:
    case Command::kPullRows:
      return true;
  }
  return false;
}

std::string_view CommandName(Command c) {
  switch (c) {
    case Command::kHello:
      return "hello";
    case Command::kBye:
      return "bye";
    case Command::kAck:
      return "ack";
    case Command::kRegister:
      return "register";
    case Command::kNodeTable:
      return "node-table";
    case Command::kReady:
      return "ready";
    case Command::kStart:
      return "start";
    case Command::kBarrier:
      return "barrier";
    case Command::kBarrierDone:
      return "barrier-done";
    case Command::kHeartbeat:
      return "heartbeat";
    case Command::kNodeFailed:
      return "node-failed";
    case Command::kFinish:
      return "finish";
    case Command::kTerminate:
      return "terminate";
    case Command::kAbort:
      return "abort";
    case Command::kRejoin:
      return "rejoin";
    case Command::kNodeReplaced:
      return "node-replaced";
    case Command::kReplacedReady:
      return "replaced-ready";
    case Command::kReplacementStarted:
      return "replacement-started";
    case Command::kInit:
      return "init";
    case Command::kPush:
      return "push";
    case Command::kPull:
      return "pull";
    case Command::kPushPull:
      return "pushpull";
    case Command::kSetOptimizer:
      return "set-optimizer";
    case Command::kCommand:
      return "command";
    case Command::kPushRows:
      return "push-rows";
    case Command::kPullRows:
      return "pull-rows";
  }
  return "unknown";
}

std::string Describe(const Message& msg) {
  const Header& h = msg.header;
  std::string s(CommandName(h.command));
  if (h.is_response()) s += h.is_error() ? " error-response" : " response";
  s += " key=" + std::to_string(h.key) + " part=" + std::to_string(h.part) +
       " from=" + std::to_string(h.sender) + " to=" + std::to_string(h.recipient) +
       " req=" + std::to_string(h.request_id) + " meta=" + std::to_string(msg.meta.size()) +
       "B body=" + std::to_string(msg.body.size) + "B";
  if (h.compression != Compression::kNone) {
    s += " compressed=" + std::string(CompressionName(h.compression)) + "x" +
         std::to_string(h.elements);
  }
  return s;
}

// Bytes 45 and 56-63: zero, or a compressed push whose every field fits the others.
static void DecodeCompression(const char* bytes, Frame* f) {
  Header& h = f->header;
  const uint8_t compression = Get<uint8_t>(bytes, 45);
  if (!IsValidCompression(compression)) {
    throw ProtocolError("unknown compression " + std::to_string(compression));
  }
  h.compression = static_cast<Compression>(compression);
  h.threshold = Get<float>(bytes, 56);
  h.elements = Get<uint32_t>(bytes, 60);
  if (h.compression == Compression::kNone) {
    if (Get<uint64_t>(bytes, 56) != 0) throw ProtocolError("reserved header bytes are not zero");
    return;
  }
  const bool push = h.command == Command::kPush || h.command == Command::kPushPull ||
                    h.command == Command::kPushRows;
  if (!push || h.is_response() || h.dtype != DType::kFloat32) {
    throw ProtocolError("only float32 pushes are compressed, not this " +
                        std::string(CommandName(h.command)));
  }
  try {
    CompressionSpec{h.compression, h.threshold}.Validate();
  } catch (const InvalidArgument& e) {
    throw ProtocolError(std::string("compressed push: ") + e.what());
  }
  const size_t packed = CompressedBytes(h.compression, h.elements);
  // A row push carries its row count and ids (8 bytes each) before the packed rows; the server
  // checks that they account for the rest (ps/row_sparse_body.h).
  const bool ids_first =
      h.command == Command::kPushRows && f->body_len > packed && (f->body_len - packed) % 8 == 0;
  if (h.elements == 0 || (!ids_first && f->body_len != packed)) {
    throw ProtocolError("compressed push of " + std::to_string(h.elements) + " values (" +
                        std::string(CompressionName(h.compression)) + ") carries " +
                        std::to_string(f->body_len) + " bytes, not " + std::to_string(packed));
  }
}

WireHeader EncodeHeader(const Header& h, size_t meta_len, size_t body_len) {
  // The receiver would refuse it; fail here, where the caller can still see why.
  if (meta_len > kMaxMetaBytes) {
    throw ProtocolError("meta of " + std::to_string(meta_len) + " bytes exceeds the limit of " +
                        std::to_string(kMaxMetaBytes));
  }
  WireHeader out{};
  Put<uint32_t>(out, 0, kWireMagic);
  Put<uint16_t>(out, 4, kWireVersion);
  Put<uint16_t>(out, 6, static_cast<uint16_t>(h.command));
  Put<uint32_t>(out, 8, h.flags);
  Put<int32_t>(out, 12, h.sender);
  Put<int32_t>(out, 16, h.recipient);
  Put<uint32_t>(out, 20, static_cast<uint32_t>(meta_len));
  Put<uint64_t>(out, 24, h.request_id);
  Put<uint64_t>(out, 32, h.key);
  Put<uint32_t>(out, 40, h.part);
  Put<uint8_t>(out, 44, static_cast<uint8_t>(h.dtype));
  Put<uint8_t>(out, 45, static_cast<uint8_t>(h.compression));
  Put<int16_t>(out, 46, h.priority);
  Put<uint64_t>(out, 48, static_cast<uint64_t>(body_len));
  Put<float>(out, 56, h.threshold);
  Put<uint32_t>(out, 60, h.elements);
  return out;
}

Frame DecodeHeader(const char* bytes, size_t size, const Limits& limits) {
  if (size < kWireHeaderSize) {
    throw ProtocolError("message header truncated: " + std::to_string(size) + " of " +
                        std::to_string(kWireHeaderSize) + " bytes");
  }
  const uint32_t magic = Get<uint32_t>(bytes, 0);
  if (magic != kWireMagic) throw ProtocolError("bad magic: not a dtrain message");
  const uint16_t version = Get<uint16_t>(bytes, 4);
  if (version != kWireVersion) {
    throw ProtocolError("unsupported protocol version " + std::to_string(version) + " (this is " +
                        std::to_string(kWireVersion) + "): are all nodes running the same dtrain?");
  }
  const uint16_t command = Get<uint16_t>(bytes, 6);
  if (!IsKnownCommand(command)) throw ProtocolError("unknown command " + std::to_string(command));
  Frame f;
  f.header.command = static_cast<Command>(command);
  f.header.flags = Get<uint32_t>(bytes, 8);
  if ((f.header.flags & ~kKnownFlags) != 0) {
    throw ProtocolError("unknown flags " + std::to_string(f.header.flags));
  }
  f.header.sender = Get<int32_t>(bytes, 12);
  f.header.recipient = Get<int32_t>(bytes, 16);
  if (f.header.sender < kNoNode || f.header.recipient < kNoNode) {
    throw ProtocolError("negative node id");
  }
  f.meta_len = Get<uint32_t>(bytes, 20);
  if (f.meta_len > kMaxMetaBytes) {
    throw ProtocolError("meta of " + std::to_string(f.meta_len) + " bytes exceeds the limit of " +
                        std::to_string(kMaxMetaBytes));
  }
  f.header.request_id = Get<uint64_t>(bytes, 24);
  f.header.key = Get<uint64_t>(bytes, 32);
  f.header.part = Get<uint32_t>(bytes, 40);
  const uint8_t dtype = Get<uint8_t>(bytes, 44);
  if (!IsValidDType(dtype)) throw ProtocolError("unknown dtype " + std::to_string(dtype));
  f.header.dtype = static_cast<DType>(dtype);
  f.header.priority = Get<int16_t>(bytes, 46);  // any value: it only orders replies
  f.body_len = Get<uint64_t>(bytes, 48);
  if (f.body_len > limits.max_body_bytes) {
    throw ProtocolError("body of " + std::to_string(f.body_len) + " bytes exceeds the limit of " +
                        std::to_string(limits.max_body_bytes) + " (DTRAIN_MAX_MESSAGE_BYTES)");
  }
  if (f.body_len != 0 && !CarriesValues(f.header.command)) {
    throw ProtocolError(std::string(CommandName(f.header.command)) + " message carries a body");
  }
  DecodeCompression(bytes, &f);
  if (f.header.compression != Compression::kNone) return f;  // its length is checked there
  if (f.body_len % DTypeSize(f.header.dtype) != 0) {
    throw ProtocolError("body of " + std::to_string(f.body_len) +
                        " bytes is not a whole number of " +
                        std::string(DTypeName(f.header.dtype)) + " elements");
  }
  return f;
}

std::string EncodeMessage(const Message& msg) {
  WireHeader h = EncodeHeader(msg.header, msg.meta.size(), msg.body.size);
  std::string out(h.begin(), h.end());
  out += msg.meta;
  out.append(msg.body.data, msg.body.size);
  return out;
}

Message DecodeMessage(const char* bytes, size_t size, const Limits& limits) {
  Frame f = DecodeHeader(bytes, size, limits);
  if ((f.header.flags & kFlagRemoteBody) != 0) {
    throw ProtocolError("a self-contained message cannot refer to a remote body");
  }
  const size_t rest = size - kWireHeaderSize;
  if (f.meta_len > rest || f.body_len > rest - f.meta_len) {
    throw ProtocolError("message truncated: header announces " + std::to_string(f.meta_len) +
                        " meta and " + std::to_string(f.body_len) + " body bytes, " +
                        std::to_string(rest) + " follow");
  }
  if (f.meta_len + f.body_len != rest) {
    throw ProtocolError("trailing bytes after message");
  }
  Message msg;
  msg.header = f.header;
  msg.meta.assign(bytes + kWireHeaderSize, f.meta_len);
  if (f.body_len > 0) {
    auto buffer = BufferPool::Default().Get(f.body_len);
    std::memcpy(buffer.get(), bytes + kWireHeaderSize + f.meta_len, f.body_len);
    msg.body.data = buffer.get();
    msg.body.size = f.body_len;
    msg.body.owner = std::move(buffer);
  }
  return msg;
}

}  // namespace dtrain::transport
