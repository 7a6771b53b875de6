// cross_entropy: softmax cross-entropy of each row of row-major [rows, vocab]
// logits (f32) against i32 targets:
//   loss[r] = log(sum_v exp(logits[r, v] - m)) + m - logits[r, targets[r]],
// m = max_v logits[r, v]. A target outside [0, vocab) gives a NaN loss. The
// mean loss is sum(loss) / rows: reduce_sum over `loss` (or the host).
// Two forms, chosen by specialization constant 1 (as layer_norm's):
//   0: one workgroup per row; max and sum are trees in shared memory of a
//      fixed shape (for wide rows);
//   1: one invocation per row, in vocabulary order, with no barrier (for
//      narrow rows, where the trees cost more barriers per row than the row
//      has elements).
// Either way every sum has a fixed order: reproducible run to run.
//
// Bindings (set 0):  0: float logits[]  (readonly)  rows * vocab
//                    1: int targets[]   (readonly)  rows
//                    2: float loss[]    (writeonly) rows
// Push constants:    uint rows; uint vocab;
// Specialization:    constant 0 = workgroup size x (default 64, at most 1024);
//                    constant 1 = form (0 a workgroup per row, 1 an
//                    invocation per row).
// Dispatch:          any number of workgroups >= 1 (form 0: workgroup g takes
//                    rows g, g + G, ...; the natural choice is
//                    min(rows, 65535) x 1 x 1. Form 1: invocation i takes rows
//                    i, i + G * wg, ...; natural min(ceil(rows / wg), 65535)).
#version 450

const uint kMaxWorkgroupSize = 1024;

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROW_PER_INVOCATION = 0;

layout(set = 0, binding = 0, std430) readonly buffer Logits { float logits[]; };
layout(set = 0, binding = 1, std430) readonly buffer Targets { int targets[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Loss { float loss[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint vocab;
} p;

shared float partial[kMaxWorkgroupSize];

float WorkgroupReduce(float v, bool take_max) {
  const uint lid = gl_LocalInvocationIndex;
  barrier();
  partial[lid] = v;
  barrier();
  for (uint n = gl_WorkGroupSize.x; n > 1;) {
    const uint half_n = (n + 1) / 2;
    if (lid < n - half_n) {
      const float other = partial[lid + half_n];
      partial[lid] = take_max ? max(partial[lid], other) : partial[lid] + other;
    }
    barrier();
    n = half_n;
  }
  return partial[0];
}

// The loss of a row from its max m and sum s of exp(logit - m).
float RowLoss(uint row, uint base, float m, float s) {
  const int target = targets[row];
  return target >= 0 && uint(target) < p.vocab ? log(s) + m - logits[base + uint(target)]
                                                : uintBitsToFloat(0x7fc00000u);
}

void RowPerInvocation() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint row = gl_GlobalInvocationID.x; row < p.rows; row += stride) {
    const uint base = row * p.vocab;
    float m = -3.402823466e38;
    for (uint v = 0; v < p.vocab; ++v) m = max(m, logits[base + v]);
    float s = 0.0;
    for (uint v = 0; v < p.vocab; ++v) s += exp(logits[base + v] - m);
    loss[row] = RowLoss(row, base, m, s);
  }
}

void WorkgroupPerRow() {
  const uint lid = gl_LocalInvocationIndex;
  const uint wg = gl_WorkGroupSize.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * p.vocab;
    float m = -3.402823466e38;
    for (uint v = lid; v < p.vocab; v += wg) m = max(m, logits[base + v]);
    m = WorkgroupReduce(m, true);
    float s = 0.0;
    for (uint v = lid; v < p.vocab; v += wg) s += exp(logits[base + v] - m);
    s = WorkgroupReduce(s, false);
    if (lid == 0) {
      loss[row] = RowLoss(row, base, m, s);
    }
  }
}

void main() {
  if (ROW_PER_INVOCATION != 0) {
    RowPerInvocation();
  } else {
    WorkgroupPerRow();
  }
}
