// softmax_causal_backward: the gradient of softmax_causal (f32, [rows, t] with
// rows = batch * heads * t), from its output y:
//   dx[r, j] = scale * y[r, j] * (dy[r, j] - sum_k dy[r, k] * y[r, k])
// (masked positions have y = 0, so their dx is 0; scale = 1 gives the plain
// softmax gradient y * (dy - sum(dy * y))). One workgroup per row; the sum is
// a fixed-shape tree: reproducible run to run.
//
// Bindings (set 0):  0: float y[]   (readonly)  rows * t (softmax_causal's output)
//                    1: float dy[]  (readonly)  rows * t
//                    2: float dx[]  (writeonly) rows * t; may alias dy
// Push constants:    uint rows; uint t; float scale;
// Specialization:    constant 0 = workgroup size x (default 64, at most 1024).
// Dispatch:          any number of workgroups >= 1 (workgroup g takes rows
//                    g, g + G, ...); the natural choice is min(rows, 65535) x 1 x 1.
#version 450

const uint kMaxWorkgroupSize = 1024;

layout(local_size_x = 64, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 2, std430) writeonly buffer DX { float dx[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint t;
  float scale;
} p;

shared float partial[kMaxWorkgroupSize];

float WorkgroupSum(float v) {
  const uint lid = gl_LocalInvocationIndex;
  barrier();
  partial[lid] = v;
  barrier();
  for (uint n = gl_WorkGroupSize.x; n > 1;) {
    const uint half_n = (n + 1) / 2;
    if (lid < n - half_n) partial[lid] += partial[lid + half_n];
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
    const uint last = row % p.t;
    float s = 0.0;
    for (uint j = lid; j <= last; j += wg) s += dy[base + j] * y[base + j];
    const float dot_dy_y = WorkgroupSum(s);
    for (uint j = lid; j < p.t; j += wg) {
      dx[base + j] = j <= last ? p.scale * y[base + j] * (dy[base + j] - dot_dy_y) : 0.0;
    }
  }
}
