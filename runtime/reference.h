// CPU reference implementations of the built-in kernels, for checking results
// (tests, the demo, benchmarks). Plain loops with double accumulation.
#ifndef CAUSEWAY_RUNTIME_REFERENCE_H_
#define CAUSEWAY_RUNTIME_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace causeway::reference {

// C[m,n] = A[m,k] * B[k,n], row-major.
std::vector<float> Matmul(const std::vector<float>& a, const std::vector<float>& b, uint32_t m, uint32_t n,
                          uint32_t k);
double Sum(const std::vector<float>& x);
// max_i |got_i - want_i| / max(1, |want_i|); infinity when sizes differ.
double MaxRelativeError(const std::vector<float>& got, const std::vector<float>& want);
// Deterministic uniform floats in [lo, hi).
std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

}  // namespace causeway::reference

#endif  // CAUSEWAY_RUNTIME_REFERENCE_H_
