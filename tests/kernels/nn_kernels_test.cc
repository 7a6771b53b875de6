// The model kernels (causeway/kernels/nn_ops.h) on lavapipe, checked against the CPU
// references of causeway/kernels/nn_reference.h at sizes that are not multiples of the
// workgroup sizes, each backward also against a finite-difference gradient of
// the CPU forward, and the results that must be reproducible bit for bit.
//
// Tolerances (|got - want| <= tol * max(1, |want|)):
//  - kKernelTol = 2e-5 for a kernel against its reference. The reference
//    accumulates in double and rounds once; the kernel works in f32, so it
//    carries the rounding of sums of at most a few hundred terms of magnitude
//    <= ~10 (a few ulp each at float epsilon 1.2e-7, and the terms mostly
//    cancel) plus lavapipe's exp, log, tanh and inversesqrt, which are
//    accurate to a few ulp. A wrong index, a missing term or a mask off by
//    one changes results by far more than 1e-3. Observed on lavapipe: at
//    most 3e-6 (bias_gelu_backward near tanh saturation, where 1 - t^2
//    cancels; Adam's f32 pow).
//  - kGradTol = 1e-3 for a backward against the central difference
//    (f(x + h) - f(x - h)) / 2h of the CPU forward with h = 1e-2: the forward
//    rounds its outputs to float (error ~ n * 6e-8 * |f| / h <= 1e-4 for the
//    tiny sizes used) and the difference has a truncation error ~ h^2 |f'''|
//    <= 1e-4 for these smooth functions on inputs of order 1. Observed: below
//    1e-4; a wrong term in a gradient formula is off by more than 1e-2.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/base/status.h"
#include "causeway/kernels/nn_ops.h"
#include "causeway/kernels/nn_reference.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;

constexpr double kKernelTol = 2e-5;
constexpr double kGradTol = 1e-3;
constexpr float kStep = 1e-2f;  // the finite differences' h

// A NaN bit pattern that no kernel here produces: words still holding it were
// not written.
constexpr uint32_t kSentinel = 0x7fc0dead;
// Words of sentinel after each output, to catch writes past the end.
constexpr uint32_t kGuard = 67;

// Row and column counts around the workgroup sizes (64 and 256) and not
// multiples of them.
constexpr uint32_t kRows[] = {1, 7, 33};
constexpr uint32_t kCols[] = {1, 5, 64, 129};
// layer_norm's widths: up to 256 an invocation takes a row, past it a
// workgroup does (ops::PlanLayerNorm); both forms are tested.
constexpr uint32_t kLayerNormCols[] = {1, 5, 64, 129, 256, 257, 600};

// Deterministic ids in [0, n), with repeats when count > n.
std::vector<int32_t> RandomIds(size_t count, uint32_t n, uint32_t seed) {
  std::vector<int32_t> ids(count);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& id : ids) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    id = static_cast<int32_t>(x % n);
  }
  return ids;
}

template <typename T>
absl::StatusOr<std::shared_ptr<Buffer>> NewBuffer(Accelerator* acc, const std::vector<T>& data) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, acc->CreateBuffer(data.size() * sizeof(T)));
  CAUSEWAY_RETURN_IF_ERROR(acc->UploadSync(buffer, data.data(), data.size() * sizeof(T)));
  return buffer;
}

// A buffer for an output of `n` floats followed by kGuard words, all kSentinel.
absl::StatusOr<std::shared_ptr<Buffer>> OutputBuffer(Accelerator* acc, size_t n) {
  return NewBuffer(acc, std::vector<uint32_t>(n + kGuard, kSentinel));
}

template <typename T>
absl::StatusOr<std::vector<T>> Read(Accelerator* acc, const std::shared_ptr<Buffer>& buffer) {
  std::vector<T> out(buffer->size() / sizeof(T));
  CAUSEWAY_RETURN_IF_ERROR(acc->DownloadSync(buffer, out.data(), out.size() * sizeof(T)));
  return out;
}

absl::Status RunList(Accelerator* acc, absl::FunctionRef<absl::Status(CommandList&)> record) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<CommandList> list, acc->CreateCommandList("nn_kernels_test"));
  CAUSEWAY_RETURN_IF_ERROR(record(*list));
  return acc->Submit(list).Await();
}

// Success when `got` holds want.size() floats, each within
// tol * max(1, |want|) of want (NaN where want is NaN), then kGuard unwritten
// sentinel words (skipped when got has exactly want.size() floats).
::testing::AssertionResult Near(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  if (got.size() != want.size() && got.size() != want.size() + kGuard) {
    return ::testing::AssertionFailure() << "got " << got.size() << " floats, want " << want.size();
  }
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double{got[i]} - want[i]);
    const bool ok =
        std::isnan(want[i]) ? std::isnan(got[i]) : err <= tol * std::max(1.0, std::fabs(double{want[i]}));
    if (!ok && ++bad <= 5) absl::StrAppend(&first, " [", i, "] got ", got[i], " want ", want[i], ";");
  }
  for (size_t i = want.size(); i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != kSentinel && ++bad <= 5) {
      absl::StrAppend(&first, " guard word ", i - want.size(), " was written;");
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " wrong:" << first;
}

// sum_i w[i] * y[i], in double: a scalar loss whose gradient in y is w.
double Dot(const std::vector<float>& w, const std::vector<float>& y) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += double{w[i]} * y[i];
  return s;
}

// The central-difference gradient of `loss` with respect to each element of
// *x (restored afterwards).
std::vector<float> NumericGradient(std::vector<float>* x, const std::function<double()>& loss) {
  std::vector<float> grad(x->size());
  for (size_t i = 0; i < x->size(); ++i) {
    const float saved = (*x)[i];
    (*x)[i] = saved + kStep;
    const double up = loss();
    (*x)[i] = saved - kStep;
    const double down = loss();
    (*x)[i] = saved;
    grad[i] = static_cast<float>((up - down) / (2.0 * kStep));
  }
  return grad;
}

class NnKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(1);
    ASSERT_NE(rt_, nullptr);
    acc_ = rt_->accelerator(0);
  }

  std::unique_ptr<Runtime> rt_;
  Accelerator* acc_ = nullptr;
};

// --- bias_gelu --------------------------------------------------------------

// Tests bias_gelu against the reference, with inputs wide enough (|x| <= 6)
// that tanh saturates.
TEST_F(NnKernelsTest, BiasGeluMatchesReference) {
  for (uint32_t rows : kRows) {
    for (uint32_t cols : kCols) {
      SCOPED_TRACE(absl::StrCat("rows ", rows, " cols ", cols));
      const uint32_t n = rows * cols;
      std::vector<float> x = RandomFloats(n, n, -5.0f, 5.0f), bias = RandomFloats(cols, cols + 1);
      ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
      ASSERT_OK_AND_ASSIGN(auto bb, NewBuffer(acc_, bias));
      ASSERT_OK_AND_ASSIGN(auto yb, OutputBuffer(acc_, n));
      ASSERT_OK(
          RunList(acc_, [&](CommandList& list) { return ops::BiasGelu(list, xb, bb, yb, rows, cols); }));
      ASSERT_OK_AND_ASSIGN(auto y, Read<float>(acc_, yb));
      EXPECT_TRUE(Near(y, reference::BiasGelu(x, bias, rows, cols), kKernelTol));
    }
  }
}

absl::StatusOr<reference::BiasGeluGrads> RunBiasGeluBackward(Accelerator* acc, const std::vector<float>& dy,
                                                             const std::vector<float>& x,
                                                             const std::vector<float>& bias, uint32_t rows,
                                                             uint32_t cols) {
  const uint32_t n = rows * cols;
  CAUSEWAY_ASSIGN_OR_RETURN(auto dyb, NewBuffer(acc, dy));
  CAUSEWAY_ASSIGN_OR_RETURN(auto xb, NewBuffer(acc, x));
  CAUSEWAY_ASSIGN_OR_RETURN(auto bb, NewBuffer(acc, bias));
  CAUSEWAY_ASSIGN_OR_RETURN(auto dxb, OutputBuffer(acc, n));
  CAUSEWAY_ASSIGN_OR_RETURN(auto dbb, OutputBuffer(acc, cols));
  CAUSEWAY_RETURN_IF_ERROR(RunList(acc, [&](CommandList& list) {
    return ops::BiasGeluBackward(list, dyb, xb, bb, dxb, dbb, rows, cols);
  }));
  reference::BiasGeluGrads out;
  CAUSEWAY_ASSIGN_OR_RETURN(out.dx, Read<float>(acc, dxb));
  CAUSEWAY_ASSIGN_OR_RETURN(out.dbias, Read<float>(acc, dbb));
  return out;
}

// Tests bias_gelu_backward's dx and dbias (column sums) against the reference.
TEST_F(NnKernelsTest, BiasGeluBackwardMatchesReference) {
  for (uint32_t rows : kRows) {
    for (uint32_t cols : kCols) {
      SCOPED_TRACE(absl::StrCat("rows ", rows, " cols ", cols));
      const uint32_t n = rows * cols;
      std::vector<float> x = RandomFloats(n, n, -5.0f, 5.0f), bias = RandomFloats(cols, cols + 1),
                         dy = RandomFloats(n, n + 2);
      ASSERT_OK_AND_ASSIGN(auto got, RunBiasGeluBackward(acc_, dy, x, bias, rows, cols));
      reference::BiasGeluGrads want = reference::BiasGeluBackward(dy, x, bias, rows, cols);
      EXPECT_TRUE(Near(got.dx, want.dx, kKernelTol)) << "dx";
      EXPECT_TRUE(Near(got.dbias, want.dbias, kKernelTol)) << "dbias";
    }
  }
}

// Tests bias_gelu_backward against finite differences of the CPU forward.
TEST_F(NnKernelsTest, BiasGeluBackwardMatchesFiniteDifferences) {
  const uint32_t rows = 3, cols = 4;
  std::vector<float> x = RandomFloats(rows * cols, 1, -3.0f, 3.0f), bias = RandomFloats(cols, 2),
                     w = RandomFloats(rows * cols, 3);
  auto loss = [&] { return Dot(w, reference::BiasGelu(x, bias, rows, cols)); };
  ASSERT_OK_AND_ASSIGN(auto got, RunBiasGeluBackward(acc_, w, x, bias, rows, cols));
  EXPECT_TRUE(Near(got.dx, NumericGradient(&x, loss), kGradTol)) << "dx";
  EXPECT_TRUE(Near(got.dbias, NumericGradient(&bias, loss), kGradTol)) << "dbias";
}

// --- layer_norm -------------------------------------------------------------

// Tests layer_norm's y, mean and rstd against the reference.
TEST_F(NnKernelsTest, LayerNormMatchesReference) {
  const float eps = 1e-5f;
  for (uint32_t rows : kRows) {
    for (uint32_t cols : kLayerNormCols) {
      SCOPED_TRACE(absl::StrCat("rows ", rows, " cols ", cols));
      const uint32_t n = rows * cols;
      // An offset row mean, as activations have, tests the two-pass variance.
      std::vector<float> x = RandomFloats(n, n, 1.0f, 4.0f), gamma = RandomFloats(cols, cols + 1, 0.5f, 1.5f),
                         beta = RandomFloats(cols, cols + 2);
      ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
      ASSERT_OK_AND_ASSIGN(auto gb, NewBuffer(acc_, gamma));
      ASSERT_OK_AND_ASSIGN(auto bb, NewBuffer(acc_, beta));
      ASSERT_OK_AND_ASSIGN(auto yb, OutputBuffer(acc_, n));
      ASSERT_OK_AND_ASSIGN(auto mb, OutputBuffer(acc_, rows));
      ASSERT_OK_AND_ASSIGN(auto rb, OutputBuffer(acc_, rows));
      ASSERT_OK(RunList(acc_, [&](CommandList& list) {
        return ops::LayerNorm(list, xb, gb, bb, yb, mb, rb, rows, cols, eps);
      }));
      reference::LayerNormResult want = reference::LayerNorm(x, gamma, beta, rows, cols, eps);
      ASSERT_OK_AND_ASSIGN(auto y, Read<float>(acc_, yb));
      ASSERT_OK_AND_ASSIGN(auto mean, Read<float>(acc_, mb));
      ASSERT_OK_AND_ASSIGN(auto rstd, Read<float>(acc_, rb));
      EXPECT_TRUE(Near(y, want.y, kKernelTol)) << "y";
      EXPECT_TRUE(Near(mean, want.mean, kKernelTol)) << "mean";
      // With cols = 1 the variance is 0 and rstd = 1 / sqrt(eps) ~ 316.
      EXPECT_TRUE(Near(rstd, want.rstd, kKernelTol)) << "rstd";
    }
  }
}

absl::StatusOr<reference::LayerNormGrads> RunLayerNormBackward(Accelerator* acc, const std::vector<float>& dy,
                                                               const std::vector<float>& x,
                                                               const std::vector<float>& gamma,
                                                               const std::vector<float>& mean,
                                                               const std::vector<float>& rstd, uint32_t rows,
                                                               uint32_t cols) {
  CAUSEWAY_ASSIGN_OR_RETURN(auto dyb, NewBuffer(acc, dy));
  CAUSEWAY_ASSIGN_OR_RETURN(auto xb, NewBuffer(acc, x));
  CAUSEWAY_ASSIGN_OR_RETURN(auto gb, NewBuffer(acc, gamma));
  CAUSEWAY_ASSIGN_OR_RETURN(auto mb, NewBuffer(acc, mean));
  CAUSEWAY_ASSIGN_OR_RETURN(auto rb, NewBuffer(acc, rstd));
  CAUSEWAY_ASSIGN_OR_RETURN(auto dxb, OutputBuffer(acc, rows * cols));
  CAUSEWAY_ASSIGN_OR_RETURN(auto dgb, OutputBuffer(acc, cols));
  CAUSEWAY_ASSIGN_OR_RETURN(auto dbb, OutputBuffer(acc, cols));
  CAUSEWAY_RETURN_IF_ERROR(RunList(acc, [&](CommandList& list) {
    return ops::LayerNormBackward(list, dyb, xb, gb, mb, rb, dxb, dgb, dbb, rows, cols);
  }));
  reference::LayerNormGrads out;
  CAUSEWAY_ASSIGN_OR_RETURN(out.dx, Read<float>(acc, dxb));
  CAUSEWAY_ASSIGN_OR_RETURN(out.dgamma, Read<float>(acc, dgb));
  CAUSEWAY_ASSIGN_OR_RETURN(out.dbeta, Read<float>(acc, dbb));
  return out;
}

// Tests layer_norm_backward's dx, dgamma and dbeta against the reference,
// both fed the reference forward's mean and rstd.
TEST_F(NnKernelsTest, LayerNormBackwardMatchesReference) {
  for (uint32_t rows : kRows) {
    for (uint32_t cols : kLayerNormCols) {
      SCOPED_TRACE(absl::StrCat("rows ", rows, " cols ", cols));
      const uint32_t n = rows * cols;
      std::vector<float> x = RandomFloats(n, n, -2.0f, 2.0f),
                         gamma = RandomFloats(cols, cols + 1, 0.5f, 1.5f),
                         beta = RandomFloats(cols, cols + 2), dy = RandomFloats(n, n + 3);
      reference::LayerNormResult fwd = reference::LayerNorm(x, gamma, beta, rows, cols, 1e-5f);
      ASSERT_OK_AND_ASSIGN(auto got,
                           RunLayerNormBackward(acc_, dy, x, gamma, fwd.mean, fwd.rstd, rows, cols));
      reference::LayerNormGrads want =
          reference::LayerNormBackward(dy, x, gamma, fwd.mean, fwd.rstd, rows, cols);
      EXPECT_TRUE(Near(got.dx, want.dx, kKernelTol)) << "dx";
      EXPECT_TRUE(Near(got.dgamma, want.dgamma, kKernelTol)) << "dgamma";
      EXPECT_TRUE(Near(got.dbeta, want.dbeta, kKernelTol)) << "dbeta";
    }
  }
}

// Tests layer_norm_backward against finite differences of the CPU forward.
TEST_F(NnKernelsTest, LayerNormBackwardMatchesFiniteDifferences) {
  const uint32_t rows = 3, cols = 5;
  const float eps = 1e-5f;
  std::vector<float> x = RandomFloats(rows * cols, 1, -2.0f, 2.0f), gamma = RandomFloats(cols, 2, 0.5f, 1.5f),
                     beta = RandomFloats(cols, 3), w = RandomFloats(rows * cols, 4);
  auto loss = [&] { return Dot(w, reference::LayerNorm(x, gamma, beta, rows, cols, eps).y); };
  reference::LayerNormResult fwd = reference::LayerNorm(x, gamma, beta, rows, cols, eps);
  ASSERT_OK_AND_ASSIGN(auto got, RunLayerNormBackward(acc_, w, x, gamma, fwd.mean, fwd.rstd, rows, cols));
  EXPECT_TRUE(Near(got.dx, NumericGradient(&x, loss), kGradTol)) << "dx";
  EXPECT_TRUE(Near(got.dgamma, NumericGradient(&gamma, loss), kGradTol)) << "dgamma";
  EXPECT_TRUE(Near(got.dbeta, NumericGradient(&beta, loss), kGradTol)) << "dbeta";
}

// --- softmax_causal ---------------------------------------------------------

constexpr uint32_t kBatchHeads[] = {1, 3};
constexpr uint32_t kSeqLens[] = {1, 5, 64, 129};
constexpr float kSoftmaxScale = 0.35f;  // ~ 1 / sqrt(head_dim 8)

// Scores with +inf in every masked position: a kernel that reads one turns
// its row into NaNs.
std::vector<float> CausalScores(uint32_t rows, uint32_t t, uint32_t seed) {
  std::vector<float> x = RandomFloats(size_t{rows} * t, seed, -6.0f, 6.0f);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t j = r % t + 1; j < t; ++j) x[size_t{r} * t + j] = INFINITY;
  }
  return x;
}

// Tests softmax_causal against the reference: masked positions 0 and never
// read, rows summing to 1.
TEST_F(NnKernelsTest, SoftmaxCausalMatchesReference) {
  for (uint32_t bh : kBatchHeads) {
    for (uint32_t t : kSeqLens) {
      SCOPED_TRACE(absl::StrCat("batch_heads ", bh, " t ", t));
      const uint32_t rows = bh * t, n = rows * t;
      std::vector<float> x = CausalScores(rows, t, n);
      ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
      ASSERT_OK_AND_ASSIGN(auto yb, OutputBuffer(acc_, n));
      ASSERT_OK(RunList(
          acc_, [&](CommandList& list) { return ops::SoftmaxCausal(list, xb, yb, bh, t, kSoftmaxScale); }));
      ASSERT_OK_AND_ASSIGN(auto y, Read<float>(acc_, yb));
      EXPECT_TRUE(Near(y, reference::SoftmaxCausal(x, rows, t, kSoftmaxScale), kKernelTol));
      for (uint32_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (uint32_t j = 0; j < t; ++j) {
          sum += y[size_t{r} * t + j];
          if (j > r % t) {
            ASSERT_EQ(y[size_t{r} * t + j], 0.0f) << "row " << r << " masked column " << j;
          }
        }
        ASSERT_NEAR(sum, 1.0, 1e-5) << "row " << r;
      }
    }
  }
}

absl::StatusOr<std::vector<float>> RunSoftmaxBackward(Accelerator* acc, const std::vector<float>& y,
                                                      const std::vector<float>& dy, uint32_t bh, uint32_t t) {
  CAUSEWAY_ASSIGN_OR_RETURN(auto yb, NewBuffer(acc, y));
  CAUSEWAY_ASSIGN_OR_RETURN(auto dyb, NewBuffer(acc, dy));
  CAUSEWAY_ASSIGN_OR_RETURN(auto dxb, OutputBuffer(acc, y.size()));
  CAUSEWAY_RETURN_IF_ERROR(RunList(acc, [&](CommandList& list) {
    return ops::SoftmaxCausalBackward(list, yb, dyb, dxb, bh, t, kSoftmaxScale);
  }));
  return Read<float>(acc, dxb);
}

// Tests softmax_causal_backward against the reference; dy is +inf in masked
// positions, which the kernel must not read.
TEST_F(NnKernelsTest, SoftmaxCausalBackwardMatchesReference) {
  for (uint32_t bh : kBatchHeads) {
    for (uint32_t t : kSeqLens) {
      SCOPED_TRACE(absl::StrCat("batch_heads ", bh, " t ", t));
      const uint32_t rows = bh * t, n = rows * t;
      std::vector<float> y = reference::SoftmaxCausal(CausalScores(rows, t, n), rows, t, kSoftmaxScale);
      std::vector<float> dy = CausalScores(rows, t, n + 1);
      ASSERT_OK_AND_ASSIGN(auto dx, RunSoftmaxBackward(acc_, y, dy, bh, t));
      EXPECT_TRUE(Near(dx, reference::SoftmaxCausalBackward(y, dy, rows, t, kSoftmaxScale), kKernelTol));
    }
  }
}

// Tests softmax_causal_backward against finite differences of the CPU
// forward (masked scores get gradient 0).
TEST_F(NnKernelsTest, SoftmaxCausalBackwardMatchesFiniteDifferences) {
  const uint32_t bh = 2, t = 3, rows = bh * t, n = rows * t;
  std::vector<float> x = RandomFloats(n, 1, -2.0f, 2.0f), w = RandomFloats(n, 2);
  auto loss = [&] { return Dot(w, reference::SoftmaxCausal(x, rows, t, kSoftmaxScale)); };
  ASSERT_OK_AND_ASSIGN(
      auto dx, RunSoftmaxBackward(acc_, reference::SoftmaxCausal(x, rows, t, kSoftmaxScale), w, bh, t));
  EXPECT_TRUE(Near(dx, NumericGradient(&x, loss), kGradTol));
}

// --- cross_entropy ----------------------------------------------------------

// Up to 256 a row per invocation, from 257 a workgroup per row.
constexpr uint32_t kVocabs[] = {1, 5, 65, 129, 256, 257, 600};

// Tests cross_entropy's per-row losses and their mean against the reference.
TEST_F(NnKernelsTest, CrossEntropyMatchesReference) {
  for (uint32_t rows : kRows) {
    for (uint32_t vocab : kVocabs) {
      SCOPED_TRACE(absl::StrCat("rows ", rows, " vocab ", vocab));
      std::vector<float> logits = RandomFloats(size_t{rows} * vocab, rows * vocab, -8.0f, 8.0f);
      std::vector<int32_t> targets = RandomIds(rows, vocab, rows + vocab);
      ASSERT_OK_AND_ASSIGN(auto lb, NewBuffer(acc_, logits));
      ASSERT_OK_AND_ASSIGN(auto tb, NewBuffer(acc_, targets));
      ASSERT_OK_AND_ASSIGN(auto loss_b, OutputBuffer(acc_, rows));
      ASSERT_OK(RunList(
          acc_, [&](CommandList& list) { return ops::CrossEntropy(list, lb, tb, loss_b, rows, vocab); }));
      ASSERT_OK_AND_ASSIGN(auto loss, Read<float>(acc_, loss_b));
      std::vector<float> want = reference::CrossEntropy(logits, targets, rows, vocab);
      EXPECT_TRUE(Near(loss, want, kKernelTol));
      double got_mean = 0, want_mean = 0;
      for (uint32_t r = 0; r < rows; ++r) {
        got_mean += loss[r] / rows;
        want_mean += want[r] / rows;
      }
      EXPECT_NEAR(got_mean, want_mean, kKernelTol * std::max(1.0, want_mean));
    }
  }
}

// Tests that a target outside [0, vocab) gives a NaN loss in its row only.
TEST_F(NnKernelsTest, CrossEntropyFlagsOutOfRangeTargets) {
  const uint32_t rows = 3, vocab = 5;
  std::vector<float> logits = RandomFloats(rows * vocab, 1);
  std::vector<int32_t> targets = {2, 5, -1};
  ASSERT_OK_AND_ASSIGN(auto lb, NewBuffer(acc_, logits));
  ASSERT_OK_AND_ASSIGN(auto tb, NewBuffer(acc_, targets));
  ASSERT_OK_AND_ASSIGN(auto loss_b, OutputBuffer(acc_, rows));
  ASSERT_OK(
      RunList(acc_, [&](CommandList& list) { return ops::CrossEntropy(list, lb, tb, loss_b, rows, vocab); }));
  ASSERT_OK_AND_ASSIGN(auto loss, Read<float>(acc_, loss_b));
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_TRUE(std::isnan(loss[2]));
  EXPECT_TRUE(Near(loss, reference::CrossEntropy(logits, targets, rows, vocab), kKernelTol));
}

absl::StatusOr<std::vector<float>> RunCrossEntropyBackward(Accelerator* acc, const std::vector<float>& logits,
                                                           const std::vector<int32_t>& targets, uint32_t rows,
                                                           uint32_t vocab) {
  CAUSEWAY_ASSIGN_OR_RETURN(auto lb, NewBuffer(acc, logits));
  CAUSEWAY_ASSIGN_OR_RETURN(auto tb, NewBuffer(acc, targets));
  CAUSEWAY_ASSIGN_OR_RETURN(auto db, OutputBuffer(acc, logits.size()));
  CAUSEWAY_RETURN_IF_ERROR(RunList(
      acc, [&](CommandList& list) { return ops::CrossEntropyBackward(list, lb, tb, db, rows, vocab); }));
  return Read<float>(acc, db);
}

// Tests cross_entropy_backward (the gradient of the mean loss) against the
// reference.
TEST_F(NnKernelsTest, CrossEntropyBackwardMatchesReference) {
  for (uint32_t rows : kRows) {
    for (uint32_t vocab : kVocabs) {
      SCOPED_TRACE(absl::StrCat("rows ", rows, " vocab ", vocab));
      std::vector<float> logits = RandomFloats(size_t{rows} * vocab, rows * vocab, -8.0f, 8.0f);
      std::vector<int32_t> targets = RandomIds(rows, vocab, rows + vocab);
      ASSERT_OK_AND_ASSIGN(auto got, RunCrossEntropyBackward(acc_, logits, targets, rows, vocab));
      EXPECT_TRUE(
          Near(got, reference::CrossEntropyBackward(logits, targets, rows, vocab, 1.0f / rows), kKernelTol));
    }
  }
}

// Tests cross_entropy_backward against finite differences of the mean of the
// CPU forward's losses.
TEST_F(NnKernelsTest, CrossEntropyBackwardMatchesFiniteDifferences) {
  const uint32_t rows = 3, vocab = 4;
  std::vector<float> logits = RandomFloats(rows * vocab, 1, -2.0f, 2.0f);
  std::vector<int32_t> targets = {3, 0, 1};
  auto loss = [&] {
    double mean = 0;
    for (float l : reference::CrossEntropy(logits, targets, rows, vocab)) mean += double{l} / rows;
    return mean;
  };
  ASSERT_OK_AND_ASSIGN(auto got, RunCrossEntropyBackward(acc_, logits, targets, rows, vocab));
  EXPECT_TRUE(Near(got, NumericGradient(&logits, loss), kGradTol));
}

// --- embedding --------------------------------------------------------------

constexpr uint32_t kVocab = 65;
// (tokens, seq_len): tokens laid out as [tokens / seq_len, seq_len].
constexpr std::pair<uint32_t, uint32_t> kTokenShapes[] = {{1, 1}, {7, 7}, {33, 11}};

// Tests embedding with and without a position table: the gather and one f32
// add, so the result must match the reference bit for bit.
TEST_F(NnKernelsTest, EmbeddingMatchesReference) {
  for (auto [tokens, seq_len] : kTokenShapes) {
    for (uint32_t dim : kCols) {
      for (bool with_pos : {false, true}) {
        SCOPED_TRACE(absl::StrCat("tokens ", tokens, " seq_len ", seq_len, " dim ", dim, " pos ", with_pos));
        std::vector<int32_t> ids = RandomIds(tokens, kVocab, tokens + dim);
        std::vector<float> table = RandomFloats(size_t{kVocab} * dim, dim),
                           pos =
                               with_pos ? RandomFloats(size_t{seq_len} * dim, dim + 1) : std::vector<float>{};
        ASSERT_OK_AND_ASSIGN(auto ib, NewBuffer(acc_, ids));
        ASSERT_OK_AND_ASSIGN(auto tb, NewBuffer(acc_, table));
        std::optional<BufferArg> pb;
        if (with_pos) {
          ASSERT_OK_AND_ASSIGN(auto b, NewBuffer(acc_, pos));
          pb = BufferArg(b);
        }
        ASSERT_OK_AND_ASSIGN(auto ob, OutputBuffer(acc_, size_t{tokens} * dim));
        ASSERT_OK(RunList(acc_, [&](CommandList& list) {
          return ops::Embedding(list, ib, tb, pb, ob, tokens, dim, kVocab, seq_len);
        }));
        ASSERT_OK_AND_ASSIGN(auto out, Read<float>(acc_, ob));
        EXPECT_TRUE(Near(out, reference::Embedding(ids, table, pos, dim, seq_len), 0.0));
      }
    }
  }
}

absl::StatusOr<std::vector<float>> RunEmbeddingBackward(Accelerator* acc, const std::vector<int32_t>& ids,
                                                        const std::vector<float>& dout, uint32_t dim) {
  CAUSEWAY_ASSIGN_OR_RETURN(auto ib, NewBuffer(acc, ids));
  CAUSEWAY_ASSIGN_OR_RETURN(auto db, NewBuffer(acc, dout));
  CAUSEWAY_ASSIGN_OR_RETURN(auto tb, OutputBuffer(acc, size_t{kVocab} * dim));
  const uint32_t tokens = static_cast<uint32_t>(ids.size());
  CAUSEWAY_RETURN_IF_ERROR(RunList(
      acc, [&](CommandList& list) { return ops::EmbeddingBackward(list, ib, db, tb, tokens, dim, kVocab); }));
  return Read<float>(acc, tb);
}

// Tests embedding_backward against the reference with many repeated ids
// (drawn from 7 of the 65 rows), that the untouched rows are zeroed, and that
// each row is the f32 sum of its tokens in token order, bit for bit.
TEST_F(NnKernelsTest, EmbeddingBackwardAccumulatesRepeatedIds) {
  for (auto [tokens, seq_len] : kTokenShapes) {
    for (uint32_t dim : kCols) {
      SCOPED_TRACE(absl::StrCat("tokens ", tokens, " dim ", dim));
      std::vector<int32_t> ids = RandomIds(tokens, 7, tokens * dim);
      std::vector<float> dout = RandomFloats(size_t{tokens} * dim, tokens + dim);
      ASSERT_OK_AND_ASSIGN(auto got, RunEmbeddingBackward(acc_, ids, dout, dim));
      EXPECT_TRUE(Near(got, reference::EmbeddingBackward(ids, dout, dim, kVocab), kKernelTol));
      std::vector<float> in_order(size_t{kVocab} * dim, 0.0f);
      for (uint32_t t = 0; t < tokens; ++t) {
        for (uint32_t c = 0; c < dim; ++c) in_order[size_t(ids[t]) * dim + c] += dout[size_t{t} * dim + c];
      }
      EXPECT_TRUE(Near(got, in_order, 0.0)) << "not the in-order f32 sum";
    }
  }
}

// Tests that embedding_backward is reproducible: two runs, bit-identical.
TEST_F(NnKernelsTest, EmbeddingBackwardIsDeterministic) {
  const uint32_t tokens = 257, dim = 129;
  std::vector<int32_t> ids = RandomIds(tokens, 3, 5);
  std::vector<float> dout = RandomFloats(size_t{tokens} * dim, 6, -100.0f, 100.0f);
  ASSERT_OK_AND_ASSIGN(auto first, RunEmbeddingBackward(acc_, ids, dout, dim));
  ASSERT_OK_AND_ASSIGN(auto second, RunEmbeddingBackward(acc_, ids, dout, dim));
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(first[i]), std::bit_cast<uint32_t>(second[i])) << "element " << i;
  }
}

// Tests the token and position table gradients against finite differences
// of the CPU forward.
TEST_F(NnKernelsTest, EmbeddingBackwardMatchesFiniteDifferences) {
  const uint32_t tokens = 6, seq_len = 3, dim = 2;
  std::vector<int32_t> ids = {4, 1, 4, 0, 4, 1};
  std::vector<float> table = RandomFloats(size_t{kVocab} * dim, 1), pos = RandomFloats(seq_len * dim, 2),
                     w = RandomFloats(tokens * dim, 3);
  auto loss = [&] { return Dot(w, reference::Embedding(ids, table, pos, dim, seq_len)); };
  ASSERT_OK_AND_ASSIGN(auto dtable, RunEmbeddingBackward(acc_, ids, w, dim));
  EXPECT_TRUE(Near(dtable, NumericGradient(&table, loss), kGradTol)) << "dtable";

  ASSERT_OK_AND_ASSIGN(auto wb, NewBuffer(acc_, w));
  ASSERT_OK_AND_ASSIGN(auto pb, OutputBuffer(acc_, seq_len * dim));
  ASSERT_OK(RunList(acc_, [&](CommandList& list) {
    return ops::PositionEmbeddingBackward(list, wb, pb, tokens, dim, seq_len);
  }));
  ASSERT_OK_AND_ASSIGN(auto dpos, Read<float>(acc_, pb));
  EXPECT_TRUE(Near(dpos, NumericGradient(&pos, loss), kGradTol)) << "dpos";
}

// --- optimizers -------------------------------------------------------------

// Tests three AdamW steps (and three plain Adam steps) against the reference:
// p, m and v after each. The kernel computes beta^step with pow in f32; the
// bias corrections then carry a relative error ~1e-5 at step 1 for
// beta2 = 0.999, which moves p by ~lr * 1e-5, well inside kKernelTol.
TEST_F(NnKernelsTest, AdamMatchesReferenceForThreeSteps) {
  for (float weight_decay : {0.0f, 0.1f}) {
    for (uint32_t n : {1u, 7u, 257u, 1000u}) {
      SCOPED_TRACE(absl::StrCat("count ", n, " weight_decay ", weight_decay));
      const ops::AdamConfig config{
          .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = weight_decay};
      const reference::AdamOptions options{config.lr, config.beta1, config.beta2, config.eps,
                                           config.weight_decay};
      std::vector<float> p = RandomFloats(n, n), m(n, 0.0f), v(n, 0.0f);
      ASSERT_OK_AND_ASSIGN(auto pb, NewBuffer(acc_, p));
      ASSERT_OK_AND_ASSIGN(auto mb, NewBuffer(acc_, m));
      ASSERT_OK_AND_ASSIGN(auto vb, NewBuffer(acc_, v));
      for (uint32_t step = 1; step <= 3; ++step) {
        std::vector<float> g = RandomFloats(n, n + step, -2.0f, 2.0f);
        ASSERT_OK_AND_ASSIGN(auto gb, NewBuffer(acc_, g));
        ASSERT_OK(RunList(
            acc_, [&](CommandList& list) { return ops::Adam(list, pb, gb, mb, vb, n, step, config); }));
        reference::AdamStep(p, g, m, v, step, options);
        ASSERT_OK_AND_ASSIGN(auto got_p, Read<float>(acc_, pb));
        ASSERT_OK_AND_ASSIGN(auto got_m, Read<float>(acc_, mb));
        ASSERT_OK_AND_ASSIGN(auto got_v, Read<float>(acc_, vb));
        EXPECT_TRUE(Near(got_p, p, kKernelTol)) << "p after step " << step;
        EXPECT_TRUE(Near(got_m, m, kKernelTol)) << "m after step " << step;
        EXPECT_TRUE(Near(got_v, v, kKernelTol)) << "v after step " << step;
      }
    }
  }
}

// The bit patterns of `values`: equal vectors of these mean bit-for-bit equal
// floats (where == would let -0 pass for 0).
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::transform(values.begin(), values.end(), bits.begin(),
                 [](float x) { return std::bit_cast<uint32_t>(x); });
  return bits;
}

// Tests adam_update (the step read from a buffer, new values to outputs)
// against the reference for steps 1, 2 and 10, with and without weight
// decay and from nonzero moments: out of place, with every input unchanged
// bit for bit and nothing written past the outputs; then in place (outputs
// bound to the inputs' buffers), bit for bit the out-of-place results.
TEST_F(NnKernelsTest, AdamUpdateMatchesReference) {
  for (float weight_decay : {0.0f, 0.1f}) {
    for (uint32_t n : {1u, 257u, 1000u}) {
      SCOPED_TRACE(absl::StrCat("count ", n, " weight_decay ", weight_decay));
      const ops::AdamConfig config{
          .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = weight_decay};
      const reference::AdamOptions options{config.lr, config.beta1, config.beta2, config.eps,
                                           config.weight_decay};
      for (uint32_t step : {1u, 2u, 10u}) {
        SCOPED_TRACE(absl::StrCat("step ", step));
        const std::vector<float> p0 = RandomFloats(n, n + step), g = RandomFloats(n, n + 1, -2.0f, 2.0f);
        const std::vector<float> m0 = RandomFloats(n, n + 2, -0.5f, 0.5f),
                                 v0 = RandomFloats(n, n + 3, 0.0f, 1.0f);
        const std::vector<float> step_data = {static_cast<float>(step)};
        std::vector<float> p = p0, m = m0, v = v0;
        reference::AdamStep(p, g, m, v, step, options);
        ASSERT_OK_AND_ASSIGN(auto pb, NewBuffer(acc_, p0));
        ASSERT_OK_AND_ASSIGN(auto gb, NewBuffer(acc_, g));
        ASSERT_OK_AND_ASSIGN(auto mb, NewBuffer(acc_, m0));
        ASSERT_OK_AND_ASSIGN(auto vb, NewBuffer(acc_, v0));
        ASSERT_OK_AND_ASSIGN(auto sb, NewBuffer(acc_, step_data));
        ASSERT_OK_AND_ASSIGN(auto po, OutputBuffer(acc_, n));
        ASSERT_OK_AND_ASSIGN(auto mo, OutputBuffer(acc_, n));
        ASSERT_OK_AND_ASSIGN(auto vo, OutputBuffer(acc_, n));
        ASSERT_OK(RunList(acc_, [&](CommandList& list) {
          return ops::AdamUpdate(list, pb, gb, mb, vb, sb, po, mo, vo, n, config);
        }));
        ASSERT_OK_AND_ASSIGN(auto got_p, Read<float>(acc_, po));
        ASSERT_OK_AND_ASSIGN(auto got_m, Read<float>(acc_, mo));
        ASSERT_OK_AND_ASSIGN(auto got_v, Read<float>(acc_, vo));
        EXPECT_TRUE(Near(got_p, p, kKernelTol)) << "p_out";
        EXPECT_TRUE(Near(got_m, m, kKernelTol)) << "m_out";
        EXPECT_TRUE(Near(got_v, v, kKernelTol)) << "v_out";
        const std::pair<const std::shared_ptr<Buffer>*, const std::vector<float>*> inputs[] = {
            {&pb, &p0}, {&gb, &g}, {&mb, &m0}, {&vb, &v0}, {&sb, &step_data}};
        for (const auto& [buffer, want] : inputs) {
          ASSERT_OK_AND_ASSIGN(auto kept, Read<float>(acc_, *buffer));
          EXPECT_EQ(Bits(kept), Bits(*want)) << "an input was written";
        }

        ASSERT_OK(RunList(acc_, [&](CommandList& list) {
          return ops::AdamUpdate(list, pb, gb, mb, vb, sb, pb, mb, vb, n, config);
        }));
        ASSERT_OK_AND_ASSIGN(auto in_place_p, Read<float>(acc_, pb));
        ASSERT_OK_AND_ASSIGN(auto in_place_m, Read<float>(acc_, mb));
        ASSERT_OK_AND_ASSIGN(auto in_place_v, Read<float>(acc_, vb));
        got_p.resize(n), got_m.resize(n), got_v.resize(n);
        EXPECT_EQ(Bits(in_place_p), Bits(got_p)) << "p in place";
        EXPECT_EQ(Bits(in_place_m), Bits(got_m)) << "m in place";
        EXPECT_EQ(Bits(in_place_v), Bits(got_v)) << "v in place";
      }
    }
  }
}

// Tests three successive adam_updates, each reading the state the previous
// one wrote (alternating between two sets of buffers) and its step from the
// step buffer, against three reference steps from zero moments.
TEST_F(NnKernelsTest, AdamUpdateChainsLikeThreeAdamSteps) {
  const uint32_t n = 257;
  const ops::AdamConfig config{
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  const reference::AdamOptions options{config.lr, config.beta1, config.beta2, config.eps,
                                       config.weight_decay};
  std::vector<float> p = RandomFloats(n, 11), m(n, 0.0f), v(n, 0.0f);
  std::shared_ptr<Buffer> state[2][3];  // [set][p, m, v]
  for (auto& set : state) {
    for (auto& buffer : set) {
      ASSERT_OK_AND_ASSIGN(buffer, OutputBuffer(acc_, n));
    }
  }
  ASSERT_OK(acc_->UploadSync(state[0][0], p.data(), n * sizeof(float)));
  ASSERT_OK(acc_->UploadSync(state[0][1], m.data(), n * sizeof(float)));
  ASSERT_OK(acc_->UploadSync(state[0][2], v.data(), n * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(auto sb, NewBuffer(acc_, std::vector<float>{0.0f}));
  for (uint32_t step = 1; step <= 3; ++step) {
    const auto& in = state[(step - 1) % 2];
    const auto& out = state[step % 2];
    const std::vector<float> g = RandomFloats(n, 20 + step, -2.0f, 2.0f);
    const float step_value = static_cast<float>(step);
    ASSERT_OK_AND_ASSIGN(auto gb, NewBuffer(acc_, g));
    ASSERT_OK(acc_->UploadSync(sb, &step_value, sizeof(float)));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) {
      return ops::AdamUpdate(list, in[0], gb, in[1], in[2], sb, out[0], out[1], out[2], n, config);
    }));
    reference::AdamStep(p, g, m, v, step, options);
    ASSERT_OK_AND_ASSIGN(auto got_p, Read<float>(acc_, out[0]));
    ASSERT_OK_AND_ASSIGN(auto got_m, Read<float>(acc_, out[1]));
    ASSERT_OK_AND_ASSIGN(auto got_v, Read<float>(acc_, out[2]));
    EXPECT_TRUE(Near(got_p, p, kKernelTol)) << "p after step " << step;
    EXPECT_TRUE(Near(got_m, m, kKernelTol)) << "m after step " << step;
    EXPECT_TRUE(Near(got_v, v, kKernelTol)) << "v after step " << step;
  }
}

// Tests adam_update_multi over 1 to 9 tensors (so launches with every count
// of used slots, 1 to 4), of sizes around a workgroup and one past what its
// groups cover in one pass (so its grid-stride loop runs twice): every
// output bit for bit adam_update's on the same tensor, and within the
// reference's tolerance; nothing written past the outputs; every input
// unchanged. Then in place, bit for bit the same.
TEST_F(NnKernelsTest, AdamUpdateMultiIsAdamUpdatePerTensor) {
  const ops::AdamConfig config{
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  const reference::AdamOptions options{config.lr, config.beta1, config.beta2, config.eps,
                                       config.weight_decay};
  const uint32_t kPastOnePass = 65535 / 4 * 256 + 3;  // adam_update_multi's groups per tensor, times 256
  const std::vector<std::vector<uint32_t>> cases = {
      {257}, {1, 256, 1000}, {5, 255, 257, 64}, {3, 1, 4, 1, 5, 9, 2, 6, 5}, {kPastOnePass, 100}};
  ASSERT_OK_AND_ASSIGN(auto sb, NewBuffer(acc_, std::vector<float>{3.0f}));
  for (const std::vector<uint32_t>& counts : cases) {
    SCOPED_TRACE(absl::StrCat("counts ", absl::StrJoin(counts, ",")));
    struct Tensor {
      std::vector<float> p, g, m, v;
      std::shared_ptr<Buffer> pb, gb, mb, vb, po, mo, vo;
    };
    std::vector<Tensor> tensors(counts.size());
    std::vector<ops::AdamTensor> args;
    for (size_t t = 0; t < counts.size(); ++t) {
      const uint32_t n = counts[t];
      Tensor& x = tensors[t];
      x.p = RandomFloats(n, 40 + t);
      x.g = RandomFloats(n, 50 + t, -2.0f, 2.0f);
      x.m = RandomFloats(n, 60 + t, -0.5f, 0.5f);
      x.v = RandomFloats(n, 70 + t, 0.0f, 1.0f);
      ASSERT_OK_AND_ASSIGN(x.pb, NewBuffer(acc_, x.p));
      ASSERT_OK_AND_ASSIGN(x.gb, NewBuffer(acc_, x.g));
      ASSERT_OK_AND_ASSIGN(x.mb, NewBuffer(acc_, x.m));
      ASSERT_OK_AND_ASSIGN(x.vb, NewBuffer(acc_, x.v));
      ASSERT_OK_AND_ASSIGN(x.po, OutputBuffer(acc_, n));
      ASSERT_OK_AND_ASSIGN(x.mo, OutputBuffer(acc_, n));
      ASSERT_OK_AND_ASSIGN(x.vo, OutputBuffer(acc_, n));
      args.push_back({x.pb, x.gb, x.mb, x.vb, x.po, x.mo, x.vo, n});
    }
    ASSERT_OK(RunList(acc_, [&](CommandList& list) { return ops::AdamUpdateMulti(list, args, sb, config); }));
    std::vector<std::array<std::vector<float>, 3>> multi(counts.size());
    for (size_t t = 0; t < counts.size(); ++t) {
      SCOPED_TRACE(absl::StrCat("tensor ", t));
      const uint32_t n = counts[t];
      Tensor& x = tensors[t];
      std::vector<float> p = x.p, m = x.m, v = x.v;
      reference::AdamStep(p, x.g, m, v, 3, options);
      ASSERT_OK_AND_ASSIGN(multi[t][0], Read<float>(acc_, x.po));
      ASSERT_OK_AND_ASSIGN(multi[t][1], Read<float>(acc_, x.mo));
      ASSERT_OK_AND_ASSIGN(multi[t][2], Read<float>(acc_, x.vo));
      EXPECT_TRUE(Near(multi[t][0], p, kKernelTol)) << "p_out";
      EXPECT_TRUE(Near(multi[t][1], m, kKernelTol)) << "m_out";
      EXPECT_TRUE(Near(multi[t][2], v, kKernelTol)) << "v_out";
      const std::pair<const std::shared_ptr<Buffer>*, const std::vector<float>*> inputs[] = {
          {&x.pb, &x.p}, {&x.gb, &x.g}, {&x.mb, &x.m}, {&x.vb, &x.v}};
      for (const auto& [buffer, want] : inputs) {
        ASSERT_OK_AND_ASSIGN(auto kept, Read<float>(acc_, *buffer));
        EXPECT_EQ(Bits(kept), Bits(*want)) << "an input was written";
      }
      // adam_update on this tensor alone, into the same outputs.
      ASSERT_OK(RunList(acc_, [&](CommandList& list) {
        return ops::AdamUpdate(list, x.pb, x.gb, x.mb, x.vb, sb, x.po, x.mo, x.vo, n, config);
      }));
      for (int k = 0; k < 3; ++k) {
        ASSERT_OK_AND_ASSIGN(auto single, Read<float>(acc_, k == 0 ? x.po : k == 1 ? x.mo : x.vo));
        EXPECT_EQ(Bits(single), Bits(multi[t][k])) << "output " << k << " differs from adam_update's";
      }
    }
    // In place: the outputs bound to the inputs' buffers.
    for (ops::AdamTensor& a : args) {
      a.p_out = a.p;
      a.m_out = a.m;
      a.v_out = a.v;
    }
    ASSERT_OK(RunList(acc_, [&](CommandList& list) { return ops::AdamUpdateMulti(list, args, sb, config); }));
    for (size_t t = 0; t < counts.size(); ++t) {
      int k = 0;
      for (const std::shared_ptr<Buffer>* buffer : {&tensors[t].pb, &tensors[t].mb, &tensors[t].vb}) {
        ASSERT_OK_AND_ASSIGN(auto in_place, Read<float>(acc_, *buffer));
        multi[t][k].resize(counts[t]);
        EXPECT_EQ(Bits(in_place), Bits(multi[t][k])) << "tensor " << t << " output " << k << " in place";
        ++k;
      }
    }
  }
}

// Tests that adam_update_multi refuses no tensors, a zero count (naming the
// tensor) and a short buffer (naming the operand), and appends nothing.
TEST_F(NnKernelsTest, AdamUpdateMultiRefusesBadArguments) {
  ASSERT_OK_AND_ASSIGN(auto small, acc_->CreateBuffer(64));
  ASSERT_OK_AND_ASSIGN(auto big, acc_->CreateBuffer(1024));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  using absl::StatusCode::kInvalidArgument;
  const ops::AdamTensor ok{big, big, big, big, big, big, big, 64};
  EXPECT_ERROR(ops::AdamUpdateMulti(*list, {}, big, {}), kInvalidArgument, "needs at least one tensor");
  ops::AdamTensor zero = ok;
  zero.count = 0;
  EXPECT_ERROR(ops::AdamUpdateMulti(*list, {ok, ok, zero}, big, {}), kInvalidArgument,
               "adam_update_multi tensor 2: count must be > 0");
  ops::AdamTensor short_m = ok;
  short_m.m_out = small;
  EXPECT_ERROR(ops::AdamUpdateMulti(*list, {ok, ok, ok, ok, short_m}, big, {}), kInvalidArgument,
               "m_out4 needs 256 bytes");
  EXPECT_EQ(list->size(), 0u);
}

// Tests that adam_update refuses short buffers, a zero count and bad
// hyperparameters, naming the operand, and appends nothing.
TEST_F(NnKernelsTest, AdamUpdateRefusesBadArguments) {
  ASSERT_OK_AND_ASSIGN(auto small, acc_->CreateBuffer(64));
  ASSERT_OK_AND_ASSIGN(auto big, acc_->CreateBuffer(1024));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  using absl::StatusCode::kInvalidArgument;
  EXPECT_ERROR(ops::AdamUpdate(*list, small, small, small, small, small, small, small, small, 64, {}),
               kInvalidArgument, "adam_update 64: p needs 256 bytes");
  EXPECT_ERROR(ops::AdamUpdate(*list, big, big, big, big, big, big, big, small, 64, {}), kInvalidArgument,
               "adam_update 64: v_out needs 256 bytes");
  EXPECT_ERROR(ops::AdamUpdate(*list, big, big, big, big, big, big, big, big, 0, {}), kInvalidArgument,
               "count must be > 0");
  EXPECT_ERROR(ops::AdamUpdate(*list, big, big, big, big, big, big, big, big, 64, {.beta1 = 1.0f}),
               kInvalidArgument, "beta1");
  EXPECT_ERROR(ops::AdamUpdate(*list, big, big, big, big, big, big, big, big, 64, {.eps = 0.0f}),
               kInvalidArgument, "eps");
  EXPECT_EQ(list->size(), 0u);
}

// Tests permute_0213 exactly against the reference on shapes with sizes of
// 1, odd sizes and more elements than one workgroup covers,
// with nothing written past the output, and that permuting [A, B, C, D]
// then [A, C, B, D] gives the input back.
TEST_F(NnKernelsTest, Permute0213MatchesReferenceAndInverts) {
  // Both of the kernel's forms: an invocation per element (fewer than 1024
  // rows of D, or D past 1024) and an invocation per row.
  const std::array<uint32_t, 4> shapes[] = {{1, 1, 1, 1},   {2, 3, 5, 7},    {1, 64, 4, 16}, {3, 1, 9, 2},
                                            {2, 33, 3, 1},  {5, 2, 1, 33},   {3, 17, 12, 7}, {4, 64, 4, 16},
                                            {3, 37, 11, 3}, {1, 2, 3, 1030}, {2, 1, 1024, 1}};
  for (const auto& [a, b, c, d] : shapes) {
    SCOPED_TRACE(absl::StrCat(a, "x", b, "x", c, "x", d));
    const uint32_t n = a * b * c * d;
    const std::vector<float> x = RandomFloats(n, n);
    ASSERT_OK_AND_ASSIGN(auto xb, NewBuffer(acc_, x));
    ASSERT_OK_AND_ASSIGN(auto yb, OutputBuffer(acc_, n));
    ASSERT_OK_AND_ASSIGN(auto zb, OutputBuffer(acc_, n));
    ASSERT_OK(RunList(acc_, [&](CommandList& list) {
      CAUSEWAY_RETURN_IF_ERROR(ops::Permute0213(list, xb, yb, a, b, c, d));
      return ops::Permute0213(list, yb, zb, a, c, b, d);
    }));
    ASSERT_OK_AND_ASSIGN(auto y, Read<float>(acc_, yb));
    ASSERT_OK_AND_ASSIGN(auto z, Read<float>(acc_, zb));
    // Tolerance 0: every element is a copy, equal to the reference exactly.
    EXPECT_TRUE(Near(y, reference::Permute0213(x, a, b, c, d), 0.0)) << "permuted";
    EXPECT_TRUE(Near(z, x, 0.0)) << "permuted back";
  }
}

// Tests that permute_0213 refuses zero sizes, more than 2^32 - 1 elements
// (also where the product overflows 64 bits) and short buffers, and appends
// nothing.
TEST_F(NnKernelsTest, Permute0213RefusesBadArguments) {
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  ASSERT_OK_AND_ASSIGN(auto small, OutputBuffer(acc_, 4));  // 4 + kGuard floats
  using absl::StatusCode::kInvalidArgument;
  EXPECT_ERROR(ops::Permute0213(*list, small, small, 2, 0, 3, 4), kInvalidArgument,
               "permute_0213 [2, 0, 3, 4]: every size must be > 0");
  EXPECT_ERROR(ops::Permute0213(*list, small, small, 65536, 65536, 1, 1), kInvalidArgument,
               "more than 2^32 - 1 elements");
  EXPECT_ERROR(ops::Permute0213(*list, small, small, 65536, 65536, 65536, 65536), kInvalidArgument,
               "more than 2^32 - 1 elements");
  EXPECT_ERROR(ops::Permute0213(*list, small, small, 2, 3, 4, 5), kInvalidArgument,
               "permute_0213 [2, 3, 4, 5]: in needs 480 bytes");
  EXPECT_EQ(list->size(), 0u);
}

// Tests three SGD steps, with and without momentum, against the reference.
TEST_F(NnKernelsTest, SgdMatchesReferenceForThreeSteps) {
  for (float momentum : {0.0f, 0.9f}) {
    for (uint32_t n : {1u, 7u, 257u}) {
      SCOPED_TRACE(absl::StrCat("count ", n, " momentum ", momentum));
      const float lr = 0.1f;
      std::vector<float> p = RandomFloats(n, n), velocity(n, 0.0f);
      ASSERT_OK_AND_ASSIGN(auto pb, NewBuffer(acc_, p));
      ASSERT_OK_AND_ASSIGN(auto vb, NewBuffer(acc_, velocity));
      std::optional<BufferArg> velocity_arg;
      if (momentum != 0.0f) velocity_arg = BufferArg(vb);
      for (uint32_t step = 1; step <= 3; ++step) {
        std::vector<float> g = RandomFloats(n, n + step);
        ASSERT_OK_AND_ASSIGN(auto gb, NewBuffer(acc_, g));
        ASSERT_OK(RunList(
            acc_, [&](CommandList& list) { return ops::Sgd(list, pb, gb, velocity_arg, n, lr, momentum); }));
        reference::SgdStep(p, g, velocity, lr, momentum);
        ASSERT_OK_AND_ASSIGN(auto got_p, Read<float>(acc_, pb));
        ASSERT_OK_AND_ASSIGN(auto got_v, Read<float>(acc_, vb));
        EXPECT_TRUE(Near(got_p, p, kKernelTol)) << "p after step " << step;
        EXPECT_TRUE(Near(got_v, velocity, kKernelTol)) << "velocity after step " << step;
      }
    }
  }
}

// --- argument checks --------------------------------------------------------

// Tests that the helpers refuse zero sizes, short buffers and bad
// hyperparameters with messages naming the operand and the sizes, and append
// nothing.
TEST_F(NnKernelsTest, OpsRefuseBadArguments) {
  ASSERT_OK_AND_ASSIGN(auto small, OutputBuffer(acc_, 4));  // 4 + kGuard floats
  ASSERT_OK_AND_ASSIGN(auto big, OutputBuffer(acc_, 4096));
  ASSERT_OK_AND_ASSIGN(auto list, acc_->CreateCommandList());
  using absl::StatusCode::kInvalidArgument;
  EXPECT_ERROR(ops::BiasGelu(*list, big, big, big, 0, 5), kInvalidArgument, "bias_gelu", "rows 0");
  EXPECT_ERROR(ops::BiasGelu(*list, big, small, big, 2, 100), kInvalidArgument,
               "bias_gelu 2x100: bias needs 400 bytes", absl::StrCat("got ", small->size()));
  EXPECT_ERROR(ops::BiasGeluBackward(*list, big, big, big, big, small, 1, 100), kInvalidArgument, "dbias");
  EXPECT_ERROR(ops::LayerNorm(*list, big, big, big, big, big, big, 4, 4, 0.0f), kInvalidArgument, "eps");
  EXPECT_ERROR(ops::LayerNormBackward(*list, big, small, big, big, big, big, big, big, 10, 10),
               kInvalidArgument, "layer_norm_backward 10x10: x needs 400 bytes");
  EXPECT_ERROR(ops::SoftmaxCausal(*list, big, small, 2, 10, 1.0f), kInvalidArgument,
               "softmax_causal 2x10: y needs 800 bytes");
  EXPECT_ERROR(ops::SoftmaxCausal(*list, big, big, 65536, 65536, 1.0f), kInvalidArgument, "exceeds");
  EXPECT_ERROR(ops::CrossEntropy(*list, big, big, big, 3, 0), kInvalidArgument, "vocab 0");
  EXPECT_ERROR(ops::CrossEntropyBackward(*list, big, small, big, 100, 5), kInvalidArgument,
               "targets needs 400 bytes");
  EXPECT_ERROR(ops::Embedding(*list, big, small, std::nullopt, big, 4, 8, 65, 4), kInvalidArgument,
               "embedding 4x8: table needs 2080 bytes");
  EXPECT_ERROR(ops::PositionEmbeddingBackward(*list, big, big, 7, 2, 3), kInvalidArgument,
               "multiple of seq_len");
  EXPECT_ERROR(ops::Adam(*list, big, big, big, big, 16, 0, {}), kInvalidArgument, "step counts from 1");
  EXPECT_ERROR(ops::Adam(*list, big, big, big, big, 16, 1, {.beta2 = 1.0f}), kInvalidArgument, "beta2");
  EXPECT_ERROR(ops::Sgd(*list, big, big, std::nullopt, 16, 0.1f, 0.9f), kInvalidArgument, "velocity");
  EXPECT_EQ(list->size(), 0u);
}

}  // namespace
}  // namespace causeway
