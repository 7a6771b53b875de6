// Programs as data: ProgramDef (program_def.proto) to Program, and protobuf
// text format to ProgramDef. An island server builds what a client sent over
// the network; a user writes a program file.
//
// A def is untrusted input. Everything in it is checked, and bounded, before
// it is used: a malformed or hostile def gives an error that names the mesh,
// function, parameter or node at fault and says what was expected and what
// came, never a crash, an abort or an unbounded allocation.
#ifndef CAUSEWAY_SCHEDULER_PROGRAM_DEF_H_
#define CAUSEWAY_SCHEDULER_PROGRAM_DEF_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/channel.h"
#include "causeway/scheduler/dtype.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/mesh.h"
#include "causeway/scheduler/program.h"
#include "causeway/scheduler/program_def.pb.h"  // IWYU pragma: export
#include "google/protobuf/text_format.h"

namespace causeway {

// What a def may hold. Far above any program built by hand, low enough that
// what one def makes a server allocate and plan stays bounded.
inline constexpr int kMaxDefNodes = 4096;  // and parameters, and outputs
inline constexpr int kMaxDefFunctions = 1024;
inline constexpr int kMaxDefMeshes = 64;
inline constexpr size_t kMaxDefNameBytes = 256;  // every name; at least 1
inline constexpr int kMaxDefRank = 8;
// Elements of one shape (global for parameters, per device for functions):
// the built-in kernels count elements in 32 bits.
inline constexpr uint64_t kMaxDefElements = (uint64_t{1} << 32) - 1;
// Elements before a shape's last axis: a reshard may copy each such row as a
// region of its own, so this bounds what planning a transfer can allocate.
inline constexpr uint64_t kMaxDefRows = uint64_t{1} << 22;
inline constexpr int kMaxDefTensors = 64;  // inputs, outputs, scratch of a custom function; call arguments
inline constexpr int kMaxDefSteps = 256;   // kernels of a custom function; RepeatedAdd's count
// Vulkan's guaranteed minimum maxPushConstantsSize. (Groups and workgroup
// sizes are bounded by Function::Create, for every function.)
inline constexpr size_t kMaxDefPushConstantBytes = 128;
inline constexpr size_t kMaxProgramTextBytes = size_t{64} << 20;

// The function `def` describes: a built-in through Function's constructors,
// a custom one from built-in kernels by name or SPIR-V bytes (validated by
// spirv-tools) and Function::Create. Errors name the function, and the step:
//   "function 'fused' step 1: argument 5 is not one of its 4 buffers"
// A custom step is checked against its kernel by Function::Create, by the
// same rules as a function made in C++ (bindings and their sizes, no input
// bound where the kernel may write, push-constant size, groups,
// specialization constants, workgroup size), but what a kernel computes from
// its push constants' bytes (a count larger than its buffers) or its own
// code is not: only robust buffer access on the device keeps an untrusted
// kernel inside its buffers.
absl::StatusOr<std::shared_ptr<const Function>> FunctionFromDef(const FunctionDef& def);

// Builds the program `def` describes over `meshes`, which binds each of the
// def's MeshDef names to a mesh of the same dims (the loading client's). The
// def's functions are made once each and shared by the nodes that call them;
// ProgramBuilder then validates and lowers (its errors name the node).
// `channels` binds the channel ids of the def's send and receive nodes (a
// part of a program split over islands, causeway/scheduler/split.h) to the channels
// that carry them; an id it lacks is InvalidArgument naming the node.
// `host_budget`, if set, is charged for the program's transfer plans
// (ProgramBuilder::ChargeTo).
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(ProgramDef def, ParseProgramDefText(text, "program.txt"));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto mesh, client->AllocateMesh({2}));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto program, BuildProgram(def, {{"m", mesh}}));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto exe, client->Load(program));
absl::StatusOr<std::shared_ptr<const Program>> BuildProgram(
    const ProgramDef& def, const absl::flat_hash_map<std::string, std::shared_ptr<Mesh>>& meshes,
    const absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>>& channels = {},
    std::shared_ptr<HostBudget> host_budget = nullptr);

// Parses a ProgramDef in protobuf text format. InvalidArgument carrying the
// parser's errors, each as "<source_name>:<line>:<column>: <reason>" (1-based),
// e.g. "program.txt:12:5: Expected identifier, got: }". Checks only the
// syntax; BuildProgram checks the rest.
absl::StatusOr<ProgramDef> ParseProgramDefText(absl::string_view text, absl::string_view source_name);
// Parses `text` (protobuf text format) into `message`, with errors as
// "SOURCE:LINE:COL: reason" (an unknown field or enum value is placed at its
// name); `locations`, if not null, gets where each field was. Used for
// ProgramDef and for files that hold one (tools/program_file.h).
absl::Status ParseTextMessage(absl::string_view text, absl::string_view source_name,
                              google::protobuf::Message* message,
                              google::protobuf::TextFormat::ParseInfoTree* locations = nullptr);
// `def` in text format (repeated numbers as lists), as ParseProgramDefText
// reads it back.
std::string ProgramDefToText(const ProgramDef& def);

// Terse defs of the built-in functions (see Function's constructors).
FunctionDef ElementwiseDef(std::string name, std::string op, const Shape& shape);
FunctionDef ScaleDef(std::string name, const Shape& shape, float alpha);
FunctionDef MatmulDef(std::string name, uint32_t m, uint32_t n, uint32_t k);
FunctionDef RepeatedAddDef(std::string name, const Shape& shape, int count);

// A built function as data: a custom FunctionDef named `name` whose steps are
// the function's kernels, by name where a kernel is the built-in of that name
// (the same module), else as their SPIR-V. FunctionFromDef of the result
// makes a function of the same buffers and steps. InvalidArgument if the
// function exceeds what a def may hold (kMaxDefTensors, kMaxDefSteps).
absl::StatusOr<FunctionDef> ToDef(const Function& function, std::string name);

// Builds a ProgramDef in ProgramBuilder's vocabulary, for programs made in
// C++ that must also travel as data: to island servers (a controller splits
// them), or into a file. Functions are given built; each distinct one is
// written once (ToDef), under its own name, or with a suffix ".2", ".3", ...
// where different functions share a name. Names of meshes, values and nodes
// are checked when the def is built (BuildProgram, SplitByIsland), as for any
// def.
//
// Example:
//   ProgramDefBuilder b("double");
//   b.Mesh("m", {2});
//   b.Parameter("x", "m", {1024}, DType::kF32, Sharding::Split(0));
//   b.Call("double", scale, "m", {"x"}, {"y"});   // scale: a built Function
//   b.Output("y");
//   CAUSEWAY_ASSIGN_OR_RETURN(ProgramDef def, b.Build());
//   CAUSEWAY_ASSIGN_OR_RETURN(auto program, BuildProgram(def, {{"m", mesh}}));
class ProgramDefBuilder {
 public:
  explicit ProgramDefBuilder(std::string name) { def_.set_name(std::move(name)); }

  ProgramDefBuilder& Mesh(std::string name, const std::vector<int>& dims);
  ProgramDefBuilder& Parameter(std::string value, std::string mesh, const Shape& shape, DType dtype = DType::kF32,
                               const Sharding& sharding = Sharding::Replicated());
  ProgramDefBuilder& Call(std::string node, const std::shared_ptr<const Function>& function, std::string mesh,
                          const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                          const std::vector<Sharding>& output_shardings = {});
  ProgramDefBuilder& AllReduce(std::string node, std::string mesh, std::string input, std::string output,
                               CollectiveDef::ReduceOp op = CollectiveDef::SUM);
  // Any collective: `collective` gives its kind, mesh, input and output, and
  // what its kind takes (op, algorithm, root, pairs, mesh axis).
  ProgramDefBuilder& Collective(std::string node, CollectiveDef collective);
  ProgramDefBuilder& Reshard(std::string node, std::string mesh, std::string input, std::string output,
                             const Sharding& sharding);
  ProgramDefBuilder& Output(std::string value);

  // The def, or the first error met while adding to it (naming the node).
  absl::StatusOr<ProgramDef> Build() const;

 private:
  ProgramDef def_;
  absl::Status status_;
  // The name each function was written under, by identity; held, so that
  // no other function takes its address while the builder lives.
  absl::flat_hash_map<const Function*, std::pair<std::shared_ptr<const Function>, std::string>> functions_;
  absl::flat_hash_map<std::string, int> name_uses_;
};

// Conversions. FromDef refuses what the C++ type cannot hold (an enum value
// out of range, a negative axis, an array axis >= kMaxDefRank, a mesh axis
// other than 0 or 1); whether a sharding fits a shape and a mesh is checked
// where both are known.
ShardingDef ToDef(const Sharding& sharding);
absl::StatusOr<Sharding> FromDef(const ShardingDef& def);
DTypeDef ToDef(DType dtype);
absl::StatusOr<DType> FromDef(DTypeDef def);
TensorSpecDef ToDef(const TensorSpec& spec);
// A step of a custom function, its kernel by name where it is the built-in
// of that name (the same module), else as its SPIR-V. `step.kernel` must
// not be null. Nothing is checked: FunctionFromDef checks the function.
KernelStepDef ToDef(const KernelStep& step);

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_PROGRAM_DEF_H_
