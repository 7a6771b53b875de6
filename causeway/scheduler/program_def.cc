#include "causeway/scheduler/program_def.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/base/checked_size.h"
#include "causeway/base/status.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/scheduler/collectives.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace causeway {
namespace {

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// `status` with `what` in front of its message; NotFound (an unknown
// built-in kernel) becomes InvalidArgument: the def named something that
// does not exist.
absl::Status Prefixed(absl::string_view what, const absl::Status& status) {
  absl::StatusCode code =
      status.code() == absl::StatusCode::kNotFound ? absl::StatusCode::kInvalidArgument : status.code();
  return absl::Status(code, absl::StrCat(what, ": ", status.message()));
}

template <typename T>
std::string ListString(const google::protobuf::RepeatedField<T>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

// The name of `what` ("node 3": its kind and index, as it has no usable
// name yet) has 1..kMaxDefNameBytes bytes.
absl::Status CheckName(absl::string_view what, absl::string_view name) {
  if (name.empty()) return Invalid(what, " has no name");
  if (name.size() > kMaxDefNameBytes) {
    return Invalid(what, " has a name of ", name.size(), " bytes ('", name.substr(0, 32), "...'); at most ",
                   kMaxDefNameBytes);
  }
  return absl::OkStatus();
}

// A reference from `what` to a `kind` (value, mesh, function) by name.
absl::Status CheckRef(absl::string_view what, absl::string_view kind, absl::string_view name) {
  if (name.empty()) return Invalid(what, ": no ", kind, " named");
  if (name.size() > kMaxDefNameBytes) {
    return Invalid(what, ": ", kind, " name of ", name.size(), " bytes ('", name.substr(0, 32),
                   "...'); at most ", kMaxDefNameBytes);
  }
  return absl::OkStatus();
}

absl::Status CheckCount(absl::string_view what, absl::string_view items, int count, int max) {
  if (count > max) return Invalid(what, " has ", count, " ", items, "; at most ", max);
  return absl::OkStatus();
}

// A static shape within the bounds: rank <= kMaxDefRank, every dimension
// >= 1, at most kMaxDefElements elements and kMaxDefRows rows (the products
// checked for overflow by CheckedElementCount).
absl::StatusOr<Shape> ShapeFromDef(absl::string_view what,
                                   const google::protobuf::RepeatedField<int64_t>& dims) {
  if (dims.size() > kMaxDefRank) {
    return Invalid(what, ": shape of rank ", dims.size(), "; at most ", kMaxDefRank);
  }
  const absl::Span<const int64_t> shape(dims.data(), dims.size());
  if (absl::StatusOr<uint64_t> elements = CheckedElementCount(shape, kMaxDefElements); !elements.ok()) {
    return Invalid(what, ": ", elements.status().message());
  }
  if (!shape.empty()) {
    if (absl::StatusOr<uint64_t> rows = CheckedElementCount(shape.first(shape.size() - 1), kMaxDefRows);
        !rows.ok()) {
      return Invalid(what, ": shape ", ListString(dims), " has more than ", kMaxDefRows,
                     " rows (elements before its last axis)");
    }
  }
  return Shape(dims.begin(), dims.end());
}

absl::StatusOr<DType> DTypeFromDef(absl::string_view what, DTypeDef def) {
  auto dtype = FromDef(def);
  if (!dtype.ok()) return Prefixed(what, dtype.status());
  return *dtype;
}

absl::StatusOr<Sharding> ShardingFromDef(absl::string_view what, const ShardingDef& def) {
  auto sharding = FromDef(def);
  if (!sharding.ok()) return Prefixed(what, sharding.status());
  return *sharding;
}

absl::StatusOr<std::shared_ptr<const Kernel>> StepKernel(const std::string& what, const std::string& function,
                                                         const KernelStepDef& step) {
  switch (step.kernel_case()) {
    case KernelStepDef::kBuiltin: {
      CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "built-in kernel", step.builtin()));
      auto kernel = BuiltinKernel(step.builtin());
      if (!kernel.ok()) return Prefixed(what, kernel.status());
      return *kernel;
    }
    case KernelStepDef::kSpirv: {
      if (step.kernel_name().size() > kMaxDefNameBytes) {
        return Invalid(what, ": kernel_name of ", step.kernel_name().size(), " bytes; at most ",
                       kMaxDefNameBytes);
      }
      auto kernel =
          Kernel::FromSpirvBytes(step.kernel_name().empty() ? function : step.kernel_name(), step.spirv());
      if (!kernel.ok()) return Prefixed(what, kernel.status());
      return *kernel;
    }
    case KernelStepDef::kSpirvFile:
    case KernelStepDef::kGlslFile: {
      // Paths are for program files, which read them into `spirv` first
      // (tools/program_file.h); a def from elsewhere carries its bytes.
      const bool spv = step.kernel_case() == KernelStepDef::kSpirvFile;
      const std::string& path = spv ? step.spirv_file() : step.glsl_file();
      return Invalid(what, ": kernel by path (", spv ? "spirv_file" : "glsl_file", " '",
                     absl::string_view(path).substr(0, kMaxDefNameBytes),
                     "') not resolved; a def must carry its SPIR-V in `spirv` (only a program file "
                     "reads kernels from files)");
    }
    case KernelStepDef::KERNEL_NOT_SET:
      break;
  }
  return Invalid(what, ": no kernel (expected `builtin` or `spirv`)");
}

absl::StatusOr<std::shared_ptr<const Function>> CustomFromDef(const std::string& name,
                                                              const FunctionDef::Custom& def) {
  const std::string what = absl::StrCat("function '", name, "'");
  std::array<std::vector<TensorSpec>, 3> specs;  // inputs, outputs, scratch
  const std::array<const google::protobuf::RepeatedPtrField<TensorSpecDef>*, 3> defs = {
      &def.inputs(), &def.outputs(), &def.scratch()};
  const std::array<const char*, 3> kinds = {"input", "output", "scratch buffer"};
  for (int k = 0; k < 3; ++k) {
    CAUSEWAY_RETURN_IF_ERROR(CheckCount(what, absl::StrCat(kinds[k], "s"), defs[k]->size(), kMaxDefTensors));
    for (int i = 0; i < defs[k]->size(); ++i) {
      const TensorSpecDef& t = (*defs[k])[i];
      const std::string which = absl::StrCat(what, " ", kinds[k], " ", i);
      CAUSEWAY_ASSIGN_OR_RETURN(Shape shape, ShapeFromDef(which, t.shape()));
      CAUSEWAY_ASSIGN_OR_RETURN(DType dtype, DTypeFromDef(which, t.dtype()));
      specs[k].push_back({std::move(shape), dtype});
    }
  }
  CAUSEWAY_RETURN_IF_ERROR(CheckCount(what, "steps", def.steps().size(), kMaxDefSteps));

  // Only what is particular to a def is checked here: how much it holds, and
  // how its kernels and groups are written. Every rule of a function (the
  // arguments against the kernel's bindings, push constants, groups,
  // specialization, workgroup size) is Function::Create's, the same for a
  // function made in C++.
  std::vector<KernelStep> steps;
  for (int s = 0; s < def.steps().size(); ++s) {
    const KernelStepDef& step = def.steps(s);
    const std::string at = absl::StrCat(what, " step ", s);
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Kernel> kernel, StepKernel(at, name, step));
    if (step.push_constants().size() > kMaxDefPushConstantBytes) {
      return Invalid(at, ": ", step.push_constants().size(), " bytes of push constants; at most ",
                     kMaxDefPushConstantBytes);
    }
    std::array<uint32_t, 3> groups{1, 1, 1};
    if (!step.groups().empty()) {
      if (step.groups().size() != 3) {
        return Invalid(at, ": groups ", ListString(step.groups()), " (expected none, or 3 counts: x, y, z)");
      }
      std::copy(step.groups().begin(), step.groups().end(), groups.begin());
    }
    SpecValues spec;
    for (const KernelStepDef::SpecValue& v : step.spec()) spec.emplace_back(v.id(), v.value());
    steps.push_back({std::move(kernel), std::vector<int>(step.args().begin(), step.args().end()),
                     std::vector<uint8_t>(step.push_constants().begin(), step.push_constants().end()), groups,
                     std::move(spec)});
  }
  return Function::Create(name, std::move(specs[0]), std::move(specs[1]), std::move(specs[2]),
                          std::move(steps));
}

absl::StatusOr<CollectiveKind> KindFromDef(absl::string_view what, CollectiveDef::Kind kind) {
  switch (kind) {
    case CollectiveDef::ALL_REDUCE:
      return CollectiveKind::kAllReduce;
    case CollectiveDef::ALL_GATHER:
      return CollectiveKind::kAllGather;
    case CollectiveDef::REDUCE_SCATTER:
      return CollectiveKind::kReduceScatter;
    case CollectiveDef::BROADCAST:
      return CollectiveKind::kBroadcast;
    case CollectiveDef::PERMUTE:
      return CollectiveKind::kPermute;
    default:
      break;
  }
  return Invalid(what, ": collective kind ", static_cast<int>(kind),
                 " (expected ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST or PERMUTE)");
}

absl::StatusOr<CollectiveOptions> OptionsFromDef(absl::string_view what, const CollectiveDef& def) {
  CollectiveOptions options;
  switch (def.op()) {
    case CollectiveDef::SUM:
      options.op = ReduceOp::kSum;
      break;
    case CollectiveDef::MAX:
      options.op = ReduceOp::kMax;
      break;
    default:
      return Invalid(what, ": reduce op ", static_cast<int>(def.op()), " (expected SUM or MAX)");
  }
  switch (def.algorithm()) {
    case CollectiveDef::AUTO:
      options.algorithm = CollectiveAlgorithm::kAuto;
      break;
    case CollectiveDef::DIRECT:
      options.algorithm = CollectiveAlgorithm::kDirect;
      break;
    case CollectiveDef::RING:
      options.algorithm = CollectiveAlgorithm::kRing;
      break;
    case CollectiveDef::DIRECT_READ:
      options.algorithm = CollectiveAlgorithm::kDirectRead;
      break;
    default:
      return Invalid(what, ": algorithm ", static_cast<int>(def.algorithm()),
                     " (expected AUTO, DIRECT, RING or DIRECT_READ)");
  }
  options.root = def.root();
  CAUSEWAY_RETURN_IF_ERROR(CheckCount(what, "pairs", def.pairs().size(), kMaxDefNodes));
  for (const CollectiveDef::Pair& pair : def.pairs()) options.pairs.emplace_back(pair.from(), pair.to());
  if (def.has_mesh_axis()) {
    if (def.mesh_axis() < -1 || def.mesh_axis() > 1) {
      return Invalid(what, ": mesh axis ", def.mesh_axis(), " (expected -1, 0 or 1)");
    }
    options.mesh_axis = def.mesh_axis();
  }
  if (def.has_ring_threshold_bytes()) options.ring_threshold_bytes = def.ring_threshold_bytes();
  return options;
}

// Collects the text parser's errors as "source:line:column: reason".
class TextErrors : public google::protobuf::io::ErrorCollector {
 public:
  TextErrors(absl::string_view text, absl::string_view source) : text_(text), source_(source) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (line < 0) {
      errors_.push_back(absl::StrCat(source_, ": ", message));
      return;
    }
    NameTheToken(message, line, column);
    errors_.push_back(absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message));
  }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  // The parser reports an unknown field name or enum value at the token after
  // it, which may be on the next line; moves (line, column) back to the name
  // itself when it is found just before. Columns count as the tokenizer's
  // do: a tab advances to the next multiple of 8.
  void NameTheToken(absl::string_view message, int& line, int& column) const {
    absl::string_view name;
    for (absl::string_view lead : {"has no field named \"", "Unknown enumeration value of \""}) {
      const size_t at = message.find(lead);
      if (at == absl::string_view::npos) continue;
      const size_t begin = at + lead.size(), end = message.find('"', begin);
      if (end != absl::string_view::npos && end > begin) name = message.substr(begin, end - begin);
    }
    if (name.empty()) return;
    // The offset of (line, column), then the last `name` before it.
    size_t offset = 0;
    for (int l = 0; l < line && offset < text_.size(); ++l) {
      const size_t nl = text_.find('\n', offset);
      offset = nl == absl::string_view::npos ? text_.size() : nl + 1;
    }
    for (int c = 0; offset < text_.size() && text_[offset] != '\n' && c < column; ++offset) {
      c = text_[offset] == '\t' ? c + 8 - c % 8 : c + 1;
    }
    const size_t found = text_.substr(0, offset).rfind(name);
    if (found == absl::string_view::npos) return;
    int l = 0, c = 0;
    for (size_t i = 0; i < found; ++i) {
      if (text_[i] == '\n') {
        ++l;
        c = 0;
      } else {
        c = text_[i] == '\t' ? c + 8 - c % 8 : c + 1;
      }
    }
    line = l;
    column = c;
  }

  absl::string_view text_;
  std::string source_;
  std::vector<std::string> errors_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Function>> FunctionFromDef(const FunctionDef& def) {
  CAUSEWAY_RETURN_IF_ERROR(CheckName("function", def.name()));
  const std::string what = absl::StrCat("function '", def.name(), "'");
  absl::StatusOr<std::shared_ptr<const Function>> function;
  switch (def.kind_case()) {
    case FunctionDef::kElementwise: {
      CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "op", def.elementwise().op()));
      CAUSEWAY_ASSIGN_OR_RETURN(Shape shape, ShapeFromDef(what, def.elementwise().shape()));
      function = Function::Elementwise(def.elementwise().op(), shape);
      break;
    }
    case FunctionDef::kScale: {
      CAUSEWAY_ASSIGN_OR_RETURN(Shape shape, ShapeFromDef(what, def.scale().shape()));
      if (!def.scale().has_alpha()) return Invalid(what, ": scale has no alpha");
      function = Function::Scale(shape, def.scale().alpha());
      break;
    }
    case FunctionDef::kMatmul: {
      const FunctionDef::Matmul& mm = def.matmul();
      google::protobuf::RepeatedField<int64_t> a, b;
      a.Add(mm.m());
      a.Add(mm.k());
      b.Add(mm.k());
      b.Add(mm.n());
      if (mm.m() == 0 || mm.n() == 0 || mm.k() == 0) {
        return Invalid(what, ": matmul m=", mm.m(), " n=", mm.n(), " k=", mm.k(), " (each must be >= 1)");
      }
      CAUSEWAY_RETURN_IF_ERROR(ShapeFromDef(absl::StrCat(what, " input a"), a).status());
      CAUSEWAY_RETURN_IF_ERROR(ShapeFromDef(absl::StrCat(what, " input b"), b).status());
      a.Set(1, mm.n());
      CAUSEWAY_RETURN_IF_ERROR(ShapeFromDef(absl::StrCat(what, " output"), a).status());
      function = Function::Matmul(mm.m(), mm.n(), mm.k());
      break;
    }
    case FunctionDef::kRepeatedAdd: {
      CAUSEWAY_ASSIGN_OR_RETURN(Shape shape, ShapeFromDef(what, def.repeated_add().shape()));
      const int count = def.repeated_add().count();
      if (count < 1 || count > kMaxDefSteps) {
        return Invalid(what, ": repeated_add count ", count, " (expected 1..", kMaxDefSteps, ")");
      }
      function = Function::RepeatedAdd(shape, count);
      break;
    }
    case FunctionDef::kCustom:
      return CustomFromDef(def.name(), def.custom());
    case FunctionDef::KIND_NOT_SET:
      return Invalid(what, ": no kind (expected elementwise, scale, matmul, repeated_add or custom)");
  }
  if (!function.ok()) return Prefixed(what, function.status());
  return function;
}

absl::StatusOr<std::shared_ptr<const Program>> BuildProgram(
    const ProgramDef& def, const absl::flat_hash_map<std::string, std::shared_ptr<Mesh>>& meshes,
    const absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>>& channels,
    std::shared_ptr<HostBudget> host_budget) {
  CAUSEWAY_RETURN_IF_ERROR(CheckName("program", def.name()));
  const std::string program = absl::StrCat("program '", def.name(), "'");
  CAUSEWAY_RETURN_IF_ERROR(CheckCount(program, "meshes", def.meshes().size(), kMaxDefMeshes));
  CAUSEWAY_RETURN_IF_ERROR(CheckCount(program, "functions", def.functions().size(), kMaxDefFunctions));
  CAUSEWAY_RETURN_IF_ERROR(CheckCount(program, "parameters", def.parameters().size(), kMaxDefNodes));
  CAUSEWAY_RETURN_IF_ERROR(CheckCount(program, "nodes", def.nodes().size(), kMaxDefNodes));
  CAUSEWAY_RETURN_IF_ERROR(CheckCount(program, "outputs", def.outputs().size(), kMaxDefNodes));

  // Meshes: each bound to a mesh of the same dims.
  absl::flat_hash_map<std::string, std::shared_ptr<Mesh>> mesh_of;
  for (int i = 0; i < def.meshes().size(); ++i) {
    const MeshDef& m = def.meshes(i);
    CAUSEWAY_RETURN_IF_ERROR(CheckName(absl::StrCat("mesh ", i), m.name()));
    const std::string what = absl::StrCat("mesh '", m.name(), "'");
    if (mesh_of.contains(m.name())) return Invalid(what, " is defined twice");
    if (m.island().size() > kMaxDefNameBytes) {
      return Invalid(what, ": island name of ", m.island().size(), " bytes; at most ", kMaxDefNameBytes);
    }
    if (m.dims().empty() || m.dims().size() > 2) {
      return Invalid(what, ": dims ", ListString(m.dims()), " (expected 1 or 2 sizes)");
    }
    for (int d : m.dims()) {
      if (d < 1) return Invalid(what, ": dims ", ListString(m.dims()), " (each must be >= 1)");
    }
    auto it = meshes.find(m.name());
    if (it == meshes.end() || it->second == nullptr) {
      std::vector<std::string> bound;
      for (const auto& [name, mesh] : meshes) {
        if (mesh != nullptr) bound.push_back(absl::StrCat("'", name, "'"));
      }
      std::sort(bound.begin(), bound.end());
      return Invalid(
          what, " is not bound to a mesh (bound: ", bound.empty() ? "none" : absl::StrJoin(bound, ", "), ")");
    }
    const std::shared_ptr<Mesh>& mesh = it->second;
    if (!std::equal(m.dims().begin(), m.dims().end(), mesh->dims().begin(), mesh->dims().end())) {
      return Invalid(what, " has dims ", ListString(m.dims()), " in the program, but it is bound to ",
                     mesh->DebugString(), " of dims [", absl::StrJoin(mesh->dims(), ", "), "]");
    }
    if (!m.island().empty() && m.island() != mesh->island()) {
      return Invalid(what, " is on island '", m.island(), "' in the program, but it is bound to ",
                     mesh->DebugString(), " on island '", mesh->island(), "'");
    }
    mesh_of.emplace(m.name(), mesh);
  }
  auto find_mesh = [&](absl::string_view what,
                       const std::string& name) -> absl::StatusOr<std::shared_ptr<Mesh>> {
    CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "mesh", name));
    auto it = mesh_of.find(name);
    if (it == mesh_of.end()) {
      std::vector<std::string> names;
      for (const MeshDef& m : def.meshes()) names.push_back(absl::StrCat("'", m.name(), "'"));
      return Invalid(what, ": unknown mesh '", name,
                     "' (the program's meshes: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")");
    }
    return it->second;
  };

  auto find_channel = [&](absl::string_view what, uint64_t id) -> absl::StatusOr<std::shared_ptr<Channel>> {
    auto it = channels.find(id);
    if (it != channels.end() && it->second != nullptr) return it->second;
    std::vector<uint64_t> ids;
    for (const auto& [given, channel] : channels) {
      if (channel != nullptr) ids.push_back(given);
    }
    std::sort(ids.begin(), ids.end());
    constexpr size_t kShown = 16;  // of a list that may be long
    std::string shown =
        ids.empty() ? "none" : absl::StrJoin(ids.begin(), ids.begin() + std::min(ids.size(), kShown), ", ");
    if (ids.size() > kShown) absl::StrAppend(&shown, ", ... (", ids.size(), " in all)");
    return Invalid(what, ": channel ", id, " is not one of the channels given to load it (given: ", shown,
                   ")");
  };

  absl::flat_hash_map<std::string, std::shared_ptr<const Function>> functions;
  for (int i = 0; i < def.functions().size(); ++i) {
    const FunctionDef& f = def.functions(i);
    CAUSEWAY_RETURN_IF_ERROR(CheckName(absl::StrCat("function ", i), f.name()));
    if (functions.contains(f.name())) return Invalid("function '", f.name(), "' is defined twice");
    CAUSEWAY_ASSIGN_OR_RETURN(auto function, FunctionFromDef(f));
    functions.emplace(f.name(), std::move(function));
  }

  ProgramBuilder b(def.name());
  b.ChargeTo(std::move(host_budget));
  for (int i = 0; i < def.parameters().size(); ++i) {
    const ParameterDef& p = def.parameters(i);
    CAUSEWAY_RETURN_IF_ERROR(CheckName(absl::StrCat("parameter ", i), p.value()));
    const std::string what = absl::StrCat("parameter '", p.value(), "'");
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, find_mesh(what, p.mesh()));
    CAUSEWAY_ASSIGN_OR_RETURN(Shape shape, ShapeFromDef(what, p.shape()));
    CAUSEWAY_ASSIGN_OR_RETURN(DType dtype, DTypeFromDef(what, p.dtype()));
    CAUSEWAY_ASSIGN_OR_RETURN(Sharding sharding, ShardingFromDef(what, p.sharding()));
    b.Parameter(p.value(), std::move(mesh), std::move(shape), dtype, sharding);
  }

  for (int i = 0; i < def.nodes().size(); ++i) {
    const NodeDef& n = def.nodes(i);
    CAUSEWAY_RETURN_IF_ERROR(CheckName(absl::StrCat("node ", i), n.name()));
    const std::string what = absl::StrCat("node '", n.name(), "'");
    switch (n.kind_case()) {
      case NodeDef::kCall: {
        const CallDef& c = n.call();
        CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "function", c.function()));
        auto f = functions.find(c.function());
        if (f == functions.end()) return Invalid(what, ": unknown function '", c.function(), "'");
        CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, find_mesh(what, c.mesh()));
        CAUSEWAY_RETURN_IF_ERROR(CheckCount(what, "inputs", c.inputs().size(), kMaxDefTensors));
        CAUSEWAY_RETURN_IF_ERROR(CheckCount(what, "outputs", c.outputs().size(), kMaxDefTensors));
        for (const std::string& v : c.inputs()) CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "input value", v));
        for (const std::string& v : c.outputs()) CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "output value", v));
        if (c.output_shardings().size() > c.outputs().size()) {
          return Invalid(what, ": ", c.output_shardings().size(), " output shardings for ",
                         c.outputs().size(), " outputs");
        }
        std::vector<Sharding> shardings;
        for (int o = 0; o < c.output_shardings().size(); ++o) {
          CAUSEWAY_ASSIGN_OR_RETURN(
              Sharding s, ShardingFromDef(absl::StrCat(what, " output ", o), c.output_shardings(o)));
          shardings.push_back(s);
        }
        b.Call(n.name(), f->second, std::move(mesh), {c.inputs().begin(), c.inputs().end()},
               {c.outputs().begin(), c.outputs().end()}, std::move(shardings));
        break;
      }
      case NodeDef::kCollective: {
        const CollectiveDef& c = n.collective();
        CAUSEWAY_ASSIGN_OR_RETURN(CollectiveKind kind, KindFromDef(what, c.kind()));
        CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, find_mesh(what, c.mesh()));
        CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "input value", c.input()));
        CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "output value", c.output()));
        CAUSEWAY_ASSIGN_OR_RETURN(CollectiveOptions options, OptionsFromDef(what, c));
        b.Collective(n.name(), kind, std::move(mesh), c.input(), c.output(), std::move(options));
        break;
      }
      case NodeDef::kReshard: {
        const ReshardDef& r = n.reshard();
        CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, find_mesh(what, r.mesh()));
        CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "input value", r.input()));
        CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "output value", r.output()));
        CAUSEWAY_ASSIGN_OR_RETURN(Sharding sharding, ShardingFromDef(what, r.sharding()));
        b.Reshard(n.name(), std::move(mesh), r.input(), r.output(), sharding);
        break;
      }
      case NodeDef::kSend: {
        const SendDef& sd = n.send();
        CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "input value", sd.input()));
        CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Channel> channel, find_channel(what, sd.channel()));
        b.Send(n.name(), sd.input(), std::move(channel));
        break;
      }
      case NodeDef::kReceive: {
        const ReceiveDef& r = n.receive();
        CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, find_mesh(what, r.mesh()));
        CAUSEWAY_RETURN_IF_ERROR(CheckRef(what, "output value", r.output()));
        CAUSEWAY_ASSIGN_OR_RETURN(Shape shape, ShapeFromDef(what, r.shape()));
        if (shape.empty()) {
          return Invalid(what, ": receives a shape of rank 0 (expected rank 1..", kMaxDefRank, ")");
        }
        CAUSEWAY_ASSIGN_OR_RETURN(DType dtype, DTypeFromDef(what, r.dtype()));
        CAUSEWAY_ASSIGN_OR_RETURN(Sharding sharding, ShardingFromDef(what, r.sharding()));
        CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Channel> channel, find_channel(what, r.channel()));
        b.Receive(n.name(), std::move(mesh), r.output(), std::move(shape), dtype, sharding,
                  std::move(channel));
        break;
      }
      case NodeDef::KIND_NOT_SET:
        return Invalid(what,
                       ": no kind, or one this build does not know (expected call, collective, reshard, "
                       "send or receive)");
    }
  }
  for (const std::string& out : def.outputs()) {
    CAUSEWAY_RETURN_IF_ERROR(CheckRef(program, "output value", out));
    b.Output(out);
  }
  return b.Build();
}

absl::StatusOr<ProgramDef> ParseProgramDefText(absl::string_view text, absl::string_view source_name) {
  if (text.size() > kMaxProgramTextBytes) {
    return Invalid(source_name, ": ", text.size(), " bytes; a program file may have at most ",
                   kMaxProgramTextBytes);
  }
  ProgramDef def;
  CAUSEWAY_RETURN_IF_ERROR(ParseTextMessage(text, source_name, &def));
  return def;
}

absl::Status ParseTextMessage(absl::string_view text, absl::string_view source_name,
                              google::protobuf::Message* message,
                              google::protobuf::TextFormat::ParseInfoTree* locations) {
  TextErrors errors(text, source_name);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (locations != nullptr) parser.WriteLocationsTo(locations);
  if (!parser.ParseFromString(std::string(text), message)) {
    if (errors.errors().empty()) {
      return Invalid(source_name, ": not a ", message->GetDescriptor()->name(), " in text format");
    }
    return Invalid(absl::StrJoin(errors.errors(), "; "));
  }
  return absl::OkStatus();
}

std::string ProgramDefToText(const ProgramDef& def) {
  google::protobuf::TextFormat::Printer printer;
  printer.SetUseShortRepeatedPrimitives(true);
  std::string out;
  printer.PrintToString(def, &out);
  return out;
}

FunctionDef ElementwiseDef(std::string name, std::string op, const Shape& shape) {
  FunctionDef def;
  def.set_name(std::move(name));
  def.mutable_elementwise()->set_op(std::move(op));
  def.mutable_elementwise()->mutable_shape()->Add(shape.begin(), shape.end());
  return def;
}

FunctionDef ScaleDef(std::string name, const Shape& shape, float alpha) {
  FunctionDef def;
  def.set_name(std::move(name));
  def.mutable_scale()->mutable_shape()->Add(shape.begin(), shape.end());
  def.mutable_scale()->set_alpha(alpha);
  return def;
}

FunctionDef MatmulDef(std::string name, uint32_t m, uint32_t n, uint32_t k) {
  FunctionDef def;
  def.set_name(std::move(name));
  def.mutable_matmul()->set_m(m);
  def.mutable_matmul()->set_n(n);
  def.mutable_matmul()->set_k(k);
  return def;
}

FunctionDef RepeatedAddDef(std::string name, const Shape& shape, int count) {
  FunctionDef def;
  def.set_name(std::move(name));
  def.mutable_repeated_add()->mutable_shape()->Add(shape.begin(), shape.end());
  def.mutable_repeated_add()->set_count(count);
  return def;
}

absl::StatusOr<FunctionDef> ToDef(const Function& function, std::string name) {
  const std::string what = absl::StrCat("function '", function.name(), "'");
  const std::vector<TensorSpec>* lists[] = {&function.inputs(), &function.outputs(), &function.scratch()};
  const char* kinds[] = {"inputs", "outputs", "scratch buffers"};
  for (int k = 0; k < 3; ++k) {
    if (lists[k]->size() > static_cast<size_t>(kMaxDefTensors)) {
      return Invalid(what, " has ", lists[k]->size(), " ", kinds[k], "; a def holds at most ", kMaxDefTensors);
    }
  }
  if (function.steps().size() > static_cast<size_t>(kMaxDefSteps)) {
    return Invalid(what, " has ", function.steps().size(), " kernels; a def holds at most ", kMaxDefSteps);
  }
  FunctionDef def;
  def.set_name(std::move(name));
  FunctionDef::Custom* custom = def.mutable_custom();
  google::protobuf::RepeatedPtrField<TensorSpecDef>* defs[] = {custom->mutable_inputs(), custom->mutable_outputs(),
                                                               custom->mutable_scratch()};
  for (int k = 0; k < 3; ++k) {
    for (const TensorSpec& spec : *lists[k]) *defs[k]->Add() = ToDef(spec);
  }
  for (const KernelStep& step : function.steps()) *custom->add_steps() = ToDef(step);
  return def;
}

TensorSpecDef ToDef(const TensorSpec& spec) {
  TensorSpecDef def;
  def.mutable_shape()->Add(spec.shape.begin(), spec.shape.end());
  def.set_dtype(ToDef(spec.dtype));
  return def;
}

KernelStepDef ToDef(const KernelStep& step) {
  KernelStepDef def;
  // A built-in by name only if it is that very module: a custom kernel may
  // share a built-in's name.
  absl::StatusOr<std::shared_ptr<const Kernel>> builtin = BuiltinKernel(step.kernel->name());
  if (builtin.ok() && (*builtin)->sha256() == step.kernel->sha256()) {
    def.set_builtin(step.kernel->name());
  } else {
    const absl::Span<const uint32_t> words = step.kernel->spirv();
    def.set_spirv(std::string(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(uint32_t)));
    def.set_kernel_name(step.kernel->name());
  }
  def.mutable_args()->Add(step.args.begin(), step.args.end());
  def.set_push_constants(std::string(step.push_constants.begin(), step.push_constants.end()));
  def.mutable_groups()->Add(step.groups.begin(), step.groups.end());
  for (const auto& [id, value] : step.spec) {
    KernelStepDef::SpecValue* v = def.add_spec();
    v->set_id(id);
    v->set_value(value);
  }
  return def;
}

ProgramDefBuilder& ProgramDefBuilder::Mesh(std::string name, const std::vector<int>& dims) {
  MeshDef* m = def_.add_meshes();
  m->set_name(std::move(name));
  m->mutable_dims()->Add(dims.begin(), dims.end());
  return *this;
}

ProgramDefBuilder& ProgramDefBuilder::Parameter(std::string value, std::string mesh, const Shape& shape, DType dtype,
                                                const Sharding& sharding) {
  ParameterDef* p = def_.add_parameters();
  p->set_value(std::move(value));
  p->set_mesh(std::move(mesh));
  p->mutable_shape()->Add(shape.begin(), shape.end());
  p->set_dtype(ToDef(dtype));
  *p->mutable_sharding() = ToDef(sharding);
  return *this;
}

ProgramDefBuilder& ProgramDefBuilder::Call(std::string node, const std::shared_ptr<const Function>& function,
                                           std::string mesh, const std::vector<std::string>& inputs,
                                           const std::vector<std::string>& outputs,
                                           const std::vector<Sharding>& output_shardings) {
  if (!status_.ok()) return *this;
  if (function == nullptr) {
    status_ = Invalid("node '", node, "' calls no function");
    return *this;
  }
  auto it = functions_.find(function.get());
  if (it == functions_.end()) {
    const int uses = ++name_uses_[function->name()];
    std::string name = uses == 1 ? function->name() : absl::StrCat(function->name(), ".", uses);
    absl::StatusOr<FunctionDef> f = ToDef(*function, name);
    if (!f.ok()) {
      status_ = Prefixed(absl::StrCat("node '", node, "'"), f.status());
      return *this;
    }
    *def_.add_functions() = *std::move(f);
    it = functions_.emplace(function.get(), std::pair{function, std::move(name)}).first;
  }
  CallDef* c = def_.add_nodes()->mutable_call();
  c->set_function(it->second.second);
  c->set_mesh(std::move(mesh));
  for (const std::string& in : inputs) c->add_inputs(in);
  for (const std::string& out : outputs) c->add_outputs(out);
  for (const Sharding& s : output_shardings) *c->add_output_shardings() = ToDef(s);
  def_.mutable_nodes(def_.nodes_size() - 1)->set_name(std::move(node));
  return *this;
}

ProgramDefBuilder& ProgramDefBuilder::AllReduce(std::string node, std::string mesh, std::string input,
                                                std::string output, CollectiveDef::ReduceOp op) {
  CollectiveDef c;
  c.set_kind(CollectiveDef::ALL_REDUCE);
  c.set_mesh(std::move(mesh));
  c.set_input(std::move(input));
  c.set_output(std::move(output));
  c.set_op(op);
  return Collective(std::move(node), std::move(c));
}

ProgramDefBuilder& ProgramDefBuilder::Collective(std::string node, CollectiveDef collective) {
  NodeDef* n = def_.add_nodes();
  n->set_name(std::move(node));
  *n->mutable_collective() = std::move(collective);
  return *this;
}

ProgramDefBuilder& ProgramDefBuilder::Reshard(std::string node, std::string mesh, std::string input,
                                              std::string output, const Sharding& sharding) {
  NodeDef* n = def_.add_nodes();
  n->set_name(std::move(node));
  ReshardDef* r = n->mutable_reshard();
  r->set_mesh(std::move(mesh));
  r->set_input(std::move(input));
  r->set_output(std::move(output));
  *r->mutable_sharding() = ToDef(sharding);
  return *this;
}

ProgramDefBuilder& ProgramDefBuilder::Output(std::string value) {
  def_.add_outputs(std::move(value));
  return *this;
}

absl::StatusOr<ProgramDef> ProgramDefBuilder::Build() const {
  CAUSEWAY_RETURN_IF_ERROR(status_);
  return def_;
}

ShardingDef ToDef(const Sharding& sharding) {
  ShardingDef def;
  if (!sharding.replicated()) {
    def.mutable_split()->set_array_axis(sharding.array_axis);
    def.mutable_split()->set_mesh_axis(sharding.mesh_axis);
  }
  return def;
}

absl::StatusOr<Sharding> FromDef(const ShardingDef& def) {
  if (def.kind_case() != ShardingDef::kSplit) return Sharding::Replicated();
  const ShardingDef::Split& split = def.split();
  if (split.array_axis() < 0 || split.array_axis() >= kMaxDefRank) {
    return Invalid("sharding split array axis ", split.array_axis(), " (expected 0..", kMaxDefRank - 1, ")");
  }
  if (split.mesh_axis() < 0 || split.mesh_axis() > 1) {
    return Invalid("sharding split mesh axis ", split.mesh_axis(), " (expected 0 or 1)");
  }
  return Sharding::Split(split.array_axis(), split.mesh_axis());
}

DTypeDef ToDef(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return F32;
    case DType::kF16:
      return F16;
    case DType::kI32:
      return I32;
  }
  return F32;
}

absl::StatusOr<DType> FromDef(DTypeDef def) {
  switch (def) {
    case F32:
      return DType::kF32;
    case F16:
      return DType::kF16;
    case I32:
      return DType::kI32;
    default:
      break;
  }
  return Invalid("dtype ", static_cast<int>(def), " (expected F32, F16 or I32)");
}

}  // namespace causeway
