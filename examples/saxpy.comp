// saxpy: result[i] = a * x[i] + y[i] for i < count (f32), a custom kernel for
// examples/custom_kernel.textproto (compiled when the file is read).
//
// Bindings (set 0):  0: float x[]       (readonly)
//                    1: float y[]       (readonly)
//                    2: float result[]  (writeonly)
// Push constants:    uint count; float a;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) readonly buffer Y { float y[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Result { float result[]; };

layout(push_constant) uniform Params {
  uint count;
  float a;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    result[i] = p.a * x[i] + y[i];
  }
}
