#include "causeway/runtime/accelerator.h"

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "causeway/kernels/builtin_kernels.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;
using ::causeway::testing::TestOptions;
using ::testing::HasSubstr;

// Builds a list that computes out = a + b over n floats.
std::shared_ptr<CommandList> AddList(Accelerator* acc, const std::shared_ptr<Buffer>& a,
                                     const std::shared_ptr<Buffer>& b, const std::shared_ptr<Buffer>& out,
                                     uint32_t n) {
  auto add = BuiltinKernel("add");
  EXPECT_TRUE(add.ok()) << add.status();
  auto list = acc->CreateCommandList("add");
  EXPECT_TRUE(list.ok());
  EXPECT_OK((*list)->Dispatch(*add, {a, b, out}, CountParams{n}, Groups1D(n, 256)));
  return *list;
}

// Tests upload, one dispatch and download against a CPU reference.
TEST(AcceleratorTest, AddMatchesCpu) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const uint32_t n = 1000;
  auto x = RandomFloats(n, 1), y = RandomFloats(n, 2);
  ASSERT_OK_AND_ASSIGN(auto a, acc->CreateBuffer(n * 4));
  ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(n * 4));
  ASSERT_OK_AND_ASSIGN(auto c, acc->CreateBuffer(n * 4));
  ASSERT_OK(acc->UploadSync(a, x.data(), n * 4));
  ASSERT_OK(acc->UploadSync(b, y.data(), n * 4));
  auto list = AddList(acc, a, b, c, n);
  ASSERT_OK(acc->Submit(list).Await());
  std::vector<float> out(n);
  ASSERT_OK(acc->DownloadSync(c, out.data(), n * 4));
  for (uint32_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(out[i], x[i] + y[i]) << i;
}

// Tests that a timed submission reports its device time once it retires:
// positive, growing with the work, and never for a submission whose input
// failed; untimed submissions of the same list still work.
TEST(AcceleratorTest, TimedSubmissionReportsDeviceTime) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  if (!acc->has_timestamps()) GTEST_SKIP() << "this queue has no timestamps";
  const uint32_t small = 256, large = 1 << 22;
  ASSERT_OK_AND_ASSIGN(auto a, acc->CreateBuffer(uint64_t{large} * 4));
  ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(uint64_t{large} * 4));
  ASSERT_OK_AND_ASSIGN(auto c, acc->CreateBuffer(uint64_t{large} * 4));
  auto small_list = AddList(acc, a, b, c, small);
  auto large_list = AddList(acc, a, b, c, large);
  std::atomic<int64_t> small_ns{-1}, large_ns{-1};
  std::atomic<int> calls{0};
  ASSERT_OK(acc->Submit(small_list).Await());  // untimed first: a recording without queries
  Future<> s = acc->Submit(small_list, {}, {[&](int64_t ns) { small_ns = ns, calls++; }});
  Future<> l = acc->Submit(large_list, {}, {[&](int64_t ns) { large_ns = ns, calls++; }});
  ASSERT_OK(s.Await());
  ASSERT_OK(l.Await());
  EXPECT_EQ(calls.load(), 2);
  EXPECT_GT(small_ns.load(), 0);
  // 16384 times the elements: far more than twice the time.
  EXPECT_GT(large_ns.load(), 2 * small_ns.load()) << small_ns.load() << " vs " << large_ns.load();

  // A failed input: the work never runs, nothing is reported.
  Promise<> host;
  Future<> failed_input = host.future();
  Future<> f = acc->Submit(small_list, {failed_input}, {[&](int64_t) { calls++; }});
  host.Set(absl::InternalError("input broke"));
  EXPECT_FALSE(f.Await().ok());
  ASSERT_OK(acc->Flush());
  EXPECT_EQ(calls.load(), 2);
}

// Tests that futures resolve in submission order and that a replayed list
// runs every time (an accumulating chain c = c + b).
TEST(AcceleratorTest, ReplayedListResolvesInOrder) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const uint32_t n = 300;
  std::vector<float> ones(n, 1.0f), zeros(n, 0.0f);
  ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(n * 4));
  ASSERT_OK_AND_ASSIGN(auto c, acc->CreateBuffer(n * 4));
  ASSERT_OK(acc->UploadSync(b, ones.data(), n * 4));
  ASSERT_OK(acc->UploadSync(c, zeros.data(), n * 4));
  auto list = AddList(acc, c, b, c, n);
  std::vector<Future<>> futures;
  std::vector<int> order;
  absl::Mutex mu;
  for (int i = 0; i < 50; ++i) {
    futures.push_back(acc->Submit(list));
    futures.back().OnReady([&, i](const absl::Status& s) {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    });
  }
  for (auto& f : futures) ASSERT_OK(f.Await());
  std::vector<float> out(n);
  ASSERT_OK(acc->DownloadSync(c, out.data(), n * 4));
  for (float v : out) ASSERT_EQ(v, 50.0f);
  absl::MutexLock lock(&mu);
  // Callbacks may still be running on the retiring thread after Await.
  auto all_called = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return order.size() == 50; };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_called), absl::Seconds(10)));
  std::vector<int> expected(50);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

}  // namespace
}  // namespace causeway
