// The built-in kernels and run-time GLSL kernels on a device, checked against
// CPU references: sizes around the workgroup size, grid-stride loops, binding
// sub-ranges, specialization, argument checking, descriptor sets, and the
// barriers between dependent commands.
#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "causeway/base/status.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/kernels/ops.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/kernel.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;
using ::causeway::testing::TestOptions;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A NaN bit pattern that no kernel here produces: words still holding it were
// not written.
constexpr uint32_t kSentinel = 0x7fc0dead;
// Words of sentinel after each output, to catch writes past the end.
constexpr uint32_t kGuard = 67;
// 1-D sizes: below, at and around the default workgroup size of 256, and more
// than one grid-stride round of small groups.
constexpr uint32_t kSizes[] = {1, 7, 255, 256, 257, 1000, 65537};

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bits(v[i]);
  return out;
}

// `values` followed by kGuard sentinels: what a buffer made by SentinelBuffer
// should hold after a kernel wrote `values` at its start.
std::vector<uint32_t> WithGuard(std::vector<uint32_t> values) {
  values.resize(values.size() + kGuard, kSentinel);
  return values;
}

// Deterministic, distinct 32-bit words (not all valid floats: some are NaNs
// and denormals, which a word copy must keep bit for bit).
std::vector<uint32_t> RandomWords(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& w : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    w = x;
  }
  return v;
}

// A device buffer holding `data`.
template <typename T>
absl::StatusOr<std::shared_ptr<Buffer>> NewBuffer(Accelerator* acc, const std::vector<T>& data) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, acc->CreateBuffer(data.size() * sizeof(T)));
  CAUSEWAY_RETURN_IF_ERROR(acc->UploadSync(buffer, data.data(), data.size() * sizeof(T)));
  return buffer;
}

// A device buffer of `words` 32-bit words, each kSentinel.
absl::StatusOr<std::shared_ptr<Buffer>> SentinelBuffer(Accelerator* acc, size_t words) {
  return NewBuffer(acc, std::vector<uint32_t>(words, kSentinel));
}

// The whole of `buffer`, as Ts.
template <typename T>
absl::StatusOr<std::vector<T>> Read(Accelerator* acc, const std::shared_ptr<Buffer>& buffer) {
  std::vector<T> out(buffer->size() / sizeof(T));
  CAUSEWAY_RETURN_IF_ERROR(acc->DownloadSync(buffer, out.data(), out.size() * sizeof(T)));
  return out;
}

// Records a list with `record`, submits it and waits for it.
absl::Status RunList(Accelerator* acc, absl::FunctionRef<absl::Status(CommandList&)> record) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<CommandList> list, acc->CreateCommandList("kernels_test"));
  CAUSEWAY_RETURN_IF_ERROR(record(*list));
  return acc->Submit(list).Await();
}

// Success when got and want are equal word for word; otherwise how many words
// differ and the first few of them (never the whole, possibly huge, vectors).
::testing::AssertionResult WordsEqual(absl::Span<const uint32_t> got, absl::Span<const uint32_t> want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "got " << got.size() << " words, want " << want.size();
  }
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++bad <= 5) {
      absl::StrAppend(&first, " [", i, "] got 0x", absl::Hex(got[i]), " (", std::bit_cast<float>(got[i]),
                      ") want 0x", absl::Hex(want[i]), " (", std::bit_cast<float>(want[i]), ");");
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " words differ:" << first;
}

// Checks a matmul result C (m*n floats, then kGuard sentinels) against the
// double-precision reference. Each element may carry the rounding error of a
// float sum of k products, bounded by 4 (k + 1) eps sum_p |a_ip b_pj|; a
// missing or doubled term is far larger.
::testing::AssertionResult MatmulClose(const std::vector<uint32_t>& got_words, const std::vector<float>& a,
                                       const std::vector<float>& b, uint32_t m, uint32_t n, uint32_t k) {
  if (got_words.size() != size_t{m} * n + kGuard) {
    return ::testing::AssertionFailure() << "got " << got_words.size() << " words";
  }
  std::vector<float> want = reference::Matmul(a, b, m, n, k);
  std::vector<float> abs_a(a.size()), abs_b(b.size());
  for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(a[i]);
  for (size_t i = 0; i < b.size(); ++i) abs_b[i] = std::fabs(b[i]);
  std::vector<float> magnitude = reference::Matmul(abs_a, abs_b, m, n, k);
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < want.size(); ++i) {
    float got = std::bit_cast<float>(got_words[i]);
    double tolerance = 4.0 * (k + 1) * FLT_EPSILON * magnitude[i];
    if (std::fabs(double{got} - want[i]) <= tolerance) continue;
    if (++bad <= 5) {
      absl::StrAppend(&first, " C[", i / n, ",", i % n, "] got ", got, " want ", want[i], ";");
    }
  }
  for (size_t i = want.size(); i < got_words.size(); ++i) {
    if (got_words[i] != kSentinel && ++bad <= 5) absl::StrAppend(&first, " guard word ", i, " was written;");
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " wrong elements:" << first;
}

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(1);
    ASSERT_NE(rt_, nullptr);
    acc_ = rt_->accelerator(0);
  }

  std::unique_ptr<Runtime> rt_;
  Accelerator* acc_ = nullptr;
};

// --- 1. Every built-in kernel against a CPU reference ---------------------

// Tests that fill writes its word to exactly the first `count` words.
TEST_F(KernelsTest, FillWritesExactlyCountWords) {
  for (uint32_t n : kSizes) {
    SCOPED_TRACE(absl::StrCat("count ", n));
    const uint32_t word = 0x3f800000u ^ n;
    ASSERT_OK_AND_ASSIGN(auto data, SentinelBuffer(acc_, n + kGuard));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) { return ops::FillWords(list, data, n, word); }));
    ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, data));
    EXPECT_TRUE(WordsEqual(got, WithGuard(std::vector<uint32_t>(n, word))));
  }
}

// Tests that the copy kernel copies `count` words bit for bit (NaNs included)
// and nothing more.
TEST_F(KernelsTest, CopyKernelCopiesExactlyCountWords) {
  for (uint32_t n : kSizes) {
    SCOPED_TRACE(absl::StrCat("count ", n));
    std::vector<uint32_t> words = RandomWords(n, n);
    ASSERT_OK_AND_ASSIGN(auto src, NewBuffer(acc_, words));
    ASSERT_OK_AND_ASSIGN(auto dst, SentinelBuffer(acc_, n + kGuard));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) { return ops::CopyWords(list, src, dst, n); }));
    ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, dst));
    EXPECT_TRUE(WordsEqual(got, WithGuard(words)));
  }
}

// Tests add, mul and scale elementwise against float arithmetic on the CPU
// (both are correctly rounded, so the bits must match).
TEST_F(KernelsTest, ElementwiseKernelsMatchCpu) {
  for (uint32_t n : kSizes) {
    SCOPED_TRACE(absl::StrCat("count ", n));
    std::vector<float> x = RandomFloats(n, 2 * n), y = RandomFloats(n, 2 * n + 1, -4.0f, 4.0f);
    const float alpha = -2.75f;
    std::vector<float> sum(n), product(n), scaled(n);
    for (uint32_t i = 0; i < n; ++i) {
      sum[i] = x[i] + y[i];
      product[i] = x[i] * y[i];
      scaled[i] = alpha * x[i];
    }
    ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
    ASSERT_OK_AND_ASSIGN(auto yb, NewBuffer(acc_, y));
    ASSERT_OK_AND_ASSIGN(auto sum_b, SentinelBuffer(acc_, n + kGuard));
    ASSERT_OK_AND_ASSIGN(auto product_b, SentinelBuffer(acc_, n + kGuard));
    ASSERT_OK_AND_ASSIGN(auto scaled_b, SentinelBuffer(acc_, n + kGuard));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
      CAUSEWAY_RETURN_IF_ERROR(ops::Add(list, xb, yb, sum_b, n));
      CAUSEWAY_RETURN_IF_ERROR(ops::Mul(list, xb, yb, product_b, n));
      return ops::Scale(list, xb, scaled_b, n, alpha);
    }));
    ASSERT_OK_AND_ASSIGN(auto got_sum, Read<uint32_t>(acc_, sum_b));
    ASSERT_OK_AND_ASSIGN(auto got_product, Read<uint32_t>(acc_, product_b));
    ASSERT_OK_AND_ASSIGN(auto got_scaled, Read<uint32_t>(acc_, scaled_b));
    EXPECT_TRUE(WordsEqual(got_sum, WithGuard(Bits(sum)))) << "add";
    EXPECT_TRUE(WordsEqual(got_product, WithGuard(Bits(product)))) << "mul";
    EXPECT_TRUE(WordsEqual(got_scaled, WithGuard(Bits(scaled)))) << "scale";
  }
}

// Tests that the op helpers refuse a zero count rather than dispatching.
TEST_F(KernelsTest, OpsRefuseZeroCount) {
  ASSERT_OK_AND_ASSIGN(auto buf, SentinelBuffer(acc_, 16));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  EXPECT_EQ(ops::FillWords(*list, buf, 0, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::CopyWords(*list, buf, buf, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::Add(*list, buf, buf, buf, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::Scale(*list, buf, buf, 0, 1.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::ReduceSum(*list, buf, buf, buf, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::Matmul(*list, buf, buf, buf, 0, 4, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(list->size(), 0u);
}

// Tests ops::ReduceSum against a double-precision sum, within the rounding of
// a float reduction tree (relative to the sum of |x|).
TEST_F(KernelsTest, ReduceSumMatchesCpu) {
  for (uint32_t n : {1u, 7u, 255u, 256u, 257u, 1000u, 100000u, (1u << 20) + 3}) {
    SCOPED_TRACE(absl::StrCat("count ", n));
    std::vector<float> x = RandomFloats(n, n + 11);
    double abs_sum = 0;
    for (float v : x) abs_sum += std::fabs(v);
    ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
    ASSERT_OK_AND_ASSIGN(auto scratch, SentinelBuffer(acc_, ops::ReduceSumScratch(n)));
    ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, 2));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) { return ops::ReduceSum(list, xb, scratch, out, n); }));
    ASSERT_OK_AND_ASSIGN(auto got, Read<float>(acc_, out));
    EXPECT_NEAR(got[0], reference::Sum(x), 1e-5 * abs_sum);
    EXPECT_EQ(Bits(got[1]), kSentinel) << "reduce_sum wrote past out[0]";
  }
}

// Tests that ops::ReduceSum of small integers is exact (every partial sum is
// an integer below 2^24), so no element is lost or counted twice.
TEST_F(KernelsTest, ReduceSumOfIntegersIsExact) {
  for (uint32_t n : {1u, 257u, 65537u, (1u << 20) + 3}) {
    SCOPED_TRACE(absl::StrCat("count ", n));
    std::vector<float> x(n);
    for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7 + 1) * (i % 2 == 0 ? 1.0f : 0.5f);
    ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
    ASSERT_OK_AND_ASSIGN(auto scratch, SentinelBuffer(acc_, ops::ReduceSumScratch(n)));
    ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, 1));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) { return ops::ReduceSum(list, xb, scratch, out, n); }));
    ASSERT_OK_AND_ASSIGN(auto got, Read<float>(acc_, out));
    EXPECT_EQ(got[0], reference::Sum(x));
  }
}

// Tests reduce_sum dispatched directly with workgroup sizes set by its
// specialization constant, including sizes that are not multiples of the
// subgroup size (the partial last subgroup must be counted).
TEST_F(KernelsTest, ReduceSumWithSpecializedWorkgroupSizes) {
  ASSERT_OK_AND_ASSIGN(auto kernel, BuiltinKernel("reduce_sum"));
  const uint32_t n = 5003;
  std::vector<float> x(n);
  for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 13);
  const double want = reference::Sum(x);
  ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
  for (uint32_t local : {1u, 5u, 8u, 33u, 100u, 256u, 1000u, 1024u}) {
    SCOPED_TRACE(absl::StrCat("workgroup size ", local));
    const uint32_t groups = Groups1D(n, local, 64)[0];
    ASSERT_OK_AND_ASSIGN(auto partial, SentinelBuffer(acc_, groups));
    ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, 1));
    const SpecValues spec = {{0, local}};
    ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
      CAUSEWAY_RETURN_IF_ERROR(list.Dispatch(kernel, {xb, partial}, CountParams{n}, {groups, 1, 1}, spec));
      return list.Dispatch(kernel, {partial, out}, CountParams{groups}, {1, 1, 1}, spec);
    }));
    ASSERT_OK_AND_ASSIGN(auto got, Read<float>(acc_, out));
    EXPECT_EQ(got[0], want);
  }
}

// Tests that a workgroup size beyond the device's limits, here set by a
// specialization constant, is refused naming the kernel, the size and the
// limits, before a pipeline is made (Vulkan leaves one undefined).
TEST_F(KernelsTest, WorkgroupSizeBeyondTheDeviceIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto kernel, BuiltinKernel("reduce_sum"));
  const VkPhysicalDeviceLimits& limits = acc_->info().limits;
  ASSERT_OK_AND_ASSIGN(auto x, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList("too large"));
  const uint32_t over =
      std::min(limits.maxComputeWorkGroupSize[0], limits.maxComputeWorkGroupInvocations) + 1;
  EXPECT_ERROR(list->Dispatch(kernel, {x, out}, CountParams{64}, {1, 1, 1}, {{0, over}}),
               absl::StatusCode::kInvalidArgument, "kernel 'reduce_sum': workgroup size ",
               absl::StrCat(over, "x1x1 on device"),
               absl::StrCat(limits.maxComputeWorkGroupInvocations, " invocations"));
  EXPECT_ERROR(list->Dispatch(kernel, {x, out}, CountParams{64}, {1, 1, 1}, {{0, 0}}),
               absl::StatusCode::kInvalidArgument, "workgroup size 0x1x1");
  // At the limit, it runs.
  const uint32_t most = over - 1;
  ASSERT_OK(RunList(acc_, [&](CommandList& l) -> absl::Status {
    return l.Dispatch(kernel, {x, out}, CountParams{1}, {1, 1, 1}, {{0, most}});
  }));
}

// Tests ops::Matmul against the CPU reference for edge-heavy shapes and every
// tile size, and that nothing is written past C.
TEST_F(KernelsTest, MatmulMatchesCpu) {
  struct Shape {
    uint32_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},    {3, 5, 7},      {16, 16, 16}, {17, 33, 65},
                          {64, 64, 64}, {100, 37, 129}, {1, 300, 2},  {257, 1, 3}};
  for (const Shape& s : shapes) {
    std::vector<float> a = RandomFloats(size_t{s.m} * s.k, s.m * 7 + s.k);
    std::vector<float> b = RandomFloats(size_t{s.k} * s.n, s.n * 13 + s.k, -2.0f, 2.0f);
    ASSERT_OK_AND_ASSIGN(auto ab, NewBuffer(acc_, a));
    ASSERT_OK_AND_ASSIGN(auto bb, NewBuffer(acc_, b));
    for (uint32_t tile : {8u, 16u, 32u}) {
      SCOPED_TRACE(absl::StrCat("M=", s.m, " N=", s.n, " K=", s.k, " tile ", tile));
      ASSERT_OK_AND_ASSIGN(auto cb, SentinelBuffer(acc_, size_t{s.m} * s.n + kGuard));
      ASSERT_OK(RunList(
          acc_, [&](CommandList& list) { return ops::Matmul(list, ab, bb, cb, s.m, s.n, s.k, tile); }));
      ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, cb));
      EXPECT_TRUE(MatmulClose(got, a, b, s.m, s.n, s.k));
    }
  }
}

// Tests that matmul with K = 0 writes zeros to all of C, as matmul.comp
// documents.
TEST_F(KernelsTest, MatmulWithEmptyKWritesZeros) {
  const uint32_t m = 19, n = 70;
  // Dispatch refuses empty bindings, so A and B get one (unused) word each.
  ASSERT_OK_AND_ASSIGN(auto ab, SentinelBuffer(acc_, 1));
  ASSERT_OK_AND_ASSIGN(auto bb, SentinelBuffer(acc_, 1));
  for (uint32_t tile : {8u, 16u, 32u}) {
    SCOPED_TRACE(absl::StrCat("tile ", tile));
    ASSERT_OK_AND_ASSIGN(auto cb, SentinelBuffer(acc_, m * n + kGuard));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) { return ops::Matmul(list, ab, bb, cb, m, n, 0, tile); }));
    ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, cb));
    EXPECT_TRUE(WordsEqual(got, WithGuard(std::vector<uint32_t>(m * n, Bits(0.0f)))));
  }
}

// Tests that ops::Matmul refuses operands too small for the shape, naming the
// operand and the sizes.
TEST_F(KernelsTest, MatmulRefusesSmallOperands) {
  ASSERT_OK_AND_ASSIGN(auto small, SentinelBuffer(acc_, 11));
  ASSERT_OK_AND_ASSIGN(auto big, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  absl::Status s = ops::Matmul(*list, big, small, big, 3, 4, 3);  // B needs 12 floats
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("B needs 48 bytes"), HasSubstr("got 44")));
  EXPECT_EQ(list->size(), 0u);
}

// --- 2. Grid-stride loops ---------------------------------------------------

// Tests fill and copy over more words than 65535 groups of 256 cover, so each
// invocation loops (Groups1D caps the grid at 65535 groups).
TEST_F(KernelsTest, FillAndCopyBeyondOneGridPass) {
  const uint32_t n = 65535u * 256u + 1000u;
  ASSERT_EQ(Groups1D(n, 256)[0], 65535u);
  std::vector<uint32_t> words(n);
  for (uint32_t i = 0; i < n; ++i) words[i] = i * 2654435761u;
  ASSERT_OK_AND_ASSIGN(auto src, NewBuffer(acc_, words));
  ASSERT_OK_AND_ASSIGN(auto filled, SentinelBuffer(acc_, n + kGuard));
  ASSERT_OK_AND_ASSIGN(auto copied, SentinelBuffer(acc_, n + kGuard));
  ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
    CAUSEWAY_RETURN_IF_ERROR(ops::FillWords(list, filled, n, 0x12345678u));
    return ops::CopyWords(list, src, copied, n);
  }));
  ASSERT_OK_AND_ASSIGN(auto got_filled, Read<uint32_t>(acc_, filled));
  EXPECT_TRUE(WordsEqual(got_filled, WithGuard(std::vector<uint32_t>(n, 0x12345678u))));
  ASSERT_OK_AND_ASSIGN(auto got_copied, Read<uint32_t>(acc_, copied));
  words.resize(n + kGuard, kSentinel);
  EXPECT_TRUE(WordsEqual(got_copied, words));
}

// Tests the 1-D kernels dispatched with far fewer groups than the count needs
// (and with a specialized workgroup size): the grid-stride loop covers the rest.
TEST_F(KernelsTest, ElementwiseKernelsWithFewGroups) {
  ASSERT_OK_AND_ASSIGN(auto add, BuiltinKernel("add"));
  ASSERT_OK_AND_ASSIGN(auto fill, BuiltinKernel("fill"));
  const uint32_t n = 5001;
  std::vector<float> x = RandomFloats(n, 5), y = RandomFloats(n, 6);
  std::vector<float> sum(n);
  for (uint32_t i = 0; i < n; ++i) sum[i] = x[i] + y[i];
  ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
  ASSERT_OK_AND_ASSIGN(auto yb, NewBuffer(acc_, y));
  for (uint32_t groups : {1u, 3u, 19u}) {
    for (uint32_t local : {32u, 256u}) {
      SCOPED_TRACE(absl::StrCat(groups, " groups of ", local));
      ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, n + kGuard));
      ASSERT_OK_AND_ASSIGN(auto filled, SentinelBuffer(acc_, n + kGuard));
      const SpecValues spec = {{0, local}};
      ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
        CAUSEWAY_RETURN_IF_ERROR(list.Dispatch(add, {xb, yb, out}, CountParams{n}, {groups, 1, 1}, spec));
        return list.Dispatch(fill, {filled}, FillParams{n, 77}, {groups, 1, 1}, spec);
      }));
      ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, out));
      EXPECT_TRUE(WordsEqual(got, WithGuard(Bits(sum))));
      ASSERT_OK_AND_ASSIGN(auto got_filled, Read<uint32_t>(acc_, filled));
      EXPECT_TRUE(WordsEqual(got_filled, WithGuard(std::vector<uint32_t>(n, 77))));
    }
  }
}

// --- 3. Binding ranges ------------------------------------------------------

// Tests dispatches on aligned, non-zero offsets and sub-ranges: each kernel
// reads and writes only its range, at the right place.
TEST_F(KernelsTest, DispatchOnBufferSubRanges) {
  const uint64_t align = acc_->info().limits.minStorageBufferOffsetAlignment;
  ASSERT_EQ(align % 4, 0u);
  const uint32_t total = 4096;  // words per buffer
  const uint32_t len = 257;     // words per range
  // Distinct offsets, so that an ignored offset shows.
  const uint64_t off_a = align * ((100 * 4 + align - 1) / align);
  const uint64_t off_b = off_a + 7 * align;
  const uint64_t off_out = off_a + 13 * align + 1024;
  ASSERT_LE(off_out + 4 * (len + kGuard), uint64_t{total} * 4);

  std::vector<float> a = RandomFloats(total, 21), b = RandomFloats(total, 22);
  ASSERT_OK_AND_ASSIGN(auto ab, NewBuffer(acc_, a));
  ASSERT_OK_AND_ASSIGN(auto bb, NewBuffer(acc_, b));
  ASSERT_OK_AND_ASSIGN(auto sum_b, SentinelBuffer(acc_, total));
  ASSERT_OK_AND_ASSIGN(auto filled, SentinelBuffer(acc_, total));
  ASSERT_OK_AND_ASSIGN(auto reduced, SentinelBuffer(acc_, total));
  const uint64_t bytes = uint64_t{len} * 4;
  ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
    CAUSEWAY_RETURN_IF_ERROR(ops::Add(list, BufferArg(ab, off_a, bytes), BufferArg(bb, off_b, bytes),
                                      BufferArg(sum_b, off_out, bytes), len));
    CAUSEWAY_RETURN_IF_ERROR(ops::FillWords(list, BufferArg(filled, off_b, bytes), len, 5));
    // The scratch and the result at offsets too; the input a sub-range of a.
    return ops::ReduceSum(list, BufferArg(ab, off_b, bytes), BufferArg(reduced, off_a, 4 * 256),
                          BufferArg(reduced, off_out, 4), len);
  }));

  std::vector<uint32_t> want_sum(total, kSentinel), want_fill(total, kSentinel);
  double want_reduced = 0, abs_sum = 0;
  for (uint32_t i = 0; i < len; ++i) {
    want_sum[off_out / 4 + i] = Bits(a[off_a / 4 + i] + b[off_b / 4 + i]);
    want_fill[off_b / 4 + i] = 5;
    want_reduced += a[off_b / 4 + i];
    abs_sum += std::fabs(a[off_b / 4 + i]);
  }
  ASSERT_OK_AND_ASSIGN(auto got_sum, Read<uint32_t>(acc_, sum_b));
  EXPECT_TRUE(WordsEqual(got_sum, want_sum)) << "add";
  ASSERT_OK_AND_ASSIGN(auto got_fill, Read<uint32_t>(acc_, filled));
  EXPECT_TRUE(WordsEqual(got_fill, want_fill)) << "fill";
  ASSERT_OK_AND_ASSIGN(auto got_reduced, Read<uint32_t>(acc_, reduced));
  EXPECT_NEAR(std::bit_cast<float>(got_reduced[off_out / 4]), want_reduced, 1e-5 * abs_sum);
  // Outside the scratch range (whose partial sums are not specified) and the
  // result, nothing changed.
  std::vector<uint32_t> want_reduced_words(total, kSentinel);
  for (uint32_t i = off_a / 4; i < off_a / 4 + 256; ++i) want_reduced_words[i] = got_reduced[i];
  want_reduced_words[off_out / 4] = got_reduced[off_out / 4];
  EXPECT_TRUE(WordsEqual(got_reduced, want_reduced_words)) << "reduce_sum";
  // The input buffers are untouched.
  ASSERT_OK_AND_ASSIGN(auto got_a, Read<uint32_t>(acc_, ab));
  EXPECT_TRUE(WordsEqual(got_a, Bits(a)));
}

// The CPU's combine of two words: a sum or max over f32 or (`i32`) i32.
uint32_t CombineWords(bool max, bool i32, uint32_t x, uint32_t y) {
  if (i32) {
    int32_t sx = static_cast<int32_t>(x), sy = static_cast<int32_t>(y);
    return static_cast<uint32_t>(max ? std::max(sx, sy) : static_cast<int32_t>(x + y));
  }
  float fx = std::bit_cast<float>(x), fy = std::bit_cast<float>(y);
  return Bits(max ? std::max(fx, fy) : fx + fy);
}

// Tests combine (sum and max over f32 and i32) at element offsets into three
// buffers, unaligned (one element at a time) and multiples of 4 (four at a
// time, with and without a remainder): exactly the range is written, each
// result equals the CPU's op on the same words.
TEST_F(KernelsTest, CombineAtAnyOffsetsMatchesCpu) {
  const uint32_t total = 4096;
  struct Layout {
    uint64_t a_off, b_off, out_off;
    uint32_t len;
  };
  const Layout layouts[] = {
      {3, 130, 17, 1001},  // unaligned
      {4, 128, 20, 1001},  // quads and a remainder of 1
      {0, 0, 0, 1000},     // quads only
      {8, 12, 16, 3},      // the remainder only
      {4, 5, 8, 999},      // one operand unaligned
  };
  std::vector<float> af = RandomFloats(total, 31), bf = RandomFloats(total, 32);
  std::vector<uint32_t> ai = RandomWords(total, 33), bi = RandomWords(total, 34);
  for (const Layout& l : layouts) {
    for (bool i32 : {false, true}) {
      for (bool max : {false, true}) {
        SCOPED_TRACE(absl::StrCat(i32 ? "i32" : "f32", max ? " max" : " sum", " at ", l.a_off, ",", l.b_off, "->",
                                  l.out_off, " x", l.len));
        std::vector<uint32_t> a = i32 ? ai : Bits(af), b = i32 ? bi : Bits(bf);
        ASSERT_OK_AND_ASSIGN(auto ab, NewBuffer(acc_, a));
        ASSERT_OK_AND_ASSIGN(auto bb, NewBuffer(acc_, b));
        ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, total));
        ASSERT_OK(RunList(acc_, [&](CommandList& list) {
          return ops::Combine(list, max, i32, {ab, l.a_off}, {bb, l.b_off}, {out, l.out_off}, l.len);
        }));
        std::vector<uint32_t> want(total, kSentinel);
        for (uint32_t i = 0; i < l.len; ++i) {
          want[l.out_off + i] = CombineWords(max, i32, a[l.a_off + i], b[l.b_off + i]);
        }
        ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, out));
        EXPECT_TRUE(WordsEqual(got, want));
      }
    }
  }
}

// Tests combine_n (ops::CombineN) with 1 to 17 operands (beyond eight, the
// dispatches after the first fold into the output), sum and max over f32 and
// i32, with every offset a multiple of 4 (four at a time, with and without a
// remainder) and with one that is not (one at a time), several operands in
// one buffer and one operand given twice: exactly the range is written, and
// each element is the CPU's left fold of the operands in order, bit for bit.
TEST_F(KernelsTest, CombineNFoldsOperandsInOrder) {
  const uint32_t total = 4096;
  struct Layout {
    bool aligned;  // operand offsets multiples of 4
    uint64_t out_off;
    uint32_t len;
  };
  const Layout layouts[] = {
      {true, 8, 1001},   // quads and a remainder of 1
      {true, 0, 1000},   // quads only
      {true, 16, 3},     // the remainder only
      {false, 20, 999},  // operands unaligned
      {true, 17, 1000},  // the output unaligned
  };
  // Operands live in three buffers; operand k at offset (k * 36) % 480 (+k
  // % 3 when unaligned) of buffer k % 3, and the last one repeats the first.
  std::vector<std::vector<uint32_t>> f32_sources, i32_sources;
  for (uint32_t j = 0; j < 3; ++j) {
    f32_sources.push_back(Bits(RandomFloats(total, 40 + j)));
    i32_sources.push_back(RandomWords(total, 50 + j));
  }
  for (size_t count : {1, 2, 3, 8, 9, 13, 17}) {
    for (const Layout& l : layouts) {
      auto source = [&](size_t k) { return k + 1 == count && count > 2 ? 0 : k % 3; };
      auto offset = [&](size_t k) -> uint64_t {
        if (k + 1 == count && count > 2) k = 0;
        return (k * 36) % 480 + (l.aligned ? 0 : k % 3);
      };
      for (bool i32 : {false, true}) {
        for (bool max : {false, true}) {
          SCOPED_TRACE(absl::StrCat(count, " operands, ", i32 ? "i32" : "f32", max ? " max" : " sum",
                                    l.aligned ? ", aligned" : ", unaligned", " -> ", l.out_off, " x", l.len));
          const auto& sources = i32 ? i32_sources : f32_sources;
          std::vector<std::shared_ptr<Buffer>> buffers;
          for (const auto& words : sources) {
            ASSERT_OK_AND_ASSIGN(auto buffer, NewBuffer(acc_, words));
            buffers.push_back(std::move(buffer));
          }
          std::vector<ops::ElementRef> operands;
          for (size_t k = 0; k < count; ++k) operands.push_back({buffers[source(k)], offset(k)});
          ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, total));
          ASSERT_OK(RunList(acc_, [&](CommandList& list) {
            return ops::CombineN(list, max, i32, operands, {out, l.out_off}, l.len);
          }));
          std::vector<uint32_t> want(total, kSentinel);
          for (uint32_t i = 0; i < l.len; ++i) {
            uint32_t acc = sources[source(0)][offset(0) + i];
            for (size_t k = 1; k < count; ++k) acc = CombineWords(max, i32, acc, sources[source(k)][offset(k) + i]);
            want[l.out_off + i] = acc;
          }
          ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, out));
          EXPECT_TRUE(WordsEqual(got, want));
        }
      }
    }
  }
}

// Tests that combine_n refuses what it cannot do, naming it: no operands, a
// null operand, an output overlapping an operand, a range outside a buffer.
TEST_F(KernelsTest, CombineNRefusesBadArguments) {
  ASSERT_OK_AND_ASSIGN(auto a, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList("refusals"));
  EXPECT_ERROR(ops::CombineN(*list, false, false, {}, {out, 0}, 8), absl::StatusCode::kInvalidArgument,
               "no operands");
  EXPECT_ERROR(ops::CombineN(*list, false, false, {{nullptr, 0}}, {out, 0}, 8),
               absl::StatusCode::kInvalidArgument, "operand 0");
  EXPECT_ERROR(ops::CombineN(*list, false, false, {{a, 0}, {out, 4}}, {out, 8}, 8),
               absl::StatusCode::kInvalidArgument, "operand 1", "overlaps the output");
  EXPECT_ERROR(ops::CombineN(*list, false, false, {{a, 60}}, {out, 0}, 8), absl::StatusCode::kOutOfRange,
               "combine_n");
  EXPECT_EQ(list->size(), 0u);
}

// Tests that combine and combine_n split a range larger than one storage
// binding allows (lavapipe: 128 MiB) into several dispatches, leaving nothing
// out, both one element at a time (offset 5) and four at a time (offset 4, a
// remainder); combine_n with nine operands, so that each part chains.
TEST_F(KernelsTest, CombineBeyondTheBindingLimit) {
  const uint64_t limit = acc_->info().limits.maxStorageBufferRange;
  for (uint64_t offset : {5, 4}) {  // elements
    SCOPED_TRACE(absl::StrCat("offset ", offset));
    const uint64_t count = limit / 4 + 1001;
    const uint64_t bytes = (count + offset) * 4;
    ASSERT_OK_AND_ASSIGN(auto a, acc_->CreateBuffer(bytes));
    ASSERT_OK_AND_ASSIGN(auto b, acc_->CreateBuffer(bytes));
    ASSERT_OK_AND_ASSIGN(auto out, acc_->CreateBuffer(bytes));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
      CAUSEWAY_RETURN_IF_ERROR(list.Fill(a, Bits(1.5f)));
      CAUSEWAY_RETURN_IF_ERROR(list.Fill(b, Bits(2.0f)));
      CAUSEWAY_RETURN_IF_ERROR(list.Fill(out, kSentinel));
      return ops::Combine(list, /*max=*/false, /*i32=*/false, {a, offset}, {b, offset}, {out, offset}, count);
    }));
    std::vector<uint32_t> got(count + offset);
    ASSERT_OK(acc_->DownloadSync(out, got.data(), bytes));
    for (uint64_t i = 0; i < offset; ++i) ASSERT_EQ(got[i], kSentinel) << i;
    for (uint64_t i = offset; i < count + offset; ++i) ASSERT_EQ(got[i], Bits(3.5f)) << i;
    // a, b, a, ... nine operands: 5 * 1.5 + 4 * 2 = 15.5.
    std::vector<ops::ElementRef> operands;
    for (int k = 0; k < 9; ++k) operands.push_back({k % 2 == 0 ? a : b, offset});
    ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
      CAUSEWAY_RETURN_IF_ERROR(list.Fill(out, kSentinel));
      return ops::CombineN(list, /*max=*/false, /*i32=*/false, operands, {out, offset}, count);
    }));
    ASSERT_OK(acc_->DownloadSync(out, got.data(), bytes));
    for (uint64_t i = 0; i < offset; ++i) ASSERT_EQ(got[i], kSentinel) << i;
    for (uint64_t i = offset; i < count + offset; ++i) ASSERT_EQ(got[i], Bits(15.5f)) << i;
  }
}

// Tests matmul with each operand at a different aligned offset into one
// shared buffer.
TEST_F(KernelsTest, MatmulOnSubRangesOfOneBuffer) {
  const uint64_t align = acc_->info().limits.minStorageBufferOffsetAlignment;
  const uint32_t m = 9, n = 21, k = 13;
  auto round_up = [&](uint64_t v) { return (v + align - 1) / align * align; };
  const uint64_t off_a = round_up(12);
  const uint64_t off_b = round_up(off_a + 4 * m * k);
  const uint64_t off_c = round_up(off_b + 4 * k * n);
  const uint64_t words = (off_c + 4 * (m * n + kGuard)) / 4;
  std::vector<float> a = RandomFloats(m * k, 31), b = RandomFloats(k * n, 32);
  std::vector<uint32_t> init(words, kSentinel);
  for (uint32_t i = 0; i < m * k; ++i) init[off_a / 4 + i] = Bits(a[i]);
  for (uint32_t i = 0; i < k * n; ++i) init[off_b / 4 + i] = Bits(b[i]);
  ASSERT_OK_AND_ASSIGN(auto buf, NewBuffer(acc_, init));
  ASSERT_OK(RunList(acc_, [&](CommandList& list) {
    return ops::Matmul(list, BufferArg(buf, off_a, 4 * m * k), BufferArg(buf, off_b, 4 * k * n),
                       BufferArg(buf, off_c, 4 * m * n), m, n, k, 8);
  }));
  ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, buf));
  std::vector<uint32_t> c(got.begin() + off_c / 4, got.end());
  EXPECT_TRUE(MatmulClose(c, a, b, m, n, k));
  // A, B and the padding between them are as uploaded.
  EXPECT_TRUE(
      WordsEqual(absl::MakeSpan(got).subspan(0, off_c / 4), absl::MakeSpan(init).subspan(0, off_c / 4)));
}

// --- 4. Kernels compiled at run time -----------------------------------------

// y = x * kMultiplier + bias over a grid-stride loop, and the workgroup size
// reported in `info` (from a second specialization constant).
constexpr char kAffineGlsl[] = R"(#version 450
layout(local_size_x = 64, local_size_x_id = 1) in;
layout(constant_id = 0) const uint kMultiplier = 1;
layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Info { uint local_size; };
layout(push_constant) uniform Params { uint count; float bias; } p;
void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    y[i] = x[i] * float(kMultiplier) + p.bias;
  }
  if (gl_GlobalInvocationID.x == 0) local_size = gl_WorkGroupSize.x;
}
)";
struct AffineParams {
  uint32_t count;
  float bias;
};

// Tests a GLSL kernel with specialization and push constants: three spec
// values in one list give three results, each from its own cached pipeline.
TEST_F(KernelsTest, GlslKernelWithSpecializationAndPushConstants) {
  ASSERT_OK_AND_ASSIGN(auto kernel, Kernel::FromGlsl("affine", kAffineGlsl));
  ASSERT_EQ(kernel->reflection().push_constant_size, sizeof(AffineParams));
  const uint32_t n = 1001;
  std::vector<float> x(n);
  for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<int>(i % 100) - 50);
  ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));

  struct Case {
    SpecValues spec;
    float multiplier;
    uint32_t local_size;
  };
  const Case cases[] = {{{}, 1, 64}, {{{0, 3}, {1, 32}}, 3, 32}, {{{0, 5}}, 5, 64}};
  std::vector<std::shared_ptr<Buffer>> ys, infos;
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  for (const Case& c : cases) {
    ASSERT_OK_AND_ASSIGN(auto y, SentinelBuffer(acc_, n + kGuard));
    ASSERT_OK_AND_ASSIGN(auto info, SentinelBuffer(acc_, 1));
    ASSERT_OK(list->Dispatch(kernel, {xb, y, info}, AffineParams{n, 0.5f}, {4, 1, 1}, c.spec));
    ys.push_back(y);
    infos.push_back(info);
  }
  ASSERT_OK(acc_->Submit(list).Await());
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(absl::StrCat("multiplier ", cases[i].multiplier));
    std::vector<float> want(n);
    for (uint32_t j = 0; j < n; ++j) want[j] = x[j] * cases[i].multiplier + 0.5f;
    ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, ys[i]));
    EXPECT_TRUE(WordsEqual(got, WithGuard(Bits(want))));
    ASSERT_OK_AND_ASSIGN(auto info, Read<uint32_t>(acc_, infos[i]));
    EXPECT_EQ(info[0], cases[i].local_size);
  }

  // One pipeline per set of values, whatever their order; each with its own
  // workgroup size.
  Device& device = acc_->device();
  ASSERT_OK_AND_ASSIGN(const Pipeline* p3, device.GetPipeline(kernel, {{0, 3}, {1, 32}}));
  ASSERT_OK_AND_ASSIGN(const Pipeline* p3_again, device.GetPipeline(kernel, {{1, 32}, {0, 3}}));
  ASSERT_OK_AND_ASSIGN(const Pipeline* p5, device.GetPipeline(kernel, {{0, 5}}));
  ASSERT_OK_AND_ASSIGN(const Pipeline* p_default, device.GetPipeline(kernel));
  EXPECT_EQ(p3, p3_again);
  EXPECT_NE(p3, p5);
  EXPECT_NE(p5, p_default);
  EXPECT_EQ(p3->local_size, (std::array<uint32_t, 3>{32, 1, 1}));
  EXPECT_EQ(p5->local_size, (std::array<uint32_t, 3>{64, 1, 1}));
}

// Tests that the same run-time kernel replayed with a new push constant in a
// second list gives the new result (push constants are per dispatch).
TEST_F(KernelsTest, GlslKernelPushConstantsArePerDispatch) {
  ASSERT_OK_AND_ASSIGN(auto kernel, Kernel::FromGlsl("affine", kAffineGlsl));
  const uint32_t n = 300;
  std::vector<float> x(n, 2.0f);
  ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
  ASSERT_OK_AND_ASSIGN(auto y1, SentinelBuffer(acc_, n + kGuard));
  ASSERT_OK_AND_ASSIGN(auto y2, SentinelBuffer(acc_, n + kGuard));
  ASSERT_OK_AND_ASSIGN(auto info, SentinelBuffer(acc_, 1));
  ASSERT_OK(RunList(acc_, [&](CommandList& list) -> absl::Status {
    CAUSEWAY_RETURN_IF_ERROR(
        list.Dispatch(kernel, {xb, y1, info}, AffineParams{n, 1.0f}, {2, 1, 1}, {{0, 7}}));
    // Same pipeline, only the count and bias differ.
    return list.Dispatch(kernel, {xb, y2, info}, AffineParams{n - 100, -1.0f}, {2, 1, 1}, {{0, 7}});
  }));
  ASSERT_OK_AND_ASSIGN(auto got1, Read<uint32_t>(acc_, y1));
  ASSERT_OK_AND_ASSIGN(auto got2, Read<uint32_t>(acc_, y2));
  EXPECT_TRUE(WordsEqual(got1, WithGuard(std::vector<uint32_t>(n, Bits(15.0f)))));
  std::vector<uint32_t> want2(n + kGuard, kSentinel);
  for (uint32_t i = 0; i < n - 100; ++i) want2[i] = Bits(13.0f);
  EXPECT_TRUE(WordsEqual(got2, want2));
}

// --- 5. Arguments that do not match the reflection -----------------------------

// out[i] = table.entries[i % 16] + table.header.x: binding 0 has a fixed part
// of 16 + 64 = 80 bytes.
constexpr char kLookupGlsl[] = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0, std430) readonly buffer Table { uvec4 header; uint entries[16]; } table;
layout(set = 0, binding = 1, std430) writeonly buffer Out { uint result[]; };
layout(push_constant) uniform Params { uint count; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i < p.count) result[i] = table.entries[i % 16] + table.header.x;
}
)";

// Tests that a buffer smaller than a binding's fixed part is refused, naming
// the kernel, the binding and both sizes, and that a large enough one works.
TEST_F(KernelsTest, BufferSmallerThanFixedBlockIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto kernel, Kernel::FromGlsl("lookup", kLookupGlsl));
  ASSERT_EQ(kernel->reflection().bindings.at(0).min_size, 80u);
  std::vector<uint32_t> table(20);
  for (uint32_t i = 0; i < 20; ++i) table[i] = 1000 + i * i;
  ASSERT_OK_AND_ASSIGN(auto table_b, NewBuffer(acc_, table));
  ASSERT_OK_AND_ASSIGN(auto small, SentinelBuffer(acc_, 16));
  const uint32_t n = 100;
  ASSERT_OK_AND_ASSIGN(auto out, SentinelBuffer(acc_, n + kGuard));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());

  absl::Status s = list->Dispatch(kernel, {small, out}, CountParams{n}, {2, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'lookup'"), HasSubstr("binding 0"),
                                 HasSubstr("at least 80 bytes"), HasSubstr("got 64")));
  // A sub-range of a big enough buffer counts by its own size.
  s = list->Dispatch(kernel, {BufferArg(table_b, 0, 76), out}, CountParams{n}, {2, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("binding 0"), HasSubstr("got 76")));
  EXPECT_EQ(list->size(), 0u);

  ASSERT_OK(list->Dispatch(kernel, {table_b, out}, CountParams{n}, {2, 1, 1}));
  ASSERT_OK(acc_->Submit(list).Await());
  std::vector<uint32_t> want(n + kGuard, kSentinel);
  for (uint32_t i = 0; i < n; ++i) want[i] = table[4 + i % 16] + table[0];
  ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, out));
  EXPECT_TRUE(WordsEqual(got, want));
}

// Tests that mismatched dispatch arguments give errors that name the kernel
// and what was expected, append nothing, and that the list and the
// accelerator then run a correct dispatch.
TEST_F(KernelsTest, MismatchedArgumentsGiveClearErrors) {
  ASSERT_OK_AND_ASSIGN(auto add, BuiltinKernel("add"));
  const uint32_t n = 600;
  std::vector<float> x = RandomFloats(n, 41), y = RandomFloats(n, 42);
  ASSERT_OK_AND_ASSIGN(auto a, NewBuffer(acc_, x));
  ASSERT_OK_AND_ASSIGN(auto b, NewBuffer(acc_, y));
  ASSERT_OK_AND_ASSIGN(auto c, SentinelBuffer(acc_, n));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList("errors"));
  const std::array<uint32_t, 3> groups = Groups1D(n, 256);
  const uint64_t size = c->size();

  // Wrong number of buffers, both ways.
  absl::Status s = list->Dispatch(add, {a, b}, CountParams{n}, groups);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'add'"), HasSubstr("expects 3 buffer arguments, got 2")));
  s = list->Dispatch(add, {a, b, c, c}, CountParams{n}, groups);
  EXPECT_THAT(s.message(), HasSubstr("expects 3 buffer arguments, got 4"));

  // A null buffer.
  s = list->Dispatch(add, {a, std::shared_ptr<Buffer>(), c}, CountParams{n}, groups);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'add'"), HasSubstr("binding 1"), HasSubstr("null")));

  // Wrong push-constant size: too many bytes, and none.
  s = list->Dispatch(add, {a, b, c}, FillParams{n, 0}, groups);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'add'"), HasSubstr("expects 4 bytes of push constants, got 8")));
  s = list->Dispatch(add, {a, b, c}, absl::Span<const uint8_t>(), groups);
  EXPECT_THAT(s.message(), HasSubstr("got 0"));

  // Zero workgroups in any dimension, and more than the device allows.
  for (int d = 0; d < 3; ++d) {
    std::array<uint32_t, 3> g = {1, 1, 1};
    g[d] = 0;
    s = list->Dispatch(add, {a, b, c}, CountParams{n}, g);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(s.message(),
                AllOf(HasSubstr("'add'"), HasSubstr(absl::StrCat("0 workgroups in dimension ", d))));
  }
  const uint32_t max_x = acc_->info().limits.maxComputeWorkGroupCount[0];
  if (max_x < UINT32_MAX) {
    s = list->Dispatch(add, {a, b, c}, CountParams{n}, {max_x + 1, 1, 1});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("allowed 1..", max_x)));
  }

  // Ranges outside the buffer: too long, starting past the end, and a size
  // whose sum with the offset wraps around.
  s = list->Dispatch(add, {a, b, BufferArg(c, 0, size + 4)}, CountParams{n}, groups);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'add'"), HasSubstr("binding 2"), HasSubstr("outside the buffer"),
                                 HasSubstr(absl::StrCat(size, " bytes"))));
  s = list->Dispatch(add, {BufferArg(a, size + 16, VK_WHOLE_SIZE), b, c}, CountParams{n}, groups);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), AllOf(HasSubstr("binding 0"), HasSubstr("outside the buffer")));
  s = list->Dispatch(add, {a, BufferArg(b, 16, UINT64_MAX - 8), c}, CountParams{n}, groups);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("binding 1"));
  // An empty range at the very end.
  s = list->Dispatch(add, {a, b, BufferArg(c, size, VK_WHOLE_SIZE)}, CountParams{n}, groups);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("binding 2"), HasSubstr("got 0")));

  // An offset that is not a multiple of the device's alignment.
  const uint64_t align = acc_->info().limits.minStorageBufferOffsetAlignment;
  if (align > 4) {
    s = list->Dispatch(add, {a, BufferArg(b, 4, size - 4), c}, CountParams{n - 1}, groups);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("binding 1"),
                                   HasSubstr(absl::StrCat("offset 4 is not a multiple of ", align))));
  }

  // A specialization constant the kernel does not have.
  s = list->Dispatch(add, {a, b, c}, CountParams{n}, groups, {{9, 1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'add'"), HasSubstr("no specialization constant 9")));

  // Nothing was appended; a correct dispatch still records and runs.
  EXPECT_EQ(list->size(), 0u);
  ASSERT_OK(list->Dispatch(add, {a, b, c}, CountParams{n}, groups));
  ASSERT_OK(acc_->Submit(list).Await());
  std::vector<float> want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, c));
  EXPECT_TRUE(WordsEqual(got, Bits(want)));
  EXPECT_OK(acc_->health());

  // A submitted list is sealed.
  s = list->Dispatch(add, {a, b, c}, CountParams{n}, groups);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'errors'"), HasSubstr("already submitted")));
}

// Tests that a range outside the buffer is reported as OutOfRange, for
// dispatches as for copies and fills.
TEST_F(KernelsTest, RangeOutsideBufferIsOutOfRange) {
  ASSERT_OK_AND_ASSIGN(auto add, BuiltinKernel("add"));
  ASSERT_OK_AND_ASSIGN(auto buf, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  absl::Status s = list->Dispatch(add, {buf, buf, BufferArg(buf, 0, 260)}, CountParams{64}, {1, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  s = list->Dispatch(add, {buf, buf, BufferArg(buf, 272, VK_WHOLE_SIZE)}, CountParams{64}, {1, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  s = list->Fill(BufferArg(buf, 0, 260), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(list->size(), 0u);
}

// Tests that fill and copy commands refuse ranges whose offset + size wraps
// around 2^64 (which would otherwise pass an `offset + size > buffer size`
// check and reach the driver with a huge size).
TEST_F(KernelsTest, FillAndCopyRefuseWrappingRanges) {
  ASSERT_OK_AND_ASSIGN(auto buf, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto other, SentinelBuffer(acc_, 64));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  const uint64_t wrapping = UINT64_MAX - 15;  // 16 + wrapping == 0 (mod 2^64); a multiple of 4
  EXPECT_ERROR(list->Fill(BufferArg(buf, 16, wrapping), 1), absl::StatusCode::kOutOfRange,
               absl::StrCat("Fill: range [16, +", wrapping, ") is outside a buffer of 256 bytes"));
  EXPECT_ERROR(list->Copy(BufferArg(buf, 16, wrapping), BufferArg(other, 16, wrapping)),
               absl::StatusCode::kOutOfRange,
               absl::StrCat("Copy: range [16, +", wrapping, ") is outside a buffer of 256 bytes"));
  EXPECT_EQ(list->size(), 0u);
  // In-range commands on the same list still work.
  ASSERT_OK(list->Fill(BufferArg(buf, 16, 32), 9));
  ASSERT_OK(list->Copy(BufferArg(buf, 0, 64), BufferArg(other, 64, 64)));
  ASSERT_EQ(list->size(), 2u);
  ASSERT_OK(acc_->Submit(list).Await());
  std::vector<uint32_t> want(64, kSentinel);
  for (int i = 4; i < 12; ++i) want[i] = 9;
  ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, buf));
  EXPECT_TRUE(WordsEqual(got, want));
  std::vector<uint32_t> want_other(64, kSentinel);
  for (int i = 0; i < 16; ++i) want_other[16 + i] = want[i];
  ASSERT_OK_AND_ASSIGN(auto got_other, Read<uint32_t>(acc_, other));
  EXPECT_TRUE(WordsEqual(got_other, want_other));
}

// Tests that a kernel never writes a buffer of another accelerator (refused,
// naming the kernel, the binding and both accelerators, nothing appended),
// that it reads one in place where the two share memory (as lavapipe's
// VkDevices do), and that both accelerators then work.
TEST(KernelsMultiAcceleratorTest, BufferOfAnotherAcceleratorIsReadNeverWritten) {
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(rt->size(), 2u);
  Accelerator* acc0 = rt->accelerator(0);
  Accelerator* acc1 = rt->accelerator(1);
  ASSERT_NE(acc0->PathFrom(*acc1), CopyPath::kHostStaged);
  ASSERT_OK_AND_ASSIGN(auto add, BuiltinKernel("add"));
  const uint32_t n = 100;
  std::vector<float> x = RandomFloats(n, 51), y = RandomFloats(n, 52);
  ASSERT_OK_AND_ASSIGN(auto a0, NewBuffer(acc0, x));
  ASSERT_OK_AND_ASSIGN(auto b0, NewBuffer(acc0, y));
  ASSERT_OK_AND_ASSIGN(auto c0, SentinelBuffer(acc0, n));
  ASSERT_OK_AND_ASSIGN(auto b1, NewBuffer(acc1, y));
  ASSERT_OK_AND_ASSIGN(auto list, acc0->CreateCommandList());

  absl::Status s = list->Dispatch(add, {a0, b0, b1}, CountParams{n}, {1, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'add'"), HasSubstr("binding 2 is written"), HasSubstr("accelerator 1"),
                                 HasSubstr("accelerator 0")));
  EXPECT_EQ(list->size(), 0u);

  std::vector<float> want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  ASSERT_OK(list->Dispatch(add, {a0, b1, c0}, CountParams{n}, {1, 1, 1}));  // b1 read in place
  ASSERT_OK(acc0->Submit(list).Await());
  ASSERT_OK_AND_ASSIGN(auto got0, Read<uint32_t>(acc0, c0));
  EXPECT_TRUE(WordsEqual(got0, Bits(want)));
  // The other accelerator's buffer is intact and usable there.
  ASSERT_OK_AND_ASSIGN(auto a1, NewBuffer(acc1, x));
  ASSERT_OK_AND_ASSIGN(auto c1, SentinelBuffer(acc1, n));
  ASSERT_OK(RunList(acc1, [&](CommandList& l) { return ops::Add(l, a1, b1, c1, n); }));
  ASSERT_OK_AND_ASSIGN(auto got1, Read<uint32_t>(acc1, c1));
  EXPECT_TRUE(WordsEqual(got1, Bits(want)));
}

// --- 6. Descriptor sets instead of push descriptors ----------------------------

// Matmul shapes of the mixed workload: (M, N, K).
constexpr uint32_t kMixedM1 = 17, kMixedN1 = 33, kMixedK1 = 65;
constexpr uint32_t kMixedM2 = 64, kMixedN2 = 64, kMixedK2 = 64;

// The outputs (as words) of one list of adds, muls and matmuls.
struct MixedResults {
  std::vector<uint32_t> sum, product, c1, c2;
};

// Runs add, mul and two matmuls (on sub-ranges of the same inputs) in one
// list, submitted three times before any is awaited, so that several
// recordings, each with its own descriptors, exist at once.
absl::StatusOr<MixedResults> RunMixed(Accelerator* acc, const std::vector<float>& x,
                                      const std::vector<float>& y, const std::vector<float>& a,
                                      const std::vector<float>& b) {
  const uint32_t n = static_cast<uint32_t>(x.size());
  CAUSEWAY_ASSIGN_OR_RETURN(auto xb, NewBuffer(acc, x));
  CAUSEWAY_ASSIGN_OR_RETURN(auto yb, NewBuffer(acc, y));
  CAUSEWAY_ASSIGN_OR_RETURN(auto ab, NewBuffer(acc, a));
  CAUSEWAY_ASSIGN_OR_RETURN(auto bb, NewBuffer(acc, b));
  CAUSEWAY_ASSIGN_OR_RETURN(auto sum, SentinelBuffer(acc, n + kGuard));
  CAUSEWAY_ASSIGN_OR_RETURN(auto product, SentinelBuffer(acc, n + kGuard));
  CAUSEWAY_ASSIGN_OR_RETURN(auto c1, SentinelBuffer(acc, kMixedM1 * kMixedN1 + kGuard));
  CAUSEWAY_ASSIGN_OR_RETURN(auto c2, SentinelBuffer(acc, kMixedM2 * kMixedN2 + kGuard));
  CAUSEWAY_ASSIGN_OR_RETURN(auto list, acc->CreateCommandList("mixed"));
  CAUSEWAY_RETURN_IF_ERROR(ops::Add(*list, xb, yb, sum, n));
  CAUSEWAY_RETURN_IF_ERROR(ops::Matmul(*list, ab, bb, c1, kMixedM1, kMixedN1, kMixedK1, 16));
  CAUSEWAY_RETURN_IF_ERROR(ops::Mul(*list, xb, yb, product, n));
  CAUSEWAY_RETURN_IF_ERROR(ops::Matmul(*list, ab, bb, c2, kMixedM2, kMixedN2, kMixedK2, 8));
  std::vector<Future<>> futures;
  for (int i = 0; i < 3; ++i) futures.push_back(acc->Submit(list));
  for (const Future<>& f : futures) CAUSEWAY_RETURN_IF_ERROR(f.Await());
  MixedResults r;
  CAUSEWAY_ASSIGN_OR_RETURN(r.sum, Read<uint32_t>(acc, sum));
  CAUSEWAY_ASSIGN_OR_RETURN(r.product, Read<uint32_t>(acc, product));
  CAUSEWAY_ASSIGN_OR_RETURN(r.c1, Read<uint32_t>(acc, c1));
  CAUSEWAY_ASSIGN_OR_RETURN(r.c2, Read<uint32_t>(acc, c2));
  return r;
}

// Tests that a runtime that binds descriptor sets (push descriptors off) gives
// the same add and matmul results as one that pushes them, and right ones.
TEST(KernelsDescriptorSetTest, DescriptorSetsMatchPushDescriptors) {
  RuntimeOptions options = TestOptions(1);
  options.use_push_descriptors = false;
  auto sets_rt = MakeRuntime(options);
  ASSERT_NE(sets_rt, nullptr);
  auto push_rt = MakeRuntime(1);
  ASSERT_NE(push_rt, nullptr);
  Accelerator* sets_acc = sets_rt->accelerator(0);
  Accelerator* push_acc = push_rt->accelerator(0);
  EXPECT_FALSE(sets_acc->device().push_descriptors());
  if (push_acc->info().push_descriptor) {
    EXPECT_TRUE(push_acc->device().push_descriptors());
  }

  const uint32_t n = 1003;
  std::vector<float> x = RandomFloats(n, 61), y = RandomFloats(n, 62);
  std::vector<float> a = RandomFloats(kMixedM2 * kMixedK2, 63), b = RandomFloats(kMixedK2 * kMixedN2, 64);
  ASSERT_OK_AND_ASSIGN(MixedResults with_sets, RunMixed(sets_acc, x, y, a, b));
  ASSERT_OK_AND_ASSIGN(MixedResults with_push, RunMixed(push_acc, x, y, a, b));

  std::vector<float> sum(n), product(n);
  for (uint32_t i = 0; i < n; ++i) {
    sum[i] = x[i] + y[i];
    product[i] = x[i] * y[i];
  }
  EXPECT_TRUE(WordsEqual(with_sets.sum, WithGuard(Bits(sum))));
  EXPECT_TRUE(WordsEqual(with_sets.product, WithGuard(Bits(product))));
  // The first matmul reads the leading parts of A and B as its (smaller) operands.
  std::vector<float> a1(a.begin(), a.begin() + kMixedM1 * kMixedK1);
  std::vector<float> b1(b.begin(), b.begin() + kMixedK1 * kMixedN1);
  EXPECT_TRUE(MatmulClose(with_sets.c1, a1, b1, kMixedM1, kMixedN1, kMixedK1));
  EXPECT_TRUE(MatmulClose(with_sets.c2, a, b, kMixedM2, kMixedN2, kMixedK2));
  // Same kernels on the same driver: the same bits either way.
  EXPECT_TRUE(WordsEqual(with_sets.sum, with_push.sum));
  EXPECT_TRUE(WordsEqual(with_sets.product, with_push.product));
  EXPECT_TRUE(WordsEqual(with_sets.c1, with_push.c1));
  EXPECT_TRUE(WordsEqual(with_sets.c2, with_push.c2));
}

// --- 7. Dependent dispatches in one list ----------------------------------------

// Tests a chain of dependent kernels, fills and copies in one list, with
// read-after-write, write-after-read and write-after-write hazards between
// compute and transfer commands: each step must see the previous ones.
TEST_F(KernelsTest, DependentCommandsInOneListSeeEachOther) {
  const uint32_t n = 100003;
  std::shared_ptr<Buffer> a, b, c, d, e, f, g;
  for (std::shared_ptr<Buffer>* buf : {&a, &b, &c, &d, &e, &f, &g}) {
    ASSERT_OK_AND_ASSIGN(*buf, SentinelBuffer(acc_, n));
  }
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList("chain"));
  ASSERT_OK(ops::FillWords(*list, a, n, Bits(1.5f)));  // a = 1.5
  ASSERT_OK(ops::Scale(*list, a, b, n, 3.0f));         // b = 3a = 4.5         (RAW a)
  ASSERT_OK(ops::Add(*list, a, b, c, n));              // c = a + b = 6        (RAW b)
  ASSERT_OK(ops::Scale(*list, c, a, n, 2.0f));         // a = 2c = 12          (RAW c, WAR a)
  ASSERT_OK(ops::CopyWords(*list, a, d, n));           // d = a = 12           (RAW a)
  ASSERT_OK(list->Fill(d, Bits(7.0f)));                // d = 7, by transfer   (WAW d)
  ASSERT_OK(ops::Add(*list, d, a, e, n));              // e = d + a = 19       (RAW d from transfer)
  ASSERT_OK(list->Copy(e, f));                         // f = e = 19, transfer (RAW e from compute)
  ASSERT_OK(ops::Mul(*list, f, b, g, n));              // g = f * b = 85.5     (RAW f from transfer)
  ASSERT_EQ(list->size(), 9u);
  ASSERT_OK(acc_->Submit(list).Await());

  const std::pair<const std::shared_ptr<Buffer>*, float> want[] = {
      {&a, 12.0f}, {&b, 4.5f}, {&c, 6.0f}, {&d, 7.0f}, {&e, 19.0f}, {&f, 19.0f}, {&g, 85.5f}};
  for (const auto& [buf, value] : want) {
    SCOPED_TRACE(absl::StrCat("want ", value));
    ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, *buf));
    EXPECT_TRUE(WordsEqual(got, std::vector<uint32_t>(n, Bits(value))));
  }
}

// Tests a list of two dependent dispatches (t = 2x; x = x + t) submitted 10
// times without waiting in between: every replay sees the previous one, so x
// triples each time.
TEST_F(KernelsTest, ReplayedDependentListAccumulates) {
  const uint32_t n = 4099;
  std::vector<float> x0(n);
  for (uint32_t i = 0; i < n; ++i) x0[i] = static_cast<float>(i % 5) - 2.0f;
  ASSERT_OK_AND_ASSIGN(auto x, NewBuffer(acc_, x0));
  ASSERT_OK_AND_ASSIGN(auto t, SentinelBuffer(acc_, n));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList("triple"));
  ASSERT_OK(ops::Scale(*list, x, t, n, 2.0f));
  ASSERT_OK(ops::Add(*list, x, t, x, n));
  std::vector<Future<>> futures;
  for (int i = 0; i < 10; ++i) futures.push_back(acc_->Submit(list));
  for (const Future<>& f : futures) ASSERT_OK(f.Await());
  std::vector<float> want(n), want_t(n);
  for (uint32_t i = 0; i < n; ++i) {
    want[i] = x0[i] * 59049.0f;           // 3^10, exact
    want_t[i] = x0[i] * 2.0f * 19683.0f;  // 2 * 3^9
  }
  ASSERT_OK_AND_ASSIGN(auto got, Read<uint32_t>(acc_, x));
  EXPECT_TRUE(WordsEqual(got, Bits(want)));
  ASSERT_OK_AND_ASSIGN(auto got_t, Read<uint32_t>(acc_, t));
  EXPECT_TRUE(WordsEqual(got_t, Bits(want_t)));
}

}  // namespace
}  // namespace causeway
