// The causal self-attention kernels (causeway/shaders/attention*.comp through
// causeway/kernels/attention_ops.h) on lavapipe against the CPU reference of
// causeway/kernels/attention_reference.h, and that reference against finite
// differences: shapes not multiples of the blocks, causality, determinism and
// argument checks.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
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
#include "causeway/kernels/attention_ops.h"
#include "causeway/kernels/attention_reference.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/runtime.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::ops::OpPlan;
using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;

// A NaN bit pattern no kernel produces: words still holding it were not
// written.
constexpr uint32_t kSentinel = 0x7fc0dead;
// Words of sentinel after each output, to catch writes past the end.
constexpr uint32_t kGuard = 37;

// Tolerances against the double-precision reference, per element:
// |got - want| <= tol * max(1, |want|). Inputs are uniform in [-1, 1), so the
// scaled scores are O(1) and each f32 dot product of head_dim <= 128 terms is
// off by a few 1e-7 at most; the online softmax's rescaling adds a few ulps
// per key block, and the backward sums up to T products per element.
// Measured worst cases on lavapipe: 2e-7 (forward), 1e-6 (backward). A wrong
// mask or block edge is off by 1e-2 or more; a 0.1% error in delta by 1e-4.
constexpr double kForwardTolerance = 1e-5;
constexpr double kBackwardTolerance = 2e-5;

// The shapes of the kernel tests: T around and past the blocks (16 rows per
// workgroup, 16 streamed rows per step), head_dim from 3 (odd, and each
// kernel is specialized for it) to the largest, 128.
struct Shape {
  uint32_t batch, heads, seq_len, head_dim;
};
// On the lanes path a group owns 8 R rows, R = 128 / head_dim clamped to
// [1, 8] forward and [1, 4] backward: T = 31, 33 and 40 and the head_dims
// 32 and 48 cross those edges too.
constexpr Shape kShapes[] = {
    {1, 1, 1, 8},    {2, 3, 1, 64},  {1, 2, 7, 8},   {2, 1, 7, 16},   {1, 3, 7, 64},   {1, 1, 64, 8},
    {2, 2, 64, 16},  {1, 3, 64, 64}, {1, 2, 129, 8}, {2, 1, 129, 16}, {2, 3, 129, 64}, {1, 2, 20, 3},
    {1, 1, 33, 128}, {1, 2, 31, 32}, {2, 1, 33, 32}, {1, 2, 40, 48},
};

AttentionShape ToShape(const Shape& s) { return AttentionShape{s.batch, s.heads, s.seq_len, s.head_dim}; }

reference::AttentionDims ToDims(const AttentionShape& s) {
  return reference::AttentionDims{s.batch, s.heads, s.seq_len, s.head_dim,
                                  1.0f / std::sqrt(static_cast<float>(s.head_dim))};
}

std::string Name(const AttentionShape& s) {
  return absl::StrCat("[", s.batch, ", ", s.heads, ", ", s.seq_len, ", ", s.head_dim, "]");
}

// A device buffer holding `data`.
template <typename T>
absl::StatusOr<std::shared_ptr<Buffer>> NewBuffer(Accelerator* acc, const std::vector<T>& data) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, acc->CreateBuffer(data.size() * sizeof(T)));
  CAUSEWAY_RETURN_IF_ERROR(acc->UploadSync(buffer, data.data(), data.size() * sizeof(T)));
  return buffer;
}

// An output buffer: `floats` sentinels, then kGuard more.
absl::StatusOr<std::shared_ptr<Buffer>> OutputBuffer(Accelerator* acc, uint64_t floats) {
  return NewBuffer(acc, std::vector<uint32_t>(floats + kGuard, kSentinel));
}

// The whole of `buffer` as 32-bit words.
absl::StatusOr<std::vector<uint32_t>> ReadWords(Accelerator* acc, const std::shared_ptr<Buffer>& buffer) {
  std::vector<uint32_t> out(buffer->size() / 4);
  CAUSEWAY_RETURN_IF_ERROR(acc->DownloadSync(buffer, out.data(), out.size() * 4));
  return out;
}

absl::Status RunList(Accelerator* acc, absl::FunctionRef<absl::Status(CommandList&)> record) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<CommandList> list, acc->CreateCommandList("attention_test"));
  CAUSEWAY_RETURN_IF_ERROR(record(*list));
  return acc->Submit(list).Await();
}

// Success when `got` (the values, then kGuard untouched sentinels) is within
// tol * max(1, |want|) of `want` everywhere; else the worst and first errors.
::testing::AssertionResult Close(const std::vector<uint32_t>& got, const std::vector<float>& want, double tol,
                                 const char* what) {
  if (got.size() != want.size() + kGuard) {
    return ::testing::AssertionFailure()
           << what << ": got " << got.size() << " words, want " << want.size() + kGuard;
  }
  size_t bad = 0;
  double worst = 0;
  std::string first;
  for (size_t i = 0; i < want.size(); ++i) {
    const float g = std::bit_cast<float>(got[i]);
    const double err = std::fabs(double{g} - want[i]) / std::max(1.0, std::fabs(double{want[i]}));
    if (!(err <= tol)) {  // NaN (an unwritten sentinel) fails too
      worst = std::isnan(err) ? err : std::max(worst, err);
      if (++bad <= 5) absl::StrAppend(&first, " [", i, "] got ", g, " want ", want[i], ";");
    }
  }
  for (size_t i = want.size(); i < got.size(); ++i) {
    if (got[i] != kSentinel && ++bad <= 5) absl::StrAppend(&first, " guard word ", i, " was written;");
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << want.size()
                                       << " elements off (worst relative error " << worst << "):" << first;
}

// Largest relative error of `got` (values then guard) against `want`.
double WorstError(const std::vector<uint32_t>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = std::bit_cast<float>(got[i]);
    worst = std::max(worst, std::fabs(g - want[i]) / std::max(1.0, std::fabs(double{want[i]})));
  }
  return worst;
}

struct Inputs {
  std::vector<float> q, k, v, d_out;
};

Inputs RandomInputs(const AttentionShape& s, uint32_t seed) {
  const size_t n = s.elements();
  return Inputs{RandomFloats(n, seed), RandomFloats(n, seed + 1), RandomFloats(n, seed + 2),
                RandomFloats(n, seed + 3)};
}

// Every kernel test runs on both paths: lanes is what lavapipe picks, shared
// tiles what a GPU does.
class AttentionTest : public ::testing::TestWithParam<ops::AttentionPath> {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(1);
    ASSERT_NE(rt_, nullptr);
    acc_ = rt_->accelerator(0);
  }

  // Device results of the forward (out, lse) and, when `backward`, of the
  // backward (dq, dk, dv) recorded in the same list; each with its guard.
  struct DeviceResults {
    std::vector<uint32_t> out, lse, dq, dk, dv;
  };
  absl::StatusOr<DeviceResults> Run(const AttentionShape& s, const Inputs& in, bool backward) {
    const uint64_t n = s.elements();
    CAUSEWAY_ASSIGN_OR_RETURN(auto q, NewBuffer(acc_, in.q));
    CAUSEWAY_ASSIGN_OR_RETURN(auto k, NewBuffer(acc_, in.k));
    CAUSEWAY_ASSIGN_OR_RETURN(auto v, NewBuffer(acc_, in.v));
    CAUSEWAY_ASSIGN_OR_RETURN(auto d_out, NewBuffer(acc_, in.d_out));
    CAUSEWAY_ASSIGN_OR_RETURN(auto out, OutputBuffer(acc_, n));
    CAUSEWAY_ASSIGN_OR_RETURN(auto lse, OutputBuffer(acc_, s.rows()));
    CAUSEWAY_ASSIGN_OR_RETURN(auto delta, OutputBuffer(acc_, s.rows()));
    CAUSEWAY_ASSIGN_OR_RETURN(auto dq, OutputBuffer(acc_, n));
    CAUSEWAY_ASSIGN_OR_RETURN(auto dk, OutputBuffer(acc_, n));
    CAUSEWAY_ASSIGN_OR_RETURN(auto dv, OutputBuffer(acc_, n));
    const DeviceCapabilities& device = acc_->capabilities();
    CAUSEWAY_ASSIGN_OR_RETURN(OpPlan forward, ops::PlanAttentionForward(s, &device, GetParam()));
    CAUSEWAY_ASSIGN_OR_RETURN(OpPlan backward_plan, ops::PlanAttentionBackward(s, &device, GetParam()));
    CAUSEWAY_RETURN_IF_ERROR(RunList(acc_, [&](CommandList& list) -> absl::Status {
      CAUSEWAY_RETURN_IF_ERROR(ops::Record(list, forward, {q, k, v, out, lse}));
      if (!backward) return absl::OkStatus();
      return ops::Record(list, backward_plan, {q, k, v, out, d_out, lse, delta, dq, dk, dv});
    }));
    DeviceResults r;
    CAUSEWAY_ASSIGN_OR_RETURN(r.out, ReadWords(acc_, out));
    CAUSEWAY_ASSIGN_OR_RETURN(r.lse, ReadWords(acc_, lse));
    if (backward) {
      CAUSEWAY_ASSIGN_OR_RETURN(r.dq, ReadWords(acc_, dq));
      CAUSEWAY_ASSIGN_OR_RETURN(r.dk, ReadWords(acc_, dk));
      CAUSEWAY_ASSIGN_OR_RETURN(r.dv, ReadWords(acc_, dv));
    }
    return r;
  }

  std::unique_ptr<Runtime> rt_;
  Accelerator* acc_ = nullptr;
};

// --- The CPU reference ------------------------------------------------------

// Tests the reference forward on a hand-checkable case: row 0 copies v[0],
// row 1 averages v[0] and v[1] when their scores are equal.
TEST(AttentionReferenceTest, ForwardMatchesHandComputedRows) {
  // One head, T = 2, head_dim = 1, q = 0 so all scores are 0.
  reference::AttentionDims dims{1, 1, 2, 1, 1.0f};
  auto r = reference::AttentionForward({0, 0}, {3, -5}, {2, 6}, dims);
  EXPECT_FLOAT_EQ(r.out[0], 2.0f);
  EXPECT_FLOAT_EQ(r.out[1], 4.0f);
  EXPECT_FLOAT_EQ(r.lse[0], 0.0f);
  EXPECT_FLOAT_EQ(r.lse[1], std::log(2.0f));
}

// Tests the reference backward against central finite differences of the
// reference forward, for loss = sum(d_out * out). The forward rounds to f32
// (relative 6e-8 of values O(1)), so with h = 1e-3 the difference quotient
// is off by ~1e-4 at most, its truncation error by ~1e-6.
TEST(AttentionReferenceTest, BackwardMatchesFiniteDifferences) {
  const reference::AttentionDims dims{1, 2, 5, 3, 0.7f};
  const AttentionShape shape{1, 2, 5, 3};
  Inputs in = RandomInputs(shape, 11);
  auto loss = [&](const Inputs& x) {
    auto r = reference::AttentionForward(x.q, x.k, x.v, dims);
    double sum = 0;
    for (size_t i = 0; i < r.out.size(); ++i) sum += double{r.out[i]} * in.d_out[i];
    return sum;
  };
  auto grads = reference::AttentionBackward(in.q, in.k, in.v, in.d_out, dims);
  constexpr float kH = 1e-3f;
  constexpr double kTolerance = 5e-4;
  struct Wrt {
    std::vector<float> Inputs::*tensor;
    const std::vector<float>* grad;
    const char* name;
  };
  for (const Wrt& wrt : {Wrt{&Inputs::q, &grads.dq, "dq"}, Wrt{&Inputs::k, &grads.dk, "dk"},
                         Wrt{&Inputs::v, &grads.dv, "dv"}}) {
    for (size_t i = 0; i < dims.elements(); ++i) {
      Inputs plus = in, minus = in;
      (plus.*wrt.tensor)[i] += kH;
      (minus.*wrt.tensor)[i] -= kH;
      const double numeric = (loss(plus) - loss(minus)) / (2.0 * kH);
      EXPECT_NEAR((*wrt.grad)[i], numeric, kTolerance) << wrt.name << "[" << i << "]";
    }
  }
  // Row 0 sees only key 0, whose probability is 1 whatever q is: its dq is 0.
  for (uint32_t c = 0; c < dims.head_dim; ++c) EXPECT_EQ(grads.dq[c], 0.0f);
}

// --- The kernels --------------------------------------------------------------

// Tests the fused forward (out and lse) against the reference for every shape.
TEST_P(AttentionTest, ForwardMatchesReference) {
  double worst_out = 0, worst_lse = 0;
  for (const Shape& shape : kShapes) {
    const AttentionShape s = ToShape(shape);
    SCOPED_TRACE(Name(s));
    Inputs in = RandomInputs(s, shape.seq_len * 7 + shape.head_dim);
    ASSERT_OK_AND_ASSIGN(DeviceResults got, Run(s, in, /*backward=*/false));
    auto want = reference::AttentionForward(in.q, in.k, in.v, ToDims(s));
    EXPECT_TRUE(Close(got.out, want.out, kForwardTolerance, "out"));
    EXPECT_TRUE(Close(got.lse, want.lse, kForwardTolerance, "lse"));
    worst_out = std::max(worst_out, WorstError(got.out, want.out));
    worst_lse = std::max(worst_lse, WorstError(got.lse, want.lse));
  }
  std::printf("forward worst relative error: out %g, lse %g\n", worst_out, worst_lse);
}

// Tests dq, dk and dv against the reference backward for every shape.
TEST_P(AttentionTest, BackwardMatchesReference) {
  double worst = 0;
  for (const Shape& shape : kShapes) {
    const AttentionShape s = ToShape(shape);
    SCOPED_TRACE(Name(s));
    Inputs in = RandomInputs(s, shape.seq_len * 5 + shape.head_dim + shape.batch);
    ASSERT_OK_AND_ASSIGN(DeviceResults got, Run(s, in, /*backward=*/true));
    auto want = reference::AttentionBackward(in.q, in.k, in.v, in.d_out, ToDims(s));
    EXPECT_TRUE(Close(got.dq, want.dq, kBackwardTolerance, "dq"));
    EXPECT_TRUE(Close(got.dk, want.dk, kBackwardTolerance, "dk"));
    EXPECT_TRUE(Close(got.dv, want.dv, kBackwardTolerance, "dv"));
    worst = std::max(
        {worst, WorstError(got.dq, want.dq), WorstError(got.dk, want.dk), WorstError(got.dv, want.dv)});
  }
  std::printf("backward worst relative error: %g\n", worst);
}

// Tests causality: changing k and v at positions > i leaves out and lse of
// rows <= i bit for bit unchanged (masked keys add exactly 0), and does
// change the later rows.
TEST_P(AttentionTest, FutureKeysDoNotChangeEarlierRows) {
  const AttentionShape s{1, 2, 129, 16};
  const uint32_t d = s.head_dim;
  Inputs in = RandomInputs(s, 3);
  ASSERT_OK_AND_ASSIGN(DeviceResults before, Run(s, in, /*backward=*/false));
  for (uint32_t i : {0u, 15u, 16u, 40u, 127u}) {
    SCOPED_TRACE(absl::StrCat("changed after row ", i));
    Inputs changed = in;
    std::vector<float> noise = RandomFloats(s.elements(), 100 + i);
    for (uint32_t h = 0; h < s.heads; ++h) {
      for (size_t e = (size_t{h} * s.seq_len + i + 1) * d; e < size_t{h + 1} * s.seq_len * d; ++e) {
        changed.k[e] = noise[e];
        changed.v[e] = -noise[e];
      }
    }
    ASSERT_OK_AND_ASSIGN(DeviceResults after, Run(s, changed, /*backward=*/false));
    for (uint32_t h = 0; h < s.heads; ++h) {
      for (uint32_t row = 0; row < s.seq_len; ++row) {
        const size_t at = size_t{h} * s.seq_len + row;
        const bool same_out = std::equal(&before.out[at * d], &before.out[at * d + d], &after.out[at * d]);
        const bool same_lse = before.lse[at] == after.lse[at];
        if (row <= i) {
          EXPECT_TRUE(same_out && same_lse) << "head " << h << " row " << row << " changed";
        } else {
          EXPECT_FALSE(same_out) << "head " << h << " row " << row << " did not change";
        }
      }
    }
  }
}

// Tests that forward and backward give the same bits on a second run.
TEST_P(AttentionTest, RunsAreBitIdentical) {
  const AttentionShape s{2, 3, 129, 64};
  Inputs in = RandomInputs(s, 21);
  ASSERT_OK_AND_ASSIGN(DeviceResults first, Run(s, in, /*backward=*/true));
  ASSERT_OK_AND_ASSIGN(DeviceResults second, Run(s, in, /*backward=*/true));
  EXPECT_EQ(first.out, second.out);
  EXPECT_EQ(first.lse, second.lse);
  EXPECT_EQ(first.dq, second.dq);
  EXPECT_EQ(first.dk, second.dk);
  EXPECT_EQ(first.dv, second.dv);
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionTest,
                         ::testing::Values(ops::AttentionPath::kSharedTiles, ops::AttentionPath::kLanes),
                         [](const ::testing::TestParamInfo<ops::AttentionPath>& info) {
                           return info.param == ops::AttentionPath::kLanes ? "Lanes" : "SharedTiles";
                         });

// Tests that the helpers pick the lanes kernels on a CPU driver and the
// shared-tiles ones elsewhere or without a device, and that both paths give
// the same results to rounding on this device.
TEST(AttentionPathTest, CpuDriversRunTheLanesKernels) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const AttentionShape s{2, 3, 45, 24};
  DeviceCapabilities cpu = acc->capabilities();
  ASSERT_EQ(cpu.kind, DeviceKind::kCpu) << "lavapipe is a CPU device";
  DeviceCapabilities gpu = cpu;
  gpu.kind = DeviceKind::kDiscreteGpu;
  auto kernels = [](const OpPlan& plan) {
    std::vector<std::string> names;
    for (const auto& launch : plan.launches) names.push_back(launch.kernel);
    return names;
  };
  using Names = std::vector<std::string>;
  ASSERT_OK_AND_ASSIGN(OpPlan f, ops::PlanAttentionForward(s, &cpu));
  EXPECT_EQ(kernels(f), Names{"attention_lanes"});
  ASSERT_OK_AND_ASSIGN(f, ops::PlanAttentionForward(s, &gpu));
  EXPECT_EQ(kernels(f), Names{"attention"});
  ASSERT_OK_AND_ASSIGN(f, ops::PlanAttentionForward(s));
  EXPECT_EQ(kernels(f), Names{"attention"});
  ASSERT_OK_AND_ASSIGN(f, ops::PlanAttentionForward(s, nullptr, ops::AttentionPath::kLanes));
  EXPECT_EQ(kernels(f), Names{"attention_lanes"});
  ASSERT_OK_AND_ASSIGN(OpPlan b, ops::PlanAttentionBackward(s, &cpu));
  EXPECT_EQ(kernels(b),
            (Names{"attention_backward_dot", "attention_backward_lanes", "attention_backward_lanes"}));
  ASSERT_OK_AND_ASSIGN(b, ops::PlanAttentionBackward(s, &gpu));
  EXPECT_EQ(kernels(b), (Names{"attention_backward_dot", "attention_backward", "attention_backward"}));
  // 5 query rows per invocation at head_dim 24, 8 invocations: 2 groups of 40.
  EXPECT_EQ(f.launches[0].groups[0], 2u);
  EXPECT_EQ(f.launches[0].groups[1], 6u);

  // The two paths on this device: the same sums in the same order, so the
  // forward agrees to a few ulps (the online softmax's blocks differ).
  const uint64_t n = s.elements();
  Inputs in = RandomInputs(s, 77);
  std::vector<std::vector<float>> outs;
  for (ops::AttentionPath path : {ops::AttentionPath::kSharedTiles, ops::AttentionPath::kLanes}) {
    ASSERT_OK_AND_ASSIGN(auto q, NewBuffer(acc, in.q));
    ASSERT_OK_AND_ASSIGN(auto k, NewBuffer(acc, in.k));
    ASSERT_OK_AND_ASSIGN(auto v, NewBuffer(acc, in.v));
    ASSERT_OK_AND_ASSIGN(auto out, acc->CreateBuffer(n * 4));
    ASSERT_OK_AND_ASSIGN(auto lse, acc->CreateBuffer(s.rows() * 4));
    ASSERT_OK_AND_ASSIGN(OpPlan plan, ops::PlanAttentionForward(s, &cpu, path));
    ASSERT_OK(RunList(acc, [&](CommandList& list) { return ops::Record(list, plan, {q, k, v, out, lse}); }));
    outs.emplace_back(n);
    ASSERT_OK(acc->DownloadSync(out, outs.back().data(), n * 4));
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(outs[0][i], outs[1][i], 1e-6 * std::max(1.0f, std::fabs(outs[0][i]))) << "element " << i;
  }
}

// Tests that bad shapes and short buffers are refused with the values in the
// message, before anything is recorded.
TEST_F(AttentionTest, RejectsBadArguments) {
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList("attention_test"));
  ASSERT_OK_AND_ASSIGN(auto small, acc_->CreateBuffer(64));
  ASSERT_OK_AND_ASSIGN(auto big, acc_->CreateBuffer(1 << 20));
  EXPECT_ERROR(ops::AttentionForward(*list, big, big, big, big, big, AttentionShape{1, 1, 4, 129}),
               absl::StatusCode::kInvalidArgument, "head_dim must be at most 128, got 129");
  EXPECT_ERROR(ops::AttentionForward(*list, big, big, big, big, big, AttentionShape{1, 0, 4, 8}),
               absl::StatusCode::kInvalidArgument, "must be > 0", "1, 0, 4, 8");
  EXPECT_ERROR(ops::AttentionForward(*list, big, small, big, big, big, AttentionShape{1, 2, 4, 8}),
               absl::StatusCode::kInvalidArgument, "k needs 256 bytes, got 64");
  EXPECT_ERROR(ops::AttentionBackward(*list, big, big, big, big, big, big, small, big, big, big,
                                      AttentionShape{1, 2, 16, 8}),
               absl::StatusCode::kInvalidArgument, "delta needs 128 bytes, got 64");
  EXPECT_EQ(list->size(), 0u);
}

}  // namespace
}  // namespace causeway
