#include "causeway/kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace causeway::reference {

std::vector<float> Matmul(const std::vector<float>& a, const std::vector<float>& b, uint32_t m, uint32_t n,
                          uint32_t k) {
  std::vector<double> acc(size_t{m} * n, 0.0);
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t p = 0; p < k; ++p) {
      double av = a[size_t{i} * k + p];
      const float* brow = &b[size_t{p} * n];
      double* crow = &acc[size_t{i} * n];
      for (uint32_t j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
  return std::vector<float>(acc.begin(), acc.end());
}

void Gemm(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c, uint32_t m, uint32_t n,
          uint32_t k, const GemmLayout& l) {
  for (uint32_t batch = 0; batch < l.batch; ++batch) {
    const float* ab = a.data() + l.a_offset + batch * l.stride_a;
    const float* bb = b.data() + l.b_offset + batch * l.stride_b;
    float* cb = c.data() + l.c_offset + batch * l.stride_c;
    for (uint32_t i = 0; i < m; ++i) {
      for (uint32_t j = 0; j < n; ++j) {
        double sum = 0;
        for (uint32_t p = 0; p < k; ++p) {
          const float av = l.transpose_a ? ab[size_t{p} * l.lda + i] : ab[size_t{i} * l.lda + p];
          const float bv = l.transpose_b ? bb[size_t{j} * l.ldb + p] : bb[size_t{p} * l.ldb + j];
          sum += double{av} * bv;
        }
        float& out = cb[size_t{i} * l.ldc + j];
        out = static_cast<float>(l.alpha * sum + (l.beta == 0.0f ? 0.0 : double{l.beta} * out));
      }
    }
  }
}

double Sum(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += v;
  return s;
}

double MaxRelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(double{got[i]} - double{want[i]}) / std::max(1.0, std::abs(double{want[i]}));
    if (std::isnan(err)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, err);
  }
  return worst;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace causeway::reference
