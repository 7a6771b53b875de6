// A program over several islands, split by a single controller into one
// ProgramDef per island: every edge that crosses islands becomes a send node
// on the producing island and a receive node on the consuming one, joined by
// a numbered channel. Each part is then loaded on its island (BuildProgram
// there, with real meshes and a channel for each id), and every run of the
// program is one run of each part under one ExecuteOptions::tag.
//
// The controller holds no accelerators: it types values by building over
// virtual meshes (meshes of null devices, which building never touches).
#ifndef CAUSEWAY_SCHEDULER_SPLIT_H_
#define CAUSEWAY_SCHEDULER_SPLIT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "causeway/scheduler/mesh.h"
#include "causeway/scheduler/program_def.h"

namespace causeway {

// One channel of a split program: `value` (its name in the whole program)
// goes from `from_island` to `to_island`, once per run.
struct ChannelSpec {
  uint64_t id = 0;
  std::string from_island, to_island;
  std::string value;
};

// What one island loads.
struct ProgramPart {
  std::string island;
  ProgramDef def;
};

struct SplitProgram {
  // One per island that has nodes or parameters, in order of first
  // appearance (the def's parameters, then its nodes in the global order).
  std::vector<ProgramPart> parts;
  // In order of their ids: first_channel_id, first_channel_id + 1, ...
  std::vector<ChannelSpec> channels;
  // For each parameter and output of the whole program (in def order): which
  // part, and its index among that part's parameters / outputs. A run passes
  // parameter i to part parameters[i].first at parameters[i].second.
  std::vector<std::pair<int, int>> parameters, outputs;
};

// Splits `def`, whose MeshDefs name their islands, into one part per island,
// numbering the channels from `first_channel_id`.
//
// Order (what keeps the islands from deadlocking): the nodes are taken in one
// global order, the topological order that keeps the def's where the
// dependencies allow (Kahn's algorithm taking the earliest-listed ready node,
// as ProgramBuilder does), and every part lists its nodes in that order. A
// node runs on the island of its mesh. When a node reads a value produced (or
// passed as a parameter) on another island, the first time that island needs
// that value a send of it is appended to the producer's part and a receive is
// appended to the consumer's part right before the node, under the value's
// own name; later readers on that island reuse it (one channel per value and
// consuming island).
//
// Layout: a channel carries a replicated or split(0) value. A value split
// along another axis is first resharded on its island (a node "<value>@dcn")
// to split(0) over mesh axis 0 if dim 0 divides by that axis, else to
// replicated. It is received split(0) over the consumer mesh's axis 0 if it
// was sent split(0) and dim 0 divides, else replicated; where the consumer
// needs it elsewhere (a call on another mesh of the island or wanting other
// shards, a collective over the value's own sharding), a reshard node follows
// the receive and the consumer reads its output instead, so that each part
// computes exactly what the whole program would on one island.
//
// Parameters go to the part of their mesh's island, outputs to the part that
// computes them; each part holds the meshes and functions it uses, no others.
// A def whose meshes all name one island, or none, gives one part and no
// channels.
//
// `def` is untrusted: it is built whole (over virtual meshes, all on one
// island) before it is split, so it is refused exactly as BuildProgram would
// refuse it (unknown names, cycles, shapes, with errors that name the node);
// and InvalidArgument also for a mesh that names no island in a def that
// names several, for send or receive nodes (splitting adds those), for a
// mesh of more than kMaxVirtualMeshDevices devices, and for an island whose
// part would compute nothing that is output or sent. Every part is built
// over virtual meshes before it is returned.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(SplitProgram split, SplitByIsland(def, /*first_channel_id=*/1));
//   for (const ChannelSpec& c : split.channels) channels[c.id] = transport->Connect(c);  // both ends
//   // On each island: BuildProgram(part.def, its meshes, channels), Load,
//   // then Execute every run of every part with one tag per run.
absl::StatusOr<SplitProgram> SplitByIsland(const ProgramDef& def, uint64_t first_channel_id);

// The most devices a mesh of a def to split may have (each virtual mesh
// holds a pointer per device).
inline constexpr int64_t kMaxVirtualMeshDevices = int64_t{1} << 16;

// Meshes of null devices standing for `def`'s meshes, all on `island` (ids
// 1, 2, ... in def order), to build `def` where its island is not: the
// program's values and steps come out as on the island, but it cannot run.
// Refuses MeshDefs BuildProgram would refuse, and meshes of more than
// kMaxVirtualMeshDevices.
absl::StatusOr<absl::flat_hash_map<std::string, std::shared_ptr<Mesh>>> VirtualMeshes(
    const ProgramDef& def, const std::string& island);

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_SPLIT_H_
