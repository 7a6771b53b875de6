// The ring of in-flight submissions: backpressure, order, failures.
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "causeway/kernels/ops.h"
#include "causeway/runtime/accelerator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::TestOptions;
using ::testing::HasSubstr;

// A list that adds 1 to every element of `x` (x = x + ones).
struct Counter {
  std::shared_ptr<Buffer> x, ones;
  std::shared_ptr<CommandList> list;
  static constexpr uint32_t kN = 64;

  static Counter Make(Accelerator* acc) {
    Counter c;
    c.x = acc->CreateBuffer(kN * 4).value();
    c.ones = acc->CreateBuffer(kN * 4).value();
    std::vector<float> zeros(kN, 0.0f), ones(kN, 1.0f);
    EXPECT_OK(acc->UploadSync(c.x, zeros.data(), kN * 4));
    EXPECT_OK(acc->UploadSync(c.ones, ones.data(), kN * 4));
    c.list = acc->CreateCommandList("increment").value();
    EXPECT_OK(ops::Add(*c.list, c.x, c.ones, c.x, kN));
    return c;
  }
  float Read(Accelerator* acc) const {
    std::vector<float> out(kN);
    EXPECT_OK(acc->DownloadSync(x, out.data(), kN * 4));
    for (float v : out) EXPECT_EQ(v, out[0]);
    return out[0];
  }
};

// Tests that a full ring blocks the producer until a slot retires, and that
// the producer then resumes and everything completes in order.
TEST(RingTest, FullRingBlocksProducerAndResumes) {
  RuntimeOptions options = TestOptions(1);
  options.ring_capacity = 3;
  auto rt = MakeRuntime(options);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  Counter c = Counter::Make(acc);

  // The first submission waits on a host promise, so nothing can retire.
  auto [gate, gate_future] = MakePromise<>();
  std::vector<Future<>> futures;
  futures.push_back(acc->Submit(c.list, {gate_future}));
  futures.push_back(acc->Submit(c.list));
  futures.push_back(acc->Submit(c.list));
  EXPECT_EQ(acc->in_flight(), 3u);

  std::atomic<bool> returned{false};
  Future<> fourth;
  std::thread producer([&] {
    fourth = acc->Submit(c.list);
    returned = true;
  });
  // The producer found the ring full; with the gate shut no slot can retire,
  // so it must still be in Submit.
  acc->AwaitRingFullForTesting(1);
  EXPECT_FALSE(returned.load()) << "Submit returned while the ring was full";
  EXPECT_FALSE(futures[0].IsReady());
  EXPECT_EQ(acc->in_flight(), 3u);

  gate.Set(absl::OkStatus());
  producer.join();
  EXPECT_TRUE(returned.load());
  futures.push_back(fourth);
  for (auto& f : futures) ASSERT_OK(f.AwaitFor(absl::Seconds(30)));
  EXPECT_EQ(c.Read(acc), 4.0f);
  EXPECT_EQ(acc->in_flight(), 0u);
}

// Tests that futures resolve in submission order, seen from callbacks.
TEST(RingTest, FuturesResolveInSubmissionOrder) {
  RuntimeOptions options = TestOptions(1);
  options.ring_capacity = 8;
  auto rt = MakeRuntime(options);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  Counter c = Counter::Make(acc);
  absl::Mutex mu;
  std::vector<int> order;
  std::vector<Future<>> futures;
  for (int i = 0; i < 100; ++i) {
    futures.push_back(acc->Submit(c.list));
    futures.back().OnReady([&, i](const absl::Status&) {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    });
    // Await some in the middle, so the awaiting thread retires slots too.
    if (i % 7 == 3) ASSERT_OK(futures.back().Await());
  }
  for (auto& f : futures) ASSERT_OK(f.Await());
  std::vector<int> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  absl::MutexLock lock(&mu);
  // Await returns once a future is resolved; its callbacks may still be
  // running on the retiring thread.
  auto all_called = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return order.size() == 100; };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_called), absl::Seconds(10)));
  EXPECT_EQ(order, expected);
  EXPECT_EQ(acc->retired_value(), acc->submitted_value());
}

// Tests that an injected submission failure fails exactly that future and the
// futures that depend on it, while the others succeed and the accelerator
// keeps working.
TEST(RingTest, InjectedSubmitFailureFailsTheRightFutures) {
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  Accelerator* a0 = rt->accelerator(0);
  Accelerator* a1 = rt->accelerator(1);
  Counter c0 = Counter::Make(a0);
  Counter c1 = Counter::Make(a1);

  a0->faults().fail_submit_countdown = 2;  // the second submission from now
  Future<> f1 = a0->Submit(c0.list);
  Future<> f2 = a0->Submit(c0.list);
  Future<> f3 = a0->Submit(c0.list);
  Future<> dependent = a1->Submit(c1.list, {f2});       // another device, through the relay
  Future<> independent = a1->Submit(c1.list, {f3});
  Future<> same_queue_dependent = a0->Submit(c0.list, {f2});

  EXPECT_OK(f1.Await());
  absl::Status s2 = f2.Await();
  EXPECT_TRUE(absl::IsResourceExhausted(s2)) << s2;
  EXPECT_THAT(std::string(s2.message()), HasSubstr("vkQueueSubmit"));
  EXPECT_OK(f3.Await());
  absl::Status sd = dependent.Await();
  EXPECT_FALSE(sd.ok());
  EXPECT_THAT(std::string(sd.message()), HasSubstr("input"));
  EXPECT_OK(independent.Await());
  EXPECT_FALSE(same_queue_dependent.Await().ok());

  // Two increments ran on a0 (f1, f3); one on a1 (independent).
  EXPECT_EQ(c0.Read(a0), 2.0f);
  EXPECT_EQ(c1.Read(a1), 1.0f);
  ASSERT_OK(a0->Submit(c0.list).Await());
  EXPECT_EQ(c0.Read(a0), 3.0f);
  EXPECT_OK(a0->health());
}

// Tests that a lost device fails every in-flight future (none hangs), that
// later submissions fail at once, and that other accelerators carry on.
TEST(RingTest, LostDeviceFailsFuturesWithoutHanging) {
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  Accelerator* a0 = rt->accelerator(0);
  Accelerator* a1 = rt->accelerator(1);
  Counter c0 = Counter::Make(a0);
  Counter c1 = Counter::Make(a1);

  auto [gate, gate_future] = MakePromise<>();
  Future<> held = a0->Submit(c0.list, {gate_future});
  Future<> behind = a0->Submit(c0.list);
  Future<> on_peer = a1->Submit(c1.list, {behind});
  a0->faults().lose_device_countdown = 1;

  absl::Status s = held.AwaitFor(absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("lost"));
  EXPECT_TRUE(absl::IsUnavailable(behind.AwaitFor(absl::Seconds(10))));
  EXPECT_FALSE(on_peer.AwaitFor(absl::Seconds(10)).ok());
  EXPECT_TRUE(absl::IsUnavailable(a0->Submit(c0.list).AwaitFor(absl::Seconds(1))));
  EXPECT_FALSE(a0->health().ok());

  ASSERT_OK(a1->Submit(c1.list).AwaitFor(absl::Seconds(10)));
  EXPECT_OK(a1->health());
  gate.Set(absl::OkStatus());
}

// Tests that accelerators of one VkDevice, each waiting on the other's
// timeline, retire without deadlock when one starts retiring while the
// other's later work is done but unretired: A's x waits on B's y, and B's z
// on A's w (after x). Retiring A needs y resolved; retiring B up to z needs
// w. Seen to deadlock when a retiring accelerator drove the other's
// retirement under its own retire lock.
TEST(RingTest, CrossDependenciesOnOneVkDeviceRetireWithoutDeadlock) {
  RuntimeOptions options = TestOptions(2);
  options.sharing = "one-device";
  auto rt = MakeRuntime(options);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  Counter ca = Counter::Make(a);
  Counter cb = Counter::Make(b);
  // B's counter is read through its mapping, which retires nothing.
  ASSERT_NE(cb.x->mapped(), nullptr);
  for (int round = 1; round <= 20; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto [gate, opened] = MakePromise<>();
    Future<> y = b->Submit(cb.list, {opened});
    Future<> x = a->Submit(ca.list, {y});
    Future<> w = a->Submit(ca.list);
    Future<> z = b->Submit(cb.list, {w});
    gate.Set(absl::OkStatus());
    // Everything has run on the device (z last) before anything retires.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    float got = 0;
    while (absl::Now() < deadline) {
      std::memcpy(&got, cb.x->mapped(), sizeof(got));
      if (got >= 2.0f * round) break;
      absl::SleepFor(absl::Microseconds(100));
    }
    ASSERT_EQ(got, 2.0f * round);
    // A retires first: its x finds B's y done and unretired.
    ::causeway::testing::RunConcurrently({[&] {
                                           EXPECT_OK(w.Await(absl::Now() + absl::Seconds(20)));
                                           EXPECT_OK(z.Await(absl::Now() + absl::Seconds(20)));
                                         }},
                                         absl::Seconds(30), "retiring across one VkDevice");
    EXPECT_OK(x.Await(absl::Now() + absl::Seconds(1)));
    EXPECT_OK(y.Await(absl::Now() + absl::Seconds(1)));
  }
  EXPECT_EQ(ca.Read(a), 40.0f);
  EXPECT_EQ(cb.Read(b), 40.0f);
}

// Tests that a host future that fails fails the submission waiting on it.
TEST(RingTest, FailedHostFutureFailsTheSubmission) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  Counter c = Counter::Make(acc);
  auto [p, hf] = MakePromise<>();
  Future<> f = acc->Submit(c.list, {hf});
  Future<> after = acc->Submit(c.list);
  p.Set(absl::DataLossError("upstream broke"));
  absl::Status s = f.AwaitFor(absl::Seconds(10));
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("upstream broke"));
  EXPECT_OK(after.AwaitFor(absl::Seconds(10)));
}

// Tests that Await with a deadline returns DeadlineExceeded and leaves the
// future to resolve later.
TEST(RingTest, AwaitDeadline) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  Counter c = Counter::Make(acc);
  auto [p, hf] = MakePromise<>();
  Future<> f = acc->Submit(c.list, {hf});
  EXPECT_TRUE(absl::IsDeadlineExceeded(f.AwaitFor(absl::Milliseconds(50))));
  EXPECT_FALSE(f.IsReady());
  p.Set(absl::OkStatus());
  EXPECT_OK(f.AwaitFor(absl::Seconds(10)));
}

}  // namespace
}  // namespace causeway
