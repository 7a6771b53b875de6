#include "runtime/nn_ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/builtin_kernels.h"
#include "runtime/status.h"

namespace causeway::ops {
namespace {

// Workgroup sizes: the kernels' defaults (see their header comments).
constexpr uint32_t kElementwiseLocal = 256;  // bias_gelu, embedding, adam, sgd
constexpr uint32_t kColumnLocal = 64;        // the column loops of the backwards
constexpr uint32_t kMaxGroups = 65535;

// Push constants of the kernels, laid out as in their .comp files.
struct RowsColsParams {
  uint32_t rows;
  uint32_t cols;
};
struct LayerNormParams {
  uint32_t rows;
  uint32_t cols;
  float eps;
};
struct RowsColsScaleParams {
  uint32_t rows;
  uint32_t cols;
  float scale;
};
struct EmbeddingParams {
  uint32_t tokens;
  uint32_t dim;
  uint32_t vocab;
  uint32_t seq_len;
  uint32_t use_pos;
};
struct EmbeddingBackwardParams {
  uint32_t tokens;
  uint32_t dim;
  uint32_t rows;
  uint32_t positional;
};
struct AdamParams {
  uint32_t count;
  uint32_t step;
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
};
struct SgdParams {
  uint32_t count;
  float lr;
  float momentum;
};

// One operand to check: its name, the bound range and the 32-bit elements the
// operation reads or writes there.
struct Operand {
  const char* name;
  const BufferArg* arg;
  uint64_t elements;
};

// InvalidArgument unless every operand is bound and large enough.
absl::Status CheckOperands(absl::string_view op, std::initializer_list<Operand> operands) {
  for (const Operand& o : operands) {
    if (o.arg->buffer == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", o.name, " is not bound"));
    if (o.arg->offset > o.arg->buffer->size() ||
        (o.arg->size != VK_WHOLE_SIZE && o.arg->offset + o.arg->size > o.arg->buffer->size())) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", o.name, " range [", o.arg->offset, ", +",
                                                     o.arg->size, ") exceeds its buffer of ",
                                                     o.arg->buffer->size(), " bytes"));
    }
    if (o.arg->resolved_size() < o.elements * 4) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", o.name, " needs ", o.elements * 4, " bytes (",
                                                     o.elements, " elements), got ", o.arg->resolved_size()));
    }
  }
  return absl::OkStatus();
}

// InvalidArgument unless a and b are > 0 and a * b indexes in 32 bits, as the
// kernels do.
absl::Status CheckShape(absl::string_view op, const char* a_name, uint32_t a, const char* b_name,
                        uint32_t b) {
  if (a == 0 || b == 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", a_name, " and ", b_name, " must be > 0, got ",
                                                   a_name, " ", a, ", ", b_name, " ", b));
  }
  if (uint64_t{a} * b > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", a_name, " * ", b_name, " = ", uint64_t{a} * b, " exceeds 2^32 - 1 elements"));
  }
  return absl::OkStatus();
}

uint32_t RowGroups(uint32_t rows) { return std::min(rows, kMaxGroups); }

}  // namespace

absl::Status BiasGelu(CommandList& list, const BufferArg& x, const BufferArg& bias, const BufferArg& y,
                      uint32_t rows, uint32_t cols) {
  constexpr absl::string_view kOp = "bias_gelu";
  RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  const uint64_t n = uint64_t{rows} * cols;
  RETURN_IF_ERROR(CheckOperands(kOp, {{"x", &x, n}, {"bias", &bias, cols}, {"y", &y, n}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {x, bias, y}, RowsColsParams{rows, cols}, Groups1D(n, kElementwiseLocal));
}

absl::Status BiasGeluBackward(CommandList& list, const BufferArg& dy, const BufferArg& x,
                              const BufferArg& bias, const BufferArg& dx, const BufferArg& dbias,
                              uint32_t rows, uint32_t cols) {
  constexpr absl::string_view kOp = "bias_gelu_backward";
  RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  const uint64_t n = uint64_t{rows} * cols;
  RETURN_IF_ERROR(CheckOperands(
      kOp, {{"dy", &dy, n}, {"x", &x, n}, {"bias", &bias, cols}, {"dx", &dx, n}, {"dbias", &dbias, cols}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {dy, x, bias, dx, dbias}, RowsColsParams{rows, cols},
                       Groups1D(cols, kColumnLocal));
}

absl::Status LayerNorm(CommandList& list, const BufferArg& x, const BufferArg& gamma, const BufferArg& beta,
                       const BufferArg& y, const BufferArg& mean, const BufferArg& rstd, uint32_t rows,
                       uint32_t cols, float eps) {
  constexpr absl::string_view kOp = "layer_norm";
  RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": eps must be finite and > 0, got ", eps));
  }
  const uint64_t n = uint64_t{rows} * cols;
  RETURN_IF_ERROR(CheckOperands(kOp, {{"x", &x, n},
                                      {"gamma", &gamma, cols},
                                      {"beta", &beta, cols},
                                      {"y", &y, n},
                                      {"mean", &mean, rows},
                                      {"rstd", &rstd, rows}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {x, gamma, beta, y, mean, rstd}, LayerNormParams{rows, cols, eps},
                       {RowGroups(rows), 1, 1});
}

absl::Status LayerNormBackward(CommandList& list, const BufferArg& dy, const BufferArg& x,
                               const BufferArg& gamma, const BufferArg& mean, const BufferArg& rstd,
                               const BufferArg& dx, const BufferArg& dgamma, const BufferArg& dbeta,
                               uint32_t rows, uint32_t cols) {
  constexpr absl::string_view kOp = "layer_norm_backward";
  RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  const uint64_t n = uint64_t{rows} * cols;
  RETURN_IF_ERROR(CheckOperands(kOp, {{"dy", &dy, n},
                                      {"x", &x, n},
                                      {"gamma", &gamma, cols},
                                      {"mean", &mean, rows},
                                      {"rstd", &rstd, rows},
                                      {"dx", &dx, n},
                                      {"dgamma", &dgamma, cols},
                                      {"dbeta", &dbeta, cols}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  const RowsColsParams params{rows, cols};
  RETURN_IF_ERROR(list.Dispatch(kernel, {dy, x, gamma, mean, rstd, dx, dgamma, dbeta}, params,
                                {RowGroups(rows), 1, 1}, {{1, 0}}));
  return list.Dispatch(kernel, {dy, x, gamma, mean, rstd, dx, dgamma, dbeta}, params,
                       Groups1D(cols, kColumnLocal), {{1, 1}});
}

absl::Status SoftmaxCausal(CommandList& list, const BufferArg& x, const BufferArg& y, uint32_t batch_heads,
                           uint32_t t, float scale) {
  constexpr absl::string_view kOp = "softmax_causal";
  RETURN_IF_ERROR(CheckShape(kOp, "batch_heads", batch_heads, "t", t));
  if (uint64_t{batch_heads} * t * t > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": batch_heads * t * t = ", uint64_t{batch_heads} * t * t, " exceeds 2^32 - 1 elements"));
  }
  if (!std::isfinite(scale)) return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite"));
  const uint32_t rows = batch_heads * t;
  const uint64_t n = uint64_t{rows} * t;
  RETURN_IF_ERROR(CheckOperands(kOp, {{"x", &x, n}, {"y", &y, n}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {x, y}, RowsColsScaleParams{rows, t, scale}, {RowGroups(rows), 1, 1});
}

absl::Status SoftmaxCausalBackward(CommandList& list, const BufferArg& y, const BufferArg& dy,
                                   const BufferArg& dx, uint32_t batch_heads, uint32_t t, float scale) {
  constexpr absl::string_view kOp = "softmax_causal_backward";
  RETURN_IF_ERROR(CheckShape(kOp, "batch_heads", batch_heads, "t", t));
  if (uint64_t{batch_heads} * t * t > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": batch_heads * t * t = ", uint64_t{batch_heads} * t * t, " exceeds 2^32 - 1 elements"));
  }
  if (!std::isfinite(scale)) return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite"));
  const uint32_t rows = batch_heads * t;
  const uint64_t n = uint64_t{rows} * t;
  RETURN_IF_ERROR(CheckOperands(kOp, {{"y", &y, n}, {"dy", &dy, n}, {"dx", &dx, n}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {y, dy, dx}, RowsColsScaleParams{rows, t, scale}, {RowGroups(rows), 1, 1});
}

absl::Status CrossEntropy(CommandList& list, const BufferArg& logits, const BufferArg& targets,
                          const BufferArg& loss, uint32_t rows, uint32_t vocab) {
  constexpr absl::string_view kOp = "cross_entropy";
  RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "vocab", vocab));
  if (vocab > uint32_t{std::numeric_limits<int32_t>::max()}) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": vocab ", vocab, " exceeds i32 targets"));
  }
  RETURN_IF_ERROR(CheckOperands(
      kOp,
      {{"logits", &logits, uint64_t{rows} * vocab}, {"targets", &targets, rows}, {"loss", &loss, rows}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {logits, targets, loss}, RowsColsParams{rows, vocab}, {RowGroups(rows), 1, 1});
}

absl::Status CrossEntropyBackward(CommandList& list, const BufferArg& logits, const BufferArg& targets,
                                  const BufferArg& dlogits, uint32_t rows, uint32_t vocab,
                                  std::optional<float> scale) {
  constexpr absl::string_view kOp = "cross_entropy_backward";
  RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "vocab", vocab));
  if (vocab > uint32_t{std::numeric_limits<int32_t>::max()}) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": vocab ", vocab, " exceeds i32 targets"));
  }
  const float s = scale.value_or(1.0f / static_cast<float>(rows));
  if (!std::isfinite(s)) return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite"));
  const uint64_t n = uint64_t{rows} * vocab;
  RETURN_IF_ERROR(
      CheckOperands(kOp, {{"logits", &logits, n}, {"targets", &targets, rows}, {"dlogits", &dlogits, n}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {logits, targets, dlogits}, RowsColsScaleParams{rows, vocab, s},
                       {RowGroups(rows), 1, 1});
}

absl::Status Embedding(CommandList& list, const BufferArg& ids, const BufferArg& table,
                       const std::optional<BufferArg>& pos, const BufferArg& out, uint32_t tokens,
                       uint32_t dim, uint32_t vocab, uint32_t seq_len) {
  constexpr absl::string_view kOp = "embedding";
  RETURN_IF_ERROR(CheckShape(kOp, "tokens", tokens, "dim", dim));
  RETURN_IF_ERROR(CheckShape(kOp, "vocab", vocab, "dim", dim));
  RETURN_IF_ERROR(CheckShape(kOp, "seq_len", seq_len, "dim", dim));
  RETURN_IF_ERROR(CheckOperands(kOp, {{"ids", &ids, tokens},
                                      {"table", &table, uint64_t{vocab} * dim},
                                      {"out", &out, uint64_t{tokens} * dim}}));
  if (pos.has_value()) RETURN_IF_ERROR(CheckOperands(kOp, {{"pos", &*pos, uint64_t{seq_len} * dim}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  // Without a position table the kernel never reads binding 2; the token
  // table stands in for it.
  return list.Dispatch(kernel, {ids, table, pos.value_or(table), out},
                       EmbeddingParams{tokens, dim, vocab, seq_len, pos.has_value() ? 1u : 0u},
                       Groups1D(uint64_t{tokens} * dim, kElementwiseLocal));
}

absl::Status EmbeddingBackward(CommandList& list, const BufferArg& ids, const BufferArg& dout,
                               const BufferArg& dtable, uint32_t tokens, uint32_t dim, uint32_t vocab) {
  constexpr absl::string_view kOp = "embedding_backward";
  RETURN_IF_ERROR(CheckShape(kOp, "tokens", tokens, "dim", dim));
  RETURN_IF_ERROR(CheckShape(kOp, "vocab", vocab, "dim", dim));
  RETURN_IF_ERROR(CheckOperands(kOp, {{"ids", &ids, tokens},
                                      {"dout", &dout, uint64_t{tokens} * dim},
                                      {"dtable", &dtable, uint64_t{vocab} * dim}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(kernel, {ids, dout, dtable}, EmbeddingBackwardParams{tokens, dim, vocab, 0},
                       Groups1D(dim, kColumnLocal));
}

absl::Status PositionEmbeddingBackward(CommandList& list, const BufferArg& dout, const BufferArg& dpos,
                                       uint32_t tokens, uint32_t dim, uint32_t seq_len) {
  constexpr absl::string_view kOp = "embedding_backward (positions)";
  RETURN_IF_ERROR(CheckShape(kOp, "tokens", tokens, "dim", dim));
  RETURN_IF_ERROR(CheckShape(kOp, "seq_len", seq_len, "dim", dim));
  if (tokens % seq_len != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": tokens (", tokens, ") must be a multiple of seq_len (", seq_len, ")"));
  }
  RETURN_IF_ERROR(CheckOperands(
      kOp, {{"dout", &dout, uint64_t{tokens} * dim}, {"dpos", &dpos, uint64_t{seq_len} * dim}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("embedding_backward"));
  // Positional mode never reads the ids binding; dout stands in for it.
  return list.Dispatch(kernel, {dout, dout, dpos}, EmbeddingBackwardParams{tokens, dim, seq_len, 1},
                       Groups1D(dim, kColumnLocal));
}

absl::Status Adam(CommandList& list, const BufferArg& p, const BufferArg& g, const BufferArg& m,
                  const BufferArg& v, uint32_t count, uint32_t step, const AdamConfig& config) {
  constexpr absl::string_view kOp = "adam";
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": count must be > 0"));
  if (step == 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": step counts from 1, got 0"));
  if (!(config.beta1 >= 0.0f && config.beta1 < 1.0f) || !(config.beta2 >= 0.0f && config.beta2 < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": beta1 and beta2 must be in [0, 1), got ", config.beta1, " and ", config.beta2));
  }
  if (!(config.eps > 0.0f) || !std::isfinite(config.lr) || !std::isfinite(config.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": needs eps > 0 and finite lr and weight_decay, got eps ", config.eps, ", lr ",
                     config.lr, ", weight_decay ", config.weight_decay));
  }
  RETURN_IF_ERROR(
      CheckOperands(kOp, {{"p", &p, count}, {"g", &g, count}, {"m", &m, count}, {"v", &v, count}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  return list.Dispatch(
      kernel, {p, g, m, v},
      AdamParams{count, step, config.lr, config.beta1, config.beta2, config.eps, config.weight_decay},
      Groups1D(count, kElementwiseLocal));
}

absl::Status Sgd(CommandList& list, const BufferArg& p, const BufferArg& g,
                 const std::optional<BufferArg>& velocity, uint32_t count, float lr, float momentum) {
  constexpr absl::string_view kOp = "sgd";
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": count must be > 0"));
  if (!std::isfinite(lr) || !std::isfinite(momentum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": lr and momentum must be finite, got ", lr, ", ", momentum));
  }
  if (momentum != 0.0f && !velocity.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": momentum ", momentum, " needs a velocity buffer"));
  }
  RETURN_IF_ERROR(CheckOperands(kOp, {{"p", &p, count}, {"g", &g, count}}));
  if (velocity.has_value()) RETURN_IF_ERROR(CheckOperands(kOp, {{"velocity", &*velocity, count}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(kOp));
  // Without momentum the kernel never touches binding 2; g stands in for it.
  return list.Dispatch(kernel, {p, g, velocity.value_or(g)}, SgdParams{count, lr, momentum},
                       Groups1D(count, kElementwiseLocal));
}

}  // namespace causeway::ops
