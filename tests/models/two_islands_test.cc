// The Transformer LM trained data parallel across two island server
// processes (`causeway island`) through a controller: each island takes half
// of every batch and the gradients cross between them over DCN inside the
// step program. Checked step by step against one accelerator in this process,
// and against an island killed mid-training.
#include <signal.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "causeway/client/local_client.h"
#include "causeway/client/remote_client.h"
#include "causeway/distributed/controller.h"
#include "causeway/distributed/island_process.h"
#include "causeway/kernels/reference.h"
#include "causeway/models/text_data.h"
#include "causeway/models/trainer.h"
#include "causeway/scheduler/island.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_support.h"

namespace causeway::models {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::HasSubstr;

const std::string kCorpus = std::string(::causeway::testing::DataDir()) + "/kjv-genesis-exodus.txt";

std::unique_ptr<transport::IslandProcess> StartIsland(const std::string& name, int accelerators) {
  auto p = transport::IslandProcess::Start(
      ::causeway::testing::CliPath(), name,
      {::causeway::testing::DeviceFlag(), absl::StrCat("--accelerators=", accelerators),
       ::causeway::testing::ValidationFlag()});
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return nullptr;
  }
  return *std::move(p);
}

TrainOptions TinyOptions(std::vector<int> stages, uint32_t replicas) {
  TrainOptions options;
  options.config.d_model = 16;
  options.config.heads = 2;
  options.config.d_ff = 32;
  options.config.layers = 4;
  options.config.seq_len = 8;
  options.layout = TrainLayout{8, 1, replicas};
  options.stages = std::move(stages);
  options.adam.lr = 3e-3f;
  options.eval_batches = 2;
  return options;
}

// Tests that two islands of two accelerators each (data parallel inside
// each over ICI, and across them over DCN) follow one accelerator's losses
// and weights step by step, that both islands end with the same weights bit
// for bit, and that evaluation runs on the islands.
TEST(TwoIslandsTest, DataParallelAcrossIslandsFollowsOneAccelerator) {
  // Every step runs the same host code: fewer under a sanitizer.
  constexpr int kSteps = testing::Repeats(5, 2);
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  std::vector<double> want_losses;
  std::vector<std::vector<float>> want_weights;
  double want_held_out = 0;
  {
    auto rt = MakeRuntime(1);
    ASSERT_NE(rt, nullptr);
    ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
    ASSERT_OK_AND_ASSIGN(auto client, client::LocalClient::Connect(island.get(), "one"));
    ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(client.get(), corpus, TinyOptions({1}, 1)));
    ASSERT_OK_AND_ASSIGN(want_losses, trainer->Train(kSteps));
    ASSERT_OK_AND_ASSIGN(want_weights, trainer->Weights());
    ASSERT_OK_AND_ASSIGN(want_held_out, trainer->Evaluate());
  }

  auto a = StartIsland("isl-a", 2), b = StartIsland("isl-b", 2);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_OK_AND_ASSIGN(auto client, client::RemoteClient::Connect({a->address(), b->address()}));
  ASSERT_OK_AND_ASSIGN(std::vector<client::Device> devices, client->Devices());
  ASSERT_EQ(devices.size(), 4u);
  for (const client::Device& d : devices) {
    EXPECT_EQ(d.island_name, d.island == 0 ? "isl-a" : "isl-b");
    EXPECT_EQ(d.capabilities.kind, DeviceKind::kCpu);  // the kind the step's kernels are planned for
  }
  ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(client.get(), corpus, TinyOptions({2}, 2)));
  ASSERT_OK_AND_ASSIGN(std::vector<double> losses, trainer->Train(kSteps));
  ASSERT_EQ(losses.size(), want_losses.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], want_losses[i], 1e-4 * std::abs(want_losses[i])) << "step " << i + 1;
  }
  ASSERT_OK_AND_ASSIGN(auto on_a, trainer->Weights(0));
  ASSERT_OK_AND_ASSIGN(auto on_b, trainer->Weights(1));
  ASSERT_EQ(on_a.size(), want_weights.size());
  ASSERT_EQ(on_b.size(), want_weights.size());
  for (size_t i = 0; i < want_weights.size(); ++i) {
    EXPECT_LT(reference::MaxRelativeError(on_a[i], want_weights[i]), 1e-3) << "tensor " << i;
    EXPECT_EQ(on_a[i], on_b[i]) << "tensor " << i << " differs between the islands";
  }
  ASSERT_OK_AND_ASSIGN(double held_out, trainer->Evaluate());
  EXPECT_NEAR(held_out, want_held_out, 1e-3 * want_held_out);
}

// Tests that killing one island mid-training ends Train with an error naming
// it, promptly, rather than a hang, and that the other island is left
// serving.
TEST(TwoIslandsTest, AnIslandKilledMidTrainingFailsTheStep) {
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  auto a = StartIsland("isl-a", 1), b = StartIsland("isl-b", 1);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  transport::ControllerOptions options;
  options.connection.peer_timeout = absl::Seconds(5);  // a kill shows at once; silence is not the test
  ASSERT_OK_AND_ASSIGN(auto client, client::RemoteClient::Connect({a->address(), b->address()}, options));
  transport::Controller* controller = &client->controller();
  ASSERT_OK_AND_ASSIGN(auto trainer,
                       Trainer::Create(client.get(), corpus, TinyOptions({1}, 2), absl::Seconds(60)));
  ASSERT_OK(trainer->Train(2).status());
  b->Signal(SIGKILL);
  const absl::Time start = absl::Now();
  auto more = trainer->Train(50);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kUnavailable) << more.status();
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr(absl::StrCat("island 1 ('isl-b' at ", b->address(), ") lost: ")));
  EXPECT_OK(controller->island_status(0));
  // Island a still serves this controller.
  ASSERT_OK_AND_ASSIGN(transport::RemoteMesh mesh, controller->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(transport::RemoteArray x, controller->CreateArray(mesh, {4}, DType::kF32));
  const float values[4] = {1, 2, 3, 4};
  ASSERT_OK(controller->Upload(x, values, sizeof(values)));
  float back[4] = {};
  ASSERT_OK(controller->Download(x, back, sizeof(back), absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(back[3], 4.0f);
}

}  // namespace
}  // namespace causeway::models
