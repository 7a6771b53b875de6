// combine4: combine (see combine.comp) four elements at a time, for operands
// whose offsets are multiples of four elements: result[r + i] = op(a[x + i],
// b[y + i]) for i < 4 * count. On a CPU driver one 16-byte load per operand
// and invocation runs about twice as fast as four 4-byte ones.
//
// Bindings (set 0):  0: uvec4 a[]       (readonly)
//                    1: uvec4 b[]       (readonly)
//                    2: uvec4 result[]  (writeonly; may alias neither a nor b)
// Push constants:    uint count; uint a_offset; uint b_offset; uint result_offset;  (4-element units)
// Specialization:    constant 0 = workgroup size x (default 256);
//                    constant 1 = op (0 sum, 1 max); constant 2 = type (0 f32, 1 i32).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const uint OP = 0;
layout(constant_id = 2) const uint TYPE = 0;

layout(set = 0, binding = 0, std430) readonly buffer A { uvec4 a[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { uvec4 b[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Result { uvec4 result[]; };

layout(push_constant) uniform Params {
  uint count;
  uint a_offset;
  uint b_offset;
  uint result_offset;
} p;

uvec4 Combine(uvec4 x, uvec4 y) {
  if (TYPE == 0) {
    vec4 fx = uintBitsToFloat(x), fy = uintBitsToFloat(y);
    return floatBitsToUint(OP == 0 ? fx + fy : max(fx, fy));
  }
  ivec4 ix = ivec4(x), iy = ivec4(y);
  return uvec4(OP == 0 ? ix + iy : max(ix, iy));
}

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    result[p.result_offset + i] = Combine(a[p.a_offset + i], b[p.b_offset + i]);
  }
}
