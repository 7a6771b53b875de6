// embedding: a gather of table rows by token id, plus an optional position
// embedding (f32 tables, i32 ids), for `tokens` tokens of `dim` columns:
//   out[t, c] = table[ids[t], c] + (use_pos != 0 ? pos[t % seq_len, c] : 0)
// Tokens are laid out as [batch, seq_len], so t % seq_len is t's position.
// An id outside [0, vocab) gives NaN in its whole output row.
//
// Bindings (set 0):  0: int ids[]      (readonly)  tokens
//                    1: float table[]  (readonly)  vocab * dim
//                    2: float pos[]    (readonly)  seq_len * dim (unread when use_pos == 0;
//                                                  bind any buffer, e.g. the table)
//                    3: float out[]    (writeonly) tokens * dim
// Push constants:    uint tokens; uint dim; uint vocab; uint seq_len; uint use_pos;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop over
//                    tokens * dim); natural min(ceil(tokens * dim / wg), 65535).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 1, std430) readonly buffer Table { float table[]; };
layout(set = 0, binding = 2, std430) readonly buffer Pos { float pos[]; };
layout(set = 0, binding = 3, std430) writeonly buffer Out { float out_[]; };

layout(push_constant) uniform Params {
  uint tokens;
  uint dim;
  uint vocab;
  uint seq_len;
  uint use_pos;
} p;

void main() {
  const uint count = p.tokens * p.dim;
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < count; i += stride) {
    const uint t = i / p.dim;
    const uint c = i % p.dim;
    const int id = ids[t];
    float v = uintBitsToFloat(0x7fc00000u);
    if (id >= 0 && uint(id) < p.vocab) v = table[uint(id) * p.dim + c];
    if (p.use_pos != 0) v += pos[(t % p.seq_len) * p.dim + c];
    out_[i] = v;
  }
}
