// combine_n: result[r + i] = op(x_0[o_0 + i], x_1[o_1 + i], ..., x_{N-1}[o_{N-1} + i])
// for i < count, folded left in operand order (so every caller that passes
// the same operands in the same order gets the same bits), where op is a sum
// or a max over f32 or i32 (see combine.comp). With constant 5 set, the
// result is the first operand: result[r + i] = op(result[r + i], x_0[...], ...),
// which chains more than eight operands over several dispatches. A
// reduce-scatter reads its operands straight from every peer's memory.
//
// Bindings (set 0):  0..7: uint x_k[]    (readonly; operands past N are not
//                                         read: bind any buffer there)
//                    8:    uint result[] (read only with constant 5; may
//                                         alias no operand)
//                    Each also as uvec4, for constant 4.
// Push constants:    uint count; uint offset[8]; uint result_offset;
//                    (elements, or 4-element units with constant 4; the
//                    offsets are not read with constant 6)
// Specialization:    constant 0 = workgroup size x (default 256);
//                    constant 1 = op (0 sum, 1 max); constant 2 = type (0 f32, 1 i32);
//                    constant 3 = N, operands read (1..8);
//                    constant 4 = 1: four elements (one uvec4) per index, for
//                    offsets that are multiples of 4 elements (on a CPU
//                    driver one 16-byte load runs about twice as fast as four);
//                    constant 5 = 1: accumulate into result;
//                    constant 6 = 1: every offset is 0 (the push constants'
//                    are not read). On lavapipe an index the compiler sees
//                    as the invocation's own runs about a quarter faster than
//                    one shifted by a push constant.
// Dispatch:          any number of workgroups >= 1 (grid-stride loop).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const uint OP = 0;
layout(constant_id = 2) const uint TYPE = 0;
layout(constant_id = 3) const uint N = 2;
layout(constant_id = 4) const uint VEC4 = 0;
layout(constant_id = 5) const uint ACCUMULATE = 0;
layout(constant_id = 6) const uint AT_ZERO = 0;

layout(set = 0, binding = 0, std430) readonly buffer X0 { uint x0[]; };
layout(set = 0, binding = 1, std430) readonly buffer X1 { uint x1[]; };
layout(set = 0, binding = 2, std430) readonly buffer X2 { uint x2[]; };
layout(set = 0, binding = 3, std430) readonly buffer X3 { uint x3[]; };
layout(set = 0, binding = 4, std430) readonly buffer X4 { uint x4[]; };
layout(set = 0, binding = 5, std430) readonly buffer X5 { uint x5[]; };
layout(set = 0, binding = 6, std430) readonly buffer X6 { uint x6[]; };
layout(set = 0, binding = 7, std430) readonly buffer X7 { uint x7[]; };
layout(set = 0, binding = 8, std430) buffer Result { uint result[]; };
// The same buffers as uvec4s, for constant 4.
layout(set = 0, binding = 0, std430) readonly buffer V0 { uvec4 v0[]; };
layout(set = 0, binding = 1, std430) readonly buffer V1 { uvec4 v1[]; };
layout(set = 0, binding = 2, std430) readonly buffer V2 { uvec4 v2[]; };
layout(set = 0, binding = 3, std430) readonly buffer V3 { uvec4 v3[]; };
layout(set = 0, binding = 4, std430) readonly buffer V4 { uvec4 v4[]; };
layout(set = 0, binding = 5, std430) readonly buffer V5 { uvec4 v5[]; };
layout(set = 0, binding = 6, std430) readonly buffer V6 { uvec4 v6[]; };
layout(set = 0, binding = 7, std430) readonly buffer V7 { uvec4 v7[]; };
layout(set = 0, binding = 8, std430) buffer Result4 { uvec4 result4[]; };

layout(push_constant) uniform Params {
  uint count;
  uint offset[8];
  uint result_offset;
} p;

// Operand k's offset (8: the result's).
uint Offset(uint k) { return AT_ZERO != 0 ? 0 : k < 8 ? p.offset[k] : p.result_offset; }

uint Combine(uint x, uint y) {
  if (TYPE == 0) {
    float fx = uintBitsToFloat(x), fy = uintBitsToFloat(y);
    return floatBitsToUint(OP == 0 ? fx + fy : max(fx, fy));
  }
  int ix = int(x), iy = int(y);
  return uint(OP == 0 ? ix + iy : max(ix, iy));
}

uvec4 Combine(uvec4 x, uvec4 y) {
  if (TYPE == 0) {
    vec4 fx = uintBitsToFloat(x), fy = uintBitsToFloat(y);
    return floatBitsToUint(OP == 0 ? fx + fy : max(fx, fy));
  }
  ivec4 ix = ivec4(x), iy = ivec4(y);
  return uvec4(OP == 0 ? ix + iy : max(ix, iy));
}

uint Fold(uint i) {
  uint acc = x0[Offset(0) + i];
  if (ACCUMULATE != 0) acc = Combine(result[Offset(8) + i], acc);
  if (N > 1) acc = Combine(acc, x1[Offset(1) + i]);
  if (N > 2) acc = Combine(acc, x2[Offset(2) + i]);
  if (N > 3) acc = Combine(acc, x3[Offset(3) + i]);
  if (N > 4) acc = Combine(acc, x4[Offset(4) + i]);
  if (N > 5) acc = Combine(acc, x5[Offset(5) + i]);
  if (N > 6) acc = Combine(acc, x6[Offset(6) + i]);
  if (N > 7) acc = Combine(acc, x7[Offset(7) + i]);
  return acc;
}

uvec4 Fold4(uint i) {
  uvec4 acc = v0[Offset(0) + i];
  if (ACCUMULATE != 0) acc = Combine(result4[Offset(8) + i], acc);
  if (N > 1) acc = Combine(acc, v1[Offset(1) + i]);
  if (N > 2) acc = Combine(acc, v2[Offset(2) + i]);
  if (N > 3) acc = Combine(acc, v3[Offset(3) + i]);
  if (N > 4) acc = Combine(acc, v4[Offset(4) + i]);
  if (N > 5) acc = Combine(acc, v5[Offset(5) + i]);
  if (N > 6) acc = Combine(acc, v6[Offset(6) + i]);
  if (N > 7) acc = Combine(acc, v7[Offset(7) + i]);
  return acc;
}

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    if (VEC4 != 0) {
      result4[Offset(8) + i] = Fold4(i);
    } else {
      result[Offset(8) + i] = Fold(i);
    }
  }
}
