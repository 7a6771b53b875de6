// The causeway command line's conventions, for every command it lists:
// --help prints usage on stdout and exits 0; a bad flag is an error on stderr
// with exit 2 and nothing on stdout; --trace FILE writes a trace.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "causeway/base/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;

using ::causeway::testing::ReadFile;
using Result = ::causeway::testing::ProgramResult;

// Runs the causeway binary with `args`.
Result RunCli(const std::vector<std::string>& args) {
  return ::causeway::testing::RunProgram(::causeway::testing::CliPath(), args);
}

// The commands `causeway help` lists.
std::vector<std::string> Commands() {
  Result help = RunCli({"help"});
  EXPECT_EQ(help.exit_code, 0);
  std::vector<std::string> commands;
  bool in_list = false;
  for (absl::string_view line : absl::StrSplit(help.out, '\n')) {
    if (line == "commands:") {
      in_list = true;
      continue;
    }
    if (!in_list || !absl::StartsWith(line, "  ")) continue;
    std::vector<std::string> words = absl::StrSplit(absl::StripLeadingAsciiWhitespace(line), ' ');
    if (words[0] != "help") commands.push_back(words[0]);
  }
  return commands;
}

TEST(CliTest, HelpListsTheCommands) {
  std::vector<std::string> commands = Commands();
  for (const char* c : {"devices", "demo", "island", "launch", "run", "trace", "bench"}) {
    EXPECT_THAT(commands, ::testing::Contains(c));
  }
  Result none = RunCli({});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_TRUE(none.out.empty());
  EXPECT_THAT(none.err, HasSubstr("usage: causeway COMMAND"));
  Result unknown = RunCli({"nosuch"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_TRUE(unknown.out.empty());
  EXPECT_THAT(unknown.err, StartsWith("causeway: unknown command 'nosuch'"));
}

TEST(CliTest, EveryCommandHasHelpAndRefusesABadFlag) {
  for (const std::string& c : Commands()) {
    SCOPED_TRACE(c);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{c, "--help"}, std::vector<std::string>{c, "-h"},
          std::vector<std::string>{"help", c}}) {
      Result help = RunCli(args);
      EXPECT_EQ(help.exit_code, 0);
      EXPECT_THAT(help.out, StartsWith(absl::StrCat("usage: causeway ", c)));
      EXPECT_THAT(help.out, HasSubstr("--trace"));
      EXPECT_TRUE(help.err.empty()) << help.err;
    }
    Result bad = RunCli({c, "--no-such-flag=1"});
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_TRUE(bad.out.empty()) << bad.out;
    EXPECT_THAT(bad.err, StartsWith(absl::StrCat("causeway ", c, ": ")));
    EXPECT_THAT(bad.err, HasSubstr("no-such-flag"));
    // Every command but run (one PROGRAM) and trace (a subcommand) takes
    // no positional argument, and says so rather than ignoring it.
    if (c == "run" || c == "trace") continue;
    Result stray = RunCli({c, "stray"});
    EXPECT_EQ(stray.exit_code, 2);
    EXPECT_TRUE(stray.out.empty()) << stray.out;
    EXPECT_THAT(stray.err, StartsWith(absl::StrCat("causeway ", c, ": unexpected argument 'stray' (")));
    EXPECT_THAT(stray.err, HasSubstr(c == "launch" ? "flags for the islands go after --"
                                                   : absl::StrCat("causeway ", c, " --help")));
  }
}

TEST(CliTest, DemoWritesATrace) {
  const std::string path = ::testing::TempDir() + "/cli_test_demo.json";
  Result demo = RunCli({"demo", "--accelerators=2", "--size=64", "--batches=2", "--repeats=1", "--trace", path});
  ASSERT_EQ(demo.exit_code, 0) << demo.err;
  json t = json::parse(ReadFile(path), nullptr, false);
  ASSERT_FALSE(t.is_discarded());
  int gang_calls = 0, matmuls = 0;
  bool main_named = false;
  for (const json& e : t["traceEvents"]) {
    gang_calls += e["ph"] == "i" && e["name"] == "gang call";
    matmuls += e["ph"] == "X" && e["cat"] == "device" && e["name"] == "matmul";
    main_named |= e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "main";
  }
  EXPECT_GT(gang_calls, 0);
  EXPECT_GT(matmuls, 0);
  EXPECT_TRUE(main_named);
  std::remove(path.c_str());

  Result unwritable = RunCli({"demo", "--accelerators=1", "--trace", "/nonexistent-dir/t.json"});
  EXPECT_EQ(unwritable.exit_code, 2);
  EXPECT_THAT(unwritable.err, HasSubstr("/nonexistent-dir/t.json"));
  EXPECT_TRUE(unwritable.out.empty());
}

// `causeway devices` describes the physical devices and the accelerators the
// flags would make, and names the devices there are when asked for one that
// is not.
TEST(CliTest, DevicesDescribesTheDevicesAndTheAcceleratorsTheFlagsMake) {
  using ::causeway::testing::DeviceFlag;
  Result devices =
      RunCli({"devices", DeviceFlag(), "--accelerators=3", "--memory-budget=64MiB", "--ring-slots=16"});
  ASSERT_EQ(devices.exit_code, 0) << devices.err;
  EXPECT_THAT(devices.out, StartsWith("physical devices:\n  [0] "));
  for (const char* field : {"type ", "Vulkan 1.", "uuid ", "driver ", "queue family 0: ", "heap 0: ",
                            "limits: storage binding ", "features: timeline yes"}) {
    EXPECT_THAT(devices.out, HasSubstr(field));
  }
  EXPECT_THAT(devices.out, HasSubstr("accelerators that would be made: 3 on ["));
  EXPECT_THAT(devices.out, HasSubstr("memory budget: 64 MiB each"));
  EXPECT_THAT(devices.out, HasSubstr("ring: 16 in-flight submissions each"));
  EXPECT_THAT(devices.out, HasSubstr("copies between accelerators: "));
  EXPECT_THAT(devices.out, HasSubstr("layout: one VkDevice per accelerator"));
  Result shared = RunCli({"devices", DeviceFlag(), "--accelerators=2", "--sharing=one-device"});
  ASSERT_EQ(shared.exit_code, 0) << shared.err;
  EXPECT_THAT(shared.out, HasSubstr("layout: one VkDevice, "));
  EXPECT_THAT(shared.out, HasSubstr("copies between accelerators: same-device"));

  Result missing = RunCli({"devices", "--device=99"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no device 99; devices: 0: "));
  Result bad = RunCli({"devices", "--ring-slots=0"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_TRUE(bad.out.empty());
}

// `causeway train` on a tiny model: every step's loss, a falling training
// loss, a held-out loss, utilization and a trace of the last steps.
TEST(CliTest, TrainLearnsAndReportsItsSummary) {
  const std::string trace = ::testing::TempDir() + "/cli_test_train.json";
  std::remove(trace.c_str());
  Result train = RunCli({"train", ::causeway::testing::DeviceFlag(),
                         absl::StrCat("--corpus=", ::causeway::testing::DataDir(), "/kjv-genesis-exodus.txt"),
                         "--steps=12", "--layers=1", "--d-model=32", "--heads=2", "--d-ff=64", "--batch=8",
                         "--seq-len=16", "--lr=0.01", "--trace", trace});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  EXPECT_THAT(train.out, HasSubstr("model: 1 layers, d_model 32, 2 heads, d_ff 64, context 16"));
  // The first and the last step's losses, and the summary's figures.
  double first = 0, last = 0, mean = 0, held_out = 0;
  for (absl::string_view line : absl::StrSplit(train.out, '\n')) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() >= 3 && words[0] == "step" && words[2] == "loss") {
      ASSERT_GE(words.size(), 4u) << line;
      double loss = 0;
      ASSERT_TRUE(absl::SimpleAtod(words[3], &loss)) << line;
      if (words[1] == "1/12") first = loss;
      if (words[1] == "12/12") last = loss;
    }
    if (words.size() >= 3 && words[0] == "training" && words[1] == "loss") {
      ASSERT_TRUE(absl::SimpleAtod(words[2], &mean)) << line;
    }
    if (words.size() >= 3 && words[0] == "held-out" && words[1] == "loss") {
      ASSERT_TRUE(absl::SimpleAtod(words[2], &held_out)) << line;
    }
  }
  // Untrained, the loss is about ln(72 characters) = 4.28; twelve steps at
  // this learning rate bring it well down.
  EXPECT_NEAR(first, std::log(72.0), 0.5) << train.out;
  EXPECT_LT(last, first - 0.3) << train.out;
  EXPECT_GT(mean, 0) << train.out;
  EXPECT_LT(mean, first) << train.out;
  EXPECT_GT(held_out, 0) << train.out;
  EXPECT_LT(held_out, first) << train.out;
  EXPECT_THAT(train.out, HasSubstr("% busy"));
  json t = json::parse(ReadFile(trace), nullptr, false);
  ASSERT_FALSE(t.is_discarded());
  EXPECT_FALSE(t["traceEvents"].empty());
  std::remove(trace.c_str());

  Result bad = RunCli({"train", "--layout=sideways"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("sideways"));
  EXPECT_TRUE(bad.out.empty());
}

// `causeway train --deadline`: a step that takes longer fails, and training
// stops with its error, naming the gang call; a malformed deadline is a
// usage error.
TEST(CliTest, TrainStopsAtAStepPastItsDeadline) {
  Result late = RunCli({"train", ::causeway::testing::DeviceFlag(),
                        absl::StrCat("--corpus=", ::causeway::testing::DataDir(), "/kjv-genesis-exodus.txt"),
                        "--steps=3", "--layers=1", "--d-model=32", "--heads=2", "--d-ff=64", "--batch=8",
                        "--seq-len=16", "--trace-steps=0", "--deadline=1us"});
  EXPECT_EQ(late.exit_code, 1) << late.out << late.err;
  EXPECT_THAT(late.err, HasSubstr("deadline"));
  EXPECT_THAT(late.err, HasSubstr("gang call"));
  EXPECT_THAT(late.out, Not(HasSubstr("held-out loss")));
  Result bad = RunCli({"train", "--deadline=soon"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--deadline wants a duration"));
}

// A server writes its trace when it is stopped.
// Tests that `causeway island` refuses handshake caps out of range and a
// session host budget that is not a size, naming the flag, before it
// serves anything.
TEST(CliTest, IslandRefusesHandshakeCapsAndHostBudgetsOutOfRange) {
  for (const std::string flag : {"--max-handshakes=0", "--max-handshakes-per-address=100001",
                                 "--max-handshakes=many", "--max-handshakes-per-address=-1"}) {
    Result r = RunCli({"island", ::causeway::testing::DeviceFlag(), flag});
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    const std::string name = flag.substr(0, flag.find('='));
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("causeway island: ", name, " must be 1..100000"))) << flag;
  }
  Result r = RunCli({"island", ::causeway::testing::DeviceFlag(), "--session-host-budget=lots"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("causeway island: --session-host-budget: not a byte size: 'lots'"));
}

TEST(CliTest, IslandWritesItsTraceWhenStopped) {
  const std::string path = ::testing::TempDir() + "/cli_test_island.json";
  std::remove(path.c_str());
  const std::string out_path = ::testing::TempDir() + "/cli_test_island.out";
  SpawnOptions options;
  options.argv = {::causeway::testing::CliPath(),
                  "island",
                  "--listen",
                  "127.0.0.1:0",
                  "--accelerators=1",
                  "--trace",
                  path};
  options.stdout_path = out_path;
  ASSERT_OK_AND_ASSIGN(Subprocess island, Subprocess::Spawn(options));
  // Serving once it prints its address.
  for (int i = 0; i < 300 && !absl::StrContains(ReadFile(out_path), "island "); ++i) usleep(100'000);
  ASSERT_THAT(ReadFile(out_path), StartsWith("island "));
  island.Signal(SIGTERM);
  ASSERT_OK_AND_ASSIGN(int status, island.Wait());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  json t = json::parse(ReadFile(path), nullptr, false);
  ASSERT_FALSE(t.is_discarded()) << "no trace at " << path;
  bool accelerator_named = false;
  for (const json& e : t["traceEvents"]) {
    // value(), not [], on a const json: [] of a key that is not there (a
    // process_name event has no tid) is undefined behaviour.
    accelerator_named |= e.value("ph", "") == "M" && e.value("name", "") == "thread_name" &&
                         e.value("pid", -1) == 2 && e.value("tid", -1) == 0;
  }
  EXPECT_TRUE(accelerator_named);
  std::remove(path.c_str());
  std::remove(out_path.c_str());
}

}  // namespace
}  // namespace causeway
