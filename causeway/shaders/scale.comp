// scale: y[i] = alpha * x[i] for i < count (f32).
//
// Bindings (set 0):  0: float x[]  (readonly)
//                    1: float y[]  (writeonly)
// Push constants:    uint count; float alpha;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop); the
//                    natural choice is min(ceil(count / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Params {
  uint count;
  float alpha;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    y[i] = p.alpha * x[i];
  }
}
