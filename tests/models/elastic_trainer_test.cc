// Elastic training across two island server processes: one killed with
// SIGKILL mid-training leaves the survivor training from the last complete
// step, on the same loss trajectory as a run that lost nothing; restarted at
// its address, the island is admitted back with the current weights.
#include "causeway/models/elastic_trainer.h"

#include <signal.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/client/local_client.h"
#include "causeway/distributed/island_process.h"
#include "causeway/kernels/reference.h"
#include "causeway/models/text_data.h"
#include "causeway/scheduler/island.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_support.h"

namespace causeway::models {
namespace {

using ::testing::HasSubstr;

const std::string kCorpus = std::string(::causeway::testing::DataDir()) + "/kjv-genesis-exodus.txt";

std::unique_ptr<transport::IslandProcess> StartIsland(const std::string& name,
                                                      const std::string& listen = "") {
  std::vector<std::string> args = {::causeway::testing::DeviceFlag(), "--accelerators=1",
                                   ::causeway::testing::ValidationFlag()};
  if (!listen.empty()) args.push_back("--listen=" + listen);
  auto p = transport::IslandProcess::Start(::causeway::testing::CliPath(), name, args);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return nullptr;
  }
  return *std::move(p);
}

TrainOptions TinyOptions() {
  TrainOptions options;
  options.config.d_model = 16;
  options.config.heads = 2;
  options.config.d_ff = 32;
  options.config.layers = 2;
  options.config.seq_len = 8;
  options.layout = TrainLayout{8, 1, 1};
  options.adam.lr = 3e-3f;
  options.eval_batches = 2;
  return options;
}

// Steps in all, and the step after whose loss island b is killed.
constexpr int kSteps = testing::Repeats(12, 8);
constexpr int kKillAfter = 3;

// One accelerator in this process, never interrupted: the trajectory every
// layout follows.
std::vector<double> Uninterrupted(const TextCorpus& corpus) {
  auto rt = ::causeway::testing::MakeRuntime(1);
  auto island = Island::Create(rt.get());
  EXPECT_OK(island.status());
  if (!island.ok()) return {};
  auto client = client::LocalClient::Connect(island->get(), "reference");
  EXPECT_OK(client.status());
  if (!client.ok()) return {};
  auto trainer = Trainer::Create(client->get(), corpus, TinyOptions());
  EXPECT_OK(trainer.status());
  if (!trainer.ok()) return {};
  auto losses = (*trainer)->Train(kSteps);
  EXPECT_OK(losses.status());
  return losses.ok() ? *losses : std::vector<double>{};
}

void ExpectSameTrajectory(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << "step " << i + 1;
  }
}

class ElasticTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(corpus_, TextCorpus::Load(kCorpus));
    want_ = Uninterrupted(corpus_);
    ASSERT_EQ(want_.size(), static_cast<size_t>(kSteps));
    a_ = StartIsland("isl-a");
    b_ = StartIsland("isl-b");
    ASSERT_TRUE(a_ != nullptr && b_ != nullptr);
  }

  ElasticOptions Options(uint64_t admit_every) {
    ElasticOptions e;
    e.islands = {a_->address(), b_->address()};
    e.controller.connection.peer_timeout = absl::Seconds(5);  // a kill shows at once
    e.admit_every = admit_every;
    e.timeout = absl::Seconds(60);
    e.report = [this](const std::string& line) {
      std::printf("elastic: %s\n", line.c_str());
      reports_.push_back(line);
    };
    return e;
  }

  // Trains kSteps on `trainer`, killing island b (SIGKILL) as step
  // kKillAfter's loss is heard, when later steps are queued and running.
  std::vector<double> TrainThroughAKill(ElasticTrainer& trainer) {
    auto killed = trainer.Train(kSteps, [&](const StepReport& r) {
      if (r.step == kKillAfter) b_->Signal(SIGKILL);
    });
    EXPECT_OK(killed.status());
    return killed.ok() ? *killed : std::vector<double>{};
  }

  TextCorpus corpus_;
  std::vector<double> want_;
  std::unique_ptr<transport::IslandProcess> a_, b_;
  std::vector<std::string> reports_;
};

// Tests that training finishes on the survivor after the other island is
// killed mid-step, from the last complete step, with the same losses
// (within the layouts' tolerance) as a run that lost nothing, and that the
// loss is reported on one line naming the island, the step and the batch.
TEST_F(ElasticTrainerTest, TrainingFinishesOnTheSurvivor) {
  ASSERT_OK_AND_ASSIGN(auto trainer,
                       ElasticTrainer::Create(corpus_, TinyOptions(), Options(/*admit_every=*/1000)));
  const std::string b_address = b_->address();
  const std::vector<double> got = TrainThroughAKill(*trainer);
  ExpectSameTrajectory(got, want_);
  EXPECT_EQ(trainer->members(), std::vector<std::string>{a_->address()});
  EXPECT_EQ(trainer->lost(), std::vector<std::string>{b_address});
  ASSERT_EQ(reports_.size(), 1u) << absl::StrJoin(reports_, "\n");
  EXPECT_THAT(reports_[0], HasSubstr(absl::StrCat("lost 'isl-b' at ", b_address)));
  EXPECT_THAT(reports_[0],
              HasSubstr(absl::StrCat("on 1 island (", a_->address(), "), batch 8 (8 per island)")));
  EXPECT_EQ(trainer->trainer().steps_done(), static_cast<uint64_t>(kSteps));
}

// Tests that an island restarted at its address is admitted back at a step
// boundary with the current weights (both replicas then hold the same
// weights bit for bit), and that the losses stay on the uninterrupted
// trajectory through the loss and the admission.
TEST_F(ElasticTrainerTest, ARestartedIslandIsAdmittedBack) {
  ASSERT_OK_AND_ASSIGN(auto trainer,
                       ElasticTrainer::Create(corpus_, TinyOptions(), Options(/*admit_every=*/2)));
  const std::string b_address = b_->address();
  std::unique_ptr<transport::IslandProcess> restarted;
  auto got = trainer->Train(kSteps, [&](const StepReport& r) {
    if (r.step == kKillAfter) b_->Signal(SIGKILL);
    // Back once the survivor has trained on alone for a while.
    if (r.step == kKillAfter + 2 && restarted == nullptr) restarted = StartIsland("isl-b2", b_address);
  });
  ASSERT_OK(got.status());
  ASSERT_NE(restarted, nullptr);
  ExpectSameTrajectory(*got, want_);
  ASSERT_EQ(reports_.size(), 2u) << absl::StrJoin(reports_, "\n");
  EXPECT_THAT(reports_[0], HasSubstr("on 1 island"));
  EXPECT_THAT(reports_[1], HasSubstr(absl::StrCat("admitted ", b_address, "; on 2 islands (", a_->address(),
                                                  ", ", b_address, "), batch 8 (4 per island)")));
  EXPECT_EQ(trainer->members(), (std::vector<std::string>{a_->address(), b_address}));
  EXPECT_TRUE(trainer->lost().empty());
  ASSERT_OK_AND_ASSIGN(auto on_a, trainer->trainer().Weights(0));
  ASSERT_OK_AND_ASSIGN(auto on_b, trainer->trainer().Weights(1));
  EXPECT_EQ(on_a, on_b);
}

// Tests that a spare island is admitted in place of a lost one that does
// not come back, and that a checkpoint of one accelerator resumes onto the
// islands (the tensors resharded onto each replica's mesh).
TEST_F(ElasticTrainerTest, ASpareTakesALostIslandsPlaceAndCheckpointsResumeOntoIslands) {
  auto spare = StartIsland("isl-spare");
  ASSERT_NE(spare, nullptr);
  // The checkpoint: one accelerator in this process after kKillAfter - 1
  // steps, from the same run as want_.
  CheckpointState saved;
  {
    auto rt = ::causeway::testing::MakeRuntime(1);
    ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
    ASSERT_OK_AND_ASSIGN(auto client, client::LocalClient::Connect(island.get(), "checkpoint"));
    ASSERT_OK_AND_ASSIGN(auto one, Trainer::Create(client.get(), corpus_, TinyOptions()));
    ASSERT_OK(one->Train(kKillAfter - 1).status());
    ASSERT_OK_AND_ASSIGN(saved, one->Snapshot());
  }
  ElasticOptions e = Options(/*admit_every=*/2);
  e.spares = {spare->address()};
  ASSERT_OK_AND_ASSIGN(auto trainer, ElasticTrainer::Create(corpus_, TinyOptions(), e));
  ASSERT_OK(trainer->trainer().Restore(saved));
  const std::string b_address = b_->address();
  auto got = trainer->Train(kSteps - (kKillAfter - 1), [&](const StepReport& r) {
    if (r.step == kKillAfter) b_->Signal(SIGKILL);
  });
  ASSERT_OK(got.status());
  ExpectSameTrajectory(*got, std::vector<double>(want_.begin() + (kKillAfter - 1), want_.end()));
  ASSERT_EQ(reports_.size(), 2u) << absl::StrJoin(reports_, "\n");
  EXPECT_THAT(reports_[0], HasSubstr(absl::StrCat("lost 'isl-b' at ", b_address)));
  EXPECT_THAT(reports_[1], HasSubstr(absl::StrCat("admitted ", spare->address(), "; on 2 islands")));
  EXPECT_EQ(trainer->members(), (std::vector<std::string>{a_->address(), spare->address()}));
  EXPECT_TRUE(trainer->lost().empty());
}

}  // namespace
}  // namespace causeway::models
