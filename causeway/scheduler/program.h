// Programs: DAGs of function calls on meshes whose edges are sharded arrays,
// built with ProgramBuilder, validated and lowered once, run many times.
#ifndef CAUSEWAY_SCHEDULER_PROGRAM_H_
#define CAUSEWAY_SCHEDULER_PROGRAM_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/channel.h"
#include "causeway/scheduler/collectives.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/mesh.h"
#include "causeway/scheduler/transfer.h"

namespace causeway {

// A value of a lowered program: one array per run.
struct ProgramValue {
  enum Kind { kParameter, kIntermediate, kOutput };
  std::string name;
  Kind kind = kIntermediate;
  std::shared_ptr<Mesh> mesh;
  Shape shape;
  DType dtype = DType::kF32;
  Sharding sharding;
};

// One gang call of a lowered program: a function call on every device of its
// mesh, a transfer (a value copied shard by shard to another mesh), one
// phase of a collective, or one end of a value crossing islands (a send
// copies each distinct shard to host-visible staging and hands it to its
// channel; a receive copies what the channel delivered into each shard).
struct ProgramStep {
  enum Kind { kCall, kTransfer, kCollective, kSend, kReceive };
  Kind kind = kCall;
  std::string node;  // the builder's node name ("x@mesh2" for transfers, "node/phase2" for collectives)
  std::shared_ptr<const Function> function;  // kCall
  std::shared_ptr<Mesh> mesh;                // where it runs
  std::vector<int> inputs;                   // value ids
  std::vector<int> outputs;
  std::shared_ptr<const TransferPlan> transfer;      // kTransfer
  bool reads_peers = false;  // kTransfer within one mesh reading other devices' shards
  std::shared_ptr<const CollectivePlan> collective;  // kCollective
  int phase = 0;                                     // kCollective: which of the plan's phases
  // kCollective: which devices of the mesh run the plan together (the plan's
  // positions are positions in a group).
  std::shared_ptr<const CollectiveGroups> groups;
  std::shared_ptr<Channel> channel;  // kSend, kReceive
  // Whether a device's part waits for other devices (a collective phase
  // over several) or for another island (a receive): such a step always
  // begins a gang call of its own.
  bool waits_on_peers() const {
    if (kind == kReceive) return true;
    if (kind == kTransfer) return reads_peers;
    if (kind != kCollective) return false;
    for (const auto& w : collective->phases[phase].waits) {
      if (!w.empty()) return true;
    }
    return false;
  }
};

// Immutable after Build.
class Program {
 public:
  const std::string& name() const { return name_; }
  const std::vector<ProgramValue>& values() const { return values_; }
  const std::vector<ProgramStep>& steps() const { return steps_; }  // in dispatch order
  const std::vector<int>& parameters() const { return parameters_; }
  const std::vector<int>& outputs() const { return outputs_; }
  int FindValue(const std::string& name) const;  // -1 if none
  std::string DebugString() const;

 private:
  friend class ProgramBuilder;
  friend class ProgramLowering;
  std::string name_;
  std::vector<ProgramValue> values_;
  std::vector<ProgramStep> steps_;
  std::vector<int> parameters_;
  std::vector<int> outputs_;
};

// Builds a program by names. Build() validates (unknown or doubly produced
// values, cycles, shapes, dtypes, meshes) with errors that name the node, and
// lowers in the order the nodes were added wherever that order respects the
// dependencies (the dispatch order is then exactly the builder's: islands
// that exchange values rely on it), and: a call whose input lives on another mesh of the island gets a
// transfer step, which also reshards (to the input's own sharding if it fits
// the function, else to replicated or the split that does). On one mesh, a
// sharding changes only by an explicit Reshard node.
//
// Example:
//   ProgramBuilder b("double-then-add");
//   b.Parameter("x", mesh, {1024}, DType::kF32, Sharding::Split(0));
//   b.Call("double", scale2, mesh, {"x"}, {"y"});
//   b.Call("sum", add, mesh, {"x", "y"}, {"z"});
//   b.Output("z");
//   CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Program> program, b.Build());
class ProgramBuilder {
 public:
  explicit ProgramBuilder(std::string name) : name_(std::move(name)) {}

  ProgramBuilder& Parameter(std::string value, std::shared_ptr<Mesh> mesh, Shape shape, DType dtype,
                            Sharding sharding = Sharding::Replicated());
  // Calls `function` on every device of `mesh`. Outputs take
  // `output_shardings` if given, else the sharding of the first input whose
  // shard shape matches, else replicated.
  ProgramBuilder& Call(std::string node, std::shared_ptr<const Function> function, std::shared_ptr<Mesh> mesh,
                       std::vector<std::string> inputs, std::vector<std::string> outputs,
                       std::vector<Sharding> output_shardings = {});
  ProgramBuilder& Output(std::string value);

  // `input` laid out on `mesh` by `sharding` (a copy; any mesh of the island).
  ProgramBuilder& Reshard(std::string node, std::shared_ptr<Mesh> mesh, std::string input, std::string output,
                          Sharding sharding);

  // A collective over the devices of `mesh` on `input` (moved to `mesh` first
  // if it lives on another mesh), over every device or, on a 2-D mesh, over
  // options.mesh_axis (one collective per line of devices along it); see
  // collectives.h for what each computes. The output's sharding: a
  // reduce-scatter's is split(0) over the collective's axis; a permute keeps
  // the input's; the others are replicated, except that over one axis of a
  // 2-D mesh an input split over the other axis stays split over it (each
  // line computes on its own piece).
  ProgramBuilder& Collective(std::string node, CollectiveKind kind, std::shared_ptr<Mesh> mesh, std::string input,
                             std::string output, CollectiveOptions options = {});
  ProgramBuilder& AllReduce(std::string node, std::shared_ptr<Mesh> mesh, std::string input, std::string output,
                            ReduceOp op = ReduceOp::kSum,
                            CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto);
  ProgramBuilder& AllGather(std::string node, std::shared_ptr<Mesh> mesh, std::string input, std::string output,
                            CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto);
  ProgramBuilder& ReduceScatter(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                std::string output, ReduceOp op = ReduceOp::kSum,
                                CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto);
  ProgramBuilder& Broadcast(std::string node, std::shared_ptr<Mesh> mesh, std::string input, std::string output,
                            int root = 0, CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto);
  ProgramBuilder& CollectivePermute(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                    std::string output, std::vector<std::pair<int, int>> pairs);

  // Sends `value` to another island over `channel`, run after run. The
  // value must be replicated or split along array axis 0 (contiguous shards);
  // a send has no output.
  ProgramBuilder& Send(std::string node, std::string value, std::shared_ptr<Channel> channel);
  // `value`, laid out on `mesh` by `sharding` (replicated or split along
  // array axis 0), arrives from another island over `channel`. Its devices
  // wait for it at this node's place in the order, so add it just before
  // the first node that reads it.
  ProgramBuilder& Receive(std::string node, std::shared_ptr<Mesh> mesh, std::string value, Shape shape,
                          DType dtype, Sharding sharding, std::shared_ptr<Channel> channel);

  // Charges the host memory of the program's transfer plans (a region per
  // contiguous run) to `budget`, as each is planned: Build fails with
  // ResourceExhausted naming the node when one does not fit. Islands charge
  // the loading session's budget.
  ProgramBuilder& ChargeTo(std::shared_ptr<HostBudget> budget);

  absl::StatusOr<std::shared_ptr<const Program>> Build() const;

 private:
  friend class ProgramLowering;  // Build's stages (program.cc)
  struct Param {
    std::string value;
    std::shared_ptr<Mesh> mesh;
    Shape shape;
    DType dtype;
    Sharding sharding;
  };
  struct Node {
    std::string name;
    std::shared_ptr<const Function> function;  // null for a collective
    std::shared_ptr<Mesh> mesh;
    std::vector<std::string> inputs, outputs;
    std::vector<Sharding> output_shardings;
    bool collective = false;
    CollectiveKind collective_kind = CollectiveKind::kAllReduce;
    CollectiveOptions collective_options;
    std::optional<Sharding> reshard;  // a Reshard node
    std::shared_ptr<Channel> channel;  // a Send or Receive node
    bool send = false;
    bool receive = false;
    Shape shape;  // Receive: what arrives
    DType dtype = DType::kF32;
  };
  std::string name_;
  std::shared_ptr<HostBudget> budget_;
  std::vector<Param> params_;
  std::vector<Node> nodes_;
  std::vector<std::string> outputs_;
};

// The order in which a program's nodes run: each after the nodes whose
// outputs it reads, and among the nodes that are ready the one added first
// (Kahn's algorithm), so an order that already respects the dependencies is
// kept. `reads[n]` lists the nodes whose outputs node n reads. Nodes on a
// cycle, and those after one, are left out. ProgramBuilder orders by it, and
// SplitByIsland places its sends and receives by it.
std::vector<int> NodeOrder(const std::vector<std::vector<int>>& reads);

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_PROGRAM_H_
