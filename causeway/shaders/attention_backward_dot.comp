// attention_backward_dot: the backward pre-pass of `attention`,
// delta[row] = sum_d d_o[row, d] * o[row, d] (f32), one value per query row.
//
// o and d_o are [rows, head_dim], row-major and densely packed, with
// rows = batch * heads * T (see attention.comp for the layout).
//
// Bindings (set 0):  0: float o[]      (readonly)   rows * head_dim floats
//                    1: float d_o[]    (readonly)   rows * head_dim floats
//                    2: float delta[]  (writeonly)  rows floats
// Push constants:    uint rows; uint head_dim;
// Specialization:    constant 0 = workgroup size x (default 256, at most 1024).
// Dispatch:          one invocation per row, grid-stride: any G >= 1 groups,
//                    G x 1 x 1; the natural choice is
//                    G = min(ceil(rows / wg), 65535).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer O { float o[]; };
layout(set = 0, binding = 1, std430) readonly buffer DO { float d_o[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Delta { float delta[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint head_dim;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint row = gl_GlobalInvocationID.x; row < p.rows; row += stride) {
    const uint base = row * p.head_dim;
    float sum = 0.0;
    for (uint d = 0; d < p.head_dim; ++d) {
      sum += d_o[base + d] * o[base + d];
    }
    delta[row] = sum;
  }
}
