#include "causeway/runtime/watchdog.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "causeway/kernels/builtin_kernels.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::TestOptions;
using ::testing::HasSubstr;

// Collects a watchdog's lines.
class Lines {
 public:
  Watchdog::Report Sink() {
    return [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(line);
    };
  }
  std::vector<std::string> Get() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  // Waits until there are `n` lines, at most `limit`.
  bool AwaitCount(size_t n, absl::Duration limit) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return lines_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), limit);
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// A list that fills `n` words of `buffer`: work that retires at once.
std::shared_ptr<CommandList> FillList(Accelerator* acc, const std::shared_ptr<Buffer>& buffer,
                                      std::string label) {
  auto list = acc->CreateCommandList(std::move(label));
  EXPECT_TRUE(list.ok()) << list.status();
  EXPECT_OK((*list)->Fill(buffer, 7));
  return *list;
}

// Tests that the watchdog reports an accelerator whose oldest submission has
// not retired for its period, naming the accelerator and the submission,
// once; and never reports a busy accelerator that keeps retiring work.
TEST(WatchdogTest, ReportsAStuckAcceleratorOnceAndNotABusyOne) {
  RuntimeOptions options = TestOptions(2);
  options.watchdog = absl::InfiniteDuration();  // this test makes its own
  auto rt = MakeRuntime(options);
  ASSERT_NE(rt, nullptr);
  Accelerator* stuck = rt->accelerator(0);
  Accelerator* busy = rt->accelerator(1);
  ASSERT_OK_AND_ASSIGN(auto a, stuck->CreateBuffer(1024));
  ASSERT_OK_AND_ASSIGN(auto b, busy->CreateBuffer(1024));
  // The period: a retirement on the busy accelerator is a few ms apart even
  // under TSan on a loaded machine; 2 s leaves a stall of that long (which
  // would be a real report) far out of reach.
  constexpr absl::Duration kPeriod = absl::Seconds(2);
  Lines lines;
  Watchdog dog({stuck, busy}, kPeriod, lines.Sink());

  // Stuck: the submission waits for a host future the test resolves later,
  // so the accelerator has work in flight and retires nothing meanwhile.
  Promise<> gate;
  Future<> held =
      stuck->Submit(FillList(stuck, a, "held-by-gate"), {gate.future()},
                    SubmitOptions{.what = "gang call 'g' (kernel 'k') of program 'p' for client 'c'"});
  // Busy: a stream of submissions, each retiring before the next, for twice
  // the period and more, until the stuck one has been reported.
  std::atomic<bool> stop{false};
  std::atomic<int> retired{0};
  std::thread worker([&] {
    auto list = FillList(busy, b, "busy");
    const absl::Time until = absl::Now() + 2 * kPeriod + absl::Milliseconds(500);
    while (!stop.load() || absl::Now() < until) {
      EXPECT_OK(busy->Submit(list).Await());
      retired.fetch_add(1);
    }
  });
  ASSERT_TRUE(lines.AwaitCount(1, 10 * kPeriod)) << "no report for the stuck accelerator";
  stop.store(true);
  worker.join();
  const std::vector<std::string> got = lines.Get();
  ASSERT_EQ(got.size(), 1u) << ::testing::PrintToString(got);
  EXPECT_THAT(got[0],
              HasSubstr(absl::StrCat("causeway: watchdog: ", stuck->name(), " has finished nothing for ")));
  EXPECT_THAT(
      got[0],
      HasSubstr("its oldest unfinished submission: gang call 'g' (kernel 'k') of program 'p' for client 'c', "
                "in flight for "));
  EXPECT_GT(retired.load(), 10);
  EXPECT_FALSE(held.IsReady());

  // Once it retires, the accelerator is no longer stuck; a later stuck
  // submission, labelled by its list alone, is reported anew.
  gate.Set(absl::OkStatus());
  ASSERT_OK(held.Await());
  Promise<> gate2;
  Future<> held2 = stuck->Submit(FillList(stuck, a, "second-held"), {gate2.future()});
  ASSERT_TRUE(lines.AwaitCount(2, 10 * kPeriod));
  gate2.Set(absl::OkStatus());
  ASSERT_OK(held2.Await());
  const std::vector<std::string> after = lines.Get();
  ASSERT_EQ(after.size(), 2u) << ::testing::PrintToString(after);
  EXPECT_THAT(after[1], HasSubstr("its oldest unfinished submission: 'second-held', in flight for "));
  EXPECT_EQ(dog.reports(), 2);
}

// Tests that a runtime keeps a watchdog unless told not to, and refuses a
// period that is not > 0.
TEST(WatchdogTest, RuntimeOptionChecksThePeriod) {
  RuntimeOptions options = TestOptions(1);
  options.watchdog = absl::ZeroDuration();
  auto rt = Runtime::Create(options);
  EXPECT_ERROR(rt.status(), absl::StatusCode::kInvalidArgument, "the watchdog's period must be > 0, got 0");
}

// Tests what OldestInFlight says: nothing when idle; the oldest submission,
// how many are in flight and since when otherwise.
TEST(WatchdogTest, OldestInFlightDescribesTheHeadOfTheRing) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  EXPECT_FALSE(acc->OldestInFlight().has_value());
  ASSERT_OK_AND_ASSIGN(auto a, acc->CreateBuffer(1024));
  Promise<> gate;
  Future<> first = acc->Submit(FillList(acc, a, "first"), {gate.future()});
  Future<> second = acc->Submit(FillList(acc, a, "second"), {}, SubmitOptions{.what = "the second"});
  std::optional<WorkInFlight> work = acc->OldestInFlight();
  ASSERT_TRUE(work.has_value());
  EXPECT_EQ(work->what, "'first'");
  EXPECT_EQ(work->in_flight, 2u);
  EXPECT_EQ(work->value, acc->submitted_value() - 1);
  EXPECT_GE(work->since_submit, absl::ZeroDuration());
  EXPECT_THAT(DescribeWorkInFlight(*work), HasSubstr("'first', in flight for "));
  EXPECT_THAT(DescribeWorkInFlight(*work), HasSubstr("(2 submissions in flight)"));
  gate.Set(absl::OkStatus());
  ASSERT_OK(second.Await());
  EXPECT_OK(first.Await());
  EXPECT_FALSE(acc->OldestInFlight().has_value());
}

}  // namespace
}  // namespace causeway
