// matmul: C[M, N] = A[M, K] * B[K, N], all row-major f32, densely packed.
//
// Bindings (set 0):  0: float a[]  (readonly)   M * K floats
//                    1: float b[]  (readonly)   K * N floats
//                    2: float c[]  (writeonly)  M * N floats
// Push constants:    uint M; uint N; uint K;
// Specialization:    constant 0 = workgroup size x = TX (default 16)
//                    constant 1 = workgroup size y = TY (default 16)
//                    Requires TX <= 32, TY <= 32 (and so TX * TY <= 1024).
//                    TX == TY is the intended use; any pair in range works.
//
// Each workgroup computes a (4 * TY) x (4 * TX) block of C; each invocation
// computes 4 x 4 outputs of it, strided by TY rows and TX columns. Any M, N, K
// work: edges are bounds-checked, and K = 0 writes zeros.
//
// Dispatch (the host computes it from these formulas):
//   groups_x = ceil(N / (4 * TX)) = (N + 4 * TX - 1) / (4 * TX)
//   groups_y = ceil(M / (4 * TY)) = (M + 4 * TY - 1) / (4 * TY)
//   groups_z = 1
// With the defaults (TX = TY = 16): (ceil(N / 64), ceil(M / 64), 1).
// When M or N is 0 there is nothing to compute; skip the dispatch.
#version 450

// Outputs per invocation along each axis.
const uint kBlock = 4;
// Depth of the K slice staged in shared memory per step.
const uint kDepth = 16;
// Largest TX and TY supported; shared memory is sized for them so the
// specialization constants can pick any size up to it.
const uint kMaxWorkgroupDim = 32;
// a_tile and b_tile each hold at most kBlock * 32 * kDepth = 2048 floats:
// 16 KiB in all, the Vulkan minimum of maxComputeSharedMemorySize.
const uint kMaxTileFloats = kBlock * kMaxWorkgroupDim * kDepth;

layout(local_size_x = 16, local_size_y = 16,
       local_size_x_id = 0, local_size_y_id = 1) in;

layout(set = 0, binding = 0, std430) readonly buffer A { float a[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { float b[]; };
layout(set = 0, binding = 2, std430) writeonly buffer C { float c[]; };

layout(push_constant) uniform Params {
  uint M;
  uint N;
  uint K;
} p;

// The slices of A and B for the current K step. a_tile is
// (kBlock * TY) x kDepth and b_tile is kDepth x (kBlock * TX), both row-major
// and densely packed. Elements past the edges of A or B are stored as 0 so
// they add nothing.
shared float a_tile[kMaxTileFloats];
shared float b_tile[kMaxTileFloats];

void main() {
  const uint tx_size = gl_WorkGroupSize.x;
  const uint ty_size = gl_WorkGroupSize.y;
  const uint invocations = tx_size * ty_size;
  const uint block_rows = kBlock * ty_size;
  const uint block_cols = kBlock * tx_size;

  const uint tx = gl_LocalInvocationID.x;
  const uint ty = gl_LocalInvocationID.y;
  const uint lid = gl_LocalInvocationIndex;
  const uint row0 = gl_WorkGroupID.y * block_rows;
  const uint col0 = gl_WorkGroupID.x * block_cols;

  // acc[i][j] is C[row0 + ty + i * TY][col0 + tx + j * TX].
  float acc[kBlock][kBlock];
  for (uint i = 0; i < kBlock; ++i) {
    for (uint j = 0; j < kBlock; ++j) {
      acc[i][j] = 0.0;
    }
  }

  // Every invocation runs every iteration (the trip count is uniform), so the
  // barriers are in uniform control flow even for invocations whose outputs
  // are out of range.
  for (uint k0 = 0; k0 < p.K; k0 += kDepth) {
    // Consecutive invocations load consecutive addresses of a row.
    for (uint e = lid; e < block_rows * kDepth; e += invocations) {
      const uint row = row0 + e / kDepth;
      const uint k = k0 + e % kDepth;
      a_tile[e] = (row < p.M && k < p.K) ? a[row * p.K + k] : 0.0;
    }
    for (uint e = lid; e < kDepth * block_cols; e += invocations) {
      const uint k = k0 + e / block_cols;
      const uint col = col0 + e % block_cols;
      b_tile[e] = (k < p.K && col < p.N) ? b[k * p.N + col] : 0.0;
    }
    barrier();

    for (uint k = 0; k < kDepth; ++k) {
      float a_values[kBlock];
      float b_values[kBlock];
      for (uint i = 0; i < kBlock; ++i) {
        a_values[i] = a_tile[(ty + i * ty_size) * kDepth + k];
      }
      for (uint j = 0; j < kBlock; ++j) {
        b_values[j] = b_tile[k * block_cols + tx + j * tx_size];
      }
      for (uint i = 0; i < kBlock; ++i) {
        for (uint j = 0; j < kBlock; ++j) {
          acc[i][j] += a_values[i] * b_values[j];
        }
      }
    }
    // The next iteration overwrites the tiles.
    barrier();
  }

  // Guards rather than early exits keep these loops unrollable, so acc stays
  // in registers (a `break` here makes lavapipe spill it and run 3x slower).
  for (uint i = 0; i < kBlock; ++i) {
    const uint row = row0 + ty + i * ty_size;
    for (uint j = 0; j < kBlock; ++j) {
      const uint col = col0 + tx + j * tx_size;
      if (row < p.M && col < p.N) {
        c[row * p.N + col] = acc[i][j];
      }
    }
  }
}
