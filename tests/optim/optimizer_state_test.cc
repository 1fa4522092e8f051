// SaveState / LoadState: a round trip continues bit for bit as if never interrupted, and bytes
// that are not a state of this optimizer (hand-made damage and random mutations, as
// tests/transport/wire_test.cc does for messages) are refused with InvalidArgument, never a crash,
// leaving the optimizer as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"

namespace dtrain {
namespace {

using optim_test::InvalidArgumentFrom;
using optim_test::NamedSpec;
using optim_test::RandomVector;
using optim_test::SameBits;
using ::testing::HasSubstr;

// A few indexes of different lengths (one empty), with their weights.
struct Model {
  std::vector<uint64_t> indexes{3, (uint64_t{7} << 20) | 1, 1000000007};
  std::vector<std::vector<float>> weights;

  explicit Model(std::mt19937& rng) {
    for (size_t n : {5, 0, 19}) weights.push_back(RandomVector(rng, n));
  }
  // One round: every index once, except that the last skips odd rounds (its own count).
  void Round(Optimizer& opt, std::mt19937& rng, int round) {
    for (size_t k = 0; k < indexes.size(); ++k) {
      if (k == 2 && round % 2 == 1) continue;
      opt.Update(indexes[k], weights[k], RandomVector(rng, weights[k].size()));
    }
  }
};

class StateRoundTripTest : public ::testing::TestWithParam<NamedSpec> {};

TEST_P(StateRoundTripTest, ContinuingFromLoadedStateIsBitIdentical) {
  const OptimizerSpec& spec = GetParam().spec;
  auto original = CreateOptimizer(spec);
  std::mt19937 rng(17);
  Model model(rng);
  for (int round = 0; round < 5; ++round) model.Round(*original, rng, round);
  original->set_learning_rate(original->learning_rate() * 0.5);  // restored by LoadState too

  const std::string saved = original->SaveState();
  auto restored = CreateOptimizer(spec);
  restored->LoadState(saved);
  EXPECT_EQ(restored->SaveState(), saved);  // canonical
  EXPECT_EQ(restored->learning_rate(), original->learning_rate());
  for (uint64_t index : model.indexes) {
    EXPECT_EQ(restored->UpdateCount(index), original->UpdateCount(index));
  }

  Model copy = model;
  std::mt19937 rng_copy = rng;
  for (int round = 5; round < 12; ++round) {
    model.Round(*original, rng, round);
    copy.Round(*restored, rng_copy, round);
  }
  for (size_t k = 0; k < model.weights.size(); ++k) {
    EXPECT_TRUE(SameBits(model.weights[k], copy.weights[k])) << "index " << model.indexes[k];
  }
  EXPECT_EQ(restored->SaveState(), original->SaveState());
}

TEST_P(StateRoundTripTest, LoadingReplacesTheWholeState) {
  const OptimizerSpec& spec = GetParam().spec;
  auto empty = CreateOptimizer(spec);
  const std::string nothing = empty->SaveState();
  auto used = CreateOptimizer(spec);
  std::vector<float> w{1.f, 2.f}, g{0.5f, -0.5f};
  used->Update(9, w, g);
  used->LoadState(nothing);
  EXPECT_EQ(used->UpdateCount(9), 0u);
  EXPECT_EQ(used->SaveState(), nothing);
  std::vector<float> w3{1.f, 2.f, 3.f}, g3{1.f, 1.f, 1.f};
  used->Update(9, w3, g3);  // index 9 is new again: any length
}

TEST_P(StateRoundTripTest, EveryTruncationAndAnyTrailingByteIsRefused) {
  const OptimizerSpec& spec = GetParam().spec;
  auto source = CreateOptimizer(spec);
  std::mt19937 rng(19);
  Model model(rng);
  for (int round = 0; round < 2; ++round) model.Round(*source, rng, round);
  const std::string saved = source->SaveState();
  auto target = CreateOptimizer(spec);
  const std::string before = target->SaveState();
  for (size_t n = 0; n < saved.size(); ++n) {
    EXPECT_THROW(target->LoadState(saved.substr(0, n)), InvalidArgument) << "first " << n;
  }
  EXPECT_THAT(InvalidArgumentFrom([&] { target->LoadState(saved + '\0'); }),
              HasSubstr("1 bytes follow the end"));
  EXPECT_EQ(target->SaveState(), before);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, StateRoundTripTest,
                         ::testing::ValuesIn(optim_test::EveryVariant()),
                         [](const auto& info) { return info.param.label; });

// ---- Hand-made damage ----

// The state layout (see elementwise_optimizer.h), for writing damaged states by hand.
struct StateBuilder {
  std::string out;
  StateBuilder& Raw(std::string_view s) { return out.append(s), *this; }
  StateBuilder& U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  StateBuilder& U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  StateBuilder& F64(double v) { return U64(std::bit_cast<uint64_t>(v)); }
  StateBuilder& F32(float v) { return U32(std::bit_cast<uint32_t>(v)); }
  // Magic, version, name, buffers, learning rate.
  static StateBuilder Header(std::string_view name = "sgd", uint32_t buffers = 1, double lr = 0.1,
                             uint32_t version = 1) {
    StateBuilder b;
    b.Raw("DTOS").U32(version).U32(static_cast<uint32_t>(name.size())).Raw(name).U32(buffers);
    return b.F64(lr), b;
  }
};

const OptimizerSpec kMomentumSgd{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}};

TEST(OptimizerStateTest, HandBuiltStateLoadsAndIsUsed) {
  // One index (5) with 2 updates, 2 elements of momentum; lr 0.25.
  const std::string state =
      StateBuilder::Header("sgd", 1, 0.25).U64(1).U64(5).U64(2).U64(2).F32(-1.f).F32(0.5f).out;
  auto opt = CreateOptimizer(kMomentumSgd);
  opt->LoadState(state);
  EXPECT_EQ(opt->SaveState(), state);
  EXPECT_EQ(opt->UpdateCount(5), 2u);
  EXPECT_EQ(opt->learning_rate(), 0.25);
  // mom = 0.9*mom - 0.25*g; w += mom, with g = 0: w = 10 - 0.9, 10 + 0.45.
  std::vector<float> w{10.f, 10.f};
  opt->Update(5, w, std::vector<float>{0.f, 0.f});
  EXPECT_EQ(w, (std::vector<float>{10.f - 0.9f, 10.f + 0.45f}));
  EXPECT_EQ(opt->UpdateCount(5), 3u);
}

TEST(OptimizerStateTest, HostileStatesAreRefusedWithAReason) {
  const uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  const struct {
    const char* label;
    std::string bytes;
    const char* message;
  } cases[] = {
      {"empty", "", "magic"},
      {"wrong magic", "XTOS" + StateBuilder::Header().out.substr(4), "magic"},
      {"other version", StateBuilder::Header("sgd", 1, 0.1, 3).U64(0).out, "version 3"},
      {"no rate changes in version 2", StateBuilder::Header("sgd", 1, 0.1, 2).U64(0).out,
       "claims 0 rate changes"},
      {"rate change from update 0",
       StateBuilder::Header("sgd", 1, 0.1, 2).U64(1).U64(0).F64(0.1).U64(0).out, "from update 0"},
      {"rate changes out of order",
       StateBuilder::Header("sgd", 1, 0.1, 2).U64(2).U64(5).F64(0.1).U64(5).F64(0.2).U64(0).out,
       "from update 5"},
      {"negative changed rate",
       StateBuilder::Header("sgd", 1, 0.1, 2).U64(1).U64(3).F64(-1).U64(0).out,
       "changed learning rate"},
      {"huge rate change count", StateBuilder::Header("sgd", 1, 0.1, 2).U64(kHuge).out,
       "claims 18446744073709551615 rate changes"},
      {"version 0", StateBuilder::Header("sgd", 1, 0.1, 0).U64(0).out, "version 0"},
      {"other optimizer", StateBuilder::Header("adam", 2).U64(0).out, "state of optimizer 'adam'"},
      {"unprintable name", StateBuilder::Header(std::string("s\0\xff", 3)).U64(0).out,
       "another optimizer"},
      {"empty name", StateBuilder::Header("").U64(0).out, "name is 0 bytes"},
      {"huge name", StateBuilder().Raw("DTOS").U32(1).U32(0xffffffff).out, "4294967295 bytes"},
      {"name past the end", StateBuilder().Raw("DTOS").U32(1).U32(60).Raw("sgd").out, "cut short"},
      {"other variant", StateBuilder::Header("sgd", 0).U64(0).out, "0 state buffers"},
      {"NaN rate", StateBuilder::Header("sgd", 1, std::nan("")).U64(0).out, "learning rate"},
      {"negative rate", StateBuilder::Header("sgd", 1, -0.5).U64(0).out, "learning rate"},
      {"infinite rate",
       StateBuilder::Header("sgd", 1, std::numeric_limits<double>::infinity()).U64(0).out,
       "learning rate"},
      {"rate beyond float32", StateBuilder::Header("sgd", 1, 1e300).U64(0).out, "learning rate"},
      {"huge index count", StateBuilder::Header().U64(kHuge).out, "claims 18446744073709551615"},
      {"index count past the end", StateBuilder::Header().U64(2).U64(1).U64(1).U64(0).out,
       "claims 2 indexes"},
      {"huge length", StateBuilder::Header().U64(1).U64(1).U64(1).U64(kHuge).out,
       "claims 18446744073709551615 elements"},
      {"length times 4 wraps", StateBuilder::Header().U64(1).U64(1).U64(1).U64(kHuge / 4 + 1).out,
       "elements of state"},
      {"floats cut short", StateBuilder::Header().U64(1).U64(1).U64(1).U64(2).F32(1).out,
       "elements of state"},
      {"count beyond 2^53",
       StateBuilder::Header().U64(1).U64(1).U64((uint64_t{1} << 53) + 1).U64(0).out,
       "more than 2^53"},
      {"max count", StateBuilder::Header().U64(1).U64(1).U64(kHuge).U64(0).out, "more than 2^53"},
      {"duplicate index",
       StateBuilder::Header().U64(2).U64(4).U64(1).U64(0).U64(4).U64(1).U64(0).out,
       "index 4 follows index 4"},
      {"decreasing indexes",
       StateBuilder::Header().U64(2).U64(9).U64(1).U64(0).U64(4).U64(1).U64(0).out,
       "index 4 follows index 9"},
      {"trailing bytes", StateBuilder::Header().U64(0).Raw("x").out, "1 bytes follow the end"},
  };
  auto opt = CreateOptimizer(kMomentumSgd);
  std::vector<float> w{1.f}, g{1.f};
  opt->Update(1, w, g);
  const std::string before = opt->SaveState();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    EXPECT_THAT(InvalidArgumentFrom([&] { opt->LoadState(c.bytes); }), HasSubstr(c.message));
    EXPECT_EQ(opt->SaveState(), before);
  }
}

TEST(OptimizerStateTest, VariantsDoNotTakeEachOthersState) {
  const OptimizerSpec pairs[][2] = {
      {{"rmsprop", {}}, {"rmsprop", {{"centered", 1}}}},
      {{"sgd", {}}, {"sgd", {{"momentum", 0.9}}}},
      {{"adam", {}}, {"adagrad", {}}},
      {{"adagrad", {}}, {"rmsprop", {}}},  // one buffer each, but not the same rule
  };
  for (const auto& [a, b] : pairs) {
    SCOPED_TRACE(a.ToJson() + " vs " + b.ToJson());
    auto from = CreateOptimizer(a);
    auto to = CreateOptimizer(b);
    EXPECT_THROW(to->LoadState(from->SaveState()), InvalidArgument);
    EXPECT_THROW(from->LoadState(to->SaveState()), InvalidArgument);
  }
  // SGD and NAG share a state form: the momentum is the same quantity in MXNet's kernels.
  auto sgd = CreateOptimizer({"sgd", {{"momentum", 0.9}, {"nesterov", 1}}});
  auto nag = CreateOptimizer({"nag", {{"momentum", 0.9}}});
  std::vector<float> w{1.f}, g{1.f};
  sgd->Update(0, w, g);
  EXPECT_NO_THROW(nag->LoadState(sgd->SaveState()));
}

// ---- Random damage ----

// Whatever the bytes, LoadState either refuses them with InvalidArgument, leaving the optimizer
// as it was, or accepts them: then they are a canonical state (SaveState gives them back) that
// updates can continue from.
TEST(OptimizerStateTest, RandomMutationsLoadOrThrowInvalidArgument) {
  for (const optim_test::NamedSpec& variant : optim_test::EveryVariant()) {
    SCOPED_TRACE(variant.label);
    auto source = CreateOptimizer(variant.spec);
    std::mt19937 rng(23);
    Model model(rng);
    for (int round = 0; round < 3; ++round) model.Round(*source, rng, round);
    // Two rate changes: the state is version 2, whose list of changes mutates too.
    source->set_learning_rate_from(4, 0.5);
    source->set_learning_rate_from(9, 0.25);
    const std::string valid = source->SaveState();

    auto target = CreateOptimizer(variant.spec);
    std::vector<float> w0{1.f, 2.f}, g0{0.1f, 0.2f};
    target->Update(99, w0, g0);
    const std::string before = target->SaveState();

    std::uniform_int_distribution<int> byte(0, 255);
    auto position = [&](size_t size) {
      return std::uniform_int_distribution<size_t>(0, size - 1)(rng);
    };
    const uint64_t extremes[] = {
        0, 1, 2, 0x7fffffff, 0xffffffff, uint64_t{1} << 53, std::numeric_limits<uint64_t>::max()};
    constexpr int kMutations = 3000;
    int accepted = 0;
    for (int i = 0; i < kMutations; ++i) {
      std::string bytes = valid;
      const int mutations = 1 + i % 3;
      for (int m = 0; m < mutations && !bytes.empty(); ++m) {
        switch (std::uniform_int_distribution<int>(0, 6)(rng)) {
          case 0:  // flip one bit
            bytes[position(bytes.size())] ^= static_cast<char>(1 << (i % 8));
            break;
          case 1:  // overwrite one byte
            bytes[position(bytes.size())] = static_cast<char>(byte(rng));
            break;
          case 2:  // cut short
            bytes.resize(position(bytes.size()));
            break;
          case 3:  // insert a byte
            bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(position(bytes.size())),
                         static_cast<char>(byte(rng)));
            break;
          case 4:  // drop a byte
            bytes.erase(position(bytes.size()), 1);
            break;
          case 5:  // append junk
            bytes.append(1 + i % 9, static_cast<char>(byte(rng)));
            break;
          case 6: {  // an extreme 64-bit value somewhere (counts, lengths, indexes)
            const size_t at = position(bytes.size());
            const uint64_t v = extremes[static_cast<size_t>(i) % std::size(extremes)];
            for (size_t k = 0; k < 8 && at + k < bytes.size(); ++k) {
              bytes[at + k] = static_cast<char>(v >> (8 * k));
            }
            break;
          }
        }
      }
      try {
        target->LoadState(bytes);
      } catch (const InvalidArgument&) {
        ASSERT_EQ(target->SaveState(), before) << "mutation " << i << " changed the state";
        continue;
      } catch (const std::exception& e) {
        FAIL() << "mutation " << i << " threw something other than InvalidArgument: " << e.what();
      }
      ++accepted;
      ASSERT_EQ(target->SaveState(), bytes) << "mutation " << i << " loaded but does not re-save";
      // Updates go on from it, for whatever lengths it now holds for the model's indexes.
      for (size_t k = 0; k < model.indexes.size(); ++k) {
        std::vector<float> w(model.weights[k].size(), 0.5f), g(w.size(), 0.25f);
        try {
          target->Update(model.indexes[k], w, g);
        } catch (const InvalidArgument&) {  // the mutation changed this index's length
        }
      }
      target->LoadState(before);
    }
    // Most damage is caught; some (a float's bits, a count) is a valid other state.
    EXPECT_LT(accepted, kMutations / 2);
  }
}

}  // namespace
}  // namespace dtrain
