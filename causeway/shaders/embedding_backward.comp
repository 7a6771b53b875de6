// embedding_backward: the gradient of an embedding gather, a scatter-add done
// without atomics (f32, i32 ids):
//   dtable[r, c] = sum over tokens t with row(t) == r of dout[t, c], in token order,
// row(t) = ids[t] (token table), or t % rows when positional != 0 (position
// table of `rows` = seq_len positions; ids is then unread: bind any buffer).
// One invocation per column zeroes its column of dtable and then adds the
// tokens in order, so repeated ids accumulate and the result is bit-identical
// run to run. Ids outside [0, rows) are skipped. The whole of dtable
// (rows * dim) is overwritten.
//
// Bindings (set 0):  0: int ids[]       (readonly)  tokens
//                    1: float dout[]    (readonly)  tokens * dim
//                    2: float dtable[]  (read-write) rows * dim
// Push constants:    uint tokens; uint dim; uint rows; uint positional;
// Specialization:    constant 0 = workgroup size x (default 64).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop over
//                    dim); the natural choice is min(ceil(dim / wg), 65535).
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 1, std430) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 2, std430) buffer DTable { float dtable[]; };

layout(push_constant) uniform Params {
  uint tokens;
  uint dim;
  uint rows;
  uint positional;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint c = gl_GlobalInvocationID.x; c < p.dim; c += stride) {
    for (uint r = 0; r < p.rows; ++r) dtable[r * p.dim + c] = 0.0;
    for (uint t = 0; t < p.tokens; ++t) {
      const int id = p.positional != 0 ? int(t % p.rows) : ids[t];
      if (id < 0 || uint(id) >= p.rows) continue;
      dtable[uint(id) * p.dim + c] += dout[t * p.dim + c];
    }
  }
}
