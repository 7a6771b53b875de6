// adam_update: the Adam / AdamW step of adam.comp in functional form, for
// programs: a kernel's push constants are fixed when a program is built, so
// the step is data (binding 4), and the new values go to outputs. For
// i < count:
//   m' = beta1 m + (1 - beta1) g;   v' = beta2 v + (1 - beta2) g^2
//   p' = p - lr * weight_decay * p - lr * (m' / bc1) / (sqrt(v' / bc2) + eps)
// with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step, step = step[0] (counting
// from 1). Only the invocation that writes element i of the outputs reads
// element i of the inputs, and each value it writes depends on the value it
// read at the same place, so p_out, m_out and v_out may be bound to the
// buffers of p, m and v (an update in place, as adam.comp does).
//
// Bindings (set 0):  0: float p[]      (readonly)  count
//                    1: float g[]      (readonly)  count
//                    2: float m[]      (readonly)  count
//                    3: float v[]      (readonly)  count
//                    4: float step[]   (readonly)  1
//                    5: float p_out[]  (writeonly) count; may alias p
//                    6: float m_out[]  (writeonly) count; may alias m
//                    7: float v_out[]  (writeonly) count; may alias v
// Push constants:    uint count; float lr; float beta1; float beta2;
//                    float eps; float weight_decay;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop); the
//                    natural choice is min(ceil(count / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer P { float param[]; };
layout(set = 0, binding = 1, std430) readonly buffer G { float grad[]; };
layout(set = 0, binding = 2, std430) readonly buffer M { float m1[]; };
layout(set = 0, binding = 3, std430) readonly buffer V { float m2[]; };
layout(set = 0, binding = 4, std430) readonly buffer Step { float step[]; };
layout(set = 0, binding = 5, std430) writeonly buffer POut { float param_out[]; };
layout(set = 0, binding = 6, std430) writeonly buffer MOut { float m1_out[]; };
layout(set = 0, binding = 7, std430) writeonly buffer VOut { float m2_out[]; };

layout(push_constant) uniform Params {
  uint count;
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
} p;

void main() {
  const float t = step[0];
  const float bc1 = 1.0 - pow(p.beta1, t);
  const float bc2 = 1.0 - pow(p.beta2, t);
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    const float g = grad[i];
    const float m = p.beta1 * m1[i] + (1.0 - p.beta1) * g;
    const float v = p.beta2 * m2[i] + (1.0 - p.beta2) * g * g;
    float w = param[i];
    w -= p.lr * p.weight_decay * w;
    w -= p.lr * (m / bc1) / (sqrt(v / bc2) + p.eps);
    m1_out[i] = m;
    m2_out[i] = v;
    param_out[i] = w;
  }
}
