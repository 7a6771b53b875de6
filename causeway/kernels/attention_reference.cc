#include "causeway/kernels/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace causeway::reference {
namespace {

// The causal softmax probabilities of one (batch, head) matrix: p[i * T + j]
// for j <= i (0 above the diagonal), in double. `lse` gets each row's
// logsumexp of the scaled scores.
std::vector<double> Probabilities(const float* q, const float* k, uint32_t t, uint32_t d, double scale,
                                  double* lse) {
  std::vector<double> p(size_t{t} * t, 0.0);
  for (uint32_t i = 0; i < t; ++i) {
    double* row = &p[size_t{i} * t];
    double max = -HUGE_VAL;
    for (uint32_t j = 0; j <= i; ++j) {
      double s = 0;
      for (uint32_t c = 0; c < d; ++c) s += double{q[size_t{i} * d + c]} * k[size_t{j} * d + c];
      row[j] = s * scale;
      max = std::max(max, row[j]);
    }
    double sum = 0;
    for (uint32_t j = 0; j <= i; ++j) sum += std::exp(row[j] - max);
    for (uint32_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - max) / sum;
    lse[i] = max + std::log(sum);
  }
  return p;
}

}  // namespace

AttentionForwardResult AttentionForward(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const AttentionDims& dims) {
  const uint32_t t = dims.seq_len, d = dims.head_dim;
  const size_t matrix = size_t{t} * d;
  AttentionForwardResult result{std::vector<float>(dims.elements()), std::vector<float>(dims.rows())};
  std::vector<double> lse(t);
  for (size_t bh = 0; bh < size_t{dims.batch} * dims.heads; ++bh) {
    const size_t base = bh * matrix;
    std::vector<double> p = Probabilities(&q[base], &k[base], t, d, dims.scale, lse.data());
    for (uint32_t i = 0; i < t; ++i) {
      for (uint32_t c = 0; c < d; ++c) {
        double acc = 0;
        for (uint32_t j = 0; j <= i; ++j) acc += p[size_t{i} * t + j] * v[base + size_t{j} * d + c];
        result.out[base + size_t{i} * d + c] = static_cast<float>(acc);
      }
      result.lse[bh * t + i] = static_cast<float>(lse[i]);
    }
  }
  return result;
}

AttentionGradients AttentionBackward(const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const std::vector<float>& d_out,
                                     const AttentionDims& dims) {
  const uint32_t t = dims.seq_len, d = dims.head_dim;
  const size_t matrix = size_t{t} * d;
  const double scale = dims.scale;
  std::vector<double> dq(dims.elements(), 0.0), dk(dims.elements(), 0.0), dv(dims.elements(), 0.0);
  std::vector<double> lse(t);
  std::vector<double> dp(t);
  for (size_t bh = 0; bh < size_t{dims.batch} * dims.heads; ++bh) {
    const size_t base = bh * matrix;
    std::vector<double> p = Probabilities(&q[base], &k[base], t, d, scale, lse.data());
    for (uint32_t i = 0; i < t; ++i) {
      const double* prow = &p[size_t{i} * t];
      const float* go = &d_out[base + size_t{i} * d];
      // dv[j] += p_ij dO_i;  dP_ij = dO_i.v_j;  dS_ij = p_ij (dP_ij - sum_l p_il dP_il).
      double weighted = 0;
      for (uint32_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (uint32_t c = 0; c < d; ++c) {
          dot += double{go[c]} * v[base + size_t{j} * d + c];
          dv[base + size_t{j} * d + c] += prow[j] * go[c];
        }
        dp[j] = dot;
        weighted += prow[j] * dot;
      }
      for (uint32_t j = 0; j <= i; ++j) {
        const double ds = prow[j] * (dp[j] - weighted) * scale;
        for (uint32_t c = 0; c < d; ++c) {
          dq[base + size_t{i} * d + c] += ds * k[base + size_t{j} * d + c];
          dk[base + size_t{j} * d + c] += ds * q[base + size_t{i} * d + c];
        }
      }
    }
  }
  return AttentionGradients{std::vector<float>(dq.begin(), dq.end()),
                            std::vector<float>(dk.begin(), dk.end()),
                            std::vector<float>(dv.begin(), dv.end())};
}

}  // namespace causeway::reference
