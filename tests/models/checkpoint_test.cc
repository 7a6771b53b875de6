// Training checkpoints: the file format against bad input (missing,
// truncated, corrupt, hostile sizes), a write that fails halfway leaving the
// previous checkpoint, and trainers on lavapipe resuming bit for bit on the
// same layout and within tolerance on others.
#include "causeway/models/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "causeway/base/fault_injection.h"
#include "causeway/client/local_client.h"
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

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TransformerConfig Tiny(uint32_t vocab) {
  TransformerConfig c;
  c.vocab = vocab;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.layers = 2;
  c.seq_len = 8;
  return c;
}

// A directory of its own under the test's temporary directory, emptied.
std::string FreshDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("checkpoint_test_", getpid(), "_", name);
  fs::remove_all(dir);
  return dir.string();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

// A state of the tiny model at `step` with values that differ per tensor.
CheckpointState SomeState(uint64_t step) {
  CheckpointState s;
  s.config = Tiny(5);
  s.vocabulary = "\n abc";
  s.adam.lr = 3e-3f;
  s.seed = 7;
  s.step = step;
  s.data_state = 0x0123456789abcdefull + step;
  s.batch = 8;
  s.layout = "1 replica of stages {1}, 1 micro-batch";
  const std::vector<ParameterInfo> params = Parameters(s.config);
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = NumElements(params[i].shape);
    s.weights.push_back(reference::RandomFloats(n, 100 * step + i));
    s.m.push_back(reference::RandomFloats(n, 100 * step + i + 1000));
    s.v.push_back(reference::RandomFloats(n, 100 * step + i + 2000));
  }
  return s;
}

void ExpectSameState(const CheckpointState& got, const CheckpointState& want) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.data_state, want.data_state);
  EXPECT_EQ(got.seed, want.seed);
  EXPECT_EQ(got.batch, want.batch);
  EXPECT_EQ(got.vocabulary, want.vocabulary);
  EXPECT_EQ(got.layout, want.layout);
  EXPECT_EQ(got.config.d_model, want.config.d_model);
  EXPECT_EQ(got.config.ln_eps, want.config.ln_eps);
  EXPECT_EQ(got.adam.lr, want.adam.lr);
  EXPECT_EQ(got.adam.beta2, want.adam.beta2);
  EXPECT_EQ(got.weights, want.weights);
  EXPECT_EQ(got.m, want.m);
  EXPECT_EQ(got.v, want.v);
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Tests CRC-32C against its standard check value.
TEST(CheckpointFileTest, Crc32cMatchesTheStandardCheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(Crc32c(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size())),
            0xE3069283u);
}

// Tests that a state survives a write and a read bit for bit, that the
// directory keeps the newest two checkpoints, and that the file may be read
// directly.
TEST(CheckpointFileTest, RoundTripsAndKeepsTheNewestTwo) {
  const std::string dir = FreshDir("roundtrip");
  for (uint64_t step : {10, 20, 30}) {
    ASSERT_OK(WriteCheckpoint(dir, SomeState(step)));
    ASSERT_OK_AND_ASSIGN(CheckpointState back, ReadCheckpoint(dir));
    ExpectSameState(back, SomeState(step));
  }
  EXPECT_EQ(Files(dir), (std::vector<std::string>{"MANIFEST", "step-00000020.ckpt", "step-00000030.ckpt"}));
  ASSERT_OK_AND_ASSIGN(CheckpointState older, ReadCheckpoint(dir + "/step-00000020.ckpt"));
  ExpectSameState(older, SomeState(20));
  // The same step again gets a name of its own: the manifest's file is
  // never rewritten in place.
  ASSERT_OK(WriteCheckpoint(dir, SomeState(30)));
  EXPECT_EQ(Files(dir), (std::vector<std::string>{"MANIFEST", "step-00000030.1.ckpt", "step-00000030.ckpt"}));
  ASSERT_OK_AND_ASSIGN(CheckpointState back, ReadCheckpoint(dir));
  ExpectSameState(back, SomeState(30));
}

// Tests that a missing, truncated, corrupt or inconsistent checkpoint is
// refused with an error naming the file and what is wrong, and that sizes
// past the model's bounds are refused before anything is allocated.
TEST(CheckpointFileTest, RefusesMissingTruncatedCorruptAndHostileCheckpoints) {
  const std::string dir = FreshDir("bad");
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kNotFound, "no checkpoint at " + dir);
  ASSERT_OK(WriteCheckpoint(dir, SomeState(10)));
  const std::string file = dir + "/step-00000010.ckpt", manifest = dir + "/MANIFEST";
  const std::string good = ReadAll(file), good_manifest = ReadAll(manifest);

  WriteAll(file, good.substr(0, good.size() / 2));
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kDataLoss, file, "truncated");
  EXPECT_ERROR(ReadCheckpoint(file).status(), absl::StatusCode::kDataLoss, file, "no checksum at its end");

  std::string flipped = good;
  flipped[good.size() - 100] ^= 0x10;  // a bit of the last tensor
  WriteAll(file, flipped);
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kDataLoss, file, "corrupt");
  WriteAll(file, good);
  ASSERT_OK(ReadCheckpoint(dir).status());

  // A header that claims another step than its manifest.
  WriteAll(manifest, absl::StrReplaceAll(good_manifest, {{"\nstep 10\n", "\nstep 11\n"}}));
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kDataLoss, "step 10; its manifest");
  // A manifest that names a file outside the directory, or none.
  WriteAll(manifest, absl::StrReplaceAll(good_manifest, {{"file step-00000010.ckpt", "file ../x.ckpt"}}));
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kDataLoss, "bad file name '../x.ckpt'");
  WriteAll(manifest, absl::StrReplaceAll(good_manifest, {{"file step-00000010.ckpt", "file step-9.ckpt"}}));
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kNotFound, dir + "/step-9.ckpt");
  WriteAll(manifest, "not a manifest\n");
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kDataLoss,
               "MANIFEST: not a Causeway checkpoint");
  fs::remove(manifest);
  EXPECT_ERROR(ReadCheckpoint(dir).status(), absl::StatusCode::kNotFound, "MANIFEST is missing");

  // A hostile header with a valid checksum: sizes out of bounds, a payload
  // that is not the model's.
  auto with_header = [&](const std::string& from, const std::string& to) {
    std::string body = absl::StrReplaceAll(good.substr(0, good.size() - 16), {{from, to}});
    const uint32_t crc =
        Crc32c(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
    WriteAll(file, body + absl::StrFormat("crc32c %08x\n", crc));
  };
  with_header(" d_model 16 ", " d_model 4000000000 ");
  EXPECT_ERROR(ReadCheckpoint(file).status(), absl::StatusCode::kInvalidArgument, "d_model in 1..8192");
  with_header(" layers 2 ", " layers 200 ");
  EXPECT_ERROR(ReadCheckpoint(file).status(), absl::StatusCode::kDataLoss, "tensors; the model has");
  with_header("\npayload ", "\npayload 1");
  EXPECT_ERROR(ReadCheckpoint(file).status(), absl::StatusCode::kDataLoss, "a payload of 1");
  with_header("\nend\n", "\n");
  EXPECT_ERROR(ReadCheckpoint(file).status(), absl::StatusCode::kDataLoss, "no 'end' line");
}

// Tests that a write failing halfway (the disk full, at the checkpoint file
// or at its manifest) returns the error naming the file, leaves no partial
// file, and leaves the previous checkpoint the directory's newest.
TEST(CheckpointFileTest, AFailedWriteLeavesThePreviousCheckpoint) {
  const std::string dir = FreshDir("failed");
  ASSERT_OK(WriteCheckpoint(dir, SomeState(10)));
  const std::vector<std::string> before = Files(dir);
  // The tiny model's file is one chunk: write 1 is the file, 2 the manifest.
  for (int nth : {1, 2}) {
    SCOPED_TRACE(nth);
    ArmFault(FaultPoint::kFileWrite, nth);
    absl::Status s = WriteCheckpoint(dir, SomeState(20));
    DisarmFaults();
    EXPECT_ERROR(s, absl::StatusCode::kResourceExhausted, "No space left on device",
                 nth == 1 ? "step-00000020.ckpt.tmp" : "MANIFEST.tmp");
    EXPECT_EQ(Files(dir), before);
    ASSERT_OK_AND_ASSIGN(CheckpointState back, ReadCheckpoint(dir));
    ExpectSameState(back, SomeState(10));
  }
  ASSERT_OK(WriteCheckpoint(dir, SomeState(20)));
  ASSERT_OK_AND_ASSIGN(CheckpointState back, ReadCheckpoint(dir));
  EXPECT_EQ(back.step, 20u);
}

// Steps before and after the checkpoint (fewer under a sanitizer).
constexpr int kHalf = testing::Repeats(3, 2);

class TrainerCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = ::causeway::testing::MakeRuntime(2);
    ASSERT_NE(rt_, nullptr);
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(rt_.get()));
    ASSERT_OK_AND_ASSIGN(client_, client::LocalClient::Connect(island_.get(), "checkpoint_test"));
    ASSERT_OK_AND_ASSIGN(
        corpus_, TextCorpus::Load(std::string(::causeway::testing::DataDir()) + "/kjv-genesis-exodus.txt"));
  }

  TrainOptions Options(std::vector<int> stages = {1}, uint32_t micro = 1, uint32_t replicas = 1) const {
    TrainOptions o;
    o.config = Tiny(0);
    o.layout = TrainLayout{8, micro, replicas};
    o.stages = std::move(stages);
    o.adam.lr = 3e-3f;
    return o;
  }

  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Island> island_;
  std::unique_ptr<client::Client> client_;
  TextCorpus corpus_;
};

// Tests that checkpointing does not change training, and that a trainer
// restored from a checkpoint of step k trains on bit for bit as the run
// that wrote it: the same losses, weights and Adam moments.
TEST_F(TrainerCheckpointTest, ResumeOnTheSameLayoutIsBitIdentical) {
  ASSERT_OK_AND_ASSIGN(auto plain, Trainer::Create(client_.get(), corpus_, Options()));
  ASSERT_OK_AND_ASSIGN(std::vector<double> want, plain->Train(2 * kHalf));
  ASSERT_OK_AND_ASSIGN(CheckpointState want_end, plain->Snapshot());

  const std::string dir = FreshDir("resume");
  TrainOptions with = Options();
  with.checkpoint_dir = dir;
  with.checkpoint_every = kHalf;
  ASSERT_OK_AND_ASSIGN(auto writer, Trainer::Create(client_.get(), corpus_, with));
  ASSERT_OK_AND_ASSIGN(std::vector<double> first, writer->Train(kHalf));
  EXPECT_EQ(writer->checkpointed_step(), static_cast<uint64_t>(kHalf));
  ASSERT_OK_AND_ASSIGN(CheckpointState saved, ReadCheckpoint(dir));
  ASSERT_OK_AND_ASSIGN(std::vector<double> second, writer->Train(kHalf));
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_EQ(first, want) << "checkpointing changed training";
  EXPECT_EQ(saved.step, static_cast<uint64_t>(kHalf));
  EXPECT_EQ(saved.vocabulary, corpus_.vocab().chars());

  ASSERT_OK_AND_ASSIGN(auto resumed, Trainer::Create(client_.get(), corpus_, Options()));
  ASSERT_OK(resumed->Restore(saved));
  EXPECT_EQ(resumed->steps_done(), static_cast<uint64_t>(kHalf));
  ASSERT_OK_AND_ASSIGN(std::vector<double> rest, resumed->Train(kHalf));
  EXPECT_EQ(rest, std::vector<double>(want.begin() + kHalf, want.end()));
  ASSERT_OK_AND_ASSIGN(CheckpointState got_end, resumed->Snapshot());
  EXPECT_EQ(got_end.step, want_end.step);
  EXPECT_EQ(got_end.data_state, want_end.data_state);
  EXPECT_EQ(got_end.weights, want_end.weights);
  EXPECT_EQ(got_end.m, want_end.m);
  EXPECT_EQ(got_end.v, want_end.v);
}

// Tests that a checkpoint of one accelerator resumes onto data parallel,
// pipeline and replica layouts (the tensors resharded onto their meshes),
// each following the uninterrupted run within the layouts' tolerance.
TEST_F(TrainerCheckpointTest, ResumesOntoAnotherLayout) {
  ASSERT_OK_AND_ASSIGN(auto plain, Trainer::Create(client_.get(), corpus_, Options()));
  ASSERT_OK_AND_ASSIGN(std::vector<double> want, plain->Train(kHalf));
  ASSERT_OK_AND_ASSIGN(CheckpointState saved, plain->Snapshot());
  ASSERT_OK_AND_ASSIGN(std::vector<double> want_rest, plain->Train(kHalf));
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<float>> want_weights, plain->Weights());

  for (auto [stages, micro, replicas] :
       {std::tuple{std::vector<int>{2}, 1u, 1u}, std::tuple{std::vector<int>{1, 1}, 2u, 1u},
        std::tuple{std::vector<int>{1}, 1u, 2u}}) {
    SCOPED_TRACE(absl::StrCat(replicas, " replicas of ", stages.size(), " stages of ", stages[0], ", ", micro,
                              " micro-batches"));
    ASSERT_OK_AND_ASSIGN(auto resumed,
                         Trainer::Create(client_.get(), corpus_, Options(stages, micro, replicas)));
    ASSERT_OK(resumed->Restore(saved));
    ASSERT_OK_AND_ASSIGN(std::vector<double> rest, resumed->Train(kHalf));
    ASSERT_EQ(rest.size(), want_rest.size());
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_NEAR(rest[i], want_rest[i], 1e-4 * std::abs(want_rest[i])) << "step " << kHalf + i + 1;
    }
    ASSERT_OK_AND_ASSIGN(std::vector<std::vector<float>> weights, resumed->Weights(replicas - 1));
    ASSERT_EQ(weights.size(), want_weights.size());
    for (size_t i = 0; i < weights.size(); ++i) {
      EXPECT_LT(reference::MaxRelativeError(weights[i], want_weights[i]), 1e-3) << "tensor " << i;
    }
  }
}

// Tests that a checkpoint of another model or corpus is refused, naming
// the difference, and leaves the trainer as it was.
TEST_F(TrainerCheckpointTest, RefusesACheckpointOfAnotherModelOrCorpus) {
  ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(client_.get(), corpus_, Options()));
  ASSERT_OK_AND_ASSIGN(CheckpointState saved, trainer->Snapshot());
  CheckpointState wider = saved;
  wider.config.d_ff = 64;
  EXPECT_ERROR(trainer->Restore(wider), absl::StatusCode::kInvalidArgument, "another model", "d_ff 64");
  CheckpointState other = saved;
  other.vocabulary[3] = '~';
  EXPECT_ERROR(trainer->Restore(other), absl::StatusCode::kInvalidArgument, "another corpus");
  CheckpointState short_tensor = saved;
  short_tensor.m[4].pop_back();
  EXPECT_ERROR(trainer->Restore(short_tensor), absl::StatusCode::kInvalidArgument, "m of");
  EXPECT_EQ(trainer->steps_done(), 0u);
  ASSERT_OK(trainer->Train(1).status());
}

// Tests that a checkpoint whose write fails (the disk full) fails training
// at the next step with an error that names the step, the file and the
// checkpoint still intact, which stays the directory's newest.
TEST_F(TrainerCheckpointTest, AFailedCheckpointFailsTrainingAndKeepsThePrevious) {
  const std::string dir = FreshDir("trainer_failed");
  TrainOptions with = Options();
  with.checkpoint_dir = dir;
  with.checkpoint_every = 1;
  ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(client_.get(), corpus_, with));
  ASSERT_OK(trainer->Train(1).status());
  ArmFault(FaultPoint::kFileWrite, 1);
  absl::Status failed = trainer->Train(3).status();
  DisarmFaults();
  EXPECT_ERROR(failed, absl::StatusCode::kResourceExhausted, "checkpoint of step 2 not written",
               "No space left on device", "the checkpoint of step 1 is intact");
  ASSERT_OK_AND_ASSIGN(CheckpointState back, ReadCheckpoint(dir));
  EXPECT_EQ(back.step, 1u);
}

}  // namespace
}  // namespace causeway::models
