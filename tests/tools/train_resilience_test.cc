// `causeway train` surviving faults as a user meets them: a training
// process killed with SIGKILL while it writes a checkpoint every step leaves
// a readable checkpoint, and resuming from it gives the uninterrupted run's
// losses bit for bit; resume flags that contradict the checkpoint are
// refused; an island process killed mid-training is restarted and admitted
// back while training goes on, on the uninterrupted trajectory.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
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
using ::causeway::testing::ReadFile;

constexpr int kSteps = 40;

std::string Temp(const std::string& name) {
  return (fs::path(::testing::TempDir()) / absl::StrCat("train_resilience_test_", getpid(), "_", name))
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
TEST(TrainResilienceTest, ResumesBitForBitAfterAKillDuringCheckpoints) {
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
TEST(TrainResilienceTest, ResumeRefusesWhatContradictsTheCheckpoint) {
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

// The pid of the child of `parent` whose command line holds `needle`, or -1.
pid_t ChildWith(pid_t parent, const std::string& needle) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // "pid (comm) state ppid ...": the comm may hold spaces; ppid follows the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> rest = absl::StrSplit(line.substr(close + 2), ' ');
    pid_t ppid = 0;
    if (rest.size() < 2 || !absl::SimpleAtoi(rest[1], &ppid) || ppid != parent) continue;
    std::ifstream cmdline(e.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), {});
    if (args.find(needle) != std::string::npos) return pid;
  }
  return -1;
}

// Tests that `causeway train --islands 2` goes on when an island process is
// killed (SIGKILL) mid-training: the survivor trains from the last complete
// step, the island is restarted at its address and admitted back at a step
// boundary, each change is reported on one line, and every step's loss
// stays within the layouts' tolerance of one accelerator's uninterrupted
// run.
TEST(TrainResilienceTest, AnIslandKilledMidTrainingIsRestartedAndAdmittedBack) {
  const std::string want_path = Temp("one.losses"), got_path = Temp("islands.losses");
  Result one = RunTrain({"--losses", want_path});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::map<uint64_t, std::string> want = Losses(want_path);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  SpawnOptions spawn;
  spawn.argv = TrainArgs({"--islands=2", "--accelerators=2", "--admit-every=4", "--losses", got_path});
  spawn.argv.insert(spawn.argv.begin(), ::causeway::testing::CliPath());
  spawn.stdout_path = Temp("islands.out");
  spawn.stderr_path = Temp("islands.err");
  ASSERT_OK_AND_ASSIGN(Subprocess train, Subprocess::Spawn(spawn));
  // Past step 10 (the progress lines come every 10 steps), kill island-1.
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline && !absl::StrContains(ReadFile(spawn.stdout_path), "step 10/")) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const pid_t island = ChildWith(train.pid(), "island-1");
  ASSERT_GT(island, 0) << "no island-1 process; out:\n" << ReadFile(spawn.stdout_path);
  ASSERT_EQ(::kill(island, SIGKILL), 0);
  ASSERT_OK_AND_ASSIGN(int status, train.Wait(absl::Now() + absl::Seconds(240)));
  const std::string out = ReadFile(spawn.stdout_path);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status) << "\n"
                                                             << out << ReadFile(spawn.stderr_path);
  EXPECT_THAT(out, HasSubstr("lost 'island-1' at"));
  EXPECT_THAT(out, HasSubstr("on 1 island"));
  EXPECT_THAT(out, HasSubstr("islands: island-1 killed by signal 9"));
  EXPECT_THAT(out, HasSubstr("; on 2 islands"));
  EXPECT_THAT(out, HasSubstr("admitted 127.0.0.1:"));
  const std::map<uint64_t, std::string> got = Losses(got_path);
  ASSERT_EQ(got.size(), want.size()) << out;
  for (const auto& [step, loss] : got) {
    double g = 0, w = 0;
    ASSERT_TRUE(absl::SimpleAtod(loss, &g) && want.contains(step) && absl::SimpleAtod(want.at(step), &w))
        << step;
    EXPECT_NEAR(g, w, 1e-4 * w) << "step " << step;
  }
}

}  // namespace
}  // namespace causeway
