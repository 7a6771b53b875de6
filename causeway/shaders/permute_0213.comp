// permute_0213: out[a, c, b, d] = in[a, b, c, d] for a row-major f32 tensor
// of sizes [A, B, C, D]; out has sizes [A, C, B, D]. Splits attention heads
// ([batch, T, heads, head_dim] -> [batch, heads, T, head_dim]) and merges
// them back (the same kernel with B and C swapped).
//
// Bindings (set 0):  0: float in[]   (readonly)  A * B * C * D
//                    1: float out[]  (writeonly) A * B * C * D; must not alias in
// Push constants:    uint A; uint B; uint C; uint D;
// Specialization:    constant 0 = workgroup size x (default 256);
//                    constant 1 = form: 0 an invocation per element, 1 an
//                    invocation per row of D elements (one index
//                    decomposition a row rather than one an element: integer
//                    division has no vector instruction on CPUs, so lavapipe
//                    spends most of the element form on it).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop over
//                    the output's elements, form 0, or rows, form 1); the
//                    natural choice is min(ceil(N / wg), 65535) x 1 x 1 for
//                    N = A * B * C * D (form 0) or A * B * C (form 1).
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROW_PER_INVOCATION = 0;

layout(set = 0, binding = 0, std430) readonly buffer In { float src[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Out { float dst[]; };

layout(push_constant) uniform Params {
  uint A;
  uint B;
  uint C;
  uint D;
} p;

void PerRow() {
  const uint rows = p.A * p.B * p.C;
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < rows; i += stride) {
    // i indexes out[a, c, b, :].
    const uint b = i % p.B;
    const uint ac = i / p.B;
    const uint c = ac % p.C;
    const uint a = ac / p.C;
    const uint from = ((a * p.B + b) * p.C + c) * p.D;
    const uint to = i * p.D;
    for (uint d = 0; d < p.D; ++d) dst[to + d] = src[from + d];
  }
}

void PerElement() {
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

void main() {
  if (ROW_PER_INVOCATION != 0) {
    PerRow();
  } else {
    PerElement();
  }
}
