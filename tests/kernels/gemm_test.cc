// The gemm kernel (ops::Gemm) on lavapipe against reference::Gemm, on each of
// its paths (subgroup lanes, shared tiles, invocation blocks): the four
// transpose combinations, sizes that are multiples of nothing, batches with
// and without a broadcast operand, alpha and beta (beta = 0 never reads C),
// leading dimensions and offsets, and argument errors.
#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/kernels/ops.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/op_plan_support.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;

// A NaN bit pattern that the kernel never produces: C words past the last
// element of C still hold it if nothing wrote there.
constexpr uint32_t kSentinel = 0x7fc0dead;
// Words of sentinel after C, to catch writes past its end.
constexpr uint32_t kGuard = 67;

struct Shape {
  uint32_t m, n, k;
};
// Sizes that are multiples of nothing, a tile exactly, and larger than one.
// {12, 20, 24}: M and N multiples of 4 but not of the lanes path's 16 x 128;
// {33, 132, 10}: three of its row blocks, the last with one row, two column
// blocks, the second all but one quad past N (N % 4 == 0: vec4 B and C),
// and K % 4 == 2 left after its 4-k steps.
constexpr Shape kShapes[] = {{1, 1, 1},    {3, 5, 7},    {17, 65, 33},    {130, 1, 129},
                             {12, 20, 24}, {64, 64, 64}, {256, 128, 200}, {33, 132, 10}};

std::string Name(const Shape& s) { return absl::StrCat(s.m, "x", s.n, "x", s.k); }

// What C starts as.
enum class CInit { kRandom, kNaN };

std::string PathName(ops::GemmPath path) {
  switch (path) {
    case ops::GemmPath::kSubgroupLanes:
      return "SubgroupLanes";
    case ops::GemmPath::kSharedTiles:
      return "SharedTiles";
    case ops::GemmPath::kInvocationBlocks:
      return "InvocationBlocks";
  }
  return "Unknown";
}

// Each test runs on one path, forced through GemmOptions::path.
class GemmTest : public ::testing::TestWithParam<ops::GemmPath> {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(1);
    ASSERT_NE(rt_, nullptr);
    acc_ = rt_->accelerator(0);
  }

  absl::StatusOr<std::shared_ptr<Buffer>> NewBuffer(const std::vector<float>& data) {
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, acc_->CreateBuffer(data.size() * 4));
    CAUSEWAY_RETURN_IF_ERROR(acc_->UploadSync(buffer, data.data(), data.size() * 4));
    return buffer;
  }

  absl::Status Run(const BufferArg& a, const BufferArg& b, const BufferArg& c, uint32_t m, uint32_t n, uint32_t k,
                   const ops::GemmOptions& o) {
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<CommandList> list, acc_->CreateCommandList("gemm_test"));
    CAUSEWAY_RETURN_IF_ERROR(ops::Gemm(*list, a, b, c, m, n, k, o));
    return acc_->Submit(list).Await();
  }

  // Runs ops::Gemm on random A and B and a C made as `init` says, and checks
  // C (and the guard words after it) against reference::Gemm. Each element
  // may carry the rounding error of a float sum of k products plus the beta
  // term, bounded by 4 (k + 2) eps (|alpha| sum_p |a b| + |beta c|); a
  // missing or doubled term is far larger.
  void Check(const Shape& s, ops::GemmOptions o, CInit init = CInit::kRandom) {
    o.path = GetParam();
    reference::GemmLayout l;
    l.transpose_a = o.transpose_a;
    l.transpose_b = o.transpose_b;
    l.alpha = o.alpha;
    l.beta = o.beta;
    l.batch = o.batch;
    const uint64_t a_rows = o.transpose_a ? s.k : s.m, a_cols = o.transpose_a ? s.m : s.k;
    const uint64_t b_rows = o.transpose_b ? s.n : s.k, b_cols = o.transpose_b ? s.k : s.n;
    l.lda = o.lda ? o.lda : a_cols;
    l.ldb = o.ldb ? o.ldb : b_cols;
    l.ldc = o.ldc ? o.ldc : s.n;
    l.stride_a = o.stride_a.value_or(a_rows * l.lda);
    l.stride_b = o.stride_b.value_or(b_rows * l.ldb);
    l.stride_c = o.stride_c.value_or(s.m * l.ldc);
    l.a_offset = o.a_offset;
    l.b_offset = o.b_offset;
    l.c_offset = o.c_offset;
    auto span = [&](uint64_t offset, uint64_t stride, uint64_t rows, uint64_t ld, uint64_t cols) {
      return offset + (o.batch - 1) * stride + (rows - 1) * ld + cols;
    };
    const uint64_t a_size = span(l.a_offset, l.stride_a, a_rows, l.lda, a_cols);
    const uint64_t b_size = span(l.b_offset, l.stride_b, b_rows, l.ldb, b_cols);
    const uint64_t c_size = span(l.c_offset, l.stride_c, s.m, l.ldc, s.n);
    // At least one element each: a buffer cannot be empty (K = 0).
    std::vector<float> a = RandomFloats(std::max<uint64_t>(a_size, 1), s.m * 7 + s.k);
    std::vector<float> b = RandomFloats(std::max<uint64_t>(b_size, 1), s.n * 11 + s.k + 1);
    std::vector<float> c = init == CInit::kNaN ? std::vector<float>(c_size, std::numeric_limits<float>::quiet_NaN())
                                               : RandomFloats(c_size, s.m + s.n + 5);
    // The reference for C, and for the error bound its magnitude.
    std::vector<float> want = c;
    reference::Gemm(a, b, want, s.m, s.n, s.k, l);
    std::vector<float> abs_a(a), abs_b(b), magnitude(c);
    for (float& x : abs_a) x = std::fabs(x);
    for (float& x : abs_b) x = std::fabs(x);
    for (float& x : magnitude) x = std::isnan(x) ? 0.0f : std::fabs(x);
    reference::GemmLayout abs_l = l;
    abs_l.alpha = std::fabs(l.alpha);
    abs_l.beta = std::fabs(l.beta);
    reference::Gemm(abs_a, abs_b, magnitude, s.m, s.n, s.k, abs_l);

    std::vector<float> c_words = c;
    c_words.resize(c_size + kGuard, std::bit_cast<float>(kSentinel));
    ASSERT_OK_AND_ASSIGN(auto a_buffer, NewBuffer(a));
    ASSERT_OK_AND_ASSIGN(auto b_buffer, NewBuffer(b));
    ASSERT_OK_AND_ASSIGN(auto c_buffer, NewBuffer(c_words));
    ASSERT_OK(Run(a_buffer, b_buffer, c_buffer, s.m, s.n, s.k, o));
    std::vector<float> got(c_words.size());
    ASSERT_OK(acc_->DownloadSync(c_buffer, got.data(), got.size() * 4));

    size_t bad = 0;
    std::string first;
    for (size_t i = 0; i < c_size; ++i) {
      const double tolerance = 4.0 * (s.k + 2) * FLT_EPSILON * magnitude[i];
      const bool same_bits = std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]);
      if (same_bits || std::fabs(double{got[i]} - want[i]) <= tolerance) continue;
      if (++bad <= 5) absl::StrAppend(&first, " c[", i, "] got ", got[i], " want ", want[i], ";");
    }
    for (size_t i = c_size; i < got.size(); ++i) {
      if (std::bit_cast<uint32_t>(got[i]) != kSentinel && ++bad <= 5) {
        absl::StrAppend(&first, " guard word ", i - c_size, " was written;");
      }
    }
    EXPECT_EQ(bad, 0u) << Name(s) << ":" << first;
  }

  std::unique_ptr<Runtime> rt_;
  Accelerator* acc_ = nullptr;
};

// Tests every transpose combination on every shape, packed, beta = 0.
TEST_P(GemmTest, AllTransposesMatchReference) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (const Shape& s : kShapes) {
        SCOPED_TRACE(absl::StrCat(Name(s), ta ? " A^T" : " A", tb ? " B^T" : " B"));
        ops::GemmOptions o;
        o.transpose_a = ta;
        o.transpose_b = tb;
        Check(s, o);
      }
    }
  }
}

// Tests batches: packed, with B broadcast (one weight for all), with A
// broadcast, and transposed with a broadcast operand.
TEST_P(GemmTest, BatchedWithAndWithoutBroadcast) {
  for (const Shape& s : {Shape{17, 65, 33}, Shape{64, 64, 64}, Shape{3, 5, 7}}) {
    SCOPED_TRACE(Name(s));
    ops::GemmOptions o;
    o.batch = 5;
    Check(s, o);
    o.stride_b = 0;
    Check(s, o);
    o.stride_b.reset();
    o.stride_a = 0;
    Check(s, o);
    o.transpose_a = true;
    o.transpose_b = true;
    o.stride_a.reset();
    o.stride_b = 0;
    Check(s, o);
  }
}

// Tests that beta = 0 writes alpha * AB without reading C (NaN there must
// not leak into the result), that beta = 1 accumulates, and other scalars.
TEST_P(GemmTest, AlphaAndBeta) {
  for (const Shape& s : {Shape{17, 65, 33}, Shape{130, 1, 129}, Shape{64, 64, 64}}) {
    SCOPED_TRACE(Name(s));
    ops::GemmOptions o;
    o.alpha = 0.5f;
    Check(s, o, CInit::kNaN);
    o.batch = 2;
    o.transpose_b = true;
    Check(s, o, CInit::kNaN);
    o.alpha = 1.0f;
    o.beta = 1.0f;
    Check(s, o);
    o.alpha = -2.0f;
    o.beta = 0.25f;
    Check(s, o);
  }
}

// Tests that K = 0 gives beta * C (and, with beta = 0, zeros over NaN).
TEST_P(GemmTest, EmptyKScalesC) {
  ops::GemmOptions o;
  o.beta = 3.0f;
  Check({5, 9, 0}, o);
  o.beta = 0.0f;
  Check({5, 9, 0}, o, CInit::kNaN);
}

// Tests leading dimensions larger than the matrices and element offsets:
// sub-matrices of larger ones, with the vec4 path of A on (lda % 4 == 0) and
// off (lda, offset odd).
TEST_P(GemmTest, LeadingDimensionsAndOffsets) {
  for (const Shape& s : {Shape{17, 65, 33}, Shape{64, 64, 64}}) {
    SCOPED_TRACE(Name(s));
    ops::GemmOptions o;
    o.lda = s.k + 12;
    o.ldb = s.n + 3;
    o.ldc = s.n + 5;
    o.batch = 2;
    Check(s, o);
    o.lda = s.k + 1;
    o.a_offset = 3;
    o.b_offset = 7;
    o.c_offset = 1;
    o.transpose_b = true;
    o.ldb = s.k + 2;
    Check(s, o);
    o.transpose_a = true;
    o.lda = s.m + 4;
    o.a_offset = 8;
    o.beta = 1.0f;
    Check(s, o);
  }
}

// Tests C with a leading dimension and an offset that keep its rows' quads
// aligned (the lanes path writes, and with beta != 0 reads, them as vec4),
// batched, and with beta = 0 over NaN.
TEST_P(GemmTest, AlignedCWithLeadingDimensionAndOffset) {
  for (const Shape& s : {Shape{33, 132, 10}, Shape{64, 64, 64}}) {
    SCOPED_TRACE(Name(s));
    ops::GemmOptions o;
    o.ldc = s.n + 4;
    o.c_offset = 8;
    o.beta = 0.5f;
    o.batch = 2;
    Check(s, o);
    o.beta = 0.0f;
    o.transpose_a = true;
    Check(s, o, CInit::kNaN);
  }
}

// Tests the argument checks: each names the operand and the sizes.
TEST_P(GemmTest, RejectsBadArguments) {
  const uint32_t m = 4, n = 6, k = 5;
  ASSERT_OK_AND_ASSIGN(auto a, NewBuffer(std::vector<float>(m * k)));
  ASSERT_OK_AND_ASSIGN(auto b, NewBuffer(std::vector<float>(k * n)));
  ASSERT_OK_AND_ASSIGN(auto c, NewBuffer(std::vector<float>(m * n)));
  // One float short of A, B and C.
  ASSERT_OK_AND_ASSIGN(auto small_a, NewBuffer(std::vector<float>(m * k - 1)));
  ASSERT_OK_AND_ASSIGN(auto small, NewBuffer(std::vector<float>(k * n - 1)));
  ASSERT_OK_AND_ASSIGN(auto small_c, NewBuffer(std::vector<float>(m * n - 1)));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList("gemm_test"));
  EXPECT_OK(ops::Gemm(*list, a, b, c, m, n, k));

  EXPECT_ERROR(ops::Gemm(*list, a, small, c, m, n, k), absl::StatusCode::kInvalidArgument, "gemm 4x6x5",
               "B needs 120 bytes, got 116");
  EXPECT_ERROR(ops::Gemm(*list, small_a, b, c, m, n, k), absl::StatusCode::kInvalidArgument,
               "A needs 80 bytes, got 76");
  EXPECT_ERROR(ops::Gemm(*list, a, b, small_c, m, n, k), absl::StatusCode::kInvalidArgument,
               "C needs 96 bytes, got 92");
  ops::GemmOptions o;
  o.batch = 2;
  EXPECT_ERROR(ops::Gemm(*list, a, b, c, m, n, k, o), absl::StatusCode::kInvalidArgument, "batch 2",
               "A needs 160 bytes, got 80");
  o.stride_a = 0;
  o.stride_b = 0;
  o.stride_c = 0;
  EXPECT_ERROR(ops::Gemm(*list, a, b, c, m, n, k, o), absl::StatusCode::kInvalidArgument,
               "C's batch stride 0 is less than the 24 elements");
  o = {};
  o.lda = 3;
  EXPECT_ERROR(ops::Gemm(*list, a, b, c, m, n, k, o), absl::StatusCode::kInvalidArgument,
               "A's leading dimension 3 is less than its 5 columns");
  o = {};
  o.transpose_b = true;  // B is N x K = 6 x 5: still 30 floats, fine
  EXPECT_OK(ops::Gemm(*list, a, b, c, m, n, k, o));
  o.b_offset = 1;
  EXPECT_ERROR(ops::Gemm(*list, a, b, c, m, n, k, o), absl::StatusCode::kInvalidArgument, "B needs 124 bytes");
  EXPECT_ERROR(ops::Gemm(*list, a, b, c, 0, n, k), absl::StatusCode::kInvalidArgument, "M, N and batch must be > 0");
}

// Tests that lavapipe (a CPU device with subgroups of 8) runs every path,
// so the tests above cover them all: the forced path is the one planned, and
// it computes a product worked out by hand.
TEST_P(GemmTest, PathRunsOnLavapipe) {
  const DeviceCapabilities& info = acc_->capabilities();
  EXPECT_EQ(info.kind, DeviceKind::kCpu);
  EXPECT_EQ(info.subgroup_size, 8u);
  EXPECT_GE(info.max_workgroup_invocations, 256u);
  ops::GemmOptions o;
  o.path = GetParam();
  ASSERT_OK_AND_ASSIGN(ops::OpPlan plan, ops::PlanGemm(2, 3, 2, o, &info));
  EXPECT_THAT(plan.launches[0].spec, ::testing::Contains(std::pair{5u, static_cast<uint32_t>(GetParam())}));
  // [1 2; 3 4] [1 0 2; 0 1 3] = [1 2 8; 3 4 18], exact in floats.
  ASSERT_OK_AND_ASSIGN(auto a, NewBuffer({1, 2, 3, 4}));
  ASSERT_OK_AND_ASSIGN(auto b, NewBuffer({1, 0, 2, 0, 1, 3}));
  ASSERT_OK_AND_ASSIGN(auto c, NewBuffer(std::vector<float>(6, -1.0f)));
  ASSERT_OK(Run(a, b, c, 2, 3, 2, o));
  std::vector<float> got(6);
  ASSERT_OK(acc_->DownloadSync(c, got.data(), got.size() * 4));
  EXPECT_THAT(got, ::testing::ElementsAre(1, 2, 8, 3, 4, 18));
}

INSTANTIATE_TEST_SUITE_P(Paths, GemmTest,
                         ::testing::Values(ops::GemmPath::kSubgroupLanes, ops::GemmPath::kSharedTiles,
                                           ops::GemmPath::kInvocationBlocks),
                         [](const ::testing::TestParamInfo<ops::GemmPath>& info) { return PathName(info.param); });

using ::causeway::testing::Bits;
using ::causeway::testing::PushWords;
using Groups = std::array<uint32_t, 3>;
using ::testing::ElementsAre;
using ::testing::Pair;

// Tests a device-less plan of a packed gemm: the invocation-blocks path
// (64 columns by 16 rows a group), operand sizes of whole matrices, the
// kernel's push constants in its order, and no vec4 reads where a leading
// dimension is not a multiple of 4.
TEST(PlanGemmTest, PackedWithoutADevice) {
  ASSERT_OK_AND_ASSIGN(ops::OpPlan plan, ops::PlanGemm(5, 130, 7));
  EXPECT_EQ(plan.name, "gemm 5x130x7 batch 1");
  ASSERT_EQ(plan.operands.size(), 3u);
  EXPECT_EQ(plan.operands[0].bytes, 5u * 7 * 4);
  EXPECT_EQ(plan.operands[1].bytes, 7u * 130 * 4);
  EXPECT_EQ(plan.operands[2].bytes, 5u * 130 * 4);
  ASSERT_EQ(plan.launches.size(), 1u);
  const ops::Launch& l = plan.launches[0];
  EXPECT_EQ(l.kernel, "gemm");
  EXPECT_THAT(l.operands, ElementsAre(0, 1, 2));
  EXPECT_EQ(l.groups, (Groups{3, 1, 1}));
  // m n k, lda ldb ldc, strides (rows * ld), offsets, alpha beta, flags.
  EXPECT_THAT(PushWords(l),
              ElementsAre(5, 130, 7, 7, 130, 130, 35, 910, 650, 0, 0, 0, Bits(1.0f), Bits(0.0f), 0));
  EXPECT_THAT(l.spec, ElementsAre(Pair(0, 64), Pair(1, 0), Pair(2, 0), Pair(3, 16), Pair(4, 1), Pair(5, 2),
                                  Pair(6, 0)));
}

// Tests a batched, transposed, offset plan: A^T stored 4 x 4 with leading
// dimension 8 from element 4, B broadcast (stride 0), C packed; the sizes
// are each operand's last element + 1, and quads of A and B may be read as
// vec4.
TEST(PlanGemmTest, BatchedTransposedWithStridesAndOffsets) {
  ops::GemmOptions o;
  o.transpose_a = true;
  o.batch = 3;
  o.lda = 8;
  o.a_offset = 4;
  o.stride_b = 0;
  o.alpha = 2.0f;
  o.beta = 0.5f;
  ASSERT_OK_AND_ASSIGN(ops::OpPlan plan, ops::PlanGemm(4, 8, 4, o));
  EXPECT_EQ(plan.name, "gemm 4x8x4 batch 3");
  // A: 4 + 2 * 32 + 3 * 8 + 4 = 96; B: 3 * 8 + 8 = 32; C: 2 * 32 + 3 * 8 + 8 = 96.
  EXPECT_EQ(plan.operands[0].bytes, 96u * 4);
  EXPECT_EQ(plan.operands[1].bytes, 32u * 4);
  EXPECT_EQ(plan.operands[2].bytes, 96u * 4);
  const ops::Launch& l = plan.launches[0];
  EXPECT_EQ(l.groups, (Groups{1, 1, 3}));
  EXPECT_THAT(PushWords(l), ElementsAre(4, 8, 4, 8, 8, 8, 32, 0, 32, 4, 0, 0, Bits(2.0f), Bits(0.5f), 0));
  EXPECT_THAT(l.spec, ElementsAre(Pair(0, 64), Pair(1, 1), Pair(2, 0), Pair(3, 16), Pair(4, 1), Pair(5, 2),
                                  Pair(6, 3)));
}

// Tests the path chosen for a device: subgroup lanes on a CPU with
// subgroups of 8 (8 lanes, 16 x 128 of C a group, vec4 C where N allows),
// shared tiles on a GPU (256 invocations, 64 x 64 a group).
TEST(PlanGemmTest, PathFollowsTheDevice) {
  DeviceCapabilities cpu;
  cpu.kind = DeviceKind::kCpu;
  cpu.subgroup_size = 8;
  cpu.max_workgroup_invocations = 1024;
  cpu.max_workgroup_size[0] = 1024;
  cpu.max_workgroup_count[2] = 65535;
  ASSERT_OK_AND_ASSIGN(ops::OpPlan lanes, ops::PlanGemm(40, 256, 8, {}, &cpu));
  EXPECT_EQ(lanes.launches[0].groups, (Groups{2, 3, 1}));
  EXPECT_THAT(lanes.launches[0].spec, ElementsAre(Pair(0, 8), Pair(1, 0), Pair(2, 0), Pair(3, 16), Pair(4, 1),
                                                  Pair(5, 0), Pair(6, 7)));
  DeviceCapabilities gpu = cpu;
  gpu.kind = DeviceKind::kDiscreteGpu;
  gpu.subgroup_size = 32;
  ASSERT_OK_AND_ASSIGN(ops::OpPlan tiles, ops::PlanGemm(40, 256, 8, {}, &gpu));
  EXPECT_EQ(tiles.launches[0].groups, (Groups{4, 1, 1}));
  EXPECT_THAT(tiles.launches[0].spec, ElementsAre(Pair(0, 256), Pair(1, 0), Pair(2, 0), Pair(3, 16),
                                                  Pair(4, 1), Pair(5, 1), Pair(6, 3)));
}

// Tests each of PlanGemm's errors by its own message.
TEST(PlanGemmTest, RefusesBadArguments) {
  constexpr auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_ERROR(ops::PlanGemm(0, 4, 4), kBad, "gemm 0x4x4 batch 1: M, N and batch must be > 0");
  ops::GemmOptions o;
  o.batch = 65536;
  EXPECT_ERROR(ops::PlanGemm(4, 4, 4, o), kBad, "gemm 4x4x4 batch 65536: batch must be at most 65535");
  o = {};
  o.lda = 4;
  EXPECT_ERROR(ops::PlanGemm(4, 4, 8, o), kBad,
               "A's leading dimension 4 is less than its 8 columns as stored");
  EXPECT_ERROR(ops::PlanGemm(65536, 65536, 1), kBad,
               "C spans 4294967296 elements; the kernel indexes at most");
  // Sizes near 2^32 wrapped the workgroup count to zero in 32 bits.
  EXPECT_ERROR(ops::PlanGemm(1, 0xFFFFFFFFu, 0), kBad, "workgroups; at most 65535 in each dimension");
  EXPECT_ERROR(ops::PlanGemm(0xFFFFFFFFu, 1, 0), kBad, "workgroups; at most 65535 in each dimension");
  o = {};
  o.batch = 2;
  o.stride_c = 10;
  EXPECT_ERROR(ops::PlanGemm(4, 4, 4, o), kBad,
               "C's batch stride 10 is less than the 16 elements of one C: batches would overlap");
  o = {};
  o.path = ops::GemmPath::kSharedTiles;
  EXPECT_ERROR(ops::PlanGemm(4, 4, 4, o), kBad, "path shared-tiles needs the device it will run on");
  DeviceCapabilities small;
  small.subgroup_size = 32;
  small.max_workgroup_invocations = 128;
  small.max_workgroup_count[2] = 65535;
  o.path = ops::GemmPath::kSubgroupLanes;
  EXPECT_ERROR(
      ops::PlanGemm(4, 4, 4, o, &small), kBad,
      "path subgroup-lanes needs a subgroup size of 8; this device has subgroups of 32 and at most 128 "
      "invocations per group");
  o.path = ops::GemmPath::kSharedTiles;
  EXPECT_ERROR(ops::PlanGemm(4, 4, 4, o, &small), kBad, "path shared-tiles needs 256 invocations per group");
  small.max_workgroup_count[2] = 8;
  o = {};
  o.batch = 9;
  EXPECT_ERROR(ops::PlanGemm(4, 4, 4, o, &small), kBad, "batch must be at most 8 on this device");
}

}  // namespace
}  // namespace causeway
