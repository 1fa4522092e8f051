#include "dtrain/kvstore/operation.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "dtrain/common/error.h"
#include "kvstore/operation_state.h"
#include "support/thread_cpu_time.h"

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

// The waiting thread's CPU time while another thread finishes the operation 200 ms later.
std::chrono::microseconds CpuWhileWaiting(std::chrono::microseconds spin) {
  auto op = std::make_shared<OperationState>("test operation", 1, std::chrono::seconds(10), spin);
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    op->PartDone();
  });
  const auto before = test_support::ThreadCpuTime();
  const auto start = std::chrono::steady_clock::now();
  op->Wait();
  const auto cpu = test_support::ThreadCpuTime() - before;
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
  finisher.join();
  return cpu;
}

TEST(Operation, AWaitThatPolledStillTimesOutAtItsDeadline) {
  auto op = std::make_shared<OperationState>("test operation", 1, std::chrono::seconds(10),
                                             std::chrono::microseconds(200000));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(op->Wait(std::chrono::milliseconds(100)), TimeoutError);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(100));
  EXPECT_LT(took, std::chrono::milliseconds(190));  // not the poll's 200 ms, nor 100 + 100
}

TEST(Operation, AWaitPollsForTheSpinTimeThenSleeps) {
  // Polling yields the core, so another busy thread may take some of the 40 ms; a wait that
  // sleeps at once takes next to no CPU at all, and one that polled on past its time ~200 ms.
  const auto polled = CpuWhileWaiting(std::chrono::microseconds(40000));
  EXPECT_GE(polled, std::chrono::microseconds(2000));
  EXPECT_LE(polled, std::chrono::microseconds(150000));
  EXPECT_LE(CpuWhileWaiting(std::chrono::microseconds(0)), std::chrono::microseconds(1500));
}

}  // namespace
}  // namespace dtrain
