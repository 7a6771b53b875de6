// Transfers: a value moved from one (mesh, sharding) to another of the same
// island, shard by shard, as device copies. Between meshes of one shape and
// sharding this is one copy per device; between shardings (replicated, split
// along any array axis over any mesh axis) and mesh shapes it is resharding:
// each target device copies the parts of its shard from the source devices
// that hold them (the same accelerator when it holds one), as strided
// regions of one copy command per source.
#ifndef CAUSEWAY_SCHEDULER_TRANSFER_H_
#define CAUSEWAY_SCHEDULER_TRANSFER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/host_budget.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/dtype.h"
#include "causeway/scheduler/mesh.h"

namespace causeway {

struct TransferPlan {
  struct Piece {
    int source = 0;  // position on the source mesh
    std::vector<CommandList::CopyRegion> regions;  // bytes, in the two shards
  };
  std::vector<std::vector<Piece>> pieces;  // [target position]
  size_t region_count() const;
  // Of the host budget of whoever asked for the plan (an island's session),
  // for its regions; given back with the plan.
  HostCharge charge;
};

// Plans moving an array of `shape` and `dtype` from `from` (laid out by
// `from_sharding`) to `to` (by `to_sharding`). Errors when a sharding does
// not fit its mesh. A plan holds a region per contiguous run (a reshard of
// [N, 2] split on axis 1 has N per target), so with a `budget` its regions
// are counted and charged to it before any is made: ResourceExhausted
// naming `what` (e.g. "reshard 'r'") and the budget when they do not fit.
absl::StatusOr<std::shared_ptr<const TransferPlan>> PlanTransfer(
    const Shape& shape, DType dtype, const Mesh& from, const Sharding& from_sharding, const Mesh& to,
    const Sharding& to_sharding, const std::shared_ptr<HostBudget>& budget = nullptr,
    absl::string_view what = "a transfer");

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_TRANSFER_H_
