// bias_gelu_backward: the gradients of bias_gelu (f32, row-major [rows, cols]):
//   dx[r, c] = dy[r, c] * gelu'(x[r, c] + bias[c])
//   dbias[c] = sum over r of dx[r, c]   (summed in row order: deterministic)
// gelu is GPT-2's tanh approximation (see bias_gelu.comp).
//
// One invocation per column walks the rows, so the column sum needs neither
// atomics nor a second pass. Neighbouring invocations touch neighbouring
// columns, so each row is read contiguously across a workgroup.
//
// Bindings (set 0):  0: float dy[]     (readonly)  rows * cols
//                    1: float x[]      (readonly)  rows * cols (bias_gelu's input)
//                    2: float bias[]   (readonly)  cols
//                    3: float dx[]     (writeonly) rows * cols; may alias dy
//                    4: float dbias[]  (writeonly) cols
// Push constants:    uint rows; uint cols;
// Specialization:    constant 0 = workgroup size x (default 64).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop over
//                    cols); the natural choice is min(ceil(cols / wg), 65535).
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 2, std430) readonly buffer Bias { float bias[]; };
layout(set = 0, binding = 3, std430) writeonly buffer DX { float dx[]; };
layout(set = 0, binding = 4, std430) writeonly buffer DBias { float dbias[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
} p;

const float kSqrt2OverPi = 0.7978845608028654;
const float kCubic = 0.044715;

float GeluGrad(float u) {
  const float t = tanh(clamp(kSqrt2OverPi * (u + kCubic * u * u * u), -10.0, 10.0));
  return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * u * u);
}

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint c = gl_GlobalInvocationID.x; c < p.cols; c += stride) {
    const float b = bias[c];
    float sum = 0.0;
    for (uint r = 0; r < p.rows; ++r) {
      const uint i = r * p.cols + c;
      const float g = dy[i] * GeluGrad(x[i] + b);
      dx[i] = g;
      sum += g;
    }
    dbias[c] = sum;
  }
}
