// The model kernels' plans (causeway/kernels/nn_ops.h Plan*), made without a device:
// each plan's operands and their byte sizes, its launches' kernels, bound
// operands, push constants, workgroups and specialization constants, all
// worked out by hand from the kernels' header comments in causeway/shaders/; every
// size error with its own message; and the plans whose launches bind
// operands other than in their order (stand-ins for unread bindings, two
// passes) run on lavapipe against the CPU references of causeway/kernels/nn_reference.h.
#include "causeway/kernels/nn_ops.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "causeway/kernels/nn_reference.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/op_plan_support.h"
#include "tests/testing/test_support.h"

namespace causeway::ops {
namespace {

using ::causeway::testing::Bits;
using ::causeway::testing::MakeRuntime;
using ::causeway::testing::PlanOperands;
using ::causeway::testing::PushWords;
using ::causeway::testing::RandomFloats;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::Pair;

using Groups = std::array<uint32_t, 3>;

// Tests bias_gelu's plan: one elementwise launch over rows * cols with 256
// invocations per group.
TEST(NnPlanTest, BiasGelu) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanBiasGelu(3, 300));
  EXPECT_EQ(plan.name, "bias_gelu 3x300");
  EXPECT_THAT(PlanOperands(plan), ElementsAre(Pair("x", 3600), Pair("bias", 1200), Pair("y", 3600)));
  ASSERT_EQ(plan.launches.size(), 1u);
  const Launch& l = plan.launches[0];
  EXPECT_EQ(l.kernel, "bias_gelu");
  EXPECT_THAT(l.operands, ElementsAre(0, 1, 2));
  EXPECT_THAT(PushWords(l), ElementsAre(3, 300));
  EXPECT_EQ(l.groups, (Groups{4, 1, 1}));  // ceil(900 / 256)
  EXPECT_TRUE(l.spec.empty());
}

// Tests bias_gelu_backward's plan: one invocation per column, 64 a group.
TEST(NnPlanTest, BiasGeluBackward) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanBiasGeluBackward(3, 300));
  EXPECT_EQ(plan.name, "bias_gelu_backward 3x300");
  EXPECT_THAT(PlanOperands(plan), ElementsAre(Pair("dy", 3600), Pair("x", 3600), Pair("bias", 1200),
                                              Pair("dx", 3600), Pair("dbias", 1200)));
  ASSERT_EQ(plan.launches.size(), 1u);
  EXPECT_EQ(plan.launches[0].kernel, "bias_gelu_backward");
  EXPECT_THAT(plan.launches[0].operands, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(PushWords(plan.launches[0]), ElementsAre(3, 300));
  EXPECT_EQ(plan.launches[0].groups, (Groups{5, 1, 1}));  // ceil(300 / 64)
}

// Tests layer_norm's plan: a group per row, capped at 65535 groups (the
// kernel loops over the rest), eps in the push constants.
TEST(NnPlanTest, LayerNormTakesARowPerInvocationUpTo256Columns) {
  // Narrow rows: an invocation per row (constant 1 = 1), 64 to a workgroup.
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanLayerNorm(70000, 2, 1e-5f));
  EXPECT_EQ(plan.name, "layer_norm 70000x2");
  EXPECT_THAT(PlanOperands(plan), ElementsAre(Pair("x", 560000), Pair("gamma", 8), Pair("beta", 8),
                                              Pair("y", 560000), Pair("mean", 280000), Pair("rstd", 280000)));
  ASSERT_EQ(plan.launches.size(), 1u);
  EXPECT_EQ(plan.launches[0].kernel, "layer_norm");
  EXPECT_THAT(PushWords(plan.launches[0]), ElementsAre(70000, 2, Bits(1e-5f)));
  EXPECT_EQ(plan.launches[0].groups, (Groups{1094, 1, 1}));  // ceil(70000 / 64)
  EXPECT_THAT(plan.launches[0].spec, ElementsAre(Pair(1u, 1u)));
  ASSERT_OK_AND_ASSIGN(OpPlan few, PlanLayerNorm(7, 256, 0.5f));
  EXPECT_EQ(few.launches[0].groups, (Groups{1, 1, 1}));
  EXPECT_THAT(few.launches[0].spec, ElementsAre(Pair(1u, 1u)));
  // Wide rows: a workgroup per row (constant 1 = 0), groups capped.
  ASSERT_OK_AND_ASSIGN(OpPlan wide, PlanLayerNorm(70000, 257, 1e-5f));
  EXPECT_EQ(wide.launches[0].groups, (Groups{65535, 1, 1}));
  EXPECT_THAT(wide.launches[0].spec, ElementsAre(Pair(1u, 0u)));
  ASSERT_OK_AND_ASSIGN(OpPlan wide_few, PlanLayerNorm(7, 300, 0.5f));
  EXPECT_EQ(wide_few.launches[0].groups, (Groups{7, 1, 1}));
}

// Tests layer_norm_backward's two passes: rows (constant 1 = 0), then
// columns (constant 1 = 1), over the same operands.
TEST(NnPlanTest, LayerNormBackwardHasTwoPasses) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanLayerNormBackward(4, 130));
  EXPECT_EQ(plan.name, "layer_norm_backward 4x130");
  EXPECT_THAT(PlanOperands(plan),
              ElementsAre(Pair("dy", 2080), Pair("x", 2080), Pair("gamma", 520), Pair("mean", 16),
                          Pair("rstd", 16), Pair("dx", 2080), Pair("dgamma", 520), Pair("dbeta", 520)));
  ASSERT_EQ(plan.launches.size(), 2u);
  for (const Launch& l : plan.launches) {
    EXPECT_EQ(l.kernel, "layer_norm_backward");
    EXPECT_THAT(l.operands, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
    EXPECT_THAT(PushWords(l), ElementsAre(4, 130));
  }
  // 130 columns: pass 0 an invocation per row (constant 2 = 1); pass 1 four
  // invocations per column, 16 columns to a workgroup of 64.
  EXPECT_EQ(plan.launches[0].groups, (Groups{1, 1, 1}));
  EXPECT_THAT(plan.launches[0].spec, ElementsAre(Pair(1u, 0u), Pair(2u, 1u)));
  EXPECT_EQ(plan.launches[1].groups, (Groups{9, 1, 1}));  // ceil(130 / 16)
  EXPECT_THAT(plan.launches[1].spec, ElementsAre(Pair(1u, 1u)));
  // Past 256 columns pass 0 takes a workgroup per row.
  ASSERT_OK_AND_ASSIGN(OpPlan wide, PlanLayerNormBackward(4, 300));
  EXPECT_EQ(wide.launches[0].groups, (Groups{4, 1, 1}));
  EXPECT_THAT(wide.launches[0].spec, ElementsAre(Pair(1u, 0u), Pair(2u, 0u)));
  EXPECT_EQ(wide.launches[1].groups, (Groups{19, 1, 1}));  // ceil(300 / 16)
}

// Tests the causal softmax plans: rows = batch_heads * t, a group each.
TEST(NnPlanTest, SoftmaxCausal) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanSoftmaxCausal(2, 5, 0.5f));
  EXPECT_EQ(plan.name, "softmax_causal 2x5");
  EXPECT_THAT(PlanOperands(plan), ElementsAre(Pair("x", 200), Pair("y", 200)));
  ASSERT_EQ(plan.launches.size(), 1u);
  EXPECT_EQ(plan.launches[0].kernel, "softmax_causal");
  EXPECT_THAT(PushWords(plan.launches[0]), ElementsAre(10, 5, Bits(0.5f)));
  EXPECT_EQ(plan.launches[0].groups, (Groups{10, 1, 1}));

  ASSERT_OK_AND_ASSIGN(OpPlan back, PlanSoftmaxCausalBackward(2, 5, 0.5f));
  EXPECT_EQ(back.name, "softmax_causal_backward 2x5");
  EXPECT_THAT(PlanOperands(back), ElementsAre(Pair("y", 200), Pair("dy", 200), Pair("dx", 200)));
  EXPECT_EQ(back.launches[0].kernel, "softmax_causal_backward");
  EXPECT_THAT(PushWords(back.launches[0]), ElementsAre(10, 5, Bits(0.5f)));
  EXPECT_EQ(back.launches[0].groups, (Groups{10, 1, 1}));
}

// Tests the cross-entropy plans, and the backward's scale: 1 / rows unless
// given.
TEST(NnPlanTest, CrossEntropy) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanCrossEntropy(4, 10));
  EXPECT_EQ(plan.name, "cross_entropy 4x10");
  EXPECT_THAT(PlanOperands(plan), ElementsAre(Pair("logits", 160), Pair("targets", 16), Pair("loss", 16)));
  EXPECT_EQ(plan.launches[0].kernel, "cross_entropy");
  EXPECT_THAT(PushWords(plan.launches[0]), ElementsAre(4, 10));
  // Up to 256 columns a row per invocation (constant 1 = 1), 64 a group.
  EXPECT_EQ(plan.launches[0].groups, (Groups{1, 1, 1}));
  EXPECT_THAT(plan.launches[0].spec, ElementsAre(Pair(1u, 1u)));
  ASSERT_OK_AND_ASSIGN(OpPlan wide, PlanCrossEntropy(4, 257));
  EXPECT_EQ(wide.launches[0].groups, (Groups{4, 1, 1}));
  EXPECT_THAT(wide.launches[0].spec, ElementsAre(Pair(1u, 0u)));

  ASSERT_OK_AND_ASSIGN(OpPlan back, PlanCrossEntropyBackward(4, 10));
  EXPECT_THAT(PlanOperands(back),
              ElementsAre(Pair("logits", 160), Pair("targets", 16), Pair("dlogits", 160)));
  EXPECT_EQ(back.launches[0].kernel, "cross_entropy_backward");
  EXPECT_THAT(PushWords(back.launches[0]), ElementsAre(4, 10, Bits(0.25f)));
  EXPECT_EQ(back.launches[0].groups, (Groups{1, 1, 1}));
  EXPECT_THAT(back.launches[0].spec, ElementsAre(Pair(1u, 1u)));
  ASSERT_OK_AND_ASSIGN(OpPlan wide_back, PlanCrossEntropyBackward(130, 300));
  EXPECT_EQ(wide_back.launches[0].groups, (Groups{130, 1, 1}));
  EXPECT_THAT(wide_back.launches[0].spec, ElementsAre(Pair(1u, 0u)));
  ASSERT_OK_AND_ASSIGN(OpPlan scaled, PlanCrossEntropyBackward(4, 10, 2.0f));
  EXPECT_THAT(PushWords(scaled.launches[0]), ElementsAre(4, 10, Bits(2.0f)));
}

// Tests the embedding plan with and without a position table; without
// one, the token table stands in for the unread binding 2.
TEST(NnPlanTest, EmbeddingWithAndWithoutPositions) {
  ASSERT_OK_AND_ASSIGN(OpPlan with, PlanEmbedding(6, 3, 10, 2, true));
  EXPECT_EQ(with.name, "embedding 6x3");
  EXPECT_THAT(PlanOperands(with),
              ElementsAre(Pair("ids", 24), Pair("table", 120), Pair("pos", 24), Pair("out", 72)));
  EXPECT_EQ(with.launches[0].kernel, "embedding");
  EXPECT_THAT(with.launches[0].operands, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(PushWords(with.launches[0]), ElementsAre(6, 3, 10, 2, 1));
  EXPECT_EQ(with.launches[0].groups, (Groups{1, 1, 1}));

  ASSERT_OK_AND_ASSIGN(OpPlan without, PlanEmbedding(600, 3, 10, 2, false));
  EXPECT_THAT(PlanOperands(without), ElementsAre(Pair("ids", 2400), Pair("table", 120), Pair("out", 7200)));
  EXPECT_THAT(without.launches[0].operands, ElementsAre(0, 1, 1, 2));
  EXPECT_THAT(PushWords(without.launches[0]), ElementsAre(600, 3, 10, 2, 0));
  EXPECT_EQ(without.launches[0].groups, (Groups{8, 1, 1}));  // ceil(1800 / 256)
}

// Tests the two embedding backwards: by ids over the table's rows, and by
// position (dout standing in for the unread ids binding).
TEST(NnPlanTest, EmbeddingBackwards) {
  ASSERT_OK_AND_ASSIGN(OpPlan ids, PlanEmbeddingBackward(6, 130, 10));
  EXPECT_EQ(ids.name, "embedding_backward 6x130");
  EXPECT_THAT(PlanOperands(ids), ElementsAre(Pair("ids", 24), Pair("dout", 3120), Pair("dtable", 5200)));
  EXPECT_EQ(ids.launches[0].kernel, "embedding_backward");
  EXPECT_THAT(ids.launches[0].operands, ElementsAre(0, 1, 2));
  EXPECT_THAT(PushWords(ids.launches[0]), ElementsAre(6, 130, 10, 0));
  EXPECT_EQ(ids.launches[0].groups, (Groups{3, 1, 1}));  // ceil(130 / 64)

  ASSERT_OK_AND_ASSIGN(OpPlan pos, PlanPositionEmbeddingBackward(6, 3, 2));
  EXPECT_EQ(pos.name, "embedding_backward (positions) 6x3");
  EXPECT_THAT(PlanOperands(pos), ElementsAre(Pair("dout", 72), Pair("dpos", 24)));
  EXPECT_EQ(pos.launches[0].kernel, "embedding_backward");
  EXPECT_THAT(pos.launches[0].operands, ElementsAre(0, 0, 1));
  EXPECT_THAT(PushWords(pos.launches[0]), ElementsAre(6, 3, 2, 1));
  EXPECT_EQ(pos.launches[0].groups, (Groups{1, 1, 1}));
}

// Tests the optimizer plans: Adam's hyperparameters in the push constants
// in the kernel's order; SGD with momentum binds a velocity, without it g
// stands in for the unread binding.
TEST(NnPlanTest, Optimizers) {
  AdamConfig config{.lr = 0.1f, .beta1 = 0.5f, .beta2 = 0.75f, .eps = 1e-6f, .weight_decay = 0.01f};
  ASSERT_OK_AND_ASSIGN(OpPlan adam, PlanAdam(1000, 3, config));
  EXPECT_EQ(adam.name, "adam 1000");
  EXPECT_THAT(PlanOperands(adam),
              ElementsAre(Pair("p", 4000), Pair("g", 4000), Pair("m", 4000), Pair("v", 4000)));
  EXPECT_EQ(adam.launches[0].kernel, "adam");
  EXPECT_THAT(PushWords(adam.launches[0]),
              ElementsAre(1000, 3, Bits(0.1f), Bits(0.5f), Bits(0.75f), Bits(1e-6f), Bits(0.01f)));
  EXPECT_EQ(adam.launches[0].groups, (Groups{4, 1, 1}));

  ASSERT_OK_AND_ASSIGN(OpPlan update, PlanAdamUpdate(10, config));
  EXPECT_EQ(update.name, "adam_update 10");
  EXPECT_THAT(PlanOperands(update),
              ElementsAre(Pair("p", 40), Pair("g", 40), Pair("m", 40), Pair("v", 40), Pair("step", 4),
                          Pair("p_out", 40), Pair("m_out", 40), Pair("v_out", 40)));
  EXPECT_EQ(update.launches[0].kernel, "adam_update");
  EXPECT_THAT(update.launches[0].operands, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(PushWords(update.launches[0]),
              ElementsAre(10, Bits(0.1f), Bits(0.5f), Bits(0.75f), Bits(1e-6f), Bits(0.01f)));

  ASSERT_OK_AND_ASSIGN(OpPlan plain, PlanSgd(10, 0.5f));
  EXPECT_EQ(plain.name, "sgd 10");
  EXPECT_THAT(PlanOperands(plain), ElementsAre(Pair("p", 40), Pair("g", 40)));
  EXPECT_THAT(plain.launches[0].operands, ElementsAre(0, 1, 1));
  EXPECT_THAT(PushWords(plain.launches[0]), ElementsAre(10, Bits(0.5f), Bits(0.0f)));
  ASSERT_OK_AND_ASSIGN(OpPlan momentum, PlanSgd(10, 0.5f, 0.9f));
  EXPECT_THAT(PlanOperands(momentum), ElementsAre(Pair("p", 40), Pair("g", 40), Pair("velocity", 40)));
  EXPECT_THAT(momentum.launches[0].operands, ElementsAre(0, 1, 2));
  EXPECT_THAT(PushWords(momentum.launches[0]), ElementsAre(10, Bits(0.5f), Bits(0.9f)));
}

// Tests the multi-tensor Adam plan: operands in the documented order, a
// launch per four tensors, each tensor's groups after its predecessor's
// (capped so that four stay within 65535), unused slots with no elements,
// no groups and a first group past the launch's end, bound to the last
// used tensor's operands.
TEST(NnPlanTest, AdamUpdateMulti) {
  AdamConfig config{.lr = 0.1f, .beta1 = 0.5f, .beta2 = 0.75f, .eps = 1e-6f, .weight_decay = 0.01f};
  const uint32_t big = 16383 * 256 + 1;  // past the cap of 16383 groups
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanAdamUpdateMulti({10, 300, big, 256, 5}, config));
  EXPECT_EQ(plan.name, absl::StrCat("adam_update_multi 10+300+", big, "+256+5"));
  ASSERT_EQ(plan.operands.size(), 5u * 7 + 1);
  EXPECT_EQ(plan.operands[0].name, "p0");
  EXPECT_EQ(plan.operands[7].name, "v1");
  EXPECT_EQ(plan.operands[7].bytes, 1200u);
  EXPECT_EQ(plan.operands[20].name, "step");
  EXPECT_EQ(plan.operands[20].bytes, 4u);
  EXPECT_EQ(plan.operands[21].name, "p_out0");
  EXPECT_EQ(plan.operands[35].name, "v_out4");
  EXPECT_EQ(plan.operands[35].bytes, 20u);
  ASSERT_EQ(plan.launches.size(), 2u);
  const Launch& first = plan.launches[0];
  EXPECT_EQ(first.kernel, "adam_update_multi");
  EXPECT_THAT(first.operands, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22,
                                          23, 24, 25, 26, 27, 28, 29, 30, 31, 32));
  EXPECT_THAT(PushWords(first), ElementsAre(10, 300, big, 256, 0, 1, 3, 16386, 1, 2, 16383, 1, Bits(0.1f),
                                            Bits(0.5f), Bits(0.75f), Bits(1e-6f), Bits(0.01f)));
  EXPECT_EQ(first.groups, (Groups{16387, 1, 1}));
  const Launch& second = plan.launches[1];
  EXPECT_THAT(second.operands, ElementsAre(16, 17, 18, 19, 16, 17, 18, 19, 16, 17, 18, 19, 16, 17, 18, 19, 20,
                                           33, 34, 35, 33, 34, 35, 33, 34, 35, 33, 34, 35));
  EXPECT_THAT(PushWords(second), ElementsAre(5, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, Bits(0.1f), Bits(0.5f),
                                             Bits(0.75f), Bits(1e-6f), Bits(0.01f)));
  EXPECT_EQ(second.groups, (Groups{1, 1, 1}));
}

// Tests the head split/merge permutation's plan.
TEST(NnPlanTest, Permute0213) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanPermute0213(2, 3, 4, 50));
  EXPECT_EQ(plan.name, "permute_0213 [2, 3, 4, 50]");
  EXPECT_THAT(PlanOperands(plan), ElementsAre(Pair("in", 4800), Pair("out", 4800)));
  EXPECT_EQ(plan.launches[0].kernel, "permute_0213");
  EXPECT_THAT(PushWords(plan.launches[0]), ElementsAre(2, 3, 4, 50));
  // 24 rows of 50: too few rows for a row per invocation.
  EXPECT_EQ(plan.launches[0].groups, (Groups{5, 1, 1}));  // ceil(1200 / 256)
  EXPECT_THAT(plan.launches[0].spec, ElementsAre(Pair(1u, 0u)));
  // 1024 rows of 16 (the demo's heads): an invocation per row.
  ASSERT_OK_AND_ASSIGN(OpPlan rows, PlanPermute0213(16, 64, 1, 16));
  EXPECT_EQ(rows.launches[0].groups, (Groups{4, 1, 1}));  // ceil(1024 / 256)
  EXPECT_THAT(rows.launches[0].spec, ElementsAre(Pair(1u, 1u)));
  // Rows past 1024 elements: an invocation per element again.
  ASSERT_OK_AND_ASSIGN(OpPlan long_rows, PlanPermute0213(1024, 1, 1, 1025));
  EXPECT_THAT(long_rows.launches[0].spec, ElementsAre(Pair(1u, 0u)));
}

// Tests every size and parameter error, each by its own message.
TEST(NnPlanTest, RefusesBadSizes) {
  constexpr auto kBad = absl::StatusCode::kInvalidArgument;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  EXPECT_ERROR(PlanBiasGelu(0, 4), kBad, "bias_gelu: rows and cols must be > 0, got rows 0, cols 4");
  EXPECT_ERROR(PlanBiasGeluBackward(4, 0), kBad,
               "bias_gelu_backward: rows and cols must be > 0, got rows 4, cols 0");
  EXPECT_ERROR(PlanBiasGelu(65536, 65536), kBad,
               "bias_gelu: rows * cols = 4294967296 exceeds 2^32 - 1 elements");
  EXPECT_ERROR(PlanLayerNorm(2, 2, 0.0f), kBad, "layer_norm: eps must be finite and > 0, got 0");
  EXPECT_ERROR(PlanLayerNorm(2, 2, kNaN), kBad, "layer_norm: eps must be finite and > 0, got nan");
  EXPECT_ERROR(PlanLayerNorm(2, 2, kInf), kBad, "layer_norm: eps must be finite and > 0, got inf");
  EXPECT_ERROR(PlanLayerNormBackward(0, 2), kBad, "layer_norm_backward: rows and cols must be > 0");
  EXPECT_ERROR(PlanSoftmaxCausal(2, 65536, 1.0f), kBad,
               "softmax_causal: batch_heads * t * t = 8589934592 exceeds 2^32 - 1 elements");
  EXPECT_ERROR(PlanSoftmaxCausal(0, 4, 1.0f), kBad,
               "softmax_causal: batch_heads and t must be > 0, got batch_heads 0, t 4");
  EXPECT_ERROR(PlanSoftmaxCausalBackward(1, 4, kInf), kBad, "softmax_causal_backward: scale must be finite");
  EXPECT_ERROR(PlanCrossEntropy(1, 2147483648u), kBad, "cross_entropy: vocab 2147483648 exceeds i32 targets");
  EXPECT_ERROR(PlanCrossEntropy(0, 10), kBad,
               "cross_entropy: rows and vocab must be > 0, got rows 0, vocab 10");
  EXPECT_ERROR(PlanCrossEntropyBackward(4, 10, kNaN), kBad, "cross_entropy_backward: scale must be finite");
  EXPECT_ERROR(PlanEmbedding(6, 3, 0, 2, true), kBad,
               "embedding: vocab and dim must be > 0, got vocab 0, dim 3");
  EXPECT_ERROR(PlanEmbedding(6, 3, 10, 0, false), kBad,
               "embedding: seq_len and dim must be > 0, got seq_len 0");
  EXPECT_ERROR(PlanEmbeddingBackward(0, 3, 10), kBad,
               "embedding_backward: tokens and dim must be > 0, got tokens 0");
  EXPECT_ERROR(PlanPositionEmbeddingBackward(5, 3, 2), kBad,
               "embedding_backward (positions): tokens (5) must be a multiple of seq_len (2)");
  EXPECT_ERROR(PlanAdam(0, 1, {}), kBad, "adam: count must be > 0");
  EXPECT_ERROR(PlanAdam(4, 0, {}), kBad, "adam: step counts from 1, got 0");
  EXPECT_ERROR(PlanAdam(4, 1, {.beta1 = 1.0f}), kBad,
               "adam: beta1 and beta2 must be in [0, 1), got 1 and 0.999");
  EXPECT_ERROR(PlanAdam(4, 1, {.beta2 = kNaN}), kBad,
               "adam: beta1 and beta2 must be in [0, 1), got 0.9 and nan");
  EXPECT_ERROR(PlanAdam(4, 1, {.eps = 0.0f}), kBad,
               "adam: needs eps > 0 and finite lr and weight_decay, got eps 0");
  EXPECT_ERROR(PlanAdamUpdate(4, {.lr = kInf}), kBad,
               "adam_update: needs eps > 0 and finite lr and weight_decay");
  EXPECT_ERROR(PlanAdamUpdate(0, {}), kBad, "adam_update: count must be > 0");
  EXPECT_ERROR(PlanSgd(0, 0.1f), kBad, "sgd: count must be > 0");
  EXPECT_ERROR(PlanSgd(4, kInf), kBad, "sgd: lr and momentum must be finite, got inf, 0");
  EXPECT_ERROR(PlanSgd(4, 0.1f, kNaN), kBad, "sgd: lr and momentum must be finite, got 0.1, nan");
  EXPECT_ERROR(PlanPermute0213(1, 0, 1, 1), kBad, "permute_0213 [1, 0, 1, 1]: every size must be > 0");
  EXPECT_ERROR(PlanPermute0213(65536, 1, 65536, 1), kBad,
               "permute_0213 [65536, 1, 65536, 1]: more than 2^32 - 1 elements");
}

// Runs plans on lavapipe: each operand a buffer of exactly its bytes,
// uploaded from `inputs` (as 32-bit words; empty: zeros), read back after.
class NnPlanRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime();
    ASSERT_NE(rt_, nullptr);
    acc_ = rt_->accelerator(0);
  }

  absl::StatusOr<std::vector<std::vector<float>>> Run(const OpPlan& plan,
                                                      const std::vector<std::vector<float>>& inputs) {
    std::vector<BufferArg> args;
    for (size_t i = 0; i < plan.operands.size(); ++i) {
      std::vector<float> data(plan.operands[i].bytes / 4, 0.0f);
      if (i < inputs.size() && !inputs[i].empty()) {
        if (inputs[i].size() != data.size())
          return absl::InternalError("input size differs from the operand");
        data = inputs[i];
      }
      CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, acc_->CreateBuffer(plan.operands[i].bytes));
      CAUSEWAY_RETURN_IF_ERROR(acc_->UploadSync(buffer, data.data(), plan.operands[i].bytes));
      args.emplace_back(std::move(buffer));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<CommandList> list, acc_->CreateCommandList("nn_ops_test"));
    CAUSEWAY_RETURN_IF_ERROR(Record(*list, plan, args));
    CAUSEWAY_RETURN_IF_ERROR(acc_->Submit(list).Await());
    std::vector<std::vector<float>> out;
    for (const BufferArg& arg : args) {
      std::vector<float> data(arg.buffer->size() / 4);
      CAUSEWAY_RETURN_IF_ERROR(acc_->DownloadSync(arg.buffer, data.data(), arg.buffer->size()));
      out.push_back(std::move(data));
    }
    return out;
  }

  std::unique_ptr<Runtime> rt_;
  Accelerator* acc_ = nullptr;
};

// i32 words carried in a float vector, as the buffers hold them.
std::vector<float> AsWords(const std::vector<int32_t>& ids) {
  std::vector<float> out;
  for (int32_t id : ids) out.push_back(std::bit_cast<float>(id));
  return out;
}

// Tolerance: the kernels work in f32, the references in double; see
// nn_kernels_test.cc for why 2e-5 separates rounding from a wrong result.
constexpr double kTol = 2e-5;

// Tests the embedding plan without positions on the device: the stand-in
// binding is never read as positions.
TEST_F(NnPlanRunTest, EmbeddingWithoutPositions) {
  const std::vector<int32_t> ids = {3, 0, 9, 3, 5, 1, 2};
  const std::vector<float> table = RandomFloats(10 * 4, 1);
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanEmbedding(7, 4, 10, 7, false));
  ASSERT_OK_AND_ASSIGN(auto out, Run(plan, {AsWords(ids), table}));
  EXPECT_LT(reference::MaxRelativeError(out[2], reference::Embedding(ids, table, {}, 4, 7)), kTol);
}

// Tests the position-embedding backward on the device against sums worked
// out directly: dpos[s] = the sum of dout over the tokens at position s.
TEST_F(NnPlanRunTest, PositionEmbeddingBackward) {
  const uint32_t tokens = 6, dim = 3, seq_len = 2;
  const std::vector<float> dout = RandomFloats(tokens * dim, 2);
  std::vector<float> want(seq_len * dim, 0.0f);
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint32_t j = 0; j < dim; ++j) want[(t % seq_len) * dim + j] += dout[t * dim + j];
  }
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanPositionEmbeddingBackward(tokens, dim, seq_len));
  // dpos starts as garbage: the whole of it is overwritten.
  ASSERT_OK_AND_ASSIGN(auto out, Run(plan, {dout, std::vector<float>(seq_len * dim, 123.0f)}));
  EXPECT_LT(reference::MaxRelativeError(out[1], want), kTol);
  EXPECT_EQ(out[0], dout);
}

// Tests layer_norm_backward's two passes on the device: dx from the row
// pass, dgamma and dbeta from the column pass.
TEST_F(NnPlanRunTest, LayerNormBackward) {
  const uint32_t rows = 5, cols = 70;
  const std::vector<float> x = RandomFloats(rows * cols, 3), dy = RandomFloats(rows * cols, 4);
  const std::vector<float> gamma = RandomFloats(cols, 5, 0.5f, 1.5f), beta = RandomFloats(cols, 6);
  const reference::LayerNormResult fwd = reference::LayerNorm(x, gamma, beta, rows, cols, 1e-5f);
  const reference::LayerNormGrads want =
      reference::LayerNormBackward(dy, x, gamma, fwd.mean, fwd.rstd, rows, cols);
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanLayerNormBackward(rows, cols));
  ASSERT_OK_AND_ASSIGN(auto out, Run(plan, {dy, x, gamma, fwd.mean, fwd.rstd}));
  EXPECT_LT(reference::MaxRelativeError(out[5], want.dx), kTol);
  EXPECT_LT(reference::MaxRelativeError(out[6], want.dgamma), kTol);
  EXPECT_LT(reference::MaxRelativeError(out[7], want.dbeta), kTol);
}

// Tests SGD without momentum on the device: p -= lr * g, and g (bound a
// second time in the velocity's place) left as it was.
TEST_F(NnPlanRunTest, SgdWithoutMomentum) {
  const std::vector<float> p = {1.0f, 2.0f, -3.0f}, g = {0.5f, -1.0f, 4.0f};
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanSgd(3, 0.25f));
  ASSERT_OK_AND_ASSIGN(auto out, Run(plan, {p, g}));
  EXPECT_THAT(out[0], ElementsAre(0.875f, 2.25f, -4.0f));
  EXPECT_EQ(out[1], g);
}

// Tests the head permutation on the device against index arithmetic done
// here: out[a, c, b, d] = in[a, b, c, d].
TEST_F(NnPlanRunTest, Permute0213) {
  const uint32_t A = 2, B = 3, C = 4, D = 5;
  std::vector<float> in(A * B * C * D);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  std::vector<float> want(in.size());
  for (uint32_t a = 0; a < A; ++a)
    for (uint32_t b = 0; b < B; ++b)
      for (uint32_t c = 0; c < C; ++c)
        for (uint32_t d = 0; d < D; ++d)
          want[((a * C + c) * B + b) * D + d] = in[((a * B + b) * C + c) * D + d];
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanPermute0213(A, B, C, D));
  ASSERT_OK_AND_ASSIGN(auto out, Run(plan, {in}));
  EXPECT_THAT(out[1], ElementsAreArray(want));
}

}  // namespace
}  // namespace causeway::ops
