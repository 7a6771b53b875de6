// bias_gelu: y[r, c] = gelu(x[r, c] + bias[c]) over a row-major [rows, cols]
// matrix (f32), with GPT-2's tanh approximation
//   gelu(u) = 0.5 u (1 + tanh(sqrt(2 / pi) (u + 0.044715 u^3))).
//
// Bindings (set 0):  0: float x[]     (readonly)  rows * cols
//                    1: float bias[]  (readonly)  cols
//                    2: float y[]     (writeonly) rows * cols; may alias x
// Push constants:    uint rows; uint cols;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop over
//                    rows * cols); the natural choice is
//                    min(ceil(rows * cols / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) readonly buffer Bias { float bias[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
} p;

const float kSqrt2OverPi = 0.7978845608028654;

float Gelu(float u) {
  // tanh saturates to +-1 in f32 well before |arg| = 10; clamping keeps a
  // driver's exp-based tanh from computing inf / inf.
  const float t = tanh(clamp(kSqrt2OverPi * (u + 0.044715 * u * u * u), -10.0, 10.0));
  return 0.5 * u * (1.0 + t);
}

void main() {
  const uint count = p.rows * p.cols;
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < count; i += stride) {
    y[i] = Gelu(x[i] + bias[i % p.cols]);
  }
}
