// attention_lanes: `attention`'s forward (same bindings, push constants,
// results and causal mask) for CPU drivers, where each invocation is a lane
// of a SIMD vector and every component of every buffer or shared-memory read
// is a loop over the lanes, whatever the addresses: the kernel reads as few
// components per FMA as it can and shares nothing between lanes.
//
// Each invocation owns R query rows (specialization constant 2), rows
// q0 + r * W + lane for r < R (W the workgroup size, q0 = group.x * W * R),
// and holds their queries, outputs and online-softmax statistics in
// registers. It walks the keys one at a time, reading each key and value
// element once straight from the buffers, with the same address in every
// lane, and uses it for all R rows: R FMAs per component read, where
// `attention` does one. No shared memory and no barriers. Row block r skips
// the keys past every one of its rows (a condition the same in all lanes).
// Scores are summed over d in order, then scaled, as in `attention` and
// attention_backward; the online softmax rescales per key, not per block of
// 16, so results differ from `attention`'s by rounding.
//
// Layout, bindings and push constants: as attention.comp (q, k, v, o
// [BH, T, head_dim], lse [BH, T]).
// Specialization:    constant 0 = workgroup size W (default 8: one SIMD
//                    vector of lavapipe).
//                    constant 1 = H, the head_dim bound (default 16, at
//                    least head_dim): the loops over head_dim run to H.
//                    constant 2 = R, query rows per invocation (default 4).
//                    H * R is what the registers hold per array; the plan
//                    keeps it at most 128 (the driver's compile time grows
//                    faster than the unrolled code).
// Dispatch:          (ceil(T / (W * R)), BH, 1).
#version 450
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 1) const uint kMaxHeadDim = 16;
layout(constant_id = 2) const uint kRows = 4;
// The running max before any key: below every real score.
const float kMasked = -3.0e38;

layout(local_size_x = 8, local_size_x_id = 0) in;

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

void main() {
  const uint W = gl_WorkGroupSize.x;
  const uint lane = gl_LocalInvocationIndex;
  const uint T = p.T;
  const uint D = p.head_dim;
  const uint base = gl_WorkGroupID.y * T * D;
  const uint q0 = gl_WorkGroupID.x * W * kRows;

  float qr[kRows][kMaxHeadDim];
  float acc[kRows][kMaxHeadDim];
  float m[kRows];  // running max of each row's scores
  float l[kRows];  // running sum of exp(score - m)
  // Rows past T are masked as row T - 1, so that every row sees key 0 and
  // keeps finite statistics; they are not written.
  uint mask_row[kRows];
  [[unroll]] for (uint r = 0; r < kRows; ++r) {
    const uint row = q0 + r * W + lane;
    mask_row[r] = min(row, T - 1);
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      qr[r][d] = (d < D && row < T) ? q[base + row * D + d] : 0.0;
      acc[r][d] = 0.0;
    }
    m[r] = kMasked;
    l[r] = 0.0;
  }

  // The group's last row that exists: no key past it is seen. Keys one at a
  // time, with the online softmax per key: a block of keys would need its
  // scores in an array indexed by the key, i.e. the key loop unrolled, and
  // the driver then takes tens of seconds to compile the kernel at head_dim
  // 64 and more. Per key and row one exp: whichever of the running max and
  // the new score is smaller is rescaled to the larger.
  const uint last_key = min(q0 + W * kRows, T) - 1;
  for (uint key = 0; key <= last_key; ++key) {
    const uint at = base + key * D;
    float kr[kMaxHeadDim];
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      kr[d] = d < D ? k[at + d] : 0.0;
    }
    float s[kRows];
    [[unroll]] for (uint r = 0; r < kRows; ++r) {
      s[r] = 0.0;
      [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
        if (d < D) {
          s[r] += qr[r][d] * kr[d];
        }
      }
    }
    float vr[kMaxHeadDim];
    [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
      vr[d] = d < D ? v[at + d] : 0.0;
    }
    [[unroll]] for (uint r = 0; r < kRows; ++r) {
      // Row block r (rows q0 + r W .. + W - 1) sees this key: the same in
      // every lane.
      if (key <= q0 + r * W + W - 1) {
        // A masked key changes nothing: scale 1, weight 0.
        float scale_acc = 1.0;
        float weight = 0.0;
        if (key <= mask_row[r]) {
          const float score = s[r] * p.scale;
          if (score > m[r]) {
            scale_acc = exp(m[r] - score);
            weight = 1.0;
            m[r] = score;
          } else {
            weight = exp(score - m[r]);
          }
        }
        l[r] = l[r] * scale_acc + weight;
        [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
          acc[r][d] = acc[r][d] * scale_acc + weight * vr[d];
        }
      }
    }
  }

  [[unroll]] for (uint r = 0; r < kRows; ++r) {
    const uint row = q0 + r * W + lane;
    if (row < T) {
      const float inv_l = 1.0 / l[r];
      [[unroll]] for (uint d = 0; d < kMaxHeadDim; ++d) {
        if (d < D) {
          o[base + row * D + d] = acc[r][d] * inv_l;
        }
      }
      lse[gl_WorkGroupID.y * T + row] = m[r] + log(l[r]);
    }
  }
}
