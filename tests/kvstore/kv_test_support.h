// Helpers shared by the KVStore unit tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "kvstore/kvstore.h"

namespace dtrain::kvtest {

inline Array Floats(std::vector<float> v, Shape shape = {}) { return Array::FromFloats(v, shape); }

// The message of the InvalidArgument `f` throws; a test failure if it throws nothing or
// something else.
inline std::string InvalidArgumentFrom(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something else than InvalidArgument: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

inline std::vector<float> PullVector(KVStore& kv, Key key, Shape shape) {
  Array out(shape);
  Operation op = kv.Pull(key, {out});
  op.Wait();
  return out.ToVector();
}

}  // namespace dtrain::kvtest
