#include "causeway/scheduler/transfer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/checked_size.h"
#include "causeway/base/status.h"

namespace causeway {
namespace {

// A box of global indices: [lo, hi) per axis.
struct Box {
  std::vector<int64_t> lo, hi;
};

// The part of the global array (of `shape`) that position `p` of `mesh` holds.
Box ShardBox(const Shape& shape, const Sharding& sharding, const Mesh& mesh, int p) {
  Box b{std::vector<int64_t>(shape.size(), 0), shape};
  if (!sharding.replicated()) {
    const int a = sharding.array_axis;
    const int64_t part = shape[a] / mesh.dims()[sharding.mesh_axis];
    const int64_t j = mesh.Coordinate(p, sharding.mesh_axis);
    b.lo[a] = j * part;
    b.hi[a] = (j + 1) * part;
  }
  return b;
}

// The first axis from which a run of `in` is contiguous in both layouts:
// the axes after it are whole in `in`, `src` and `dst` (-1: all are).
int RunAxis(const Box& in, const Box& src, const Box& dst) {
  auto extent = [](const Box& b, int k) { return b.hi[k] - b.lo[k]; };
  int k = static_cast<int>(in.lo.size()) - 1;
  while (k >= 0 && extent(in, k) == extent(src, k) && extent(in, k) == extent(dst, k)) --k;
  return k;
}

// How many regions Regions(in, src, dst, ...) makes, before merging: one per
// index of the axes before the run axis.
uint64_t RegionCount(const Box& in, const Box& src, const Box& dst) {
  uint64_t n = 1;
  // Each factor is at most an axis of a shape whose element count is
  // checked, so the product is at most that count.
  for (int i = 0; i < RunAxis(in, src, dst); ++i) n *= static_cast<uint64_t>(in.hi[i] - in.lo[i]);
  return n;
}

// Copies the intersection `in` of two boxes from a shard laid out as `src`
// to one laid out as `dst` (each row-major over its own box), as contiguous
// byte regions.
std::vector<CommandList::CopyRegion> Regions(const Box& in, const Box& src, const Box& dst, uint64_t elem) {
  const int rank = static_cast<int>(in.lo.size());
  auto extent = [](const Box& b, int k) { return b.hi[k] - b.lo[k]; };
  // Axes after k are whole in both layouts: a run is contiguous over them
  // and over the range of axis k.
  const int k = RunAxis(in, src, dst);
  int64_t run = 1;
  for (int i = std::max(k, 0); i < rank; ++i) run *= extent(in, i);
  std::vector<int64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (int i = rank - 2; i >= 0; --i) {
    src_stride[i] = src_stride[i + 1] * extent(src, i + 1);
    dst_stride[i] = dst_stride[i + 1] * extent(dst, i + 1);
  }
  std::vector<CommandList::CopyRegion> regions;
  // Walk every index of the axes before k (an odometer); axis k starts at lo.
  std::vector<int64_t> idx(in.lo);
  while (true) {
    int64_t s = 0, d = 0;
    for (int i = 0; i < rank; ++i) {
      s += (idx[i] - src.lo[i]) * src_stride[i];
      d += (idx[i] - dst.lo[i]) * dst_stride[i];
    }
    regions.push_back({static_cast<uint64_t>(s) * elem, static_cast<uint64_t>(d) * elem,
                       static_cast<uint64_t>(run) * elem});
    int i = k - 1;
    while (i >= 0 && ++idx[i] == in.hi[i]) {
      idx[i] = in.lo[i];
      --i;
    }
    if (i < 0) break;
  }
  // Merge runs that follow each other in both layouts.
  std::vector<CommandList::CopyRegion> merged;
  for (const auto& r : regions) {
    if (!merged.empty() && merged.back().src_offset + merged.back().size == r.src_offset &&
        merged.back().dst_offset + merged.back().size == r.dst_offset) {
      merged.back().size += r.size;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace

size_t TransferPlan::region_count() const {
  size_t n = 0;
  for (const auto& target : pieces) {
    for (const Piece& p : target) n += p.regions.size();
  }
  return n;
}

absl::StatusOr<std::shared_ptr<const TransferPlan>> PlanTransfer(
    const Shape& shape, DType dtype, const Mesh& from, const Sharding& from_sharding, const Mesh& to,
    const Sharding& to_sharding, const std::shared_ptr<HostBudget>& budget, absl::string_view what) {
  CAUSEWAY_RETURN_IF_ERROR(ShardShape(shape, from_sharding, from).status());
  CAUSEWAY_RETURN_IF_ERROR(ShardShape(shape, to_sharding, to).status());
  // A scalar is an array of one element.
  const Shape global = shape.empty() ? Shape{1} : shape;
  const uint64_t elem = DTypeSize(dtype);
  // What each target copies from which source: the plan's regions are
  // counted (and charged) before any is made.
  struct Part {
    int target, source;
    Box in, src, dst;
  };
  std::vector<Part> parts;
  uint64_t regions = 0;
  for (int t = 0; t < to.size(); ++t) {
    const Box want = ShardBox(global, to_sharding, to, t);
    // Source blocks: the distinct boxes of the source layout; for each, the
    // positions holding it (several when replicated along a mesh axis).
    std::vector<std::pair<Box, std::vector<int>>> blocks;
    for (int p = 0; p < from.size(); ++p) {
      Box b = ShardBox(global, from_sharding, from, p);
      auto it = std::find_if(blocks.begin(), blocks.end(), [&](const auto& e) { return e.first.lo == b.lo; });
      if (it == blocks.end()) {
        blocks.push_back({b, {p}});
      } else {
        it->second.push_back(p);
      }
    }
    for (const auto& [box, holders] : blocks) {
      Box in{want.lo, want.hi};
      bool empty = false;
      for (size_t i = 0; i < global.size(); ++i) {
        in.lo[i] = std::max(want.lo[i], box.lo[i]);
        in.hi[i] = std::min(want.hi[i], box.hi[i]);
        empty |= in.lo[i] >= in.hi[i];
      }
      if (empty) continue;
      // The holder on the target's own accelerator if there is one, else
      // spread the targets over the holders.
      int source = holders[t % holders.size()];
      for (int p : holders) {
        if (from.device(p) == to.device(t)) source = p;
      }
      CAUSEWAY_ASSIGN_OR_RETURN(regions, CheckedAdd(regions, RegionCount(in, box, want), "copy regions"));
      parts.push_back({t, source, std::move(in), box, want});
    }
  }
  auto plan = std::make_shared<TransferPlan>();
  if (budget != nullptr) {
    CAUSEWAY_ASSIGN_OR_RETURN(const uint64_t bytes,
                              CheckedMul(regions, sizeof(CommandList::CopyRegion), "a plan's bytes"));
    CAUSEWAY_ASSIGN_OR_RETURN(plan->charge, HostBudget::Charge(budget, bytes,
                                                               absl::StrCat("the plan of ", what, " (",
                                                                            regions, " copy regions)")));
  }
  plan->pieces.resize(to.size());
  for (Part& part : parts) {
    plan->pieces[part.target].push_back({part.source, Regions(part.in, part.src, part.dst, elem)});
  }
  return plan;
}

}  // namespace causeway
