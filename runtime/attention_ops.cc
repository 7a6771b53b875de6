#include "runtime/attention_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/accelerator.h"
#include "runtime/builtin_kernels.h"
#include "runtime/status.h"

namespace causeway::ops {
namespace {

// Query (forward, backward pass 1) or key (backward pass 0) rows per
// workgroup at the kernels' default workgroup sizes (attention: 16 invocations,
// one per row; attention_backward: 64, four per row).
constexpr uint32_t kRowsPerGroup = 16;
// The dot pre-pass's workgroup size (its default).
constexpr uint32_t kDotLocal = 256;
// Shared memory the kernels declare (see their header comments).
constexpr uint32_t kForwardSharedBytes = 17 * 1024;
constexpr uint32_t kBackwardSharedBytes = 25 * 1024;

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

absl::Status CheckShape(const char* op, CommandList& list, const AttentionShape& s, uint32_t shared_bytes) {
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
  const VkPhysicalDeviceLimits& limits = list.accelerator()->info().limits;
  const uint64_t matrices = uint64_t{s.batch} * s.heads;
  if (matrices > limits.maxComputeWorkGroupCount[1]) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": batch * heads must be at most ",
                                                   limits.maxComputeWorkGroupCount[1], " (the device's ",
                                                   "workgroup count in y), got ", matrices));
  }
  if (limits.maxComputeSharedMemorySize < shared_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": the kernel needs ", shared_bytes,
                                                      " bytes of shared memory, the device has ",
                                                      limits.maxComputeSharedMemorySize));
  }
  return absl::OkStatus();
}

// Checks that each argument holds at least its number of floats.
absl::Status CheckSizes(const char* op, const AttentionShape& s,
                        std::initializer_list<std::tuple<const BufferArg*, uint64_t, const char*>> args) {
  for (auto [arg, floats, what] : args) {
    if (arg->buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " has no buffer"));
    }
    if (arg->resolved_size() < floats * 4) {
      return absl::InvalidArgumentError(absl::StrCat(op, " [", s.batch, ", ", s.heads, ", ", s.seq_len, ", ",
                                                     s.head_dim, "]: ", what, " needs ", floats * 4,
                                                     " bytes, got ", arg->resolved_size()));
    }
  }
  return absl::OkStatus();
}

AttentionParams Params(const AttentionShape& s) {
  return AttentionParams{s.seq_len, s.head_dim, 1.0f / std::sqrt(static_cast<float>(s.head_dim))};
}

std::array<uint32_t, 3> Groups(const AttentionShape& s) {
  return {(s.seq_len + kRowsPerGroup - 1) / kRowsPerGroup, s.batch * s.heads, 1};
}

}  // namespace

absl::Status AttentionForward(CommandList& list, const BufferArg& q, const BufferArg& k, const BufferArg& v,
                              const BufferArg& out, const BufferArg& lse, const AttentionShape& shape) {
  constexpr const char* kOp = "attention";
  RETURN_IF_ERROR(CheckShape(kOp, list, shape, kForwardSharedBytes));
  const uint64_t n = shape.elements();
  RETURN_IF_ERROR(CheckSizes(
      kOp, shape, {{&q, n, "q"}, {&k, n, "k"}, {&v, n, "v"}, {&out, n, "out"}, {&lse, shape.rows(), "lse"}}));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("attention"));
  return list.Dispatch(kernel, {q, k, v, out, lse}, Params(shape), Groups(shape));
}

absl::Status AttentionBackward(CommandList& list, const BufferArg& q, const BufferArg& k, const BufferArg& v,
                               const BufferArg& out, const BufferArg& d_out, const BufferArg& lse,
                               const BufferArg& delta, const BufferArg& dq, const BufferArg& dk,
                               const BufferArg& dv, const AttentionShape& shape) {
  constexpr const char* kOp = "attention_backward";
  RETURN_IF_ERROR(CheckShape(kOp, list, shape, kBackwardSharedBytes));
  const uint64_t n = shape.elements();
  const uint64_t rows = shape.rows();
  RETURN_IF_ERROR(CheckSizes(kOp, shape,
                             {{&q, n, "q"},
                              {&k, n, "k"},
                              {&v, n, "v"},
                              {&out, n, "out"},
                              {&d_out, n, "d_out"},
                              {&lse, rows, "lse"},
                              {&delta, rows, "delta"},
                              {&dq, n, "dq"},
                              {&dk, n, "dk"},
                              {&dv, n, "dv"}}));
  ASSIGN_OR_RETURN(auto dot, BuiltinKernel("attention_backward_dot"));
  ASSIGN_OR_RETURN(auto backward, BuiltinKernel("attention_backward"));
  RETURN_IF_ERROR(list.Dispatch(dot, {out, d_out, delta},
                                AttentionDotParams{static_cast<uint32_t>(rows), shape.head_dim},
                                Groups1D(rows, kDotLocal)));
  // Pass 0 writes dk and dv, pass 1 dq (specialization constant 1).
  for (uint32_t pass : {0u, 1u}) {
    RETURN_IF_ERROR(list.Dispatch(backward, {q, k, v, d_out, lse, delta, dq, dk, dv}, Params(shape),
                                  Groups(shape), {{1, pass}}));
  }
  return absl::OkStatus();
}

}  // namespace causeway::ops
