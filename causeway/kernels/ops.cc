#include "causeway/kernels/ops.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/runtime/accelerator.h"

namespace causeway::ops {
namespace {

constexpr uint32_t kLocal = 256;  // the 1-D kernels' default workgroup size
// Workgroups of reduce_sum's first pass; the second pass reduces these.
constexpr uint32_t kReduceGroups = 256;
// Workgroups of a combine dispatch at most.
constexpr uint32_t kCombineGroups = 1024;
// Operands of one combine_n dispatch at most (its bindings 0..7).
constexpr size_t kCombineOperands = 8;

absl::Status Elementwise(const char* name, CommandList& list, std::vector<BufferArg> args, uint32_t count) {
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(name, ": count must be > 0"));
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(name));
  return list.Dispatch(kernel, std::move(args), CountParams{count}, Groups1D(count, kLocal));
}

// Dispatches `kernel` over elements [first, last) of `refs`, one binding
// each in order, `unit` elements (1, or 4 for a uvec4) per index: each
// binding starts at an offset aligned for storage buffers at or before its
// element, in as many dispatches as the device's binding limit needs, so the
// buffers may be of any size. Push constants: the count of units, then each
// binding's offset to its first element, in units. If `at_zero_id` is not
// negative, the specialization constant of that id tells the kernel when
// every binding starts at its first element (1) or not (0).
absl::Status DispatchElementwise(CommandList& list, const std::shared_ptr<const Kernel>& kernel,
                                 absl::Span<const ElementRef> refs, uint64_t unit, uint64_t first, uint64_t last,
                                 const SpecValues& spec, int at_zero_id = -1) {
  const VkPhysicalDeviceLimits& limits = list.accelerator()->info().limits;
  // Bound offsets are multiples of `step` (a power of two, like the
  // device's alignment), so a binding starts at most step - 4 bytes before
  // its operand.
  const uint64_t step = std::max<uint64_t>(limits.minStorageBufferOffsetAlignment, 16);
  // Elements per dispatch, a multiple of 4 that fits the binding limit.
  const uint64_t per_dispatch = std::min<uint64_t>((limits.maxStorageBufferRange - step) / 16 * 4, 1u << 30);
  for (uint64_t done = first; done < last; done += per_dispatch) {
    const uint64_t n = std::min(per_dispatch, last - done);
    std::vector<uint32_t> push = {static_cast<uint32_t>(n / unit)};
    std::vector<BufferArg> args;
    bool at_zero = true;
    for (const ElementRef& ref : refs) {
      const uint64_t byte = (ref.offset + done) * 4;
      const uint64_t base = byte - byte % step;
      push.push_back(static_cast<uint32_t>((byte - base) / 4 / unit));
      at_zero &= push.back() == 0;
      args.emplace_back(ref.buffer, base, byte - base + n * 4);
    }
    SpecValues specialized = spec;
    if (at_zero_id >= 0) specialized.push_back({static_cast<uint32_t>(at_zero_id), at_zero ? 1u : 0u});
    // About a thousand workgroups keep a CPU driver's threads busy without
    // paying for many small ones (measured on lavapipe: 8192 groups run
    // 30% slower than 1024).
    CAUSEWAY_RETURN_IF_ERROR(list.Dispatch(
        kernel, std::move(args),
        absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(push.data()), push.size() * 4),
        Groups1D(n / unit, kLocal, kCombineGroups), specialized));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FillWords(CommandList& list, const BufferArg& data, uint32_t count, uint32_t word) {
  if (count == 0) return absl::InvalidArgumentError("fill: count must be > 0");
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("fill"));
  return list.Dispatch(kernel, {data}, FillParams{count, word}, Groups1D(count, kLocal));
}

absl::Status CopyWords(CommandList& list, const BufferArg& src, const BufferArg& dst, uint32_t count) {
  return Elementwise("copy", list, {src, dst}, count);
}

absl::Status Add(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& out, uint32_t count) {
  return Elementwise("add", list, {a, b, out}, count);
}

absl::Status Mul(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& out, uint32_t count) {
  return Elementwise("mul", list, {a, b, out}, count);
}

absl::Status Combine(CommandList& list, bool max, bool i32, const ElementRef& a, const ElementRef& b,
                     const ElementRef& out, uint64_t count) {
  // Four elements per invocation (twice as fast on lavapipe) when every
  // operand starts at a multiple of 4 elements; the last count % 4 singly.
  const bool quads = a.offset % 4 == 0 && b.offset % 4 == 0 && out.offset % 4 == 0;
  const uint64_t whole = quads ? count / 4 * 4 : 0;
  const SpecValues spec = {{1, max ? 1u : 0u}, {2, i32 ? 1u : 0u}};
  const ElementRef refs[] = {a, b, out};
  static_assert(sizeof(CombineParams) == 4 * (1 + std::size(refs)), "count, then one offset per binding");
  if (whole > 0) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("combine4"));
    CAUSEWAY_RETURN_IF_ERROR(DispatchElementwise(list, kernel, refs, 4, 0, whole, spec));
  }
  if (whole == count) return absl::OkStatus();
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("combine"));
  return DispatchElementwise(list, kernel, refs, 1, whole, count, spec);
}

absl::Status CombineN(CommandList& list, bool max, bool i32, absl::Span<const ElementRef> operands,
                      const ElementRef& out, uint64_t count) {
  if (operands.empty()) return absl::InvalidArgumentError("combine_n: no operands");
  if (out.buffer == nullptr) return absl::InvalidArgumentError("combine_n: null output buffer");
  for (size_t k = 0; k < operands.size(); ++k) {
    const ElementRef& x = operands[k];
    if (x.buffer == nullptr) return absl::InvalidArgumentError(absl::StrCat("combine_n: operand ", k, " is null"));
    if (x.buffer == out.buffer && x.offset < out.offset + count && out.offset < x.offset + count) {
      return absl::InvalidArgumentError(absl::StrCat("combine_n: operand ", k, " (elements ", x.offset, "..",
                                                     x.offset + count, ") overlaps the output (elements ",
                                                     out.offset, "..", out.offset + count, ")"));
    }
  }
  if (count == 0) return absl::OkStatus();
  bool quads = out.offset % 4 == 0;
  for (const ElementRef& x : operands) quads &= x.offset % 4 == 0;
  const uint64_t whole = quads ? count / 4 * 4 : 0;
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("combine_n"));
  // Groups of up to kCombineOperands, each after the first folded into the
  // output, so that the operands are reduced in order.
  for (size_t first = 0; first < operands.size(); first += kCombineOperands) {
    const size_t n = std::min(operands.size() - first, kCombineOperands);
    std::vector<ElementRef> refs(operands.begin() + first, operands.begin() + first + n);
    // Bindings past n are never read: the output there keeps the import of
    // a peer's block out of them (and out of the bytes read from peers).
    refs.resize(kCombineOperands, out);
    refs.push_back(out);
    static_assert(sizeof(CombineNParams) == 4 * (1 + kCombineOperands + 1), "count, then one offset per binding");
    for (uint64_t unit : {4, 1}) {
      const SpecValues spec = {{1, max ? 1u : 0u},
                               {2, i32 ? 1u : 0u},
                               {3, static_cast<uint32_t>(n)},
                               {4, unit == 4 ? 1u : 0u},
                               {5, first > 0 ? 1u : 0u}};
      CAUSEWAY_RETURN_IF_ERROR(DispatchElementwise(list, kernel, refs, unit, unit == 4 ? 0 : whole,
                                                   unit == 4 ? whole : count, spec, /*at_zero_id=*/6));
    }
  }
  return absl::OkStatus();
}

absl::Status Scale(CommandList& list, const BufferArg& x, const BufferArg& y, uint32_t count, float alpha) {
  if (count == 0) return absl::InvalidArgumentError("scale: count must be > 0");
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("scale"));
  return list.Dispatch(kernel, {x, y}, ScaleParams{count, alpha}, Groups1D(count, kLocal));
}

uint32_t ReduceSumScratch(uint32_t count) { return kReduceGroups; }

absl::Status ReduceSum(CommandList& list, const BufferArg& x, const BufferArg& scratch, const BufferArg& out,
                       uint32_t count) {
  if (count == 0) return absl::InvalidArgumentError("reduce_sum: count must be > 0");
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("reduce_sum"));
  uint32_t groups = Groups1D(count, kLocal, kReduceGroups)[0];
  CAUSEWAY_RETURN_IF_ERROR(list.Dispatch(kernel,
                                         {x, BufferArg(scratch.buffer, scratch.offset, uint64_t{groups} * 4)},
                                         CountParams{count}, {groups, 1, 1}));
  return list.Dispatch(kernel, {BufferArg(scratch.buffer, scratch.offset, uint64_t{groups} * 4), out},
                       CountParams{groups}, {1, 1, 1});
}

absl::Status Matmul(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& c, uint32_t m,
                    uint32_t n, uint32_t k, uint32_t tile) {
  if (m == 0 || n == 0) return absl::InvalidArgumentError("matmul: M and N must be > 0");
  if (tile == 0 || tile > 32) return absl::InvalidArgumentError(absl::StrCat("matmul: tile ", tile, " not in 1..32"));
  for (auto [arg, need, what] : {std::tuple{&a, uint64_t{m} * k, "A"}, std::tuple{&b, uint64_t{k} * n, "B"},
                                 std::tuple{&c, uint64_t{m} * n, "C"}}) {
    if (arg->buffer != nullptr && arg->resolved_size() < need * 4) {
      return absl::InvalidArgumentError(absl::StrCat("matmul ", m, "x", n, "x", k, ": ", what, " needs ", need * 4,
                                                     " bytes, got ", arg->resolved_size()));
    }
  }
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("matmul"));
  uint32_t per_group = 4 * tile;
  std::array<uint32_t, 3> groups{(n + per_group - 1) / per_group, (m + per_group - 1) / per_group, 1};
  return list.Dispatch(kernel, {a, b, c}, MatmulParams{m, n, k}, groups, {{0, tile}, {1, tile}});
}

namespace {

// The gemm kernel's push constants (causeway/shaders/gemm.comp).
struct GemmParams {
  uint32_t m, n, k;
  uint32_t lda, ldb, ldc;
  uint32_t stride_a, stride_b, stride_c;
  uint32_t a_offset, b_offset, c_offset;
  float alpha, beta;
  uint32_t flags;
};
static_assert(sizeof(GemmParams) == 60);

// The kernel's blocks per path (causeway/shaders/gemm.comp): kSubgroupLanes groups of
// kGemmLanes invocations compute kGemmLaneRows x kGemmLaneCols of C (fixed in
// the shader, which ignores constants 3 and 4 there); kSharedTiles groups
// of kGemmTileGroup invocations 64 x 64; kInvocationBlocks groups of
// kGemmWidth invocations kGemmRows x kGemmWidth.
constexpr uint32_t kGemmLanes = 8;
constexpr uint32_t kGemmLaneRows = 16;
constexpr uint32_t kGemmLaneCols = 128;
constexpr uint32_t kGemmTileGroup = 256;
constexpr uint32_t kGemmTile = 64;
constexpr uint32_t kGemmWidth = 64;
// Workgroups per dimension every Vulkan device allows (maxComputeWorkGroupCount).
constexpr uint64_t kMaxGemmGroups = 65535;
constexpr uint32_t kGemmRows = 16;
// Constant 6: A's (bit 0) and B's (bit 1) runs of four may be read as vec4.
constexpr uint32_t kGemmVec4Spec = 6;
constexpr uint32_t kGemmVec4A = 1;
constexpr uint32_t kGemmVec4B = 2;
constexpr uint32_t kGemmVec4C = 4;

const char* GemmPathName(GemmPath path) {
  switch (path) {
    case GemmPath::kSubgroupLanes:
      return "subgroup-lanes";
    case GemmPath::kSharedTiles:
      return "shared-tiles";
    case GemmPath::kInvocationBlocks:
      return "invocation-blocks";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<OpPlan> PlanGemm(uint32_t m, uint32_t n, uint32_t k, const GemmOptions& o,
                                const DeviceCapabilities* device) {
  const std::string what = absl::StrCat("gemm ", m, "x", n, "x", k, " batch ", o.batch);
  if (m == 0 || n == 0 || o.batch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": M, N and batch must be > 0"));
  }
  // Every Vulkan device dispatches 65535 groups in z.
  const uint32_t max_z = device != nullptr ? device->max_workgroup_count[2] : 65535;
  if (o.batch > max_z) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch must be at most ", max_z,
                                                   device != nullptr ? " on this device" : ""));
  }
  struct Operand {
    const char* name;
    uint64_t rows, cols;  // as stored
    uint32_t ld;
    std::optional<uint64_t> stride;
    uint64_t offset;
    uint32_t resolved_ld = 0;
    uint64_t resolved_stride = 0;
    uint64_t elements = 0;
  };
  std::array<Operand, 3> operands = {{
      {"A", o.transpose_a ? k : m, o.transpose_a ? m : k, o.lda, o.stride_a, o.a_offset},
      {"B", o.transpose_b ? n : k, o.transpose_b ? k : n, o.ldb, o.stride_b, o.b_offset},
      {"C", m, n, o.ldc, o.stride_c, o.c_offset},
  }};
  constexpr uint64_t kMaxIndex = std::numeric_limits<uint32_t>::max();
  for (Operand& op : operands) {
    const uint64_t ld = op.ld == 0 ? op.cols : op.ld;
    if (ld < op.cols) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", op.name, "'s leading dimension ", ld,
                                                     " is less than its ", op.cols, " columns as stored"));
    }
    const uint64_t stride = op.stride.value_or(op.rows * ld);
    // An empty A or B (K = 0) is never read.
    const uint64_t elements = op.rows == 0 || op.cols == 0
                                  ? 0
                                  : op.offset + (o.batch - 1) * stride + (op.rows - 1) * ld + op.cols;
    if (ld > kMaxIndex || stride > kMaxIndex || op.offset > kMaxIndex || elements > kMaxIndex) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", op.name, " spans ", elements,
                                                     " elements; the kernel indexes at most 2^32 - 1"));
    }
    op.resolved_ld = static_cast<uint32_t>(ld);
    op.resolved_stride = stride;
    op.elements = elements;
  }
  // Batches write C concurrently: their matrices must not overlap.
  const uint64_t c_span = uint64_t{m - 1} * operands[2].resolved_ld + n;
  if (o.batch > 1 && operands[2].resolved_stride < c_span) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": C's batch stride ", operands[2].resolved_stride,
                                                   " is less than the ", c_span,
                                                   " elements of one C: batches would overlap"));
  }
  GemmParams params{m,
                    n,
                    k,
                    operands[0].resolved_ld,
                    operands[1].resolved_ld,
                    operands[2].resolved_ld,
                    static_cast<uint32_t>(operands[0].resolved_stride),
                    static_cast<uint32_t>(operands[1].resolved_stride),
                    static_cast<uint32_t>(operands[2].resolved_stride),
                    static_cast<uint32_t>(o.a_offset),
                    static_cast<uint32_t>(o.b_offset),
                    static_cast<uint32_t>(o.c_offset),
                    o.alpha,
                    o.beta,
                    0};
  // Without a device, the path that runs on any: invocation blocks.
  const bool lanes_ok = device != nullptr && device->subgroup_size == kGemmLanes;
  const bool tiles_ok = device != nullptr && device->max_workgroup_invocations >= kGemmTileGroup &&
                        device->max_workgroup_size[0] >= kGemmTileGroup;
  GemmPath path = GemmPath::kInvocationBlocks;
  if (o.path.has_value()) {
    path = *o.path;
    if (device == nullptr && path != GemmPath::kInvocationBlocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": path ", GemmPathName(path), " needs the device it will run on"));
    }
    if ((path == GemmPath::kSubgroupLanes && !lanes_ok) || (path == GemmPath::kSharedTiles && !tiles_ok)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": path ", GemmPathName(path), " needs ",
          path == GemmPath::kSubgroupLanes ? "a subgroup size of 8" : "256 invocations per group",
          "; this device has subgroups of ", device->subgroup_size, " and at most ",
          device->max_workgroup_invocations, " invocations per group"));
    }
  } else if (device == nullptr) {
    path = GemmPath::kInvocationBlocks;
  } else if (device->kind == DeviceKind::kCpu) {
    if (lanes_ok) path = GemmPath::kSubgroupLanes;
  } else if (tiles_ok) {
    path = GemmPath::kSharedTiles;
  }

  // vec4 reads need every run of four at a multiple of 16 bytes from the
  // binding (a plan's operands are bound at their start; Gemm below clears
  // the bits for a binding that is not 16-byte aligned).
  uint32_t vec4 = 0;
  if (params.lda % 4 == 0 && params.stride_a % 4 == 0 && params.a_offset % 4 == 0) {
    vec4 |= kGemmVec4A;
  }
  if (params.ldb % 4 == 0 && params.stride_b % 4 == 0 && params.b_offset % 4 == 0) {
    vec4 |= kGemmVec4B;
  }
  // The lanes path reads whole quads of A's rows (transposed) and of B's
  // columns (not transposed) and writes whole quads of C's columns, which
  // must not straddle M or N.
  if (path == GemmPath::kSubgroupLanes) {
    if (o.transpose_a && m % 4 != 0) vec4 &= ~kGemmVec4A;
    if (!o.transpose_b && n % 4 != 0) vec4 &= ~kGemmVec4B;
    if (n % 4 == 0 && params.ldc % 4 == 0 && params.stride_c % 4 == 0 && params.c_offset % 4 == 0) {
      vec4 |= kGemmVec4C;
    }
  }

  uint32_t width = kGemmWidth, rows = kGemmRows, cols = 1, per_x = kGemmWidth, per_y = kGemmRows;
  switch (path) {
    case GemmPath::kSubgroupLanes:
      width = kGemmLanes;
      rows = kGemmLaneRows;
      per_x = kGemmLaneCols;
      per_y = kGemmLaneRows;
      break;
    case GemmPath::kSharedTiles:
      width = kGemmTileGroup;
      per_x = kGemmTile;
      per_y = kGemmTile;
      break;
    case GemmPath::kInvocationBlocks:
      break;
  }
  OpPlan plan{what,
              {{"A", operands[0].elements * 4}, {"B", operands[1].elements * 4}, {"C", operands[2].elements * 4}},
              {}};
  // In 64 bits: n + per_x - 1 wraps in 32 for n near 2^32, which gave zero
  // workgroups; a count past the device's limit is refused here.
  const uint64_t groups_x = (uint64_t{n} + per_x - 1) / per_x, groups_y = (uint64_t{m} + per_y - 1) / per_y;
  if (groups_x > kMaxGemmGroups || groups_y > kMaxGemmGroups) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", groups_x, " x ", groups_y,
                                                   " workgroups; at most ", kMaxGemmGroups,
                                                   " in each dimension"));
  }
  const std::array<uint32_t, 3> groups{static_cast<uint32_t>(groups_x), static_cast<uint32_t>(groups_y),
                                       o.batch};
  plan.launches.push_back({"gemm",
                           {0, 1, 2},
                           PushBytes(params),
                           groups,
                           {{0, width},
                            {1, o.transpose_a ? 1u : 0u},
                            {2, o.transpose_b ? 1u : 0u},
                            {3, rows},
                            {4, cols},
                            {5, static_cast<uint32_t>(path)},
                            {kGemmVec4Spec, vec4}}});
  return plan;
}

absl::Status Gemm(CommandList& list, const BufferArg& a, const BufferArg& b, const BufferArg& c, uint32_t m,
                  uint32_t n, uint32_t k, const GemmOptions& o) {
  CAUSEWAY_ASSIGN_OR_RETURN(OpPlan plan, PlanGemm(m, n, k, o, &list.accelerator()->capabilities()));
  // Binding offsets are multiples of 4 bytes only: no vec4 reads from one
  // that is not 16-byte aligned.
  for (auto& [id, value] : plan.launches[0].spec) {
    if (id != kGemmVec4Spec) continue;
    if (a.offset % 16 != 0) value &= ~kGemmVec4A;
    if (b.offset % 16 != 0) value &= ~kGemmVec4B;
    if (c.offset % 16 != 0) value &= ~kGemmVec4C;
  }
  return Record(list, plan, {a, b, c});
}

}  // namespace causeway::ops
