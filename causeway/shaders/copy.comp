// copy: dst[i] = src[i] for i < count (32-bit words).
//
// Bindings (set 0):  0: uint src[]  (readonly)
//                    1: uint dst[]  (writeonly)
// Push constants:    uint count;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop); the
//                    natural choice is min(ceil(count / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Params {
  uint count;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    dst[i] = src[i];
  }
}
