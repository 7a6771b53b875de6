// adam_update_multi: adam_update over up to four tensors in one dispatch (a
// fused multi-tensor update: a model's many small parameter tensors cost one
// dispatch per four, not one each). Each element gets exactly adam_update's
// arithmetic, in its order, so the results are bit for bit adam_update's;
// outputs may alias their inputs as there.
//
// The workgroups are split among the tensors: tensor t takes groups
// [first_group[t], first_group[t] + groups[t]) and strides over its count
// elements with them. An unused slot has count 0 and groups 0, and its first
// group is the dispatch's end (so no group selects it); its bindings are
// bound to any buffers (a used tensor's), which it never touches.
//
// Bindings (set 0):  4t + 0: float p_t[]     (readonly)  count[t]
//                    4t + 1: float g_t[]     (readonly)  count[t]
//                    4t + 2: float m_t[]     (readonly)  count[t]
//                    4t + 3: float v_t[]     (readonly)  count[t]
//                    16:     float step[]    (readonly)  1
//                    17 + 3t: float p_out_t[] (writeonly) count[t]; may alias p_t
//                    18 + 3t: float m_out_t[] (writeonly) count[t]; may alias m_t
//                    19 + 3t: float v_out_t[] (writeonly) count[t]; may alias v_t
//                    for t = 0..3: 29 storage buffers (Vulkan's minimum per
//                    stage is 4; lavapipe allows 32, desktop GPUs far more).
// Push constants:    uint count[4]; uint first_group[4]; uint groups[4];
//                    float lr; float beta1; float beta2; float eps;
//                    float weight_decay;
//                    first_group[0] = 0, each next one its predecessor's
//                    first plus groups; used slots first.
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          (sum of groups, 1, 1).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer P0 { float p0[]; };
layout(set = 0, binding = 1, std430) readonly buffer G0 { float g0[]; };
layout(set = 0, binding = 2, std430) readonly buffer M0 { float m0[]; };
layout(set = 0, binding = 3, std430) readonly buffer V0 { float v0[]; };
layout(set = 0, binding = 4, std430) readonly buffer P1 { float p1[]; };
layout(set = 0, binding = 5, std430) readonly buffer G1 { float g1[]; };
layout(set = 0, binding = 6, std430) readonly buffer M1 { float m1[]; };
layout(set = 0, binding = 7, std430) readonly buffer V1 { float v1[]; };
layout(set = 0, binding = 8, std430) readonly buffer P2 { float p2[]; };
layout(set = 0, binding = 9, std430) readonly buffer G2 { float g2[]; };
layout(set = 0, binding = 10, std430) readonly buffer M2 { float m2[]; };
layout(set = 0, binding = 11, std430) readonly buffer V2 { float v2[]; };
layout(set = 0, binding = 12, std430) readonly buffer P3 { float p3[]; };
layout(set = 0, binding = 13, std430) readonly buffer G3 { float g3[]; };
layout(set = 0, binding = 14, std430) readonly buffer M3 { float m3[]; };
layout(set = 0, binding = 15, std430) readonly buffer V3 { float v3[]; };
layout(set = 0, binding = 16, std430) readonly buffer Step { float step[]; };
layout(set = 0, binding = 17, std430) writeonly buffer POut0 { float p_out0[]; };
layout(set = 0, binding = 18, std430) writeonly buffer MOut0 { float m_out0[]; };
layout(set = 0, binding = 19, std430) writeonly buffer VOut0 { float v_out0[]; };
layout(set = 0, binding = 20, std430) writeonly buffer POut1 { float p_out1[]; };
layout(set = 0, binding = 21, std430) writeonly buffer MOut1 { float m_out1[]; };
layout(set = 0, binding = 22, std430) writeonly buffer VOut1 { float v_out1[]; };
layout(set = 0, binding = 23, std430) writeonly buffer POut2 { float p_out2[]; };
layout(set = 0, binding = 24, std430) writeonly buffer MOut2 { float m_out2[]; };
layout(set = 0, binding = 25, std430) writeonly buffer VOut2 { float v_out2[]; };
layout(set = 0, binding = 26, std430) writeonly buffer POut3 { float p_out3[]; };
layout(set = 0, binding = 27, std430) writeonly buffer MOut3 { float m_out3[]; };
layout(set = 0, binding = 28, std430) writeonly buffer VOut3 { float v_out3[]; };

layout(push_constant) uniform Params {
  uint count[4];
  uint first_group[4];
  uint groups[4];
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
} p;

// adam_update's loop over one tensor's elements (GLSL passes no buffers to
// functions, so the four copies come from one macro).
#define ADAM_UPDATE(P, G, M, V, P_OUT, M_OUT, V_OUT)                      \
  for (uint i = first; i < count; i += stride) {                          \
    const float g = G[i];                                                 \
    const float m = p.beta1 * M[i] + (1.0 - p.beta1) * g;                 \
    const float v = p.beta2 * V[i] + (1.0 - p.beta2) * g * g;             \
    float w = P[i];                                                       \
    w -= p.lr * p.weight_decay * w;                                       \
    w -= p.lr * (m / bc1) / (sqrt(v / bc2) + p.eps);                      \
    M_OUT[i] = m;                                                         \
    V_OUT[i] = v;                                                         \
    P_OUT[i] = w;                                                         \
  }

void main() {
  const float t = step[0];
  const float bc1 = 1.0 - pow(p.beta1, t);
  const float bc2 = 1.0 - pow(p.beta2, t);
  const uint group = gl_WorkGroupID.x;
  const uint tensor = group >= p.first_group[3]   ? 3
                      : group >= p.first_group[2] ? 2
                      : group >= p.first_group[1] ? 1
                                                  : 0;
  const uint count = p.count[tensor];
  const uint stride = p.groups[tensor] * gl_WorkGroupSize.x;
  const uint first = (group - p.first_group[tensor]) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
  // The tensor is uniform in the workgroup: one branch, then one loop.
  switch (tensor) {
    case 0:
      ADAM_UPDATE(p0, g0, m0, v0, p_out0, m_out0, v_out0)
      break;
    case 1:
      ADAM_UPDATE(p1, g1, m1, v1, p_out1, m_out1, v_out1)
      break;
    case 2:
      ADAM_UPDATE(p2, g2, m2, v2, p_out2, m_out2, v_out2)
      break;
    default:
      ADAM_UPDATE(p3, g3, m3, v3, p_out3, m_out3, v_out3)
      break;
  }
}
