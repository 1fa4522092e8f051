#include "ps/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/dtype_checks.h"
#include "dtrain/common/error.h"

namespace dtrain::ps {
namespace {

constexpr std::string_view kMagic = "DTSC";
constexpr std::string_view kEndMagic = "DTSE";
constexpr uint32_t kVersion = 1;
constexpr std::string_view kFileName = "checkpoint.dtsc";
constexpr std::string_view kTempPrefix = "checkpoint.dtsc.tmp-";
constexpr size_t kHeaderBytes = 4 + 4 + 8;
constexpr size_t kTrailerBytes = 4 + 8;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T Get(std::string_view bytes, size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

std::string SystemError(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Writes all of `data` to fd, retrying short writes.
void WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(SystemError("cannot write the server checkpoint", path));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void SyncFolder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // the rename happened; only its durability across a power cut is at stake
  ::fsync(fd);
  ::close(fd);
}

int64_t IntField(const nlohmann::json& j, const char* name, int64_t min, int64_t max) {
  if (!j.contains(name) || !j[name].is_number_integer()) {
    throw ProtocolError(std::string("checkpoint index: '") + name + "' missing or not an integer");
  }
  const int64_t v = j[name].is_number_unsigned()
                        ? static_cast<int64_t>(std::min<uint64_t>(
                              j[name].get<uint64_t>(), std::numeric_limits<int64_t>::max()))
                        : j[name].get<int64_t>();
  if (v < min || v > max) {
    throw ProtocolError(std::string("checkpoint index: '") + name + "' out of range");
  }
  return v;
}

}  // namespace

std::string CheckpointFolder(const std::string& dir, int rank) {
  return (std::filesystem::path(dir) / ("server-" + std::to_string(rank))).string();
}

size_t WriteCheckpoint(const std::string& folder, const ServerCheckpoint& checkpoint) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw Error("cannot make the checkpoint folder " + folder + ": " + ec.message());

  nlohmann::json slots = nlohmann::json::array();
  for (const CheckpointSlot& s : checkpoint.slots) {
    nlohmann::json slot{
        {"key", s.key},       {"part", s.part}, {"dtype", static_cast<int>(s.dtype)},
        {"length", s.length}, {"sync", s.sync}, {"rounds", s.rounds}};
    if (!s.sync) slot["pushes"] = s.pushes;
    if (s.row_length > 0) slot["row_length"] = s.row_length;
    slots.push_back(std::move(slot));
  }
  const std::string index =
      nlohmann::json{{"slots", slots},
                     {"optimizer", checkpoint.optimizer_spec},
                     {"optimizer_state_bytes", checkpoint.optimizer_state.size()}}
          .dump();
  std::string head;
  head.append(kMagic);
  Put<uint32_t>(&head, kVersion);
  Put<uint64_t>(&head, index.size());
  head += index;
  size_t total = head.size() + checkpoint.optimizer_state.size() + kTrailerBytes;
  for (const CheckpointSlot& s : checkpoint.slots) total += s.value.size;
  std::string tail;
  tail.append(kEndMagic);
  Put<uint64_t>(&tail, total);

  const std::string path = (std::filesystem::path(folder) / kFileName).string();
  const std::string temp =
      (std::filesystem::path(folder) / (std::string(kTempPrefix) + std::to_string(::getpid())))
          .string();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(SystemError("cannot create", temp));
  try {
    WriteAll(fd, head.data(), head.size(), temp);
    for (const CheckpointSlot& s : checkpoint.slots) WriteAll(fd, s.value.data, s.value.size, temp);
    WriteAll(fd, checkpoint.optimizer_state.data(), checkpoint.optimizer_state.size(), temp);
    WriteAll(fd, tail.data(), tail.size(), temp);
    if (::fsync(fd) != 0) throw Error(SystemError("cannot flush", temp));
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = SystemError("cannot rename the checkpoint to", path);
    ::unlink(temp.c_str());
    throw Error(why);
  }
  SyncFolder(folder);
  return total;
}

std::optional<ServerCheckpoint> ReadCheckpoint(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / kFileName).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    throw Error("cannot read the server checkpoint " + path);
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error("cannot read the server checkpoint " + path);
  try {
    return DecodeCheckpoint(bytes);
  } catch (const ProtocolError& e) {
    throw Error("the server checkpoint " + path + " is corrupt: " + e.what());
  }
}

void RemoveCheckpoint(const std::string& folder) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kFileName || name.starts_with(kTempPrefix)) std::filesystem::remove(entry, ec);
  }
}

ServerCheckpoint DecodeCheckpoint(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes + kTrailerBytes || bytes.substr(0, 4) != kMagic) {
    throw ProtocolError("not a dtrain server checkpoint");
  }
  if (Get<uint32_t>(bytes, 4) != kVersion) {
    throw ProtocolError("checkpoint version " + std::to_string(Get<uint32_t>(bytes, 4)) +
                        ", this build reads version " + std::to_string(kVersion));
  }
  const size_t trailer = bytes.size() - kTrailerBytes;
  if (bytes.substr(trailer, 4) != kEndMagic || Get<uint64_t>(bytes, trailer + 4) != bytes.size()) {
    throw ProtocolError("the file is incomplete (its end marker or size does not match)");
  }
  const uint64_t index_bytes = Get<uint64_t>(bytes, 8);
  if (index_bytes > trailer - kHeaderBytes) throw ProtocolError("the index overruns the file");
  const auto index = nlohmann::json::parse(bytes.substr(kHeaderBytes, index_bytes), nullptr, false);
  if (index.is_discarded() || !index.is_object() || !index.contains("slots") ||
      !index["slots"].is_array() || !index.contains("optimizer") ||
      !index["optimizer"].is_string()) {
    throw ProtocolError("malformed checkpoint index");
  }
  ServerCheckpoint out;
  out.optimizer_spec = index["optimizer"].get<std::string>();
  size_t at = kHeaderBytes + index_bytes;
  for (const auto& j : index["slots"]) {
    if (!j.is_object() || !j.contains("sync") || !j["sync"].is_boolean() || !j.contains("key") ||
        !j["key"].is_number_unsigned()) {
      throw ProtocolError("malformed checkpoint slot");
    }
    CheckpointSlot s;
    s.key = j["key"].get<uint64_t>();
    s.part = static_cast<uint32_t>(IntField(j, "part", 0, std::numeric_limits<uint32_t>::max()));
    s.dtype = static_cast<DType>(IntField(j, "dtype", 0, kNumDTypes - 1));
    s.length = IntField(j, "length", 0, std::numeric_limits<int64_t>::max());
    s.sync = j["sync"].get<bool>();
    s.rounds = IntField(j, "rounds", 0, std::numeric_limits<int64_t>::max());
    if (j.contains("row_length")) {
      s.row_length = IntField(j, "row_length", 1, std::numeric_limits<int64_t>::max());
      if (s.length % s.row_length != 0) throw ProtocolError("checkpoint rows do not divide a slot");
    }
    if (j.contains("pushes")) {
      if (s.sync || !j["pushes"].is_array()) throw ProtocolError("malformed checkpoint pushes");
      for (const auto& count : j["pushes"]) {
        if (!count.is_number_unsigned() ||
            count.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw ProtocolError("malformed checkpoint push count");
        }
        s.pushes.push_back(count.get<int64_t>());
      }
    }
    // In elements first: length * size could wrap around.
    const size_t elem = DTypeSize(s.dtype);
    if (static_cast<uint64_t>(s.length) > (trailer - at) / elem) {
      throw ProtocolError("slot values overrun the file");
    }
    const size_t n = static_cast<size_t>(s.length) * elem;
    auto buffer = std::shared_ptr<char[]>(new char[std::max<size_t>(n, 1)]);
    std::memcpy(buffer.get(), bytes.data() + at, n);
    s.value.data = buffer.get();
    s.value.size = n;
    s.value.owner = std::move(buffer);
    at += n;
    out.slots.push_back(std::move(s));
  }
  const int64_t state_bytes =
      IntField(index, "optimizer_state_bytes", 0, std::numeric_limits<int64_t>::max());
  if (static_cast<uint64_t>(state_bytes) != trailer - at) {
    throw ProtocolError("the optimizer state does not fill the rest of the file");
  }
  out.optimizer_state.assign(bytes.data() + at, static_cast<size_t>(state_bytes));
  return out;
}

std::string EncodeSlotRounds(const std::string& cmd, const std::vector<SlotRounds>& slots,
                             uint64_t checkpoint) {
  nlohmann::json list = nlohmann::json::array();
  for (const SlotRounds& s : slots) list.push_back({s.key, s.part, s.rounds});
  nlohmann::json j{{"cmd", cmd}, {"slots", list}};
  if (checkpoint > 0) j["checkpoint"] = checkpoint;
  return j.dump();
}

std::vector<SlotRounds> DecodeSlotRounds(std::string_view meta, std::string* cmd,
                                         uint64_t* checkpoint) {
  const auto j = nlohmann::json::parse(meta, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("slots") || !j["slots"].is_array() ||
      !j.contains("cmd") || !j["cmd"].is_string()) {
    throw ProtocolError("malformed slot rounds");
  }
  if (cmd != nullptr) *cmd = j["cmd"].get<std::string>();
  if (checkpoint != nullptr) {
    *checkpoint = 0;
    if (j.contains("checkpoint")) {
      if (!j["checkpoint"].is_number_unsigned()) throw ProtocolError("malformed checkpoint number");
      *checkpoint = j["checkpoint"].get<uint64_t>();
    }
  }
  std::vector<SlotRounds> out;
  out.reserve(j["slots"].size());
  for (const auto& e : j["slots"]) {
    if (!e.is_array() || e.size() != 3 || !e[0].is_number_unsigned() ||
        !e[1].is_number_unsigned() || !e[2].is_number_unsigned() ||
        e[1].get<uint64_t>() > std::numeric_limits<uint32_t>::max() ||
        e[2].get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw ProtocolError("malformed slot rounds entry");
    }
    out.push_back({e[0].get<uint64_t>(), static_cast<uint32_t>(e[1].get<uint64_t>()),
                   static_cast<int64_t>(e[2].get<uint64_t>())});
  }
  return out;
}

}  // namespace dtrain::ps
