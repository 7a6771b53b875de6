#include "tools/program_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <latch>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "causeway/base/status.h"
#include "causeway/client/local_client.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/glsl_compiler.h"
#include "causeway/scheduler/program_def.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace causeway::cli {
namespace {

using ::causeway::reference::SplitMix64;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::TextFormat;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// --- element conversions ---------------------------------------------------

// IEEE binary16 of `x`, rounded to nearest even (no double rounding through
// float): overflow to infinity, underflow through the subnormals to zero.
uint16_t HalfFromDouble(double x) {
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;
  double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // halfway above 65504 rounds to infinity
  if (a < 0x1p-14) {
    // Subnormal (or the smallest normal, when it rounds up: 1024 carries
    // into the exponent field).
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24));
  }
  int e;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exponent = e - 1;          // a = s * 2^exponent, s in [1, 2)
  double q = std::nearbyint((m * 2 - 1) * 1024);
  if (q == 1024) {
    q = 0;
    ++exponent;
  }
  if (exponent + 15 >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>((exponent + 15) << 10) | static_cast<uint16_t>(q);
}

double DoubleFromHalf(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31)
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Appends `v` as one element of `dtype`, little-endian.
absl::Status AppendElement(double v, DType dtype, std::string& out) {
  uint8_t bytes[4];
  size_t size = DTypeSize(dtype);
  switch (dtype) {
    case DType::kF32: {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(bits >> (8 * i));
      break;
    }
    case DType::kF16: {
      const uint16_t h = HalfFromDouble(v);
      bytes[0] = static_cast<uint8_t>(h);
      bytes[1] = static_cast<uint8_t>(h >> 8);
      break;
    }
    case DType::kI32: {
      if (!(v == std::floor(v)) || v < std::numeric_limits<int32_t>::min() ||
          v > std::numeric_limits<int32_t>::max()) {
        return Invalid("value ", v, " is not an i32 (an integer in [-2^31, 2^31 - 1])");
      }
      const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(v));
      for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(bits >> (8 * i));
      break;
    }
  }
  out.append(reinterpret_cast<const char*>(bytes), size);
  return absl::OkStatus();
}

// What InputDef and ExpectDef have in common: where an array's elements
// come from.
struct Source {
  enum Kind { kNone, kFill, kIota, kRandom, kData, kValues } kind = kNone;
  int kinds = 0;  // how many were given (exactly 1 is valid)
  double fill = 0;
  IotaDef iota;
  RandomDef random;
  std::string data;
  std::vector<double> values;
};

Source SourceOf(const InputDef& in) {
  Source s;
  switch (in.source_case()) {
    case InputDef::kFill:
      s.kind = Source::kFill;
      s.fill = in.fill();
      break;
    case InputDef::kIota:
      s.kind = Source::kIota;
      s.iota = in.iota();
      break;
    case InputDef::kRandom:
      s.kind = Source::kRandom;
      s.random = in.random();
      break;
    case InputDef::kData:
    case InputDef::kFile:  // read into `data` by ReadProgramFile
      s.kind = Source::kData;
      s.data = in.data();
      break;
    case InputDef::SOURCE_NOT_SET:
      break;
  }
  s.kinds = s.kind != Source::kNone;
  if (!in.values().empty()) {
    s.kind = Source::kValues;
    s.kinds++;
    s.values.assign(in.values().begin(), in.values().end());
  }
  return s;
}

Source SourceOf(const ExpectDef& ex) {
  Source s;
  switch (ex.source_case()) {
    case ExpectDef::kFill:
      s.kind = Source::kFill;
      s.fill = ex.fill();
      break;
    case ExpectDef::kIota:
      s.kind = Source::kIota;
      s.iota = ex.iota();
      break;
    case ExpectDef::kData:
    case ExpectDef::kFile:
      s.kind = Source::kData;
      s.data = ex.data();
      break;
    case ExpectDef::SOURCE_NOT_SET:
      break;
  }
  s.kinds = s.kind != Source::kNone;
  if (!ex.values().empty()) {
    s.kind = Source::kValues;
    s.kinds++;
    s.values.assign(ex.values().begin(), ex.values().end());
  }
  return s;
}

constexpr char kSourceKinds[] = "fill, iota, random, file, data or values";

absl::StatusOr<std::string> MakeBytes(const Source& s, const Shape& shape, DType dtype) {
  const uint64_t n = static_cast<uint64_t>(NumElements(shape));
  const uint64_t bytes = n * DTypeSize(dtype);
  if (bytes > kMaxProgramFileDataBytes) {
    return Invalid(ShapeString(shape), " ", DTypeName(dtype), " is ", bytes,
                   " bytes; a program file's data may have at most ", kMaxProgramFileDataBytes);
  }
  if (s.kinds != 1) return Invalid(s.kinds == 0 ? "no " : "more than one of ", kSourceKinds);
  if (s.kind == Source::kData) {
    if (s.data.size() != bytes) {
      return Invalid(s.data.size(), " bytes of data for ", ShapeString(shape), " ", DTypeName(dtype),
                     ": expected ", n, " elements x ", DTypeSize(dtype), " = ", bytes, " bytes");
    }
    return s.data;
  }
  if (s.kind == Source::kValues && s.values.size() != n) {
    return Invalid(s.values.size(), " values for ", ShapeString(shape), ": expected ", n,
                   " (every element, row-major)");
  }
  if (s.kind == Source::kIota && !s.iota.steps().empty() &&
      static_cast<size_t>(s.iota.steps_size()) != shape.size()) {
    return Invalid("iota: ", s.iota.steps_size(), " steps for ", ShapeString(shape),
                   "; expected one per axis (", shape.size(), ")");
  }
  std::vector<int64_t> index(shape.size(), 0);  // of element i, for iota's steps
  double lo = 0, span = 0;
  if (s.kind == Source::kRandom) {
    const bool integer = dtype == DType::kI32;
    lo = s.random.has_min() ? s.random.min() : (integer ? 0 : -1);
    const double hi = s.random.has_max() ? s.random.max() : (integer ? 100 : 1);
    if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) {
      return Invalid("random: min ", lo, " and max ", hi, " must be finite with min <= max");
    }
    if (integer && (lo != std::floor(lo) || hi != std::floor(hi))) {
      return Invalid("random: min ", lo, " and max ", hi, " must be integers for i32");
    }
    span = integer ? hi - lo + 1 : hi - lo;
  }
  std::string out;
  out.reserve(bytes);
  for (uint64_t i = 0; i < n; ++i) {
    double v = 0;
    switch (s.kind) {
      case Source::kFill:
        v = s.fill;
        break;
      case Source::kIota:
        if (s.iota.steps().empty()) {
          v = s.iota.start() + static_cast<double>(i) * s.iota.step();
        } else {
          v = s.iota.start();
          for (size_t a = 0; a < index.size(); ++a) v += static_cast<double>(index[a]) * s.iota.steps(a);
          for (size_t a = index.size(); a-- > 0;) {
            if (++index[a] < shape[a]) break;
            index[a] = 0;
          }
        }
        break;
      case Source::kRandom: {
        const double u = static_cast<double>(SplitMix64(s.random.seed(), i) >> 11) * 0x1p-53;
        v = dtype == DType::kI32 ? lo + std::floor(u * span) : lo + span * u;
        break;
      }
      case Source::kValues:
        v = s.values[i];
        break;
      case Source::kData:
      case Source::kNone:
        break;
    }
    if (absl::Status st = AppendElement(v, dtype, out); !st.ok()) {
      return Invalid("element ", i, ": ", st.message());
    }
  }
  return out;
}

// --- reading the text ------------------------------------------------------

using Location = std::pair<int, int>;
using ParseInfoTree = TextFormat::ParseInfoTree;

const FieldDescriptor* Field(const Message& m, const char* name) {
  return m.GetDescriptor()->FindFieldByName(name);
}

// The 1-based location of field `name` (element `index` if repeated) of
// `m` parsed into `tree`; (0, 0) when it was not in the text.
Location LocationOf(const ParseInfoTree* tree, const Message& m, const char* name, int index = -1) {
  if (tree == nullptr) return {0, 0};
  TextFormat::ParseLocation at = tree->GetLocation(Field(m, name), index);
  if (at.line < 0) return {0, 0};
  return {at.line + 1, at.column + 1};
}

const ParseInfoTree* Nested(const ParseInfoTree* tree, const Message& m, const char* name, int index = -1) {
  return tree == nullptr ? nullptr : tree->GetTreeForNested(Field(m, name), index);
}

// The first thing of a name is "kind 'name'"; a second is also recorded, as
// "kind 'name' again", for the error that names it twice.
void Record(ProgramFile& file, std::string key, Location at) {
  if (at.first <= 0) return;
  if (!file.locations.contains(key)) {
    file.locations.emplace(std::move(key), at);
  } else {
    file.locations.emplace(absl::StrCat(key, " again"), at);
  }
}

void RecordLocations(ProgramFile& file, const ParseInfoTree* root) {
  const ProgramFileDef& d = file.def;
  const ProgramDef& p = d.program();
  Record(file, absl::StrCat("program '", p.name(), "'"), LocationOf(root, d, "program"));
  const ParseInfoTree* tree = Nested(root, d, "program");
  for (int i = 0; i < p.meshes_size(); ++i) {
    Record(file, absl::StrCat("mesh '", p.meshes(i).name(), "'"), LocationOf(tree, p, "meshes", i));
  }
  for (int i = 0; i < p.functions_size(); ++i) {
    const FunctionDef& f = p.functions(i);
    const std::string what = absl::StrCat("function '", f.name(), "'");
    Record(file, what, LocationOf(tree, p, "functions", i));
    if (!f.has_custom()) continue;
    const ParseInfoTree* custom = Nested(Nested(tree, p, "functions", i), f, "custom");
    for (int s = 0; s < f.custom().steps_size(); ++s) {
      Record(file, absl::StrCat(what, " step ", s), LocationOf(custom, f.custom(), "steps", s));
    }
  }
  for (int i = 0; i < p.parameters_size(); ++i) {
    Record(file, absl::StrCat("parameter '", p.parameters(i).value(), "'"),
           LocationOf(tree, p, "parameters", i));
  }
  for (int i = 0; i < p.nodes_size(); ++i) {
    Record(file, absl::StrCat("node '", p.nodes(i).name(), "'"), LocationOf(tree, p, "nodes", i));
  }
  for (int i = 0; i < p.outputs_size(); ++i) {
    Record(file, absl::StrCat("output '", p.outputs(i), "'"), LocationOf(tree, p, "outputs", i));
  }
  for (int i = 0; i < d.inputs_size(); ++i) {
    Record(file, absl::StrCat("input '", d.inputs(i).value(), "'"), LocationOf(root, d, "inputs", i));
  }
  for (int i = 0; i < d.expect_size(); ++i) {
    Record(file, absl::StrCat("expect '", d.expect(i).output(), "'"), LocationOf(root, d, "expect", i));
  }
  for (const char* field : {"clients", "runs", "accelerators"}) {
    Record(file, absl::StrCat(field, ":"), LocationOf(root, d, field));
  }
}

absl::Status At(const ProgramFile& file, Location at, absl::string_view message) {
  if (at.first <= 0) return Invalid(file.path, ": ", message);
  return Invalid(file.path, ":", at.first, ":", at.second, ": ", message);
}

// --- files named by a program file -----------------------------------------

std::filesystem::path Resolve(const ProgramFile& file, const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_absolute()) return p;
  return std::filesystem::path(file.path).parent_path() / p;
}

absl::StatusOr<std::string> ReadBytes(const std::filesystem::path& path, uint64_t max) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return absl::NotFoundError(absl::StrCat("no such file ", path.string()));
  if (std::filesystem::is_directory(path, ec)) return Invalid(path.string(), " is a directory, not a file");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot read ", path.string(), ": ", ec.message()));
  if (size > max) return Invalid(path.string(), " has ", size, " bytes; at most ", max);
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path.string()));
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<uintmax_t>(in.gcount()) != size) {
    return absl::DataLossError(absl::StrCat("read ", in.gcount(), " of ", size, " bytes of ", path.string()));
  }
  return bytes;
}

// Replaces spirv_file and glsl_file kernels by their SPIR-V bytes.
absl::Status ResolveKernels(ProgramFile& file) {
  ProgramDef& p = *file.def.mutable_program();
  for (FunctionDef& f : *p.mutable_functions()) {
    if (!f.has_custom()) continue;
    for (int s = 0; s < f.custom().steps_size(); ++s) {
      KernelStepDef& step = *f.mutable_custom()->mutable_steps(s);
      const std::string what = absl::StrCat("function '", f.name(), "' step ", s);
      if (step.kernel_case() == KernelStepDef::kSpirvFile) {
        const std::string name = step.spirv_file();
        auto bytes = ReadBytes(Resolve(file, name), kMaxProgramFileDataBytes);
        if (!bytes.ok())
          return file.Locate(Invalid(what, ": spirv_file '", name, "': ", bytes.status().message()));
        step.set_spirv(*std::move(bytes));
      } else if (step.kernel_case() == KernelStepDef::kGlslFile) {
        const std::string name = step.glsl_file();
        auto source = ReadBytes(Resolve(file, name), kMaxProgramFileDataBytes);
        if (!source.ok())
          return file.Locate(Invalid(what, ": glsl_file '", name, "': ", source.status().message()));
        auto words = CompileGlsl(name, *source);
        if (!words.ok())
          return file.Locate(Invalid(what, ": glsl_file '", name, "': ", words.status().message()));
        step.set_spirv(
            std::string(reinterpret_cast<const char*>(words->data()), words->size() * sizeof(uint32_t)));
      }
    }
  }
  return absl::OkStatus();
}

// --- checks --------------------------------------------------------------

// A parameter's shape as the data needs it (BuildProgram checks the rest).
absl::StatusOr<Shape> ParameterShape(const ParameterDef& p) {
  if (p.shape().empty()) return Invalid("has no shape");
  if (p.shape_size() > kMaxDefRank)
    return Invalid("shape of rank ", p.shape_size(), "; at most ", kMaxDefRank);
  uint64_t n = 1;
  for (int64_t d : p.shape()) {
    if (d < 1)
      return Invalid("shape ", ShapeString(Shape(p.shape().begin(), p.shape().end())),
                     " has a dimension < 1");
    if (static_cast<uint64_t>(d) > kMaxDefElements || (n *= static_cast<uint64_t>(d)) > kMaxDefElements) {
      return Invalid("shape has more than ", kMaxDefElements, " elements");
    }
  }
  return Shape(p.shape().begin(), p.shape().end());
}

absl::Status CheckProgramFile(ProgramFile& file) {
  ProgramFileDef& d = file.def;
  const ProgramDef& p = d.program();
  const std::string& path = file.path;
  auto located = [&](const std::string& key, absl::string_view message) {
    auto it = file.locations.find(key);
    return At(file, it == file.locations.end() ? Location{0, 0} : it->second, message);
  };
  if (!d.has_program()) return Invalid(path, ": no program (expected `program { ... }`)");
  if (p.nodes().empty()) return located(absl::StrCat("program '", p.name(), "'"), "the program has no nodes");
  if (d.clients() < 0 || d.clients() > kMaxProgramFileClients) {
    return located("clients:", absl::StrCat("clients: ", d.clients(), "; expected 1..",
                                            kMaxProgramFileClients, " (0: 1)"));
  }
  if (d.runs() < 0 || d.runs() > kMaxProgramFileRuns) {
    return located("runs:",
                   absl::StrCat("runs: ", d.runs(), "; expected 1..", kMaxProgramFileRuns, " (0: 1)"));
  }
  if (d.accelerators() < 0 || d.accelerators() > kMaxProgramFileAccelerators) {
    return located("accelerators:",
                   absl::StrCat("accelerators: ", d.accelerators(), "; expected 1..",
                                kMaxProgramFileAccelerators, " (0: the sum of the mesh sizes)"));
  }

  // Names and references, which the builder would also find, but here
  // before any accelerator is made.
  absl::flat_hash_set<std::string> meshes, functions, values, parameters;
  for (const MeshDef& m : p.meshes()) {
    const std::string what = absl::StrCat("mesh '", m.name(), "'");
    if (m.name().empty()) return Invalid(path, ": a mesh has no name");
    if (!meshes.insert(m.name()).second)
      return located(what + " again", absl::StrCat(what, " is defined twice"));
  }
  for (const FunctionDef& f : p.functions()) {
    const std::string what = absl::StrCat("function '", f.name(), "'");
    if (f.name().empty()) return Invalid(path, ": a function has no name");
    if (!functions.insert(f.name()).second) {
      return located(what + " again", absl::StrCat(what, " is defined twice"));
    }
    // Kernels are checked here (SPIR-V, bindings, push constants) rather
    // than once per client.
    auto function = FunctionFromDef(f);
    if (!function.ok()) return file.Locate(function.status());
  }
  auto need_mesh = [&](const std::string& what, const std::string& mesh) -> absl::Status {
    if (meshes.contains(mesh)) return absl::OkStatus();
    return located(what, absl::StrCat(what, ": mesh '", mesh, "' is not one of the program's meshes (",
                                      absl::StrJoin(p.meshes(), ", ",
                                                    [](std::string* out, const MeshDef& m) {
                                                      absl::StrAppend(out, "'", m.name(), "'");
                                                    }),
                                      ")"));
  };
  for (const ParameterDef& par : p.parameters()) {
    const std::string what = absl::StrCat("parameter '", par.value(), "'");
    if (par.value().empty()) return Invalid(path, ": a parameter has no value name");
    if (!values.insert(par.value()).second) {
      return located(what + " again", absl::StrCat(what, ": value '", par.value(), "' is defined twice"));
    }
    parameters.insert(par.value());
    CAUSEWAY_RETURN_IF_ERROR(need_mesh(what, par.mesh()));
    auto shape = ParameterShape(par);
    if (!shape.ok()) return located(what, absl::StrCat(what, ": ", shape.status().message()));
  }
  absl::flat_hash_set<std::string> nodes;
  for (const NodeDef& n : p.nodes()) {
    const std::string what = absl::StrCat("node '", n.name(), "'");
    if (n.name().empty()) return Invalid(path, ": a node has no name");
    if (!nodes.insert(n.name()).second)
      return located(what + " again", absl::StrCat(what, " is defined twice"));
    std::vector<std::string> outputs;
    switch (n.kind_case()) {
      case NodeDef::kCall:
        outputs.assign(n.call().outputs().begin(), n.call().outputs().end());
        break;
      case NodeDef::kCollective:
        outputs = {n.collective().output()};
        break;
      case NodeDef::kReshard:
        outputs = {n.reshard().output()};
        break;
      case NodeDef::kSend:
      case NodeDef::kReceive:
        return located(
            what, absl::StrCat(what,
                               ": send and receive nodes cross islands; a program file runs on one "
                               "island (split programs run from a controller, causeway/scheduler/split.h)"));
      case NodeDef::KIND_NOT_SET:
        return located(what, absl::StrCat(what, ": no kind (expected call, collective or reshard)"));
    }
    for (const std::string& v : outputs) {
      if (!v.empty() && !values.insert(v).second) {
        return located(what, absl::StrCat(what, ": value '", v, "' is defined twice"));
      }
    }
  }
  for (const NodeDef& n : p.nodes()) {
    const std::string what = absl::StrCat("node '", n.name(), "'");
    std::vector<std::string> inputs;
    std::string mesh;
    if (n.has_call()) {
      inputs.assign(n.call().inputs().begin(), n.call().inputs().end());
      mesh = n.call().mesh();
      if (!functions.contains(n.call().function())) {
        return located(what, absl::StrCat(what, ": function '", n.call().function(),
                                          "' is not one of the program's functions"));
      }
    } else if (n.has_collective()) {
      inputs = {n.collective().input()};
      mesh = n.collective().mesh();
    } else {
      inputs = {n.reshard().input()};
      mesh = n.reshard().mesh();
    }
    CAUSEWAY_RETURN_IF_ERROR(need_mesh(what, mesh));
    for (const std::string& v : inputs) {
      if (!values.contains(v)) {
        return located(
            what, absl::StrCat(what, ": input '", v, "' is neither a parameter nor an output of any node"));
      }
    }
  }
  for (const std::string& out : p.outputs()) {
    const std::string what = absl::StrCat("output '", out, "'");
    if (!values.contains(out)) {
      return located(what, absl::StrCat(what, " is neither a parameter nor an output of any node"));
    }
    if (parameters.contains(out))
      return located(what, absl::StrCat(what, " is a parameter; outputs are computed values"));
  }

  // Inputs: one per parameter, data that fits it.
  absl::flat_hash_map<std::string, InputDef*> inputs;
  for (InputDef& in : *d.mutable_inputs()) {
    const std::string what = absl::StrCat("input '", in.value(), "'");
    if (!parameters.contains(in.value())) {
      return located(what, absl::StrCat(what, ": the program has no parameter '", in.value(), "'"));
    }
    if (!inputs.emplace(in.value(), &in).second) {
      return located(what + " again", absl::StrCat(what, " is given twice"));
    }
    if (in.source_case() == InputDef::kFile) {
      const std::string name = in.file();
      auto bytes = ReadBytes(Resolve(file, name), kMaxProgramFileDataBytes);
      if (!bytes.ok())
        return located(what, absl::StrCat(what, ": file '", name, "': ", bytes.status().message()));
      in.set_data(*std::move(bytes));
    }
  }
  for (const ParameterDef& par : p.parameters()) {
    const std::string what = absl::StrCat("parameter '", par.value(), "'");
    auto it = inputs.find(par.value());
    if (it == inputs.end()) {
      return located(what, absl::StrCat(what, " has no input (add `inputs { value: \"", par.value(),
                                        "\" fill: 0 }` or iota, random, file, values)"));
    }
    auto dtype = FromDef(par.dtype());
    if (!dtype.ok()) return located(what, absl::StrCat(what, ": ", dtype.status().message()));
    auto bytes = InputBytes(*it->second, *ParameterShape(par), *dtype);
    const std::string input = absl::StrCat("input '", par.value(), "'");
    if (!bytes.ok()) {
      return located(input, absl::StrCat(input, " for ", ShapeString(*ParameterShape(par)), " ",
                                         DTypeName(*dtype), ": ", bytes.status().message()));
    }
  }

  // Expectations: of outputs, with one source.
  absl::flat_hash_set<std::string> outputs(p.outputs().begin(), p.outputs().end()), expected;
  for (ExpectDef& ex : *d.mutable_expect()) {
    const std::string what = absl::StrCat("expect '", ex.output(), "'");
    if (!outputs.contains(ex.output())) {
      return located(what, absl::StrCat(what, ": the program has no output '", ex.output(),
                                        "' (its outputs: ", absl::StrJoin(p.outputs(), ", "), ")"));
    }
    if (!expected.insert(ex.output()).second) {
      return located(what + " again", absl::StrCat(what, " is given twice"));
    }
    if (!(ex.tolerance() >= 0) || !std::isfinite(ex.tolerance())) {
      return located(what, absl::StrCat(what, ": tolerance ", ex.tolerance(), " must be finite and >= 0"));
    }
    if (ex.source_case() == ExpectDef::kFile) {
      const std::string name = ex.file();
      auto bytes = ReadBytes(Resolve(file, name), kMaxProgramFileDataBytes);
      if (!bytes.ok())
        return located(what, absl::StrCat(what, ": file '", name, "': ", bytes.status().message()));
      ex.set_data(*std::move(bytes));
    }
    const int kinds = SourceOf(ex).kinds;
    if (kinds != 1) {
      return located(what, absl::StrCat(what, ": ", kinds == 0 ? "no " : "more than one of ",
                                        "fill, iota, file, data or values"));
    }
  }
  return absl::OkStatus();
}

// --- running --------------------------------------------------------------

// One expectation, ready to compare: values rounded to the output's dtype.
struct Expected {
  std::vector<double> want;
  double tolerance = 0;
};

bool Matches(double got, double want, double tolerance) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (got == want) return true;
  return std::fabs(got - want) <= tolerance * std::max(1.0, std::fabs(want));
}

std::string IndexString(uint64_t i, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t a = shape.size(); a-- > 0;) {
    index[a] = static_cast<int64_t>(i % shape[a]);
    i /= shape[a];
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

// What one client does; see RunProgramFile.
class ClientRunner {
 public:
  ClientRunner(const ProgramFile& file, const ProgramFileClientFactory& connect, std::string name, int runs,
               const ProgramFileRunOptions& options)
      : file_(file), connect_(connect), runs_(runs), options_(options) {
    result_.client = std::move(name);
  }

  // Everything before the runs: connect, meshes, load, inputs.
  absl::Status Prepare() {
    const absl::Time t0 = absl::Now();
    const ProgramDef& p = file_.def.program();
    CAUSEWAY_ASSIGN_OR_RETURN(client_, connect_(result_.client));
    // A mesh that names its island goes there; the rest go to the first.
    std::vector<std::string> islands(static_cast<size_t>(client_->island_count()));
    CAUSEWAY_ASSIGN_OR_RETURN(std::vector<client::Device> devices, client_->Devices());
    for (const client::Device& d : devices) {
      if (d.island >= 0 && d.island < client_->island_count()) islands[d.island] = d.island_name;
    }
    absl::flat_hash_map<std::string, client::Mesh> meshes;
    for (const MeshDef& m : p.meshes()) {
      const std::string what = absl::StrCat("mesh '", m.name(), "'");
      int island = 0;
      if (!m.island().empty()) {
        auto it = std::find(islands.begin(), islands.end(), m.island());
        if (it == islands.end()) {
          return file_.Locate(Invalid(what, " is on island '", m.island(),
                                      "', which is not among the islands: '", absl::StrJoin(islands, "', '"),
                                      "'"));
        }
        island = static_cast<int>(it - islands.begin());
      }
      auto mesh = client_->AllocateMesh(island, std::vector<int>(m.dims().begin(), m.dims().end()));
      if (!mesh.ok())
        return file_.Locate(
            absl::Status(mesh.status().code(), absl::StrCat(what, ": ", mesh.status().message())));
      meshes[m.name()] = *std::move(mesh);
    }
    auto program = client_->Load(p, meshes);
    if (!program.ok()) return file_.Locate(program.status());
    program_ = *std::move(program);
    for (const ParameterDef& par : p.parameters()) {
      // Load checked each parameter: its mesh, dtype and sharding.
      const std::string what = absl::StrCat("input '", par.value(), "'");
      CAUSEWAY_ASSIGN_OR_RETURN(DType dtype, FromDef(par.dtype()));
      CAUSEWAY_ASSIGN_OR_RETURN(Sharding sharding, FromDef(par.sharding()));
      const Shape shape(par.shape().begin(), par.shape().end());
      const InputDef* in = nullptr;
      for (const InputDef& i : file_.def.inputs()) {
        if (i.value() == par.value()) in = &i;
      }
      auto bytes = InputBytes(*in, shape, dtype);
      if (!bytes.ok()) return file_.Locate(Invalid(what, ": ", bytes.status().message()));
      CAUSEWAY_ASSIGN_OR_RETURN(client::Array array,
                                client_->CreateArray(meshes.at(par.mesh()), shape, dtype, sharding));
      inputs_.push_back(array);
      CAUSEWAY_RETURN_IF_ERROR(client_->Upload(array, bytes->data(), bytes->size()));
    }
    result_.load_time = absl::Now() - t0;
    return absl::OkStatus();
  }

  // Queues every run, keeping at most `window` in flight awaited behind the
  // newest (each awaited run's outputs given back); then downloads the last
  // run's outputs.
  absl::Status Run() {
    const absl::Time t0 = absl::Now();
    const absl::Time deadline = t0 + options_.timeout;
    const size_t window = static_cast<size_t>(std::max(1, options_.window));
    client::ExecuteOptions execute;
    execute.deadline = options_.deadline;
    std::deque<std::pair<int, client::Run>> pending;
    auto await_front = [&](bool keep_outputs) -> absl::Status {
      auto& [index, run] = pending.front();
      if (absl::Status s = run.done.AwaitStatus(deadline); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("run ", index, ": ", s.message()));
      }
      if (!keep_outputs) {
        for (const client::Array& a : run.outputs) CAUSEWAY_RETURN_IF_ERROR(client_->Release(a));
      }
      pending.pop_front();
      return absl::OkStatus();
    };
    for (int r = 0; r < runs_; ++r) {
      auto run = client_->Execute(program_, inputs_, execute);
      if (!run.ok())
        return absl::Status(run.status().code(), absl::StrCat("run ", r, ": ", run.status().message()));
      if (r == 0) CAUSEWAY_RETURN_IF_ERROR(Expect(run->outputs));
      pending.emplace_back(r, *std::move(run));
      while (pending.size() > window) CAUSEWAY_RETURN_IF_ERROR(await_front(false));
    }
    const client::Run last = pending.back().second;
    while (!pending.empty()) CAUSEWAY_RETURN_IF_ERROR(await_front(pending.size() == 1));
    result_.run_time = absl::Now() - t0;
    result_.runs = runs_;
    const ProgramDef& p = file_.def.program();
    for (size_t i = 0; i < last.outputs.size(); ++i) {
      const client::Array& a = last.outputs[i];
      ProgramFileOutput out;
      out.name = p.outputs(static_cast<int>(i));
      out.shape = a.shape;
      out.dtype = a.dtype;
      out.bytes.resize(a.bytes());
      CAUSEWAY_RETURN_IF_ERROR(client_->Download(a, out.bytes.data(), out.bytes.size(), deadline));
      result_.outputs.push_back(std::move(out));
    }
    return absl::OkStatus();
  }

  // Sentences for the outputs that are not as expected.
  std::vector<std::string> Check() const {
    std::vector<std::string> mismatches;
    for (const ProgramFileOutput& out : result_.outputs) {
      auto it = expected_.find(out.name);
      if (it == expected_.end()) continue;
      const std::vector<double> got = ElementsAsDoubles(out.bytes, out.dtype);
      const Expected& e = it->second;
      std::vector<std::string> firsts;
      uint64_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (Matches(got[i], e.want[i], e.tolerance)) continue;
        if (++wrong <= 4) {
          firsts.push_back(absl::StrCat(IndexString(i, out.shape), " got ", got[i], " want ", e.want[i]));
        }
      }
      if (wrong == 0) continue;
      mismatches.push_back(
          absl::StrCat("client '", result_.client, "' output '", out.name, "': ", wrong, " of ", got.size(),
                       " elements differ from the expectation (tolerance ", e.tolerance,
                       "): ", absl::StrJoin(firsts, "; "), wrong > firsts.size() ? "; ..." : ""));
    }
    return mismatches;
  }

  bool expects(const std::string& output) const { return expected_.contains(output); }
  ProgramFileClientResult& result() { return result_; }
  // Gives back the client's meshes and arrays (before the island goes).
  void Close() {
    program_.reset();
    inputs_.clear();
    client_.reset();
  }

 private:
  // The file's expectations, made for the outputs' shapes and dtypes (known
  // once the first run has started).
  absl::Status Expect(const std::vector<client::Array>& outputs) {
    const ProgramDef& p = file_.def.program();
    for (size_t i = 0; i < outputs.size() && i < static_cast<size_t>(p.outputs_size()); ++i) {
      const std::string& name = p.outputs(static_cast<int>(i));
      const client::Array& a = outputs[i];
      for (const ExpectDef& ex : file_.def.expect()) {
        if (ex.output() != name) continue;
        auto bytes = MakeBytes(SourceOf(ex), a.shape, a.dtype);
        if (!bytes.ok()) {
          return file_.Locate(Invalid("expect '", name, "' for output '", name, "' ", ShapeString(a.shape),
                                      " ", DTypeName(a.dtype), ": ", bytes.status().message()));
        }
        expected_[name] = {ElementsAsDoubles(*bytes, a.dtype), ex.tolerance()};
      }
    }
    return absl::OkStatus();
  }

  const ProgramFile& file_;
  const ProgramFileClientFactory& connect_;
  const int runs_;
  const ProgramFileRunOptions options_;
  ProgramFileClientResult result_;
  std::unique_ptr<client::Client> client_;
  std::shared_ptr<client::LoadedProgram> program_;
  std::vector<client::Array> inputs_;
  absl::flat_hash_map<std::string, Expected> expected_;
};

}  // namespace

int ProgramFile::accelerators() const {
  if (def.accelerators() > 0) return def.accelerators();
  int64_t sum = 0;
  for (const MeshDef& m : def.program().meshes()) {
    int64_t size = 1;
    for (int d : m.dims()) size *= std::clamp(d, 1, kMaxProgramFileAccelerators);
    sum += std::min<int64_t>(size, kMaxProgramFileAccelerators);
  }
  return static_cast<int>(std::clamp<int64_t>(sum, 1, kMaxProgramFileAccelerators));
}

absl::Status ProgramFile::Locate(const absl::Status& status) const {
  if (status.ok()) return status;
  const absl::string_view message = status.message();
  size_t best_at = absl::string_view::npos, best_size = 0;
  Location best;
  for (const auto& [key, at] : locations) {
    const size_t found = message.find(key);
    if (found == absl::string_view::npos) continue;
    if (found < best_at || (found == best_at && key.size() > best_size)) {
      best_at = found, best_size = key.size(), best = at;
    }
  }
  if (best_at == absl::string_view::npos)
    return absl::Status(status.code(), absl::StrCat(path, ": ", message));
  return absl::Status(status.code(), absl::StrCat(path, ":", best.first, ":", best.second, ": ", message));
}

absl::StatusOr<ProgramFile> ParseProgramFile(absl::string_view text, const std::string& path) {
  if (text.size() > kMaxProgramTextBytes) {
    return Invalid(path, ": ", text.size(), " bytes; a program file may have at most ", kMaxProgramTextBytes);
  }
  ProgramFile file;
  file.path = path;
  ParseInfoTree tree;
  CAUSEWAY_RETURN_IF_ERROR(ParseTextMessage(text, path, &file.def, &tree));
  RecordLocations(file, &tree);
  CAUSEWAY_RETURN_IF_ERROR(ResolveKernels(file));
  CAUSEWAY_RETURN_IF_ERROR(CheckProgramFile(file));
  return file;
}

absl::StatusOr<ProgramFile> ReadProgramFile(const std::string& path) {
  auto text = ReadBytes(path, kMaxProgramTextBytes);
  if (!text.ok())
    return absl::Status(text.status().code(), absl::StrCat(path, ": ", text.status().message()));
  return ParseProgramFile(*text, path);
}

absl::StatusOr<std::string> InputBytes(const InputDef& input, const Shape& shape, DType dtype) {
  if (input.source_case() == InputDef::kFile) {
    return Invalid("file '", input.file(), "' not read (ReadProgramFile reads it into `data`)");
  }
  return MakeBytes(SourceOf(input), shape, dtype);
}

std::vector<double> ElementsAsDoubles(absl::string_view bytes, DType dtype) {
  const size_t size = DTypeSize(dtype);
  std::vector<double> out(bytes.size() / size);
  for (size_t i = 0; i < out.size(); ++i) {
    const auto* b = reinterpret_cast<const uint8_t*>(bytes.data() + i * size);
    uint32_t bits = 0;
    for (size_t k = 0; k < size; ++k) bits |= static_cast<uint32_t>(b[k]) << (8 * k);
    switch (dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, &bits, 4);
        out[i] = f;
        break;
      }
      case DType::kF16:
        out[i] = DoubleFromHalf(static_cast<uint16_t>(bits));
        break;
      case DType::kI32:
        out[i] = static_cast<int32_t>(bits);
        break;
    }
  }
  return out;
}

uint64_t OutputChecksum(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

double ProgramFileClientResult::runs_per_second() const {
  const double s = absl::ToDoubleSeconds(run_time);
  return s > 0 ? runs / s : 0;
}

absl::StatusOr<ProgramFileResult> RunProgramFile(const ProgramFile& file,
                                                 const ProgramFileClientFactory& connect,
                                                 const ProgramFileRunOptions& options) {
  const int clients = options.clients > 0 ? options.clients : file.clients();
  const int runs = options.runs > 0 ? options.runs : file.runs();
  if (clients > kMaxProgramFileClients)
    return Invalid("clients: ", clients, "; at most ", kMaxProgramFileClients);
  if (runs > kMaxProgramFileRuns) return Invalid("runs: ", runs, "; at most ", kMaxProgramFileRuns);

  std::vector<std::unique_ptr<ClientRunner>> runners;
  for (int c = 0; c < clients; ++c) {
    runners.push_back(
        std::make_unique<ClientRunner>(file, connect, absl::StrCat("client-", c), runs, options));
  }
  // Every client prepares, then all start their runs together, so that
  // their runs overlap and each one's rate is measured under the others.
  std::vector<absl::Status> status(clients);
  std::latch prepared(clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      status[c] = runners[c]->Prepare();
      prepared.arrive_and_wait();
      if (status[c].ok()) status[c] = runners[c]->Run();
    });
  }
  for (std::thread& t : threads) t.join();

  ProgramFileResult result;
  absl::Status failed;
  for (int c = 0; c < clients; ++c) {
    if (!status[c].ok() && failed.ok()) {
      failed = clients == 1
                   ? status[c]
                   : absl::Status(status[c].code(), absl::StrCat("client '", runners[c]->result().client,
                                                                 "': ", status[c].message()));
    }
  }
  if (failed.ok()) {
    for (int c = 0; c < clients; ++c) {
      for (std::string& m : runners[c]->Check()) result.mismatches.push_back(std::move(m));
      // Outputs without an expectation must at least agree between clients:
      // the same program on the same inputs.
      const auto& first = runners[0]->result().outputs;
      const auto& mine = runners[c]->result().outputs;
      for (size_t i = 0; c > 0 && i < mine.size(); ++i) {
        if (runners[c]->expects(mine[i].name) || mine[i].bytes == first[i].bytes) continue;
        result.mismatches.push_back(absl::StrCat(
            "client '", runners[c]->result().client, "' output '", mine[i].name, "' differs from client '",
            runners[0]->result().client, "''s (same program, same inputs)"));
      }
    }
    for (auto& r : runners) result.clients.push_back(std::move(r->result()));
  }
  for (auto& r : runners) r->Close();
  if (!failed.ok()) return failed;
  return result;
}

absl::StatusOr<ProgramFileResult> RunProgramFile(const ProgramFile& file, Island& island,
                                                 ProgramFileRunOptions options) {
  if (options.window == 0) options.window = island.options().runs_in_flight;
  return RunProgramFile(
      file,
      [&island](const std::string& name) -> absl::StatusOr<std::unique_ptr<client::Client>> {
        CAUSEWAY_ASSIGN_OR_RETURN(auto c, client::LocalClient::Connect(&island, name));
        return std::unique_ptr<client::Client>(std::move(c));
      },
      options);
}

}  // namespace causeway::cli
