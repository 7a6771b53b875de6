#include "causeway/kernels/nn_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "causeway/base/status.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/kernels/op_plan.h"

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

// layer_norm, cross_entropy and their backwards take a row per invocation
// when rows are at most this wide: a workgroup's tree sum costs about
// 2 log2(wg) barriers a row, more than a narrow row has elements to add (on
// lavapipe a barrier is a switch between coroutines). Wider rows take a
// workgroup each.
constexpr uint32_t kRowPerInvocationMaxCols = 256;
constexpr uint32_t kRowLocal = 64;  // the row kernels' default workgroup size

// The groups of a row kernel in the form `row_per_invocation` picks.
std::array<uint32_t, 3> RowKernelGroups(uint32_t rows, bool row_per_invocation) {
  if (!row_per_invocation) return {RowGroups(rows), 1, 1};
  return {std::min((rows + kRowLocal - 1) / kRowLocal, kMaxGroups), 1, 1};
}

// permute_0213 moves a row of D elements per invocation when D is at most
// this and there are at least kPermuteMinRows rows.
constexpr uint32_t kPermuteMaxRow = 1024;
constexpr uint64_t kPermuteMinRows = 1024;

// layer_norm_backward's column pass: invocations per column (kLanes in the
// kernel), and so columns per workgroup.
constexpr uint32_t kColumnLanes = 4;

}  // namespace


namespace {

OpPlan::Operand Floats(std::string name, uint64_t elements) { return {std::move(name), elements * 4}; }

// A plan of one launch of `kernel` that binds the operands in their order.
OpPlan OneLaunch(std::string name, std::string kernel, std::vector<OpPlan::Operand> operands,
                 std::vector<uint8_t> push_constants, std::array<uint32_t, 3> groups, SpecValues spec = {}) {
  OpPlan plan{std::move(name), std::move(operands), {}};
  Launch launch{std::move(kernel), {}, std::move(push_constants), groups, std::move(spec)};
  for (size_t i = 0; i < plan.operands.size(); ++i) launch.operands.push_back(static_cast<int>(i));
  plan.launches.push_back(std::move(launch));
  return plan;
}

std::string Sized(absl::string_view op, uint32_t a, uint32_t b) { return absl::StrCat(op, " ", a, "x", b); }

}  // namespace

absl::StatusOr<OpPlan> PlanBiasGelu(uint32_t rows, uint32_t cols) {
  constexpr absl::string_view kOp = "bias_gelu";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  const uint64_t n = uint64_t{rows} * cols;
  return OneLaunch(Sized(kOp, rows, cols), std::string(kOp), {Floats("x", n), Floats("bias", cols), Floats("y", n)},
                   PushBytes(RowsColsParams{rows, cols}), Groups1D(n, kElementwiseLocal));
}

absl::StatusOr<OpPlan> PlanBiasGeluBackward(uint32_t rows, uint32_t cols) {
  constexpr absl::string_view kOp = "bias_gelu_backward";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  const uint64_t n = uint64_t{rows} * cols;
  return OneLaunch(Sized(kOp, rows, cols), std::string(kOp),
                   {Floats("dy", n), Floats("x", n), Floats("bias", cols), Floats("dx", n), Floats("dbias", cols)},
                   PushBytes(RowsColsParams{rows, cols}), Groups1D(cols, kColumnLocal));
}

absl::StatusOr<OpPlan> PlanLayerNorm(uint32_t rows, uint32_t cols, float eps) {
  constexpr absl::string_view kOp = "layer_norm";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": eps must be finite and > 0, got ", eps));
  }
  const uint64_t n = uint64_t{rows} * cols;
  const bool per_invocation = cols <= kRowPerInvocationMaxCols;
  return OneLaunch(Sized(kOp, rows, cols), std::string(kOp),
                   {Floats("x", n), Floats("gamma", cols), Floats("beta", cols), Floats("y", n),
                    Floats("mean", rows), Floats("rstd", rows)},
                   PushBytes(LayerNormParams{rows, cols, eps}), RowKernelGroups(rows, per_invocation),
                   {{1, per_invocation ? 1u : 0u}});
}

absl::StatusOr<OpPlan> PlanLayerNormBackward(uint32_t rows, uint32_t cols) {
  constexpr absl::string_view kOp = "layer_norm_backward";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "rows", rows, "cols", cols));
  const uint64_t n = uint64_t{rows} * cols;
  const bool per_invocation = cols <= kRowPerInvocationMaxCols;
  OpPlan plan =
      OneLaunch(Sized(kOp, rows, cols), std::string(kOp),
                {Floats("dy", n), Floats("x", n), Floats("gamma", cols), Floats("mean", rows),
                 Floats("rstd", rows), Floats("dx", n), Floats("dgamma", cols), Floats("dbeta", cols)},
                PushBytes(RowsColsParams{rows, cols}), RowKernelGroups(rows, per_invocation),
                {{1, 0}, {2, per_invocation ? 1u : 0u}});
  // Pass 1: dgamma and dbeta, kColumnLanes invocations per column.
  Launch columns = plan.launches[0];
  columns.groups = Groups1D(cols, kColumnLocal / kColumnLanes);
  columns.spec = {{1, 1}};
  plan.launches.push_back(std::move(columns));
  return plan;
}

namespace {

absl::Status CheckScores(absl::string_view op, uint32_t batch_heads, uint32_t t, float scale) {
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(op, "batch_heads", batch_heads, "t", t));
  if (uint64_t{batch_heads} * t * t > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": batch_heads * t * t = ", uint64_t{batch_heads} * t * t, " exceeds 2^32 - 1 elements"));
  }
  if (!std::isfinite(scale)) return absl::InvalidArgumentError(absl::StrCat(op, ": scale must be finite"));
  return absl::OkStatus();
}

absl::Status CheckVocab(absl::string_view op, uint32_t rows, uint32_t vocab) {
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(op, "rows", rows, "vocab", vocab));
  if (vocab > uint32_t{std::numeric_limits<int32_t>::max()}) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": vocab ", vocab, " exceeds i32 targets"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpPlan> PlanSoftmaxCausal(uint32_t batch_heads, uint32_t t, float scale) {
  constexpr absl::string_view kOp = "softmax_causal";
  CAUSEWAY_RETURN_IF_ERROR(CheckScores(kOp, batch_heads, t, scale));
  const uint32_t rows = batch_heads * t;
  const uint64_t n = uint64_t{rows} * t;
  return OneLaunch(Sized(kOp, batch_heads, t), std::string(kOp), {Floats("x", n), Floats("y", n)},
                   PushBytes(RowsColsScaleParams{rows, t, scale}), {RowGroups(rows), 1, 1});
}

absl::StatusOr<OpPlan> PlanSoftmaxCausalBackward(uint32_t batch_heads, uint32_t t, float scale) {
  constexpr absl::string_view kOp = "softmax_causal_backward";
  CAUSEWAY_RETURN_IF_ERROR(CheckScores(kOp, batch_heads, t, scale));
  const uint32_t rows = batch_heads * t;
  const uint64_t n = uint64_t{rows} * t;
  return OneLaunch(Sized(kOp, batch_heads, t), std::string(kOp), {Floats("y", n), Floats("dy", n), Floats("dx", n)},
                   PushBytes(RowsColsScaleParams{rows, t, scale}), {RowGroups(rows), 1, 1});
}

absl::StatusOr<OpPlan> PlanCrossEntropy(uint32_t rows, uint32_t vocab) {
  constexpr absl::string_view kOp = "cross_entropy";
  CAUSEWAY_RETURN_IF_ERROR(CheckVocab(kOp, rows, vocab));
  const bool per_invocation = vocab <= kRowPerInvocationMaxCols;
  return OneLaunch(Sized(kOp, rows, vocab), std::string(kOp),
                   {Floats("logits", uint64_t{rows} * vocab), Floats("targets", rows), Floats("loss", rows)},
                   PushBytes(RowsColsParams{rows, vocab}), RowKernelGroups(rows, per_invocation),
                   {{1, per_invocation ? 1u : 0u}});
}

absl::StatusOr<OpPlan> PlanCrossEntropyBackward(uint32_t rows, uint32_t vocab, std::optional<float> scale) {
  constexpr absl::string_view kOp = "cross_entropy_backward";
  CAUSEWAY_RETURN_IF_ERROR(CheckVocab(kOp, rows, vocab));
  const float s = scale.value_or(1.0f / static_cast<float>(rows));
  if (!std::isfinite(s)) return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite"));
  const uint64_t n = uint64_t{rows} * vocab;
  const bool per_invocation = vocab <= kRowPerInvocationMaxCols;
  return OneLaunch(Sized(kOp, rows, vocab), std::string(kOp),
                   {Floats("logits", n), Floats("targets", rows), Floats("dlogits", n)},
                   PushBytes(RowsColsScaleParams{rows, vocab, s}), RowKernelGroups(rows, per_invocation),
                   {{1, per_invocation ? 1u : 0u}});
}

absl::StatusOr<OpPlan> PlanEmbedding(uint32_t tokens, uint32_t dim, uint32_t vocab, uint32_t seq_len,
                                     bool with_positions) {
  constexpr absl::string_view kOp = "embedding";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "tokens", tokens, "dim", dim));
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "vocab", vocab, "dim", dim));
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "seq_len", seq_len, "dim", dim));
  std::vector<OpPlan::Operand> operands = {Floats("ids", tokens), Floats("table", uint64_t{vocab} * dim)};
  if (with_positions) operands.push_back(Floats("pos", uint64_t{seq_len} * dim));
  operands.push_back(Floats("out", uint64_t{tokens} * dim));
  OpPlan plan = OneLaunch(Sized(kOp, tokens, dim), std::string(kOp), std::move(operands),
                          PushBytes(EmbeddingParams{tokens, dim, vocab, seq_len, with_positions ? 1u : 0u}),
                          Groups1D(uint64_t{tokens} * dim, kElementwiseLocal));
  // Without a position table the kernel never reads binding 2; the token
  // table stands in for it.
  if (!with_positions) plan.launches[0].operands = {0, 1, 1, 2};
  return plan;
}

absl::StatusOr<OpPlan> PlanEmbeddingBackward(uint32_t tokens, uint32_t dim, uint32_t vocab) {
  constexpr absl::string_view kOp = "embedding_backward";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "tokens", tokens, "dim", dim));
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "vocab", vocab, "dim", dim));
  return OneLaunch(Sized(kOp, tokens, dim), std::string(kOp),
                   {Floats("ids", tokens), Floats("dout", uint64_t{tokens} * dim),
                    Floats("dtable", uint64_t{vocab} * dim)},
                   PushBytes(EmbeddingBackwardParams{tokens, dim, vocab, 0}), Groups1D(dim, kColumnLocal));
}

absl::StatusOr<OpPlan> PlanPositionEmbeddingBackward(uint32_t tokens, uint32_t dim, uint32_t seq_len) {
  constexpr absl::string_view kOp = "embedding_backward (positions)";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "tokens", tokens, "dim", dim));
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, "seq_len", seq_len, "dim", dim));
  if (tokens % seq_len != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": tokens (", tokens, ") must be a multiple of seq_len (", seq_len, ")"));
  }
  OpPlan plan = OneLaunch(Sized(kOp, tokens, dim), "embedding_backward",
                          {Floats("dout", uint64_t{tokens} * dim), Floats("dpos", uint64_t{seq_len} * dim)},
                          PushBytes(EmbeddingBackwardParams{tokens, dim, seq_len, 1}), Groups1D(dim, kColumnLocal));
  // Positional mode never reads the ids binding; dout stands in for it.
  plan.launches[0].operands = {0, 0, 1};
  return plan;
}

namespace {

struct Permute0213Params {
  uint32_t a, b, c, d;
};
struct AdamUpdateParams {
  uint32_t count;
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
};

absl::Status CheckAdam(absl::string_view op, uint32_t count, const AdamConfig& config) {
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(op, ": count must be > 0"));
  if (!(config.beta1 >= 0.0f && config.beta1 < 1.0f) || !(config.beta2 >= 0.0f && config.beta2 < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": beta1 and beta2 must be in [0, 1), got ", config.beta1, " and ", config.beta2));
  }
  if (!(config.eps > 0.0f) || !std::isfinite(config.lr) || !std::isfinite(config.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": needs eps > 0 and finite lr and weight_decay, got eps ", config.eps, ", lr ",
                     config.lr, ", weight_decay ", config.weight_decay));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpPlan> PlanAdam(uint32_t count, uint32_t step, const AdamConfig& config) {
  constexpr absl::string_view kOp = "adam";
  CAUSEWAY_RETURN_IF_ERROR(CheckAdam(kOp, count, config));
  if (step == 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": step counts from 1, got 0"));
  return OneLaunch(absl::StrCat(kOp, " ", count), std::string(kOp),
                   {Floats("p", count), Floats("g", count), Floats("m", count), Floats("v", count)},
                   PushBytes(AdamParams{count, step, config.lr, config.beta1, config.beta2, config.eps,
                                        config.weight_decay}),
                   Groups1D(count, kElementwiseLocal));
}

absl::StatusOr<OpPlan> PlanSgd(uint32_t count, float lr, float momentum) {
  constexpr absl::string_view kOp = "sgd";
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": count must be > 0"));
  if (!std::isfinite(lr) || !std::isfinite(momentum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": lr and momentum must be finite, got ", lr, ", ", momentum));
  }
  std::vector<OpPlan::Operand> operands = {Floats("p", count), Floats("g", count)};
  if (momentum != 0.0f) operands.push_back(Floats("velocity", count));
  OpPlan plan = OneLaunch(absl::StrCat(kOp, " ", count), std::string(kOp), std::move(operands),
                          PushBytes(SgdParams{count, lr, momentum}), Groups1D(count, kElementwiseLocal));
  // Without momentum the kernel never touches binding 2; g stands in for it.
  if (momentum == 0.0f) plan.launches[0].operands = {0, 1, 1};
  return plan;
}

absl::Status BiasGelu(CommandList& list, const BufferArg& x, const BufferArg& bias, const BufferArg& y,
                      uint32_t rows, uint32_t cols) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanBiasGelu(rows, cols));
  return Record(list, plan, {x, bias, y});
}

absl::Status BiasGeluBackward(CommandList& list, const BufferArg& dy, const BufferArg& x,
                              const BufferArg& bias, const BufferArg& dx, const BufferArg& dbias,
                              uint32_t rows, uint32_t cols) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanBiasGeluBackward(rows, cols));
  return Record(list, plan, {dy, x, bias, dx, dbias});
}

absl::Status LayerNorm(CommandList& list, const BufferArg& x, const BufferArg& gamma, const BufferArg& beta,
                       const BufferArg& y, const BufferArg& mean, const BufferArg& rstd, uint32_t rows,
                       uint32_t cols, float eps) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanLayerNorm(rows, cols, eps));
  return Record(list, plan, {x, gamma, beta, y, mean, rstd});
}

absl::Status LayerNormBackward(CommandList& list, const BufferArg& dy, const BufferArg& x,
                               const BufferArg& gamma, const BufferArg& mean, const BufferArg& rstd,
                               const BufferArg& dx, const BufferArg& dgamma, const BufferArg& dbeta,
                               uint32_t rows, uint32_t cols) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanLayerNormBackward(rows, cols));
  return Record(list, plan, {dy, x, gamma, mean, rstd, dx, dgamma, dbeta});
}

absl::Status SoftmaxCausal(CommandList& list, const BufferArg& x, const BufferArg& y, uint32_t batch_heads,
                           uint32_t t, float scale) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanSoftmaxCausal(batch_heads, t, scale));
  return Record(list, plan, {x, y});
}

absl::Status SoftmaxCausalBackward(CommandList& list, const BufferArg& y, const BufferArg& dy,
                                   const BufferArg& dx, uint32_t batch_heads, uint32_t t, float scale) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanSoftmaxCausalBackward(batch_heads, t, scale));
  return Record(list, plan, {y, dy, dx});
}

absl::Status CrossEntropy(CommandList& list, const BufferArg& logits, const BufferArg& targets,
                          const BufferArg& loss, uint32_t rows, uint32_t vocab) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanCrossEntropy(rows, vocab));
  return Record(list, plan, {logits, targets, loss});
}

absl::Status CrossEntropyBackward(CommandList& list, const BufferArg& logits, const BufferArg& targets,
                                  const BufferArg& dlogits, uint32_t rows, uint32_t vocab,
                                  std::optional<float> scale) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanCrossEntropyBackward(rows, vocab, scale));
  return Record(list, plan, {logits, targets, dlogits});
}

absl::Status Embedding(CommandList& list, const BufferArg& ids, const BufferArg& table,
                       const std::optional<BufferArg>& pos, const BufferArg& out, uint32_t tokens,
                       uint32_t dim, uint32_t vocab, uint32_t seq_len) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanEmbedding(tokens, dim, vocab, seq_len, pos.has_value()));
  if (pos.has_value()) return Record(list, plan, {ids, table, *pos, out});
  return Record(list, plan, {ids, table, out});
}

absl::Status EmbeddingBackward(CommandList& list, const BufferArg& ids, const BufferArg& dout,
                               const BufferArg& dtable, uint32_t tokens, uint32_t dim, uint32_t vocab) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanEmbeddingBackward(tokens, dim, vocab));
  return Record(list, plan, {ids, dout, dtable});
}

absl::Status PositionEmbeddingBackward(CommandList& list, const BufferArg& dout, const BufferArg& dpos,
                                       uint32_t tokens, uint32_t dim, uint32_t seq_len) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanPositionEmbeddingBackward(tokens, dim, seq_len));
  return Record(list, plan, {dout, dpos});
}

absl::Status Adam(CommandList& list, const BufferArg& p, const BufferArg& g, const BufferArg& m,
                  const BufferArg& v, uint32_t count, uint32_t step, const AdamConfig& config) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanAdam(count, step, config));
  return Record(list, plan, {p, g, m, v});
}

absl::Status Sgd(CommandList& list, const BufferArg& p, const BufferArg& g,
                 const std::optional<BufferArg>& velocity, uint32_t count, float lr, float momentum) {
  if (momentum != 0.0f && !velocity.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("sgd: momentum ", momentum, " needs a velocity buffer"));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanSgd(count, lr, momentum));
  if (momentum != 0.0f) return Record(list, plan, {p, g, *velocity});
  return Record(list, plan, {p, g});
}

absl::StatusOr<OpPlan> PlanPermute0213(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  constexpr absl::string_view kOp = "permute_0213";
  const std::string name = absl::StrCat(kOp, " [", a, ", ", b, ", ", c, ", ", d, "]");
  if (a == 0 || b == 0 || c == 0 || d == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": every size must be > 0"));
  }
  // Multiplied one size at a time, so that no product overflows 64 bits
  // before it is checked: the kernel indexes in 32.
  constexpr uint64_t kMaxElements = std::numeric_limits<uint32_t>::max();
  uint64_t n = 1;
  for (uint32_t size : {a, b, c, d}) {
    n *= size;
    if (n > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": more than 2^32 - 1 elements"));
    }
  }
  // A row of D elements per invocation unless rows are long (a loop past
  // about 65535 iterations is cut short on llvmpipe) or too few to fill a
  // device's invocations.
  const uint64_t rows = n / d;
  const bool per_row = d <= kPermuteMaxRow && rows >= kPermuteMinRows;
  return OneLaunch(name, std::string(kOp), {Floats("in", n), Floats("out", n)},
                   PushBytes(Permute0213Params{a, b, c, d}), Groups1D(per_row ? rows : n, kElementwiseLocal),
                   {{1, per_row ? 1u : 0u}});
}

absl::Status Permute0213(CommandList& list, const BufferArg& in, const BufferArg& out, uint32_t a, uint32_t b,
                         uint32_t c, uint32_t d) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanPermute0213(a, b, c, d));
  return Record(list, plan, {in, out});
}

absl::StatusOr<OpPlan> PlanAdamUpdate(uint32_t count, const AdamConfig& config) {
  constexpr absl::string_view kOp = "adam_update";
  CAUSEWAY_RETURN_IF_ERROR(CheckAdam(kOp, count, config));
  return OneLaunch(absl::StrCat(kOp, " ", count), std::string(kOp),
                   {Floats("p", count), Floats("g", count), Floats("m", count), Floats("v", count),
                    Floats("step", 1), Floats("p_out", count), Floats("m_out", count), Floats("v_out", count)},
                   PushBytes(AdamUpdateParams{count, config.lr, config.beta1, config.beta2, config.eps,
                                              config.weight_decay}),
                   Groups1D(count, kElementwiseLocal));
}

namespace {

// Push constants of adam_update_multi.
struct AdamUpdateMultiParams {
  uint32_t count[kAdamTensorsPerLaunch];
  uint32_t first_group[kAdamTensorsPerLaunch];
  uint32_t groups[kAdamTensorsPerLaunch];
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
};
// Groups per tensor at most: the four tensors' together stay within the
// 65535 groups every device dispatches in x.
constexpr uint32_t kAdamMultiMaxGroups = 65535 / kAdamTensorsPerLaunch;

}  // namespace

absl::StatusOr<OpPlan> PlanAdamUpdateMulti(absl::Span<const uint32_t> counts, const AdamConfig& config) {
  constexpr absl::string_view kOp = "adam_update_multi";
  if (counts.empty()) return absl::InvalidArgumentError(absl::StrCat(kOp, ": needs at least one tensor"));
  const size_t n = counts.size();
  OpPlan plan;
  plan.name = absl::StrCat(kOp, " ", absl::StrJoin(counts, "+"));
  for (size_t t = 0; t < n; ++t) {
    CAUSEWAY_RETURN_IF_ERROR(CheckAdam(absl::StrCat(kOp, " tensor ", t), counts[t], config));
    for (const char* name : {"p", "g", "m", "v"})
      plan.operands.push_back(Floats(absl::StrCat(name, t), counts[t]));
  }
  const int step = static_cast<int>(plan.operands.size());
  plan.operands.push_back(Floats("step", 1));
  for (size_t t = 0; t < n; ++t) {
    for (const char* name : {"p_out", "m_out", "v_out"}) {
      plan.operands.push_back(Floats(absl::StrCat(name, t), counts[t]));
    }
  }
  auto input = [](size_t t, int k) { return static_cast<int>(4 * t) + k; };
  auto output = [step](size_t t, int k) { return step + 1 + static_cast<int>(3 * t) + k; };
  for (size_t first = 0; first < n; first += kAdamTensorsPerLaunch) {
    const size_t used = std::min(kAdamTensorsPerLaunch, n - first);
    AdamUpdateMultiParams params{{},           {},           {},         config.lr,
                                 config.beta1, config.beta2, config.eps, config.weight_decay};
    uint32_t total = 0;
    for (size_t slot = 0; slot < used; ++slot) {
      params.count[slot] = counts[first + slot];
      params.first_group[slot] = total;
      params.groups[slot] = Groups1D(counts[first + slot], kElementwiseLocal, kAdamMultiMaxGroups)[0];
      total += params.groups[slot];
    }
    // Unused slots: no elements, no groups, and a first group no group
    // reaches; bound to the last used tensor's buffers, never touched.
    for (size_t slot = used; slot < kAdamTensorsPerLaunch; ++slot) params.first_group[slot] = total;
    Launch launch{std::string(kOp), {}, PushBytes(params), {total, 1, 1}, {}};
    for (size_t slot = 0; slot < kAdamTensorsPerLaunch; ++slot) {
      const size_t t = first + std::min(slot, used - 1);
      for (int k = 0; k < 4; ++k) launch.operands.push_back(input(t, k));
    }
    launch.operands.push_back(step);
    for (size_t slot = 0; slot < kAdamTensorsPerLaunch; ++slot) {
      const size_t t = first + std::min(slot, used - 1);
      for (int k = 0; k < 3; ++k) launch.operands.push_back(output(t, k));
    }
    plan.launches.push_back(std::move(launch));
  }
  return plan;
}

absl::Status AdamUpdateMulti(CommandList& list, absl::Span<const AdamTensor> tensors, const BufferArg& step,
                             const AdamConfig& config) {
  std::vector<uint32_t> counts;
  for (const AdamTensor& t : tensors) counts.push_back(t.count);
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanAdamUpdateMulti(counts, config));
  std::vector<BufferArg> buffers;
  for (const AdamTensor& t : tensors) buffers.insert(buffers.end(), {t.p, t.g, t.m, t.v});
  buffers.push_back(step);
  for (const AdamTensor& t : tensors) buffers.insert(buffers.end(), {t.p_out, t.m_out, t.v_out});
  return Record(list, plan, buffers);
}

absl::Status AdamUpdate(CommandList& list, const BufferArg& p, const BufferArg& g, const BufferArg& m,
                        const BufferArg& v, const BufferArg& step, const BufferArg& p_out, const BufferArg& m_out,
                        const BufferArg& v_out, uint32_t count, const AdamConfig& config) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanAdamUpdate(count, config));
  return Record(list, plan, {p, g, m, v, step, p_out, m_out, v_out});
}

}  // namespace causeway::ops
