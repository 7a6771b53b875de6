#include "causeway/base/future.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace causeway {
namespace {

// Tests that a value set on another thread reaches Await.
TEST(FutureTest, AwaitSeesValueFromAnotherThread) {
  auto [p, f] = MakePromise<int>();
  std::thread t([p = std::move(p)]() mutable { p.Set(42); });
  absl::StatusOr<int> v = f.Await();
  t.join();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
  EXPECT_TRUE(f.IsReady());
}

// Tests that an error travels as a status, and that the first result wins.
TEST(FutureTest, ErrorsAreCarriedAndFirstSetWins) {
  auto [p, f] = MakePromise<>();
  EXPECT_TRUE(p.Set(absl::InternalError("broken")));
  EXPECT_FALSE(p.Set(absl::OkStatus()));
  absl::Status s = f.Await();
  EXPECT_TRUE(absl::IsInternal(s));
  EXPECT_EQ(s.message(), "broken");
}

// Tests that Await with a deadline times out without resolving the future.
TEST(FutureTest, DeadlineExceededLeavesFutureOpen) {
  auto [p, f] = MakePromise<std::string>();
  absl::Time start = absl::Now();
  auto r = f.AwaitFor(absl::Milliseconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status()));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(25));
  EXPECT_FALSE(f.IsReady());
  p.Set(std::string("late"));
  EXPECT_EQ(*f.Await(), "late");
}

// Tests that callbacks run once: inline when already resolved, otherwise on
// the resolving thread, in the order they were added.
TEST(FutureTest, OnReadyRunsOnceInOrder) {
  auto [p, f] = MakePromise<int>();
  std::vector<int> seen;
  std::thread::id resolver;
  std::thread::id ran_on;
  f.OnReady([&](const absl::StatusOr<int>& v) { seen.push_back(*v); ran_on = std::this_thread::get_id(); });
  f.OnReady([&](const absl::StatusOr<int>& v) { seen.push_back(*v + 1); });
  std::thread t([&, p = std::move(p)]() mutable {
    resolver = std::this_thread::get_id();
    p.Set(7);
  });
  t.join();
  EXPECT_EQ(seen, (std::vector<int>{7, 8}));
  EXPECT_EQ(ran_on, resolver);
  f.OnReady([&](const absl::StatusOr<int>& v) { seen.push_back(*v + 2); });  // already ready: inline
  EXPECT_EQ(seen, (std::vector<int>{7, 8, 9}));
}

// Tests that dropping a promise unresolved cancels its future instead of
// leaving waiters hanging.
TEST(FutureTest, DroppedPromiseCancels) {
  Future<> f;
  {
    auto [p, fut] = MakePromise<>();
    f = fut;
  }
  EXPECT_TRUE(absl::IsCancelled(f.AwaitFor(absl::Seconds(5))));
}

// Tests that many waiters on one future all wake.
TEST(FutureTest, ManyWaitersWake) {
  auto [p, f] = MakePromise<>();
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 8; ++i) {
    waiters.emplace_back([&, f = f] {
      if (f.Await().ok()) woke++;
    });
  }
  // Every waiter is blocked in Await before the promise is set.
  f.AwaitWaitersForTesting(8);
  EXPECT_EQ(woke.load(), 0);
  p.Set(absl::OkStatus());
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 8);
}

// Tests Ready futures and the invalid default.
TEST(FutureTest, ReadyAndInvalid) {
  Future<int> ready = Future<int>::Ready(5);
  EXPECT_TRUE(ready.IsReady());
  EXPECT_EQ(*ready.Await(), 5);
  Future<int> none;
  EXPECT_FALSE(none.valid());
}

// A driver that resolves on Wait, standing in for an accelerator's ring.
class FakeDriver : public TimelineDriver {
 public:
  void WaitFor(uint64_t value, absl::Time) override {
    waited_for = value;
    promise->Set(absl::OkStatus());
  }
  void WantCompletion(uint64_t value) override { wanted = value; }
  Promise<>* promise = nullptr;
  uint64_t waited_for = 0, wanted = 0;
};

// Tests that a device future's Await asks its driver to wait (so the waiter
// retires the work itself) and OnReady asks it to complete unawaited.
TEST(FutureTest, TimelineDriverIsAskedToWaitAndComplete) {
  FakeDriver driver;
  Promise<> p;
  driver.promise = &p;
  p.SetTimeline(&driver, 17);
  Future<> f = p.future();
  EXPECT_EQ(f.timeline_driver(), &driver);
  EXPECT_EQ(f.timeline_value(), 17u);
  bool called = false;
  f.OnReady([&](const absl::Status& s) { called = s.ok(); });
  EXPECT_EQ(driver.wanted, 17u);
  EXPECT_TRUE(f.Await().ok());
  EXPECT_EQ(driver.waited_for, 17u);
  EXPECT_TRUE(called);
}

}  // namespace
}  // namespace causeway
