// attention_backward: gradients of `attention` (causal, f32), in two passes of
// this kernel that recompute the probabilities from q, k and the forward's
// logsumexp, so T x T is never stored. With P[i, j] = exp(scale * q_i.k_j -
// lse[i]) for j <= i (0 otherwise), dP[i, j] = d_o[i].v[j] and
// dS[i, j] = P[i, j] (dP[i, j] - delta[i]):
//   pass 0 (specialization constant 1 = 0), one group per block of keys:
//     dv[j] = sum_i P[i, j] d_o[i]        dk[j] = scale * sum_i dS[i, j] q[i]
//   pass 1 (specialization constant 1 = 1), one group per block of queries:
//     dq[i] = scale * sum_j dS[i, j] k[j]
// Every output element is summed by one invocation in a fixed order: no
// atomics, and the results are bit-identical from run to run. Pass 0 writes
// only dk and dv, pass 1 only dq; both may be recorded in either order.
//
// As in attention: each invocation owns one row (a key in pass 0, a query in
// pass 1) and holds that row's two operands and its accumulators in
// registers, while its workgroup streams blocks of the other side's rows
// (with their lse and delta in pass 0) through shared memory; every tile read
// has the same address in all invocations (a broadcast on a GPU; lavapipe
// still reads it once per lane, which is why CPU devices run
// attention_backward_lanes.comp instead), and there are two barriers per
// block of 16 rows. (An earlier
// form shared each row among 4 invocations and passed P and dS through shared
// memory: three barriers per 8 rows, and 4 to 10 times slower on lavapipe.)
//
// Layout as attention.comp: q, k, v, d_o, dq, dk, dv are [BH, T, head_dim]
// (BH = batch * heads), row-major and densely packed; lse (from attention)
// and delta (from attention_backward_dot) are [BH, T].
//
// Bindings (set 0):  0: float q[]      (readonly)
//                    1: float k[]      (readonly)
//                    2: float v[]      (readonly)
//                    3: float d_o[]    (readonly)
//                    4: float lse[]    (readonly)   BH * T floats
//                    5: float delta[]  (readonly)   BH * T floats
//                    6: float dq[]     (writeonly)  written by pass 1
//                    7: float dk[]     (writeonly)  written by pass 0
//                    8: float dv[]     (writeonly)  written by pass 0
//                    (the [BH, T, head_dim] ones hold BH * T * head_dim floats)
// Push constants:    uint T; uint head_dim; float scale;  (as attention)
//                    T >= 1, 1 <= head_dim <= H.
// Specialization:    constant 0 = workgroup size R (default 16, at most 16):
//                    the group's own rows (keys in pass 0, queries in pass
//                    1), one invocation each.
//                    constant 1 = pass (0 or 1, default 0).
//                    constant 2 = H, the head_dim bound (default 128, at
//                    least head_dim, at most 128), as in attention: the
//                    loops over head_dim run to H and the tiles hold H
//                    columns, so H = head_dim wastes none of them.
// Dispatch:          (ceil(T / R), BH, 1) for each pass; (ceil(T / 16), BH, 1)
//                    by default.
// Shared memory:     (32 H + 32) * 4 bytes: 16.1 KiB at H = 128 (more than
//                    Vulkan's 16 KiB minimum; lavapipe has 32 KiB), 2.1 KiB
//                    at H = 16.
#version 450
#extension GL_EXT_control_flow_attributes : require

// Own rows per workgroup at most.
const uint kMaxRows = 16;
// Rows of the streamed block (queries in pass 0, keys in pass 1).
const uint kStep = 16;
layout(constant_id = 2) const uint kMaxHeadDim = 128;

layout(local_size_x = 16, local_size_x_id = 0) in;
layout(constant_id = 1) const uint kPass = 0;

layout(set = 0, binding = 0, std430) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1, std430) readonly buffer K { float k[]; };
layout(set = 0, binding = 2, std430) readonly buffer V { float v[]; };
layout(set = 0, binding = 3, std430) readonly buffer DO { float d_o[]; };
layout(set = 0, binding = 4, std430) readonly buffer Lse { float lse[]; };
layout(set = 0, binding = 5, std430) readonly buffer Delta { float delta[]; };
layout(set = 0, binding = 6, std430) writeonly buffer DQ { float dq[]; };
layout(set = 0, binding = 7, std430) writeonly buffer DK { float dk[]; };
layout(set = 0, binding = 8, std430) writeonly buffer DV { float dv[]; };

layout(push_constant) uniform Params {
  uint T;
  uint head_dim;
  float scale;
} p;

// The two passes are symmetric: the score is own_x.step_x[s] (pass 0: k.q,
// pass 1: q.k) and dP is own_y.step_y[s] (pass 0: v.d_o, pass 1: d_o.v):
//   pass 0: own_x = k, own_y = v, step_x = q, step_y = d_o
//   pass 1: own_x = q, own_y = d_o, step_x = k, step_y = v
// The step tiles are kStep rows of head_dim (rows past T are 0), sized by the
// specialization constant alone, which reflection resolves (an expression of
// it, it cannot). In pass 0 the step rows are queries, with their lse and
// delta.
shared float step_x[kStep][kMaxHeadDim];
shared float step_y[kStep][kMaxHeadDim];
shared float step_lse[kStep];
shared float step_delta[kStep];

void main() {
  const uint size = gl_WorkGroupSize.x;
  const uint lid = gl_LocalInvocationIndex;
  const uint T = p.T;
  const uint D = p.head_dim;
  const uint bh = gl_WorkGroupID.y;
  const uint base = bh * T * D;
  const uint o0 = gl_WorkGroupID.x * size;
  const uint own_row = o0 + lid;
  const bool owned = own_row < T;

  // The own row's operands and accumulators (acc_x: dk in pass 0, dq in
  // pass 1; acc_y: dv in pass 0), in registers: the loops over head_dim are
  // unrolled with guards, so the arrays are indexed by constants.
  float own_x[kMaxHeadDim];
  float own_y[kMaxHeadDim];
  float acc_x[kMaxHeadDim];
  float acc_y[kMaxHeadDim];
  [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
    const bool in_range = d < D && owned;
    const uint at = base + own_row * D + d;
    own_x[d] = in_range ? (kPass == 0 ? k[at] : q[at]) : 0.0;
    own_y[d] = in_range ? (kPass == 0 ? v[at] : d_o[at]) : 0.0;
    acc_x[d] = 0.0;
    acc_y[d] = 0.0;
  }
  // Pass 1: the own query's statistics.
  float own_lse = 0.0;
  float own_delta = 0.0;
  if (kPass == 1 && owned) {
    own_lse = lse[bh * T + own_row];
    own_delta = delta[bh * T + own_row];
  }

  // Pass 0: the queries that see any of the group's keys, [o0, T).
  // Pass 1: the keys any of the group's queries sees, [0, min(o0 + R, T)).
  // Uniform bounds, so the barriers are in uniform control flow.
  const uint first = (kPass == 0) ? o0 : 0;
  const uint end = (kPass == 0) ? T : min(o0 + size, T);
  for (uint s0 = first; s0 < end; s0 += kStep) {
    // The previous block's readers of the step tiles are done.
    barrier();
    for (uint e = lid; e < kStep * D; e += size) {
      const bool in_range = s0 + e / D < T;
      const uint at = base + s0 * D + e;
      if (kPass == 0) {
        step_x[e / D][e % D] = in_range ? q[at] : 0.0;
        step_y[e / D][e % D] = in_range ? d_o[at] : 0.0;
      } else {
        step_x[e / D][e % D] = in_range ? k[at] : 0.0;
        step_y[e / D][e % D] = in_range ? v[at] : 0.0;
      }
    }
    if (kPass == 0) {
      for (uint e = lid; e < kStep; e += size) {
        const bool in_range = s0 + e < T;
        step_lse[e] = in_range ? lse[bh * T + s0 + e] : 0.0;
        step_delta[e] = in_range ? delta[bh * T + s0 + e] : 0.0;
      }
    }
    barrier();
    for (uint s = 0; s < kStep; ++s) {
      const uint query = (kPass == 0) ? s0 + s : own_row;
      const uint key = (kPass == 0) ? own_row : s0 + s;
      float score = 0.0;
      float dp = 0.0;
      [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
        if (d < D) {
          score += own_x[d] * step_x[s][d];
          dp += own_y[d] * step_y[s][d];
        }
      }
      const float row_lse = (kPass == 0) ? step_lse[s] : own_lse;
      const float row_delta = (kPass == 0) ? step_delta[s] : own_delta;
      const bool seen = query < T && key <= query;
      const float prob = seen ? exp(score * p.scale - row_lse) : 0.0;
      const float ds = prob * (dp - row_delta);
      [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
        if (d < D) {
          acc_x[d] += ds * step_x[s][d];
          if (kPass == 0) {
            acc_y[d] += prob * step_y[s][d];
          }
        }
      }
    }
  }

  if (owned) {
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      if (d < D) {
        const uint at = base + own_row * D + d;
        if (kPass == 0) {
          dk[at] = acc_x[d] * p.scale;
          dv[at] = acc_y[d];
        } else {
          dq[at] = acc_x[d] * p.scale;
        }
      }
    }
  }
}
