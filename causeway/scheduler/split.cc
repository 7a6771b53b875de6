#include "causeway/scheduler/split.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/base/status.h"
#include "causeway/scheduler/channel.h"

namespace causeway {
namespace {

using MeshMap = absl::flat_hash_map<std::string, std::shared_ptr<Mesh>>;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// Stands for every channel of a program built only to be typed or checked:
// building never calls a channel, and such a program cannot run.
class VirtualChannel final : public Channel {
 public:
  Future<> Send(uint64_t, uint64_t, uint64_t, std::shared_ptr<Buffer>, Future<>) override { return Refuse(); }
  Future<> Receive(uint64_t, uint64_t, std::vector<Target>) override { return Refuse(); }
  void Abandon(uint64_t, const absl::Status&) override {}  // received nothing
  std::string Describe() const override { return "a virtual channel"; }

 private:
  static Future<> Refuse() {
    return Future<>::Ready(absl::FailedPreconditionError(
        "a virtual channel carries nothing: load the part with the channels of its island"));
  }
};

// The values a node reads, in order, for renaming in place.
std::vector<std::string*> MutableInputs(NodeDef& n) {
  std::vector<std::string*> out;
  switch (n.kind_case()) {
    case NodeDef::kCall:
      for (int i = 0; i < n.call().inputs_size(); ++i) out.push_back(n.mutable_call()->mutable_inputs(i));
      break;
    case NodeDef::kCollective:
      out.push_back(n.mutable_collective()->mutable_input());
      break;
    case NodeDef::kReshard:
      out.push_back(n.mutable_reshard()->mutable_input());
      break;
    case NodeDef::kSend:
      out.push_back(n.mutable_send()->mutable_input());
      break;
    default:
      break;
  }
  return out;
}

// The values a node produces, in order.
std::vector<std::string*> MutableOutputs(NodeDef& n) {
  std::vector<std::string*> out;
  switch (n.kind_case()) {
    case NodeDef::kCall:
      for (int i = 0; i < n.call().outputs_size(); ++i) out.push_back(n.mutable_call()->mutable_outputs(i));
      break;
    case NodeDef::kCollective:
      out.push_back(n.mutable_collective()->mutable_output());
      break;
    case NodeDef::kReshard:
      out.push_back(n.mutable_reshard()->mutable_output());
      break;
    case NodeDef::kReceive:
      out.push_back(n.mutable_receive()->mutable_output());
      break;
    default:
      break;
  }
  return out;
}

std::vector<std::string> Inputs(const NodeDef& n) {
  NodeDef copy = n;
  std::vector<std::string> out;
  for (std::string* v : MutableInputs(copy)) out.push_back(*v);
  return out;
}

std::vector<std::string> Outputs(const NodeDef& n) {
  NodeDef copy = n;
  std::vector<std::string> out;
  for (std::string* v : MutableOutputs(copy)) out.push_back(*v);
  return out;
}

// The mesh a node runs on (a send runs where its input is: none).
const std::string& MeshOf(const NodeDef& n) {
  switch (n.kind_case()) {
    case NodeDef::kCall:
      return n.call().mesh();
    case NodeDef::kCollective:
      return n.collective().mesh();
    case NodeDef::kReshard:
      return n.reshard().mesh();
    case NodeDef::kReceive:
      return n.receive().mesh();
    default:
      break;
  }
  static const std::string* const kNone = new std::string();
  return *kNone;
}

NodeDef ReshardNode(const std::string& name, const std::string& mesh, const std::string& input,
                    const Sharding& sharding) {
  NodeDef n;
  n.set_name(name);
  ReshardDef* r = n.mutable_reshard();
  r->set_mesh(mesh);
  r->set_input(input);
  r->set_output(name);
  *r->mutable_sharding() = ToDef(sharding);
  return n;
}

std::string ShardingTag(const Sharding& s) {
  return s.replicated() ? "replicated" : absl::StrCat("split(", s.array_axis, ",", s.mesh_axis, ")");
}

// `name` cut to at most `max` bytes, on a UTF-8 character boundary (proto3
// strings must be valid UTF-8).
std::string Truncated(std::string name, size_t max) {
  if (name.size() <= max) return name;
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(name[end]) & 0xC0) == 0x80) --end;
  name.resize(end);
  return name;
}

}  // namespace

absl::StatusOr<MeshMap> VirtualMeshes(const ProgramDef& def, const std::string& island) {
  if (def.meshes_size() > kMaxDefMeshes) {
    return Invalid("program '", def.name(), "' has ", def.meshes_size(), " meshes; at most ", kMaxDefMeshes);
  }
  MeshMap meshes;
  for (int i = 0; i < def.meshes_size(); ++i) {
    const MeshDef& m = def.meshes(i);
    if (m.name().empty()) return Invalid("mesh ", i, " has no name");
    const std::string what = absl::StrCat("mesh '", m.name(), "'");
    if (meshes.contains(m.name())) return Invalid(what, " is defined twice");
    int64_t size = 1;
    bool fits = !m.dims().empty() && m.dims().size() <= 2;
    for (int d : m.dims()) {
      fits &= d >= 1;
      if (fits) size *= d;  // two factors of at most 2^31: no overflow
    }
    if (!fits) {
      return Invalid(what, ": dims [", absl::StrJoin(m.dims(), ", "), "] (expected 1 or 2 sizes, each >= 1)");
    }
    if (size > kMaxVirtualMeshDevices) {
      return Invalid(what, ": dims [", absl::StrJoin(m.dims(), ", "), "] make ", size, " devices; at most ",
                     kMaxVirtualMeshDevices);
    }
    meshes.emplace(m.name(),
                   std::make_shared<Mesh>(i + 1, island, std::vector<int>(m.dims().begin(), m.dims().end()),
                                          std::vector<Accelerator*>(size, nullptr), /*owner=*/0));
  }
  return meshes;
}

absl::StatusOr<SplitProgram> SplitByIsland(const ProgramDef& def, uint64_t first_channel_id) {
  const std::string program = absl::StrCat("program '", def.name(), "'");
  for (const NodeDef& n : def.nodes()) {
    if (n.has_send() || n.has_receive()) {
      return Invalid("node '", n.name(), "' is a ", n.has_send() ? "send" : "receive",
                     "; a program to split has none (splitting adds them)");
    }
  }

  // Islands: all meshes on one (or none) make one part; over several, every
  // mesh must say which.
  std::vector<std::string> islands;
  const MeshDef* unnamed = nullptr;
  for (const MeshDef& m : def.meshes()) {
    if (m.island().size() > kMaxDefNameBytes) {
      return Invalid("mesh '", m.name(), "': island name of ", m.island().size(), " bytes; at most ",
                     kMaxDefNameBytes);
    }
    if (m.island().empty()) {
      if (unnamed == nullptr) unnamed = &m;
    } else if (std::find(islands.begin(), islands.end(), m.island()) == islands.end()) {
      islands.push_back(m.island());
    }
  }
  if (islands.size() > 1 && unnamed != nullptr) {
    std::vector<std::string> quoted;
    for (const std::string& i : islands) quoted.push_back(absl::StrCat("'", i, "'"));
    return Invalid(program, " places its meshes on islands ", absl::StrJoin(quoted, ", "), ", but mesh '",
                   unnamed->name(), "' names no island (over several islands, every mesh names its own)");
  }
  absl::flat_hash_map<std::string, std::string> island_of_mesh;
  for (const MeshDef& m : def.meshes()) {
    island_of_mesh[m.name()] = m.island().empty() && !islands.empty() ? islands[0] : m.island();
  }

  // Checked and typed whole, every mesh virtual and on one island: the parts
  // compute exactly what this program computes, so its values' shapes, types
  // and shardings are theirs. Built twice: once as given, for errors in the
  // def's own names; once with every value renamed "@<k>" for typing, as the
  // builder's own names for moved values ("<value>@mesh<id>...") might equal
  // a value's name in the def, but never "@<k>".
  ProgramDef whole = def;
  for (MeshDef& m : *whole.mutable_meshes()) m.clear_island();
  CAUSEWAY_ASSIGN_OR_RETURN(MeshMap virtual_meshes, VirtualMeshes(whole, ""));
  CAUSEWAY_RETURN_IF_ERROR(BuildProgram(whole, virtual_meshes).status());
  absl::flat_hash_map<std::string, std::string> canonical;
  for (const ParameterDef& p : def.parameters()) {
    canonical.emplace(p.value(), absl::StrCat("@", canonical.size()));
  }
  for (const NodeDef& n : def.nodes()) {
    for (const std::string& v : Outputs(n)) canonical.emplace(v, absl::StrCat("@", canonical.size()));
  }
  ProgramDef typed_def = whole;
  for (ParameterDef& p : *typed_def.mutable_parameters()) p.set_value(canonical.at(p.value()));
  for (NodeDef& n : *typed_def.mutable_nodes()) {
    for (std::string* v : MutableInputs(n)) *v = canonical.at(*v);
    for (std::string* v : MutableOutputs(n)) *v = canonical.at(*v);
  }
  for (std::string& v : *typed_def.mutable_outputs()) v = canonical.at(v);
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Program> typed, BuildProgram(typed_def, virtual_meshes));
  absl::flat_hash_map<std::string, const ProgramValue*> typed_values;
  for (const ProgramValue& v : typed->values()) typed_values.emplace(v.name, &v);
  auto type_of = [&](const std::string& value) -> const ProgramValue& {
    return *typed_values.at(canonical.at(value));
  };
  // Call steps by node: where each call reads its inputs (mesh and sharding).
  absl::flat_hash_map<std::string, const ProgramStep*> call_steps;
  for (const ProgramStep& s : typed->steps()) {
    if (s.kind == ProgramStep::kCall) call_steps.emplace(s.node, &s);
  }
  absl::flat_hash_map<const Mesh*, std::string> mesh_name;
  for (const auto& [name, mesh] : virtual_meshes) mesh_name.emplace(mesh.get(), name);

  // The global order: Kahn's algorithm taking the earliest-listed ready node
  // (ProgramBuilder's rule; the build above found no cycle).
  const int count = def.nodes_size();
  absl::flat_hash_map<std::string, int> producer;  // value -> node (-1: parameter)
  absl::flat_hash_map<std::string, std::string> island_of_value;
  for (const ParameterDef& p : def.parameters()) {
    producer[p.value()] = -1;
    island_of_value[p.value()] = island_of_mesh.at(p.mesh());
  }
  for (int n = 0; n < count; ++n) {
    for (const std::string& v : Outputs(def.nodes(n))) {
      producer[v] = n;
      island_of_value[v] = island_of_mesh.at(MeshOf(def.nodes(n)));
    }
  }
  std::vector<int> pending(count, 0);
  std::vector<std::vector<int>> consumers(count);
  for (int n = 0; n < count; ++n) {
    for (const std::string& v : Inputs(def.nodes(n))) {
      const int from = producer.at(v);
      if (from >= 0) {
        ++pending[n];
        consumers[from].push_back(n);
      }
    }
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int n = 0; n < count; ++n) {
    if (pending[n] == 0) ready.push(n);
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
  if (static_cast<int>(order.size()) != count) {
    return absl::InternalError(absl::StrCat(program, " built, but its nodes have no topological order"));
  }

  SplitProgram split;
  absl::flat_hash_map<std::string, int> part_of_island;
  auto part_for = [&](const std::string& island) -> ProgramDef& {
    auto [it, added] = part_of_island.try_emplace(island, static_cast<int>(split.parts.size()));
    if (added) split.parts.push_back({island, ProgramDef()});
    return split.parts[it->second].def;
  };
  // Names the split adds, unique among the def's node and value names and
  // each other, and within the length limit.
  absl::flat_hash_set<std::string> taken;
  for (const ParameterDef& p : def.parameters()) taken.insert(p.value());
  for (const NodeDef& n : def.nodes()) {
    taken.insert(n.name());
    for (const std::string& v : Outputs(n)) taken.insert(v);
  }
  auto fresh = [&](const std::string& wanted) {
    const std::string base = Truncated(wanted, kMaxDefNameBytes - 16);
    std::string name = base;
    for (int k = 2; taken.contains(name); ++k) name = absl::StrCat(base, "#", k);
    taken.insert(name);
    return name;
  };

  for (int i = 0; i < def.parameters_size(); ++i) {
    const ParameterDef& p = def.parameters(i);
    ProgramDef& part = part_for(island_of_value.at(p.value()));
    *part.add_parameters() = p;
    split.parameters.emplace_back(part_of_island.at(island_of_value.at(p.value())),
                                  part.parameters_size() - 1);
  }

  // What crossed: per value, the name it is sent under (itself, or its
  // reshard to a layout a channel carries); per (value, island), where it was
  // received; per (value, mesh, sharding), its reshard on the receiving side.
  absl::flat_hash_map<std::string, std::pair<std::string, Sharding>> sent;
  struct Received {
    std::string mesh;
    Sharding sharding;
    std::string name;  // the value's name on the receiving island
  };
  absl::flat_hash_map<std::pair<std::string, std::string>, Received> received;
  absl::flat_hash_map<std::tuple<std::string, std::string, int, int>, std::string> placed;

  for (int n : order) {
    const NodeDef& node = def.nodes(n);
    const std::string& mesh = MeshOf(node);
    const std::string& island = island_of_mesh.at(mesh);
    const std::shared_ptr<Mesh>& consumer_mesh = virtual_meshes.at(mesh);
    part_for(island);  // first, so that parts come in order of first appearance
    NodeDef copy = node;
    std::vector<std::string*> inputs = MutableInputs(copy);
    bool received_directly = false;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string value = *inputs[i];
      const std::string& from = island_of_value.at(value);
      if (from == island) continue;
      const ProgramValue& type = type_of(value);
      if (type.shape.empty()) {
        return Invalid("node '", node.name(), "' reads '", value, "' from island '", from,
                       "', but a value of rank 0 cannot cross islands (give it shape [1])");
      }

      if (!received.contains(std::make_pair(value, island))) {
        // The send goes at the end of the producer's part as it stands now.
        // Why this cannot deadlock: think of every node, send and receive in
        // the order they are appended here, over all parts (one sequence).
        // Each island runs its part in that sequence's order, a send right
        // before its receive. Everything an item waits for comes earlier in
        // the sequence: a node or a send waits for its inputs and for what
        // precedes it on its own island (appended earlier); a receive waits
        // for its send, appended just before it. So no run of any island can
        // wait, directly or through another island, for something that
        // waits for it. The producer came earlier in the global order, so it
        // is already in its part, before the send; and whatever that part
        // gained since is earlier in the sequence too. Runs in flight only
        // repeat the sequence, run after run, on every island.
        ProgramDef& producing = part_for(from);
        auto [it, first_send] = sent.try_emplace(value, value, type.sharding);
        if (first_send && !type.sharding.replicated() && type.sharding.array_axis != 0) {
          // Channels carry contiguous shards: reshard on the producing island.
          const Sharding to =
              type.shape[0] % type.mesh->dims()[0] == 0 ? Sharding::Split(0, 0) : Sharding::Replicated();
          const std::string name = fresh(absl::StrCat(value, "@dcn"));
          *producing.add_nodes() = ReshardNode(name, mesh_name.at(type.mesh.get()), value, to);
          it->second = {name, to};
        }
        const auto& [sent_name, sent_sharding] = it->second;
        if (split.channels.size() > UINT64_MAX - first_channel_id) {
          return Invalid(program, ": channel ids from ", first_channel_id, " run past 2^64 - 1");
        }
        const uint64_t id = first_channel_id + split.channels.size();
        NodeDef* send = producing.add_nodes();
        send->set_name(fresh(absl::StrCat("send:", value, ":", island)));
        send->mutable_send()->set_input(sent_name);
        send->mutable_send()->set_channel(id);

        const bool split_rows = !sent_sharding.replicated() && sent_sharding.array_axis == 0 &&
                                type.shape[0] % consumer_mesh->dims()[0] == 0;
        Sharding arrives = split_rows ? Sharding::Split(0, 0) : Sharding::Replicated();
        // A reshard that moves the value to this island in a layout a channel
        // can fill (contiguous shards) is the receive itself: the bytes land
        // in the reshard's output, with no copy after.
        bool direct = false;
        if (node.has_reshard()) {
          absl::StatusOr<Sharding> target = FromDef(node.reshard().sharding());
          direct = target.ok() && (target->replicated() || target->array_axis == 0);
          if (direct) arrives = *target;
        }
        NodeDef* receive = part_for(island).add_nodes();
        receive->set_name(fresh(absl::StrCat("recv:", value)));
        ReceiveDef* r = receive->mutable_receive();
        r->set_mesh(mesh);
        r->set_output(direct ? node.reshard().output() : value);
        r->mutable_shape()->Add(type.shape.begin(), type.shape.end());
        r->set_dtype(ToDef(type.dtype));
        *r->mutable_sharding() = ToDef(arrives);
        r->set_channel(id);
        split.channels.push_back({id, from, island, value});
        received.emplace(std::make_pair(value, island),
                         Received{mesh, arrives, direct ? node.reshard().output() : value});
        if (direct) {
          received_directly = true;
          break;
        }
      }

      // Where the whole program would have the consumer read it: a call
      // where its lowering moved it (its own sharding if that fits the
      // function, else the first that does), a collective in the value's own
      // sharding on the collective's mesh; a reshard takes it from anywhere.
      std::optional<Sharding> wanted;
      if (node.has_call()) {
        wanted = typed->values()[call_steps.at(node.name())->inputs[i]].sharding;
      } else if (node.has_collective()) {
        wanted = type.sharding;
      }
      const Received& got = received.at(std::make_pair(value, island));
      *inputs[i] = got.name;
      if (!wanted.has_value() || (got.mesh == mesh && got.sharding == *wanted)) continue;
      auto key = std::make_tuple(value, mesh, wanted->array_axis, wanted->mesh_axis);
      auto [it, added] = placed.try_emplace(key);
      if (added) {
        it->second = fresh(absl::StrCat(value, "@", mesh, ":", ShardingTag(*wanted)));
        *part_for(island).add_nodes() = ReshardNode(it->second, mesh, got.name, *wanted);
      }
      *inputs[i] = it->second;
    }
    if (received_directly) continue;  // the receive made the reshard's output
    *part_for(island).add_nodes() = std::move(copy);
  }

  for (const std::string& out : def.outputs()) {
    const std::string& island = island_of_value.at(out);
    ProgramDef& part = part_for(island);
    part.add_outputs(out);
    split.outputs.emplace_back(part_of_island.at(island), part.outputs_size() - 1);
  }

  // Names, meshes and functions of each part; each is checked by building it.
  auto channel = std::make_shared<VirtualChannel>();
  absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels;
  for (const ChannelSpec& c : split.channels) channels.emplace(c.id, channel);
  for (ProgramPart& part : split.parts) {
    ProgramDef& p = part.def;
    bool sends = false;
    absl::flat_hash_set<std::string> meshes, functions;
    for (const ParameterDef& param : p.parameters()) meshes.insert(param.mesh());
    for (const NodeDef& n : p.nodes()) {
      sends |= n.has_send();
      if (!MeshOf(n).empty()) meshes.insert(MeshOf(n));
      if (n.has_call()) functions.insert(n.call().function());
    }
    if (p.outputs().empty() && !sends) {
      std::vector<std::string> names;
      for (const NodeDef& n : p.nodes()) names.push_back(absl::StrCat("'", n.name(), "'"));
      return Invalid(program, ": island '", part.island,
                     "' computes nothing the program outputs or another island reads (its nodes: ",
                     names.empty() ? "none" : absl::StrJoin(names, ", "), ")");
    }
    for (const MeshDef& m : def.meshes()) {
      if (meshes.contains(m.name())) *p.add_meshes() = m;
    }
    for (const FunctionDef& f : def.functions()) {
      if (functions.contains(f.name())) *p.add_functions() = f;
    }
    p.set_name(split.parts.size() == 1 || def.name().size() + 1 + part.island.size() > kMaxDefNameBytes
                   ? def.name()
                   : absl::StrCat(def.name(), "@", part.island));
    CAUSEWAY_ASSIGN_OR_RETURN(MeshMap part_meshes, VirtualMeshes(p, part.island));
    auto built = BuildProgram(p, part_meshes, channels);
    if (!built.ok()) {
      return absl::InternalError(absl::StrCat(program, ": its part for island '", part.island,
                                              "' does not build: ", built.status().message()));
    }
  }
  return split;
}

}  // namespace causeway
