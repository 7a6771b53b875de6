// Programs as data: a program built from a ProgramDef (made in C++, or parsed
// from a text file) runs bit for bit like the same program built with
// ProgramBuilder and matches a CPU reference; custom functions from SPIR-V
// bytes and built-in kernel names run; send and receive nodes bind to the
// channels given by id; text round-trips; malformed text and
// defs give errors that name the offender; random mutations of a serialized
// def never crash BuildProgram.
#include "causeway/scheduler/program_def.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/local_channel.h"
#include "causeway/shaders/builtin_shaders.h"
#include "gmock/gmock.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/testing/pipeline_program.h"
#include "tests/testing/program_defs.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::PipelineInCpp;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

constexpr absl::Duration kRunTimeout = absl::Seconds(60);
using MeshMap = absl::flat_hash_map<std::string, std::shared_ptr<Mesh>>;
using HostValues = std::map<std::string, std::vector<float>>;

std::string Bytes(const void* data, size_t size) { return std::string(static_cast<const char*>(data), size); }

std::string BuiltinSpirvBytes(const char* name) {
  std::optional<absl::Span<const uint32_t>> words = FindBuiltinShader(name);
  EXPECT_TRUE(words.has_value()) << name;
  if (!words.has_value()) return "";
  return Bytes(words->data(), words->size() * sizeof(uint32_t));
}

// --- the programs ----------------------------------------------------------------------
//
// "pipeline", over meshes a and b of 2 devices each:
//   s = x + y          on a, split by rows (each device 4 of the 8 rows)
//   t = 0.5 * s        on a
//   t_full = t         a reshard on a to replicated
//   u = t_full * w     on b: t_full crosses meshes (a transfer), w [16, 16]
//   u_split = u        a reshard on b to split by rows
//   v = all-reduce(u_split): u[0:4] + u[4:8], replicated on b
//   out = v + 3 v      repeated_add x3 on b
// Outputs out [4, 16] and t_full [8, 16].

using ::causeway::testing::AddAllReduce;
using ::causeway::testing::AddCall;
using ::causeway::testing::AddMesh;
using ::causeway::testing::AddParameter;
using ::causeway::testing::AddReshard;

ProgramDef PipelineDef() {
  ProgramDef def;
  def.set_name("pipeline");
  for (const char* name : {"a", "b"}) AddMesh(def, name, {2});
  *def.add_functions() = ElementwiseDef("add", "add", {4, 16});
  *def.add_functions() = ScaleDef("half", {4, 16}, 0.5f);
  *def.add_functions() = MatmulDef("mm", 8, 16, 16);
  *def.add_functions() = RepeatedAddDef("acc3", {4, 16}, 3);
  AddParameter(def, "x", "a", {8, 16}, Sharding::Split(0));
  AddParameter(def, "y", "a", {8, 16}, Sharding::Split(0));
  AddParameter(def, "w", "b", {16, 16}, Sharding::Replicated());
  AddCall(def, "sum", "add", "a", {"x", "y"}, {"s"});
  AddCall(def, "halve", "half", "a", {"s"}, {"t"});
  AddReshard(def, "gather", "a", "t", "t_full", Sharding::Replicated());
  AddCall(def, "matmul", "mm", "b", {"t_full", "w"}, {"u"});
  AddReshard(def, "split", "b", "u", "u_split", Sharding::Split(0));
  AddAllReduce(def, "allreduce", "b", "u_split", "v");
  AddCall(def, "accumulate", "acc3", "b", {"v", "v"}, {"out"});
  def.add_outputs("out");
  def.add_outputs("t_full");
  return def;
}

// The same program as a user would write it in a file.
constexpr char kPipelineText[] = R"text(
  # Two meshes of two devices; values cross from a to b.
  name: "pipeline"
  meshes { name: "a" dims: 2 }
  meshes { name: "b" dims: [2] }

  functions { name: "add" elementwise { op: "add" shape: [4, 16] } }
  functions { name: "half" scale { shape: [4, 16] alpha: 0.5 } }
  functions { name: "mm" matmul { m: 8 n: 16 k: 16 } }
  functions { name: "acc3" repeated_add { shape: [4, 16] count: 3 } }

  parameters { value: "x" mesh: "a" shape: [8, 16] sharding { split { array_axis: 0 } } }
  parameters { value: "y" mesh: "a" shape: [8, 16] sharding { split {} } }
  parameters { value: "w" mesh: "b" shape: [16, 16] }

  nodes { name: "sum" call { function: "add" mesh: "a" inputs: ["x", "y"] outputs: "s" } }
  nodes { name: "halve" call { function: "half" mesh: "a" inputs: "s" outputs: "t" } }
  nodes { name: "gather" reshard { mesh: "a" input: "t" output: "t_full" sharding {} } }
  nodes { name: "matmul" call { function: "mm" mesh: "b" inputs: ["t_full", "w"] outputs: "u" } }
  nodes {
    name: "split"
    reshard { mesh: "b" input: "u" output: "u_split" sharding { split { array_axis: 0 mesh_axis: 0 } } }
  }
  nodes { name: "allreduce" collective { kind: ALL_REDUCE mesh: "b" input: "u_split" output: "v" op: SUM } }
  nodes { name: "accumulate" call { function: "acc3" mesh: "b" inputs: ["v", "v"] outputs: "out" } }
  outputs: ["out", "t_full"]
)text";

HostValues PipelineInputs(uint32_t seed) {
  return {{"x", reference::RandomFloats(8 * 16, seed)},
          {"y", reference::RandomFloats(8 * 16, seed + 1)},
          {"w", reference::RandomFloats(16 * 16, seed + 2, -0.5f, 0.5f)}};
}

// The CPU reference of the pipeline, in the kernels' order of operations.
HostValues PipelineReference(const HostValues& in) {
  std::vector<float> t(8 * 16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = 0.5f * (in.at("x")[i] + in.at("y")[i]);
  std::vector<float> u = reference::Matmul(t, in.at("w"), 8, 16, 16);
  std::vector<float> out(4 * 16);
  for (size_t i = 0; i < out.size(); ++i) {
    const float v = u[i] + u[i + 4 * 16];
    out[i] = ((v + v) + v) + v;
  }
  return {{"out", out}, {"t_full", t}};
}

// "custom", on mesh a: p = a * b by a custom function of the built-in kernel
// "mul" named; out = a * b + a by a custom function of two steps, mul by name
// into scratch, then add from SPIR-V bytes with a workgroup size of 64.
ProgramDef CustomDef() {
  ProgramDef def;
  def.set_name("custom");
  AddMesh(def, "a", {2});
  CountParams count{256};
  const std::string push = Bytes(&count, sizeof(count));

  FunctionDef* by_name = def.add_functions();
  by_name->set_name("mul_by_name");
  FunctionDef::Custom* c = by_name->mutable_custom();
  for (int i = 0; i < 2; ++i) c->add_inputs()->add_shape(256);
  c->add_outputs()->add_shape(256);
  KernelStepDef* s = c->add_steps();
  s->set_builtin("mul");
  for (int a : {0, 1, 2}) s->add_args(a);
  s->set_push_constants(push);
  for (uint32_t g : {1, 1, 1}) s->add_groups(g);

  FunctionDef* fused = def.add_functions();
  fused->set_name("fused");
  c = fused->mutable_custom();
  for (int i = 0; i < 2; ++i) c->add_inputs()->add_shape(256);
  c->add_outputs()->add_shape(256);
  c->add_scratch()->add_shape(256);
  s = c->add_steps();
  s->set_builtin("mul");
  for (int a : {0, 1, 3}) s->add_args(a);  // scratch = a * b
  s->set_push_constants(push);
  s = c->add_steps();
  s->set_spirv(BuiltinSpirvBytes("add"));
  s->set_kernel_name("my_add");
  for (int a : {3, 0, 2}) s->add_args(a);  // out = scratch + a
  s->set_push_constants(push);
  for (uint32_t g : {2, 1, 1}) s->add_groups(g);
  KernelStepDef::SpecValue* spec = s->add_spec();
  spec->set_id(0);
  spec->set_value(64);

  AddParameter(def, "a", "a", {512}, Sharding::Split(0));
  AddParameter(def, "b", "a", {512}, Sharding::Split(0));
  AddCall(def, "product", "mul_by_name", "a", {"a", "b"}, {"p"});
  AddCall(def, "fma", "fused", "a", {"a", "b"}, {"out"});
  def.add_outputs("p");
  def.add_outputs("out");
  return def;
}

class ProgramDefTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_ = MakeRuntime(4);
    ASSERT_NE(runtime_, nullptr);
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(runtime_.get()));
    ASSERT_OK_AND_ASSIGN(client_, island_->Connect("defs"));
    ASSERT_OK_AND_ASSIGN(a_, client_->AllocateMesh({2}));
    ASSERT_OK_AND_ASSIGN(b_, client_->AllocateMesh({2}));
    meshes_ = {{"a", a_}, {"b", b_}};
  }
  void TearDown() override {
    if (client_ != nullptr) client_->Close();
    client_.reset();
    island_.reset();
    runtime_.reset();
  }

  // Runs `program` once on `inputs` (by parameter name); its outputs by name.
  absl::StatusOr<HostValues> Run(const std::shared_ptr<const Program>& program, const HostValues& inputs) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto exe, client_->Load(program));
    std::vector<ArrayRef> arrays;
    for (int id : program->parameters()) {
      const ProgramValue& v = program->values()[id];
      CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef array,
                                client_->CreateArray(v.mesh, v.shape, v.dtype, v.sharding, v.name));
      const std::vector<float>& host = inputs.at(v.name);
      if (host.size() != static_cast<size_t>(NumElements(v.shape))) {
        return absl::InternalError(absl::StrCat("test input '", v.name, "' has the wrong size"));
      }
      CAUSEWAY_RETURN_IF_ERROR(array->Upload(host.data(), host.size() * sizeof(float)));
      arrays.push_back(std::move(array));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(Execution run, client_->Execute(exe, arrays));
    CAUSEWAY_RETURN_IF_ERROR(run.Await(absl::Now() + kRunTimeout));
    HostValues out;
    for (size_t o = 0; o < program->outputs().size(); ++o) {
      const ProgramValue& v = program->values()[program->outputs()[o]];
      std::vector<float> host(NumElements(v.shape));
      CAUSEWAY_RETURN_IF_ERROR(run.outputs[o]->Download(host.data(), host.size() * sizeof(float)));
      out[v.name] = std::move(host);
    }
    return out;
  }

  // Runs `program` once on inputs of zeros.
  absl::Status RunZeros(const std::shared_ptr<const Program>& program) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto exe, client_->Load(program));
    std::vector<ArrayRef> arrays;
    for (int id : program->parameters()) {
      const ProgramValue& v = program->values()[id];
      CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef array,
                                client_->CreateArray(v.mesh, v.shape, v.dtype, v.sharding, v.name));
      std::vector<uint8_t> zeros(NumElements(v.shape) * DTypeSize(v.dtype));
      CAUSEWAY_RETURN_IF_ERROR(array->Upload(zeros.data(), zeros.size()));
      arrays.push_back(std::move(array));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(Execution run, client_->Execute(exe, arrays));
    return run.Await(absl::Now() + kRunTimeout);
  }

  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Island> island_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Mesh> a_, b_;
  MeshMap meshes_;
};

// The kinds and node names of a program's steps, in dispatch order.
std::vector<std::string> StepNames(const Program& program) {
  std::vector<std::string> out;
  for (const ProgramStep& s : program.steps())
    out.push_back(absl::StrCat(static_cast<int>(s.kind), ":", s.node));
  return out;
}

void ExpectBitIdentical(const HostValues& got, const HostValues& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, values] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    ASSERT_EQ(got.at(name).size(), values.size()) << name;
    EXPECT_EQ(std::memcmp(got.at(name).data(), values.data(), values.size() * sizeof(float)), 0) << name;
  }
}

void ExpectNear(const HostValues& got, const HostValues& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, values] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    EXPECT_LE(reference::MaxRelativeError(got.at(name), values), tolerance) << name;
  }
}

// Tests that the pipeline built from a ProgramDef lowers to the same steps
// (a transfer from a to b among them) and gives bit-identical results to the
// pipeline built with ProgramBuilder, both matching the CPU reference.
TEST_F(ProgramDefTest, DefMatchesBuilderAndCpu) {
  ASSERT_OK_AND_ASSIGN(auto from_def, BuildProgram(PipelineDef(), meshes_));
  ASSERT_OK_AND_ASSIGN(auto in_cpp, PipelineInCpp(a_, b_));
  EXPECT_EQ(StepNames(*from_def), StepNames(*in_cpp)) << from_def->DebugString();
  int transfers = 0, collectives = 0;
  for (const ProgramStep& s : from_def->steps()) {
    transfers +=
        s.kind == ProgramStep::kTransfer && s.mesh == b_ && s.node.find("@mesh") != std::string::npos;
    collectives += s.kind == ProgramStep::kCollective;
  }
  EXPECT_EQ(transfers, 1) << from_def->DebugString();  // t_full from a to b
  EXPECT_GE(collectives, 1) << from_def->DebugString();

  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE(seed);
    const HostValues inputs = PipelineInputs(seed * 10);
    ASSERT_OK_AND_ASSIGN(HostValues got_def, Run(from_def, inputs));
    ASSERT_OK_AND_ASSIGN(HostValues got_cpp, Run(in_cpp, inputs));
    ExpectBitIdentical(got_def, got_cpp);
    ExpectNear(got_def, PipelineReference(inputs), 1e-5);
  }
}

// Tests that custom functions from a built-in kernel's name and from SPIR-V
// bytes (with scratch, specialization and groups) run and equal the CPU.
// Tests that ProgramDefBuilder's reshard and collective nodes are the defs
// written by hand, and that they run: a split array gathered whole by a
// reshard, then broadcast from position 1 (which holds the same whole array)
// and all-gathered again from a split, equals the host's input.
TEST_F(ProgramDefTest, BuilderWritesReshardsAndCollectives) {
  ProgramDefBuilder b("moves");
  b.Mesh("a", {2});
  b.Parameter("x", "a", {64}, DType::kF32, Sharding::Split(0));
  b.Reshard("whole", "a", "x", "y", Sharding::Replicated());
  CollectiveDef broadcast;
  broadcast.set_kind(CollectiveDef::BROADCAST);
  broadcast.set_mesh("a");
  broadcast.set_input("y");
  broadcast.set_output("z");
  broadcast.set_root(1);
  b.Collective("from-1", broadcast);
  CollectiveDef gather;
  gather.set_kind(CollectiveDef::ALL_GATHER);
  gather.set_mesh("a");
  gather.set_input("x");
  gather.set_output("g");
  b.Collective("gather", gather);
  b.Output("z").Output("g");
  ASSERT_OK_AND_ASSIGN(ProgramDef def, b.Build());

  ProgramDef hand;
  hand.set_name("moves");
  AddMesh(hand, "a", {2});
  AddParameter(hand, "x", "a", {64}, Sharding::Split(0));
  AddReshard(hand, "whole", "a", "x", "y", Sharding::Replicated());
  NodeDef* n = hand.add_nodes();
  n->set_name("from-1");
  *n->mutable_collective() = broadcast;
  n = hand.add_nodes();
  n->set_name("gather");
  *n->mutable_collective() = gather;
  hand.add_outputs("z");
  hand.add_outputs("g");
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(def, hand)) << diff;

  const std::vector<float> x = reference::RandomFloats(64, 11);
  ASSERT_OK_AND_ASSIGN(auto program, BuildProgram(def, meshes_));
  ASSERT_OK_AND_ASSIGN(HostValues got, Run(program, {{"x", x}}));
  EXPECT_EQ(got["z"], x);
  EXPECT_EQ(got["g"], x);
}

TEST_F(ProgramDefTest, CustomFunctionsFromSpirvAndBuiltinNames) {
  const ProgramDef def = CustomDef();
  ASSERT_OK_AND_ASSIGN(auto fused, FunctionFromDef(def.functions(1)));
  ASSERT_EQ(fused->steps().size(), 2u);
  ASSERT_OK_AND_ASSIGN(auto mul, BuiltinKernel("mul"));
  EXPECT_EQ(fused->steps()[0].kernel, mul);  // the shared built-in
  EXPECT_EQ(fused->steps()[1].kernel->name(), "my_add");
  EXPECT_EQ(fused->steps()[1].groups, (std::array<uint32_t, 3>{2, 1, 1}));
  EXPECT_EQ(fused->steps()[1].spec, (SpecValues{{0, 64}}));
  EXPECT_EQ(fused->scratch().size(), 1u);

  ASSERT_OK_AND_ASSIGN(auto program, BuildProgram(def, meshes_));
  const HostValues inputs = {{"a", reference::RandomFloats(512, 3)}, {"b", reference::RandomFloats(512, 4)}};
  ASSERT_OK_AND_ASSIGN(HostValues got, Run(program, inputs));
  HostValues want = {{"p", std::vector<float>(512)}, {"out", std::vector<float>(512)}};
  for (int i = 0; i < 512; ++i) {
    const float p = inputs.at("a")[i] * inputs.at("b")[i];
    want["p"][i] = p;
    want["out"][i] = p + inputs.at("a")[i];
  }
  ExpectBitIdentical(got, want);  // one rounding per kernel, as on the CPU
}

// Tests that a built function written as data (ToDef) builds the same
// function again, built-in kernels by name and others as their SPIR-V; that
// ProgramDefBuilder writes a program that runs bit for bit like the def
// written by hand, each function once and under a name of its own; and that
// what a def cannot hold is refused naming the node.
TEST_F(ProgramDefTest, BuiltFunctionsAndProgramsAsData) {
  const ProgramDef hand = CustomDef();
  ASSERT_OK_AND_ASSIGN(auto by_name, FunctionFromDef(hand.functions(0)));
  ASSERT_OK_AND_ASSIGN(auto fused, FunctionFromDef(hand.functions(1)));
  ASSERT_OK_AND_ASSIGN(FunctionDef written, ToDef(*fused, "fused"));
  ASSERT_EQ(written.custom().steps_size(), 2);
  EXPECT_EQ(written.custom().steps(0).builtin(), "mul");
  EXPECT_EQ(written.custom().steps(1).kernel_name(), "my_add");
  EXPECT_EQ(written.custom().steps(1).spirv(), BuiltinSpirvBytes("add"));
  ASSERT_OK_AND_ASSIGN(auto again, FunctionFromDef(written));
  EXPECT_EQ(again->inputs(), fused->inputs());
  EXPECT_EQ(again->outputs(), fused->outputs());
  EXPECT_EQ(again->scratch(), fused->scratch());
  ASSERT_EQ(again->steps().size(), fused->steps().size());
  for (size_t i = 0; i < fused->steps().size(); ++i) {
    const KernelStep &want = fused->steps()[i], &got = again->steps()[i];
    EXPECT_EQ(got.kernel->sha256(), want.kernel->sha256()) << "step " << i;
    EXPECT_EQ(got.kernel->name(), want.kernel->name()) << "step " << i;
    EXPECT_EQ(got.args, want.args) << "step " << i;
    EXPECT_EQ(got.push_constants, want.push_constants) << "step " << i;
    EXPECT_EQ(got.groups, want.groups) << "step " << i;
    EXPECT_EQ(got.spec, want.spec) << "step " << i;
  }

  ASSERT_OK_AND_ASSIGN(auto fused_twin, FunctionFromDef(hand.functions(1)));  // another function, same name
  ProgramDefBuilder b("custom");
  b.Mesh("a", {2});
  b.Parameter("a", "a", {512}, DType::kF32, Sharding::Split(0));
  b.Parameter("b", "a", {512}, DType::kF32, Sharding::Split(0));
  b.Call("product", by_name, "a", {"a", "b"}, {"p"});
  b.Call("fma", fused, "a", {"a", "b"}, {"out"});
  b.Call("fma.again", fused, "a", {"a", "b"}, {"out2"});
  b.Call("fma.twin", fused_twin, "a", {"a", "b"}, {"out3"});
  b.Output("p").Output("out").Output("out2").Output("out3");
  ASSERT_OK_AND_ASSIGN(ProgramDef def, b.Build());
  ASSERT_EQ(def.functions_size(), 3);
  EXPECT_EQ(def.functions(1).name(), "fused");
  EXPECT_EQ(def.functions(2).name(), "fused.2");
  EXPECT_EQ(def.nodes(2).call().function(), "fused");
  EXPECT_EQ(def.nodes(3).call().function(), "fused.2");

  const HostValues inputs = {{"a", reference::RandomFloats(512, 5)}, {"b", reference::RandomFloats(512, 6)}};
  ASSERT_OK_AND_ASSIGN(auto from_builder, BuildProgram(def, meshes_));
  ASSERT_OK_AND_ASSIGN(auto from_hand, BuildProgram(hand, meshes_));
  ASSERT_OK_AND_ASSIGN(HostValues got, Run(from_builder, inputs));
  ASSERT_OK_AND_ASSIGN(HostValues want, Run(from_hand, inputs));
  want["out2"] = want["out"];
  want["out3"] = want["out"];
  ExpectBitIdentical(got, want);

  ProgramDefBuilder none("none");
  none.Call("nothing", nullptr, "a", {}, {"x"}).Output("x");
  EXPECT_ERROR(none.Build(), absl::StatusCode::kInvalidArgument, "node 'nothing' calls no function");
  std::vector<TensorSpec> wide(kMaxDefTensors + 1, TensorSpec{{256}, DType::kF32});
  std::vector<KernelStep> steps = fused->steps();
  steps.resize(1);
  ASSERT_OK_AND_ASSIGN(auto too_wide, Function::Create("too_wide", wide, {TensorSpec{{256}, DType::kF32}}, {},
                                                       {KernelStep{steps[0].kernel, {0, 1, kMaxDefTensors + 1},
                                                                   steps[0].push_constants}}));
  ProgramDefBuilder wide_program("wide");
  wide_program.Call("wide_call", too_wide, "a", {}, {"x"});
  EXPECT_ERROR(wide_program.Build(), absl::StatusCode::kInvalidArgument,
               "node 'wide_call': function 'too_wide' has 65 inputs; a def holds at most 64");
}

// Tests that the pipeline written as text parses to the def made in C++,
// builds and runs to the same bits, and that ProgramDefToText round-trips
// (SPIR-V bytes included).
TEST_F(ProgramDefTest, TextParsesRunsAndRoundTrips) {
  ASSERT_OK_AND_ASSIGN(ProgramDef parsed, ParseProgramDefText(kPipelineText, "pipeline.txt"));
  std::string diff;
  MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(parsed, PipelineDef())) << diff;

  ASSERT_OK_AND_ASSIGN(auto from_text, BuildProgram(parsed, meshes_));
  ASSERT_OK_AND_ASSIGN(auto from_def, BuildProgram(PipelineDef(), meshes_));
  const HostValues inputs = PipelineInputs(77);
  ASSERT_OK_AND_ASSIGN(HostValues got_text, Run(from_text, inputs));
  ASSERT_OK_AND_ASSIGN(HostValues got_def, Run(from_def, inputs));
  ExpectBitIdentical(got_text, got_def);
  ExpectNear(got_text, PipelineReference(inputs), 1e-5);

  for (const ProgramDef& def : {PipelineDef(), CustomDef()}) {
    SCOPED_TRACE(def.name());
    const std::string text = ProgramDefToText(def);
    ASSERT_OK_AND_ASSIGN(ProgramDef back, ParseProgramDefText(text, "roundtrip.txt"));
    diff.clear();
    EXPECT_TRUE(differ.Compare(back, def)) << diff << "\n" << text;
  }
  EXPECT_THAT(ProgramDefToText(PipelineDef()), HasSubstr("shape: [8, 16]"));
}

// Tests that a collective's algorithm is read from the def by name into its
// plan (AUTO from ring_threshold_bytes: direct-read for an all-reduce on
// devices that share memory, as these do), and that DIRECT_READ of a
// collective that only copies is refused naming the node.
TEST_F(ProgramDefTest, CollectiveAlgorithmsByName) {
  auto text = [](const char* kind, const char* algorithm) {
    return absl::StrCat(R"text(
      name: "algorithms"
      meshes { name: "a" dims: 2 }
      parameters { value: "x" mesh: "a" shape: [4096] sharding { split {} } }
      nodes { name: "c" collective { kind: )text",
                        kind, " mesh: \"a\" input: \"x\" output: \"y\" algorithm: ", algorithm,
                        R"text( ring_threshold_bytes: 1024 } }
      outputs: "y"
    )text");
  };
  const std::pair<const char*, CollectiveAlgorithm> cases[] = {
      {"DIRECT", CollectiveAlgorithm::kDirect},
      {"RING", CollectiveAlgorithm::kRing},
      {"DIRECT_READ", CollectiveAlgorithm::kDirectRead},
      {"AUTO", CollectiveAlgorithm::kDirectRead},
  };
  for (const auto& [name, want] : cases) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(ProgramDef def, ParseProgramDefText(text("ALL_REDUCE", name), "algorithms.txt"));
    ASSERT_OK_AND_ASSIGN(auto program, BuildProgram(def, meshes_));
    ASSERT_FALSE(program->steps().empty());
    ASSERT_NE(program->steps()[0].collective, nullptr) << program->DebugString();
    EXPECT_EQ(program->steps()[0].collective->algorithm, want) << program->steps()[0].collective->ToString();
  }
  ASSERT_OK_AND_ASSIGN(ProgramDef gather, ParseProgramDefText(text("ALL_GATHER", "DIRECT_READ"), "gather.txt"));
  EXPECT_ERROR(BuildProgram(gather, meshes_).status(), absl::StatusCode::kInvalidArgument, "'c'", "direct-read");
}

// One end of each kind: y arrives over channel 9 split by rows, z = 2 y
// leaves over channel 7 and is the output too.
constexpr char kEndsText[] = R"text(
  name: "ends"
  meshes { name: "a" dims: 2 }
  functions { name: "double" scale { shape: [8] alpha: 2 } }
  nodes { name: "recv" receive { mesh: "a" output: "y" shape: [16] sharding { split {} } channel: 9 } }
  nodes { name: "double" call { function: "double" mesh: "a" inputs: "y" outputs: "z" } }
  nodes { name: "send" send { input: "z" channel: 7 } }
  outputs: "z"
)text";

// Tests that send and receive nodes of a def bind to the channels given by
// id and run: bytes delivered into channel 9 for a run's tag come out of
// channel 7 doubled (CPU reference), and as the output; the text round-trips.
TEST_F(ProgramDefTest, SendAndReceiveNodesUseTheGivenChannels) {
  ASSERT_OK_AND_ASSIGN(ProgramDef def, ParseProgramDefText(kEndsText, "ends.txt"));
  ASSERT_OK_AND_ASSIGN(ProgramDef back, ParseProgramDefText(ProgramDefToText(def), "back.txt"));
  EXPECT_TRUE(MessageDifferencer::Equals(back, def)) << ProgramDefToText(def);
  auto in = LocalChannel::Create("channel 9 from island 'x'");
  auto out = LocalChannel::Create("channel 7 to island 'y'");
  ASSERT_OK_AND_ASSIGN(auto program, BuildProgram(def, meshes_, {{9, in}, {7, out}, {8, nullptr}}));
  ASSERT_EQ(program->steps().size(), 3u) << program->DebugString();
  EXPECT_EQ(program->steps()[0].kind, ProgramStep::kReceive);
  EXPECT_EQ(program->steps()[0].channel, in);
  EXPECT_EQ(program->steps()[0].mesh, a_);
  EXPECT_EQ(program->steps()[2].kind, ProgramStep::kSend);
  EXPECT_EQ(program->steps()[2].channel, out);
  const ProgramValue& y = program->values()[program->FindValue("y")];
  EXPECT_EQ(y.shape, (Shape{16}));
  EXPECT_EQ(y.sharding, Sharding::Split(0));

  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  const std::vector<float> host = reference::RandomFloats(16, 5);
  ASSERT_OK_AND_ASSIGN(auto staging, runtime_->accelerator(0)->CreateStagingBuffer(16 * sizeof(float)));
  Future<> sent = out->inbox().Expect(42, 16 * sizeof(float), {{0, staging}});
  ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {}, {.tag = 42}));
  ASSERT_OK(in->inbox().Deliver(42, 0, 16 * sizeof(float), host.data(), 16 * sizeof(float)));
  ASSERT_OK(run.Await(absl::Now() + kRunTimeout));
  ASSERT_OK(sent.AwaitStatus(absl::Now() + kRunTimeout));
  std::vector<float> got(16), output(16);
  std::memcpy(got.data(), staging->mapped(), got.size() * sizeof(float));
  ASSERT_OK(run.outputs[0]->Download(output.data(), output.size() * sizeof(float)));
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(got[i], 2.0f * host[i]) << i;
    EXPECT_EQ(output[i], 2.0f * host[i]) << i;
  }
}

// Tests that send and receive nodes are checked like the others: a channel
// id not given (or given as null), a receive of rank 0, of a bad dtype, of a
// layout a channel cannot carry, on an unknown mesh, with no output, and a
// send of nothing are refused with InvalidArgument naming the node.
TEST_F(ProgramDefTest, InvalidSendAndReceiveNodesNameTheNode) {
  ASSERT_OK_AND_ASSIGN(const ProgramDef base, ParseProgramDefText(kEndsText, "ends.txt"));
  auto channel = LocalChannel::Create("c");
  const absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels = {{9, channel}, {7, channel}};
  auto recv = [](ProgramDef& d) { return d.mutable_nodes(0)->mutable_receive(); };
  auto send = [](ProgramDef& d) { return d.mutable_nodes(2)->mutable_send(); };
  struct Case {
    std::string what;
    std::function<void(ProgramDef&)> mutate;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"unknown receive channel",
       [&](ProgramDef& d) { recv(d)->set_channel(3); },
       {"node 'recv': channel 3 is not one of the channels", "given: 7, 9"}},
      {"unknown send channel",
       [&](ProgramDef& d) { send(d)->set_channel(12345678901234ull); },
       {"node 'send': channel 12345678901234"}},
      {"rank 0", [&](ProgramDef& d) { recv(d)->clear_shape(); }, {"node 'recv'", "rank 0"}},
      {"negative dim",
       [&](ProgramDef& d) { recv(d)->set_shape(0, -4); },
       {"node 'recv'", "dimension 0 = -4"}},
      {"dtype",
       [&](ProgramDef& d) { recv(d)->set_dtype(static_cast<DTypeDef>(5)); },
       {"node 'recv'", "dtype 5"}},
      {"layout",
       [&](ProgramDef& d) {
         recv(d)->add_shape(2);
         recv(d)->mutable_sharding()->mutable_split()->set_array_axis(1);
       },
       {"node 'recv'", "replicated or split along array axis 0"}},
      {"unknown mesh",
       [&](ProgramDef& d) { recv(d)->set_mesh("nowhere"); },
       {"node 'recv'", "unknown mesh 'nowhere'"}},
      {"no output",
       [&](ProgramDef& d) { recv(d)->clear_output(); },
       {"node 'recv'", "no output value named"}},
      {"no input", [&](ProgramDef& d) { send(d)->clear_input(); }, {"node 'send'", "no input value named"}},
      {"unknown input", [&](ProgramDef& d) { send(d)->set_input("ghost"); }, {"node 'send' reads 'ghost'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ProgramDef def = base;
    c.mutate(def);
    EXPECT_ERROR(BuildProgram(def, meshes_, channels).status(), absl::StatusCode::kInvalidArgument, c.want);
  }
  // Without channels, or with the id bound to null.
  EXPECT_ERROR(BuildProgram(base, meshes_).status(), absl::StatusCode::kInvalidArgument,
               "node 'recv': channel 9 is not one of the channels", "given: none");
  EXPECT_ERROR(BuildProgram(base, meshes_, {{9, nullptr}, {7, channel}}).status(),
               absl::StatusCode::kInvalidArgument, "node 'recv': channel 9", "given: 7)");
  EXPECT_OK(BuildProgram(base, meshes_, channels).status());
}

// Tests that malformed text is refused with the source name, the 1-based line
// and column, and the parser's reason.
TEST(ProgramDefTextTest, MalformedTextNamesLineAndReason) {
  struct Case {
    std::string text;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"name: \"p\"\nmeshes { name: \"a\" dims: 2 }\nnodes {\n  name: \"n\"\n}\n}\n",
       "program.txt:6:1: Expected identifier, got: }"},
      {"name: \"p\"\n\nmeshs { name: \"a\" }\n",
       "program.txt:3:1: Message type \"causeway.ProgramDef\" has no field named \"meshs\""},
      {"name: \"p\"\nparameters {\n  value: \"x\"\n  dtype: F64\n}\n",
       "program.txt:4:10: Unknown enumeration value of \"F64\" for field \"dtype\""},
      {"name: \"p\"\nmeshes { name: \"a\" dims: \"two\" }\n", "program.txt:2:26: Expected integer"},
      {"name: \"p\"\nnodes { name: \"n\" call { function: \"f\" }\n",
       "program.txt:3:1: Expected identifier, got: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    auto def = ParseProgramDefText(c.text, "program.txt");
    EXPECT_ERROR(def.status(), absl::StatusCode::kInvalidArgument, c.want);
  }
  EXPECT_ERROR(ParseProgramDefText("meshs {}", "p.txt").status(), absl::StatusCode::kInvalidArgument,
               "p.txt:1:1: ", "no field named \"meshs\"");
  EXPECT_ERROR(ParseProgramDefText("parameters { dtype: F64 }", "p.txt").status(),
               absl::StatusCode::kInvalidArgument, "p.txt:1:21: ", "F64");
}

// Tests that a def whose custom kernel uses PhysicalStorageBuffer pointers
// (an address from the push constants) is refused, naming the capability.
TEST(ProgramDefAdmissionTest, PointerKernelInADefIsRefused) {
  absl::StatusOr<std::vector<uint32_t>> words = CompileGlsl("peek", testing::kPointerKernelGlsl);
  ASSERT_OK(words.status());
  FunctionDef def;
  def.set_name("peek");
  FunctionDef::Custom* c = def.mutable_custom();
  c->add_outputs()->add_shape(4);
  KernelStepDef* step = c->add_steps();
  step->set_spirv(
      std::string(reinterpret_cast<const char*>(words->data()), words->size() * sizeof(uint32_t)));
  step->add_args(0);
  step->set_push_constants(std::string(8, '\0'));
  EXPECT_ERROR(FunctionFromDef(def).status(), absl::StatusCode::kInvalidArgument, "function 'peek' step 0",
               "PhysicalStorageBufferAddresses");
}

// Tests that defs naming what does not exist, disagreeing with their meshes,
// or out of bounds are refused with InvalidArgument naming the offender.
TEST_F(ProgramDefTest, InvalidDefsNameTheOffender) {
  struct Case {
    std::string what;
    std::function<void(ProgramDef&)> mutate;
    std::vector<std::string> want;
  };
  auto fused_step = [](ProgramDef& d, int s) {
    return d.mutable_functions(1)->mutable_custom()->mutable_steps(s);
  };
  const std::vector<Case> cases = {
      {"unknown mesh",
       [](ProgramDef& d) { d.mutable_parameters(0)->set_mesh("c"); },
       {"parameter 'x'", "unknown mesh 'c'"}},
      {"unbound mesh", [](ProgramDef& d) { AddMesh(d, "c", {2}); }, {"mesh 'c' is not bound", "'a', 'b'"}},
      {"mesh dims",
       [](ProgramDef& d) { d.mutable_meshes(1)->set_dims(0, 4); },
       {"mesh 'b' has dims [4]", "dims [2]"}},
      {"mesh island",
       [](ProgramDef& d) { d.mutable_meshes(0)->set_island("elsewhere"); },
       {"mesh 'a' is on island 'elsewhere'", "'local'"}},
      {"unknown function",
       [](ProgramDef& d) { d.mutable_nodes(3)->mutable_call()->set_function("nope"); },
       {"node 'matmul'", "unknown function 'nope'"}},
      {"duplicate function",
       [](ProgramDef& d) { *d.add_functions() = ScaleDef("half", {4}, 1.0f); },
       {"function 'half' is defined twice"}},
      {"unknown value",
       [](ProgramDef& d) { d.mutable_nodes(0)->mutable_call()->set_inputs(1, "ghost"); },
       {"node 'sum'", "'ghost'"}},
      {"unknown output", [](ProgramDef& d) { d.add_outputs("nothing"); }, {"'nothing'"}},
      {"no node name", [](ProgramDef& d) { d.mutable_nodes(2)->clear_name(); }, {"node 2 has no name"}},
      {"long name",
       [](ProgramDef& d) { d.mutable_nodes(2)->set_name(std::string(300, 'n')); },
       {"node 2 has a name of 300 bytes"}},
      {"no node kind", [](ProgramDef& d) { d.mutable_nodes(4)->clear_kind(); }, {"node 'split': no kind"}},
      {"huge shape",
       [](ProgramDef& d) { d.mutable_parameters(2)->set_shape(0, int64_t{1} << 40); },
       {"parameter 'w'", "more than 4294967295 elements"}},
      {"overflowing shape",
       [](ProgramDef& d) {
         for (int i = 0; i < 4; ++i) d.mutable_parameters(2)->add_shape(int64_t{1} << 31);
       },
       {"parameter 'w'", "more than 4294967295 elements"}},
      {"too many rows",
       [](ProgramDef& d) { d.mutable_parameters(2)->set_shape(0, int64_t{1} << 23); },
       {"parameter 'w'", "rows"}},
      {"negative dim",
       [](ProgramDef& d) { d.mutable_parameters(0)->set_shape(1, -16); },
       {"parameter 'x'", "dimension 1 = -16"}},
      {"rank",
       [](ProgramDef& d) {
         for (int i = 0; i < 8; ++i) d.mutable_parameters(0)->add_shape(1);
       },
       {"parameter 'x'", "rank 10"}},
      {"function shape",
       [](ProgramDef& d) { d.mutable_functions(0)->mutable_elementwise()->set_shape(0, 0); },
       {"function 'add'", "dimension 0 = 0"}},
      {"matmul size",
       [](ProgramDef& d) { d.mutable_functions(2)->mutable_matmul()->set_m(0); },
       {"function 'mm'", "m=0"}},
      {"matmul too large",
       [](ProgramDef& d) { d.mutable_functions(2)->mutable_matmul()->set_k(4000000000u); },
       {"function 'mm' input a", "elements"}},
      {"repeated_add count",
       [](ProgramDef& d) { d.mutable_functions(3)->mutable_repeated_add()->set_count(100000); },
       {"function 'acc3'", "count 100000"}},
      {"scale alpha",
       [](ProgramDef& d) { d.mutable_functions(1)->mutable_scale()->clear_alpha(); },
       {"function 'half'", "no alpha"}},
      {"elementwise op",
       [](ProgramDef& d) { d.mutable_functions(0)->mutable_elementwise()->set_op("frobnicate"); },
       {"function 'add'", "frobnicate"}},
      {"too many nodes",
       [](ProgramDef& d) {
         while (d.nodes_size() <= kMaxDefNodes) *d.add_nodes() = d.nodes(0);
       },
       {"program 'pipeline' has 4097 nodes; at most 4096"}},
      {"duplicate node", [](ProgramDef& d) { d.mutable_nodes(1)->set_name("sum"); }, {"node 'sum'", "twice"}},
      {"bad dtype",
       [](ProgramDef& d) { d.mutable_parameters(1)->set_dtype(static_cast<DTypeDef>(7)); },
       {"parameter 'y'", "dtype 7"}},
      {"bad sharding axis",
       [](ProgramDef& d) {
         d.mutable_parameters(0)->mutable_sharding()->mutable_split()->set_array_axis(-3);
       },
       {"parameter 'x'", "array axis -3"}},
      {"sharding that does not fit",
       [](ProgramDef& d) { d.mutable_parameters(0)->mutable_sharding()->mutable_split()->set_mesh_axis(1); },
       {"parameter 'x'", "has no axis 1"}},
      {"collective kind unset",
       [](ProgramDef& d) { d.mutable_nodes(5)->mutable_collective()->clear_kind(); },
       {"node 'allreduce'", "collective kind 0"}},
      {"collective kind",
       [](ProgramDef& d) {
         d.mutable_nodes(5)->mutable_collective()->set_kind(static_cast<CollectiveDef::Kind>(42));
       },
       {"node 'allreduce'", "collective kind 42"}},
      {"reduce op",
       [](ProgramDef& d) {
         d.mutable_nodes(5)->mutable_collective()->set_op(static_cast<CollectiveDef::ReduceOp>(9));
       },
       {"node 'allreduce'", "reduce op 9"}},
      {"algorithm",
       [](ProgramDef& d) {
         d.mutable_nodes(5)->mutable_collective()->set_algorithm(static_cast<CollectiveDef::Algorithm>(-1));
       },
       {"node 'allreduce'", "algorithm -1"}},
      {"collective mesh axis",
       [](ProgramDef& d) { d.mutable_nodes(5)->mutable_collective()->set_mesh_axis(1); },
       {"node 'allreduce'", "mesh axis 1"}},
      {"broadcast root",
       [](ProgramDef& d) {
         d.mutable_nodes(5)->mutable_collective()->set_kind(CollectiveDef::BROADCAST);
         d.mutable_nodes(5)->mutable_collective()->set_root(5);
       },
       {"node 'allreduce'", "5"}},
      {"output shardings",
       [](ProgramDef& d) {
         d.mutable_nodes(0)->mutable_call()->add_output_shardings();
         d.mutable_nodes(0)->mutable_call()->add_output_shardings();
       },
       {"node 'sum'", "2 output shardings for 1 outputs"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ProgramDef def = PipelineDef();
    c.mutate(def);
    auto program = BuildProgram(def, meshes_);
    EXPECT_FALSE(program.ok());
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument) << program.status();
    for (const std::string& part : c.want)
      EXPECT_THAT(std::string(program.status().message()), HasSubstr(part));
  }

  // The custom functions' steps.
  const std::vector<Case> custom_cases = {
      {"arg out of range",
       [&](ProgramDef& d) { fused_step(d, 0)->set_args(2, 7); },
       {"function 'fused' step 0: argument 7 is not one of its 4 buffers"}},
      {"negative arg",
       [&](ProgramDef& d) { fused_step(d, 1)->set_args(0, -1); },
       {"function 'fused' step 1: argument -1"}},
      {"arg count",
       [&](ProgramDef& d) { fused_step(d, 0)->add_args(0); },
       {"function 'fused' step 0: kernel 'mul' has 3 bindings, given 4 args"}},
      {"writes an input",
       [&](ProgramDef& d) { fused_step(d, 0)->set_args(2, 0); },
       {"function 'fused' step 0", "may write binding 2, given input 0"}},
      {"invalid SPIR-V",
       [&](ProgramDef& d) { fused_step(d, 1)->set_spirv("certainly not SPIR-V"); },
       {"function 'fused' step 1", "my_add", "not SPIR-V"}},
      {"truncated SPIR-V",
       [&](ProgramDef& d) { fused_step(d, 1)->mutable_spirv()->resize(1001); },
       {"function 'fused' step 1", "not a whole number of words"}},
      {"corrupt SPIR-V",
       [&](ProgramDef& d) {
         std::string* spirv = fused_step(d, 1)->mutable_spirv();
         for (size_t i = 40; i < spirv->size(); i += 4) (*spirv)[i] = static_cast<char>(0xff);
       },
       {"function 'fused' step 1", "my_add"}},
      {"no kernel",
       [&](ProgramDef& d) { fused_step(d, 1)->clear_kernel(); },
       {"function 'fused' step 1: no kernel"}},
      {"unknown builtin",
       [&](ProgramDef& d) { fused_step(d, 0)->set_builtin("frobnicate"); },
       {"function 'fused' step 0", "frobnicate"}},
      {"push constants too long",
       [&](ProgramDef& d) { fused_step(d, 0)->set_push_constants(std::string(200, 'x')); },
       {"function 'fused' step 0: 200 bytes of push constants; at most 128"}},
      {"push constants size",
       [&](ProgramDef& d) { fused_step(d, 0)->set_push_constants("12345678"); },
       {"function 'fused' step 0: kernel 'mul' takes 4 bytes of push constants, given 8"}},
      {"zero groups",
       [&](ProgramDef& d) { fused_step(d, 1)->set_groups(1, 0); },
       {"function 'fused' step 1: groups [2, 0, 1]"}},
      {"two groups",
       [&](ProgramDef& d) { fused_step(d, 1)->mutable_groups()->RemoveLast(); },
       {"function 'fused' step 1: groups [2, 1]"}},
      {"too many groups",
       [&](ProgramDef& d) { fused_step(d, 1)->set_groups(0, 70000); },
       {"function 'fused' step 1: groups [70000, 1, 1]"}},
      {"undeclared spec",
       [&](ProgramDef& d) { fused_step(d, 1)->mutable_spec(0)->set_id(9); },
       {"function 'fused' step 1", "has no specialization constant 9"}},
      {"spec twice",
       [&](ProgramDef& d) { *fused_step(d, 1)->add_spec() = fused_step(d, 1)->spec(0); },
       {"function 'fused' step 1: specialization constant 0 is given twice"}},
      {"workgroup too large",
       [&](ProgramDef& d) { fused_step(d, 1)->mutable_spec(0)->set_value(1 << 20); },
       {"function 'fused' step 1", "workgroup size 1048576x1x1"}},
      {"tensor dtype",
       [](ProgramDef& d) {
         d.mutable_functions(1)->mutable_custom()->mutable_scratch(0)->set_dtype(static_cast<DTypeDef>(3));
       },
       {"function 'fused' scratch buffer 0", "dtype 3"}},
      {"no outputs",
       [](ProgramDef& d) { d.mutable_functions(1)->mutable_custom()->clear_outputs(); },
       {"function 'fused' has no outputs"}},
      {"no function kind",
       [](ProgramDef& d) { d.mutable_functions(1)->clear_kind(); },
       {"function 'fused': no kind"}},
  };
  for (const Case& c : custom_cases) {
    SCOPED_TRACE(c.what);
    ProgramDef def = CustomDef();
    c.mutate(def);
    auto program = BuildProgram(def, meshes_);
    EXPECT_FALSE(program.ok());
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument) << program.status();
    for (const std::string& part : c.want)
      EXPECT_THAT(std::string(program.status().message()), HasSubstr(part));
  }

  // Both defs as they are build.
  EXPECT_OK(BuildProgram(PipelineDef(), meshes_).status());
  EXPECT_OK(BuildProgram(CustomDef(), meshes_).status());
}

// Tests that 2000 random mutations (fixed seed) of serialized defs, parsed
// with ParseFromString, are built or refused by BuildProgram without a crash,
// every refusal an InvalidArgument (or Unimplemented) with a message, and
// that what builds from built-in functions also loads and runs; and that the
// mutations reach every outcome.
TEST_F(ProgramDefTest, MutatedBytesNeverCrash) {
  std::mt19937 rng(20240611);
  const std::vector<std::pair<std::string, int>> bases = {{PipelineDef().SerializeAsString(), 1500},
                                                          {CustomDef().SerializeAsString(), 500}};
  int unparsed = 0, built = 0, refused = 0, ran = 0;
  // Mutants that parse back to their base def (a byte set to the value it
  // had, or a change the parse does not see), found by comparing messages:
  // each must build as its base does, whatever the other counts are.
  int same_as_base = 0, same_built = 0;
  google::protobuf::LogSilencer quiet;  // protobuf logs each string that is not UTF-8
  for (const auto& [base, iterations] : bases) {
    for (int it = 0; it < iterations; ++it) {
      std::string bytes = base;
      // Mostly changed in place (a byte inserted or dropped inside a nested
      // message breaks its length, and the parse), and mostly to ASCII (proto3
      // refuses strings that are not UTF-8): so that most mutants reach
      // BuildProgram.
      const int mutations = 1 + static_cast<int>(rng() % 2);
      for (int m = 0; m < mutations && !bytes.empty(); ++m) {
        const size_t at = rng() % bytes.size();
        switch (rng() % 10) {
          case 0:
          case 1:
          case 2:
            bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 7)));
            break;
          case 3:
          case 4:
          case 5:
            bytes[at] = static_cast<char>(rng() % 128);
            break;
          case 6:
            bytes[at] = static_cast<char>(rng() % 256);
            break;
          case 7:
            bytes.insert(bytes.begin() + at, static_cast<char>(rng() % 256));
            break;
          case 8:
            bytes.erase(at, 1 + rng() % 8);
            break;
          case 9: {  // a slice repeated: fields given twice, varints stretched
            const size_t len = 1 + rng() % 16;
            bytes.insert(at, bytes.substr(at, len));
            break;
          }
        }
      }
      ProgramDef def;
      if (!def.ParseFromString(bytes)) {
        ++unparsed;
        continue;
      }
      ProgramDef base_def;
      ASSERT_TRUE(base_def.ParseFromString(base));
      const bool same = google::protobuf::util::MessageDifferencer::Equals(def, base_def);
      same_as_base += same;
      auto program = BuildProgram(def, meshes_);
      same_built += same && program.ok();
      if (!program.ok()) {
        ++refused;
        EXPECT_THAT(program.status().code(),
                    ::testing::AnyOf(absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnimplemented))
            << program.status();
        EXPECT_FALSE(program.status().message().empty());
        continue;
      }
      ++built;
      // What builds runs, unless it is large or brings its own kernels (whose
      // push constants and code could make them run for as long as they like).
      bool small = true, custom = false;
      for (const ProgramValue& v : (*program)->values()) {
        small &= NumElements(v.shape) * DTypeSize(v.dtype) <= (1 << 20);
      }
      for (const FunctionDef& f : def.functions()) custom |= f.has_custom();
      if (small && !custom) {
        ++ran;
        const absl::Status run = RunZeros(*program);
        EXPECT_TRUE(run.ok()) << run << "\n" << ProgramDefToText(def);
      }
    }
  }
  EXPECT_GT(same_as_base, 0);
  EXPECT_EQ(same_built, same_as_base);
  EXPECT_GT(built, 0);
  EXPECT_GT(ran, 0);
  EXPECT_GT(refused, 0);
  std::printf("2000 mutations: %d unparsed, %d refused, %d built (%d of them run; %d the base def)\n",
              unparsed, refused, built, ran, same_as_base);
}

}  // namespace
}  // namespace causeway
