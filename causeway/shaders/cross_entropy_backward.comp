// cross_entropy_backward: the gradient of the mean (or otherwise scaled) loss
// of cross_entropy with respect to the logits (f32, row-major [rows, vocab]):
//   dlogits[r, v] = scale * (softmax(logits[r])[v] - (v == targets[r] ? 1 : 0))
// scale = 1 / rows for the mean loss (times the upstream gradient, if any).
// A target outside [0, vocab) has no one-hot term. Two forms, chosen by
// specialization constant 1, as cross_entropy's: 0 one workgroup per row
// (max and sum are fixed-shape trees), 1 one invocation per row (in
// vocabulary order, no barrier). Either way reproducible run to run.
//
// Bindings (set 0):  0: float logits[]   (readonly)  rows * vocab
//                    1: int targets[]    (readonly)  rows
//                    2: float dlogits[]  (writeonly) rows * vocab; may alias logits
// Push constants:    uint rows; uint vocab; float scale;
// Specialization:    constant 0 = workgroup size x (default 64, at most 1024);
//                    constant 1 = form (0 a workgroup per row, 1 an
//                    invocation per row).
// Dispatch:          as cross_entropy's, by form.
#version 450

const uint kMaxWorkgroupSize = 1024;

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROW_PER_INVOCATION = 0;

layout(set = 0, binding = 0, std430) readonly buffer Logits { float logits[]; };
layout(set = 0, binding = 1, std430) readonly buffer Targets { int targets[]; };
layout(set = 0, binding = 2, std430) writeonly buffer DLogits { float dlogits[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint vocab;
  float scale;
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

void RowPerInvocation() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint row = gl_GlobalInvocationID.x; row < p.rows; row += stride) {
    const uint base = row * p.vocab;
    float m = -3.402823466e38;
    for (uint v = 0; v < p.vocab; ++v) m = max(m, logits[base + v]);
    float s = 0.0;
    for (uint v = 0; v < p.vocab; ++v) s += exp(logits[base + v] - m);
    const float inv = 1.0 / s;
    const int target = targets[row];
    // Each element is read before it is written: dlogits may alias logits.
    for (uint v = 0; v < p.vocab; ++v) {
      const float onehot = int(v) == target ? 1.0 : 0.0;
      dlogits[base + v] = p.scale * (exp(logits[base + v] - m) * inv - onehot);
    }
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
    const float inv = 1.0 / WorkgroupReduce(s, false);
    const int target = targets[row];
    for (uint v = lid; v < p.vocab; v += wg) {
      const float onehot = int(v) == target ? 1.0 : 0.0;
      dlogits[base + v] = p.scale * (exp(logits[base + v] - m) * inv - onehot);
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
