// Program files (tools/program_file.h) and `causeway run`: a file runs bit
// for bit like the same program built with ProgramBuilder on the same inputs;
// inputs follow their documented generators; kernels by path resolve
// relative to the file (and a def that still names a path is refused by
// FunctionFromDef); every example in examples/ runs and meets its
// expectations; malformed files give errors with the line and the reason;
// the causeway binary runs a file, writes its outputs and fails on a bad one.
#include "tools/program_file.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "causeway/base/subprocess.h"
#include "causeway/distributed/island_process.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/shaders/builtin_shaders.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/testing/pipeline_program.h"
#include "tests/testing/test_support.h"

namespace causeway::cli {
namespace {

namespace fs = std::filesystem;
using ::causeway::testing::MakeRuntime;
using ::causeway::testing::PipelineInCpp;
using ::causeway::testing::TestOptions;
using ::testing::HasSubstr;

// The repository's examples/ (::causeway::testing::SourceDir() is set by the build, as an
// absolute path; __FILE__ may be relative to the build directory).
fs::path ExamplesDir() { return fs::path(::causeway::testing::SourceDir()) / "examples"; }

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A fresh directory under the test's temporary directory.
fs::path FreshDir(const std::string& name) {
  fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("program_file_test_", getpid(), "_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// Runs `file` on a fresh island of `runtime`.
absl::StatusOr<ProgramFileResult> RunOn(Runtime& runtime, const ProgramFile& file,
                                        const ProgramFileRunOptions& options = {}) {
  IslandOptions island_options;
  island_options.runs_in_flight = 4;
  CAUSEWAY_ASSIGN_OR_RETURN(auto island, Island::Create(&runtime, island_options));
  return RunProgramFile(file, *island, options);
}

// --- the program, as a file and in C++ ------------------------------------------------
//
// Over meshes a and b of 2 devices each:
//   s = x + y           on a, split by rows
//   t = 0.5 s           on a
//   t_full = t          reshard on a to replicated
//   u = t_full * w      on b (a transfer from a)
//   u_split = u         reshard on b, split by rows
//   v = all-reduce(u_split)
//   out = v + 3 v       repeated_add x3 on b
constexpr char kPipelineFile[] = R"text(
description: "the pipeline of program_def_test, with random inputs"
program {
  name: "pipeline"
  meshes { name: "a" dims: 2 }
  meshes { name: "b" dims: 2 }
  functions { name: "add" elementwise { op: "add" shape: [4, 16] } }
  functions { name: "half" scale { shape: [4, 16] alpha: 0.5 } }
  functions { name: "mm" matmul { m: 8 n: 16 k: 16 } }
  functions { name: "acc3" repeated_add { shape: [4, 16] count: 3 } }
  parameters { value: "x" mesh: "a" shape: [8, 16] sharding { split {} } }
  parameters { value: "y" mesh: "a" shape: [8, 16] sharding { split {} } }
  parameters { value: "w" mesh: "b" shape: [16, 16] }
  nodes { name: "sum" call { function: "add" mesh: "a" inputs: ["x", "y"] outputs: "s" } }
  nodes { name: "halve" call { function: "half" mesh: "a" inputs: "s" outputs: "t" } }
  nodes { name: "gather" reshard { mesh: "a" input: "t" output: "t_full" sharding {} } }
  nodes { name: "matmul" call { function: "mm" mesh: "b" inputs: ["t_full", "w"] outputs: "u" } }
  nodes { name: "split" reshard { mesh: "b" input: "u" output: "u_split" sharding { split {} } } }
  nodes { name: "allreduce" collective { kind: ALL_REDUCE mesh: "b" input: "u_split" output: "v" op: SUM } }
  nodes { name: "accumulate" call { function: "acc3" mesh: "b" inputs: ["v", "v"] outputs: "out" } }
  outputs: ["out", "t_full"]
}
inputs { value: "x" random { seed: 1 } }
inputs { value: "y" random { seed: 2 min: -4 max: 4 } }
inputs { value: "w" random { seed: 3 min: -0.5 max: 0.5 } }
runs: 3
)text";

// Tests that a program file runs to the same outputs, bit for bit, as the
// same program built with ProgramBuilder and run on the same inputs, and
// that those outputs are right (a CPU reference in the kernels' order).
TEST(ProgramFileTest, RunsLikeTheProgramBuiltInCpp) {
  const fs::path dir = FreshDir("like_cpp");
  WriteFile(dir / "pipeline.textproto", kPipelineFile);
  ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile((dir / "pipeline.textproto").string()));
  EXPECT_EQ(file.accelerators(), 4);
  EXPECT_EQ(file.runs(), 3);
  EXPECT_EQ(file.clients(), 1);
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(ProgramFileResult result, RunOn(*rt, file));
  ASSERT_EQ(result.clients.size(), 1u);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.clients[0].runs, 3);
  EXPECT_GT(result.clients[0].runs_per_second(), 0);
  const std::vector<ProgramFileOutput>& got = result.clients[0].outputs;
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].name, "out");
  EXPECT_EQ(got[0].shape, (Shape{4, 16}));
  EXPECT_EQ(got[1].name, "t_full");
  EXPECT_EQ(got[1].shape, (Shape{8, 16}));

  // The same inputs, from the file's generators.
  std::map<std::string, std::string> inputs;
  const Shape shapes[] = {{8, 16}, {8, 16}, {16, 16}};
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(inputs[file.def.inputs(i).value()],
                         InputBytes(file.def.inputs(i), shapes[i], DType::kF32));
  }
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto client, island->Connect("cpp"));
  ASSERT_OK_AND_ASSIGN(auto a, client->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(auto b, client->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(auto program, PipelineInCpp(a, b));
  ASSERT_OK_AND_ASSIGN(auto exe, client->Load(program));
  std::vector<ArrayRef> args;
  for (int i = 0; i < 3; ++i) {
    const std::string& name = file.def.inputs(i).value();
    ASSERT_OK_AND_ASSIGN(ArrayRef arr,
                         client->CreateArray(i < 2 ? a : b, shapes[i], DType::kF32,
                                             i < 2 ? Sharding::Split(0) : Sharding::Replicated()));
    ASSERT_OK(arr->Upload(inputs[name].data(), inputs[name].size()));
    args.push_back(arr);
  }
  ASSERT_OK_AND_ASSIGN(Execution run, client->Execute(exe, args));
  ASSERT_OK(run.Await(absl::Now() + absl::Seconds(60)));
  for (size_t o = 0; o < 2; ++o) {
    std::string want(got[o].bytes.size(), '\0');
    ASSERT_OK(run.outputs[o]->Download(want.data(), want.size()));
    EXPECT_EQ(got[o].bytes, want) << "output " << got[o].name << " differs from the C++ program's";
  }

  // And the values are right.
  const std::vector<float> x = AsFloats(inputs["x"]), y = AsFloats(inputs["y"]), w = AsFloats(inputs["w"]);
  std::vector<float> t(8 * 16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = 0.5f * (x[i] + y[i]);
  const std::vector<float> u = reference::Matmul(t, w, 8, 16, 16);
  std::vector<float> out(4 * 16);
  for (size_t i = 0; i < out.size(); ++i) {
    const float v = u[i] + u[i + 4 * 16];
    out[i] = ((v + v) + v) + v;
  }
  EXPECT_EQ(AsFloats(got[1].bytes), t);
  EXPECT_LT(reference::MaxRelativeError(AsFloats(got[0].bytes), out), 1e-5);
}

// --- inputs ------------------------------------------------------------------------

InputDef Input(const std::string& text) {
  InputDef def;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &def)) << text;
  return def;
}

// SplitMix64 as the schema documents it, written again here.
uint64_t DocumentedSplitMix(uint64_t seed, uint64_t i) {
  uint64_t state = seed, z = 0;
  for (uint64_t k = 0; k <= i; ++k) {
    state += 0x9e3779b97f4a7c15ull;
    z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
  }
  return z;
}

// Tests that fill, iota (flat and per axis), values and random make the
// elements their comments promise, in every dtype.
TEST(ProgramFileTest, InputsFollowTheirDocumentedGenerators) {
  ASSERT_OK_AND_ASSIGN(std::string fill, InputBytes(Input("fill: 2.5"), {3}, DType::kF32));
  EXPECT_EQ(AsFloats(fill), (std::vector<float>{2.5f, 2.5f, 2.5f}));
  ASSERT_OK_AND_ASSIGN(std::string iota,
                       InputBytes(Input("iota { start: 1 step: 0.5 }"), {2, 2}, DType::kF32));
  EXPECT_EQ(AsFloats(iota), (std::vector<float>{1, 1.5, 2, 2.5}));
  ASSERT_OK_AND_ASSIGN(std::string steps,
                       InputBytes(Input("iota { start: 3 steps: [10, -1] }"), {2, 3}, DType::kF32));
  EXPECT_EQ(AsFloats(steps), (std::vector<float>{3, 2, 1, 13, 12, 11}));
  ASSERT_OK_AND_ASSIGN(std::string values, InputBytes(Input("values: [1, -2]"), {2}, DType::kI32));
  EXPECT_EQ(ElementsAsDoubles(values, DType::kI32), (std::vector<double>{1, -2}));
  EXPECT_EQ(values, std::string("\x01\x00\x00\x00\xfe\xff\xff\xff", 8));

  // f16: round to nearest even, exactly from the double.
  ASSERT_OK_AND_ASSIGN(std::string half,
                       InputBytes(Input("values: [1, 0.333333333333, 65504, 1e6, -0.0]"), {5}, DType::kF16));
  EXPECT_EQ(half, std::string("\x00\x3c\x55\x35\xff\x7b\x00\x7c\x00\x80", 10));
  EXPECT_EQ(ElementsAsDoubles(half, DType::kF16)[1], 0.333251953125);

  ASSERT_OK_AND_ASSIGN(std::string random,
                       InputBytes(Input("random { seed: 7 min: -2 max: 6 }"), {64}, DType::kF32));
  const std::vector<float> r = AsFloats(random);
  for (size_t i = 0; i < r.size(); ++i) {
    const double u = static_cast<double>(DocumentedSplitMix(7, i) >> 11) * 0x1p-53;
    EXPECT_EQ(r[i], static_cast<float>(-2 + 8 * u)) << i;
  }
  ASSERT_OK_AND_ASSIGN(std::string ints,
                       InputBytes(Input("random { seed: 7 min: -3 max: 3 }"), {256}, DType::kI32));
  std::map<double, int> seen;
  for (double v : ElementsAsDoubles(ints, DType::kI32)) seen[v]++;
  EXPECT_EQ(seen.size(), 7u);  // every integer in [-3, 3], nothing else
  EXPECT_EQ(seen.begin()->first, -3);
  EXPECT_EQ(seen.rbegin()->first, 3);

  EXPECT_ERROR(InputBytes(Input("fill: 1.5"), {2}, DType::kI32).status(), absl::StatusCode::kInvalidArgument,
               "element 0", "not an i32");
  EXPECT_ERROR(InputBytes(Input("values: [1, 2, 3]"), {2}, DType::kF32).status(),
               absl::StatusCode::kInvalidArgument, "3 values for [2]", "expected 2");
  EXPECT_ERROR(InputBytes(Input("data: \"abc\""), {2}, DType::kF32).status(),
               absl::StatusCode::kInvalidArgument, "3 bytes of data for [2] f32", "8 bytes");
  EXPECT_ERROR(InputBytes(Input("iota { steps: [1] }"), {2, 2}, DType::kF32).status(),
               absl::StatusCode::kInvalidArgument, "1 steps for [2, 2]");
  EXPECT_ERROR(InputBytes(Input("random { min: 2 max: 1 }"), {2}, DType::kF32).status(),
               absl::StatusCode::kInvalidArgument, "min <= max");
  EXPECT_ERROR(InputBytes(Input("value: \"x\""), {2}, DType::kF32).status(),
               absl::StatusCode::kInvalidArgument, "no fill, iota");
}

// --- kernels by path -----------------------------------------------------------------

std::string BuiltinSpirvBytes(const char* name) {
  std::optional<absl::Span<const uint32_t>> words = FindBuiltinShader(name);
  EXPECT_TRUE(words.has_value()) << name;
  if (!words.has_value()) return "";
  return std::string(reinterpret_cast<const char*>(words->data()), words->size() * sizeof(uint32_t));
}

// A program of one custom function whose single step is `kernel` (an add:
// out = a + b over 256 floats per device on 2 devices).
std::string CustomAddFile(const std::string& kernel) {
  return absl::StrCat(R"(program {
  name: "custom"
  meshes { name: "m" dims: 2 }
  functions {
    name: "my_add"
    custom {
      inputs { shape: 256 }
      inputs { shape: 256 }
      outputs { shape: 256 }
      steps { )",
                      kernel, R"( args: [0, 1, 2] push_constants: "\x00\x01\x00\x00" }
    }
  }
  parameters { value: "a" mesh: "m" shape: [512] sharding { split {} } }
  parameters { value: "b" mesh: "m" shape: [512] sharding { split {} } }
  nodes { name: "add" call { function: "my_add" mesh: "m" inputs: ["a", "b"] outputs: "c" } }
  outputs: "c"
}
inputs { value: "a" iota { start: 0 step: 1 } }
inputs { value: "b" fill: 10 }
expect { output: "c" iota { start: 10 step: 1 } }
)");
}

// Tests that spirv_file and glsl_file are read relative to the program file
// into `spirv`, and that the resulting function runs.
TEST(ProgramFileTest, KernelFilesResolveRelativeToTheFile) {
  const fs::path dir = FreshDir("kernels");
  fs::create_directories(dir / "sub" / "kernels");
  const std::string spv = BuiltinSpirvBytes("add");
  WriteFile(dir / "sub" / "kernels" / "add.spv", spv);
  WriteFile(dir / "sub" / "kernels" / "add.comp",
            ReadFile(fs::path(::causeway::testing::SourceDir()) / "causeway" / "shaders" / "add.comp"));
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  for (const char* kernel : {"spirv_file: \"kernels/add.spv\"", "glsl_file: \"kernels/add.comp\""}) {
    SCOPED_TRACE(kernel);
    const fs::path path = dir / "sub" / "custom.textproto";
    WriteFile(path, CustomAddFile(kernel));
    ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile(path.string()));
    const KernelStepDef& step = file.def.program().functions(0).custom().steps(0);
    ASSERT_EQ(step.kernel_case(), KernelStepDef::kSpirv);
    if (absl::StartsWith(kernel, "spirv")) {
      EXPECT_EQ(step.spirv(), spv);
    }
    ASSERT_OK_AND_ASSIGN(ProgramFileResult result, RunOn(*rt, file));
    EXPECT_TRUE(result.ok()) << (result.mismatches.empty() ? "" : result.mismatches[0]);
  }
}

// Tests that FunctionFromDef refuses a kernel still named by path: a def
// from the network must carry its bytes, and an island never reads files.
TEST(ProgramFileTest, FunctionFromDefRefusesKernelPaths) {
  FunctionDef def;
  def.set_name("by_path");
  FunctionDef::Custom* c = def.mutable_custom();
  c->add_inputs()->add_shape(256);
  c->add_outputs()->add_shape(256);
  KernelStepDef* step = c->add_steps();
  step->set_spirv_file("/etc/passwd");
  step->add_args(0);
  step->add_args(1);
  EXPECT_ERROR(FunctionFromDef(def).status(), absl::StatusCode::kInvalidArgument, "function 'by_path' step 0",
               "spirv_file '/etc/passwd'", "not resolved", "`spirv`");
  step->set_glsl_file("kernel.comp");
  EXPECT_ERROR(FunctionFromDef(def).status(), absl::StatusCode::kInvalidArgument, "glsl_file 'kernel.comp'",
               "not resolved");
}

// --- examples --------------------------------------------------------------------------

// Tests that every example in examples/ reads, runs on as many accelerators
// as it asks for, and meets its expectations.
TEST(ProgramFileTest, EveryExampleRunsAndMeetsItsExpectations) {
  std::vector<fs::path> examples;
  for (const auto& entry : fs::directory_iterator(ExamplesDir())) {
    if (entry.path().extension() == ".textproto") examples.push_back(entry.path());
  }
  std::sort(examples.begin(), examples.end());
  ASSERT_GE(examples.size(), 4u) << ExamplesDir();
  for (const fs::path& path : examples) {
    SCOPED_TRACE(path.filename().string());
    ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile(path.string()));
    EXPECT_FALSE(file.def.description().empty());
    EXPECT_GT(file.def.expect_size(), 0) << "an example checks itself";
    auto rt = MakeRuntime(file.accelerators());
    ASSERT_NE(rt, nullptr);
    ASSERT_OK_AND_ASSIGN(ProgramFileResult result, RunOn(*rt, file));
    EXPECT_EQ(static_cast<int>(result.clients.size()), file.clients());
    for (const std::string& m : result.mismatches) ADD_FAILURE() << m;
    for (const ProgramFileClientResult& c : result.clients) EXPECT_EQ(c.runs, file.runs());
  }
}

// Tests that an expectation that does not hold is reported, naming the
// client, the output and the first elements at fault, and that a tolerance
// admits what it should.
TEST(ProgramFileTest, UnmetExpectationsAreReported) {
  const fs::path dir = FreshDir("unmet");
  std::string text = ReadFile(ExamplesDir() / "multi_client.textproto");
  const std::string expect = "expect { output: \"v\" iota { start: 264 step: 2 } }";
  ASSERT_THAT(text, HasSubstr(expect));
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  struct Case {
    std::string expect;
    bool ok;
  };
  for (const Case& c :
       {Case{"expect { output: \"v\" iota { start: 264.001 step: 2 } }", false},
        Case{"expect { output: \"v\" iota { start: 264.001 step: 2 } tolerance: 1e-5 }", true}}) {
    SCOPED_TRACE(c.expect);
    std::string changed = text;
    changed.replace(changed.find(expect), expect.size(), c.expect);
    WriteFile(dir / "f.textproto", changed);
    ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile((dir / "f.textproto").string()));
    ASSERT_OK_AND_ASSIGN(ProgramFileResult result, RunOn(*rt, file, {.clients = 2, .runs = 2}));
    EXPECT_EQ(result.ok(), c.ok);
    if (!c.ok) {
      ASSERT_EQ(result.mismatches.size(), 2u);  // each client
      EXPECT_THAT(result.mismatches[0],
                  HasSubstr("client 'client-0' output 'v': 256 of 256 elements differ"));
      EXPECT_THAT(result.mismatches[0], HasSubstr("[0] got 264 want 264.001"));
    }
  }
}

// --- malformed files ---------------------------------------------------------------

constexpr char kGoodFile[] = R"(program {
  name: "p"
  meshes { name: "m" dims: 2 }
  functions { name: "add" elementwise { op: "add" shape: [4] } }
  parameters { value: "x" mesh: "m" shape: [8] sharding { split {} } }
  parameters { value: "y" mesh: "m" shape: [8] sharding { split {} } }
  nodes { name: "sum" call { function: "add" mesh: "m" inputs: ["x", "y"] outputs: "z" } }
  outputs: "z"
}
inputs { value: "x" fill: 1 }
inputs { value: "y" file: "y.bin" }
expect { output: "z" fill: 3 }
)";

// Tests that an expectation may be a raw file beside the program file, and
// that a file of other values is a mismatch.
TEST(ProgramFileTest, ExpectationsFromAFile) {
  const fs::path dir = FreshDir("expect_file");
  std::string text = kGoodFile;
  text.replace(text.find("fill: 3 }"), 9, "file: \"z.bin\" }");
  WriteFile(dir / "f.textproto", text);
  WriteFile(dir / "y.bin", Floats(std::vector<float>(8, 2.0f)));
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  std::vector<float> z(8, 3.0f);
  for (bool right : {true, false}) {
    SCOPED_TRACE(right);
    if (!right) z[5] = 3.5f;
    WriteFile(dir / "z.bin", Floats(z));
    ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile((dir / "f.textproto").string()));
    EXPECT_EQ(file.def.expect(0).data(), Floats(z));
    ASSERT_OK_AND_ASSIGN(ProgramFileResult result, RunOn(*rt, file));
    EXPECT_EQ(result.ok(), right);
    if (!right) {
      ASSERT_EQ(result.mismatches.size(), 1u);
      EXPECT_THAT(result.mismatches[0],
                  HasSubstr("1 of 8 elements differ from the expectation (tolerance 0): [5] got 3 want 3.5"));
    }
  }
  WriteFile(dir / "z.bin", Floats(std::vector<float>(7, 3.0f)));
  ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile((dir / "f.textproto").string()));
  EXPECT_ERROR(RunOn(*rt, file).status(), absl::StatusCode::kInvalidArgument,
               (dir / "f.textproto").string() + ":12:1: expect 'z' for output 'z' [8] f32: 28 bytes of data");
}

struct Malformed {
  std::string name;
  std::vector<std::pair<std::string, std::string>> edits;  // kGoodFile with each `from` replaced by `to`
  std::vector<std::string> want;                           // in the error message
};

// Tests that what is wrong in a file is named, at its line: syntax, unknown
// fields, references, inputs, kernel files, data sizes, bounds.
TEST(ProgramFileTest, MalformedFilesGiveTheLineAndTheReason) {
  const fs::path dir = FreshDir("malformed");
  const std::string f = (dir / "f.textproto").string();
  WriteFile(dir / "y.bin", Floats(std::vector<float>(8, 2.0f)));
  WriteFile(dir / "short.bin", Floats(std::vector<float>(3, 2.0f)));
  {
    WriteFile(f, kGoodFile);
    ASSERT_OK_AND_ASSIGN(ProgramFile good, ReadProgramFile(f));
    EXPECT_EQ(good.def.inputs(1).data(), Floats(std::vector<float>(8, 2.0f)));
    EXPECT_EQ(good.locations.at("node 'sum'"), std::make_pair(7, 3));
    EXPECT_EQ(good.locations.at("input 'y'"), std::make_pair(11, 1));
    auto rt = MakeRuntime(2);
    ASSERT_NE(rt, nullptr);
    ASSERT_OK_AND_ASSIGN(ProgramFileResult result, RunOn(*rt, good));
    EXPECT_TRUE(result.ok());
  }
  const std::vector<Malformed> cases = {
      {"syntax", {{"dims: 2 }", "dims: 2 ]"}}, {f + ":3:", "Expected"}},
      {"unknown field", {{"  name: \"p\"", "  nmae: \"p\""}}, {f + ":2:3:", "no field named \"nmae\""}},
      {"unknown enum",
       {{"  outputs: \"z\"",
         "  nodes { name: \"r\" collective { kind: ALL_SUM mesh: \"m\" input: \"z\" output: \"w\" } }\n  "
         "outputs: \"z\""}},
       {f + ":8:", "ALL_SUM"}},
      {"missing value",
       {{"inputs: [\"x\", \"y\"]", "inputs: [\"x\", \"q\"]"}},
       {f + ":7:3: node 'sum': input 'q' is neither a parameter nor an output of any node"}},
      {"missing function",
       {{"function: \"add\" mesh", "function: \"sub\" mesh"}},
       {f + ":7:3: node 'sum': function 'sub' is not one of the program's functions"}},
      {"missing mesh",
       {{"value: \"y\" mesh: \"m\"", "value: \"y\" mesh: \"n\""}},
       {f + ":6:3: parameter 'y': mesh 'n' is not one of the program's meshes ('m')"}},
      {"missing input",
       {{"inputs { value: \"y\" file: \"y.bin\" }\n", ""}},
       {f + ":6:3: parameter 'y' has no input"}},
      {"input for no parameter",
       {{"inputs { value: \"x\" fill: 1 }",
         "inputs { value: \"x\" fill: 1 }\ninputs { value: \"q\" fill: 1 }"}},
       {f + ":11:1: input 'q': the program has no parameter 'q'"}},
      {"input twice",
       {{"inputs { value: \"x\" fill: 1 }",
         "inputs { value: \"x\" fill: 1 }\ninputs { value: \"x\" fill: 2 }"}},
       {f + ":11:1: input 'x' is given twice"}},
      {"missing data file",
       {{"file: \"y.bin\"", "file: \"nope.bin\""}},
       {f + ":11:1: input 'y': file 'nope.bin': no such file"}},
      {"data file of the wrong size",
       {{"file: \"y.bin\"", "file: \"short.bin\""}},
       {f + ":11:1: input 'y' for [8] f32: 12 bytes of data", "expected 8 elements x 4 = 32 bytes"}},
      {"missing spirv file",
       {{"functions { name: \"add\" elementwise { op: \"add\" shape: [4] } }",
         "functions { name: \"add\" custom { inputs { shape: 4 } outputs { shape: 4 }\n"
         "    steps { spirv_file: \"missing.spv\" } } }"}},
       {f + ":5:5: function 'add' step 0: spirv_file 'missing.spv': no such file"}},
      {"glsl that does not compile",
       {{"functions { name: \"add\" elementwise { op: \"add\" shape: [4] } }",
         "functions { name: \"add\" custom { inputs { shape: 4 } outputs { shape: 4 }\n"
         "    steps { glsl_file: \"y.bin\" } } }"}},
       {f + ":5:5: function 'add' step 0: glsl_file 'y.bin'"}},
      {"expect of no output",
       {{"expect { output: \"z\"", "expect { output: \"s\""}},
       {f + ":12:1: expect 's': the program has no output 's' (its outputs: z)"}},
      {"expect without values",
       {{"expect { output: \"z\" fill: 3 }", "expect { output: \"z\" tolerance: 1 }"}},
       {f + ":12:1: expect 'z': no fill, iota"}},
      {"i32 input not an integer",
       {{"value: \"x\" mesh: \"m\"", "value: \"x\" dtype: I32 mesh: \"m\""},
        {"value: \"x\" fill: 1", "value: \"x\" fill: 1.5"}},
       {f + ":10:1: input 'x' for [8] i32: element 0: value 1.5 is not an i32"}},
      {"runs out of range",
       {{"expect {", "runs: -3\nexpect {"}},
       {f + ":12:1: runs: -3; expected 1..1000000"}},
      {"send node",
       {{"  outputs: \"z\"", "  nodes { name: \"out\" send { input: \"z\" channel: 1 } }\n  outputs: \"z\""}},
       {f + ":8:3: node 'out': send and receive nodes cross islands"}},
      {"value produced twice",
       {{"  outputs: \"z\"",
         "  nodes { name: \"sum2\" call { function: \"add\" mesh: \"m\" inputs: [\"x\", \"y\"] outputs: "
         "\"z\" } }\n"
         "  outputs: \"z\""}},
       {f + ":8:3: node 'sum2': value 'z' is defined twice"}},
      {"node name twice",
       {{"  outputs: \"z\"",
         "  nodes { name: \"sum\" call { function: \"add\" mesh: \"m\" inputs: [\"x\", \"y\"] outputs: "
         "\"z2\" } }\n"
         "  outputs: \"z\""}},
       {f + ":8:3: node 'sum' is defined twice"}},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    std::string text = kGoodFile;
    for (const auto& [from, to] : c.edits) {
      const size_t at = text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      text.replace(at, from.size(), to);
    }
    WriteFile(f, text);
    auto file = ReadProgramFile(f);
    ASSERT_FALSE(file.ok()) << text;
    for (const std::string& want : c.want) EXPECT_THAT(std::string(file.status().message()), HasSubstr(want));
  }
  EXPECT_EQ(ReadProgramFile((dir / "absent.textproto").string()).status().code(),
            absl::StatusCode::kNotFound);
}

// Tests that what only BuildProgram can find (a shape that does not fit the
// function), and a mesh on another island, are placed in the file too, when
// the file runs.
TEST(ProgramFileTest, ErrorsFoundWhenRunningArePlacedInTheFile) {
  const fs::path dir = FreshDir("run_errors");
  const std::string f = (dir / "f.textproto").string();
  WriteFile(dir / "y.bin", Floats(std::vector<float>(8, 2.0f)));
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  struct Case {
    std::string from, to;
    std::vector<std::string> want;
  };
  for (const Case& c : {
           Case{"shape: [4] } }", "shape: [3] } }", {f + ":7:3: node 'sum'"}},
           Case{"dims: 2 }",
                "dims: 2 island: \"far\" }",
                {f + ":3:3: mesh 'm' is on island 'far', which is not among the islands: 'local'"}},
           Case{"dims: 2 }", "dims: 3 }", {f + ":3:3: mesh 'm': a mesh of 3 accelerators does not fit"}},
       }) {
    SCOPED_TRACE(c.to);
    std::string text = kGoodFile;
    text.replace(text.find(c.from), c.from.size(), c.to);
    WriteFile(f, text);
    ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile(f));
    auto result = RunOn(*rt, file);
    ASSERT_FALSE(result.ok());
    for (const std::string& want : c.want)
      EXPECT_THAT(std::string(result.status().message()), HasSubstr(want));
  }
}

// --- the causeway binary ------------------------------------------------------------

struct Ran {
  int code = -1;
  std::string out, err;
};

// Runs the causeway binary with `args` through the shell.
Ran Cli(const std::string& args, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const int status = std::system(
      absl::StrCat(::causeway::testing::CliPath(), " ", args, " >", out.string(), " 2>", err.string())
          .c_str());
  Ran r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

// The bytes an expectation of `file` stands for, for an output of `shape`.
std::string ExpectedBytes(const ProgramFile& file, const std::string& output, const Shape& shape) {
  for (const ExpectDef& ex : file.def.expect()) {
    if (ex.output() != output) continue;
    InputDef as_input;
    if (ex.has_iota()) *as_input.mutable_iota() = ex.iota();
    if (ex.has_fill()) as_input.set_fill(ex.fill());
    if (ex.has_data()) as_input.set_data(ex.data());
    as_input.mutable_values()->CopyFrom(ex.values());
    auto bytes = InputBytes(as_input, shape, DType::kF32);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : "";
  }
  ADD_FAILURE() << "no expectation of " << output;
  return "";
}

// FNV-1a 64 (Fowler, Noll, Vo) written out here from its definition, so
// that the checksums expected below do not come from the code under test.
uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 14695981039346656037ull;                          // the offset basis
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;  // the prime
  return h;
}

// Tests OutputChecksum against FNV-1a 64's published test vectors.
TEST(OutputChecksumTest, IsFnv1a64) {
  EXPECT_EQ(OutputChecksum(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(OutputChecksum("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(OutputChecksum("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

// Tests that `causeway run` runs an example: exit 0, each output's checksum
// printed, the rate per client, and with --outputs the raw outputs written.
TEST(RunCommandTest, RunsAnExampleAndWritesItsOutputs) {
  const fs::path dir = FreshDir("cli_run");
  const fs::path example = ExamplesDir() / "data_parallel.textproto";
  ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile(example.string()));
  Ran r =
      Cli(absl::StrCat("run ", example.string(), " ", ::causeway::testing::DeviceFlag(), " ",
                       ::causeway::testing::ValidationFlag(), " --runs 5 --outputs ", (dir / "out").string()),
          dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* output : {"grad", "p1"}) {
    const std::string want = ExpectedBytes(file, output, {4, 8});
    EXPECT_THAT(r.out,
                HasSubstr(absl::StrFormat("output %s: [4, 8] f32 checksum %016x", output, Fnv1a64(want))));
    EXPECT_EQ(ReadFile(dir / "out" / absl::StrCat(output, ".bin")), want) << output;
  }
  EXPECT_THAT(r.out, HasSubstr("program data-parallel-step: 1 client x 5 runs on 4 accelerators"));
  EXPECT_THAT(r.out, HasSubstr("values [206, 206, 206, 206, 206, 206, 206, 206, ...]"));
  EXPECT_THAT(r.out, HasSubstr("client client-0: 5 runs in"));
  EXPECT_THAT(r.out, HasSubstr("expect: ok (2 outputs as expected)"));
}

// Tests that several clients each report their rate.
TEST(RunCommandTest, RunsSeveralClients) {
  const fs::path dir = FreshDir("cli_clients");
  Ran r = Cli(absl::StrCat("run ", (ExamplesDir() / "multi_client.textproto").string(), " ",
                           ::causeway::testing::DeviceFlag(), " ", ::causeway::testing::ValidationFlag(),
                           " --runs 4 --clients 2"),
              dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 clients x 4 runs on 2 accelerators"));
  EXPECT_THAT(r.out, HasSubstr("client client-0: 4 runs"));
  EXPECT_THAT(r.out, HasSubstr("client client-1: 4 runs"));
}

// Tests that `causeway run --connect` runs a program file on running island
// servers through the same code as on an island of its own: the pipeline
// example with two stages on each of two islands (meshes naming them), two
// clients each a controller of its own, gives the example's expected output
// with the same checksum; a mesh naming no island of --connect is placed in
// the file; what applies only to an island of this process is refused.
TEST(RunCommandTest, RunsOnRunningIslandsWithConnect) {
  const fs::path dir = FreshDir("cli_connect");
  std::vector<std::unique_ptr<transport::IslandProcess>> islands;
  for (const char* name : {"left", "right"}) {
    auto island = transport::IslandProcess::Start(::causeway::testing::CliPath(), name,
                                                  {::causeway::testing::DeviceFlag(), "--accelerators=2"});
    ASSERT_TRUE(island.ok()) << island.status();
    islands.push_back(*std::move(island));
  }
  const std::string connect = absl::StrCat(" --connect ", islands[0]->address(), ",", islands[1]->address());
  std::string text = ReadFile(ExamplesDir() / "pipeline.textproto");
  for (const auto& [mesh, island] :
       {std::pair{"s0", "left"}, {"s1", "left"}, {"s2", "right"}, {"s3", "right"}}) {
    const std::string from = absl::StrCat("name: \"", mesh, "\" dims: 1");
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(),
                 absl::StrCat("name: \"", mesh, "\" island: \"", island, "\" dims: 1"));
  }
  const fs::path two = dir / "two_islands.textproto";
  WriteFile(two, text);
  ASSERT_OK_AND_ASSIGN(ProgramFile file, ReadProgramFile(two.string()));
  const std::string want = ExpectedBytes(file, "x4", {8, 64});

  Ran r = Cli(
      absl::StrCat("run ", two.string(), connect, " --runs 4 --clients 2 --outputs ", (dir / "out").string()),
      dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("program matmul-pipeline: 2 clients x 4 runs on 4 accelerators of 2 islands"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat("output x4: [8, 64] f32 checksum %016x", Fnv1a64(want))));
  EXPECT_THAT(r.out, HasSubstr("client client-0: 4 runs"));
  EXPECT_THAT(r.out, HasSubstr("client client-1: 4 runs"));
  EXPECT_THAT(r.out, HasSubstr("expect: ok (1 output as expected)"));
  EXPECT_EQ(ReadFile(dir / "out" / "x4.bin"), want);

  // The example as it is (no island named) runs on the first island alone.
  Ran first = Cli(absl::StrCat("run ", (ExamplesDir() / "pipeline.textproto").string(), " --connect ",
                               islands[1]->address()),
                  dir);
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  EXPECT_THAT(first.out, HasSubstr("on 2 accelerators of 1 island"));
  EXPECT_THAT(first.out, HasSubstr(absl::StrFormat("checksum %016x", Fnv1a64(want))));

  // A mesh on an island --connect does not name, placed in the file.
  std::string elsewhere = text;
  elsewhere.replace(elsewhere.find("island: \"right\""), 15, "island: \"north\"");
  WriteFile(dir / "north.textproto", elsewhere);
  Ran north = Cli(absl::StrCat("run ", (dir / "north.textproto").string(), connect), dir);
  EXPECT_EQ(north.code, 1) << north.out << north.err;
  EXPECT_THAT(north.err,
              HasSubstr(absl::StrCat((dir / "north.textproto").string(),
                                     ":18:3: mesh 's2' is on island 'north', which is not among the "
                                     "islands: 'left', 'right'")));

  // What belongs to an island of this process, with --connect.
  for (const char* flag : {"--accelerators=2", "--check-order", "--device=cpu"}) {
    Ran bad = Cli(absl::StrCat("run ", two.string(), connect, " ", flag), dir);
    EXPECT_EQ(bad.code, 2) << flag << ": " << bad.err;
    EXPECT_THAT(bad.err, HasSubstr("--connect")) << flag;
  }
  Ran secret = Cli(absl::StrCat("run ", two.string(), " --secret-file ", (dir / "none").string()), dir);
  EXPECT_EQ(secret.code, 2);
  EXPECT_THAT(secret.err, HasSubstr("--secret-file is for --connect"));

  // An island that is gone: the run fails naming it.
  const std::string gone = islands[1]->address();
  islands[1]->Stop(absl::Seconds(10));
  Ran down = Cli(absl::StrCat("run ", two.string(), " --connect ", islands[0]->address(), ",", gone), dir);
  EXPECT_EQ(down.code, 1) << down.out << down.err;
  EXPECT_THAT(down.err, HasSubstr(gone));
}

// Tests that a malformed file exits 1 with the file, the line and the
// reason on stderr and nothing on stdout; bad usage exits 2; --help is 0.
TEST(RunCommandTest, FailsOnAMalformedFileAndOnBadUsage) {
  const fs::path dir = FreshDir("cli_bad");
  std::string text = kGoodFile;
  text.replace(text.find("inputs: [\"x\", \"y\"]"), 18, "inputs: [\"x\", \"q\"]");
  WriteFile(dir / "bad.textproto", text);
  WriteFile(dir / "y.bin", Floats(std::vector<float>(8, 2.0f)));
  Ran r = Cli(absl::StrCat("run ", (dir / "bad.textproto").string(), " ", ::causeway::testing::DeviceFlag()),
              dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("causeway run: ", (dir / "bad.textproto").string(),
                                            ":7:3: node 'sum': input 'q' is neither")));

  r = Cli("run", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "causeway run: expected one PROGRAM file, got none (causeway run --help)\n");
  r = Cli("run a b", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("causeway run: expected one PROGRAM file, got 2"));
  r = Cli(absl::StrCat("run ", (dir / "bad.textproto").string(), " --runs 0"), dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--runs must be 1.."));
  r = Cli("run --help", dir);
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("usage: causeway run PROGRAM"));
}

// Tests that `causeway run` refuses a program whose kernel dereferences an
// address from its push constants (GL_EXT_buffer_reference): exit 1 with
// the capability named, where it once died of SIGSEGV.
TEST(RunCommandTest, RefusesAKernelThatUsesPointers) {
  const fs::path dir = FreshDir("cli_pointers");
  WriteFile(dir / "peek.comp", R"(#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 1) in;
layout(buffer_reference, std430) buffer Words { uint v[]; };
layout(push_constant) uniform Params { uint64_t address; };
layout(set = 0, binding = 0) readonly buffer In { uint in_v[]; };
layout(set = 0, binding = 1) buffer Out { uint out_v[]; };
void main() {
  Words w = Words(address);
  out_v[0] = w.v[0] + in_v[0];
  w.v[1] = 7u;
}
)");
  WriteFile(dir / "peek.textproto", R"(program {
  name: "peek"
  meshes { name: "m" dims: 1 }
  functions {
    name: "peek"
    custom {
      inputs { shape: 4 }
      outputs { shape: 4 }
      steps { glsl_file: "peek.comp" args: [0, 1] push_constants: "\x10\x00\x00\x00\x00\x00\x00\x00" }
    }
  }
  parameters { value: "a" mesh: "m" shape: [4] }
  nodes { name: "peek" call { function: "peek" mesh: "m" inputs: ["a"] outputs: "b" } }
  outputs: "b"
}
inputs { value: "a" fill: 1 }
)");
  Ran r = Cli(absl::StrCat("run ", (dir / "peek.textproto").string(), " ", ::causeway::testing::DeviceFlag()),
              dir);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("PhysicalStorageBufferAddresses"));
}

// Writes spin.textproto (program 'forever': gang call 'spin' of kernel
// 'spin') and its shader into `dir`: 65535 workgroups of 60000 rounds of
// integer mixing, far more than minutes on any CPU.
void WriteForeverProgram(const fs::path& dir) {
  WriteFile(dir / "spin.comp", R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer In { uint in_v[]; };
layout(set = 0, binding = 1) writeonly buffer Out { uint out_v[]; };
void main() {
  uint x = in_v[0] + gl_WorkGroupID.x;
  for (uint i = 0u; i < 60000u; ++i) {
    // Not an affine recurrence, which a compiler folds into a closed form.
    for (uint j = 0u; j < 64u; ++j) {
      x ^= x >> 13;
      x *= 0x5bd1e995u;
      x ^= x >> 15;
    }
  }
  out_v[gl_WorkGroupID.x & 3u] = x;
}
)");
  WriteFile(dir / "spin.textproto", R"(program {
  name: "forever"
  meshes { name: "m" dims: 1 }
  functions {
    name: "spin"
    custom {
      inputs { shape: 4 }
      outputs { shape: 4 }
      steps { glsl_file: "spin.comp" kernel_name: "spin" args: [0, 1] groups: [65535, 1, 1] }
    }
  }
  parameters { value: "a" mesh: "m" shape: [4] }
  nodes { name: "spin" call { function: "spin" mesh: "m" inputs: ["a"] outputs: "b" } }
  outputs: "b"
}
inputs { value: "a" fill: 1 }
)");
}

// Tests that `causeway run --deadline 1s` on a kernel that would run for
// minutes fails the run naming the kernel and its accelerator, quarantines
// the accelerator, and leaves within seconds (the device still running it is
// abandoned, and says so) instead of waiting the kernel out.
TEST(RunCommandTest, DeadlineEndsAKernelThatWouldRunForMinutes) {
  const fs::path dir = FreshDir("cli_deadline");
  WriteForeverProgram(dir);
  const absl::Time start = absl::Now();
  Ran r = Cli(absl::StrCat("run ", (dir / "spin.textproto").string(), " --deadline 1s ",
                           ::causeway::testing::DeviceFlag()),
              dir);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  // The deadline watch's message or, when the quarantine came first, the
  // accelerator's: both name the deadline, the gang call, its kernel and where.
  EXPECT_THAT(r.err, HasSubstr("deadline of 1.00 s"));
  EXPECT_THAT(r.err, HasSubstr("gang call 'spin' (kernel 'spin') of program 'forever'"));
  EXPECT_THAT(r.err, HasSubstr("accelerator 0 ("));
  EXPECT_THAT(r.err, HasSubstr("abandoning accelerator 0"));
  EXPECT_THAT(r.err, HasSubstr("is quarantined"));
  // The deadline, the quarantine's poll and the bounded teardown, plus
  // start-up (pipelines compiled) and the slack of a loaded machine.
  EXPECT_LT(took, absl::Seconds(1) + Accelerator::kAbandonAfter + absl::Seconds(10)) << r.err;
  // A deadline must be a duration.
  Ran bad = Cli(absl::StrCat("run ", (dir / "spin.textproto").string(), " --deadline soon"), dir);
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--deadline wants a duration such as 30s, 500ms or 1h30m, got 'soon'"));
}

// Tests that SIGINT ends `causeway run` on a kernel that would run for
// minutes within 2 s, with exit code 130 and a line naming what was running.
// The watchdog (after 300 ms) says when the kernel is stuck on its
// accelerator: then the signal is sent.
TEST(RunCommandTest, SigintEndsALongKernelWithin2s) {
  const fs::path dir = FreshDir("cli_sigint");
  WriteForeverProgram(dir);
  // Its stderr into the pipe, its stdout to nowhere.
  SpawnOptions options;
  options.argv = {
      "sh", "-c",
      absl::StrCat("exec ", ::causeway::testing::CliPath(), " run ", (dir / "spin.textproto").string(),
                   " --watchdog=300ms ", ::causeway::testing::DeviceFlag(), " 2>&1 >/dev/null")};
  options.pipe_stdout = true;
  ASSERT_OK_AND_ASSIGN(Subprocess run, Subprocess::Spawn(options));
  const int err = run.stdout_fd();
  // Reads the child's stderr until `want` shows or `limit` passes.
  std::string text;
  auto read_until = [&](absl::string_view want, absl::Duration limit) {
    const absl::Time until = absl::Now() + limit;
    while (!absl::StrContains(text, want) && absl::Now() < until) {
      pollfd pfd{err, POLLIN, 0};
      if (poll(&pfd, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(err, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    return absl::StrContains(text, want);
  };
  // Start-up compiles pipelines: a minute is ample even under TSan.
  const bool stuck =
      read_until("of program 'forever' for client 'client-0', in flight for", absl::Seconds(60));
  EXPECT_TRUE(stuck) << text;
  const absl::Time signalled = absl::Now();
  run.Signal(SIGINT);
  absl::StatusOr<int> ended = run.Wait(signalled + absl::Seconds(30));
  const absl::Duration took = absl::Now() - signalled;
  const int status = ended.ok() ? *ended : run.Stop(absl::ZeroDuration());
  read_until("\n\n", absl::Seconds(1));  // the rest, up to the pipe's end
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  EXPECT_THAT(text, HasSubstr("has finished nothing for"));
  EXPECT_THAT(text, HasSubstr("causeway run: stopped by Interrupt; work in flight, abandoned:\n"
                              "  accelerator 0 ("));
  EXPECT_THAT(text, HasSubstr("gang call 'spin' (kernel 'spin') of program 'forever' for client 'client-0', "
                              "in flight for "));
  // The command leaves at most 1.5 s after the signal by construction
  // (tools/interrupt.cc), without waiting for the device, which would take
  // far more than minutes. Under TSan at load 4 the signal thread's turn and
  // the teardown of a process whose driver threads still spin took up to
  // 3.4 s (seen): the bound is the 2 s promised plus the suite's slack for a
  // loaded machine, and still tells a prompt exit from one that waited.
  EXPECT_LT(took, absl::Seconds(2) + ::causeway::testing::kSchedulingSlack) << text;
}

// Tests that an expectation not met exits 1 naming the output.
TEST(RunCommandTest, FailsWhenAnExpectationIsNotMet) {
  const fs::path dir = FreshDir("cli_unmet");
  std::string text = kGoodFile;
  text.replace(text.find("fill: 3 }"), 9, "fill: 4 }");
  WriteFile(dir / "f.textproto", text);
  WriteFile(dir / "y.bin", Floats(std::vector<float>(8, 2.0f)));
  Ran r =
      Cli(absl::StrCat("run ", (dir / "f.textproto").string(), " ", ::causeway::testing::DeviceFlag()), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("expect: FAILED"));
  EXPECT_THAT(
      r.err,
      HasSubstr("output 'z': 8 of 8 elements differ from the expectation (tolerance 0): [0] got 3 want 4"));
}

// Tests that --check-order traces the run and checks the gang order of
// several clients' collectives on shared accelerators.
TEST(RunCommandTest, ChecksTheGangOrder) {
  const fs::path dir = FreshDir("cli_order");
  const fs::path trace = dir / "run.json";
  Ran r =
      Cli(absl::StrCat("run ", (ExamplesDir() / "multi_client.textproto").string(), " ",
                       ::causeway::testing::DeviceFlag(), " --runs 3 --check-order --trace ", trace.string()),
          dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("order: ok ("));
  EXPECT_TRUE(fs::exists(trace));
  // Without --trace, the trace goes to a temporary file, removed after.
  r = Cli(absl::StrCat("run ", (ExamplesDir() / "multi_client.textproto").string(), " ",
                       ::causeway::testing::DeviceFlag(), " --runs 2 --check-order"),
          dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("order: ok ("));
}

}  // namespace
}  // namespace causeway::cli
