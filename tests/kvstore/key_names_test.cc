// String keys: hashed into their own range, the same in every process, named in errors.
#include "kvstore/key_names.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "dtrain/common/error.h"
#include "kvstore/local_kvstore.h"
#include "support/invalid_argument_from.h"

namespace dtrain {
namespace {

TEST(KeyNames, ANameAlwaysGivesTheSameKeyInTheNamedRange) {
  const Key a = KeyOfName("fc1.weight");
  EXPECT_EQ(KeyOfName("fc1.weight"), a);
  EXPECT_GE(a, kFirstNamedKey);
  EXPECT_LT(a, 2 * kFirstNamedKey);  // below 2^44: the servers' optimizer index has room
  // FNV-1a is fixed, so every process and every run agrees (this value is part of the protocol).
  EXPECT_EQ(KeyOfName("a"),
            kFirstNamedKey + static_cast<Key>(0xaf63dc4c8601ec8cull % (1ull << 43)));
}

TEST(KeyNames, DistinctNamesGetDistinctKeys) {
  std::set<Key> keys;
  for (int i = 0; i < 10000; ++i) keys.insert(KeyOfName("layer" + std::to_string(i) + ".weight"));
  EXPECT_EQ(keys.size(), 10000u);
}

TEST(KeyNames, LabelsNameStringsAndNumberInts) {
  EXPECT_EQ(KeyLabel(KeyOfName("conv1.bias")), "'conv1.bias'");
  EXPECT_EQ(KeyLabel(3), "3");
}

TEST(KeyNames, BadNamesAndKeysAreInvalidArguments) {
  EXPECT_THROW(KeyOfName(""), InvalidArgument);
  EXPECT_THROW(KeyOfName(std::string(1025, 'x')), InvalidArgument);
  EXPECT_NO_THROW(CheckKey(0));
  EXPECT_NO_THROW(CheckKey(kFirstNamedKey - 1));
  EXPECT_NO_THROW(CheckKey(KeyOfName("known")));
  EXPECT_THROW(CheckKey(-1), InvalidArgument);
  EXPECT_THROW(CheckKey(kFirstNamedKey + 12345), InvalidArgument);  // no name behind it
}

TEST(KeyNames, StoreErrorsNameTheString) {
  LocalKVStore kv("local");
  const Key w = KeyOfName("dense.weight");
  kv.Init(w, Array(Shape{3}));
  const std::string twice = test_support::InvalidArgumentFrom([&] { kv.Init(w, Array(Shape{3})); });
  EXPECT_NE(twice.find("'dense.weight'"), std::string::npos) << twice;
  const std::string shape =
      test_support::InvalidArgumentFrom([&] { kv.Push(w, {Array(Shape{4})}); });
  EXPECT_NE(shape.find("'dense.weight'"), std::string::npos) << shape;
  EXPECT_THROW(kv.Init(-5, Array(Shape{1})), InvalidArgument);
}

}  // namespace
}  // namespace dtrain
