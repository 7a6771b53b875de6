// attention_backward_lanes: `attention_backward` (same two passes, bindings,
// push constants, results and determinism) for CPU drivers, where each
// invocation is a lane of a SIMD vector and every component of every buffer
// or shared-memory read is a loop over the lanes, whatever the addresses (see
// attention_lanes.comp).
//
// Each invocation owns R rows (specialization constant 3; keys in pass 0,
// queries in pass 1), rows o0 + r * W + lane for r < R (W the workgroup size,
// o0 = group.x * W * R), holding their two operands and accumulators in
// registers. It walks the other side's rows one at a time, reading each
// element once straight from the buffers (the same address in every lane)
// and using it for all R rows: 2 R FMAs per component read, where
// attention_backward does two. No shared memory and no barriers. Row block r
// skips the other side's rows that none of its rows pairs with (a condition
// the same in all lanes). Every output element is summed by one invocation
// in the same order as attention_backward: the results are bit-identical
// from run to run.
//
// Layout, bindings and push constants: as attention_backward.comp.
// Specialization:    constant 0 = workgroup size W (default 8: one SIMD
//                    vector of lavapipe).
//                    constant 1 = pass (0: dk and dv, 1: dq; default 0).
//                    constant 2 = H, the head_dim bound (default 16, at
//                    least head_dim): the loops over head_dim run to H.
//                    constant 3 = R, rows per invocation (default 4). H * R
//                    is what the registers hold per array; the plan keeps
//                    it at most 128 (the driver's compile time grows faster
//                    than the unrolled code).
// Dispatch:          (ceil(T / (W * R)), BH, 1) for each pass.
#version 450
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 1) const uint kPass = 0;
layout(constant_id = 2) const uint kMaxHeadDim = 16;
layout(constant_id = 3) const uint kRows = 4;

layout(local_size_x = 8, local_size_x_id = 0) in;

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

// As in attention_backward, the passes are symmetric: the score is
// own_x.step_x (pass 0: k.q, pass 1: q.k) and dP is own_y.step_y (pass 0:
// v.d_o, pass 1: d_o.v):
//   pass 0: own_x = k, own_y = v, step_x = q, step_y = d_o
//   pass 1: own_x = q, own_y = d_o, step_x = k, step_y = v
void main() {
  const uint W = gl_WorkGroupSize.x;
  const uint lane = gl_LocalInvocationIndex;
  const uint T = p.T;
  const uint D = p.head_dim;
  const uint bh = gl_WorkGroupID.y;
  const uint base = bh * T * D;
  const uint o0 = gl_WorkGroupID.x * W * kRows;

  // acc_x: dk in pass 0, dq in pass 1; acc_y: dv in pass 0.
  float own_x[kRows][kMaxHeadDim];
  float own_y[kRows][kMaxHeadDim];
  float acc_x[kRows][kMaxHeadDim];
  float acc_y[kRows][kMaxHeadDim];
  float own_lse[kRows];
  float own_delta[kRows];
  [[unroll]] for (uint r = 0; r < kRows; ++r) {
    const uint row = o0 + r * W + lane;
    const bool owned = row < T;
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      const bool in_range = d < D && owned;
      const uint at = base + row * D + d;
      own_x[r][d] = in_range ? (kPass == 0 ? k[at] : q[at]) : 0.0;
      own_y[r][d] = in_range ? (kPass == 0 ? v[at] : d_o[at]) : 0.0;
      acc_x[r][d] = 0.0;
      acc_y[r][d] = 0.0;
    }
    own_lse[r] = (kPass == 1 && owned) ? lse[bh * T + row] : 0.0;
    own_delta[r] = (kPass == 1 && owned) ? delta[bh * T + row] : 0.0;
  }

  // Pass 0: the queries that see any of the group's keys, [o0, T).
  // Pass 1: the keys any of the group's queries sees, [0, min(o0 + W R, T)).
  const uint first = (kPass == 0) ? o0 : 0;
  const uint end = (kPass == 0) ? T : min(o0 + W * kRows, T);
  for (uint s = first; s < end; ++s) {
    const uint at = base + s * D;
    float step_x[kMaxHeadDim];
    float step_y[kMaxHeadDim];
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      step_x[d] = d < D ? (kPass == 0 ? q[at + d] : k[at + d]) : 0.0;
      step_y[d] = d < D ? (kPass == 0 ? d_o[at + d] : v[at + d]) : 0.0;
    }
    const float step_lse = kPass == 0 ? lse[bh * T + s] : 0.0;
    const float step_delta = kPass == 0 ? delta[bh * T + s] : 0.0;
    [[unroll]] for (uint r = 0; r < kRows; ++r) {
      // Pass 0: query s sees a key of block r only if s >= its first key.
      // Pass 1: key s is seen by block r only if s <= its last query.
      const uint block0 = o0 + r * W;
      if (kPass == 0 ? s >= block0 : s <= block0 + W - 1) {
        const uint row = block0 + lane;
        const uint query = (kPass == 0) ? s : row;
        const uint key = (kPass == 0) ? row : s;
        float score = 0.0;
        float dp = 0.0;
        [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
          if (d < D) {
            score += own_x[r][d] * step_x[d];
            dp += own_y[r][d] * step_y[d];
          }
        }
        const float row_lse = (kPass == 0) ? step_lse : own_lse[r];
        const float row_delta = (kPass == 0) ? step_delta : own_delta[r];
        const bool seen = query < T && key <= query;
        const float prob = seen ? exp(score * p.scale - row_lse) : 0.0;
        const float ds = prob * (dp - row_delta);
        [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
          if (d < D) {
            acc_x[r][d] += ds * step_x[d];
            if (kPass == 0) {
              acc_y[r][d] += prob * step_y[d];
            }
          }
        }
      }
    }
  }

  [[unroll]] for (uint r = 0; r < kRows; ++r) {
    const uint row = o0 + r * W + lane;
    if (row < T) {
      [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
        if (d < D) {
          const uint at = base + row * D + d;
          if (kPass == 0) {
            dk[at] = acc_x[r][d] * p.scale;
            dv[at] = acc_y[r][d];
          } else {
            dq[at] = acc_x[r][d] * p.scale;
          }
        }
      }
    }
  }
}
