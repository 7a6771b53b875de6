// Validation of programs, loads and runs: every bad program, mesh or input is
// refused with an error that names the node, parameter or value at fault; a
// good program lowers to the steps expected.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kFailedPrecondition = absl::StatusCode::kFailedPrecondition;
constexpr auto kPermissionDenied = absl::StatusCode::kPermissionDenied;

// A 4-accelerator island with one client holding two 1-D meshes of 2, and the
// built-in functions over shards of [4].
class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(4);
    ASSERT_NE(rt_, nullptr);
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(rt_.get()));
    ASSERT_OK_AND_ASSIGN(client_, island_->Connect("owner"));
    ASSERT_OK_AND_ASSIGN(m0_, client_->AllocateMesh({2}));
    ASSERT_OK_AND_ASSIGN(m1_, client_->AllocateMesh({2}));
    ASSERT_OK_AND_ASSIGN(scale_, Function::Scale({4}, 2.0f));       // f32[4] -> f32[4]
    ASSERT_OK_AND_ASSIGN(add_, Function::Elementwise("add", {4}));  // f32[4], f32[4] -> f32[4]
  }
  void TearDown() override {
    client_.reset();
    island_.reset();
  }

  // x: f32[8] split over `mesh` (a [4] shard per device) -> scale -> y.
  ProgramBuilder Simple(const std::shared_ptr<Mesh>& mesh) {
    ProgramBuilder b("simple");
    b.Parameter("x", mesh, {8}, DType::kF32, Sharding::Split(0));
    b.Call("work", scale_, mesh, {"x"}, {"y"});
    b.Output("y");
    return b;
  }

  // An f32[8] array split over `mesh` holding 0, 1, ..., 7.
  ArrayRef Input(const std::shared_ptr<Client>& client, const std::shared_ptr<Mesh>& mesh,
                 const std::string& label = "x") {
    auto a = client->CreateArray(mesh, {8}, DType::kF32, Sharding::Split(0), label);
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return nullptr;
    std::vector<float> host = {0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT_OK((*a)->Upload(host.data(), host.size() * 4));
    return *a;
  }

  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Island> island_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Mesh> m0_, m1_;
  std::shared_ptr<const Function> scale_, add_;
};

// --- graph structure ---------------------------------------------------------

// Tests that a cycle (a reads y from b, b reads x from a) names both nodes.
TEST_F(ValidationTest, CycleNamesBothNodes) {
  ProgramBuilder b("loop");
  b.Parameter("p", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("a", add_, m0_, {"p", "y"}, {"x"});
  b.Call("b", scale_, m0_, {"x"}, {"y"});
  b.Output("x");
  EXPECT_ERROR(b.Build().status(), kInvalid, "cycle", "'a'", "'b'");

  // A node that reads its own output is a cycle of one.
  ProgramBuilder self("self");
  self.Parameter("p", m0_, {8}, DType::kF32, Sharding::Split(0));
  self.Call("fine", scale_, m0_, {"p"}, {"q"});
  self.Call("ouroboros", add_, m0_, {"q", "r"}, {"r"});
  self.Output("r");
  absl::Status s = self.Build().status();
  EXPECT_ERROR(s, kInvalid, "cycle", "'ouroboros'");
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("'fine'")));
}

// Tests that reading a value nobody produces names the node and the value.
TEST_F(ValidationTest, UnproducedValueNamesNode) {
  ProgramBuilder b("ghost");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("reader", add_, m0_, {"x", "phantom"}, {"y"});
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kInvalid, "'reader'", "'phantom'", "no parameter or node produces");
}

// Tests that a value produced twice (by two nodes, or by a node and a
// parameter, or twice by one node) names the node and the first producer.
TEST_F(ValidationTest, ValueProducedTwiceNamesNodes) {
  ProgramBuilder b("twice");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("first", scale_, m0_, {"x"}, {"y"});
  b.Call("second", scale_, m0_, {"x"}, {"y"});
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kInvalid, "'second'", "'y'", "already produced", "'first'");

  ProgramBuilder p("over-param");
  p.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  p.Call("clobber", scale_, m0_, {"x"}, {"x"});
  p.Output("x");
  EXPECT_ERROR(p.Build().status(), kInvalid, "'clobber'", "'x'", "already produced by a parameter");

  ProgramBuilder d("dup-param");
  d.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  d.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  d.Call("work", scale_, m0_, {"x"}, {"y"});
  d.Output("y");
  EXPECT_ERROR(d.Build().status(), kInvalid, "parameter 'x'", "twice");
}

// Tests that two nodes of one name are refused, naming it.
TEST_F(ValidationTest, DuplicateNodeName) {
  ProgramBuilder b("dup");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("same", scale_, m0_, {"x"}, {"y"});
  b.Call("same", scale_, m0_, {"y"}, {"z"});
  b.Output("z");
  EXPECT_ERROR(b.Build().status(), kInvalid, "node 'same'", "twice");

  ProgramBuilder n("nameless");
  n.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  n.Call("", scale_, m0_, {"x"}, {"y"});
  n.Output("y");
  EXPECT_ERROR(n.Build().status(), kInvalid, "no name");

  ProgramBuilder f("no-function");
  f.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  f.Call("empty", nullptr, m0_, {"x"}, {"y"});
  f.Output("y");
  EXPECT_ERROR(f.Build().status(), kInvalid, "node 'empty'", "no function");
}

// Tests that outputs must name a computed value and that a program needs one.
TEST_F(ValidationTest, OutputsMustBeKnownAndPresent) {
  ProgramBuilder unknown = Simple(m0_);
  unknown.Output("nowhere");
  EXPECT_ERROR(unknown.Build().status(), kInvalid, "'nowhere'", "program 'simple'");

  ProgramBuilder none("silent");
  none.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  none.Call("work", scale_, m0_, {"x"}, {"y"});
  EXPECT_ERROR(none.Build().status(), kInvalid, "program 'silent'", "no outputs");

  ProgramBuilder empty("empty");
  EXPECT_ERROR(empty.Build().status(), kInvalid, "no outputs");

  ProgramBuilder param("passthrough");
  param.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  param.Call("work", scale_, m0_, {"x"}, {"y"});
  param.Output("x");
  EXPECT_ERROR(param.Build().status(), kInvalid, "parameter 'x'");
}

// Tests that a value listed twice as an output is either refused naming it or
// delivered correctly in both places (never an output that nothing writes).
TEST_F(ValidationTest, OutputListedTwice) {
  ProgramBuilder b = Simple(m0_);
  b.Output("y");
  auto program = b.Build();
  if (!program.ok()) {
    EXPECT_ERROR(program.status(), kInvalid, "'y'");
    return;
  }
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(*program));
  ArrayRef x = Input(client_, m0_);
  ASSERT_NE(x, nullptr);
  ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x}));
  ASSERT_OK(run.Await());
  ASSERT_EQ(run.outputs.size(), 2u);
  for (int o = 0; o < 2; ++o) {
    std::vector<float> y(8, -1.0f);
    ASSERT_OK(run.outputs[o]->Download(y.data(), y.size() * 4));
    EXPECT_THAT(y, ElementsAre(0, 2, 4, 6, 8, 10, 12, 14)) << "output " << o;
  }
}

// --- types and shapes ----------------------------------------------------------

// Tests that a shard of [8] into a function over [4] names the node, the
// input and both shapes.
TEST_F(ValidationTest, ShapeMismatchNamesNode) {
  ProgramBuilder b("shapes");
  b.Parameter("big", m0_, {16}, DType::kF32, Sharding::Split(0));  // [8] per device
  b.Call("squeeze", scale_, m0_, {"big"}, {"y"});
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kInvalid, "node 'squeeze'", "'big'", "[8]", "f32[4]");

  // Replicated [8]: each device holds all of it, also [8].
  ProgramBuilder r("replicated");
  r.Parameter("whole", m0_, {8}, DType::kF32, Sharding::Replicated());
  r.Call("squeeze", scale_, m0_, {"whole"}, {"y"});
  r.Output("y");
  EXPECT_ERROR(r.Build().status(), kInvalid, "node 'squeeze'", "'whole'", "[8]", "f32[4]");

  // The second input of a node, from an upstream node.
  ProgramBuilder s("second-input");
  s.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  s.Parameter("w", m0_, {4, 2}, DType::kF32, Sharding::Split(0));  // [2, 2] per device
  s.Call("ok", scale_, m0_, {"x"}, {"y"});
  s.Call("sum", add_, m0_, {"y", "w"}, {"z"});
  s.Output("z");
  EXPECT_ERROR(s.Build().status(), kInvalid, "node 'sum'", "input 1", "'w'", "[2, 2]");
}

// Tests that an i32 value into an f32 function names the node and both types.
TEST_F(ValidationTest, DTypeMismatchNamesNode) {
  ProgramBuilder b("types");
  b.Parameter("ints", m0_, {8}, DType::kI32, Sharding::Split(0));
  b.Call("convert", scale_, m0_, {"ints"}, {"y"});
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kInvalid, "node 'convert'", "'ints'", "i32", "f32");

  ProgramBuilder h("halves");
  h.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  h.Parameter("h", m0_, {8}, DType::kF16, Sharding::Split(0));
  h.Call("mix", add_, m0_, {"x", "h"}, {"y"});
  h.Output("y");
  EXPECT_ERROR(h.Build().status(), kInvalid, "node 'mix'", "input 1", "f16");
}

// Tests that wrong numbers of inputs or outputs name the node and the counts.
TEST_F(ValidationTest, WrongArityNamesNode) {
  ProgramBuilder in("inputs");
  in.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  in.Call("lonely", add_, m0_, {"x"}, {"y"});
  in.Output("y");
  EXPECT_ERROR(in.Build().status(), kInvalid, "node 'lonely'", "takes 2 inputs, given 1");

  ProgramBuilder more("more-inputs");
  more.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  more.Call("crowded", scale_, m0_, {"x", "x"}, {"y"});
  more.Output("y");
  EXPECT_ERROR(more.Build().status(), kInvalid, "node 'crowded'", "takes 1 inputs, given 2");

  ProgramBuilder out("outputs");
  out.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  out.Call("split", scale_, m0_, {"x"}, {"y", "z"});
  out.Output("y");
  EXPECT_ERROR(out.Build().status(), kInvalid, "node 'split'", "gives 1 outputs, named 2");

  ProgramBuilder none("no-outputs");
  none.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  none.Call("sink", scale_, m0_, {"x"}, {});
  none.Output("x");
  EXPECT_ERROR(none.Build().status(), kInvalid, "node 'sink'", "gives 1 outputs, named 0");
}

// Tests that shapes that are not static (a dimension 0 or negative) are
// refused by Function::Create, by parameters and by arrays, saying so.
TEST_F(ValidationTest, DataDependentShapesAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto kernel, BuiltinKernel("scale"));
  ScaleParams params{4, 2.0f};
  std::vector<uint8_t> pc(sizeof(params));
  std::memcpy(pc.data(), &params, sizeof(params));
  auto make = [&](Shape in, Shape out, std::vector<TensorSpec> scratch = {}) {
    return Function::Create("dynamic", {{in, DType::kF32}}, {{out, DType::kF32}}, std::move(scratch),
                            {{kernel, {0, 1}, pc, {1, 1, 1}, {}}});
  };
  // The same function with static shapes is fine: the refusals are about shapes.
  EXPECT_OK(make({4}, {4}).status());
  for (const Shape& bad : std::vector<Shape>{{0}, {4, 0}, {-1}, {2, -4}, {-1, -4}}) {
    SCOPED_TRACE(ShapeString(bad));
    EXPECT_ERROR(make(bad, {4}).status(), kInvalid, "function 'dynamic'", "static", ShapeString(bad));
    EXPECT_ERROR(make({4}, bad).status(), kInvalid, "function 'dynamic'", "static");
    EXPECT_ERROR(make({4}, {4}, {{bad, DType::kF32}}).status(), kInvalid, "function 'dynamic'", "static");
  }

  ProgramBuilder b("dynamic-param");
  b.Parameter("rows", m0_, {0, 4}, DType::kF32, Sharding::Replicated());
  b.Call("work", scale_, m0_, {"rows"}, {"y"});
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kInvalid, "parameter 'rows'", "static");

  auto a = client_->CreateArray(m0_, {-8}, DType::kF32, Sharding::Split(0));
  EXPECT_ERROR(a.status(), kInvalid, "static");
}

// Tests that ShardShape names the axis that does not split evenly, and that a
// parameter with such a split is refused naming it.
TEST_F(ValidationTest, UnevenSplitNamesAxis) {
  ASSERT_OK_AND_ASSIGN(auto grid, client_->AllocateMesh({2, 2}));
  EXPECT_ERROR(ShardShape({6, 5}, Sharding::Split(1), *m0_).status(), kInvalid, "axis 1", "[6, 5]",
               "2 shards");
  EXPECT_ERROR(ShardShape({3, 8}, Sharding::Split(0, 1), *grid).status(), kInvalid, "axis 0", "[3, 8]");
  EXPECT_ERROR(ShardShape({4, 4}, Sharding::Split(2), *m0_).status(), kInvalid, "no axis 2");
  EXPECT_ERROR(ShardShape({4, 4}, Sharding::Split(0, 1), *m0_).status(), kInvalid, "no axis 1");
  EXPECT_ERROR(ShardShape({4, 4}, Sharding::Split(0, -1), *m0_).status(), kInvalid, "no axis -1");
  // Even splits give the piece.
  ASSERT_OK_AND_ASSIGN(Shape piece, ShardShape({6, 8}, Sharding::Split(1, 1), *grid));
  EXPECT_THAT(piece, ElementsAre(6, 4));
  ASSERT_OK_AND_ASSIGN(piece, ShardShape({6, 8}, Sharding::Replicated(), *grid));
  EXPECT_THAT(piece, ElementsAre(6, 8));
  EXPECT_THAT(GlobalShape({6, 4}, Sharding::Split(1, 1), *grid), ElementsAre(6, 8));

  ProgramBuilder b("uneven");
  b.Parameter("odd", m0_, {7}, DType::kF32, Sharding::Split(0));
  b.Call("work", scale_, m0_, {"odd"}, {"y"});
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kInvalid, "parameter 'odd'", "axis 0", "[7]");
}

// Tests that an explicit output sharding that does not fit the node's mesh
// is refused naming the node and the output.
TEST_F(ValidationTest, BadOutputShardingNamesNode) {
  ProgramBuilder b("bad-out");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("spread", scale_, m0_, {"x"}, {"y"}, {Sharding::Split(0, /*mesh_axis=*/1)});  // m0 is 1-D
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kInvalid, "node 'spread'", "'y'", "no axis 1");

  ProgramBuilder r("bad-rank");
  r.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  r.Call("widen", scale_, m0_, {"x"}, {"y"}, {Sharding::Split(/*array_axis=*/1)});  // y is 1-D
  r.Output("y");
  EXPECT_ERROR(r.Build().status(), kInvalid, "node 'widen'", "'y'", "no axis 1");

  // A fitting explicit sharding is honoured: the [4] shards gathered
  // replicated make a replicated [4].
  ProgramBuilder ok("good-out");
  ok.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  ok.Call("keep", scale_, m0_, {"x"}, {"y"}, {Sharding::Replicated()});
  ok.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, ok.Build());
  const ProgramValue& y = program->values()[program->FindValue("y")];
  EXPECT_THAT(y.shape, ElementsAre(4));
  EXPECT_TRUE(y.sharding.replicated());
}

// --- meshes --------------------------------------------------------------------

// Tests that a mesh released before Build makes Build fail naming the node
// (or the parameter) and the mesh.
TEST_F(ValidationTest, ReleasedMeshBeforeBuild) {
  ASSERT_OK(island_->resources().Release(m1_));
  ProgramBuilder b("late");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("elsewhere", scale_, m1_, {"x"}, {"y"});
  b.Output("y");
  EXPECT_ERROR(b.Build().status(), kFailedPrecondition, "node 'elsewhere'", "unknown mesh",
               m1_->DebugString(), "released");

  EXPECT_ERROR(Simple(m1_).Build().status(), kFailedPrecondition, "parameter 'x'", "unknown mesh",
               "released");

  ProgramBuilder n("null");
  n.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  n.Call("nowhere", scale_, nullptr, {"x"}, {"y"});
  n.Output("y");
  EXPECT_ERROR(n.Build().status(), kInvalid, "node 'nowhere'", "unknown mesh");
}

// Tests that a mesh released after Build fails Load, and after Load fails
// Execute, naming the node and the mesh.
TEST_F(ValidationTest, ReleasedMeshAfterBuildOrLoad) {
  ASSERT_OK_AND_ASSIGN(auto program, Simple(m1_).Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  ArrayRef x = Input(client_, m1_);
  ASSERT_NE(x, nullptr);
  // It runs before the release.
  ASSERT_OK_AND_ASSIGN(Execution first, client_->Execute(exe, {x}));
  ASSERT_OK(first.Await());

  const std::string mesh = m1_->DebugString();
  ASSERT_OK(island_->resources().Release(m1_));
  auto run = client_->Execute(exe, {x});
  EXPECT_ERROR(run.status(), kFailedPrecondition, "node 'work'", mesh, "released");
  EXPECT_ERROR(client_->Load(program).status(), kFailedPrecondition, "node 'work'", "unknown mesh",
               "released");
}

// Tests that a run whose parameter lives on a released mesh (the node reading
// it runs on a live mesh, through a transfer) is refused naming the parameter:
// a released mesh's arrays stop working (see ResourceManager::Release).
TEST_F(ValidationTest, ReleasedParameterMeshFailsExecute) {
  ProgramBuilder b("cross");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("work", scale_, m1_, {"x"}, {"y"});
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  ArrayRef x = Input(client_, m0_);
  ASSERT_NE(x, nullptr);
  ASSERT_OK(island_->resources().Release(m0_));
  auto run = client_->Execute(exe, {x});
  EXPECT_ERROR(run.status(), kFailedPrecondition, "'x'", "released");
  if (run.ok()) (void)run->Await();
}

// Tests that Load refuses a program on a mesh of another client with
// PermissionDenied naming the node.
TEST_F(ValidationTest, ForeignMeshInLoad) {
  ASSERT_OK_AND_ASSIGN(auto intruder, island_->Connect("intruder"));
  ASSERT_OK_AND_ASSIGN(auto program, Simple(m0_).Build());
  EXPECT_ERROR(intruder->Load(program).status(), kPermissionDenied, "node 'work'", "'intruder'",
               m0_->DebugString());
  // The owner may load it.
  EXPECT_OK(client_->Load(program).status());
}

// Tests that Load refuses a program that reads a parameter on another
// client's mesh into a node on the loader's own mesh (a transfer out of memory
// the loader does not hold), naming the parameter.
TEST_F(ValidationTest, ForeignParameterMeshInLoad) {
  ASSERT_OK_AND_ASSIGN(auto intruder, island_->Connect("intruder"));
  // The intruder's own mesh of the same shape, so the node can read x through a transfer.
  ASSERT_OK_AND_ASSIGN(auto own, intruder->AllocateMesh({2}));
  ProgramBuilder b("snoop");
  b.Parameter("secret", m0_, {8}, DType::kF32, Sharding::Split(0));  // the victim's mesh
  b.Call("copy", scale_, own, {"secret"}, {"y"});
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  EXPECT_ERROR(intruder->Load(program).status(), kPermissionDenied, "'secret'");
}

// --- run inputs ------------------------------------------------------------------

// Tests that Execute refuses a released input array, naming the parameter.
TEST_F(ValidationTest, ReleasedInputNamesParameter) {
  ASSERT_OK_AND_ASSIGN(auto program, Simple(m0_).Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  ArrayRef x = Input(client_, m0_, "input-array");
  ASSERT_NE(x, nullptr);
  x->Release();
  EXPECT_ERROR(client_->Execute(exe, {x}).status(), kFailedPrecondition, "parameter 'x'", "'input-array'",
               "released");
}

// Tests that inputs of the wrong count, shape, dtype, sharding or mesh are
// refused naming the parameter, and that a fitting input then runs.
TEST_F(ValidationTest, WrongInputsNameParameter) {
  ProgramBuilder b("two-params");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Parameter("bias", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("sum", add_, m0_, {"x", "bias"}, {"y"});
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  ArrayRef x = Input(client_, m0_);
  ASSERT_NE(x, nullptr);

  EXPECT_ERROR(client_->Execute(exe, {x}).status(), kInvalid, "takes 2 inputs, given 1");
  EXPECT_ERROR(client_->Execute(exe, {x, x, x}).status(), kInvalid, "takes 2 inputs, given 3");
  EXPECT_ERROR(client_->Execute(exe, {x, nullptr}).status(), kInvalid, "parameter 'bias'");

  ASSERT_OK_AND_ASSIGN(auto shape, client_->CreateArray(m0_, {16}, DType::kF32, Sharding::Split(0)));
  EXPECT_ERROR(client_->Execute(exe, {x, shape}).status(), kInvalid, "parameter 'bias'", "[8]", "[16]");
  ASSERT_OK_AND_ASSIGN(auto dtype, client_->CreateArray(m0_, {8}, DType::kI32, Sharding::Split(0)));
  EXPECT_ERROR(client_->Execute(exe, {x, dtype}).status(), kInvalid, "parameter 'bias'", "i32");
  ASSERT_OK_AND_ASSIGN(auto replicated, client_->CreateArray(m0_, {8}, DType::kF32, Sharding::Replicated()));
  EXPECT_ERROR(client_->Execute(exe, {x, replicated}).status(), kInvalid, "parameter 'bias'", "replicated");
  ASSERT_OK_AND_ASSIGN(auto other_mesh, client_->CreateArray(m1_, {8}, DType::kF32, Sharding::Split(0)));
  EXPECT_ERROR(client_->Execute(exe, {x, other_mesh}).status(), kInvalid, "parameter 'bias'",
               m1_->DebugString());
  EXPECT_ERROR(client_->Execute(exe, {other_mesh, x}).status(), kInvalid, "parameter 'x'");

  // The right input runs: y = x + x.
  ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x, x}));
  ASSERT_OK(run.Await());
  std::vector<float> y(8);
  ASSERT_OK(run.outputs[0]->Download(y.data(), y.size() * 4));
  EXPECT_THAT(y, ElementsAre(0, 2, 4, 6, 8, 10, 12, 14));
}

// Tests that an array of another client is refused, naming the parameter,
// and that an executable of another client cannot be run.
TEST_F(ValidationTest, ForeignInputIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto program, Simple(m0_).Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  ASSERT_OK_AND_ASSIGN(auto other, island_->Connect("other"));
  ASSERT_OK_AND_ASSIGN(auto other_mesh, other->AllocateMesh({2}));
  ArrayRef theirs = Input(other, other_mesh);
  ASSERT_NE(theirs, nullptr);
  EXPECT_ERROR(client_->Execute(exe, {theirs}).status(), kPermissionDenied, "parameter 'x'",
               "another client");
  ArrayRef mine = Input(client_, m0_);
  EXPECT_ERROR(other->Execute(exe, {mine}).status(), kPermissionDenied, "'other'");
}

// Tests that a closed client can neither load nor run, and says so by name.
TEST_F(ValidationTest, ClosedClientIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto program, Simple(m0_).Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  ArrayRef x = Input(client_, m0_);
  ASSERT_NE(x, nullptr);
  client_->Close();
  EXPECT_ERROR(client_->Execute(exe, {x}).status(), kFailedPrecondition, "client 'owner'", "closed");
  EXPECT_ERROR(client_->Load(program).status(), kFailedPrecondition, "client 'owner'", "closed");
  EXPECT_TRUE(x->released());
  EXPECT_TRUE(m0_->released());
}

// --- lowering ------------------------------------------------------------------

// Tests that a program spanning two meshes lowers to calls with a transfer
// before the first use of a value on another mesh (one per value and mesh,
// reused), that DebugString shows the transfers, and that it computes the
// right values.
TEST_F(ValidationTest, TransfersLowerToExpectedSteps) {
  ProgramBuilder b("two-meshes");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Parameter("b", m1_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("double", scale_, m0_, {"x"}, {"y"});     // y = 2x on m0
  b.Call("sum", add_, m1_, {"y", "b"}, {"z"});     // y moves to m1; z = 2x + b
  b.Call("again", add_, m1_, {"y", "z"}, {"w"});   // y already on m1: w = 4x + b
  b.Call("back", add_, m0_, {"w", "x"}, {"out"});  // w moves to m0: out = 5x + b
  b.Output("out");
  b.Output("z");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  const std::string debug = program->DebugString();
  SCOPED_TRACE(debug);

  const std::string y_on_m1 = absl::StrCat("y@mesh", m1_->id());
  const std::string w_on_m0 = absl::StrCat("w@mesh", m0_->id());
  std::vector<std::string> nodes;
  std::vector<ProgramStep::Kind> kinds;
  for (const ProgramStep& s : program->steps()) {
    nodes.push_back(s.node);
    kinds.push_back(s.kind);
  }
  EXPECT_THAT(nodes, ElementsAre("double", y_on_m1, "sum", "again", w_on_m0, "back"));
  EXPECT_THAT(kinds, ElementsAre(ProgramStep::kCall, ProgramStep::kTransfer, ProgramStep::kCall,
                                 ProgramStep::kCall, ProgramStep::kTransfer, ProgramStep::kCall));
  const auto& steps = program->steps();
  EXPECT_EQ(steps[0].mesh, m0_);
  EXPECT_EQ(steps[1].mesh, m1_);
  EXPECT_EQ(steps[1].function, nullptr);
  EXPECT_EQ(steps[4].mesh, m0_);
  // The transfers read the original value and write the moved one, which the
  // calls then read.
  const int y = program->FindValue("y"), y1 = program->FindValue(y_on_m1);
  const int w = program->FindValue("w"), w0 = program->FindValue(w_on_m0);
  ASSERT_GE(y1, 0);
  ASSERT_GE(w0, 0);
  EXPECT_THAT(steps[1].inputs, ElementsAre(y));
  EXPECT_THAT(steps[1].outputs, ElementsAre(y1));
  EXPECT_THAT(steps[2].inputs, ElementsAre(y1, program->FindValue("b")));
  EXPECT_THAT(steps[3].inputs, ElementsAre(y1, program->FindValue("z")));
  EXPECT_THAT(steps[4].inputs, ElementsAre(w));
  EXPECT_THAT(steps[5].inputs, ElementsAre(w0, program->FindValue("x")));
  EXPECT_EQ(program->values()[y1].mesh, m1_);
  EXPECT_EQ(program->values()[y1].kind, ProgramValue::kIntermediate);
  EXPECT_THAT(program->values()[y1].shape, ElementsAre(8));
  EXPECT_EQ(program->values()[y1].sharding, Sharding::Split(0));
  EXPECT_THAT(program->parameters(), ElementsAre(program->FindValue("x"), program->FindValue("b")));
  EXPECT_THAT(program->outputs(), ElementsAre(program->FindValue("out"), program->FindValue("z")));
  EXPECT_EQ(program->values()[program->FindValue("z")].kind, ProgramValue::kOutput);

  EXPECT_THAT(debug, HasSubstr(absl::StrCat("transfer ", y_on_m1, " on ", m1_->DebugString(), ": (y) -> (",
                                            y_on_m1, ")")));
  EXPECT_THAT(debug, HasSubstr(absl::StrCat("transfer ", w_on_m0)));
  EXPECT_THAT(debug, HasSubstr("call sum on"));

  // And it runs: out = 5x + b, z = 2x + b (small integers: exact in f32).
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  ArrayRef x = Input(client_, m0_);
  ASSERT_NE(x, nullptr);
  ASSERT_OK_AND_ASSIGN(ArrayRef bias, client_->CreateArray(m1_, {8}, DType::kF32, Sharding::Split(0), "b"));
  std::vector<float> host_b = {100, 200, 300, 400, 500, 600, 700, 800};
  ASSERT_OK(bias->Upload(host_b.data(), host_b.size() * 4));
  for (int r = 0; r < 3; ++r) {
    ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x, bias}));
    ASSERT_OK(run.Await());
    ASSERT_EQ(run.outputs.size(), 2u);
    EXPECT_EQ(run.outputs[0]->mesh(), m0_);
    EXPECT_EQ(run.outputs[1]->mesh(), m1_);
    std::vector<float> out(8), z(8);
    ASSERT_OK(run.outputs[0]->Download(out.data(), out.size() * 4));
    ASSERT_OK(run.outputs[1]->Download(z.data(), z.size() * 4));
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(out[i], 5.0f * i + host_b[i]) << "run " << r << " element " << i;
      EXPECT_EQ(z[i], 2.0f * i + host_b[i]) << "run " << r << " element " << i;
    }
  }
}

// Tests that a parameter read on another mesh is transferred first, and that
// a program on one mesh lowers to calls only, in dependency order (not the
// order the nodes were added).
TEST_F(ValidationTest, LoweringOrdersByDependencies) {
  ProgramBuilder b("param-moves");
  b.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  b.Call("far", scale_, m1_, {"x"}, {"y"});
  b.Call("near", scale_, m0_, {"x"}, {"z"});
  b.Output("y");
  b.Output("z");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  ASSERT_EQ(program->steps().size(), 3u) << program->DebugString();
  EXPECT_EQ(program->steps()[0].kind, ProgramStep::kTransfer);
  EXPECT_EQ(program->steps()[0].node, absl::StrCat("x@mesh", m1_->id()));
  EXPECT_EQ(program->steps()[1].node, "far");
  EXPECT_EQ(program->steps()[2].node, "near");

  ProgramBuilder r("reversed");
  r.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  r.Call("third", add_, m0_, {"b", "a"}, {"c"});
  r.Call("second", scale_, m0_, {"a"}, {"b"});
  r.Call("first", scale_, m0_, {"x"}, {"a"});
  r.Output("c");
  ASSERT_OK_AND_ASSIGN(auto ordered, r.Build());
  std::vector<std::string> nodes;
  for (const ProgramStep& s : ordered->steps()) {
    EXPECT_EQ(s.kind, ProgramStep::kCall) << s.node;
    nodes.push_back(s.node);
  }
  EXPECT_THAT(nodes, ElementsAre("first", "second", "third"));
  EXPECT_THAT(ordered->DebugString(), ::testing::Not(HasSubstr("transfer")));

  // Between meshes of different shapes the transfer reshards to the layout
  // the function takes (here split over the grid's second axis); where no
  // layout fits, the error names the node and the input.
  ASSERT_OK(island_->resources().Release(m1_));
  ASSERT_OK_AND_ASSIGN(auto grid, client_->AllocateMesh({1, 2}));
  ProgramBuilder g("reshard");
  g.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  g.Call("grid-node", scale_, grid, {"x"}, {"y"});
  g.Output("y");
  ASSERT_OK_AND_ASSIGN(auto resharded, g.Build());
  ASSERT_EQ(resharded->steps().size(), 2u) << resharded->DebugString();
  EXPECT_EQ(resharded->steps()[0].kind, ProgramStep::kTransfer);
  EXPECT_EQ(resharded->values()[resharded->steps()[0].outputs[0]].sharding, Sharding::Split(0, 1));
  ASSERT_OK_AND_ASSIGN(auto scale3, Function::Scale({3}, 2.0f));
  ProgramBuilder bad("no-layout");
  bad.Parameter("x", m0_, {8}, DType::kF32, Sharding::Split(0));
  bad.Call("odd-node", scale3, grid, {"x"}, {"y"});
  bad.Output("y");
  EXPECT_ERROR(bad.Build().status(), absl::StatusCode::kInvalidArgument, "node 'odd-node'", "'x'");
}

}  // namespace
}  // namespace causeway
