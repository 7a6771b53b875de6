// combine: result[r + i] = op(a[x + i], b[y + i]) for i < count, where op is a
// sum or a max over f32 or i32 (the element bits are read as 32-bit words).
// Collectives use it to reduce chunks of whole buffers, hence the offsets.
//
// Bindings (set 0):  0: uint a[]       (readonly)
//                    1: uint b[]       (readonly)
//                    2: uint result[]  (writeonly; may alias neither a nor b)
// Push constants:    uint count; uint a_offset; uint b_offset; uint result_offset;  (elements)
// Specialization:    constant 0 = workgroup size x (default 256);
//                    constant 1 = op (0 sum, 1 max); constant 2 = type (0 f32, 1 i32).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const uint OP = 0;
layout(constant_id = 2) const uint TYPE = 0;

layout(set = 0, binding = 0, std430) readonly buffer A { uint a[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { uint b[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Result { uint result[]; };

layout(push_constant) uniform Params {
  uint count;
  uint a_offset;
  uint b_offset;
  uint result_offset;
} p;

uint Combine(uint x, uint y) {
  if (TYPE == 0) {
    float fx = uintBitsToFloat(x), fy = uintBitsToFloat(y);
    return floatBitsToUint(OP == 0 ? fx + fy : max(fx, fy));
  }
  int ix = int(x), iy = int(y);
  return uint(OP == 0 ? ix + iy : max(ix, iy));
}

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    result[p.result_offset + i] = Combine(a[p.a_offset + i], b[p.b_offset + i]);
  }
}
