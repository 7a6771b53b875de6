// Functions: Function::Create checks every step against its kernel (bindings
// written versus inputs, argument indexes, binding sizes, push constants,
// workgroup counts, specialization constants, workgroup sizes) and its specs
// (outputs, steps, static shapes), with the same rules and messages as a
// custom function from a def (FunctionFromDef), whose checks are Create's.
// A kernel may never write a function's input: a step that binds an input
// where its kernel may write would overwrite the caller's array.
#include "causeway/scheduler/function.h"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "causeway/runtime/kernel.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"
#include "causeway/scheduler/program_def.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// y = a * x + b: binding 0 is read, binding 1 written.
constexpr char kAxpb[] = R"(
  #version 450
  layout(local_size_x = 64, local_size_x_id = 0) in;
  layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
  layout(set = 0, binding = 1, std430) writeonly buffer Y { float y[]; };
  layout(push_constant) uniform Params { uint count; float a; float b; } p;
  void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) y[i] = p.a * x[i] + p.b;
  }
)";

// out[i] = table[i % 64]: binding 0 is a block of fixed size (256 bytes).
constexpr char kLookup[] = R"(
  #version 450
  layout(local_size_x = 64) in;
  layout(set = 0, binding = 0, std430) readonly buffer Table { float table[64]; };
  layout(set = 0, binding = 1, std430) writeonly buffer Out { float result[]; };
  layout(push_constant) uniform Params { uint count; } p;
  void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i < p.count) result[i] = table[i % 64];
  }
)";

struct AxpbParams {
  uint32_t count;
  float a, b;
};

std::vector<uint8_t> PushBytes(const void* data, size_t size) {
  std::vector<uint8_t> out(size);
  std::memcpy(out.data(), data, size);
  return out;
}

// Everything Function::Create takes, so that one case can be given to both
// Create and a def.
struct Parts {
  std::string name;
  std::vector<TensorSpec> inputs, outputs, scratch;
  std::vector<KernelStep> steps;

  absl::StatusOr<std::shared_ptr<const Function>> Create() const {
    return Function::Create(name, inputs, outputs, scratch, steps);
  }

  // The same function as a custom def (ToDef of a Function needs one that
  // Create accepted).
  FunctionDef Def() const {
    FunctionDef def;
    def.set_name(name);
    FunctionDef::Custom* custom = def.mutable_custom();
    for (const TensorSpec& spec : inputs) *custom->add_inputs() = ToDef(spec);
    for (const TensorSpec& spec : outputs) *custom->add_outputs() = ToDef(spec);
    for (const TensorSpec& spec : scratch) *custom->add_scratch() = ToDef(spec);
    for (const KernelStep& step : steps) *custom->add_steps() = ToDef(step);
    return def;
  }
};

class FunctionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(axpb_, Kernel::FromGlsl("axpb", kAxpb));
    ASSERT_OK_AND_ASSIGN(lookup_, Kernel::FromGlsl("lookup", kLookup));
  }

  // "axpb": y = 2 x + 1 over f32[256], with args {0, 1}: x read, y written.
  Parts Axpb() const {
    const TensorSpec t{{256}, DType::kF32};
    const AxpbParams params{256, 2.0f, 1.0f};
    return {"axpb", {t}, {t}, {}, {{axpb_, {0, 1}, PushBytes(&params, sizeof(params)), {4, 1, 1}, {}}}};
  }

  std::shared_ptr<const Kernel> axpb_, lookup_;
};

// Tests the silent wrong result this rule prevents: "axpb" with args {1, 0}
// binds the input x to binding 1, which the kernel writes, so every run
// would overwrite the caller's x. Create refuses it, naming the binding.
TEST_F(FunctionTest, StepThatWritesAnInputIsRefused) {
  Parts parts = Axpb();
  EXPECT_OK(parts.Create().status());
  parts.steps[0].args = {1, 0};
  EXPECT_ERROR(parts.Create().status(), kInvalid,
               "function 'axpb' step 0: kernel 'axpb' may write binding 1, given input 0",
               "inputs are read-only");
}

// Tests that the function Create accepts runs and leaves its input as it was
// uploaded: y = 2 x + 1, x unchanged.
TEST_F(FunctionTest, AcceptedFunctionKeepsItsInput) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto client, island->Connect("test"));
  ASSERT_OK_AND_ASSIGN(auto mesh, client->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto axpb, Axpb().Create());
  ProgramBuilder b("axpb");
  b.Parameter("x", mesh, {256}, DType::kF32, Sharding::Replicated());
  b.Call("axpb", axpb, mesh, {"x"}, {"y"});
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client->Load(program));
  ASSERT_OK_AND_ASSIGN(ArrayRef x, client->CreateArray(mesh, {256}, DType::kF32, Sharding::Replicated()));
  std::vector<float> host(256);
  for (int i = 0; i < 256; ++i) host[i] = static_cast<float>(i);
  ASSERT_OK(x->Upload(host.data(), host.size() * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(Execution run, client->Execute(exe, {x}));
  ASSERT_OK(run.Await());

  std::vector<float> y(256, -1.0f), x_after(256, -1.0f);
  ASSERT_OK(run.outputs[0]->Download(y.data(), y.size() * sizeof(float)));
  ASSERT_OK(x->Download(x_after.data(), x_after.size() * sizeof(float)));
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(y[i], 2.0f * i + 1.0f) << i;
    EXPECT_EQ(x_after[i], static_cast<float>(i)) << i;
  }
}

// Tests each rule on both paths: Function::Create and a custom function from
// a def refuse the same function with InvalidArgument and the same message.
TEST_F(FunctionTest, EveryRuleHoldsForCreateAndForDefs) {
  struct Case {
    std::string what;
    std::function<void(Parts&)> mutate;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"writes an input",
       [](Parts& f) {
         f.steps[0].args = {1, 0};
       },
       {"function 'axpb' step 0: kernel 'axpb' may write binding 1, given input 0"}},
      {"arg out of range",
       [](Parts& f) {
         f.steps[0].args = {0, 5};
       },
       {"function 'axpb' step 0: argument 5 is not one of its 2 buffers (1 inputs, 1 outputs, 0 scratch"}},
      {"negative arg",
       [](Parts& f) {
         f.steps[0].args = {-1, 1};
       },
       {"function 'axpb' step 0: argument -1"}},
      {"arg count",
       [](Parts& f) {
         f.steps[0].args = {0, 1, 1};
       },
       {"function 'axpb' step 0: kernel 'axpb' has 2 bindings, given 3 args"}},
      {"binding too small",
       [&](Parts& f) {
         f.inputs[0].shape = {16};
         f.steps[0].kernel = lookup_;
         f.steps[0].push_constants.resize(4);
       },
       {"function 'axpb' step 0: kernel 'lookup' binding 0 expects at least 256 bytes, given argument 0 "
        "f32[16] "
        "of 64"}},
      {"push constants size",
       [](Parts& f) { f.steps[0].push_constants.resize(8); },
       {"function 'axpb' step 0: kernel 'axpb' takes 12 bytes of push constants, given 8"}},
      {"zero groups",
       [](Parts& f) {
         f.steps[0].groups = {4, 0, 1};
       },
       {"function 'axpb' step 0: groups [4, 0, 1] (each must be 1..65535)"}},
      {"too many groups",
       [](Parts& f) {
         f.steps[0].groups = {70000, 1, 1};
       },
       {"function 'axpb' step 0: groups [70000, 1, 1] (each must be 1..65535)"}},
      {"undeclared spec",
       [](Parts& f) {
         f.steps[0].spec = {{9, 1}};
       },
       {"function 'axpb' step 0: kernel 'axpb' has no specialization constant 9 (it declares 0)"}},
      {"spec twice",
       [](Parts& f) {
         f.steps[0].spec = {{0, 64}, {0, 32}};
       },
       {"function 'axpb' step 0: specialization constant 0 is given twice"}},
      {"workgroup too large",
       [](Parts& f) {
         f.steps[0].spec = {{0, 2048}};
       },
       {"function 'axpb' step 0: kernel 'axpb': workgroup size 2048x1x1 (expected 1..1024 invocations"}},
      {"workgroup of zero",
       [](Parts& f) {
         f.steps[0].spec = {{0, 0}};
       },
       {"function 'axpb' step 0: kernel 'axpb': workgroup size 0x1x1"}},
      {"no outputs",
       [](Parts& f) { f.outputs.clear(); },
       {"function 'axpb' has no outputs (expected at least 1)"}},
      {"no steps",
       [](Parts& f) { f.steps.clear(); },
       {"function 'axpb' has no steps (expected at least 1 kernel)"}},
      {"shape not static",
       [](Parts& f) {
         f.outputs[0].shape = {16, 0};
       },
       {"function 'axpb'", "[16, 0]", "every dimension must be >= 1"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Parts parts = Axpb();
    c.mutate(parts);
    EXPECT_ERROR(parts.Create().status(), kInvalid, c.want);
    EXPECT_ERROR(FunctionFromDef(parts.Def()).status(), kInvalid, c.want);
  }
  // Unchanged, both paths accept it.
  EXPECT_OK(Axpb().Create().status());
  EXPECT_OK(FunctionFromDef(Axpb().Def()).status());
}

// Tests that a step without a kernel is refused, naming the step.
TEST_F(FunctionTest, StepWithoutKernelIsRefused) {
  Parts parts = Axpb();
  parts.steps[0].kernel = nullptr;
  EXPECT_ERROR(parts.Create().status(), kInvalid, "function 'axpb' step 0: no kernel");
}

// Tests that the built-in functions pass Create's checks, fused steps that
// read and write the output included.
TEST_F(FunctionTest, BuiltinFunctionsPass) {
  EXPECT_OK(Function::Elementwise("add", {1024}).status());
  EXPECT_OK(Function::Elementwise("mul", {3, 5}).status());
  EXPECT_OK(Function::Scale({1 << 20}, 0.5f).status());
  EXPECT_OK(Function::Matmul(64, 48, 32).status());
  EXPECT_OK(Function::RepeatedAdd({300}, 4).status());
}

}  // namespace
}  // namespace causeway
