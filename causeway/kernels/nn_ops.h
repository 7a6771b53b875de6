// Recording helpers for the model kernels (the layers of a decoder-only
// Transformer LM, forward and backward, and its optimizers; f32, row-major):
// each appends the dispatch(es) of one operation to a command list, with the
// workgroup counts that the kernel's header comment in shaders/ prescribes,
// after checking sizes and bound buffers (InvalidArgument naming the
// operation, the operand and the sizes expected and given). Nothing is
// appended when a check fails. Every result is reproducible run to run: no
// kernel uses atomics, and every sum has a fixed order.
//
// Example (a GELU MLP's activation, forward then backward):
//   CAUSEWAY_RETURN_IF_ERROR(ops::BiasGelu(*list, h, b, a, rows, cols));
//   ...
//   CAUSEWAY_RETURN_IF_ERROR(ops::BiasGeluBackward(*list, da, h, b, dh, db, rows, cols));
#ifndef CAUSEWAY_KERNELS_NN_OPS_H_
#define CAUSEWAY_KERNELS_NN_OPS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/runtime/command_list.h"

namespace causeway::ops {

// y[r, c] = gelu(x[r, c] + bias[c]) over [rows, cols] (GPT-2's tanh GELU).
absl::Status BiasGelu(CommandList& list, const BufferArg& x, const BufferArg& bias, const BufferArg& y,
                      uint32_t rows, uint32_t cols);
// dx = dy * gelu'(x + bias) (rows * cols), dbias = column sums of dx (cols).
absl::Status BiasGeluBackward(CommandList& list, const BufferArg& dy, const BufferArg& x,
                              const BufferArg& bias, const BufferArg& dx, const BufferArg& dbias,
                              uint32_t rows, uint32_t cols);

// Per row of [rows, cols]: y = (x - mean) * rstd * gamma + beta, saving mean
// and rstd (rows floats each) for the backward.
absl::Status LayerNorm(CommandList& list, const BufferArg& x, const BufferArg& gamma, const BufferArg& beta,
                       const BufferArg& y, const BufferArg& mean, const BufferArg& rstd, uint32_t rows,
                       uint32_t cols, float eps = 1e-5f);
// dx (rows * cols), dgamma and dbeta (cols each) from the forward's input x
// and its saved mean and rstd. Two dispatches.
absl::Status LayerNormBackward(CommandList& list, const BufferArg& dy, const BufferArg& x,
                               const BufferArg& gamma, const BufferArg& mean, const BufferArg& rstd,
                               const BufferArg& dx, const BufferArg& dgamma, const BufferArg& dbeta,
                               uint32_t rows, uint32_t cols);

// y = causal softmax of scale * x over [batch_heads, t, t] scores: position
// j > i of query i gets probability 0. x and y must not overlap.
absl::Status SoftmaxCausal(CommandList& list, const BufferArg& x, const BufferArg& y, uint32_t batch_heads,
                           uint32_t t, float scale);
// dx = scale * y * (dy - sum(dy * y)) per row, from the forward's output y.
absl::Status SoftmaxCausalBackward(CommandList& list, const BufferArg& y, const BufferArg& dy,
                                   const BufferArg& dx, uint32_t batch_heads, uint32_t t, float scale);

// loss[r] (rows floats) = softmax cross-entropy of logits [rows, vocab]
// against i32 targets (rows); NaN for a target outside [0, vocab). The mean
// is ReduceSum (ops.h) of `loss` divided by rows.
absl::Status CrossEntropy(CommandList& list, const BufferArg& logits, const BufferArg& targets,
                          const BufferArg& loss, uint32_t rows, uint32_t vocab);
// dlogits = scale * (softmax(logits) - onehot(targets)), where scale is
// 1 / rows (the gradient of the mean loss) unless given.
absl::Status CrossEntropyBackward(CommandList& list, const BufferArg& logits, const BufferArg& targets,
                                  const BufferArg& dlogits, uint32_t rows, uint32_t vocab,
                                  std::optional<float> scale = std::nullopt);

// out[t] = table[ids[t]] (+ pos[t % seq_len] when `pos` is given) for
// `tokens` i32 ids laid out as [batch, seq_len]; table is [vocab, dim], pos
// [seq_len, dim], out [tokens, dim]. An id outside [0, vocab) gives a NaN row.
absl::Status Embedding(CommandList& list, const BufferArg& ids, const BufferArg& table,
                       const std::optional<BufferArg>& pos, const BufferArg& out, uint32_t tokens,
                       uint32_t dim, uint32_t vocab, uint32_t seq_len);
// dtable [vocab, dim] = the scatter-add of dout [tokens, dim] by ids: the
// whole of dtable is overwritten; repeated ids accumulate, in token order.
absl::Status EmbeddingBackward(CommandList& list, const BufferArg& ids, const BufferArg& dout,
                               const BufferArg& dtable, uint32_t tokens, uint32_t dim, uint32_t vocab);
// dpos [seq_len, dim] = the sum of dout [tokens, dim] over the tokens at each
// position (tokens is a multiple of seq_len). Overwrites the whole of dpos.
absl::Status PositionEmbeddingBackward(CommandList& list, const BufferArg& dout, const BufferArg& dpos,
                                       uint32_t tokens, uint32_t dim, uint32_t seq_len);

// Hyperparameters of Adam; weight_decay > 0 makes it AdamW (decoupled decay).
struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};
// One Adam step on `count` floats of p, with gradient g and moments m and v
// (zero before step 1), all updated in place. `step` counts from 1.
absl::Status Adam(CommandList& list, const BufferArg& p, const BufferArg& g, const BufferArg& m,
                  const BufferArg& v, uint32_t count, uint32_t step, const AdamConfig& config);
// One SGD step in place: p -= lr * g, or with momentum != 0
// velocity = momentum * velocity + g, p -= lr * velocity (velocity required).
absl::Status Sgd(CommandList& list, const BufferArg& p, const BufferArg& g,
                 const std::optional<BufferArg>& velocity, uint32_t count, float lr, float momentum = 0.0f);

// out[a, c, b, d] = in[a, b, c, d] for [A, B, C, D] row-major floats: splits
// attention heads ([batch, T, heads, head_dim] -> [batch, heads, T,
// head_dim]) and merges them (the same with B and C swapped). in and out
// must not overlap.
absl::Status Permute0213(CommandList& list, const BufferArg& in, const BufferArg& out, uint32_t a, uint32_t b,
                         uint32_t c, uint32_t d);
// Adam as Adam() does it, with the step read from `step` (one float,
// counting from 1) and the new values written to p_out, m_out, v_out, which
// may be the buffers of p, m, v (in place): the form a program's function
// needs, since its push constants are fixed when it is built.
absl::Status AdamUpdate(CommandList& list, const BufferArg& p, const BufferArg& g, const BufferArg& m,
                        const BufferArg& v, const BufferArg& step, const BufferArg& p_out, const BufferArg& m_out,
                        const BufferArg& v_out, uint32_t count, const AdamConfig& config);
// One tensor of a multi-tensor Adam update: AdamUpdate's operands and count.
struct AdamTensor {
  BufferArg p, g, m, v, p_out, m_out, v_out;
  uint32_t count = 0;
};
// AdamUpdate on every tensor of `tensors` (at least one), with one dispatch
// per kAdamTensorsPerLaunch tensors: bit for bit the results of one
// AdamUpdate each.
inline constexpr size_t kAdamTensorsPerLaunch = 4;
// The storage buffers its kernel binds (DeviceCapabilities::max_storage_buffers
// must allow them).
inline constexpr uint32_t kAdamUpdateMultiBuffers = 29;
absl::Status AdamUpdateMulti(CommandList& list, absl::Span<const AdamTensor> tensors, const BufferArg& step,
                             const AdamConfig& config);

// The same operations as plans (op_plan.h), for functions of programs. The
// operands are those of the helpers above in their order; optional ones
// are present as the flags say (Embedding: pos when with_positions; Sgd:
// velocity when momentum != 0).
absl::StatusOr<OpPlan> PlanBiasGelu(uint32_t rows, uint32_t cols);
absl::StatusOr<OpPlan> PlanBiasGeluBackward(uint32_t rows, uint32_t cols);
absl::StatusOr<OpPlan> PlanLayerNorm(uint32_t rows, uint32_t cols, float eps);
absl::StatusOr<OpPlan> PlanLayerNormBackward(uint32_t rows, uint32_t cols);
absl::StatusOr<OpPlan> PlanSoftmaxCausal(uint32_t batch_heads, uint32_t t, float scale);
absl::StatusOr<OpPlan> PlanSoftmaxCausalBackward(uint32_t batch_heads, uint32_t t, float scale);
absl::StatusOr<OpPlan> PlanCrossEntropy(uint32_t rows, uint32_t vocab);
absl::StatusOr<OpPlan> PlanCrossEntropyBackward(uint32_t rows, uint32_t vocab, std::optional<float> scale = {});
absl::StatusOr<OpPlan> PlanEmbedding(uint32_t tokens, uint32_t dim, uint32_t vocab, uint32_t seq_len,
                                     bool with_positions);
absl::StatusOr<OpPlan> PlanEmbeddingBackward(uint32_t tokens, uint32_t dim, uint32_t vocab);
absl::StatusOr<OpPlan> PlanPositionEmbeddingBackward(uint32_t tokens, uint32_t dim, uint32_t seq_len);
absl::StatusOr<OpPlan> PlanAdam(uint32_t count, uint32_t step, const AdamConfig& config);
absl::StatusOr<OpPlan> PlanSgd(uint32_t count, float lr, float momentum = 0.0f);
absl::StatusOr<OpPlan> PlanPermute0213(uint32_t a, uint32_t b, uint32_t c, uint32_t d);
absl::StatusOr<OpPlan> PlanAdamUpdate(uint32_t count, const AdamConfig& config);
// AdamUpdateMulti for tensors of `counts` elements: operands p, g, m, v of
// each tensor in turn ("p0", "g0", "m0", "v0", "p1", ...), then "step", then
// p_out, m_out, v_out of each ("p_out0", "m_out0", "v_out0", "p_out1", ...).
absl::StatusOr<OpPlan> PlanAdamUpdateMulti(absl::Span<const uint32_t> counts, const AdamConfig& config);

}  // namespace causeway::ops

#endif  // CAUSEWAY_KERNELS_NN_OPS_H_
