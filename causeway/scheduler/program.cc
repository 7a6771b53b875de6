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

absl::StatusOr<std::shared_ptr<const Program>> ProgramBuilder::Build() const {
  HostSpan span("build");
  if (span.active()) span.set_args(absl::StrCat("\"program\":", JsonQuote(name_)));
  auto program = std::shared_ptr<Program>(new Program());
  Program& p = *program;
  p.name_ = name_;
  absl::flat_hash_map<std::string, int> value_ids;   // name -> value id
  absl::flat_hash_map<std::string, int> producer;    // value name -> node index (-1: parameter)
  auto check_mesh = [](const std::string& what, const std::shared_ptr<Mesh>& mesh) -> absl::Status {
    if (mesh == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": unknown mesh (null)"));
    if (mesh->released()) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": unknown mesh: ", mesh->DebugString(),
                                                        " was released"));
    }
    return absl::OkStatus();
  };

  for (const Param& par : params_) {
    std::string what = absl::StrCat("parameter '", par.value, "'");
    CAUSEWAY_RETURN_IF_ERROR(check_mesh(what, par.mesh));
    if (value_ids.contains(par.value)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is defined twice"));
    }
    auto shard = ShardShape(par.shape, par.sharding, *par.mesh);
    if (!shard.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", shard.status().message()));
    value_ids[par.value] = static_cast<int>(p.values_.size());
    producer[par.value] = -1;
    p.parameters_.push_back(static_cast<int>(p.values_.size()));
    p.values_.push_back({par.value, ProgramValue::kParameter, par.mesh, par.shape, par.dtype, par.sharding});
  }
  absl::flat_hash_map<std::string, int> node_index;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
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
    if (!node.send) CAUSEWAY_RETURN_IF_ERROR(check_mesh(what, node.mesh));
    if (node.send || node.receive) {
      // Checked as it is lowered.
    } else if (node.collective) {
      const int axis = node.collective_options.mesh_axis;
      if (axis < -1 || axis >= static_cast<int>(node.mesh->dims().size())) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", CollectiveKindName(node.collective_kind),
                                                       " over mesh axis ", axis, ", but ", node.mesh->DebugString(),
                                                       " has ", node.mesh->dims().size(), " axes"));
      }
    } else if (!node.reshard) {
      const Function& f = *node.function;
      if (node.inputs.size() != f.inputs().size()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": function '", f.name(), "' takes ",
                                                       f.inputs().size(), " inputs, given ", node.inputs.size()));
      }
      if (node.outputs.size() != f.outputs().size()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": function '", f.name(), "' gives ",
                                                       f.outputs().size(), " outputs, named ", node.outputs.size()));
      }
    }
    for (const std::string& out : node.outputs) {
      if (producer.contains(out)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": value '", out, "' is already produced by ",
                                                       producer[out] < 0 ? "a parameter"
                                                                         : "node '" + nodes_[producer[out]].name + "'"));
      }
      producer[out] = static_cast<int>(n);
    }
  }
  // Every input must be produced; order the nodes so producers come first
  // (Kahn's algorithm, taking the earliest added node that is ready, so an
  // order that already respects the dependencies is kept); what is left
  // over is a cycle.
  std::vector<int> pending(nodes_.size(), 0);
  std::vector<std::vector<int>> consumers(nodes_.size());
  for (size_t n = 0; n < nodes_.size(); ++n) {
    for (const std::string& in : nodes_[n].inputs) {
      auto it = producer.find(in);
      if (it == producer.end()) {
        return absl::InvalidArgumentError(absl::StrCat("node '", nodes_[n].name, "' reads '", in,
                                                       "', which no parameter or node produces"));
      }
      if (it->second >= 0) {
        pending[n]++;
        consumers[it->second].push_back(static_cast<int>(n));
      }
    }
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    if (pending[n] == 0) ready.push(static_cast<int>(n));
  }
  std::vector<int> order;
  while (!ready.empty()) {
    int n = ready.top();
    ready.pop();
    order.push_back(n);
    for (int c : consumers[n]) {
      if (--pending[c] == 0) ready.push(c);
    }
  }
  if (order.size() != nodes_.size()) {
    std::vector<std::string> cyclic;
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (pending[n] > 0) cyclic.push_back("'" + nodes_[n].name + "'");
    }
    return absl::InvalidArgumentError(absl::StrCat("program '", name_, "' has a cycle through nodes ",
                                                   absl::StrJoin(cyclic, ", ")));
  }

  // Lower in that order: check shapes and types, insert transfers.
  // A transfer step moving value `v` to `mesh` laid out by `sharding`, into
  // a new value named `name`; its id.
  auto add_transfer = [&](const std::string& what, const std::string& node_name, int v,
                          const std::shared_ptr<Mesh>& mesh, const Sharding& sharding,
                          const std::string& name) -> absl::StatusOr<int> {
    const ProgramValue value = p.values_[v];
    if (value.mesh->island() != mesh->island()) {
      return absl::UnimplementedError(absl::StrCat(what, ": input '", value.name, "' is on island '",
                                                   value.mesh->island(), "'; transfers between islands are "
                                                   "not supported yet"));
    }
    auto plan = PlanTransfer(value.shape, value.dtype, *value.mesh, value.sharding, *mesh, sharding, budget_,
                             absl::StrCat("moving '", value.name, "' for ", what));
    if (absl::IsResourceExhausted(plan.status())) return plan.status();
    if (!plan.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": moving '", value.name, "' ", ShapeString(value.shape),
                                                     " to ", mesh->DebugString(), " as ", sharding.ToString(),
                                                     ": ", plan.status().message()));
    }
    ProgramValue moved = value;
    moved.name = name;
    moved.kind = ProgramValue::kIntermediate;
    moved.mesh = mesh;
    moved.sharding = sharding;
    int id = static_cast<int>(p.values_.size());
    p.values_.push_back(moved);
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
    p.steps_.push_back(std::move(transfer));
    return id;
  };
  // Value `v` as it is on `mesh` laid out by `sharding`: itself, or its copy
  // made by a transfer step (one per value, mesh and sharding).
  absl::flat_hash_map<std::tuple<int, uint64_t, int, int>, int> transferred;
  auto on_mesh = [&](const std::string& what, int v, const std::shared_ptr<Mesh>& mesh,
                     const Sharding& sharding) -> absl::StatusOr<int> {
    const ProgramValue& value = p.values_[v];
    if (value.mesh == mesh && value.sharding == sharding) return v;
    auto key = std::make_tuple(v, mesh->id(), sharding.array_axis, sharding.mesh_axis);
    if (auto it = transferred.find(key); it != transferred.end()) return it->second;
    std::string name = absl::StrCat(value.name, "@mesh", mesh->id(),
                                    sharding == value.sharding ? "" : absl::StrCat(":", sharding.ToString()));
    CAUSEWAY_ASSIGN_OR_RETURN(int id, add_transfer(what, name, v, mesh, sharding, name));
    transferred.emplace(key, id);
    return id;
  };
  // Values that cross islands go as contiguous byte ranges (channel.h).
  auto check_contiguous = [](const std::string& what, const std::string& value, const Sharding& sharding) {
    if (sharding.replicated() || sharding.array_axis == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", value, "' is ", sharding.ToString(),
                                                   "; a value crossing islands must be replicated or split "
                                                   "along array axis 0 (reshard it on its island first)"));
  };
  for (int n : order) {
    const Node& node = nodes_[n];
    std::string what = absl::StrCat("node '", node.name, "'");
    if (node.send) {
      const int v = value_ids.at(node.inputs[0]);
      const ProgramValue& value = p.values_[v];
      CAUSEWAY_RETURN_IF_ERROR(check_contiguous(what, value.name, value.sharding));
      ProgramStep send;
      send.kind = ProgramStep::kSend;
      send.node = node.name;
      send.mesh = value.mesh;
      send.inputs = {v};
      send.channel = node.channel;
      p.steps_.push_back(std::move(send));
      continue;
    }
    if (node.receive) {
      CAUSEWAY_RETURN_IF_ERROR(check_contiguous(what, node.outputs[0], *node.reshard));
      if (node.shape.empty() || NumElements(node.shape) <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": receives an empty shape ", ShapeString(node.shape)));
      }
      auto shard = ShardShape(node.shape, *node.reshard, *node.mesh);
      if (!shard.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", shard.status().message()));
      int id = static_cast<int>(p.values_.size());
      value_ids[node.outputs[0]] = id;
      p.values_.push_back({node.outputs[0], ProgramValue::kIntermediate, node.mesh, node.shape, node.dtype,
                           *node.reshard});
      ProgramStep receive;
      receive.kind = ProgramStep::kReceive;
      receive.node = node.name;
      receive.mesh = node.mesh;
      receive.outputs = {id};
      receive.channel = node.channel;
      p.steps_.push_back(std::move(receive));
      continue;
    }
    if (node.reshard) {
      CAUSEWAY_ASSIGN_OR_RETURN(int id, add_transfer(what, node.name, value_ids.at(node.inputs[0]), node.mesh,
                                                     *node.reshard, node.outputs[0]));
      value_ids[node.outputs[0]] = id;
      continue;
    }
    if (node.collective) {
      const int source = value_ids.at(node.inputs[0]);
      CAUSEWAY_ASSIGN_OR_RETURN(int v, on_mesh(what, source, node.mesh, p.values_[source].sharding));
      const ProgramValue in = p.values_[v];
      auto shard = ShardShape(in.shape, in.sharding, *node.mesh);
      if (!shard.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", shard.status().message()));
      CAUSEWAY_ASSIGN_OR_RETURN(CollectiveGroups groups,
                                GroupsForAxis(node.mesh->dims(), node.collective_options.mesh_axis));
      const int size = groups.size();
      auto plan = PlanCollective(node.collective_kind, node.collective_options, size, *shard, in.dtype,
                                 node.mesh->DevicesShareMemory());
      if (!plan.ok()) {
        return absl::Status(plan.status().code(), absl::StrCat(what, ": ", plan.status().message()));
      }
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
              what, ": reduce-scatter over ", along < 0 ? "both axes of " : "one axis of ", node.mesh->DebugString(),
              along < 0 ? "" : absl::StrCat(" of '", in.name, "', which is ", in.sharding.ToString(), ","),
              " would split its result over both mesh axes, which a sharding cannot express",
              along < 0 ? "; name a mesh axis" : ""));
        }
        sharding = Sharding::Split(0, along);
      }
      int id = static_cast<int>(p.values_.size());
      value_ids[node.outputs[0]] = id;
      p.values_.push_back({node.outputs[0], ProgramValue::kIntermediate, node.mesh,
                           GlobalShape(out_shard, sharding, *node.mesh), in.dtype, sharding});
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
        p.steps_.push_back(std::move(step));
      }
      continue;
    }
    const Function& f = *node.function;
    ProgramStep call;
    call.kind = ProgramStep::kCall;
    call.node = node.name;
    call.function = node.function;
    call.mesh = node.mesh;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = value_ids.at(node.inputs[i]);
      const ProgramValue value = p.values_[v];
      if (value.dtype != f.inputs()[i].dtype) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": input ", i, " '", value.name, "' is ",
                                                       DTypeName(value.dtype), " but function '", f.name(),
                                                       "' expects ", DTypeName(f.inputs()[i].dtype)));
      }
      auto fits = [&](const Sharding& sharding) {
        auto shard = ShardShape(value.shape, sharding, *node.mesh);
        return shard.ok() && *shard == f.inputs()[i].shape;
      };
      // From another mesh: its own sharding if that fits the function, else
      // the first that does.
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
      CAUSEWAY_ASSIGN_OR_RETURN(v, on_mesh(what, v, node.mesh, sharding));
      call.inputs.push_back(v);
    }
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      const TensorSpec& spec = f.outputs()[o];
      Sharding sharding = Sharding::Replicated();
      if (o < node.output_shardings.size()) {
        sharding = node.output_shardings[o];
      } else {
        for (int v : call.inputs) {
          auto shard = ShardShape(p.values_[v].shape, p.values_[v].sharding, *node.mesh);
          if (shard.ok() && *shard == spec.shape) {
            sharding = p.values_[v].sharding;
            break;
          }
        }
      }
      if (!sharding.replicated() &&
          (sharding.array_axis >= static_cast<int>(spec.shape.size()) || sharding.mesh_axis < 0 ||
           sharding.mesh_axis >= static_cast<int>(node.mesh->dims().size()))) {
        bool no_array_axis = sharding.array_axis >= static_cast<int>(spec.shape.size());
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": output '", node.outputs[o], "' cannot be ", sharding.ToString(), ": ",
            no_array_axis ? spec.ToString() : node.mesh->DebugString(), " has no axis ",
            no_array_axis ? sharding.array_axis : sharding.mesh_axis));
      }
      Shape global = GlobalShape(spec.shape, sharding, *node.mesh);
      auto check = ShardShape(global, sharding, *node.mesh);
      if (!check.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": output '", node.outputs[o], "': ",
                                                       check.status().message()));
      }
      int id = static_cast<int>(p.values_.size());
      value_ids[node.outputs[o]] = id;
      p.values_.push_back({node.outputs[o], ProgramValue::kIntermediate, node.mesh, global, spec.dtype, sharding});
      call.outputs.push_back(id);
    }
    p.steps_.push_back(std::move(call));
  }
  for (const std::string& out : outputs_) {
    auto it = value_ids.find(out);
    if (it == value_ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat("program '", name_, "' outputs '", out,
                                                     "', which no parameter or node produces"));
    }
    if (p.values_[it->second].kind == ProgramValue::kOutput) {
      return absl::InvalidArgumentError(absl::StrCat("program '", name_, "' lists output '", out, "' twice"));
    }
    if (p.values_[it->second].kind == ProgramValue::kParameter) {
      return absl::InvalidArgumentError(absl::StrCat("program '", name_, "' outputs parameter '", out,
                                                     "' unchanged; output a computed value"));
    }
    p.values_[it->second].kind = ProgramValue::kOutput;
    p.outputs_.push_back(it->second);
  }
  bool sends = false;
  for (const ProgramStep& step : p.steps_) sends |= step.kind == ProgramStep::kSend;
  if (p.outputs_.empty() && !sends) {
    return absl::InvalidArgumentError(absl::StrCat("program '", name_, "' has no outputs"));
  }
  return program;
}

}  // namespace causeway
