// `causeway train --checkpoint/--resume` as a user runs it: a training
// process killed with SIGKILL while it writes a checkpoint every step leaves
// a readable checkpoint, and resuming from it gives the uninterrupted run's
// losses bit for bit; resume flags that contradict the checkpoint are
// refused.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "causeway/base/subprocess.h"
#include "causeway/models/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Result = ::causeway::testing::ProgramResult;

constexpr int kSteps = 40;

std::string Temp(const std::string& name) {
  return (fs::path(::testing::TempDir()) / absl::StrCat("train_checkpoint_test_", getpid(), "_", name))
      .string();
}

// A tiny model's training flags, then `more`.
std::vector<std::string> TrainArgs(std::vector<std::string> more) {
  std::vector<std::string> args = {
      "train",
      ::causeway::testing::DeviceFlag(),
      absl::StrCat("--corpus=", ::causeway::testing::DataDir(), "/kjv-genesis-exodus.txt"),
      absl::StrCat("--steps=", kSteps),
      "--layers=1",
      "--d-model=16",
      "--heads=2",
      "--d-ff=32",
      "--batch=4",
      "--seq-len=16",
      "--trace-steps=0",
      "--eval-batches=1"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

Result RunTrain(std::vector<std::string> more) {
  return ::causeway::testing::RunProgram(::causeway::testing::CliPath(), TrainArgs(std::move(more)));
}

// A --losses file: step -> the loss as written (full precision).
std::map<uint64_t, std::string> Losses(const std::string& path) {
  std::ifstream in(path);
  std::map<uint64_t, std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    uint64_t step = 0;
    if (words.size() == 2 && absl::SimpleAtoi(words[0], &step)) out[step] = words[1];
  }
  return out;
}

// Tests that training killed (SIGKILL) in the middle of its checkpoints
// leaves a directory whose newest checkpoint loads, and that resuming from
// it gives every later step's loss bit for bit as a run never stopped.
TEST(TrainCheckpointTest, ResumesBitForBitAfterAKillDuringCheckpoints) {
  const std::string full = Temp("full.losses"), dir = Temp("ckpt"), rest = Temp("rest.losses");
  fs::remove_all(dir);
  Result uninterrupted = RunTrain({"--losses", full});
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.err;
  const std::map<uint64_t, std::string> want = Losses(full);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  SpawnOptions spawn;
  spawn.argv = TrainArgs({"--checkpoint", dir, "--checkpoint-every=1"});
  spawn.argv.insert(spawn.argv.begin(), ::causeway::testing::CliPath());
  spawn.stdout_path = Temp("killed.out");
  spawn.stderr_path = Temp("killed.err");
  ASSERT_OK_AND_ASSIGN(Subprocess child, Subprocess::Spawn(spawn));
  // Once a few checkpoints are down, kill it where it stands: between
  // steps, or amid a checkpoint's download or write.
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  uint64_t seen = 0;
  while (absl::Now() < deadline && seen < 3) {
    absl::StatusOr<models::CheckpointState> s = models::ReadCheckpoint(dir);
    if (s.ok()) seen = s->step;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(seen, 3u) << "no third checkpoint in 120 s";
  absl::SleepFor(absl::Milliseconds(getpid() % 7));
  child.Signal(SIGKILL);
  ASSERT_OK_AND_ASSIGN(int status, child.Wait(absl::Now() + absl::Seconds(30)));
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << DescribeWaitStatus(status);

  ASSERT_OK_AND_ASSIGN(models::CheckpointState saved, models::ReadCheckpoint(dir));
  ASSERT_GE(saved.step, seen);
  ASSERT_LT(saved.step, static_cast<uint64_t>(kSteps)) << "it finished before the kill";
  Result resumed = RunTrain({"--resume", dir, "--checkpoint", dir, "--losses", rest});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr(absl::StrCat("resumed: step ", saved.step, " from ", dir)));
  EXPECT_THAT(resumed.out, HasSubstr(absl::StrCat("checkpoint: step ", kSteps, " in ", dir)));
  const std::map<uint64_t, std::string> got = Losses(rest);
  ASSERT_EQ(got.size(), kSteps - saved.step);
  for (const auto& [step, loss] : got) {
    ASSERT_TRUE(want.contains(step)) << step;
    EXPECT_EQ(loss, want.at(step)) << "step " << step;
  }
  ASSERT_OK_AND_ASSIGN(models::CheckpointState last, models::ReadCheckpoint(dir));
  EXPECT_EQ(last.step, static_cast<uint64_t>(kSteps));
  fs::remove_all(dir);
}

// Tests that --resume refuses a missing or corrupt checkpoint, a model flag
// or corpus that contradicts it and a --steps it has already reached, each
// naming what is wrong, and that --checkpoint-every needs --checkpoint.
TEST(TrainCheckpointTest, ResumeRefusesWhatContradictsTheCheckpoint) {
  const std::string dir = Temp("refuse");
  fs::remove_all(dir);
  Result missing = RunTrain({"--resume", dir});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no checkpoint at " + dir));
  Result written = RunTrain({"--checkpoint", dir, "--steps=2"});
  ASSERT_EQ(written.exit_code, 0) << written.err;
  EXPECT_THAT(written.out, HasSubstr("checkpoint: step 2 in " + dir));

  Result wider = RunTrain({"--resume", dir, "--d-model=32"});
  EXPECT_EQ(wider.exit_code, 2);
  EXPECT_THAT(wider.err, HasSubstr("--d-model 32 differs from the 16 of the checkpoint in " + dir));
  Result done = RunTrain({"--resume", dir, "--steps=2"});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_THAT(done.err, HasSubstr("is at step 2; --steps 2 (steps in all) leaves none to train"));
  Result other =
      RunTrain({"--resume", dir, absl::StrCat("--corpus=", ::causeway::testing::SourceDir(), "/README.md")});
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_THAT(other.err, HasSubstr("trained on another corpus"));
  Result every = RunTrain({"--checkpoint-every=5"});
  EXPECT_EQ(every.exit_code, 2);
  EXPECT_THAT(every.err, HasSubstr("--checkpoint-every needs --checkpoint DIR"));

  const std::string file = dir + "/step-00000002.ckpt";
  fs::resize_file(file, fs::file_size(file) - 1);
  Result truncated = RunTrain({"--resume", dir});
  EXPECT_EQ(truncated.exit_code, 1);
  EXPECT_THAT(truncated.err, HasSubstr(file + ": "));
  EXPECT_THAT(truncated.err, HasSubstr("(truncated?)"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace causeway
