#include "causeway/scheduler/program.h"

#include <functional>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"

namespace causeway {

int Program::FindValue(const std::string& name) const {
  for (size_t i = 0; i < values_.size(); ++i) {
    if (values_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string Program::DebugString() const {
  std::string out = absl::StrCat("program '", name_, "'\n");
  for (const ProgramStep& s : steps_) {
    std::vector<std::string> in, outs;
    for (int v : s.inputs) in.push_back(values_[v].name);
    for (int v : s.outputs) outs.push_back(values_[v].name);
    static constexpr const char* kKinds[] = {"call ", "transfer ", "collective ", "send ", "receive "};
    const char* kind = kKinds[s.kind];
    absl::StrAppend(&out, "  ", kind, s.node, " on ",
                    s.mesh->DebugString(), ": (", absl::StrJoin(in, ", "), ") -> (", absl::StrJoin(outs, ", "), ")\n");
  }
  return out;
}

ProgramBuilder& ProgramBuilder::Parameter(std::string value, std::shared_ptr<Mesh> mesh, Shape shape, DType dtype,
                                          Sharding sharding) {
  params_.push_back({std::move(value), std::move(mesh), std::move(shape), dtype, sharding});
  return *this;
}

ProgramBuilder& ProgramBuilder::Call(std::string node, std::shared_ptr<const Function> function,
                                     std::shared_ptr<Mesh> mesh, std::vector<std::string> inputs,
                                     std::vector<std::string> outputs, std::vector<Sharding> output_shardings) {
  nodes_.push_back({std::move(node), std::move(function), std::move(mesh), std::move(inputs), std::move(outputs),
                    std::move(output_shardings)});
  return *this;
}

ProgramBuilder& ProgramBuilder::Output(std::string value) {
  outputs_.push_back(std::move(value));
  return *this;
}

ProgramBuilder& ProgramBuilder::Reshard(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                        std::string output, Sharding sharding) {
  Node n;
  n.name = std::move(node);
  n.mesh = std::move(mesh);
  n.inputs = {std::move(input)};
  n.outputs = {std::move(output)};
  n.reshard = sharding;
  nodes_.push_back(std::move(n));
  return *this;
}

ProgramBuilder& ProgramBuilder::Send(std::string node, std::string value, std::shared_ptr<Channel> channel) {
  Node n;
  n.name = std::move(node);
  n.inputs = {std::move(value)};
  n.send = true;
  n.channel = std::move(channel);
  nodes_.push_back(std::move(n));
  return *this;
}

ProgramBuilder& ProgramBuilder::Receive(std::string node, std::shared_ptr<Mesh> mesh, std::string value,
                                        Shape shape, DType dtype, Sharding sharding,
                                        std::shared_ptr<Channel> channel) {
  Node n;
  n.name = std::move(node);
  n.mesh = std::move(mesh);
  n.outputs = {std::move(value)};
  n.receive = true;
  n.shape = std::move(shape);
  n.dtype = dtype;
  n.reshard = sharding;
  n.channel = std::move(channel);
  nodes_.push_back(std::move(n));
  return *this;
}

ProgramBuilder& ProgramBuilder::Collective(std::string node, CollectiveKind kind, std::shared_ptr<Mesh> mesh,
                                           std::string input, std::string output, CollectiveOptions options) {
  Node n;
  n.name = std::move(node);
  n.mesh = std::move(mesh);
  n.inputs = {std::move(input)};
  n.outputs = {std::move(output)};
  n.collective = true;
  n.collective_kind = kind;
  n.collective_options = std::move(options);
  nodes_.push_back(std::move(n));
  return *this;
}

ProgramBuilder& ProgramBuilder::AllReduce(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                          std::string output, ReduceOp op, CollectiveAlgorithm algorithm) {
  CollectiveOptions options;
  options.op = op;
  options.algorithm = algorithm;
  return Collective(std::move(node), CollectiveKind::kAllReduce, std::move(mesh), std::move(input),
                    std::move(output), std::move(options));
}

ProgramBuilder& ProgramBuilder::AllGather(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                          std::string output, CollectiveAlgorithm algorithm) {
  CollectiveOptions options;
  options.algorithm = algorithm;
  return Collective(std::move(node), CollectiveKind::kAllGather, std::move(mesh), std::move(input),
                    std::move(output), std::move(options));
}

ProgramBuilder& ProgramBuilder::ReduceScatter(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                              std::string output, ReduceOp op, CollectiveAlgorithm algorithm) {
  CollectiveOptions options;
  options.op = op;
  options.algorithm = algorithm;
  return Collective(std::move(node), CollectiveKind::kReduceScatter, std::move(mesh), std::move(input),
                    std::move(output), std::move(options));
}

ProgramBuilder& ProgramBuilder::Broadcast(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                          std::string output, int root, CollectiveAlgorithm algorithm) {
  CollectiveOptions options;
  options.root = root;
  options.algorithm = algorithm;
  return Collective(std::move(node), CollectiveKind::kBroadcast, std::move(mesh), std::move(input),
                    std::move(output), std::move(options));
}

ProgramBuilder& ProgramBuilder::CollectivePermute(std::string node, std::shared_ptr<Mesh> mesh, std::string input,
                                                  std::string output, std::vector<std::pair<int, int>> pairs) {
  CollectiveOptions options;
  options.pairs = std::move(pairs);
  options.algorithm = CollectiveAlgorithm::kDirect;
  return Collective(std::move(node), CollectiveKind::kPermute, std::move(mesh), std::move(input),
                    std::move(output), std::move(options));
}

ProgramBuilder& ProgramBuilder::ChargeTo(std::shared_ptr<HostBudget> budget) {
  budget_ = std::move(budget);
  return *this;
}

std::vector<int> NodeOrder(const std::vector<std::vector<int>>& reads) {
  const size_t count = reads.size();
  std::vector<int> pending(count, 0);
  std::vector<std::vector<int>> consumers(count);
  for (size_t n = 0; n < count; ++n) {
    for (int from : reads[n]) {
      ++pending[n];
      consumers[from].push_back(static_cast<int>(n));
    }
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (size_t n = 0; n < count; ++n) {
    if (pending[n] == 0) ready.push(static_cast<int>(n));
  }
  std::vector<int> order;
  while (!ready.empty()) {
    const int n = ready.top();
    ready.pop();
    order.push_back(n);
    for (int c : consumers[n]) {
      if (--pending[c] == 0) ready.push(c);
    }
  }
  return order;
}

namespace {

absl::Status CheckMesh(const std::string& what, const std::shared_ptr<Mesh>& mesh) {
  if (mesh == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": unknown mesh (null)"));
  if (mesh->released()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": unknown mesh: ", mesh->DebugString(), " was released"));
  }
  return absl::OkStatus();
}

// Values that cross islands go as contiguous byte ranges (channel.h).
absl::Status CheckContiguous(const std::string& what, const std::string& value, const Sharding& sharding) {
  if (sharding.replicated() || sharding.array_axis == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": '", value, "' is ", sharding.ToString(),
                                                 "; a value crossing islands must be replicated or split "
                                                 "along array axis 0 (reshard it on its island first)"));
}

}  // namespace

// What Build does, in its stages: Validate checks every parameter and node
// on its own; Order puts producers before their consumers; Lower turns each
// node, in that order, into steps, with transfers wherever a value is read
// on another mesh or sharding than it has; Finish marks the outputs.
class ProgramLowering {
 public:
  using Node = ProgramBuilder::Node;

  ProgramLowering(const ProgramBuilder& builder, Program& program) : b_(builder), p_(program) {}

  absl::Status Validate();
  absl::StatusOr<std::vector<int>> Order() const;
  absl::Status Lower(const Node& node);
  absl::Status Finish();

 private:
  absl::Status ValidateNode(size_t n, absl::flat_hash_map<std::string, int>& node_index);
  void LowerSend(const Node& node);
  absl::Status LowerReceive(const std::string& what, const Node& node);
  absl::Status LowerCollective(const std::string& what, const Node& node);
  absl::Status LowerCall(const std::string& what, const Node& node);
  // The sharding in which input `i` of `node`'s function reads value `v`.
  absl::StatusOr<Sharding> CallInputSharding(const std::string& what, const Node& node, size_t i,
                                             int v) const;
  // The sharding of output `o` of `node`'s call, whose inputs are `inputs`.
  absl::StatusOr<Sharding> CallOutputSharding(const std::string& what, const Node& node, size_t o,
                                              const std::vector<int>& inputs) const;
  // A transfer step moving value `v` to `mesh` laid out by `sharding`, into a
  // new value named `name`; its id.
  absl::StatusOr<int> AddTransfer(const std::string& what, const std::string& node_name, int v,
                                  const std::shared_ptr<Mesh>& mesh, const Sharding& sharding,
                                  const std::string& name);
  // Value `v` as it is on `mesh` laid out by `sharding`: itself, or its copy
  // made by a transfer step (one per value, mesh and sharding).
  absl::StatusOr<int> OnMesh(const std::string& what, int v, const std::shared_ptr<Mesh>& mesh,
                             const Sharding& sharding);
  // Adds an intermediate value; its id.
  int AddValue(const std::string& name, const std::shared_ptr<Mesh>& mesh, Shape shape, DType dtype,
               const Sharding& sharding);

  const ProgramBuilder& b_;
  Program& p_;
  absl::flat_hash_map<std::string, int> value_ids_;  // name -> value id
  absl::flat_hash_map<std::string, int> producer_;   // value name -> node index (-1: parameter)
  absl::flat_hash_map<std::tuple<int, uint64_t, int, int>, int> transferred_;
};

absl::Status ProgramLowering::Validate() {
  for (const ProgramBuilder::Param& par : b_.params_) {
    std::string what = absl::StrCat("parameter '", par.value, "'");
    CAUSEWAY_RETURN_IF_ERROR(CheckMesh(what, par.mesh));
    if (value_ids_.contains(par.value)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is defined twice"));
    }
    auto shard = ShardShape(par.shape, par.sharding, *par.mesh);
    if (!shard.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", shard.status().message()));
    value_ids_[par.value] = static_cast<int>(p_.values_.size());
    producer_[par.value] = -1;
    p_.parameters_.push_back(static_cast<int>(p_.values_.size()));
    p_.values_.push_back({par.value, ProgramValue::kParameter, par.mesh, par.shape, par.dtype, par.sharding});
  }
  absl::flat_hash_map<std::string, int> node_index;
  for (size_t n = 0; n < b_.nodes_.size(); ++n) CAUSEWAY_RETURN_IF_ERROR(ValidateNode(n, node_index));
  return absl::OkStatus();
}

absl::Status ProgramLowering::ValidateNode(size_t n, absl::flat_hash_map<std::string, int>& node_index) {
  const Node& node = b_.nodes_[n];
  std::string what = absl::StrCat("node '", node.name, "'");
  if (node.name.empty()) return absl::InvalidArgumentError(absl::StrCat("node ", n, " has no name"));
  if (!node_index.emplace(node.name, static_cast<int>(n)).second) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is defined twice"));
  }
  if (node.function == nullptr && !node.collective && !node.reshard && !node.send) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no function"));
  }
  if ((node.send || node.receive) && node.channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no channel"));
  }
  if (!node.send) CAUSEWAY_RETURN_IF_ERROR(CheckMesh(what, node.mesh));
  if (node.send || node.receive) {
    // Checked as it is lowered.
  } else if (node.collective) {
    const int axis = node.collective_options.mesh_axis;
    if (axis < -1 || axis >= static_cast<int>(node.mesh->dims().size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", CollectiveKindName(node.collective_kind), " over mesh axis ", axis,
                       ", but ", node.mesh->DebugString(), " has ", node.mesh->dims().size(), " axes"));
    }
  } else if (!node.reshard) {
    const Function& f = *node.function;
    if (node.inputs.size() != f.inputs().size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": function '", f.name(), "' takes ",
                                                     f.inputs().size(), " inputs, given ",
                                                     node.inputs.size()));
    }
    if (node.outputs.size() != f.outputs().size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": function '", f.name(), "' gives ",
                                                     f.outputs().size(), " outputs, named ",
                                                     node.outputs.size()));
    }
  }
  for (const std::string& out : node.outputs) {
    if (producer_.contains(out)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": value '", out, "' is already produced by ",
                       producer_[out] < 0 ? "a parameter" : "node '" + b_.nodes_[producer_[out]].name + "'"));
    }
    producer_[out] = static_cast<int>(n);
  }
  return absl::OkStatus();
}

// Every input must be produced, and the nodes in NodeOrder; those left out
// are on a cycle.
absl::StatusOr<std::vector<int>> ProgramLowering::Order() const {
  const std::vector<Node>& nodes = b_.nodes_;
  std::vector<std::vector<int>> reads(nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (const std::string& in : nodes[n].inputs) {
      auto it = producer_.find(in);
      if (it == producer_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", nodes[n].name, "' reads '", in, "', which no parameter or node produces"));
      }
      if (it->second >= 0) reads[n].push_back(it->second);
    }
  }
  std::vector<int> order = NodeOrder(reads);
  if (order.size() != nodes.size()) {
    std::vector<bool> ordered(nodes.size(), false);
    for (int n : order) ordered[n] = true;
    std::vector<std::string> cyclic;
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (!ordered[n]) cyclic.push_back("'" + nodes[n].name + "'");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("program '", b_.name_, "' has a cycle through nodes ", absl::StrJoin(cyclic, ", ")));
  }
  return order;
}

int ProgramLowering::AddValue(const std::string& name, const std::shared_ptr<Mesh>& mesh, Shape shape,
                              DType dtype, const Sharding& sharding) {
  const int id = static_cast<int>(p_.values_.size());
  value_ids_[name] = id;
  p_.values_.push_back({name, ProgramValue::kIntermediate, mesh, std::move(shape), dtype, sharding});
  return id;
}

absl::StatusOr<int> ProgramLowering::AddTransfer(const std::string& what, const std::string& node_name, int v,
                                                 const std::shared_ptr<Mesh>& mesh, const Sharding& sharding,
                                                 const std::string& name) {
  const ProgramValue value = p_.values_[v];
  if (value.mesh->island() != mesh->island()) {
    return absl::UnimplementedError(absl::StrCat(what, ": input '", value.name, "' is on island '",
                                                 value.mesh->island(),
                                                 "'; transfers between islands are "
                                                 "not supported yet"));
  }
  auto plan = PlanTransfer(value.shape, value.dtype, *value.mesh, value.sharding, *mesh, sharding, b_.budget_,
                           absl::StrCat("moving '", value.name, "' for ", what));
  if (absl::IsResourceExhausted(plan.status())) return plan.status();
  if (!plan.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": moving '", value.name, "' ", ShapeString(value.shape), " to ",
                     mesh->DebugString(), " as ", sharding.ToString(), ": ", plan.status().message()));
  }
  ProgramValue moved = value;
  moved.name = name;
  moved.kind = ProgramValue::kIntermediate;
  moved.mesh = mesh;
  moved.sharding = sharding;
  int id = static_cast<int>(p_.values_.size());
  p_.values_.push_back(moved);
  ProgramStep transfer;
  transfer.kind = ProgramStep::kTransfer;
  transfer.node = node_name;
  transfer.mesh = mesh;
  transfer.inputs = {v};
  transfer.outputs = {id};
  transfer.transfer = *std::move(plan);
  if (value.mesh == mesh) {
    for (int t = 0; t < mesh->size(); ++t) {
      for (const auto& piece : transfer.transfer->pieces[t]) transfer.reads_peers |= piece.source != t;
    }
  }
  p_.steps_.push_back(std::move(transfer));
  return id;
}

absl::StatusOr<int> ProgramLowering::OnMesh(const std::string& what, int v, const std::shared_ptr<Mesh>& mesh,
                                            const Sharding& sharding) {
  const ProgramValue& value = p_.values_[v];
  if (value.mesh == mesh && value.sharding == sharding) return v;
  auto key = std::make_tuple(v, mesh->id(), sharding.array_axis, sharding.mesh_axis);
  if (auto it = transferred_.find(key); it != transferred_.end()) return it->second;
  std::string name = absl::StrCat(value.name, "@mesh", mesh->id(),
                                  sharding == value.sharding ? "" : absl::StrCat(":", sharding.ToString()));
  CAUSEWAY_ASSIGN_OR_RETURN(int id, AddTransfer(what, name, v, mesh, sharding, name));
  transferred_.emplace(key, id);
  return id;
}

absl::Status ProgramLowering::Lower(const Node& node) {
  std::string what = absl::StrCat("node '", node.name, "'");
  if (node.send) {
    const int v = value_ids_.at(node.inputs[0]);
    CAUSEWAY_RETURN_IF_ERROR(CheckContiguous(what, p_.values_[v].name, p_.values_[v].sharding));
    LowerSend(node);
    return absl::OkStatus();
  }
  if (node.receive) return LowerReceive(what, node);
  if (node.reshard) {
    CAUSEWAY_ASSIGN_OR_RETURN(int id, AddTransfer(what, node.name, value_ids_.at(node.inputs[0]), node.mesh,
                                                  *node.reshard, node.outputs[0]));
    value_ids_[node.outputs[0]] = id;
    return absl::OkStatus();
  }
  if (node.collective) return LowerCollective(what, node);
  return LowerCall(what, node);
}

void ProgramLowering::LowerSend(const Node& node) {
  const int v = value_ids_.at(node.inputs[0]);
  ProgramStep send;
  send.kind = ProgramStep::kSend;
  send.node = node.name;
  send.mesh = p_.values_[v].mesh;
  send.inputs = {v};
  send.channel = node.channel;
  p_.steps_.push_back(std::move(send));
}

absl::Status ProgramLowering::LowerReceive(const std::string& what, const Node& node) {
  CAUSEWAY_RETURN_IF_ERROR(CheckContiguous(what, node.outputs[0], *node.reshard));
  if (node.shape.empty() || NumElements(node.shape) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": receives an empty shape ", ShapeString(node.shape)));
  }
  auto shard = ShardShape(node.shape, *node.reshard, *node.mesh);
  if (!shard.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", shard.status().message()));
  ProgramStep receive;
  receive.kind = ProgramStep::kReceive;
  receive.node = node.name;
  receive.mesh = node.mesh;
  receive.outputs = {AddValue(node.outputs[0], node.mesh, node.shape, node.dtype, *node.reshard)};
  receive.channel = node.channel;
  p_.steps_.push_back(std::move(receive));
  return absl::OkStatus();
}

absl::Status ProgramLowering::LowerCollective(const std::string& what, const Node& node) {
  const int source = value_ids_.at(node.inputs[0]);
  CAUSEWAY_ASSIGN_OR_RETURN(int v, OnMesh(what, source, node.mesh, p_.values_[source].sharding));
  const ProgramValue in = p_.values_[v];
  auto shard = ShardShape(in.shape, in.sharding, *node.mesh);
  if (!shard.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", shard.status().message()));
  CAUSEWAY_ASSIGN_OR_RETURN(CollectiveGroups groups,
                            GroupsForAxis(node.mesh->dims(), node.collective_options.mesh_axis));
  const int size = groups.size();
  auto plan = PlanCollective(node.collective_kind, node.collective_options, size, *shard, in.dtype,
                             node.mesh->DevicesShareMemory());
  if (!plan.ok())
    return absl::Status(plan.status().code(), absl::StrCat(what, ": ", plan.status().message()));
  CAUSEWAY_ASSIGN_OR_RETURN(Shape out_shard, CollectiveOutputShard(node.collective_kind, size, *shard));
  // The mesh axis the collective runs along (-1: both of a 2-D mesh), and
  // whether the input differs along the other one only.
  const int along = node.mesh->dims().size() == 1 ? 0 : node.collective_options.mesh_axis;
  const bool split_across = along >= 0 && node.mesh->dims().size() == 2 && !in.sharding.replicated() &&
                            in.sharding.mesh_axis == 1 - along;
  Sharding sharding = split_across ? in.sharding : Sharding::Replicated();
  if (node.collective_kind == CollectiveKind::kPermute) sharding = in.sharding;
  if (node.collective_kind == CollectiveKind::kReduceScatter) {
    if (along < 0 || split_across) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": reduce-scatter over ", along < 0 ? "both axes of " : "one axis of ",
          node.mesh->DebugString(),
          along < 0 ? "" : absl::StrCat(" of '", in.name, "', which is ", in.sharding.ToString(), ","),
          " would split its result over both mesh axes, which a sharding cannot express",
          along < 0 ? "; name a mesh axis" : ""));
    }
    sharding = Sharding::Split(0, along);
  }
  const int id =
      AddValue(node.outputs[0], node.mesh, GlobalShape(out_shard, sharding, *node.mesh), in.dtype, sharding);
  const size_t phases = (*plan)->phases.size();
  auto shared_groups = std::make_shared<const CollectiveGroups>(std::move(groups));
  for (size_t ph = 0; ph < phases; ++ph) {
    ProgramStep step;
    step.kind = ProgramStep::kCollective;
    step.node = phases == 1 ? node.name : absl::StrCat(node.name, "/", ph);
    step.mesh = node.mesh;
    step.inputs = {v};
    step.outputs = {id};
    step.collective = *plan;
    step.phase = static_cast<int>(ph);
    step.groups = shared_groups;
    p_.steps_.push_back(std::move(step));
  }
  return absl::OkStatus();
}

absl::StatusOr<Sharding> ProgramLowering::CallInputSharding(const std::string& what, const Node& node,
                                                            size_t i, int v) const {
  const Function& f = *node.function;
  const ProgramValue& value = p_.values_[v];
  if (value.dtype != f.inputs()[i].dtype) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": input ", i, " '", value.name, "' is ",
                                                   DTypeName(value.dtype), " but function '", f.name(),
                                                   "' expects ", DTypeName(f.inputs()[i].dtype)));
  }
  auto fits = [&](const Sharding& sharding) {
    auto shard = ShardShape(value.shape, sharding, *node.mesh);
    return shard.ok() && *shard == f.inputs()[i].shape;
  };
  // From another mesh: its own sharding if that fits the function, else the
  // first that does.
  Sharding sharding = value.sharding;
  if (value.mesh != node.mesh && !fits(sharding)) {
    std::vector<Sharding> candidates = {Sharding::Replicated()};
    for (int a = 0; a < static_cast<int>(value.shape.size()); ++a) {
      for (int m = 0; m < static_cast<int>(node.mesh->dims().size()); ++m) {
        candidates.push_back(Sharding::Split(a, m));
      }
    }
    for (const Sharding& c : candidates) {
      if (fits(c)) {
        sharding = c;
        break;
      }
    }
  }
  if (!fits(sharding)) {
    auto shard = ShardShape(value.shape, value.sharding, *node.mesh);
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": input ", i, " '", value.name, "' ", ShapeString(value.shape), " ", value.sharding.ToString(),
        " gives each device ", shard.ok() ? ShapeString(*shard) : std::string(shard.status().message()),
        " but function '", f.name(), "' expects ", f.inputs()[i].ToString(),
        value.mesh == node.mesh ? " (a Reshard node changes an array's sharding)" : ""));
  }
  return sharding;
}

absl::StatusOr<Sharding> ProgramLowering::CallOutputSharding(const std::string& what, const Node& node,
                                                             size_t o, const std::vector<int>& inputs) const {
  const TensorSpec& spec = node.function->outputs()[o];
  Sharding sharding = Sharding::Replicated();
  if (o < node.output_shardings.size()) {
    sharding = node.output_shardings[o];
  } else {
    for (int v : inputs) {
      auto shard = ShardShape(p_.values_[v].shape, p_.values_[v].sharding, *node.mesh);
      if (shard.ok() && *shard == spec.shape) {
        sharding = p_.values_[v].sharding;
        break;
      }
    }
  }
  if (!sharding.replicated() &&
      (sharding.array_axis >= static_cast<int>(spec.shape.size()) || sharding.mesh_axis < 0 ||
       sharding.mesh_axis >= static_cast<int>(node.mesh->dims().size()))) {
    bool no_array_axis = sharding.array_axis >= static_cast<int>(spec.shape.size());
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": output '", node.outputs[o], "' cannot be ", sharding.ToString(), ": ",
                     no_array_axis ? spec.ToString() : node.mesh->DebugString(), " has no axis ",
                     no_array_axis ? sharding.array_axis : sharding.mesh_axis));
  }
  return sharding;
}

absl::Status ProgramLowering::LowerCall(const std::string& what, const Node& node) {
  const Function& f = *node.function;
  ProgramStep call;
  call.kind = ProgramStep::kCall;
  call.node = node.name;
  call.function = node.function;
  call.mesh = node.mesh;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    int v = value_ids_.at(node.inputs[i]);
    CAUSEWAY_ASSIGN_OR_RETURN(Sharding sharding, CallInputSharding(what, node, i, v));
    CAUSEWAY_ASSIGN_OR_RETURN(v, OnMesh(what, v, node.mesh, sharding));
    call.inputs.push_back(v);
  }
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const TensorSpec& spec = f.outputs()[o];
    CAUSEWAY_ASSIGN_OR_RETURN(Sharding sharding, CallOutputSharding(what, node, o, call.inputs));
    Shape global = GlobalShape(spec.shape, sharding, *node.mesh);
    auto check = ShardShape(global, sharding, *node.mesh);
    if (!check.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": output '", node.outputs[o], "': ", check.status().message()));
    }
    call.outputs.push_back(AddValue(node.outputs[o], node.mesh, std::move(global), spec.dtype, sharding));
  }
  p_.steps_.push_back(std::move(call));
  return absl::OkStatus();
}

absl::Status ProgramLowering::Finish() {
  const std::string& name = b_.name_;
  for (const std::string& out : b_.outputs_) {
    auto it = value_ids_.find(out);
    if (it == value_ids_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("program '", name, "' outputs '", out, "', which no parameter or node produces"));
    }
    if (p_.values_[it->second].kind == ProgramValue::kOutput) {
      return absl::InvalidArgumentError(absl::StrCat("program '", name, "' lists output '", out, "' twice"));
    }
    if (p_.values_[it->second].kind == ProgramValue::kParameter) {
      return absl::InvalidArgumentError(absl::StrCat("program '", name, "' outputs parameter '", out,
                                                     "' unchanged; output a computed value"));
    }
    p_.values_[it->second].kind = ProgramValue::kOutput;
    p_.outputs_.push_back(it->second);
  }
  bool sends = false;
  for (const ProgramStep& step : p_.steps_) sends |= step.kind == ProgramStep::kSend;
  if (p_.outputs_.empty() && !sends) {
    return absl::InvalidArgumentError(absl::StrCat("program '", name, "' has no outputs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Program>> ProgramBuilder::Build() const {
  HostSpan span("build");
  if (span.active()) span.set_args(absl::StrCat("\"program\":", JsonQuote(name_)));
  auto program = std::shared_ptr<Program>(new Program());
  program->name_ = name_;
  ProgramLowering lowering(*this, *program);
  CAUSEWAY_RETURN_IF_ERROR(lowering.Validate());
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<int> order, lowering.Order());
  for (int n : order) CAUSEWAY_RETURN_IF_ERROR(lowering.Lower(nodes_[n]));
  CAUSEWAY_RETURN_IF_ERROR(lowering.Finish());
  return program;
}

}  // namespace causeway
