// add: result[i] = a[i] + b[i] for i < count (f32).
//
// Bindings (set 0):  0: float a[]       (readonly)
//                    1: float b[]       (readonly)
//                    2: float result[]  (writeonly; "out" is a GLSL keyword)
// Push constants:    uint count;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop); the
//                    natural choice is min(ceil(count / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer A { float a[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { float b[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Result { float result[]; };

layout(push_constant) uniform Params {
  uint count;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    result[i] = a[i] + b[i];
  }
}
