// CPU references of the model kernels in shaders/ (bias_gelu, layer_norm,
// softmax_causal, cross_entropy, embedding, the optimizers and their
// backwards), for checking results. Plain loops that accumulate in double and
// round once to float; matrices are row-major. Each function states the kernel
// it mirrors; the kernel's header comment is the contract.
#ifndef CAUSEWAY_KERNELS_NN_REFERENCE_H_
#define CAUSEWAY_KERNELS_NN_REFERENCE_H_

#include <cstdint>
#include <vector>

namespace causeway::reference {

// GPT-2's tanh approximation of GELU and its derivative.
double Gelu(double u);
double GeluGrad(double u);

// bias_gelu: y[r, c] = gelu(x[r, c] + bias[c]) over [rows, cols].
std::vector<float> BiasGelu(const std::vector<float>& x, const std::vector<float>& bias, uint32_t rows,
                            uint32_t cols);
struct BiasGeluGrads {
  std::vector<float> dx;     // rows * cols
  std::vector<float> dbias;  // cols
};
// bias_gelu_backward: dx = dy * gelu'(x + bias), dbias = column sums of dx.
BiasGeluGrads BiasGeluBackward(const std::vector<float>& dy, const std::vector<float>& x,
                               const std::vector<float>& bias, uint32_t rows, uint32_t cols);

struct LayerNormResult {
  std::vector<float> y;     // rows * cols
  std::vector<float> mean;  // rows
  std::vector<float> rstd;  // rows: 1 / sqrt(biased variance + eps)
};
// layer_norm: y = (x - mean) * rstd * gamma + beta per row.
LayerNormResult LayerNorm(const std::vector<float>& x, const std::vector<float>& gamma,
                          const std::vector<float>& beta, uint32_t rows, uint32_t cols, float eps);
struct LayerNormGrads {
  std::vector<float> dx;      // rows * cols
  std::vector<float> dgamma;  // cols
  std::vector<float> dbeta;   // cols
};
// layer_norm_backward, from the forward's saved mean and rstd.
LayerNormGrads LayerNormBackward(const std::vector<float>& dy, const std::vector<float>& x,
                                 const std::vector<float>& gamma, const std::vector<float>& mean,
                                 const std::vector<float>& rstd, uint32_t rows, uint32_t cols);

// softmax_causal over [rows, t] scores, rows = batch * heads * t; row r is
// query position r % t and sees columns 0..r % t.
std::vector<float> SoftmaxCausal(const std::vector<float>& x, uint32_t rows, uint32_t t, float scale);
// softmax_causal_backward: dx = scale * y * (dy - sum(dy * y)) per row.
std::vector<float> SoftmaxCausalBackward(const std::vector<float>& y, const std::vector<float>& dy,
                                         uint32_t rows, uint32_t t, float scale);

// cross_entropy: per-row loss of [rows, vocab] logits against targets.
std::vector<float> CrossEntropy(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                uint32_t rows, uint32_t vocab);
// cross_entropy_backward: dlogits = scale * (softmax - onehot).
std::vector<float> CrossEntropyBackward(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                        uint32_t rows, uint32_t vocab, float scale);

// embedding: out[t] = table[ids[t]] (+ pos[t % seq_len] if `pos` is not empty).
std::vector<float> Embedding(const std::vector<int32_t>& ids, const std::vector<float>& table,
                             const std::vector<float>& pos, uint32_t dim, uint32_t seq_len);
// embedding_backward: dtable[r] = sum of dout[t] over tokens with ids[t] == r
// (rows = the table's rows). Ids outside [0, rows) are skipped.
std::vector<float> EmbeddingBackward(const std::vector<int32_t>& ids, const std::vector<float>& dout,
                                     uint32_t dim, uint32_t rows);

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // AdamW's decoupled decay
};
// adam: one AdamW step `step` (from 1) on p, m, v in place.
void AdamStep(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m,
              std::vector<float>& v, uint32_t step, const AdamOptions& options);
// sgd: one step in place; `velocity` is used only when momentum != 0.
void SgdStep(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& velocity, float lr,
             float momentum);

// permute_0213: out[a, c, b, d] = in[a, b, c, d] for sizes [A, B, C, D].
std::vector<float> Permute0213(const std::vector<float>& in, uint32_t a, uint32_t b, uint32_t c, uint32_t d);

}  // namespace causeway::reference

#endif  // CAUSEWAY_KERNELS_NN_REFERENCE_H_
