// attention: fused causal self-attention, forward (f32, flash-attention style).
//
// For every (batch, head) matrix, with S = scale * Q K^T masked causally
// (query i sees keys j <= i):
//   o[i]   = sum_j softmax_j(S[i, :]) v[j]
//   lse[i] = log(sum_{j <= i} exp(S[i, j]))      (natural log; for the backward)
// T x T scores are never stored: each invocation holds one query row and its
// output in registers, and its workgroup streams blocks of keys and values
// through shared memory past them with an online softmax (a running max and
// sum per row). Scores are summed over d in order, then scaled, as
// attention_backward recomputes them.
//
// Layout: q, k, v and o are [batch * heads, T, head_dim], row-major and densely
// packed (i.e. [batch, heads, T, head_dim]); a [batch, T, heads, head_dim]
// tensor must be transposed first. lse is [batch * heads, T].
//
// Bindings (set 0):  0: float q[]    (readonly)   BH * T * head_dim floats
//                    1: float k[]    (readonly)   BH * T * head_dim floats
//                    2: float v[]    (readonly)   BH * T * head_dim floats
//                    3: float o[]    (writeonly)  BH * T * head_dim floats
//                    4: float lse[]  (writeonly)  BH * T floats
//                    (BH = batch * heads)
// Push constants:    uint T; uint head_dim; float scale;
//                    T >= 1, 1 <= head_dim <= H; scale is usually
//                    1 / sqrt(head_dim).
// Specialization:    constant 0 = workgroup size R (default 16, at most 16):
//                    the group's query rows, one invocation each.
//                    constant 1 = H, the head_dim bound (default 128, at
//                    least head_dim, at most 128): the loops over head_dim
//                    run to H, so H = head_dim wastes none of them (at
//                    head_dim 16, the 128 of the default made the kernel do
//                    8 times the work), and the tiles hold H columns.
// Dispatch:          (ceil(T / R), BH, 1); (ceil(T / 16), BH, 1) by default.
// Shared memory:     (32 H + 256) * 4 bytes: 17 KiB at H = 128 (more than
//                    Vulkan's 16 KiB minimum; lavapipe has 32 KiB), 3 KiB at
//                    H = 16.
#version 450
#extension GL_EXT_control_flow_attributes : require

// Query rows per workgroup at most.
const uint kMaxRows = 16;
// Keys per streamed block.
const uint kKeys = 16;
layout(constant_id = 1) const uint kMaxHeadDim = 128;
// Score of a masked (future or padding) key: finite, so that no inf - inf
// can make a NaN, and exp(kMasked - m) is 0 for any real running max m.
const float kMasked = -3.0e38;

layout(local_size_x = 16, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1, std430) readonly buffer K { float k[]; };
layout(set = 0, binding = 2, std430) readonly buffer V { float v[]; };
layout(set = 0, binding = 3, std430) writeonly buffer O { float o[]; };
layout(set = 0, binding = 4, std430) writeonly buffer Lse { float lse[]; };

layout(push_constant) uniform Params {
  uint T;
  uint head_dim;
  float scale;
} p;

// The current block of keys and of values: kKeys rows of head_dim (rows past
// T are 0). Sized by the specialization constant alone, which reflection
// resolves (an expression of it, it cannot).
shared float k_tile[kKeys][kMaxHeadDim];
shared float v_tile[kKeys][kMaxHeadDim];
// Scaled, masked scores of the current block: R x kKeys.
shared float s_tile[kMaxRows * kKeys];

void main() {
  const uint size = gl_WorkGroupSize.x;
  const uint lid = gl_LocalInvocationIndex;
  const uint T = p.T;
  const uint D = p.head_dim;
  const uint base = gl_WorkGroupID.y * T * D;
  const uint q0 = gl_WorkGroupID.x * size;
  const uint row = q0 + lid;
  // Rows past T are masked as row T - 1, so every row sees key 0 and keeps
  // finite statistics; they are not written.
  const uint mask_row = min(row, T - 1);

  // The row's query and output live in registers: the loops
  // over head_dim are unrolled with guards, so the arrays are indexed by
  // constants, and every tile read below has the same address in all
  // invocations (a broadcast on a GPU; lavapipe still reads it once per
  // lane, which is why CPU devices run attention_lanes.comp instead).
  float qr[kMaxHeadDim];
  float acc[kMaxHeadDim];
  [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
    qr[d] = (d < D && row < T) ? q[base + row * D + d] : 0.0;
    acc[d] = 0.0;
  }
  float m = kMasked;  // running max of the row's scores
  float l = 0.0;      // running sum of exp(score - m)

  // Keys past the group's last row are masked for all its rows. The trip
  // count is uniform, so the barriers are in uniform control flow.
  const uint last_key = min(q0 + size, T) - 1;
  for (uint k0 = 0; k0 <= last_key; k0 += kKeys) {
    // The previous block's readers of the tiles are done.
    barrier();
    for (uint e = lid; e < kKeys * D; e += size) {
      const bool in_range = k0 + e / D < T;
      k_tile[e / D][e % D] = in_range ? k[base + k0 * D + e] : 0.0;
      v_tile[e / D][e % D] = in_range ? v[base + k0 * D + e] : 0.0;
    }
    barrier();
    float block_max = kMasked;
    for (uint j = 0; j < kKeys; ++j) {
      float s = 0.0;
      [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
        if (d < D) {
          s += qr[d] * k_tile[j][d];
        }
      }
      s = (k0 + j <= mask_row) ? s * p.scale : kMasked;
      s_tile[lid * kKeys + j] = s;
      block_max = max(block_max, s);
    }

    // Online softmax: rescale what is summed so far to the new max.
    const float m_new = max(m, block_max);
    const float correction = exp(m - m_new);
    l *= correction;
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      acc[d] *= correction;
    }
    for (uint j = 0; j < kKeys; ++j) {
      const float s = s_tile[lid * kKeys + j];
      const float pj = (s > kMasked) ? exp(s - m_new) : 0.0;
      l += pj;
      [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
        if (d < D) {
          acc[d] += pj * v_tile[j][d];
        }
      }
    }
    m = m_new;
  }

  if (row < T) {
    const float inv_l = 1.0 / l;
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      if (d < D) {
        o[base + row * D + d] = acc[d] * inv_l;
      }
    }
    lse[gl_WorkGroupID.y * T + row] = m + log(l);
  }
}
