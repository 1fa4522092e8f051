// Server checkpoint files (checkpoint_file.h): written whole or not at all, read back exactly,
// and every damaged or foreign file refused with a clear error instead of being restored.
#include "ps/checkpoint_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "dtrain/common/error.h"

namespace dtrain::ps {
namespace {

class CheckpointFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("dtrain-checkpoint-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    folder_ = CheckpointFolder(root_.string(), 3);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::filesystem::path root_;
  std::string folder_;
};

transport::Body Floats(std::vector<float> values) {
  auto buffer = std::shared_ptr<char[]>(new char[values.size() * 4 + 1]);
  std::memcpy(buffer.get(), values.data(), values.size() * 4);
  transport::Body b;
  b.data = buffer.get();
  b.size = values.size() * 4;
  b.owner = std::move(buffer);
  return b;
}

ServerCheckpoint Sample() {
  ServerCheckpoint c;
  c.slots.push_back({7, 0, DType::kFloat32, 3, true, 12, {}, Floats({1.5f, -2.0f, 3.25f})});
  // dist_async: each worker's pushes applied, in rank order.
  c.slots.push_back(
      {(uint64_t{1} << 63) + 5, 2, DType::kFloat32, 1, false, 0, {40, 0, 3}, Floats({9.0f})});
  c.slots.push_back({8, 0, DType::kFloat32, 0, true, 4, {}, Floats({})});
  // A matrix's slot: 2 rows of 2.
  c.slots.push_back({9, 1, DType::kFloat32, 4, true, 2, {}, Floats({1.f, 2.f, 3.f, 4.f}), 2});
  c.optimizer_spec = R"({"name":"sgd","learning_rate":0.1,"momentum":0.9})";
  c.optimizer_state = std::string("state\0bytes", 11);
  return c;
}

std::string FileBytes(const std::string& folder) {
  std::ifstream in(std::filesystem::path(folder) / "checkpoint.dtsc", std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_F(CheckpointFolderTest, WhatIsWrittenIsReadBackExactly) {
  EXPECT_FALSE(ReadCheckpoint(folder_).has_value());  // none yet: not an error
  const ServerCheckpoint written = Sample();
  const size_t bytes = WriteCheckpoint(folder_, written);
  EXPECT_EQ(bytes, FileBytes(folder_).size());
  const auto read = ReadCheckpoint(folder_);
  ASSERT_TRUE(read.has_value());
  ASSERT_EQ(read->slots.size(), written.slots.size());
  for (size_t i = 0; i < written.slots.size(); ++i) {
    const CheckpointSlot& a = written.slots[i];
    const CheckpointSlot& b = read->slots[i];
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.part, b.part);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.length, b.length);
    EXPECT_EQ(a.sync, b.sync);
    EXPECT_EQ(a.rounds, b.rounds);
    EXPECT_EQ(a.pushes, b.pushes);
    EXPECT_EQ(a.row_length, b.row_length);
    for (int w = 0; w < 3; ++w) EXPECT_EQ(a.PushedBy(w), b.PushedBy(w));
    ASSERT_EQ(a.value.size, b.value.size);
    EXPECT_EQ(std::memcmp(a.value.data, b.value.data, a.value.size), 0);
  }
  EXPECT_EQ(read->optimizer_spec, written.optimizer_spec);
  EXPECT_EQ(read->optimizer_state, written.optimizer_state);
}

TEST_F(CheckpointFolderTest, ANewCheckpointReplacesTheOldAndLeavesNoTemporaryFile) {
  WriteCheckpoint(folder_, Sample());
  ServerCheckpoint next = Sample();
  next.slots[0].rounds = 13;
  WriteCheckpoint(folder_, next);
  EXPECT_EQ(ReadCheckpoint(folder_)->slots[0].rounds, 13);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(folder_)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "checkpoint.dtsc");
  }
  EXPECT_EQ(files, 1);
}

TEST_F(CheckpointFolderTest, AHalfWrittenTemporaryFileIsNeverRead) {
  WriteCheckpoint(folder_, Sample());
  const std::string whole = FileBytes(folder_);
  std::ofstream(std::filesystem::path(folder_) / "checkpoint.dtsc.tmp-99", std::ios::binary)
      << whole.substr(0, whole.size() / 2);
  EXPECT_EQ(ReadCheckpoint(folder_)->slots[0].rounds, 12);
  RemoveCheckpoint(folder_);  // a new job clears both
  EXPECT_FALSE(ReadCheckpoint(folder_).has_value());
  EXPECT_TRUE(std::filesystem::is_empty(folder_));
}

TEST_F(CheckpointFolderTest, EveryTruncationAndEveryFlippedByteIsRefusedOrHarmless) {
  WriteCheckpoint(folder_, Sample());
  const std::string whole = FileBytes(folder_);
  for (size_t n = 0; n < whole.size(); ++n) {
    EXPECT_THROW(DecodeCheckpoint(std::string_view(whole).substr(0, n)), ProtocolError) << n;
  }
  // A flipped byte either fails a check or lands in values (which no check can tell from
  // others); it never crashes or reads past the end (ASan runs of the fuzzer check the rest).
  for (size_t i = 0; i < whole.size(); ++i) {
    std::string bad = whole;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    try {
      DecodeCheckpoint(bad);
    } catch (const ProtocolError&) {
    }
  }
  std::ofstream(std::filesystem::path(folder_) / "checkpoint.dtsc", std::ios::binary)
      << whole.substr(0, whole.size() - 1);
  try {
    ReadCheckpoint(folder_);
    FAIL() << "a truncated checkpoint was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is corrupt"), std::string::npos) << e.what();
  }
}

TEST(SlotRoundsTest, RoundTripAndMalformedInputIsRefused) {
  std::string cmd;
  uint64_t checkpoint = 0;
  const auto slots = DecodeSlotRounds(EncodeSlotRounds("checkpointed", {{1, 0, 5}, {2, 3, 0}}, 12),
                                      &cmd, &checkpoint);
  EXPECT_EQ(cmd, "checkpointed");
  EXPECT_EQ(checkpoint, 12u);
  DecodeSlotRounds(EncodeSlotRounds("restored_rounds", {}), &cmd, &checkpoint);
  EXPECT_EQ(checkpoint, 0u);  // none named
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[1].key, 2u);
  EXPECT_EQ(slots[1].part, 3u);
  EXPECT_EQ(slots[0].rounds, 5);
  for (const char* bad :
       {"", "[]", "{}", R"({"cmd":"x"})", R"({"cmd":1,"slots":[]})",
        R"({"cmd":"x","slots":[[1,2]]})", R"({"cmd":"x","slots":[[1,2,-1]]})",
        R"({"cmd":"x","slots":[[1,4294967296,1]]})", R"({"cmd":"x","slots":[[1,2,"3"]]})",
        R"({"cmd":"x","slots":[],"checkpoint":-1})",
        R"({"cmd":"x","slots":[],"checkpoint":"2"})"}) {
    EXPECT_THROW(DecodeSlotRounds(bad, nullptr, &checkpoint), ProtocolError) << bad;
  }
}

}  // namespace
}  // namespace dtrain::ps
