// Collectives over the accelerators of a mesh, as program nodes: the data
// moves by device copies (ICI: copies between queues of one VkDevice, or
// through imported memory between VkDevices) and reductions run as kernels.
//
// A collective runs over a group of devices: every device of the mesh (in
// row-major order), or, over one axis of a 2-D mesh, each line of devices
// along that axis at once (a group per index of the other axis, position p
// being mesh coordinate p along the axis). Every device holds one shard of
// the input (shard shape S, E elements); position p is the group's p-th
// device.
//
//   all-reduce      every device gets op(shard_0, ..., shard_{n-1}); the
//                   output is replicated, shape S.
//   all-gather      every device gets the shards concatenated along axis 0 in
//                   mesh order; the output is replicated, shape [n*S0, S1...].
//   reduce-scatter  device p gets block p (along axis 0) of the reduction; the
//                   output is split along axis 0, global shape S (S0 must be
//                   a multiple of n).
//   broadcast       every device gets the shard of position `root`;
//                   replicated, shape S.
//   permute         for each (source, target) pair, target gets source's
//                   shard (a source may feed several targets; a target takes
//                   one source); a device that is no target gets zeros. The
//                   output has the input's shape and sharding.
//
// Reductions (sum, max) take f32 or i32; the others move bytes of any dtype.
//
// Algorithms: direct (one phase: every device reads what it needs from its
// peers at once; least latency) or ring (bandwidth-optimal over links: all-
// reduce is a reduce-scatter and an all-gather around the ring, 2(n-1)
// phases of chunks of about E/n elements; broadcast is a pipelined chain), or,
// for the reductions on devices that read each other's memory directly (one
// VkDevice, or imported memory; not host-staged), direct-read: device p
// reduces its slice p of all n inputs in one kernel that reads them in place
// from the peers' memory, in position order, into its output (reduce-scatter
// ends there); an all-reduce then copies every other slice from its owner's
// output. Two phases, no scratch, and the fewest bytes a shared memory bus
// moves in two phases. kAuto picks, for shards of at least
// CollectiveOptions::ring_threshold_bytes, direct-read for the reductions
// where the devices share memory and ring otherwise; direct below. Every
// phase is a gang call: each device's part waits only on the peers it reads
// from.
#ifndef CAUSEWAY_SCHEDULER_COLLECTIVES_H_
#define CAUSEWAY_SCHEDULER_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "causeway/scheduler/dtype.h"

namespace causeway {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kPermute };
enum class ReduceOp { kSum, kMax };
enum class CollectiveAlgorithm { kAuto, kDirect, kRing, kDirectRead };
const char* CollectiveKindName(CollectiveKind kind);
const char* ReduceOpName(ReduceOp op);
const char* CollectiveAlgorithmName(CollectiveAlgorithm algorithm);  // "auto", "direct", "ring", "direct-read"

struct CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;  // all-reduce, reduce-scatter
  int root = 0;                  // broadcast
  std::vector<std::pair<int, int>> pairs;  // permute: (source, target) positions
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto;
  // kAuto: ring (direct-read for reductions where devices share memory) from
  // this shard size.
  uint64_t ring_threshold_bytes = 256 << 10;
  // -1: one group of every device of the mesh. 0 or 1: over that axis of a
  // 2-D mesh, one group per line of devices along it.
  int mesh_axis = -1;
};

// Which devices of a mesh run a collective together, in position order.
struct CollectiveGroups {
  std::vector<std::vector<int>> members;  // [group][position]: device index in the mesh
  std::vector<int> group, position;       // [device index]
  int size() const { return static_cast<int>(members[0].size()); }  // devices per group
  // The device at `pos` of the group of `device`.
  int Peer(int device, int pos) const { return members[group[device]][pos]; }
};

// The groups of a mesh of `dims` (1 or 2 entries) for `mesh_axis`; an error
// names an axis the mesh does not have.
absl::StatusOr<CollectiveGroups> GroupsForAxis(const std::vector<int>& dims, int mesh_axis);

// One device's work in one phase of a collective.
struct CollectiveOp {
  // The buffers a collective touches on each device.
  enum Buffer : uint8_t {
    kIn,    // the input shard
    kOut,   // the output shard
    kWork,  // scratch: partial reductions (reduce-scatter ring), E elements
    kRecv,  // scratch: what was copied from peers before it is reduced
  };
  enum Kind : uint8_t {
    kCopy,     // src_device's src[src_offset..] -> this device's dst[dst_offset..], `elements`
    kCombine,  // dst[dst_offset + i] = op(a[a_offset + i], src[src_offset + i]) on this device
    kZero,     // dst[dst_offset..] = 0
    // dst[dst_offset + i] = op(src of position 0 [src_offset + i], ..., src
    // of position n-1 [...]) for i < elements: every position of the group,
    // reduced in position order, each read in place from its own memory.
    kReduce,
  };
  Kind kind = kCopy;
  Buffer src = kIn;
  int src_device = 0;  // position (kCopy)
  uint64_t src_offset = 0;  // elements
  Buffer a = kIn;           // kCombine: the first operand
  uint64_t a_offset = 0;
  Buffer dst = kOut;
  uint64_t dst_offset = 0;
  uint64_t elements = 0;
};

// One phase of a collective: per device position, what it does and which
// peers it must wait for first (their previous phase, or, in the first phase,
// their input).
struct CollectivePhase {
  std::vector<std::vector<CollectiveOp>> ops;  // [position]
  std::vector<std::vector<int>> waits;         // [position]: peer positions
};

// A collective lowered for one mesh size and shard: its phases and scratch.
struct CollectivePlan {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  CollectiveOptions options;
  DType dtype = DType::kF32;
  int devices = 1;
  uint64_t in_elements = 0, out_elements = 0;  // per shard
  uint64_t work_elements = 0, recv_elements = 0;  // scratch per device (0: none)
  // The algorithm chosen (never kAuto); one device or a permute: kDirect.
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kDirect;
  std::vector<CollectivePhase> phases;
  std::string ToString() const;  // "all-reduce sum ring over 4 devices, 6 phases"
};

// Plans `kind` over `devices` positions for input shards of `shard` shape and
// `dtype`; `shared_memory` says whether the devices read each other's memory
// directly (kAuto's choice, and what direct-read needs). Errors say what is
// wrong (dtype not reducible, shape not divisible, root or pairs out of
// range, a target named twice, direct-read without shared memory).
absl::StatusOr<std::shared_ptr<const CollectivePlan>> PlanCollective(CollectiveKind kind,
                                                                     const CollectiveOptions& options,
                                                                     int devices, const Shape& shard, DType dtype,
                                                                     bool shared_memory);

// The output shard shape of `kind` for input shards of `shard` over `devices`.
absl::StatusOr<Shape> CollectiveOutputShard(CollectiveKind kind, int devices, const Shape& shard);

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_COLLECTIVES_H_
