// The attention plans (causeway/kernels/attention_ops.h Plan*), made without a
// device (the shared-tiles path) and for the lanes path: operands and byte sizes, launches (the backward's
// dot pre-pass and its two passes), push constants and workgroups worked out by hand from the kernels' header
// comments; each shape error by its own message; and both plans run on lavapipe against the CPU reference of
// causeway/kernels/attention_reference.h.
#include "causeway/kernels/attention_ops.h"

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "causeway/kernels/attention_reference.h"
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
using ::testing::Pair;
using Groups = std::array<uint32_t, 3>;

// head_dim 16: the scale 1 / sqrt(16) = 0.25 is exact.
constexpr AttentionShape kShape{.batch = 2, .heads = 3, .seq_len = 20, .head_dim = 16};

// Tests the forward plan: one fused launch, 16 query rows per group in x,
// one (batch, head) per group in y, specialized for the head size (constant 1).
TEST(AttentionPlanTest, Forward) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanAttentionForward(kShape));
  EXPECT_EQ(plan.name, "attention [2, 3, 20, 16]");
  // 2 * 3 * 20 * 16 = 1920 floats; lse 2 * 3 * 20 = 120.
  EXPECT_THAT(PlanOperands(plan), ElementsAre(Pair("q", 7680), Pair("k", 7680), Pair("v", 7680),
                                              Pair("out", 7680), Pair("lse", 480)));
  ASSERT_EQ(plan.launches.size(), 1u);
  EXPECT_EQ(plan.launches[0].kernel, "attention");
  EXPECT_THAT(plan.launches[0].operands, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(PushWords(plan.launches[0]), ElementsAre(20, 16, Bits(0.25f)));
  EXPECT_EQ(plan.launches[0].groups, (Groups{2, 6, 1}));
  EXPECT_THAT(plan.launches[0].spec, ElementsAre(Pair(1u, 16u)));
}

// Tests the backward plan: delta = rowsum(d_out * out) first, then the
// dk/dv pass (constant 1 = 0) and the dq pass (constant 1 = 1), both
// specialized for the head size (constant 2).
TEST(AttentionPlanTest, Backward) {
  ASSERT_OK_AND_ASSIGN(OpPlan plan, PlanAttentionBackward(kShape));
  EXPECT_EQ(plan.name, "attention_backward [2, 3, 20, 16]");
  EXPECT_THAT(PlanOperands(plan),
              ElementsAre(Pair("q", 7680), Pair("k", 7680), Pair("v", 7680), Pair("out", 7680),
                          Pair("d_out", 7680), Pair("lse", 480), Pair("delta", 480), Pair("dq", 7680),
                          Pair("dk", 7680), Pair("dv", 7680)));
  ASSERT_EQ(plan.launches.size(), 3u);
  const Launch& dot = plan.launches[0];
  EXPECT_EQ(dot.kernel, "attention_backward_dot");
  EXPECT_THAT(dot.operands, ElementsAre(3, 4, 6));  // out, d_out -> delta
  EXPECT_THAT(PushWords(dot), ElementsAre(120, 16));
  EXPECT_EQ(dot.groups, (Groups{1, 1, 1}));  // ceil(120 / 256)
  for (uint32_t pass : {0u, 1u}) {
    const Launch& l = plan.launches[1 + pass];
    EXPECT_EQ(l.kernel, "attention_backward");
    EXPECT_THAT(l.operands, ElementsAre(0, 1, 2, 4, 5, 6, 7, 8, 9));  // all but out
    EXPECT_THAT(PushWords(l), ElementsAre(20, 16, Bits(0.25f)));
    EXPECT_EQ(l.groups, (Groups{2, 6, 1}));
    EXPECT_THAT(l.spec, ElementsAre(Pair(1u, pass), Pair(2u, 16u)));
  }
}

// Tests the lanes plans (what a CPU device gets): 8 invocations per group,
// each owning R rows, R * head_dim at most 128 with R at most 8 forward
// (queries) and 4 backward (keys, then queries): at head_dim 16, 64 rows per
// group forward and 32 backward.
TEST(AttentionPlanTest, LanesPath) {
  ASSERT_OK_AND_ASSIGN(OpPlan forward, PlanAttentionForward(kShape, nullptr, AttentionPath::kLanes));
  ASSERT_EQ(forward.launches.size(), 1u);
  EXPECT_EQ(forward.launches[0].kernel, "attention_lanes");
  EXPECT_THAT(forward.launches[0].operands, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(PushWords(forward.launches[0]), ElementsAre(20, 16, Bits(0.25f)));
  EXPECT_EQ(forward.launches[0].groups, (Groups{1, 6, 1}));  // ceil(20 / 64)
  EXPECT_THAT(forward.launches[0].spec, ElementsAre(Pair(0u, 8u), Pair(1u, 16u), Pair(2u, 8u)));

  ASSERT_OK_AND_ASSIGN(OpPlan backward, PlanAttentionBackward(kShape, nullptr, AttentionPath::kLanes));
  ASSERT_EQ(backward.launches.size(), 3u);
  EXPECT_EQ(backward.launches[0].kernel, "attention_backward_dot");
  for (uint32_t pass : {0u, 1u}) {
    const Launch& l = backward.launches[1 + pass];
    EXPECT_EQ(l.kernel, "attention_backward_lanes");
    EXPECT_THAT(l.operands, ElementsAre(0, 1, 2, 4, 5, 6, 7, 8, 9));
    EXPECT_EQ(l.groups, (Groups{1, 6, 1}));  // ceil(20 / 32)
    EXPECT_THAT(l.spec, ElementsAre(Pair(0u, 8u), Pair(1u, pass), Pair(2u, 16u), Pair(3u, 4u)));
  }

  // Rows per invocation by head_dim (forward, backward), and the groups
  // they give at T = 100.
  struct Case {
    uint32_t head_dim, forward, backward;
  };
  for (const Case& c :
       {Case{3, 8, 4}, Case{32, 4, 4}, Case{33, 3, 3}, Case{64, 2, 2}, Case{65, 1, 1}, Case{128, 1, 1}}) {
    SCOPED_TRACE(c.head_dim);
    const AttentionShape s{.batch = 1, .heads = 2, .seq_len = 100, .head_dim = c.head_dim};
    ASSERT_OK_AND_ASSIGN(OpPlan f, PlanAttentionForward(s, nullptr, AttentionPath::kLanes));
    EXPECT_THAT(f.launches[0].spec, ElementsAre(Pair(0u, 8u), Pair(1u, c.head_dim), Pair(2u, c.forward)));
    EXPECT_EQ(f.launches[0].groups, (Groups{(100 + 8 * c.forward - 1) / (8 * c.forward), 2, 1}));
    ASSERT_OK_AND_ASSIGN(OpPlan b, PlanAttentionBackward(s, nullptr, AttentionPath::kLanes));
    EXPECT_THAT(b.launches[2].spec,
                ElementsAre(Pair(0u, 8u), Pair(1u, 1u), Pair(2u, c.head_dim), Pair(3u, c.backward)));
    EXPECT_EQ(b.launches[2].groups, (Groups{(100 + 8 * c.backward - 1) / (8 * c.backward), 2, 1}));
  }
}

// Tests each shape error by its own message, for both plans.
TEST(AttentionPlanTest, RefusesBadShapes) {
  constexpr auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_ERROR(PlanAttentionForward({.batch = 1, .heads = 0, .seq_len = 4, .head_dim = 4}), kBad,
               "attention: batch, heads, seq_len and head_dim must be > 0, got 1, 0, 4, 4");
  EXPECT_ERROR(PlanAttentionBackward({.batch = 1, .heads = 1, .seq_len = 4, .head_dim = 129}), kBad,
               "attention_backward: head_dim must be at most 128, got 129");
  EXPECT_ERROR(PlanAttentionForward({.batch = 1, .heads = 1, .seq_len = 1u << 26, .head_dim = 64}), kBad,
               "attention: tensors of at most 2^32 - 1 elements, got 4294967296");
  EXPECT_ERROR(PlanAttentionBackward({.batch = 256, .heads = 256, .seq_len = 1, .head_dim = 1}), kBad,
               "attention_backward: batch * heads must be at most 65535, got 65536");
  ASSERT_OK(PlanAttentionForward({.batch = 255, .heads = 257, .seq_len = 1, .head_dim = 128}).status());
}

// Runs the attention plans on lavapipe against the double-precision CPU
// reference (tolerances as attention_test.cc: 1e-5 forward, 2e-5 backward,
// relative to max(1, |want|), for inputs in [-1, 1)).
TEST(AttentionPlanRunTest, PlansMatchTheReference) {
  auto rt = MakeRuntime();
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const AttentionShape shape{.batch = 1, .heads = 2, .seq_len = 19, .head_dim = 16};
  const reference::AttentionDims dims{.batch = 1, .heads = 2, .seq_len = 19, .head_dim = 16, .scale = 0.25f};
  const size_t n = shape.elements(), rows = shape.rows();
  const std::vector<float> q = RandomFloats(n, 1), k = RandomFloats(n, 2), v = RandomFloats(n, 3);
  const std::vector<float> d_out = RandomFloats(n, 4);
  const reference::AttentionForwardResult fwd = reference::AttentionForward(q, k, v, dims);
  const reference::AttentionGradients grads = reference::AttentionBackward(q, k, v, d_out, dims);

  // A buffer of `floats`, uploaded from `data` where given, else zeros.
  auto make = [&](const std::vector<float>& data, size_t floats) {
    std::vector<float> init = data.empty() ? std::vector<float>(floats, 0.0f) : data;
    auto buffer = acc->CreateBuffer(floats * 4);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_OK(acc->UploadSync(*buffer, init.data(), floats * 4));
    return *buffer;
  };
  auto read = [&](const std::shared_ptr<Buffer>& buffer) {
    std::vector<float> out(buffer->size() / 4);
    EXPECT_OK(acc->DownloadSync(buffer, out.data(), buffer->size()));
    return out;
  };
  auto bq = make(q, n), bk = make(k, n), bv = make(v, n);
  auto out = make({}, n), lse = make({}, rows);
  ASSERT_OK_AND_ASSIGN(OpPlan forward, PlanAttentionForward(shape));
  ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList("attention_ops_test"));
  ASSERT_OK(Record(*list, forward, {bq, bk, bv, out, lse}));
  ASSERT_OK(acc->Submit(list).Await());
  EXPECT_LT(reference::MaxRelativeError(read(out), fwd.out), 1e-5);
  EXPECT_LT(reference::MaxRelativeError(read(lse), fwd.lse), 1e-5);

  auto bd_out = make(d_out, n), delta = make({}, rows);
  auto dq = make({}, n), dk = make({}, n), dv = make({}, n);
  ASSERT_OK_AND_ASSIGN(OpPlan backward, PlanAttentionBackward(shape));
  ASSERT_OK_AND_ASSIGN(auto back_list, acc->CreateCommandList("attention_ops_test"));
  ASSERT_OK(Record(*back_list, backward, {bq, bk, bv, out, bd_out, lse, delta, dq, dk, dv}));
  ASSERT_OK(acc->Submit(back_list).Await());
  EXPECT_LT(reference::MaxRelativeError(read(dq), grads.dq), 2e-5);
  EXPECT_LT(reference::MaxRelativeError(read(dk), grads.dk), 2e-5);
  EXPECT_LT(reference::MaxRelativeError(read(dv), grads.dv), 2e-5);
  // delta = rowsum(d_out * out), computed here from the reference's out.
  std::vector<float> want_delta(rows, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (uint32_t e = 0; e < shape.head_dim; ++e) sum += double{d_out[r * 16 + e]} * fwd.out[r * 16 + e];
    want_delta[r] = static_cast<float>(sum);
  }
  EXPECT_LT(reference::MaxRelativeError(read(delta), want_delta), 2e-5);
}

}  // namespace
}  // namespace causeway::ops
