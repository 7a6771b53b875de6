// Programs end to end: build, validate, lower, run on the gang scheduler.
#include "causeway/scheduler/program.h"

#include "causeway/kernels/reference.h"
#include "causeway/scheduler/island.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::HasSubstr;

// Builds a chain over `stages` meshes of `width` accelerators each: stage s
// computes x = x * W_s (split by rows over its mesh: each device a block of
// rows), with transfers between meshes. Returns the program.
struct Chain {
  std::shared_ptr<const Program> program;
  std::vector<ArrayRef> weights;
  std::vector<std::vector<float>> host_weights;
};

// Tests that chained programs over 1, 2, 4 and 8 accelerators equal a CPU
// reference, for several runs with new inputs.
TEST(ProgramTest, ChainedProgramsMatchCpu) {
  for (int n : {1, 2, 4, 8}) {
    SCOPED_TRACE(n);
    auto rt = MakeRuntime(n);
    ASSERT_NE(rt, nullptr);
    ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
    ASSERT_OK_AND_ASSIGN(auto client, island->Connect("c"));
    // Two meshes of n/2 devices (or one of 1), alternating: stages ping-pong
    // between them, so every edge between stages is a transfer.
    int width = n == 1 ? 1 : n / 2;
    ASSERT_OK_AND_ASSIGN(auto m0, client->AllocateMesh({width}));
    std::shared_ptr<Mesh> m1 = m0;
    if (n > 1) {
      ASSERT_OK_AND_ASSIGN(m1, client->AllocateMesh({width}));
    }
    const uint32_t rows = 8 * width, k = 16;
    ASSERT_OK_AND_ASSIGN(auto mm, Function::Matmul(rows / width, k, k));
    ProgramBuilder b("chain");
    b.Parameter("x0", m0, {rows, k}, DType::kF32, Sharding::Split(0));
    std::vector<std::vector<float>> w;
    std::vector<ArrayRef> w_arrays;
    const int stages = 4;
    for (int s = 0; s < stages; ++s) {
      auto mesh = s % 2 == 0 ? m0 : m1;
      std::string wn = absl::StrCat("w", s);
      b.Parameter(wn, mesh, {k, k}, DType::kF32, Sharding::Replicated());
      b.Call(absl::StrCat("stage", s), mm, mesh, {absl::StrCat("x", s), wn}, {absl::StrCat("x", s + 1)});
      w.push_back(reference::RandomFloats(k * k, 50 + s, -0.3f, 0.3f));
      ASSERT_OK_AND_ASSIGN(auto wa, client->CreateArray(mesh, {k, k}, DType::kF32, Sharding::Replicated(), wn));
      ASSERT_OK(wa->Upload(w.back().data(), w.back().size() * 4));
      w_arrays.push_back(wa);
    }
    b.Output(absl::StrCat("x", stages));
    ASSERT_OK_AND_ASSIGN(auto program, b.Build());
    int transfers = 0;
    for (const auto& s : program->steps()) transfers += s.kind == ProgramStep::kTransfer;
    EXPECT_EQ(transfers, n == 1 ? 0 : 3) << program->DebugString();  // x1, x2, x3 cross meshes
    ASSERT_OK_AND_ASSIGN(auto exe, client->Load(program));
    for (int r = 0; r < 3; ++r) {
      std::vector<float> x = reference::RandomFloats(rows * k, 7 + r);
      ASSERT_OK_AND_ASSIGN(auto xa, client->CreateArray(m0, {rows, k}, DType::kF32, Sharding::Split(0), "x0"));
      ASSERT_OK(xa->Upload(x.data(), x.size() * 4));
      std::vector<ArrayRef> inputs = {xa};
      for (auto& wa : w_arrays) inputs.push_back(wa);
      ASSERT_OK_AND_ASSIGN(Execution run, client->Execute(exe, inputs));
      ASSERT_OK(run.Await());
      std::vector<float> got(rows * k);
      ASSERT_OK(run.outputs[0]->Download(got.data(), got.size() * 4));
      for (int s = 0; s < stages; ++s) x = reference::Matmul(x, w[s], rows, k, k);
      EXPECT_LT(reference::MaxRelativeError(got, x), 1e-4);
    }
  }
}

}  // namespace
}  // namespace causeway
