#include "causeway/kernels/attention_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/runtime/accelerator.h"

namespace causeway::ops {
namespace {

// Query (forward, backward pass 1) or key (backward pass 0) rows per
// workgroup at the kernels' default workgroup sizes (16 invocations, one per
// row).
constexpr uint32_t kRowsPerGroup = 16;
// The dot pre-pass's workgroup size (its default).
constexpr uint32_t kDotLocal = 256;
// Shared memory the kernels declare at head-dim bound H (see their header
// comments).
uint32_t ForwardSharedBytes(uint32_t h) { return (32 * h + 256) * 4; }
uint32_t BackwardSharedBytes(uint32_t h) { return (32 * h + 32) * 4; }
// The kernels' specialization constants for the head-dim bound: each runs
// its loops over head_dim to exactly the shape's.
constexpr uint32_t kForwardHeadDimId = 1;
constexpr uint32_t kBackwardHeadDimId = 2;
// The lanes kernels: one 8-wide SIMD vector per group (lavapipe's width), and
// their constant for the rows each invocation owns.
constexpr uint32_t kLanesGroup = 8;
constexpr uint32_t kLanesRowsId = 3;
constexpr uint32_t kLanesForwardRowsId = 2;
// Rows per invocation on the lanes path: each component read feeds that
// many FMAs per row product, and the registers hold that many rows of
// head_dim per array. R * head_dim at most 128 keeps the driver's compile
// time (which grows faster than the unrolled code) near the shared-tiles
// kernels': on lavapipe about 2 s forward and 3-12 s for both backward
// passes, against 2 s and 4-14 s (head_dim 32 to 128). The forward takes up
// to 8 rows (at head_dim 16, 8 rows ran 1.15 times as fast as 4); the
// backward, with four arrays of R rows, up to 4 (8 were no faster).
uint32_t LanesRows(uint32_t head_dim, uint32_t most) { return std::clamp<uint32_t>(128 / head_dim, 1, most); }
constexpr uint32_t kLanesForwardMostRows = 8;
constexpr uint32_t kLanesBackwardMostRows = 4;

AttentionPath ChoosePath(const DeviceCapabilities* device, std::optional<AttentionPath> path) {
  if (path.has_value()) return *path;
  return device != nullptr && device->kind == DeviceKind::kCpu ? AttentionPath::kLanes
                                                               : AttentionPath::kSharedTiles;
}

// Push constants of attention and attention_backward.
struct AttentionParams {
  uint32_t seq_len;
  uint32_t head_dim;
  float scale;
};
// Push constants of attention_backward_dot.
struct AttentionDotParams {
  uint32_t rows;
  uint32_t head_dim;
};

absl::Status CheckShape(const char* op, const AttentionShape& s) {
  if (s.batch == 0 || s.heads == 0 || s.seq_len == 0 || s.head_dim == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": batch, heads, seq_len and head_dim must be > 0, got ", s.batch, ", ", s.heads,
                     ", ", s.seq_len, ", ", s.head_dim));
  }
  if (s.head_dim > kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head_dim must be at most ", kMaxAttentionHeadDim, ", got ", s.head_dim));
  }
  // The kernels index with 32-bit words.
  if (s.elements() > (uint64_t{1} << 32) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": tensors of at most 2^32 - 1 elements, got ", s.elements()));
  }
  // Every Vulkan device dispatches 65535 groups in y; more is checked
  // against the device when recorded.
  if (uint64_t{s.batch} * s.heads > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": batch * heads must be at most 65535, got ",
                                                   uint64_t{s.batch} * s.heads));
  }
  return absl::OkStatus();
}

// What the device must offer to run the kernel.
absl::Status CheckDevice(const char* op, CommandList& list, uint32_t shared_bytes) {
  const VkPhysicalDeviceLimits& limits = list.accelerator()->info().limits;
  if (limits.maxComputeSharedMemorySize < shared_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": the kernel needs ", shared_bytes,
                                                      " bytes of shared memory, the device has ",
                                                      limits.maxComputeSharedMemorySize));
  }
  return absl::OkStatus();
}

std::string Name(const char* op, const AttentionShape& s) {
  return absl::StrCat(op, " [", s.batch, ", ", s.heads, ", ", s.seq_len, ", ", s.head_dim, "]");
}

OpPlan::Operand Floats(const char* name, uint64_t elements) { return {name, elements * 4}; }

AttentionParams Params(const AttentionShape& s) {
  return AttentionParams{s.seq_len, s.head_dim, 1.0f / std::sqrt(static_cast<float>(s.head_dim))};
}

std::array<uint32_t, 3> Groups(const AttentionShape& s, uint32_t rows_per_group) {
  return {(s.seq_len + rows_per_group - 1) / rows_per_group, s.batch * s.heads, 1};
}

}  // namespace

absl::StatusOr<OpPlan> PlanAttentionForward(const AttentionShape& shape, const DeviceCapabilities* device,
                                            std::optional<AttentionPath> path) {
  constexpr const char* kOp = "attention";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, shape));
  const uint64_t n = shape.elements();
  OpPlan plan{Name(kOp, shape),
              {Floats("q", n), Floats("k", n), Floats("v", n), Floats("out", n), Floats("lse", shape.rows())},
              {}};
  if (ChoosePath(device, path) == AttentionPath::kLanes) {
    const uint32_t rows = LanesRows(shape.head_dim, kLanesForwardMostRows);
    plan.launches.push_back(
        {"attention_lanes",
         {0, 1, 2, 3, 4},
         PushBytes(Params(shape)),
         Groups(shape, kLanesGroup * rows),
         {{0, kLanesGroup}, {kForwardHeadDimId, shape.head_dim}, {kLanesForwardRowsId, rows}}});
    return plan;
  }
  plan.launches.push_back({"attention",
                           {0, 1, 2, 3, 4},
                           PushBytes(Params(shape)),
                           Groups(shape, kRowsPerGroup),
                           {{kForwardHeadDimId, shape.head_dim}}});
  return plan;
}

absl::StatusOr<OpPlan> PlanAttentionBackward(const AttentionShape& shape, const DeviceCapabilities* device,
                                             std::optional<AttentionPath> path) {
  constexpr const char* kOp = "attention_backward";
  CAUSEWAY_RETURN_IF_ERROR(CheckShape(kOp, shape));
  const uint64_t n = shape.elements();
  const uint64_t rows = shape.rows();
  OpPlan plan{Name(kOp, shape),
              {Floats("q", n), Floats("k", n), Floats("v", n), Floats("out", n), Floats("d_out", n),
               Floats("lse", rows), Floats("delta", rows), Floats("dq", n), Floats("dk", n), Floats("dv", n)},
              {}};
  plan.launches.push_back({"attention_backward_dot", {3, 4, 6},
                           PushBytes(AttentionDotParams{static_cast<uint32_t>(rows), shape.head_dim}),
                           Groups1D(rows, kDotLocal), {}});
  // Pass 0 writes dk and dv, pass 1 dq (specialization constant 1).
  const bool lanes = ChoosePath(device, path) == AttentionPath::kLanes;
  const uint32_t lane_rows = LanesRows(shape.head_dim, kLanesBackwardMostRows);
  for (uint32_t pass : {0u, 1u}) {
    if (lanes) {
      plan.launches.push_back(
          {"attention_backward_lanes",
           {0, 1, 2, 4, 5, 6, 7, 8, 9},
           PushBytes(Params(shape)),
           Groups(shape, kLanesGroup * lane_rows),
           {{0, kLanesGroup}, {1, pass}, {kBackwardHeadDimId, shape.head_dim}, {kLanesRowsId, lane_rows}}});
    } else {
      plan.launches.push_back({"attention_backward",
                               {0, 1, 2, 4, 5, 6, 7, 8, 9},
                               PushBytes(Params(shape)),
                               Groups(shape, kRowsPerGroup),
                               {{1, pass}, {kBackwardHeadDimId, shape.head_dim}}});
    }
  }
  return plan;
}

absl::Status AttentionForward(CommandList& list, const BufferArg& q, const BufferArg& k, const BufferArg& v,
                              const BufferArg& out, const BufferArg& lse, const AttentionShape& shape) {
  const DeviceCapabilities* device = &list.accelerator()->capabilities();
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanAttentionForward(shape, device));
  if (ChoosePath(device, std::nullopt) == AttentionPath::kSharedTiles) {
    CAUSEWAY_RETURN_IF_ERROR(CheckDevice("attention", list, ForwardSharedBytes(shape.head_dim)));
  }
  return Record(list, plan, {q, k, v, out, lse});
}

absl::Status AttentionBackward(CommandList& list, const BufferArg& q, const BufferArg& k, const BufferArg& v,
                               const BufferArg& out, const BufferArg& d_out, const BufferArg& lse,
                               const BufferArg& delta, const BufferArg& dq, const BufferArg& dk,
                               const BufferArg& dv, const AttentionShape& shape) {
  const DeviceCapabilities* device = &list.accelerator()->capabilities();
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanAttentionBackward(shape, device));
  if (ChoosePath(device, std::nullopt) == AttentionPath::kSharedTiles) {
    CAUSEWAY_RETURN_IF_ERROR(CheckDevice("attention_backward", list, BackwardSharedBytes(shape.head_dim)));
  }
  return Record(list, plan, {q, k, v, out, d_out, lse, delta, dq, dk, dv});
}

}  // namespace causeway::ops
