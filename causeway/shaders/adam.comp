// adam: one Adam / AdamW step, in place (f32), for i < count, as PyTorch's AdamW
// (weight_decay = 0 gives plain Adam):
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   p = p - lr * weight_decay * p - lr * (m / bc1) / (sqrt(v / bc2) + eps)
// with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step, step counting from 1.
// m and v start at zero.
//
// Bindings (set 0):  0: float p[]  (read-write) count
//                    1: float g[]  (readonly)   count
//                    2: float m[]  (read-write) count
//                    3: float v[]  (read-write) count
// Push constants:    uint count; uint step; float lr; float beta1; float beta2;
//                    float eps; float weight_decay;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop); the
//                    natural choice is min(ceil(count / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) buffer P { float param[]; };
layout(set = 0, binding = 1, std430) readonly buffer G { float grad[]; };
layout(set = 0, binding = 2, std430) buffer M { float m1[]; };
layout(set = 0, binding = 3, std430) buffer V { float m2[]; };

layout(push_constant) uniform Params {
  uint count;
  uint step;
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
} p;

void main() {
  const float bc1 = 1.0 - pow(p.beta1, float(p.step));
  const float bc2 = 1.0 - pow(p.beta2, float(p.step));
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    const float g = grad[i];
    const float m = p.beta1 * m1[i] + (1.0 - p.beta1) * g;
    const float v = p.beta2 * m2[i] + (1.0 - p.beta2) * g * g;
    m1[i] = m;
    m2[i] = v;
    float w = param[i];
    w -= p.lr * p.weight_decay * w;
    w -= p.lr * (m / bc1) / (sqrt(v / bc2) + p.eps);
    param[i] = w;
  }
}
