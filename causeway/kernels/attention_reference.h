// CPU reference for causal self-attention (the `attention` kernels), for
// checking results: naive loops in double precision that materialize the
// T x T scores. Layout as the kernels: q, k, v, out and their gradients are
// [batch, heads, T, head_dim] row-major; lse is [batch, heads, T].
#ifndef CAUSEWAY_KERNELS_ATTENTION_REFERENCE_H_
#define CAUSEWAY_KERNELS_ATTENTION_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace causeway::reference {

// The sizes of one attention call. `scale` multiplies q.k (usually
// 1 / sqrt(head_dim)).
struct AttentionDims {
  uint32_t batch = 1;
  uint32_t heads = 1;
  uint32_t seq_len = 1;
  uint32_t head_dim = 1;
  float scale = 1.0f;
  // Elements of a [batch, heads, T, head_dim] tensor, and of lse.
  size_t elements() const { return size_t{batch} * heads * seq_len * head_dim; }
  size_t rows() const { return size_t{batch} * heads * seq_len; }
};

struct AttentionForwardResult {
  std::vector<float> out;  // [batch, heads, T, head_dim]
  std::vector<float> lse;  // [batch, heads, T]: log sum_{j <= i} exp(scale q_i.k_j)
};

// out[i] = sum_{j <= i} softmax_j(scale q_i.k_j) v[j] per (batch, head).
AttentionForwardResult AttentionForward(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const AttentionDims& dims);

struct AttentionGradients {
  std::vector<float> dq, dk, dv;  // each [batch, heads, T, head_dim]
};

// The exact gradients of sum(d_out * AttentionForward(q, k, v).out) with
// respect to q, k and v.
AttentionGradients AttentionBackward(const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const std::vector<float>& d_out,
                                     const AttentionDims& dims);

}  // namespace causeway::reference

#endif  // CAUSEWAY_KERNELS_ATTENTION_REFERENCE_H_
