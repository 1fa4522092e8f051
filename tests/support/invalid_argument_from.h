// Shared by the unit tests of every module: the message of the InvalidArgument a call throws.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

#include "dtrain/common/error.h"

namespace dtrain::test_support {

// Runs `f`, which must throw InvalidArgument, and returns the message; a test failure if it
// throws nothing or something else.
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

}  // namespace dtrain::test_support
