// Recording helpers for the causal self-attention kernels (shaders/
// attention*.comp): each appends the dispatches of one operation to a command
// list, with the workgroup counts the kernels' header comments prescribe.
//
// Tensors are f32 [batch, heads, T, head_dim], row-major and densely packed
// (a [batch, T, heads, head_dim] projection must be transposed first); the
// per-row logsumexp is [batch, heads, T]. The scale is 1 / sqrt(head_dim).
//
// Example (one training step's attention):
//   AttentionShape shape{.batch = 2, .heads = 4, .seq_len = 128, .head_dim = 64};
//   CAUSEWAY_RETURN_IF_ERROR(ops::AttentionForward(*list, q, k, v, out, lse, shape));
//   ...
//   CAUSEWAY_RETURN_IF_ERROR(ops::AttentionBackward(*list, q, k, v, out, d_out, lse, delta,
//                                          dq, dk, dv, shape));
#ifndef CAUSEWAY_KERNELS_ATTENTION_OPS_H_
#define CAUSEWAY_KERNELS_ATTENTION_OPS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/runtime/command_list.h"

namespace causeway {

// The sizes of one attention call: all must be > 0, head_dim at most
// kMaxAttentionHeadDim, batch * heads at most the device's workgroup count
// limit in y (65535 at least).
struct AttentionShape {
  uint32_t batch = 1;
  uint32_t heads = 1;
  uint32_t seq_len = 1;  // T
  uint32_t head_dim = 1;
  // Floats of a [batch, heads, T, head_dim] tensor and of a [batch, heads, T] one.
  uint64_t elements() const { return rows() * head_dim; }
  uint64_t rows() const { return uint64_t{batch} * heads * seq_len; }
};

inline constexpr uint32_t kMaxAttentionHeadDim = 128;

namespace ops {

// How the attention kernels divide the work.
enum class AttentionPath : uint32_t {
  // attention.comp, attention_backward.comp: each invocation one row, its
  // group streaming tiles of the other side's rows through shared memory
  // (the FlashAttention formulation). For GPUs; runs on any device with the
  // shared memory below.
  kSharedTiles = 0,
  // attention_lanes.comp, attention_backward_lanes.comp: each invocation
  // several rows in registers, reading the other side's rows straight from
  // the buffers with the same address in every lane, no shared memory and no
  // barriers. For CPU drivers (lavapipe), where every component read is a
  // loop over the SIMD lanes: each read feeds one FMA per owned row.
  kLanes = 1,
};

// out = softmax(q k^T / sqrt(head_dim), causal) v and lse = the rows'
// logsumexp of the scaled scores, one fused dispatch (never T x T in memory).
// q, k, v, out hold shape.elements() floats, lse shape.rows(). `out` and
// `lse` must not overlap the inputs.
absl::Status AttentionForward(CommandList& list, const BufferArg& q, const BufferArg& k, const BufferArg& v,
                              const BufferArg& out, const BufferArg& lse, const AttentionShape& shape);

// dq, dk, dv: the gradients of sum(d_out * out) for out = AttentionForward(q,
// k, v), from the forward's `out` and `lse`. Three dispatches: delta =
// rowsum(d_out * out) into `delta` (shape.rows() floats of scratch), then dk
// and dv, then dq. Deterministic: no atomics, the same bits every run.
// The outputs must not overlap the inputs or each other.
absl::Status AttentionBackward(CommandList& list, const BufferArg& q, const BufferArg& k, const BufferArg& v,
                               const BufferArg& out, const BufferArg& d_out, const BufferArg& lse,
                               const BufferArg& delta, const BufferArg& dq, const BufferArg& dk,
                               const BufferArg& dv, const AttentionShape& shape);

// The same as plans (op_plan.h), for functions of programs. Forward's
// operands: q, k, v, out, lse; backward's: q, k, v, out, d_out, lse, delta,
// dq, dk, dv. The kernels are specialized for the shape's head_dim. The
// path: `path` if set, else kLanes on a CPU device and kSharedTiles on any
// other or without a device (the helpers above pass the list's). On the
// shared-tiles path a device must offer (32 head_dim + 256) * 4 bytes of
// shared memory (forward; 17 KiB at head_dim 128) and (32 head_dim + 32) * 4
// (backward; 16.1 KiB): the helpers above check it, a program's dispatch
// fails. Both paths give the same results to rounding (scores are summed in
// the same order).
absl::StatusOr<OpPlan> PlanAttentionForward(const AttentionShape& shape,
                                            const DeviceCapabilities* device = nullptr,
                                            std::optional<AttentionPath> path = std::nullopt);
absl::StatusOr<OpPlan> PlanAttentionBackward(const AttentionShape& shape,
                                             const DeviceCapabilities* device = nullptr,
                                             std::optional<AttentionPath> path = std::nullopt);

}  // namespace ops
}  // namespace causeway

#endif  // CAUSEWAY_KERNELS_ATTENTION_OPS_H_
