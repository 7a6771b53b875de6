// An executable that is dropped gives back its memory: its instances'
// intermediates and the arrays of its last runs, with no Close or Release
// (an instance keeps only its last run's completion, not the run, which
// holds the executable).
#include <memory>
#include <vector>

#include "causeway/runtime/accelerator.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

TEST(ExecutableLifetimeTest, DroppedExecutableGivesBackItsMemory) {
  auto rt = testing::MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto client, island->Connect("lifetime"));
  ASSERT_OK_AND_ASSIGN(auto mesh, client->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(auto add, Function::Elementwise("add", {1024}));
  auto in_use = [&] { return rt->accelerator(0)->memory_in_use() + rt->accelerator(1)->memory_in_use(); };
  const uint64_t baseline = in_use();
  for (int runs : {1, 3, 8}) {
    SCOPED_TRACE(runs);
    {
      // c is an intermediate (an instance's buffer); d the output, fed back
      // as the next run's input, so runs chain through the executable.
      ProgramBuilder b("chain");
      b.Parameter("a", mesh, {1024}, DType::kF32);
      b.Parameter("b", mesh, {1024}, DType::kF32);
      b.Call("first", add, mesh, {"a", "b"}, {"c"});
      b.Call("second", add, mesh, {"c", "b"}, {"d"});
      b.Output("d");
      ASSERT_OK_AND_ASSIGN(auto program, b.Build());
      ASSERT_OK_AND_ASSIGN(auto executable, client->Load(program));
      ASSERT_OK_AND_ASSIGN(auto x, client->CreateArray(mesh, {1024}, DType::kF32));
      ASSERT_OK_AND_ASSIGN(auto y, client->CreateArray(mesh, {1024}, DType::kF32));
      std::vector<float> ones(1024, 1.0f);
      ASSERT_OK(x->Upload(ones.data(), ones.size() * 4));
      ASSERT_OK(y->Upload(ones.data(), ones.size() * 4));
      ArrayRef in = x;
      for (int r = 0; r < runs; ++r) {
        ASSERT_OK_AND_ASSIGN(Execution run, client->Execute(executable, {in, y}));
        in = run.outputs[0];
      }
      std::vector<float> out(1024);
      ASSERT_OK(in->Download(out.data(), out.size() * 4));
      EXPECT_EQ(out[0], 1.0f + 2.0f * runs);
      EXPECT_GT(client->bytes_held(), 0u);
    }
    EXPECT_EQ(client->bytes_held(), 0u);
    // Submissions release what they bind when they retire.
    ASSERT_OK(rt->accelerator(0)->Flush());
    ASSERT_OK(rt->accelerator(1)->Flush());
    EXPECT_EQ(in_use(), baseline);
  }
}

}  // namespace
}  // namespace causeway
