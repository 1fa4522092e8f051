// Helpers shared by the KVStore unit tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/kvstore/kvstore.h"
#include "support/invalid_argument_from.h"

namespace dtrain::kvtest {

using test_support::InvalidArgumentFrom;

inline Array Floats(std::vector<float> v, Shape shape = {}) { return Array::FromFloats(v, shape); }

inline std::vector<float> PullVector(KVStore& kv, Key key, Shape shape) {
  Array out(shape);
  Operation op = kv.Pull(key, {out});
  op.Wait();
  return out.ToVector();
}

}  // namespace dtrain::kvtest
