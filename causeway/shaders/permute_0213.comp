// permute_0213: out[a, c, b, d] = in[a, b, c, d] for a row-major f32 tensor
// of sizes [A, B, C, D]; out has sizes [A, C, B, D]. Splits attention heads
// ([batch, T, heads, head_dim] -> [batch, heads, T, head_dim]) and merges
// them back (the same kernel with B and C swapped).
//
// Bindings (set 0):  0: float in[]   (readonly)  A * B * C * D
//                    1: float out[]  (writeonly) A * B * C * D; must not alias in
// Push constants:    uint A; uint B; uint C; uint D;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop over
//                    the output); the natural choice is
//                    min(ceil(A * B * C * D / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer In { float src[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Out { float dst[]; };

layout(push_constant) uniform Params {
  uint A;
  uint B;
  uint C;
  uint D;
} p;

void main() {
  const uint count = p.A * p.B * p.C * p.D;
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < count; i += stride) {
    // i indexes out[a, c, b, d].
    const uint d = i % p.D;
    const uint b = (i / p.D) % p.B;
    const uint c = (i / (p.D * p.B)) % p.C;
    const uint a = i / (p.D * p.B * p.C);
    dst[i] = src[((a * p.B + b) * p.C + c) * p.D + d];
  }
}
