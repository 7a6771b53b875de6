#include "causeway/scheduler/collectives.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"

namespace causeway {

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all-reduce";
    case CollectiveKind::kAllGather:
      return "all-gather";
    case CollectiveKind::kReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kPermute:
      return "permute";
  }
  return "?";
}

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

const char* CollectiveAlgorithmName(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
    case CollectiveAlgorithm::kAuto:
      return "auto";
    case CollectiveAlgorithm::kDirect:
      return "direct";
    case CollectiveAlgorithm::kRing:
      return "ring";
    case CollectiveAlgorithm::kDirectRead:
      return "direct-read";
  }
  return "?";
}

std::string CollectivePlan::ToString() const {
  bool reduces = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
  return absl::StrCat(CollectiveKindName(kind), reduces ? absl::StrCat(" ", ReduceOpName(options.op)) : "", " ",
                      CollectiveAlgorithmName(algorithm), " over ", devices, " devices, ", phases.size(), " phases");
}

absl::StatusOr<Shape> CollectiveOutputShard(CollectiveKind kind, int devices, const Shape& shard) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kPermute:
      return shard;
    case CollectiveKind::kAllGather: {
      if (shard.empty()) return Shape{devices};
      Shape out = shard;
      out[0] *= devices;
      return out;
    }
    case CollectiveKind::kReduceScatter: {
      if (shard.empty() || shard[0] % devices != 0) {
        return absl::InvalidArgumentError(absl::StrCat("reduce-scatter splits axis 0 of each shard ",
                                                       ShapeString(shard), " over ", devices,
                                                       " devices: it must be a multiple of ", devices));
      }
      Shape out = shard;
      out[0] /= devices;
      return out;
    }
  }
  return absl::InternalError("unknown collective");
}

absl::StatusOr<CollectiveGroups> GroupsForAxis(const std::vector<int>& dims, int mesh_axis) {
  int size = 1;
  for (int d : dims) size *= d;
  CollectiveGroups g;
  g.group.assign(size, 0);
  g.position.assign(size, 0);
  if (mesh_axis == -1 || (dims.size() == 1 && mesh_axis == 0)) {
    g.members.emplace_back();
    for (int i = 0; i < size; ++i) {
      g.members[0].push_back(i);
      g.position[i] = i;
    }
    return g;
  }
  if (mesh_axis < 0 || mesh_axis >= static_cast<int>(dims.size())) {
    return absl::InvalidArgumentError(absl::StrCat("a mesh of ", dims.size(), " dimension",
                                                   dims.size() == 1 ? "" : "s", " has no axis ", mesh_axis));
  }
  // Row-major [rows, cols]: axis 0 runs down a column, axis 1 along a row.
  const int rows = dims[0], cols = dims[1];
  const int groups = mesh_axis == 0 ? cols : rows, length = mesh_axis == 0 ? rows : cols;
  g.members.assign(groups, std::vector<int>(length));
  for (int i = 0; i < size; ++i) {
    const int r = i / cols, c = i % cols;
    g.group[i] = mesh_axis == 0 ? c : r;
    g.position[i] = mesh_axis == 0 ? r : c;
    g.members[g.group[i]][g.position[i]] = i;
  }
  return g;
}

namespace {

// Part `i` of `total` elements cut into `parts` nearly equal pieces (the
// first total % parts one longer).
struct Piece {
  uint64_t offset, size;
};
Piece PieceOf(uint64_t total, int parts, int i) {
  uint64_t base = total / parts, rem = total % parts, ui = static_cast<uint64_t>(i);
  return {ui * base + std::min(ui, rem), base + (ui < rem ? 1 : 0)};
}

// As PieceOf, but every piece but the last starts and ends at a multiple of
// 4 elements, so that combine reduces four at a time (a piece may be empty).
Piece QuadPieceOf(uint64_t total, int parts, int i) {
  auto boundary = [&](int k) -> uint64_t {
    if (k >= parts) return total;
    return static_cast<uint64_t>(k) * (total / 4) / parts * 4;
  };
  return {boundary(i), boundary(i + 1) - boundary(i)};
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

CollectiveOp Copy(int from, CollectiveOp::Buffer src, uint64_t src_offset, CollectiveOp::Buffer dst,
                  uint64_t dst_offset, uint64_t elements) {
  CollectiveOp op;
  op.kind = CollectiveOp::kCopy;
  op.src_device = from;
  op.src = src;
  op.src_offset = src_offset;
  op.dst = dst;
  op.dst_offset = dst_offset;
  op.elements = elements;
  return op;
}

// dst[dst_offset..] = op(a[a_offset..], b[b_offset..]), all on one device.
CollectiveOp Combine(CollectiveOp::Buffer a, uint64_t a_offset, CollectiveOp::Buffer b, uint64_t b_offset,
                     CollectiveOp::Buffer dst, uint64_t dst_offset, uint64_t elements) {
  CollectiveOp op;
  op.kind = CollectiveOp::kCombine;
  op.a = a;
  op.a_offset = a_offset;
  op.src = b;
  op.src_offset = b_offset;
  op.dst = dst;
  op.dst_offset = dst_offset;
  op.elements = elements;
  return op;
}

CollectivePhase NewPhase(int n) {
  CollectivePhase p;
  p.ops.resize(n);
  p.waits.resize(n);
  return p;
}

// Direct reduction: position d reads piece [offset, +len) of every peer's
// input into recv and reduces all n in mesh order into dst at 0, so that
// every device sums in the same order.
void DirectReduce(CollectivePlan& plan, uint64_t len, bool scatter) {
  const int n = plan.devices;
  CollectivePhase phase = NewPhase(n);
  for (int d = 0; d < n; ++d) {
    const uint64_t offset = scatter ? d * len : 0;
    auto& ops = phase.ops[d];
    // Where operand k lives on device d: its own input, or a recv slot.
    auto where = [&](int k) -> std::pair<CollectiveOp::Buffer, uint64_t> {
      if (k == d) return {CollectiveOp::kIn, offset};
      return {CollectiveOp::kRecv, static_cast<uint64_t>(k < d ? k : k - 1) * len};
    };
    for (int e = 0; e < n; ++e) {
      if (e == d) continue;
      phase.waits[d].push_back(e);
      ops.push_back(Copy(e, CollectiveOp::kIn, offset, CollectiveOp::kRecv, where(e).second, len));
    }
    // Partial results alternate between kWork and kOut (a kernel never
    // reads and writes one buffer), ending in kOut.
    auto partial = [n](int k) { return (n - 1 - k) % 2 == 0 ? CollectiveOp::kOut : CollectiveOp::kWork; };
    for (int k = 1; k < n; ++k) {
      auto [a, a_off] = k == 1 ? where(0) : std::make_pair(partial(k - 1), uint64_t{0});
      auto [b, b_off] = where(k);
      ops.push_back(Combine(a, a_off, b, b_off, partial(k), 0, len));
    }
  }
  plan.recv_elements = static_cast<uint64_t>(n - 1) * len;
  plan.work_elements = n > 2 ? len : 0;
  plan.phases.push_back(std::move(phase));
}

// Direct-read: position d reduces its slice of every position's input in
// place into its output (block d for reduce-scatter, quad piece d for
// all-reduce); an all-reduce then copies each other slice from its owner.
// A device waits only for the peers it reads: none when its slice is empty.
void PlanDirectRead(CollectivePlan& plan, bool scatter) {
  const int n = plan.devices;
  auto slice = [&](int d) -> Piece {
    if (scatter) return {static_cast<uint64_t>(d) * plan.out_elements, plan.out_elements};
    return QuadPieceOf(plan.in_elements, n, d);
  };
  CollectivePhase reduce = NewPhase(n);
  for (int d = 0; d < n; ++d) {
    const Piece c = slice(d);
    if (c.size == 0) continue;
    for (int e = 0; e < n; ++e) {
      if (e != d) reduce.waits[d].push_back(e);
    }
    CollectiveOp op;
    op.kind = CollectiveOp::kReduce;
    op.src = CollectiveOp::kIn;
    op.src_offset = c.offset;
    op.dst = CollectiveOp::kOut;
    op.dst_offset = scatter ? 0 : c.offset;
    op.elements = c.size;
    reduce.ops[d].push_back(op);
  }
  plan.phases.push_back(std::move(reduce));
  if (scatter) return;
  CollectivePhase gather = NewPhase(n);
  for (int d = 0; d < n; ++d) {
    for (int e = 0; e < n; ++e) {
      const Piece c = slice(e);
      if (e == d || c.size == 0) continue;
      gather.waits[d].push_back(e);
      gather.ops[d].push_back(Copy(e, CollectiveOp::kOut, c.offset, CollectiveOp::kOut, c.offset, c.size));
    }
  }
  plan.phases.push_back(std::move(gather));
}

void PlanAllReduceRing(CollectivePlan& plan) {
  const int n = plan.devices;
  const uint64_t e = plan.in_elements;
  // Reduce-scatter: at step s, device d adds its chunk (d - s - 1) to the
  // partial its left neighbour holds of it; after n - 1 steps device d holds
  // chunk d + 1 fully reduced (every chunk is reduced exactly once).
  for (int s = 0; s + 1 < n; ++s) {
    CollectivePhase phase = NewPhase(n);
    for (int d = 0; d < n; ++d) {
      const int left = Mod(d - 1, n);
      Piece c = QuadPieceOf(e, n, Mod(d - s - 1, n));
      phase.waits[d].push_back(left);
      if (c.size == 0) continue;
      phase.ops[d].push_back(
          Copy(left, s == 0 ? CollectiveOp::kIn : CollectiveOp::kOut, c.offset, CollectiveOp::kRecv, 0, c.size));
      phase.ops[d].push_back(
          Combine(CollectiveOp::kIn, c.offset, CollectiveOp::kRecv, 0, CollectiveOp::kOut, c.offset, c.size));
    }
    plan.phases.push_back(std::move(phase));
  }
  // All-gather: at step s, device d copies chunk (d - s) from its left
  // neighbour, who finished it (reduced, or copied) one step before.
  for (int s = 0; s + 1 < n; ++s) {
    CollectivePhase phase = NewPhase(n);
    for (int d = 0; d < n; ++d) {
      const int left = Mod(d - 1, n);
      Piece c = QuadPieceOf(e, n, Mod(d - s, n));
      phase.waits[d].push_back(left);
      if (c.size == 0) continue;
      phase.ops[d].push_back(Copy(left, CollectiveOp::kOut, c.offset, CollectiveOp::kOut, c.offset, c.size));
    }
    plan.phases.push_back(std::move(phase));
  }
  for (int i = 0; i < n; ++i) plan.recv_elements = std::max(plan.recv_elements, QuadPieceOf(e, n, i).size);
}

void PlanReduceScatterRing(CollectivePlan& plan) {
  const int n = plan.devices;
  const uint64_t block = plan.out_elements;
  // As the all-reduce's first half, shifted so that device d ends with block
  // d: at step s it reduces block (d - s - 2); partials live in kWork, the
  // last step writes the output.
  for (int s = 0; s + 1 < n; ++s) {
    CollectivePhase phase = NewPhase(n);
    const bool last = s + 2 == n;
    for (int d = 0; d < n; ++d) {
      const int left = Mod(d - 1, n);
      const uint64_t offset = static_cast<uint64_t>(Mod(d - s - 2, n)) * block;
      phase.waits[d].push_back(left);
      phase.ops[d].push_back(
          Copy(left, s == 0 ? CollectiveOp::kIn : CollectiveOp::kWork, offset, CollectiveOp::kRecv, 0, block));
      phase.ops[d].push_back(Combine(CollectiveOp::kIn, offset, CollectiveOp::kRecv, 0,
                                     last ? CollectiveOp::kOut : CollectiveOp::kWork, last ? 0 : offset, block));
    }
    plan.phases.push_back(std::move(phase));
  }
  plan.recv_elements = block;
  plan.work_elements = n > 2 ? plan.in_elements : 0;
}

void PlanAllGather(CollectivePlan& plan) {
  const bool ring = plan.algorithm == CollectiveAlgorithm::kRing;
  const int n = plan.devices;
  const uint64_t e = plan.in_elements;
  if (!ring) {
    CollectivePhase phase = NewPhase(n);
    for (int d = 0; d < n; ++d) {
      for (int k = 0; k < n; ++k) {
        if (k != d) phase.waits[d].push_back(k);
        phase.ops[d].push_back(Copy(k, CollectiveOp::kIn, 0, CollectiveOp::kOut, k * e, e));
      }
    }
    plan.phases.push_back(std::move(phase));
    return;
  }
  // Step s: device d takes block (d - 1 - s) from its left neighbour (from
  // its input at step 0, else from what it received one step before).
  for (int s = 0; s + 1 < n; ++s) {
    CollectivePhase phase = NewPhase(n);
    for (int d = 0; d < n; ++d) {
      const int left = Mod(d - 1, n);
      const uint64_t block = static_cast<uint64_t>(Mod(d - 1 - s, n));
      phase.waits[d].push_back(left);
      if (s == 0) phase.ops[d].push_back(Copy(d, CollectiveOp::kIn, 0, CollectiveOp::kOut, d * e, e));
      phase.ops[d].push_back(Copy(left, s == 0 ? CollectiveOp::kIn : CollectiveOp::kOut, s == 0 ? 0 : block * e,
                                  CollectiveOp::kOut, block * e, e));
    }
    plan.phases.push_back(std::move(phase));
  }
}

void PlanBroadcast(CollectivePlan& plan) {
  const bool ring = plan.algorithm == CollectiveAlgorithm::kRing;
  const int n = plan.devices, root = plan.options.root;
  const uint64_t e = plan.in_elements;
  if (!ring) {
    CollectivePhase phase = NewPhase(n);
    for (int d = 0; d < n; ++d) {
      if (d != root) phase.waits[d].push_back(root);
      phase.ops[d].push_back(Copy(root, CollectiveOp::kIn, 0, CollectiveOp::kOut, 0, e));
    }
    plan.phases.push_back(std::move(phase));
    return;
  }
  // A pipelined chain: the device k places after the root copies chunk j
  // from the one before it at phase j + k - 1.
  const int chunks = n;
  for (int p = 0; p + 2 < chunks + n; ++p) {
    CollectivePhase phase = NewPhase(n);
    if (p == 0) phase.ops[root].push_back(Copy(root, CollectiveOp::kIn, 0, CollectiveOp::kOut, 0, e));
    for (int k = 1; k < n; ++k) {
      const int d = Mod(root + k, n), before = Mod(d - 1, n);
      const int j = p - (k - 1);
      if (j < 0 || j >= chunks) continue;
      Piece c = PieceOf(e, chunks, j);
      phase.waits[d].push_back(before);
      if (c.size == 0) continue;
      phase.ops[d].push_back(Copy(before, k == 1 ? CollectiveOp::kIn : CollectiveOp::kOut, c.offset,
                                  CollectiveOp::kOut, c.offset, c.size));
    }
    plan.phases.push_back(std::move(phase));
  }
}

absl::Status PlanPermute(CollectivePlan& plan) {
  const int n = plan.devices;
  std::vector<int> source_of(n, -1);
  for (auto [s, t] : plan.options.pairs) {
    if (s < 0 || s >= n || t < 0 || t >= n) {
      return absl::InvalidArgumentError(absl::StrCat("permute pair (", s, ", ", t, ") is outside the ", n,
                                                     " devices the collective runs over (positions 0..", n - 1, ")"));
    }
    if (source_of[t] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("permute names device ", t, " as a target twice"));
    }
    source_of[t] = s;
  }
  CollectivePhase phase = NewPhase(n);
  for (int d = 0; d < n; ++d) {
    const int s = source_of[d];
    if (s < 0) {
      CollectiveOp zero;
      zero.kind = CollectiveOp::kZero;
      zero.dst = CollectiveOp::kOut;
      zero.elements = plan.out_elements;
      phase.ops[d].push_back(zero);
      continue;
    }
    if (s != d) phase.waits[d].push_back(s);
    phase.ops[d].push_back(Copy(s, CollectiveOp::kIn, 0, CollectiveOp::kOut, 0, plan.in_elements));
  }
  plan.phases.push_back(std::move(phase));
  return absl::OkStatus();
}

// The algorithm `options` ask for, resolved for this collective.
absl::StatusOr<CollectiveAlgorithm> ChooseAlgorithm(CollectiveKind kind, const CollectiveOptions& options, int devices,
                                                    uint64_t shard_bytes, bool shared_memory) {
  const bool reduces = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
  switch (options.algorithm) {
    case CollectiveAlgorithm::kAuto:
      if (devices == 1 || kind == CollectiveKind::kPermute || shard_bytes < options.ring_threshold_bytes) {
        return CollectiveAlgorithm::kDirect;
      }
      return reduces && shared_memory ? CollectiveAlgorithm::kDirectRead : CollectiveAlgorithm::kRing;
    case CollectiveAlgorithm::kDirect:
      return CollectiveAlgorithm::kDirect;
    case CollectiveAlgorithm::kRing:
      if (kind == CollectiveKind::kPermute) {
        return absl::InvalidArgumentError("permute has no ring algorithm (every pair is one copy)");
      }
      return devices == 1 ? CollectiveAlgorithm::kDirect : CollectiveAlgorithm::kRing;
    case CollectiveAlgorithm::kDirectRead:
      if (!reduces) {
        return absl::InvalidArgumentError(absl::StrCat(
            "direct-read is an algorithm of all-reduce and reduce-scatter; ", CollectiveKindName(kind),
            " copies, and its direct algorithm already reads the peers' memory"));
      }
      if (devices > 1 && !shared_memory) {
        return absl::FailedPreconditionError(absl::StrCat(
            "direct-read reads the peers' inputs in place, but these ", devices,
            " devices cannot read each other's memory directly (their copies stage through the host); "
            "use ring or direct"));
      }
      return devices == 1 ? CollectiveAlgorithm::kDirect : CollectiveAlgorithm::kDirectRead;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective algorithm ", static_cast<int>(options.algorithm)));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CollectivePlan>> PlanCollective(CollectiveKind kind,
                                                                     const CollectiveOptions& options,
                                                                     int devices, const Shape& shard, DType dtype,
                                                                     bool shared_memory) {
  if (devices < 1) return absl::InvalidArgumentError("a collective needs at least one device");
  auto plan = std::make_shared<CollectivePlan>();
  plan->kind = kind;
  plan->options = options;
  plan->dtype = dtype;
  plan->devices = devices;
  plan->in_elements = static_cast<uint64_t>(NumElements(shard));
  CAUSEWAY_ASSIGN_OR_RETURN(Shape out, CollectiveOutputShard(kind, devices, shard));
  plan->out_elements = static_cast<uint64_t>(NumElements(out));
  const bool reduces = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
  if (reduces && dtype != DType::kF32 && dtype != DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveKindName(kind), " ", ReduceOpName(options.op),
                                                   " reduces f32 or i32, not ", DTypeName(dtype)));
  }
  if (kind == CollectiveKind::kBroadcast && (options.root < 0 || options.root >= devices)) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", options.root, " is outside the ", devices,
                                                   " devices the collective runs over (positions 0..", devices - 1,
                                                   ")"));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(
      plan->algorithm,
      ChooseAlgorithm(kind, options, devices, plan->in_elements * DTypeSize(dtype), shared_memory));

  if (devices == 1 && kind != CollectiveKind::kPermute) {
    CollectivePhase phase = NewPhase(1);
    phase.ops[0].push_back(Copy(0, CollectiveOp::kIn, 0, CollectiveOp::kOut, 0, plan->in_elements));
    plan->phases.push_back(std::move(phase));
    return plan;
  }
  const CollectiveAlgorithm algorithm = plan->algorithm;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      if (algorithm == CollectiveAlgorithm::kRing) {
        PlanAllReduceRing(*plan);
      } else if (algorithm == CollectiveAlgorithm::kDirectRead) {
        PlanDirectRead(*plan, /*scatter=*/false);
      } else {
        DirectReduce(*plan, plan->in_elements, /*scatter=*/false);
      }
      break;
    case CollectiveKind::kReduceScatter:
      if (algorithm == CollectiveAlgorithm::kRing) {
        PlanReduceScatterRing(*plan);
      } else if (algorithm == CollectiveAlgorithm::kDirectRead) {
        PlanDirectRead(*plan, /*scatter=*/true);
      } else {
        DirectReduce(*plan, plan->out_elements, /*scatter=*/true);
      }
      break;
    case CollectiveKind::kAllGather:
      PlanAllGather(*plan);
      break;
    case CollectiveKind::kBroadcast:
      PlanBroadcast(*plan);
      break;
    case CollectiveKind::kPermute:
      CAUSEWAY_RETURN_IF_ERROR(PlanPermute(*plan));
      break;
  }
  return plan;
}

}  // namespace causeway
