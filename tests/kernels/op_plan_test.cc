// Operations as data (causeway/kernels/op_plan.h): PushBytes' layout, and Record
// binding a hand-written plan's operands launch by launch (an operand bound
// twice, in another order than the plan's), run on lavapipe; and Record's
// checks, each with its own error, none of which appends anything.
#include "causeway/kernels/op_plan.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway::ops {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::ElementsAre;

// The push constants of the `scale` kernel (causeway/shaders/scale.comp).
struct ScaleParams {
  uint32_t count;
  float alpha;
};

// Tests that PushBytes gives the parameter block's bytes as laid out in
// memory (little-endian on every host Causeway runs on).
TEST(PushBytesTest, CopiesTheBlock) {
  // 2.0f is 0x40000000.
  EXPECT_THAT(PushBytes(ScaleParams{7, 2.0f}), ElementsAre(7, 0, 0, 0, 0, 0, 0, 0x40));
  EXPECT_THAT(PushBytes(uint32_t{0x01020304}), ElementsAre(4, 3, 2, 1));
}

constexpr uint32_t kCount = 5;

// y = 3 x in two launches: tmp = 2 x (scale), then y = tmp + x (add, which
// binds x a second time and binds the operands in another order than the
// plan lists them).
OpPlan TripleX() {
  OpPlan plan{"triple 5", {{"x", kCount * 4}, {"tmp", kCount * 4}, {"y", kCount * 4}}, {}};
  plan.launches.push_back({"scale", {0, 1}, PushBytes(ScaleParams{kCount, 2.0f}), {1, 1, 1}, {}});
  plan.launches.push_back({"add", {1, 0, 2}, PushBytes(uint32_t{kCount}), {1, 1, 1}, {}});
  return plan;
}

class OpPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime();
    ASSERT_NE(rt_, nullptr);
    acc_ = rt_->accelerator(0);
    ASSERT_OK_AND_ASSIGN(list_, acc_->CreateCommandList("op_plan_test"));
  }
  std::shared_ptr<Buffer> Floats(const std::vector<float>& values) {
    auto buffer = acc_->CreateBuffer(values.size() * 4);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return nullptr;
    EXPECT_OK(acc_->UploadSync(*buffer, values.data(), values.size() * 4));
    return *buffer;
  }

  std::unique_ptr<Runtime> rt_;
  Accelerator* acc_ = nullptr;
  std::shared_ptr<CommandList> list_;
};

// Tests that Record appends each launch with its operands bound as the
// launch lists them: the result is 3 x, which needs both launches, x bound
// twice and tmp read after it was written.
TEST_F(OpPlanTest, RecordsLaunchesWithTheirOperands) {
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 100.0f, -0.25f};
  auto in = Floats(x);
  auto tmp = Floats(std::vector<float>(kCount, -7.0f));
  // y is larger than the plan needs: the rest stays as it was.
  auto out = Floats(std::vector<float>(kCount + 1, -9.0f));
  ASSERT_OK(Record(*list_, TripleX(), {in, tmp, out}));
  EXPECT_EQ(list_->size(), 2u);
  ASSERT_OK(acc_->Submit(list_).Await());
  std::vector<float> y(kCount + 1), t(kCount);
  ASSERT_OK(acc_->DownloadSync(out, y.data(), y.size() * 4));
  ASSERT_OK(acc_->DownloadSync(tmp, t.data(), t.size() * 4));
  EXPECT_THAT(y, ElementsAre(3.0f, -6.0f, 1.5f, 300.0f, -0.75f, -9.0f));
  EXPECT_THAT(t, ElementsAre(2.0f, -4.0f, 1.0f, 200.0f, -0.5f));
}

// Tests that an operand may be a range of a larger buffer, bound at its
// offset.
TEST_F(OpPlanTest, OperandsMayBeRanges) {
  // x at floats [2, 7) of a buffer of 8; an offset of 16 bytes is aligned
  // for storage buffers on lavapipe.
  ASSERT_LE(acc_->info().limits.minStorageBufferOffsetAlignment, 16u);
  auto in = Floats({9, 9, 9, 9, 1, 2, 3, 4, 5, 9});
  auto tmp = Floats(std::vector<float>(kCount, 0.0f));
  auto out = Floats(std::vector<float>(kCount, 0.0f));
  ASSERT_OK(Record(*list_, TripleX(), {BufferArg(in, 16, kCount * 4), tmp, out}));
  ASSERT_OK(acc_->Submit(list_).Await());
  std::vector<float> y(kCount);
  ASSERT_OK(acc_->DownloadSync(out, y.data(), y.size() * 4));
  EXPECT_THAT(y, ElementsAre(3.0f, 6.0f, 9.0f, 12.0f, 15.0f));
}

// Tests each of Record's checks: its error names the plan and the operand,
// and nothing is appended to the list.
TEST_F(OpPlanTest, RefusesBadBindingsAndAppendsNothing) {
  auto in = Floats(std::vector<float>(kCount, 1.0f));
  auto tmp = Floats(std::vector<float>(kCount, 0.0f));
  auto small = Floats(std::vector<float>(kCount - 1, 0.0f));
  auto out = Floats(std::vector<float>(kCount, 0.0f));
  EXPECT_ERROR(Record(*list_, TripleX(), {in, tmp}), absl::StatusCode::kInvalidArgument,
               "triple 5: takes 3 buffers, given 2");
  EXPECT_ERROR(Record(*list_, TripleX(), {in, std::shared_ptr<Buffer>(), out}),
               absl::StatusCode::kInvalidArgument, "triple 5: tmp is not bound");
  EXPECT_ERROR(Record(*list_, TripleX(), {in, tmp, small}), absl::StatusCode::kInvalidArgument,
               "triple 5: y needs 20 bytes, got 16");
  EXPECT_ERROR(Record(*list_, TripleX(), {in, tmp, BufferArg(out, 4, 20)}),
               absl::StatusCode::kInvalidArgument,
               "triple 5: y range [4, +20) exceeds its buffer of 20 bytes");
  EXPECT_ERROR(Record(*list_, TripleX(), {BufferArg(in, 24, VK_WHOLE_SIZE), tmp, out}),
               absl::StatusCode::kInvalidArgument, "triple 5: x range [24, +");
  // An offset and size whose sum wraps around 2^64 (used only by the second
  // launch, so a check that let it through would append the first).
  EXPECT_ERROR(Record(*list_, TripleX(), {in, tmp, BufferArg(out, 16, UINT64_MAX - 8)}),
               absl::StatusCode::kInvalidArgument, "triple 5: y range [16, +18446744073709551607) exceeds");
  OpPlan unknown = TripleX();
  unknown.launches[1].kernel = "no_such_kernel";
  EXPECT_ERROR(Record(*list_, unknown, {in, tmp, out}), absl::StatusCode::kNotFound,
               "no built-in kernel 'no_such_kernel'");
  EXPECT_EQ(list_->size(), 0u);
}

// Tests that a launch the kernel refuses (push constants of the wrong size)
// fails with the kernel's error.
TEST_F(OpPlanTest, PassesOnTheKernelsErrors) {
  auto in = Floats(std::vector<float>(kCount, 1.0f));
  OpPlan plan{"bad push", {{"x", 4}, {"y", 4}}, {}};
  plan.launches.push_back({"scale", {0, 1}, PushBytes(uint32_t{1}), {1, 1, 1}, {}});
  auto out = Floats({0.0f});
  EXPECT_ERROR(Record(*list_, plan, {in, out}), absl::StatusCode::kInvalidArgument,
               "kernel 'scale' expects 8 bytes of push constants, got 4");
}

}  // namespace
}  // namespace causeway::ops
