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
//                    T >= 1, 1 <= head_dim <= 128.
// Specialization:    constant 0 = workgroup size (default 64): a multiple of
//                    4, at most 64; each group owns R = size / 4 rows (keys in
//                    pass 0, queries in pass 1), 4 invocations per row.
//                    constant 1 = pass (0 or 1, default 0).
// Dispatch:          (ceil(T / R), BH, 1) for each pass; (ceil(T / 16), BH, 1)
//                    by default.
// Shared memory:     25 KiB (more than Vulkan's 16 KiB minimum; lavapipe has
//                    32 KiB).
#version 450

const uint kThreadsPerRow = 4;
// Rows owned by a group at most (the default workgroup size / 4).
const uint kMaxRows = 16;
// Rows of the streamed block (queries in pass 0, keys in pass 1).
const uint kStep = 8;
const uint kMaxHeadDim = 128;
// Accumulated columns per invocation: column t + 4 c for c < kColsPerThread.
const uint kColsPerThread = kMaxHeadDim / kThreadsPerRow;

layout(local_size_x = 64, local_size_x_id = 0) in;
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

// The two passes are symmetric: the score is own_x[r].step_x[s] (pass 0:
// k.q, pass 1: q.k) and dP is own_y[r].step_y[s] (pass 0: v.d_o, pass 1:
// d_o.v). All are densely packed, rows x head_dim; rows past T are 0.
//   pass 0: own_x = k, own_y = v, step_x = q, step_y = d_o
//   pass 1: own_x = q, own_y = d_o, step_x = k, step_y = v
shared float own_x[kMaxRows * kMaxHeadDim];
shared float own_y[kMaxRows * kMaxHeadDim];
shared float step_x[kStep * kMaxHeadDim];
shared float step_y[kStep * kMaxHeadDim];
// P and dS of the current step, indexed [own row * kStep + step row].
shared float p_tile[kMaxRows * kStep];
shared float ds_tile[kMaxRows * kStep];

void main() {
  const uint size = gl_WorkGroupSize.x;
  const uint rows = size / kThreadsPerRow;
  const uint lid = gl_LocalInvocationIndex;
  const uint T = p.T;
  const uint D = p.head_dim;
  const uint bh = gl_WorkGroupID.y;
  const uint base = bh * T * D;
  const uint o0 = gl_WorkGroupID.x * rows;
  const uint r = lid / kThreadsPerRow;
  const uint t = lid % kThreadsPerRow;
  const uint own_row = o0 + r;

  for (uint e = lid; e < rows * D; e += size) {
    const bool in_range = o0 + e / D < T;
    const uint at = base + o0 * D + e;
    if (kPass == 0) {
      own_x[e] = in_range ? k[at] : 0.0;
      own_y[e] = in_range ? v[at] : 0.0;
    } else {
      own_x[e] = in_range ? q[at] : 0.0;
      own_y[e] = in_range ? d_o[at] : 0.0;
    }
  }

  // acc_x: dk (pass 0) or dq (pass 1); acc_y: dv (pass 0).
  float acc_x[kColsPerThread];
  float acc_y[kColsPerThread];
  for (uint c = 0; c < kColsPerThread; ++c) {
    acc_x[c] = 0.0;
    acc_y[c] = 0.0;
  }

  // Pass 0: the queries that see any of the group's keys, [o0, T).
  // Pass 1: the keys any of the group's queries sees, [0, min(o0 + R, T)).
  // Uniform bounds, so the barriers are in uniform control flow.
  const uint first = (kPass == 0) ? o0 : 0;
  const uint end = (kPass == 0) ? T : min(o0 + rows, T);
  for (uint s0 = first; s0 < end; s0 += kStep) {
    // The previous step's readers of the step tiles are done.
    barrier();
    for (uint e = lid; e < kStep * D; e += size) {
      const bool in_range = s0 + e / D < T;
      const uint at = base + s0 * D + e;
      if (kPass == 0) {
        step_x[e] = in_range ? q[at] : 0.0;
        step_y[e] = in_range ? d_o[at] : 0.0;
      } else {
        step_x[e] = in_range ? k[at] : 0.0;
        step_y[e] = in_range ? v[at] : 0.0;
      }
    }
    barrier();
    for (uint ss = 0; ss < kStep / kThreadsPerRow; ++ss) {
      const uint s = t + ss * kThreadsPerRow;
      const uint query = (kPass == 0) ? s0 + s : own_row;
      const uint key = (kPass == 0) ? own_row : s0 + s;
      float prob = 0.0;
      float ds = 0.0;
      if (query < T && key <= query) {
        float score = 0.0;
        float dp = 0.0;
        for (uint d = 0; d < D; ++d) {
          score += own_x[r * D + d] * step_x[s * D + d];
          dp += own_y[r * D + d] * step_y[s * D + d];
        }
        const uint stat = bh * T + query;
        prob = exp(score * p.scale - lse[stat]);
        ds = prob * (dp - delta[stat]);
      }
      p_tile[r * kStep + s] = prob;
      ds_tile[r * kStep + s] = ds;
    }
    barrier();
    // Guards rather than a shorter loop keep the accumulators in registers.
    for (uint s = 0; s < kStep; ++s) {
      const float prob = p_tile[r * kStep + s];
      const float ds = ds_tile[r * kStep + s];
      for (uint c = 0; c < kColsPerThread; ++c) {
        const uint col = t + c * kThreadsPerRow;
        if (col < D) {
          acc_x[c] += ds * step_x[s * D + col];
          if (kPass == 0) {
            acc_y[c] += prob * step_y[s * D + col];
          }
        }
      }
    }
  }

  if (own_row < T) {
    for (uint c = 0; c < kColsPerThread; ++c) {
      const uint col = t + c * kThreadsPerRow;
      if (col < D) {
        const uint at = base + own_row * D + col;
        if (kPass == 0) {
          dk[at] = acc_x[c] * p.scale;
          dv[at] = acc_y[c];
        } else {
          dq[at] = acc_x[c] * p.scale;
        }
      }
    }
  }
}
