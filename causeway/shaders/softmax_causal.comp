// softmax_causal: causal softmax of attention scores (f32). x and y are
// [rows, t] with rows = batch * heads * t, i.e. [batch * heads, t, t]; row r
// is query position i = r % t, and
//   y[r, j] = exp(scale * x[r, j] - m) / sum_{k <= i} exp(scale * x[r, k] - m)  for j <= i
//   y[r, j] = 0                                                                for j > i
// with m = max_{k <= i} scale * x[r, k]. Masked scores are never read, so
// they may hold anything (even inf or NaN). One workgroup per row; the max
// and the sum are fixed-shape trees: reproducible run to run.
//
// Bindings (set 0):  0: float x[]  (readonly)  rows * t
//                    1: float y[]  (writeonly) rows * t; may not alias x
// Push constants:    uint rows; uint t; float scale;
// Specialization:    constant 0 = workgroup size x (default 64, at most 1024).
// Dispatch:          any number of workgroups >= 1 (workgroup g takes rows
//                    g, g + G, ...); the natural choice is min(rows, 65535) x 1 x 1.
#version 450

const uint kMaxWorkgroupSize = 1024;

layout(local_size_x = 64, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint t;
  float scale;
} p;

shared float partial[kMaxWorkgroupSize];

// The sum (or, if `take_max`, the max) of every invocation's `v`, returned to
// all of them. Call in uniform control flow.
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

void main() {
  const uint lid = gl_LocalInvocationIndex;
  const uint wg = gl_WorkGroupSize.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * p.t;
    const uint last = row % p.t;  // the last unmasked column
    float m = -3.402823466e38;
    for (uint j = lid; j <= last; j += wg) m = max(m, p.scale * x[base + j]);
    m = WorkgroupReduce(m, true);
    float s = 0.0;
    for (uint j = lid; j <= last; j += wg) s += exp(p.scale * x[base + j] - m);
    const float inv = 1.0 / WorkgroupReduce(s, false);
    for (uint j = lid; j < p.t; j += wg) {
      y[base + j] = j <= last ? exp(p.scale * x[base + j] - m) * inv : 0.0;
    }
  }
}
