#include "causeway/kernels/nn_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace causeway::reference {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

std::vector<float> ToFloat(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

}  // namespace

double Gelu(double u) { return 0.5 * u * (1.0 + std::tanh(kSqrt2OverPi * (u + kCubic * u * u * u))); }

double GeluGrad(double u) {
  const double t = std::tanh(kSqrt2OverPi * (u + kCubic * u * u * u));
  return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * u * u);
}

std::vector<float> BiasGelu(const std::vector<float>& x, const std::vector<float>& bias, uint32_t rows,
                            uint32_t cols) {
  std::vector<float> y(size_t{rows} * cols);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(Gelu(double{x[i]} + bias[i % cols]));
  return y;
}

BiasGeluGrads BiasGeluBackward(const std::vector<float>& dy, const std::vector<float>& x,
                               const std::vector<float>& bias, uint32_t rows, uint32_t cols) {
  BiasGeluGrads out{std::vector<float>(size_t{rows} * cols), {}};
  std::vector<double> dbias(cols, 0.0);
  for (size_t i = 0; i < out.dx.size(); ++i) {
    const double g = double{dy[i]} * GeluGrad(double{x[i]} + bias[i % cols]);
    out.dx[i] = static_cast<float>(g);
    dbias[i % cols] += g;
  }
  out.dbias = ToFloat(dbias);
  return out;
}

LayerNormResult LayerNorm(const std::vector<float>& x, const std::vector<float>& gamma,
                          const std::vector<float>& beta, uint32_t rows, uint32_t cols, float eps) {
  LayerNormResult out{std::vector<float>(size_t{rows} * cols), std::vector<float>(rows),
                      std::vector<float>(rows)};
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = &x[size_t{r} * cols];
    double mean = 0;
    for (uint32_t c = 0; c < cols; ++c) mean += row[c];
    mean /= cols;
    double var = 0;
    for (uint32_t c = 0; c < cols; ++c) var += (row[c] - mean) * (row[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / cols + eps);
    for (uint32_t c = 0; c < cols; ++c) {
      out.y[size_t{r} * cols + c] = static_cast<float>((row[c] - mean) * rstd * gamma[c] + beta[c]);
    }
    out.mean[r] = static_cast<float>(mean);
    out.rstd[r] = static_cast<float>(rstd);
  }
  return out;
}

LayerNormGrads LayerNormBackward(const std::vector<float>& dy, const std::vector<float>& x,
                                 const std::vector<float>& gamma, const std::vector<float>& mean,
                                 const std::vector<float>& rstd, uint32_t rows, uint32_t cols) {
  LayerNormGrads out{std::vector<float>(size_t{rows} * cols), {}, {}};
  std::vector<double> dgamma(cols, 0.0), dbeta(cols, 0.0);
  for (uint32_t r = 0; r < rows; ++r) {
    const size_t base = size_t{r} * cols;
    double mean_g = 0, mean_gx = 0;
    for (uint32_t c = 0; c < cols; ++c) {
      const double xhat = (double{x[base + c]} - mean[r]) * rstd[r];
      const double g = double{dy[base + c]} * gamma[c];
      mean_g += g;
      mean_gx += g * xhat;
      dgamma[c] += double{dy[base + c]} * xhat;
      dbeta[c] += dy[base + c];
    }
    mean_g /= cols;
    mean_gx /= cols;
    for (uint32_t c = 0; c < cols; ++c) {
      const double xhat = (double{x[base + c]} - mean[r]) * rstd[r];
      const double g = double{dy[base + c]} * gamma[c];
      out.dx[base + c] = static_cast<float>(rstd[r] * (g - mean_g - xhat * mean_gx));
    }
  }
  out.dgamma = ToFloat(dgamma);
  out.dbeta = ToFloat(dbeta);
  return out;
}

std::vector<float> SoftmaxCausal(const std::vector<float>& x, uint32_t rows, uint32_t t, float scale) {
  std::vector<float> y(size_t{rows} * t, 0.0f);
  for (uint32_t r = 0; r < rows; ++r) {
    const size_t base = size_t{r} * t;
    const uint32_t last = r % t;
    double m = -std::numeric_limits<double>::infinity();
    for (uint32_t j = 0; j <= last; ++j) m = std::max(m, double{scale} * x[base + j]);
    double s = 0;
    for (uint32_t j = 0; j <= last; ++j) s += std::exp(double{scale} * x[base + j] - m);
    for (uint32_t j = 0; j <= last; ++j)
      y[base + j] = static_cast<float>(std::exp(double{scale} * x[base + j] - m) / s);
  }
  return y;
}

std::vector<float> SoftmaxCausalBackward(const std::vector<float>& y, const std::vector<float>& dy,
                                         uint32_t rows, uint32_t t, float scale) {
  std::vector<float> dx(size_t{rows} * t, 0.0f);
  for (uint32_t r = 0; r < rows; ++r) {
    const size_t base = size_t{r} * t;
    const uint32_t last = r % t;
    double dot = 0;
    for (uint32_t j = 0; j <= last; ++j) dot += double{dy[base + j]} * y[base + j];
    for (uint32_t j = 0; j <= last; ++j) {
      dx[base + j] = static_cast<float>(double{scale} * y[base + j] * (dy[base + j] - dot));
    }
  }
  return dx;
}

namespace {

// log(sum exp(row)) and the row's max, in double.
std::pair<double, double> LogSumExp(const float* row, uint32_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (uint32_t v = 0; v < n; ++v) m = std::max(m, double{row[v]});
  double s = 0;
  for (uint32_t v = 0; v < n; ++v) s += std::exp(row[v] - m);
  return {std::log(s) + m, m};
}

}  // namespace

std::vector<float> CrossEntropy(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                uint32_t rows, uint32_t vocab) {
  std::vector<float> loss(rows);
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = &logits[size_t{r} * vocab];
    const int32_t target = targets[r];
    if (target < 0 || static_cast<uint32_t>(target) >= vocab) {
      loss[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    loss[r] = static_cast<float>(LogSumExp(row, vocab).first - row[target]);
  }
  return loss;
}

std::vector<float> CrossEntropyBackward(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                        uint32_t rows, uint32_t vocab, float scale) {
  std::vector<float> d(size_t{rows} * vocab);
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = &logits[size_t{r} * vocab];
    const double lse = LogSumExp(row, vocab).first;
    for (uint32_t v = 0; v < vocab; ++v) {
      const double onehot = static_cast<int64_t>(v) == targets[r] ? 1.0 : 0.0;
      d[size_t{r} * vocab + v] = static_cast<float>(scale * (std::exp(row[v] - lse) - onehot));
    }
  }
  return d;
}

std::vector<float> Embedding(const std::vector<int32_t>& ids, const std::vector<float>& table,
                             const std::vector<float>& pos, uint32_t dim, uint32_t seq_len) {
  const size_t vocab = table.size() / dim;
  std::vector<float> out(ids.size() * dim);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (uint32_t c = 0; c < dim; ++c) {
      float v = ids[t] >= 0 && static_cast<size_t>(ids[t]) < vocab ? table[size_t(ids[t]) * dim + c]
                                                                   : std::numeric_limits<float>::quiet_NaN();
      if (!pos.empty()) v += pos[(t % seq_len) * dim + c];
      out[t * dim + c] = v;
    }
  }
  return out;
}

std::vector<float> EmbeddingBackward(const std::vector<int32_t>& ids, const std::vector<float>& dout,
                                     uint32_t dim, uint32_t rows) {
  std::vector<double> d(size_t{rows} * dim, 0.0);
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || static_cast<uint32_t>(ids[t]) >= rows) continue;
    for (uint32_t c = 0; c < dim; ++c) d[size_t(ids[t]) * dim + c] += dout[t * dim + c];
  }
  return ToFloat(d);
}

void AdamStep(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m,
              std::vector<float>& v, uint32_t step, const AdamOptions& o) {
  const double bc1 = 1.0 - std::pow(double{o.beta1}, step);
  const double bc2 = 1.0 - std::pow(double{o.beta2}, step);
  for (size_t i = 0; i < p.size(); ++i) {
    const double mi = double{o.beta1} * m[i] + (1.0 - o.beta1) * g[i];
    const double vi = double{o.beta2} * v[i] + (1.0 - o.beta2) * double{g[i]} * g[i];
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    double w = p[i];
    w -= double{o.lr} * o.weight_decay * w;
    w -= o.lr * (mi / bc1) / (std::sqrt(vi / bc2) + o.eps);
    p[i] = static_cast<float>(w);
  }
}

void SgdStep(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& velocity, float lr,
             float momentum) {
  for (size_t i = 0; i < p.size(); ++i) {
    double step = g[i];
    if (momentum != 0.0f) {
      step = double{momentum} * velocity[i] + step;
      velocity[i] = static_cast<float>(step);
    }
    p[i] = static_cast<float>(p[i] - double{lr} * step);
  }
}

std::vector<float> Permute0213(const std::vector<float>& in, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  std::vector<float> out(in.size());
  for (uint32_t i = 0; i < a; ++i) {
    for (uint32_t j = 0; j < b; ++j) {
      for (uint32_t k = 0; k < c; ++k) {
        for (uint32_t l = 0; l < d; ++l) {
          out[((size_t{i} * c + k) * b + j) * d + l] = in[((size_t{i} * b + j) * c + k) * d + l];
        }
      }
    }
  }
  return out;
}

}  // namespace causeway::reference
