#include "causeway/scheduler/split.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
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

namespace {

// SplitByIsland's work, in its stages: PlaceMeshes (which island each mesh
// is on), Type (the whole program built once on virtual meshes, so that
// every value has its shape, type and sharding), Order (the global order),
// then the parameters, each node in that order (with a send and a receive
// for every value it reads from another island), the outputs, and Finish
// (each part named, given its meshes and functions, and checked by building
// it).
class Splitter {
 public:
  Splitter(const ProgramDef& def, uint64_t first_channel_id)
      : def_(def),
        first_channel_id_(first_channel_id),
        program_(absl::StrCat("program '", def.name(), "'")) {}

  absl::StatusOr<SplitProgram> Split();

 private:
  // Where a value was received on an island.
  struct Received {
    std::string mesh;
    Sharding sharding;
    std::string name;  // the value's name on the receiving island
  };

  absl::Status PlaceMeshes();
  absl::Status Type();
  absl::StatusOr<std::vector<int>> Order();
  void AddParameters();
  absl::Status AddNode(const NodeDef& node);
  // Sends `value` from its island to `island` for `node` and receives it
  // there; whether the receive is `node` itself (a reshard it fills).
  absl::StatusOr<bool> Carry(const NodeDef& node, const std::string& value, const std::string& island);
  void AddOutputs();
  absl::Status Finish();

  // The part of `island`, added (in order of first appearance) if new.
  ProgramDef& PartFor(const std::string& island);
  // A name the split adds: unique among the def's node and value names and
  // each other, and within the length limit.
  std::string Fresh(const std::string& wanted);
  const ProgramValue& TypeOf(const std::string& value) const {
    return *typed_values_.at(canonical_.at(value));
  }

  const ProgramDef& def_;
  const uint64_t first_channel_id_;
  const std::string program_;  // "program 'NAME'", for messages
  SplitProgram split_;

  absl::flat_hash_map<std::string, std::string> island_of_mesh_;
  absl::flat_hash_map<std::string, std::string> island_of_value_;
  // The whole program, typed.
  MeshMap virtual_meshes_;
  absl::flat_hash_map<std::string, std::string> canonical_;  // value -> "@<k>"
  std::shared_ptr<const Program> typed_;
  absl::flat_hash_map<std::string, const ProgramValue*> typed_values_;
  // Call steps by node: where each call reads its inputs (mesh and sharding).
  absl::flat_hash_map<std::string, const ProgramStep*> call_steps_;
  absl::flat_hash_map<const Mesh*, std::string> mesh_name_;

  absl::flat_hash_map<std::string, int> part_of_island_;
  absl::flat_hash_set<std::string> taken_;
  // What crossed: per value, the name it is sent under (itself, or its
  // reshard to a layout a channel carries); per (value, island), where it was
  // received; per (value, mesh, sharding), its reshard on the receiving side.
  absl::flat_hash_map<std::string, std::pair<std::string, Sharding>> sent_;
  absl::flat_hash_map<std::pair<std::string, std::string>, Received> received_;
  absl::flat_hash_map<std::tuple<std::string, std::string, int, int>, std::string> placed_;
};

absl::StatusOr<SplitProgram> Splitter::Split() {
  for (const NodeDef& n : def_.nodes()) {
    if (n.has_send() || n.has_receive()) {
      return Invalid("node '", n.name(), "' is a ", n.has_send() ? "send" : "receive",
                     "; a program to split has none (splitting adds them)");
    }
  }
  CAUSEWAY_RETURN_IF_ERROR(PlaceMeshes());
  CAUSEWAY_RETURN_IF_ERROR(Type());
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<int> order, Order());
  for (const ParameterDef& p : def_.parameters()) taken_.insert(p.value());
  for (const NodeDef& n : def_.nodes()) {
    taken_.insert(n.name());
    for (const std::string& v : Outputs(n)) taken_.insert(v);
  }
  AddParameters();
  for (int n : order) CAUSEWAY_RETURN_IF_ERROR(AddNode(def_.nodes(n)));
  AddOutputs();
  CAUSEWAY_RETURN_IF_ERROR(Finish());
  return std::move(split_);
}

// Islands: all meshes on one (or none) make one part; over several, every
// mesh must say which.
absl::Status Splitter::PlaceMeshes() {
  std::vector<std::string> islands;
  const MeshDef* unnamed = nullptr;
  for (const MeshDef& m : def_.meshes()) {
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
    return Invalid(program_, " places its meshes on islands ", absl::StrJoin(quoted, ", "), ", but mesh '",
                   unnamed->name(), "' names no island (over several islands, every mesh names its own)");
  }
  for (const MeshDef& m : def_.meshes()) {
    island_of_mesh_[m.name()] = m.island().empty() && !islands.empty() ? islands[0] : m.island();
  }
  return absl::OkStatus();
}

// Checked and typed whole, every mesh virtual and on one island: the parts
// compute exactly what this program computes, so its values' shapes, types
// and shardings are theirs. Built twice: once as given, for errors in the
// def's own names; once with every value renamed "@<k>" for typing, as the
// builder's own names for moved values ("<value>@mesh<id>...") might equal a
// value's name in the def, but never "@<k>".
absl::Status Splitter::Type() {
  ProgramDef whole = def_;
  for (MeshDef& m : *whole.mutable_meshes()) m.clear_island();
  CAUSEWAY_ASSIGN_OR_RETURN(virtual_meshes_, VirtualMeshes(whole, ""));
  CAUSEWAY_RETURN_IF_ERROR(BuildProgram(whole, virtual_meshes_).status());
  for (const ParameterDef& p : def_.parameters()) {
    canonical_.emplace(p.value(), absl::StrCat("@", canonical_.size()));
  }
  for (const NodeDef& n : def_.nodes()) {
    for (const std::string& v : Outputs(n)) canonical_.emplace(v, absl::StrCat("@", canonical_.size()));
  }
  ProgramDef typed_def = std::move(whole);
  for (ParameterDef& p : *typed_def.mutable_parameters()) p.set_value(canonical_.at(p.value()));
  for (NodeDef& n : *typed_def.mutable_nodes()) {
    for (std::string* v : MutableInputs(n)) *v = canonical_.at(*v);
    for (std::string* v : MutableOutputs(n)) *v = canonical_.at(*v);
  }
  for (std::string& v : *typed_def.mutable_outputs()) v = canonical_.at(v);
  CAUSEWAY_ASSIGN_OR_RETURN(typed_, BuildProgram(typed_def, virtual_meshes_));
  for (const ProgramValue& v : typed_->values()) typed_values_.emplace(v.name, &v);
  for (const ProgramStep& s : typed_->steps()) {
    if (s.kind == ProgramStep::kCall) call_steps_.emplace(s.node, &s);
  }
  for (const auto& [name, mesh] : virtual_meshes_) mesh_name_.emplace(mesh.get(), name);
  return absl::OkStatus();
}

// The global order: ProgramBuilder's (NodeOrder; the build above found no
// cycle).
absl::StatusOr<std::vector<int>> Splitter::Order() {
  const int count = def_.nodes_size();
  absl::flat_hash_map<std::string, int> producer;  // value -> node (-1: parameter)
  for (const ParameterDef& p : def_.parameters()) {
    producer[p.value()] = -1;
    island_of_value_[p.value()] = island_of_mesh_.at(p.mesh());
  }
  for (int n = 0; n < count; ++n) {
    for (const std::string& v : Outputs(def_.nodes(n))) {
      producer[v] = n;
      island_of_value_[v] = island_of_mesh_.at(MeshOf(def_.nodes(n)));
    }
  }
  std::vector<std::vector<int>> reads(count);
  for (int n = 0; n < count; ++n) {
    for (const std::string& v : Inputs(def_.nodes(n))) {
      if (const int from = producer.at(v); from >= 0) reads[n].push_back(from);
    }
  }
  std::vector<int> order = NodeOrder(reads);
  if (static_cast<int>(order.size()) != count) {
    return absl::InternalError(absl::StrCat(program_, " built, but its nodes have no topological order"));
  }
  return order;
}

ProgramDef& Splitter::PartFor(const std::string& island) {
  auto [it, added] = part_of_island_.try_emplace(island, static_cast<int>(split_.parts.size()));
  if (added) split_.parts.push_back({island, ProgramDef()});
  return split_.parts[it->second].def;
}

std::string Splitter::Fresh(const std::string& wanted) {
  const std::string base = Truncated(wanted, kMaxDefNameBytes - 16);
  std::string name = base;
  for (int k = 2; taken_.contains(name); ++k) name = absl::StrCat(base, "#", k);
  taken_.insert(name);
  return name;
}

void Splitter::AddParameters() {
  for (const ParameterDef& p : def_.parameters()) {
    const std::string& island = island_of_value_.at(p.value());
    ProgramDef& part = PartFor(island);
    *part.add_parameters() = p;
    split_.parameters.emplace_back(part_of_island_.at(island), part.parameters_size() - 1);
  }
}

absl::Status Splitter::AddNode(const NodeDef& node) {
  const std::string& mesh = MeshOf(node);
  const std::string& island = island_of_mesh_.at(mesh);
  PartFor(island);  // first, so that parts come in order of first appearance
  NodeDef copy = node;
  std::vector<std::string*> inputs = MutableInputs(copy);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string value = *inputs[i];
    const std::string& from = island_of_value_.at(value);
    if (from == island) continue;
    const ProgramValue& type = TypeOf(value);
    if (type.shape.empty()) {
      return Invalid("node '", node.name(), "' reads '", value, "' from island '", from,
                     "', but a value of rank 0 cannot cross islands (give it shape [1])");
    }
    if (!received_.contains(std::make_pair(value, island))) {
      CAUSEWAY_ASSIGN_OR_RETURN(bool direct, Carry(node, value, island));
      if (direct) return absl::OkStatus();  // the receive made the reshard's output
    }
    // Where the whole program would have the consumer read it: a call where
    // its lowering moved it (its own sharding if that fits the function,
    // else the first that does), a collective in the value's own sharding on
    // the collective's mesh; a reshard takes it from anywhere.
    std::optional<Sharding> wanted;
    if (node.has_call()) {
      wanted = typed_->values()[call_steps_.at(node.name())->inputs[i]].sharding;
    } else if (node.has_collective()) {
      wanted = type.sharding;
    }
    const Received& got = received_.at(std::make_pair(value, island));
    *inputs[i] = got.name;
    if (!wanted.has_value() || (got.mesh == mesh && got.sharding == *wanted)) continue;
    auto key = std::make_tuple(value, mesh, wanted->array_axis, wanted->mesh_axis);
    auto [it, added] = placed_.try_emplace(key);
    if (added) {
      it->second = Fresh(absl::StrCat(value, "@", mesh, ":", ShardingTag(*wanted)));
      *PartFor(island).add_nodes() = ReshardNode(it->second, mesh, got.name, *wanted);
    }
    *inputs[i] = it->second;
  }
  *PartFor(island).add_nodes() = std::move(copy);
  return absl::OkStatus();
}

absl::StatusOr<bool> Splitter::Carry(const NodeDef& node, const std::string& value,
                                     const std::string& island) {
  const std::string& mesh = MeshOf(node);
  const std::string& from = island_of_value_.at(value);
  const ProgramValue& type = TypeOf(value);
  const std::shared_ptr<Mesh>& consumer_mesh = virtual_meshes_.at(mesh);
  // The send goes at the end of the producer's part as it stands now. Why
  // this cannot deadlock: think of every node, send and receive in the order
  // they are appended here, over all parts (one sequence). Each island runs
  // its part in that sequence's order, a send right before its receive.
  // Everything an item waits for comes earlier in the sequence: a node or a
  // send waits for its inputs and for what precedes it on its own island
  // (appended earlier); a receive waits for its send, appended just before
  // it. So no run of any island can wait, directly or through another
  // island, for something that waits for it. The producer came earlier in
  // the global order, so it is already in its part, before the send; and
  // whatever that part gained since is earlier in the sequence too. Runs in
  // flight only repeat the sequence, run after run, on every island.
  ProgramDef& producing = PartFor(from);
  auto [it, first_send] = sent_.try_emplace(value, value, type.sharding);
  if (first_send && !type.sharding.replicated() && type.sharding.array_axis != 0) {
    // Channels carry contiguous shards: reshard on the producing island.
    const Sharding to =
        type.shape[0] % type.mesh->dims()[0] == 0 ? Sharding::Split(0, 0) : Sharding::Replicated();
    const std::string name = Fresh(absl::StrCat(value, "@dcn"));
    *producing.add_nodes() = ReshardNode(name, mesh_name_.at(type.mesh.get()), value, to);
    it->second = {name, to};
  }
  const auto& [sent_name, sent_sharding] = it->second;
  if (split_.channels.size() > UINT64_MAX - first_channel_id_) {
    return Invalid(program_, ": channel ids from ", first_channel_id_, " run past 2^64 - 1");
  }
  const uint64_t id = first_channel_id_ + split_.channels.size();
  NodeDef* send = producing.add_nodes();
  send->set_name(Fresh(absl::StrCat("send:", value, ":", island)));
  send->mutable_send()->set_input(sent_name);
  send->mutable_send()->set_channel(id);

  const bool split_rows = !sent_sharding.replicated() && sent_sharding.array_axis == 0 &&
                          type.shape[0] % consumer_mesh->dims()[0] == 0;
  Sharding arrives = split_rows ? Sharding::Split(0, 0) : Sharding::Replicated();
  // A reshard that moves the value to this island in a layout a channel can
  // fill (contiguous shards) is the receive itself: the bytes land in the
  // reshard's output, with no copy after.
  bool direct = false;
  if (node.has_reshard()) {
    absl::StatusOr<Sharding> target = FromDef(node.reshard().sharding());
    direct = target.ok() && (target->replicated() || target->array_axis == 0);
    if (direct) arrives = *target;
  }
  NodeDef* receive = PartFor(island).add_nodes();
  receive->set_name(Fresh(absl::StrCat("recv:", value)));
  ReceiveDef* r = receive->mutable_receive();
  r->set_mesh(mesh);
  r->set_output(direct ? node.reshard().output() : value);
  r->mutable_shape()->Add(type.shape.begin(), type.shape.end());
  r->set_dtype(ToDef(type.dtype));
  *r->mutable_sharding() = ToDef(arrives);
  r->set_channel(id);
  split_.channels.push_back({id, from, island, value});
  received_.emplace(std::make_pair(value, island),
                    Received{mesh, arrives, direct ? node.reshard().output() : value});
  return direct;
}

void Splitter::AddOutputs() {
  for (const std::string& out : def_.outputs()) {
    const std::string& island = island_of_value_.at(out);
    ProgramDef& part = PartFor(island);
    part.add_outputs(out);
    split_.outputs.emplace_back(part_of_island_.at(island), part.outputs_size() - 1);
  }
}

// Names, meshes and functions of each part; each is checked by building it.
absl::Status Splitter::Finish() {
  auto channel = std::make_shared<VirtualChannel>();
  absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels;
  for (const ChannelSpec& c : split_.channels) channels.emplace(c.id, channel);
  for (ProgramPart& part : split_.parts) {
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
      return Invalid(program_, ": island '", part.island,
                     "' computes nothing the program outputs or another island reads (its nodes: ",
                     names.empty() ? "none" : absl::StrJoin(names, ", "), ")");
    }
    for (const MeshDef& m : def_.meshes()) {
      if (meshes.contains(m.name())) *p.add_meshes() = m;
    }
    for (const FunctionDef& f : def_.functions()) {
      if (functions.contains(f.name())) *p.add_functions() = f;
    }
    p.set_name(split_.parts.size() == 1 || def_.name().size() + 1 + part.island.size() > kMaxDefNameBytes
                   ? def_.name()
                   : absl::StrCat(def_.name(), "@", part.island));
    CAUSEWAY_ASSIGN_OR_RETURN(MeshMap part_meshes, VirtualMeshes(p, part.island));
    auto built = BuildProgram(p, part_meshes, channels);
    if (!built.ok()) {
      return absl::InternalError(absl::StrCat(program_, ": its part for island '", part.island,
                                              "' does not build: ", built.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SplitProgram> SplitByIsland(const ProgramDef& def, uint64_t first_channel_id) {
  return Splitter(def, first_channel_id).Split();
}

}  // namespace causeway
