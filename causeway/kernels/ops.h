// Recording helpers for the built-in kernels: each appends the dispatch(es)
// of one operation to a command list, with the workgroup counts that the
// kernel's header comment in shaders/ prescribes.
//
// Example:
//   CAUSEWAY_RETURN_IF_ERROR(ops::Matmul(*list, a, b, c, m, n, k));
#ifndef CAUSEWAY_KERNELS_OPS_H_
#define CAUSEWAY_KERNELS_OPS_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/device_capabilities.h"

namespace causeway::ops {

// data[i] = word for i < count (32-bit words).
absl::Status FillWords(CommandList& list, const BufferArg& data, uint32_t count, uint32_t word);
// dst[i] = src[i] for i < count (32-bit words), by a kernel.
absl::Status CopyWords(CommandList& list, const BufferArg& src, const BufferArg& dst, uint32_t count);
// out = a + b, out = a * b (f32, elementwise).
absl::Status Add(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& out, uint32_t count);
absl::Status Mul(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& out, uint32_t count);
// A place in a buffer, in 32-bit elements.
struct ElementRef {
  std::shared_ptr<Buffer> buffer;
  uint64_t offset = 0;  // elements
};
// out[i] = op(a[i], b[i]) for i < count, op a sum or (`max`) a max over f32
// or (`i32`) i32 words. Binds each operand from an offset aligned for
// storage buffers, in as many dispatches as the device's binding limit
// needs, so the buffers may be of any size. `out` must not overlap a or b.
absl::Status Combine(CommandList& list, bool max, bool i32, const ElementRef& a, const ElementRef& b,
                     const ElementRef& out, uint64_t count);
// out[i] = op(operands[0][i], ..., operands[k-1][i]) for i < count, folded
// left in operand order (the same operands in the same order give the same
// bits on every device), op and types as Combine. Operands may live on other
// accelerators that this list's can read directly (CommandList::Dispatch):
// a reduction then reads its peers' memory in place. One dispatch per eight
// operands (and per binding limit's worth of elements), four elements per
// invocation where every offset is a multiple of 4, the rest singly. `out`
// must be on the list's accelerator and overlap no operand.
absl::Status CombineN(CommandList& list, bool max, bool i32, absl::Span<const ElementRef> operands,
                      const ElementRef& out, uint64_t count);
// y = alpha * x.
absl::Status Scale(CommandList& list, const BufferArg& x, const BufferArg& y, uint32_t count, float alpha);
// out[0] = sum of x[0..count). `scratch` holds at least ReduceSumScratch(count) floats.
absl::Status ReduceSum(CommandList& list, const BufferArg& x, const BufferArg& scratch, const BufferArg& out,
                       uint32_t count);
uint32_t ReduceSumScratch(uint32_t count);
// C[m,n] = A[m,k] * B[k,n], row-major f32. `tile` (8, 16 or 32) sets the
// workgroup's width and height through the kernel's specialization constants.
absl::Status Matmul(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& c, uint32_t m,
                    uint32_t n, uint32_t k, uint32_t tile = 16);

// How the `gemm` kernel divides the work (causeway/shaders/gemm.comp, constant 5).
enum class GemmPath : uint32_t {
  // One 8-wide SIMD vector per group, each lane 16 x 16 outputs of a
  // 16 x 128 block, reading A and B as vec4 and sharing nothing between
  // lanes. Fastest on CPU drivers (lavapipe), where each invocation is a
  // SIMD lane and each component of a read is a loop over the lanes. Needs a
  // subgroup size of 8 (the SIMD width it is tuned for).
  kSubgroupLanes = 0,
  // Tiles of A and B in shared memory, 256 invocations of 4 x 4 outputs per
  // group, for GPUs. Needs maxComputeWorkGroupInvocations >= 256.
  kSharedTiles = 1,
  // Each invocation computes a column of 16 outputs on its own; works on
  // any device.
  kInvocationBlocks = 2,
};

// How ops::Gemm reads its operands. Sizes are in elements. A leading
// dimension is the distance between consecutive rows of a matrix as stored
// (0: packed, i.e. its column count as stored); a batch stride the distance
// between consecutive batches' matrices (nullopt: packed, rows * leading
// dimension; 0: one matrix for every batch, e.g. a weight).
struct GemmOptions {
  bool transpose_a = false;  // op(A) = A^T: A is stored K x M
  bool transpose_b = false;  // op(B) = B^T: B is stored N x K
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is only written, never read (it may hold NaNs)
  uint32_t batch = 1;
  uint32_t lda = 0, ldb = 0, ldc = 0;
  std::optional<uint64_t> stride_a, stride_b, stride_c;
  // Where each operand's first matrix starts in its BufferArg.
  uint64_t a_offset = 0, b_offset = 0, c_offset = 0;
  // nullopt: kSubgroupLanes on a CPU device with subgroups of 8, kSharedTiles
  // on other devices that allow 256 invocations per group, else
  // kInvocationBlocks. Set it to compare the paths or to test one.
  std::optional<GemmPath> path;
};
// C[i] = alpha * op(A[i]) * op(B[i]) + beta * C[i] for i < options.batch,
// op(A) M x K, op(B) K x N, C M x N, row-major f32, by the `gemm` kernel (one
// pipeline per path, transpose combination and vec4 alignment). M, N and
// batch must be > 0; K may be 0 (C = beta * C). Each operand's range must
// hold its last element, and C must not overlap A or B. Errors name the
// operand and the sizes, or the path the device cannot run.
//
// Example (a batch of 16 activations times one weight):
//   GemmOptions o;
//   o.batch = 16;
//   o.stride_b = 0;
//   CAUSEWAY_RETURN_IF_ERROR(ops::Gemm(*list, x, w, y, 128, 64, 128, o));
absl::Status Gemm(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& c, uint32_t m,
                  uint32_t n, uint32_t k, const GemmOptions& options = {});
// The same as a plan (op_plan.h; operands A, B, C), for the device `device`
// describes: the path is chosen for it as above. Without a device the plan
// runs on any (invocation blocks), and a path other than that is refused.
absl::StatusOr<OpPlan> PlanGemm(uint32_t m, uint32_t n, uint32_t k, const GemmOptions& options = {},
                                const DeviceCapabilities* device = nullptr);

}  // namespace causeway::ops

#endif  // CAUSEWAY_KERNELS_OPS_H_
