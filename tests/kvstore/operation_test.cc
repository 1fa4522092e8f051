#include "dtrain/kvstore/operation.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

#include "dtrain/common/error.h"
#include "kvstore/operation_state.h"

namespace dtrain {
namespace {

std::shared_ptr<OperationState> Pending(int parts) {
  return std::make_shared<OperationState>("test operation", parts, std::chrono::seconds(10));
}

TEST(Operation, OnDoneRunsOnceEveryPartIsDone) {
  auto a = Pending(1), b = Pending(2);
  Operation both = Operation::Combine({Operation(a), Operation(b)});
  int calls = 0;
  std::exception_ptr seen = std::make_exception_ptr(std::runtime_error("not called"));
  both.OnDone([&](std::exception_ptr error) {
    ++calls;
    seen = error;
  });
  a->PartDone();
  b->PartDone();
  EXPECT_EQ(calls, 0);
  std::thread last([&] { b->PartDone(); });  // on the thread that finishes it
  last.join();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, nullptr);
}

TEST(Operation, OnDoneHandsOnTheError) {
  auto a = Pending(1);
  a->PartDone(std::make_exception_ptr(PeerError("server 0 at 10.0.0.1:9000 failed")));
  std::exception_ptr seen;
  Operation(a).OnDone([&](std::exception_ptr error) { seen = error; });  // already done: at once
  ASSERT_NE(seen, nullptr);
  EXPECT_THROW(std::rethrow_exception(seen), PeerError);
}

TEST(Operation, OnDoneOfACompleteOperationRunsAtOnce) {
  bool ran = false;
  Operation().OnDone([&](std::exception_ptr error) { ran = error == nullptr; });
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace dtrain
