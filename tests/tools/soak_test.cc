// Tests of `causeway soak` (tools/soak_command.cc), the real binary on a short
// run with fast kills: what its report says of programs, kills, recovery and
// futures. Timings are generous (the suite also runs under sanitizers) and
// nothing here depends on speed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "causeway/distributed/island_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using ::causeway::testing::ReadFile;
using Result = ::causeway::testing::ProgramResult;

// Runs the causeway binary with `args`.
Result RunCli(const std::vector<std::string>& args) {
  return ::causeway::testing::RunProgram(::causeway::testing::CliPath(), args);
}

// The number on the report line that starts with `name` (after the
// indent), or -1.
long long ReportValue(const std::string& report, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(report, m, std::regex("\n  " + name + " +([0-9]+)"))) return -1;
  return std::stoll(m[1]);
}

// Tests that a short soak with fast kills runs programs, kills and restarts
// an island, that the clients go on running programs after the last kill,
// that every future resolved, and that it passes (exit 0), its runs under a
// deadline on the islands that none of them comes near.
TEST(SoakTest, ClientsRecoverFromKilledIslands) {
  // Kills from 3 s on, none in the last 14 s: time for the last restart and
  // the clients' reconnects, however slow the build.
  Result r =
      RunCli({"soak", "--duration=24s", "--kill-min=3s", "--kill-max=5s", "--settle=14s", "--report-every=2s",
              "--timeout=60s", "--deadline=30s", ::causeway::testing::DeviceFlag()});
  SCOPED_TRACE(absl::StrCat("stdout:\n", r.out, "\nstderr:\n", r.err));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_GT(ReportValue(r.out, "programs ok"), 0);
  EXPECT_GE(ReportValue(r.out, "kills"), 1);
  EXPECT_EQ(ReportValue(r.out, "restarts"), ReportValue(r.out, "kills"));
  EXPECT_GT(ReportValue(r.out, "programs after last kill"), 0);
  EXPECT_EQ(ReportValue(r.out, "unresolved futures"), 0);
  EXPECT_EQ(ReportValue(r.out, "wrong results"), 0);
  EXPECT_GT(ReportValue(r.out, "futures issued"), 0);
  EXPECT_THAT(r.out, HasSubstr("\nsoak: PASS: "));
  // The table has a row per sample: a progress line every 2 s, and the end.
  EXPECT_THAT(r.out, HasSubstr("RSS MiB"));
  EXPECT_THAT(r.out, HasSubstr("flat                      fds "));
}

// Tests that --train trains through kills: islands killed and started
// again at their address are admitted back, no step is lost or repeated,
// the loss falls, and it passes (exit 0); flags of the program soak are
// refused with it.
TEST(SoakTest, TrainingGoesOnThroughKilledIslands) {
  // Kills from 3 s on, none in the last part: time for the last admission
  // and enough steps to see the loss fall, however slow the build (a
  // sanitizer's islands start and step several times slower).
  const int seconds = ::causeway::testing::Repeats(26, 70), settle = ::causeway::testing::Repeats(14, 45);
  Result r = RunCli({"soak", "--train", absl::StrCat("--duration=", seconds, "s"), "--kill-min=3s",
                     "--kill-max=5s", absl::StrCat("--settle=", settle, "s"), "--report-every=2s",
                     "--timeout=60s", "--admit-every=3", ::causeway::testing::DeviceFlag()});
  SCOPED_TRACE(absl::StrCat("stdout:\n", r.out, "\nstderr:\n", r.err));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_GE(ReportValue(r.out, "kills"), 1);
  EXPECT_EQ(ReportValue(r.out, "restarts"), ReportValue(r.out, "kills"));
  // Each kill is a loss and an admission.
  EXPECT_GE(ReportValue(r.out, "changes of islands"), 2 * ReportValue(r.out, "kills"));
  EXPECT_GE(ReportValue(r.out, "steps"), 10);
  EXPECT_THAT(r.out, HasSubstr("islands: step "));
  EXPECT_THAT(r.out, HasSubstr("; on 1 island ("));
  EXPECT_THAT(r.out, HasSubstr(": admitted 127.0.0.1:"));
  EXPECT_THAT(r.out, HasSubstr("\nsoak: PASS: "));
  EXPECT_THAT(r.out, HasSubstr("flat                      fds "));

  Result bad = RunCli({"soak", "--train", "--clients=2"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--clients is not for --train"));
  Result stray = RunCli({"soak", "--admit-every=2"});
  EXPECT_EQ(stray.exit_code, 2);
  EXPECT_THAT(stray.err, HasSubstr("--admit-every is for --train"));
}

// Tests that the same clients soak an island in this process (--local:
// both meshes on it) and running islands (--connect), through the client
// API, killing nothing: programs run, all right, every future resolved.
TEST(SoakTest, LocalAndConnectRunTheSameClientsWithoutKills) {
  auto check = [](const Result& r) {
    SCOPED_TRACE(absl::StrCat("stdout:\n", r.out, "\nstderr:\n", r.err));
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_GT(ReportValue(r.out, "programs ok"), 0);
    EXPECT_EQ(ReportValue(r.out, "kills"), 0);
    EXPECT_EQ(ReportValue(r.out, "wrong results"), 0);
    EXPECT_EQ(ReportValue(r.out, "errors"), 0);
    EXPECT_EQ(ReportValue(r.out, "unresolved futures"), 0);
    EXPECT_THAT(r.out, HasSubstr("no kills"));
    EXPECT_THAT(r.out, HasSubstr("\nsoak: PASS: "));
  };
  check(RunCli({"soak", "--local", "--duration=4s", "--report-every=1s", "--timeout=60s",
                ::causeway::testing::DeviceFlag()}));

  const std::vector<std::string> flags = {::causeway::testing::DeviceFlag(), "--accelerators=2"};
  ASSERT_OK_AND_ASSIGN(auto a,
                       transport::IslandProcess::Start(::causeway::testing::CliPath(), "soak-a", flags));
  ASSERT_OK_AND_ASSIGN(auto b,
                       transport::IslandProcess::Start(::causeway::testing::CliPath(), "soak-b", flags));
  const Result connected = RunCli({"soak", absl::StrCat("--connect=", a->address(), ",", b->address()),
                                   "--duration=4s", "--report-every=1s", "--timeout=60s"});
  check(connected);
  EXPECT_THAT(connected.out, HasSubstr(absl::StrCat("islands ", a->address(), " and ", b->address())));
  // The islands served it and are still up.
  EXPECT_EQ(kill(a->pid(), 0), 0);
  EXPECT_EQ(kill(b->pid(), 0), 0);
}

// Tests that bad values are refused before anything starts: a message on
// stderr naming the flag, nothing on stdout, exit 2.
TEST(SoakTest, BadFlagsAreRefused) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--duration=0s"}, "--duration must be a finite duration > 0, got '0s'"},
      {{"--duration=-5s"}, "--duration must be a finite duration > 0"},
      {{"--duration=10"}, "--duration wants a duration such as 30s, 500ms or 1h30m, got '10'"},
      {{"--duration=soon"}, "--duration wants a duration"},
      {{"--kill-min=20s", "--kill-max=5s"}, "--kill-min (20s) must not exceed --kill-max (5s)"},
      {{"--kill-min=0s"}, "--kill-min must be a finite duration > 0"},
      {{"--report-every=inf"}, "--report-every must be a finite duration > 0"},
      {{"--deadline=0s"}, "--deadline must be a finite duration > 0"},
      {{"--duration=1m", "--settle=2m"}, "--settle wants a duration from 0 to less than --duration (1m)"},
      {{"--clients=0"}, "--clients must be in 1..64, got 0"},
      {{"--size=63"}, "--size must be even"},
      {{"--accelerators=1"}, "--accelerators (per island) must be at least 2, got 1"},
      {{"extra"}, "unexpected argument 'extra'"},
      {{"--local", "--connect=127.0.0.1:1,127.0.0.1:2"}, "--local and --connect are two ways to run"},
      {{"--connect=127.0.0.1:1"}, "--connect takes two islands (HOST:PORT,HOST:PORT), got 1"},
      {{"--local", "--kill-min=1s"}, "--kill-min is for islands started here"},
      {{"--connect=127.0.0.1:1,127.0.0.1:2", "--device=cpu"}, "--device is for islands of this soak"},
      {{"--secret-file=/nonexistent"}, "--secret-file is for --connect"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"soak"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Result r = RunCli(args);
    SCOPED_TRACE(c.args[0]);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_THAT(r.err, StartsWith("causeway soak: "));
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace causeway
