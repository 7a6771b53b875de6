// fill: data[i] = value for i < count.
//
// Works on 32-bit words, so it fills f32, i32 and u32 buffers alike (pass the
// bit pattern of the value).
//
// Bindings (set 0):  0: uint data[]  (writeonly)
// Push constants:    uint count; uint value;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop); the
//                    natural choice is min(ceil(count / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) writeonly buffer Data { uint data[]; };

layout(push_constant) uniform Params {
  uint count;
  uint value;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    data[i] = p.value;
  }
}
