// gemm: C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] for b < batch,
// row-major f32, op(X) = X or X^T per operand (specialization constants).
//
// Shapes: op(A) is M x K, op(B) is K x N, C is M x N. As stored, A is M x K
// (lda >= K) or, transposed, K x M (lda >= M); B is K x N (ldb >= N) or,
// transposed, N x K (ldb >= K); C is M x N (ldc >= N). Element (r, c) of a
// stored matrix of batch b is x[x_offset + b * stride_x + r * ldx + c].
//
// Bindings (set 0):  0: float a[]  (readonly)
//                    1: float b[]  (readonly)
//                    2: float c[]  (read-write; read only when beta != 0)
//                    Each must hold its last element: for A,
//                    a_offset + (batch - 1) * stride_a + (rows - 1) * lda + cols
//                    floats, with rows x cols as stored (likewise B, C).
// Push constants:    uint M, N, K;
//                    uint lda, ldb, ldc;                (elements)
//                    uint stride_a, stride_b, stride_c; (elements per batch;
//                                                        0 = one matrix for all)
//                    uint a_offset, b_offset, c_offset; (elements)
//                    float alpha, beta;
//                    uint flags;   bit 0: A may be read as vec4 (see below)
//                    60 bytes.
// Specialization:    constant 0 = workgroup size x = WG (default 64, <= 1024)
//                    constant 1 = transpose A (0 or 1, default 0)
//                    constant 2 = transpose B (0 or 1, default 0)
//                    constant 3 = rows of C per invocation R (default 16)
//                    constant 4 = columns of C per invocation S (default 1)
//
// Each invocation computes R x S outputs: rows row0 .. row0 + R - 1 and the
// columns col0 + lx * S .. + S - 1, where row0 = group.y * R,
// col0 = group.x * WG * S and lx the local index. The R values of A it needs
// per k are the same for every invocation of the group (they depend on no
// local id), so a CPU driver loads each once for the whole SIMD batch and
// broadcasts it; only B is read per invocation. There are no barriers and no
// shared memory: on lavapipe a barrier splits the shader into coroutines and
// shared memory is plain memory, so a shared tile only adds copies.
// Out-of-range rows and columns are clamped for loading and not stored, so
// control flow stays uniform; any M, N, K >= 0 work (K = 0 gives beta * C).
// beta == 0 never reads C, which may hold anything (NaN included).
//
// flags bit 0 (the host sets it when !transpose_a, lda % 4 == 0,
// stride_a % 4 == 0 and a_offset % 4 == 0): A's rows are read four k at a
// time as vec4. Without it every element is read singly.
//
// Dispatch (the host computes it from these formulas):
//   groups_x = ceil(N / (WG * S))
//   groups_y = ceil(M / R)
//   groups_z = batch (<= maxComputeWorkGroupCount[2])
// With the defaults: (ceil(N / 64), ceil(M / 16), batch). Skip the dispatch
// when M, N or batch is 0.
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;

layout(constant_id = 1) const uint kTransposeA = 0;
layout(constant_id = 2) const uint kTransposeB = 0;
layout(constant_id = 3) const uint kRows = 16;
layout(constant_id = 4) const uint kCols = 1;

layout(set = 0, binding = 0, std430) readonly buffer A { float a[]; };
// The same buffer as vec4s, for flags bit 0.
layout(set = 0, binding = 0, std430) readonly buffer A4 { vec4 a4[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { float b[]; };
layout(set = 0, binding = 2, std430) buffer C { float c[]; };

layout(push_constant) uniform Params {
  uint M;
  uint N;
  uint K;
  uint lda;
  uint ldb;
  uint ldc;
  uint stride_a;
  uint stride_b;
  uint stride_c;
  uint a_offset;
  uint b_offset;
  uint c_offset;
  float alpha;
  float beta;
  uint flags;
} p;

const uint kVec4A = 1;

void main() {
  const uint batch = gl_WorkGroupID.z;
  const uint row0 = gl_WorkGroupID.y * kRows;
  const uint col0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * kCols + gl_LocalInvocationID.x * kCols;
  const uint a_base = p.a_offset + batch * p.stride_a;
  const uint b_base = p.b_offset + batch * p.stride_b;

  // Where row i of op(A) starts and how far apart its k are; likewise the
  // columns of op(B). Clamped indices keep every load in range.
  uint a_row[kRows];
  for (uint i = 0; i < kRows; ++i) {
    const uint row = min(row0 + i, p.M - 1);
    a_row[i] = a_base + (kTransposeA != 0 ? row : row * p.lda);
  }
  const uint a_step = kTransposeA != 0 ? p.lda : 1;
  uint b_col[kCols];
  for (uint j = 0; j < kCols; ++j) {
    const uint col = min(col0 + j, p.N - 1);
    b_col[j] = b_base + (kTransposeB != 0 ? col * p.ldb : col);
  }
  const uint b_step = kTransposeB != 0 ? 1 : p.ldb;

  float acc[kRows][kCols];
  for (uint i = 0; i < kRows; ++i) {
    for (uint j = 0; j < kCols; ++j) {
      acc[i][j] = 0.0;
    }
  }

  uint k = 0;
  if ((p.flags & kVec4A) != 0) {
    // a_row[i] is a multiple of 4 here, and so is k.
    for (; k + 4 <= p.K; k += 4) {
      float bv[4][kCols];
      for (uint kk = 0; kk < 4; ++kk) {
        for (uint j = 0; j < kCols; ++j) {
          bv[kk][j] = b[b_col[j] + (k + kk) * b_step];
        }
      }
      for (uint i = 0; i < kRows; ++i) {
        const vec4 av = a4[(a_row[i] + k) / 4];
        for (uint j = 0; j < kCols; ++j) {
          acc[i][j] = fma(av.x, bv[0][j], acc[i][j]);
          acc[i][j] = fma(av.y, bv[1][j], acc[i][j]);
          acc[i][j] = fma(av.z, bv[2][j], acc[i][j]);
          acc[i][j] = fma(av.w, bv[3][j], acc[i][j]);
        }
      }
    }
  }
  for (; k < p.K; ++k) {
    float bv[kCols];
    for (uint j = 0; j < kCols; ++j) {
      bv[j] = b[b_col[j] + k * b_step];
    }
    for (uint i = 0; i < kRows; ++i) {
      const float av = a[a_row[i] + k * a_step];
      for (uint j = 0; j < kCols; ++j) {
        acc[i][j] = fma(av, bv[j], acc[i][j]);
      }
    }
  }

  const uint c_base = p.c_offset + batch * p.stride_c;
  for (uint i = 0; i < kRows; ++i) {
    const uint row = row0 + i;
    for (uint j = 0; j < kCols; ++j) {
      const uint col = col0 + j;
      if (row < p.M && col < p.N) {
        const uint at = c_base + row * p.ldc + col;
        float value = p.alpha * acc[i][j];
        if (p.beta != 0.0) {
          value = fma(p.beta, c[at], value);
        }
        c[at] = value;
      }
    }
  }
}
