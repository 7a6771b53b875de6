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
//                    uint flags;   reserved, 0
//                    60 bytes.
// Specialization:    constant 0 = workgroup size x = WG (see the paths)
//                    constant 1 = transpose A (0 or 1, default 0)
//                    constant 2 = transpose B (0 or 1, default 0)
//                    constant 3 = rows of C per invocation R (path 2)
//                    constant 4 = columns of C per invocation S (path 2)
//                    constant 5 = the path (default 0, below)
//                    constant 6 = vec4 accesses: bit 0 for A, bit 1 for B,
//                                 bit 2 for C (path 0)
//
// Every path clamps or zero-fills out-of-range rows, columns and k for
// loading and stores only in-range elements of C, so any M, N, K >= 0 work
// (K = 0 gives beta * C). beta == 0 never reads C, which may hold anything
// (NaN included).
//
// Path 0, subgroup lanes (for CPU drivers; WG = 8, constants 3 and 4
// unused).
// A group computes a 16 x 128 block of C (kLaneRows x 32 kLaneSets below):
// lane l owns columns col0 + 32s + 4l .. + 3 (s < 4) of all 16 rows, 64
// vec4 accumulators. On lavapipe each invocation is a lane of one 8-wide SIMD
// vector, and every component of every storage-buffer read (or
// subgroupBroadcast) is a loop over the 8 lanes costing ~3 cycles per lane,
// against a fraction of a cycle per 8-wide FMA: the path therefore reads
// the fewest components per FMA it can without spilling beyond reason and
// shares nothing between lanes (a broadcast costs as much as a read). Per 4
// k every lane reads the block's 16 rows of A as 16 vec4 (the same
// addresses in every lane: k0 .. + 3 of a row, or, transposed, four rows at
// one k) and its own 16 columns of B as 16 vec4, then does 1024 FMAs. The
// last K % 4 are read singly. C is written row by row in a loop (unrolled,
// its reads and writes would take seconds to compile), as vec4 with bit 2.
// Dispatch (ceil(N / 128), ceil(M / 16), batch).
//
// Path 1, shared tiles (for GPUs; WG = 256). A group computes a 64 x 64
// block of C: per 16 k its 256 invocations each read a run of four
// consecutive floats of A and of B (vec4 where aligned and in range, else
// singly with zeros past the edge) into shared 16 x 64 tiles, then each
// computes 4 x 4 outputs (rows ty + 16i, columns tx + 16j) from the tiles.
// Dispatch (ceil(N / 64), ceil(M / 64), batch).
//
// Path 2, invocation blocks (the portable fallback; any WG, R, S). Each
// invocation computes R x S outputs: rows row0 .. + R - 1, columns
// col0 + lx * S .. + S - 1 (row0 = group.y * R, col0 = group.x * WG * S,
// lx the local index), reading A's R values per k (the same across the
// group) and B's S values itself. Dispatch (ceil(N / (WG * S)),
// ceil(M / R), batch).
//
// Constant 6, bit 0 (bit 1 likewise for B, bit 2 for C) may be set when A's
// binding offset is a multiple of 16 bytes and lda, stride_a and a_offset
// are multiples of 4; path 0 also needs M % 4 == 0 when A is transposed (N %
// 4 == 0 when B is not, and for C), path 2 ignores it when A is transposed
// and for B, paths 1 and 2 for C.
//
// groups_z = batch (<= maxComputeWorkGroupCount[2]). Skip the dispatch when
// M, N or batch is 0.
#version 450
// [[unroll]]: loops over fixed sizes unroll at build time (spirv-opt), so
// that path 0's arrays are indexed by constants and live in registers.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 64, local_size_x_id = 0) in;

layout(constant_id = 1) const uint kTransposeA = 0;
layout(constant_id = 2) const uint kTransposeB = 0;
layout(constant_id = 3) const uint kRows = 8;
layout(constant_id = 4) const uint kCols = 1;
layout(constant_id = 5) const uint kPath = 0;
layout(constant_id = 6) const uint kVec4 = 0;

const uint kSubgroupLanes = 0;
const uint kSharedTiles = 1;
const uint kInvocationBlocks = 2;
const uint kVec4A = 1;
const uint kVec4B = 2;
const uint kVec4C = 4;

layout(set = 0, binding = 0, std430) readonly buffer A { float a[]; };
// The same buffers as vec4s, for constant 6.
layout(set = 0, binding = 0, std430) readonly buffer A4 { vec4 a4[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { float b[]; };
layout(set = 0, binding = 1, std430) readonly buffer B4 { vec4 b4[]; };
layout(set = 0, binding = 2, std430) buffer C { float c[]; };
layout(set = 0, binding = 2, std430) buffer C4 { vec4 c4[]; };

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

// Stores alpha * acc (+ beta * C) at (row, col) of C when it is in range.
void Store(uint c_base, uint row, uint col, float acc) {
  if (row < p.M && col < p.N) {
    const uint at = c_base + row * p.ldc + col;
    float value = p.alpha * acc;
    if (p.beta != 0.0) {
      value = fma(p.beta, c[at], value);
    }
    c[at] = value;
  }
}

// Four floats of A (or B): with vec4_ok the four from index `at` on (`at` a
// multiple of 4), else the elements at at_q.
vec4 LoadA4(bool vec4_ok, uint at, uvec4 at_q) {
  if (vec4_ok) return a4[at / 4];
  return vec4(a[at_q.x], a[at_q.y], a[at_q.z], a[at_q.w]);
}
vec4 LoadB4(bool vec4_ok, uint at, uvec4 at_q) {
  if (vec4_ok) return b4[at / 4];
  return vec4(b[at_q.x], b[at_q.y], b[at_q.z], b[at_q.w]);
}

void InvocationBlocks() {
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
  if (kTransposeA == 0 && (kVec4 & kVec4A) != 0) {
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
    for (uint j = 0; j < kCols; ++j) {
      Store(c_base, row0 + i, col0 + j, acc[i][j]);
    }
  }
}

// Path 0's block: kLaneRows x 32 kLaneSets of C per group (fixed here
// rather than by constants 3 and 4: the loops below must unroll at build
// time so that every array index is a constant). Measured on lavapipe, 16 x
// 128 is the fastest that compiles in about a second: 32 x 128 runs no
// faster, 8 x 128 and 16 x 64 run 25-30% slower, and each doubling of the
// block about triples the compile time.
const uint kLaneRows = 16;
const uint kLaneSets = 4;
const uint kLaneQuads = kLaneRows / 4;

void SubgroupLanes() {
  const uint l = gl_LocalInvocationID.x;
  const uint batch = gl_WorkGroupID.z;
  const uint row0 = gl_WorkGroupID.y * kLaneRows;
  // This lane's columns of C: col[s] .. + 3 for s < kLaneSets.
  uint col[kLaneSets];
  [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
    col[s] = gl_WorkGroupID.x * 32 * kLaneSets + 32 * s + 4 * l;
  }
  const uint a_base = p.a_offset + batch * p.stride_a;
  const uint b_base = p.b_offset + batch * p.stride_b;
  const uvec4 q = uvec4(0, 1, 2, 3);
  const bool vec4_a = (kVec4 & kVec4A) != 0;
  const bool vec4_b = (kVec4 & kVec4B) != 0;
  // The block's rows of A by quads, clamped (the same in every lane).
  uvec4 a_rows[kLaneQuads];
  [[unroll]] for (uint g = 0; g < kLaneQuads; ++g) {
    a_rows[g] = min(uvec4(row0 + 4 * g) + q, uvec4(p.M - 1));
  }
  // This lane's columns of B, clamped; with vec4 B (not transposed) N % 4
  // == 0, so a quad is wholly in range or out, and an out one reads the last.
  uvec4 b_cols[kLaneSets];
  uint b_col4[kLaneSets];
  [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
    b_cols[s] = min(uvec4(col[s]) + q, uvec4(p.N - 1));
    b_col4[s] = min(col[s], p.N - 4);
  }

  vec4 acc[kLaneRows][kLaneSets];
  [[unroll]] for (uint i = 0; i < kLaneRows; ++i) {
    [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
      acc[i][s] = vec4(0.0);
    }
  }
  uint k0 = 0;
  for (; k0 + 4 <= p.K; k0 += 4) {
    // B at k0 + kk for this lane's columns.
    vec4 bv[4][kLaneSets];
    [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
      if (kTransposeB != 0) {
        [[unroll]] for (uint j = 0; j < 4; ++j) {
          const uint at = b_base + b_cols[s][j] * p.ldb + k0;
          const vec4 t = LoadB4(vec4_b, at, uvec4(at) + q);
          [[unroll]] for (uint kk = 0; kk < 4; ++kk) {
            bv[kk][s][j] = t[kk];
          }
        }
      } else {
        [[unroll]] for (uint kk = 0; kk < 4; ++kk) {
          const uint at = b_base + (k0 + kk) * p.ldb;
          bv[kk][s] = LoadB4(vec4_b, at + b_col4[s], uvec4(at) + b_cols[s]);
        }
      }
    }
    [[unroll]] for (uint g = 0; g < kLaneQuads; ++g) {
      // Rows 4g + r at k0 .. k0 + 3, read alike by every lane.
      vec4 av[4];
      [[unroll]] for (uint j = 0; j < 4; ++j) {
        if (kTransposeA != 0) {
          const uint at = a_base + (k0 + j) * p.lda;
          // With vec4 A M % 4 == 0: a quad past M reads the last one instead.
          const vec4 t = LoadA4(vec4_a, at + min(row0 + 4 * g, p.M - 4), uvec4(at) + a_rows[g]);
          [[unroll]] for (uint r = 0; r < 4; ++r) {
            av[r][j] = t[r];
          }
        } else {
          const uint at = a_base + a_rows[g][j] * p.lda + k0;
          av[j] = LoadA4(vec4_a, at, uvec4(at) + q);
        }
      }
      [[unroll]] for (uint r = 0; r < 4; ++r) {
        [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
          [[unroll]] for (uint kk = 0; kk < 4; ++kk) {
            acc[4 * g + r][s] = fma(vec4(av[r][kk]), bv[kk][s], acc[4 * g + r][s]);
          }
        }
      }
    }
  }
  // The last K % 4, one k at a time.
  for (uint k = k0; k < p.K; ++k) {
    vec4 bk[kLaneSets];
    [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
      [[unroll]] for (uint j = 0; j < 4; ++j) {
        bk[s][j] = b[b_base + (kTransposeB != 0 ? b_cols[s][j] * p.ldb + k : k * p.ldb + b_cols[s][j])];
      }
    }
    [[unroll]] for (uint g = 0; g < kLaneQuads; ++g) {
      [[unroll]] for (uint r = 0; r < 4; ++r) {
        const uint row = a_rows[g][r];
        const float ak = a[a_base + (kTransposeA != 0 ? k * p.lda + row : row * p.lda + k)];
        [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
          acc[4 * g + r][s] = fma(vec4(ak), bk[s], acc[4 * g + r][s]);
        }
      }
    }
  }

  // alpha * acc, indexed by a loop over the rows below: unrolled, the
  // stores (each a loop over the lanes) would take seconds to compile.
  vec4 scaled[kLaneRows][kLaneSets];
  [[unroll]] for (uint i = 0; i < kLaneRows; ++i) {
    [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
      scaled[i][s] = p.alpha * acc[i][s];
    }
  }
  const uint c_base = p.c_offset + batch * p.stride_c;
  const uint rows = min(kLaneRows, p.M - row0);
  [[dont_unroll]] for (uint i = 0; i < rows; ++i) {
    const uint row_at = c_base + (row0 + i) * p.ldc;
    [[unroll]] for (uint s = 0; s < kLaneSets; ++s) {
      vec4 v = scaled[i][s];
      if ((kVec4 & kVec4C) != 0) {
        // N % 4 == 0: the quad is wholly in range or out.
        if (col[s] < p.N) {
          const uint at = (row_at + col[s]) / 4;
          if (p.beta != 0.0) v = fma(vec4(p.beta), c4[at], v);
          c4[at] = v;
        }
      } else {
        [[unroll]] for (uint j = 0; j < 4; ++j) {
          if (col[s] + j < p.N) {
            const uint at = row_at + col[s] + j;
            float value = v[j];
            if (p.beta != 0.0) value = fma(p.beta, c[at], value);
            c[at] = value;
          }
        }
      }
    }
  }
}

// Path 1's tiles: 16 k by 64 rows of op(A), 16 k by 64 columns of op(B).
const uint kTile = 64;
const uint kTileK = 16;
shared float a_tile[kTileK][kTile];
shared float b_tile[kTileK][kTile];

// Four consecutive floats of a stored matrix from (row, col) on, zero where
// past its rows x cols; one vec4 read when `vec4_ok` and all four are in.
vec4 RunA(bool vec4_ok, uint base, uint row, uint col, uint rows, uint cols) {
  vec4 v = vec4(0.0);
  if (row < rows) {
    const uint at = base + row * p.lda + col;
    if (vec4_ok && col + 4 <= cols) return a4[at / 4];
    for (uint q = 0; q < 4; ++q) {
      if (col + q < cols) v[q] = a[at + q];
    }
  }
  return v;
}
vec4 RunB(bool vec4_ok, uint base, uint row, uint col, uint rows, uint cols) {
  vec4 v = vec4(0.0);
  if (row < rows) {
    const uint at = base + row * p.ldb + col;
    if (vec4_ok && col + 4 <= cols) return b4[at / 4];
    for (uint q = 0; q < 4; ++q) {
      if (col + q < cols) v[q] = b[at + q];
    }
  }
  return v;
}

void SharedTiles() {
  const uint t = gl_LocalInvocationID.x;
  const uint tx = t % 16;
  const uint ty = t / 16;
  const uint batch = gl_WorkGroupID.z;
  const uint row0 = gl_WorkGroupID.y * kTile;
  const uint col0 = gl_WorkGroupID.x * kTile;
  const uint a_base = p.a_offset + batch * p.stride_a;
  const uint b_base = p.b_offset + batch * p.stride_b;
  const bool vec4_a = (kVec4 & kVec4A) != 0;
  const bool vec4_b = (kVec4 & kVec4B) != 0;

  float acc[4][4];
  for (uint i = 0; i < 4; ++i) {
    for (uint j = 0; j < 4; ++j) {
      acc[i][j] = 0.0;
    }
  }
  for (uint k0 = 0; k0 < p.K; k0 += kTileK) {
    // Each invocation reads one run of four along the stored rows.
    if (kTransposeA != 0) {
      const uint kk = t / 16, r = (t % 16) * 4;
      const vec4 v = RunA(vec4_a, a_base, k0 + kk, row0 + r, p.K, p.M);
      for (uint q = 0; q < 4; ++q) a_tile[kk][r + q] = v[q];
    } else {
      const uint r = t / 4, kk = (t % 4) * 4;
      const vec4 v = RunA(vec4_a, a_base, row0 + r, k0 + kk, p.M, p.K);
      for (uint q = 0; q < 4; ++q) a_tile[kk + q][r] = v[q];
    }
    if (kTransposeB != 0) {
      const uint n = t / 4, kk = (t % 4) * 4;
      const vec4 v = RunB(vec4_b, b_base, col0 + n, k0 + kk, p.N, p.K);
      for (uint q = 0; q < 4; ++q) b_tile[kk + q][n] = v[q];
    } else {
      const uint kk = t / 16, n = (t % 16) * 4;
      const vec4 v = RunB(vec4_b, b_base, k0 + kk, col0 + n, p.K, p.N);
      for (uint q = 0; q < 4; ++q) b_tile[kk][n + q] = v[q];
    }
    barrier();
    for (uint kk = 0; kk < kTileK; ++kk) {
      float av[4], bv[4];
      for (uint i = 0; i < 4; ++i) av[i] = a_tile[kk][ty + 16 * i];
      for (uint j = 0; j < 4; ++j) bv[j] = b_tile[kk][tx + 16 * j];
      for (uint i = 0; i < 4; ++i) {
        for (uint j = 0; j < 4; ++j) {
          acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
      }
    }
    barrier();
  }

  const uint c_base = p.c_offset + batch * p.stride_c;
  for (uint i = 0; i < 4; ++i) {
    for (uint j = 0; j < 4; ++j) {
      Store(c_base, row0 + ty + 16 * i, col0 + tx + 16 * j, acc[i][j]);
    }
  }
}

void main() {
  if (kPath == kSubgroupLanes) {
    SubgroupLanes();
  } else if (kPath == kSharedTiles) {
    SharedTiles();
  } else {
    InvocationBlocks();
  }
}
