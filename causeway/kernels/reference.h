// CPU reference implementations of the built-in kernels, for checking results
// (tests, the demo, benchmarks). Plain loops with double accumulation.
#ifndef CAUSEWAY_KERNELS_REFERENCE_H_
#define CAUSEWAY_KERNELS_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace causeway::reference {

// C[m,n] = A[m,k] * B[k,n], row-major.
std::vector<float> Matmul(const std::vector<float>& a, const std::vector<float>& b, uint32_t m, uint32_t n,
                          uint32_t k);
// C[i] = alpha * op(A[i]) * op(B[i]) + beta * C[i] for i < batch, row-major,
// as ops::Gemm computes it (see ops.h for the layout). Strides and leading
// dimensions are explicit here (no defaults); a stride of 0 repeats one
// matrix. beta == 0 ignores C's old values (NaNs included). Updates `c`.
struct GemmLayout {
  bool transpose_a = false, transpose_b = false;
  float alpha = 1.0f, beta = 0.0f;
  uint32_t batch = 1;
  uint64_t lda = 0, ldb = 0, ldc = 0;
  uint64_t stride_a = 0, stride_b = 0, stride_c = 0;
  uint64_t a_offset = 0, b_offset = 0, c_offset = 0;
};
void Gemm(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c, uint32_t m, uint32_t n,
          uint32_t k, const GemmLayout& layout);
// SplitMix64 (Steele, Lea, Flood 2014): the (i+1)-th output from `seed`, a
// counter-based generator that gives the same numbers on every machine.
inline uint64_t SplitMix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double Sum(const std::vector<float>& x);
// max_i |got_i - want_i| / max(1, |want_i|); infinity when sizes differ.
double MaxRelativeError(const std::vector<float>& got, const std::vector<float>& want);
// Deterministic uniform floats in [lo, hi).
std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

}  // namespace causeway::reference

#endif  // CAUSEWAY_KERNELS_REFERENCE_H_
