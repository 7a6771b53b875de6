// Tests of `causeway bench` (tools/bench_command.cc) and of the benchmarks'
// JSON results (benchmarks/bench_report.h). The suites run in quick mode, so
// their figures only show that they were measured, not what they are.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_report.h"
#include "causeway/base/subprocess.h"
#include "causeway/distributed/island_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh directory under the test's temporary directory.
fs::path FreshDir(const std::string& name) {
  fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("bench_command_test_", getpid(), "_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Ran {
  int code = -1;
  std::string out, err;
};

// Runs `command` through the shell, its stdout and stderr into files.
Ran RunShell(const std::string& command, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  int status = std::system(absl::StrCat(command, " >", out.string(), " 2>", err.string()).c_str());
  Ran r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

std::string Cli() { return ::causeway::testing::CliPath(); }

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// Checks that `results` is a non-empty list of `suite`'s results, each with a
// positive value, and a positive ratio where it has a baseline.
void ExpectResults(const json& results, const std::string& suite) {
  ASSERT_TRUE(results.is_array());
  ASSERT_FALSE(results.empty()) << suite;
  for (const json& r : results) {
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r.at("suite"), suite);
    EXPECT_FALSE(r.at("case").get<std::string>().empty());
    EXPECT_FALSE(r.at("metric").get<std::string>().empty());
    EXPECT_GT(r.at("value").get<double>(), 0);
    EXPECT_GE(r.at("samples").get<int>(), 1);
    EXPECT_TRUE(r.at("params").is_object());
    if (r.contains("baseline")) {
      EXPECT_GT(r.at("baseline_value").get<double>(), 0);
      EXPECT_GT(r.at("ratio").get<double>(), 0);
      EXPECT_NEAR(r.at("ratio").get<double>(),
                  r.at("value").get<double>() / r.at("baseline_value").get<double>(),
                  1e-6 * r.at("ratio").get<double>());
    }
  }
}

// Tests that strings are escaped as JSON wants and parse back to themselves.
TEST(BenchReportTest, JsonStringEscapes) {
  EXPECT_EQ(bench::JsonString("plain"), "\"plain\"");
  EXPECT_EQ(bench::JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(bench::JsonString("1\n2\t3\r\b\f"), "\"1\\n2\\t3\\r\\b\\f\"");
  EXPECT_EQ(bench::JsonString(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(bench::JsonString(std::string("nul\0!", 5)), "\"nul\\u0000!\"");
  const std::string tricky = std::string("q\"uote\\ \n µs \x7f end") + '\x02';
  EXPECT_EQ(json::parse(bench::JsonString(tricky)).get<std::string>(), tricky);
}

// Tests that numbers keep 12 digits and that a non-finite one is null.
TEST(BenchReportTest, JsonNumbers) {
  EXPECT_EQ(bench::JsonNumber(14.38), "14.38");
  EXPECT_EQ(bench::JsonNumber(268435456), "268435456");
  EXPECT_EQ(bench::JsonNumber(std::nan("")), "null");
  EXPECT_EQ(bench::JsonNumber(std::numeric_limits<double>::infinity()), "null");
}

// Tests that a report is a JSON list of its results, with the baseline and
// ratio only where there is a baseline, params and extras as given.
TEST(BenchReportTest, ReportIsAListOfResults) {
  bench::Report report("ici");
  report.Add("copy", "list copy 16 MiB", "GB/s")
      .Value(18)
      .Baseline("memcpy \"host\"", 24)
      .Samples(9)
      .Param("bytes", 16777216)
      .Param("path", "external-memory")
      .Extra("bound", 0.29);
  report.Add("dispatch", "submit-await", "us/dispatch", /*higher_is_better=*/false).Value(14.5).Samples(3);
  json j = json::parse(report.ToJson());
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["suite"], "ici");
  EXPECT_EQ(j[0]["group"], "copy");
  EXPECT_EQ(j[0]["case"], "list copy 16 MiB");
  EXPECT_EQ(j[0]["metric"], "GB/s");
  EXPECT_EQ(j[0]["higher_is_better"], true);
  EXPECT_EQ(j[0]["value"], 18);
  EXPECT_EQ(j[0]["baseline"], "memcpy \"host\"");
  EXPECT_EQ(j[0]["baseline_value"], 24);
  EXPECT_DOUBLE_EQ(j[0]["ratio"].get<double>(), 0.75);
  EXPECT_EQ(j[0]["samples"], 9);
  EXPECT_EQ(j[0]["params"], json({{"bytes", 16777216}, {"path", "external-memory"}}));
  EXPECT_EQ(j[0]["extra"], json({{"bound", 0.29}}));
  EXPECT_EQ(j[1]["higher_is_better"], false);
  EXPECT_FALSE(j[1].contains("baseline"));
  EXPECT_FALSE(j[1].contains("baseline_value"));
  EXPECT_FALSE(j[1].contains("ratio"));
  EXPECT_EQ(bench::Report("empty").ToJson(), "[\n]\n");
}

#ifdef CAUSEWAY_BENCHMARKS_BUILT
// Tests the whole command on the dispatch suite: results.json, results.csv
// with the same rows, BENCHMARKS.md naming the command, a plot, and the
// summary on stdout.
TEST(BenchCommandTest, QuickDispatchWritesReport) {
  fs::path dir = FreshDir("dispatch");
  fs::path out = dir / "out";
  Ran r = RunShell(absl::StrCat(Cli(), " bench --quick --only dispatch --out ", out.string()), dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("[1/1] dispatch: 5 results"));
  EXPECT_THAT(r.out, HasSubstr("submit-await"));
  EXPECT_THAT(r.out, HasSubstr("raw Vulkan"));

  json report = json::parse(ReadFile(out / "results.json"));
  EXPECT_EQ(report["schema"], "causeway-bench/1");
  EXPECT_EQ(report["quick"], true);
  // Where the outputs went is not part of the command as recorded.
  EXPECT_EQ(report["command"].get<std::string>(), "causeway bench --quick --only dispatch");
  EXPECT_FALSE(report["date"].get<std::string>().empty());
  EXPECT_GE(report["machine"]["cores"].get<int>(), 1);
  EXPECT_GT(report["machine"]["memory_bytes"].get<double>(), 0);
  EXPECT_TRUE(report["machine"].contains("kernel"));
  ASSERT_TRUE(report["machine"].contains("vulkan_devices")) << report["machine"].dump();
  EXPECT_FALSE(report["machine"]["vulkan_devices"].empty());
  ASSERT_EQ(report["suites"].size(), 1u);
  EXPECT_EQ(report["suites"][0]["name"], "dispatch");
  EXPECT_EQ(report["suites"][0]["status"], "ok");
  const json& results = report["results"];
  ExpectResults(results, "dispatch");
  std::vector<std::string> cases;
  for (const json& res : results) cases.push_back(res["case"]);
  EXPECT_THAT(cases, ::testing::ElementsAre("submit-await", "replay", "replay-one-submit", "batched", "relay"));

  // The CSV: a header and the same rows in the same order.
  std::vector<std::string> lines = absl::StrSplit(ReadFile(out / "results.csv"), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), results.size() + 1);
  EXPECT_TRUE(absl::StartsWith(lines[0], "suite,group,case,metric,"));
  for (size_t i = 0; i < results.size(); ++i) {
    std::vector<std::string> fields = absl::StrSplit(lines[i + 1], ',');
    ASSERT_GE(fields.size(), 10u) << lines[i + 1];
    EXPECT_EQ(fields[0], "dispatch");
    EXPECT_EQ(fields[2], results[i]["case"]);
    EXPECT_EQ(fields[3], results[i]["metric"]);
    EXPECT_NEAR(std::stod(fields[5]), results[i]["value"].get<double>(),
                1e-9 * results[i]["value"].get<double>());
  }

  const std::string md = ReadFile(out / "BENCHMARKS.md");
  EXPECT_THAT(md, HasSubstr("causeway bench --quick --only dispatch"));
  EXPECT_THAT(md, HasSubstr("Quick mode"));
  EXPECT_THAT(md, HasSubstr("| submit-await |"));
  EXPECT_TRUE(fs::exists(out / "raw" / "dispatch.txt"));
  EXPECT_THAT(ReadFile(out / "raw" / "dispatch.txt"), HasSubstr("dispatch cost on"));
  if (HaveGnuplot()) {
    ASSERT_TRUE(fs::exists(out / "dispatch.svg"));
    EXPECT_THAT(ReadFile(out / "dispatch.svg"), HasSubstr("<svg"));
    EXPECT_THAT(md, HasSubstr("](dispatch.svg)"));
  } else {
    GTEST_LOG_(INFO) << "gnuplot is not installed: no plot to check";
  }
}
#endif  // CAUSEWAY_BENCHMARKS_BUILT

// Tests that an unknown suite is an error that names the suites.
TEST(BenchCommandTest, UnknownSuiteFails) {
  fs::path dir = FreshDir("nosuch");
  Ran r = RunShell(absl::StrCat(Cli(), " bench --only nosuch --out ", (dir / "out").string()), dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err,
              HasSubstr("causeway bench: unknown suite 'nosuch' in --only; the suites are dispatch, "));
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(fs::exists(dir / "out" / "results.json"));
}

// Tests that a bad --samples is refused before anything runs.
TEST(BenchCommandTest, BadSamplesFails) {
  fs::path dir = FreshDir("samples");
  Ran r = RunShell(absl::StrCat(Cli(), " bench --samples 0 --out ", (dir / "out").string()), dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("causeway bench: --samples must be 1..1000, got '0'"));
}

#ifdef CAUSEWAY_BENCHMARKS_BUILT
// Tests that a failing suite is reported with its stderr, that the others
// still run and are written, and that the command exits 1. The dispatch
// suite fails on a device that does not exist; the DCN suite uses no device.
TEST(BenchCommandTest, FailingSuiteIsReportedAndOthersRun) {
  fs::path dir = FreshDir("failing");
  fs::path out = dir / "out";
  Ran r = RunShell(absl::StrCat("CAUSEWAY_DEVICE=nosuch ", Cli(), " bench --quick --only dispatch,dcn --out ",
                                out.string()),
                   dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              HasSubstr("[1/2] dispatch: FAILED: causeway_dispatch_bench failed (exit code 1); its stderr:"));
  EXPECT_THAT(r.err, HasSubstr("nosuch"));
  EXPECT_THAT(r.err, HasSubstr("[2/2] dcn: "));
  EXPECT_THAT(r.err, HasSubstr("causeway bench: 1 of 2 suites failed: dispatch"));
  json report = json::parse(ReadFile(out / "results.json"));
  ASSERT_EQ(report["suites"].size(), 2u);
  EXPECT_EQ(report["suites"][0]["status"], "failed");
  EXPECT_THAT(report["suites"][0]["stderr"].get<std::string>(), HasSubstr("nosuch"));
  EXPECT_EQ(report["suites"][1]["status"], "ok");
  ExpectResults(report["results"], "dcn");
  EXPECT_THAT(ReadFile(out / "BENCHMARKS.md"), HasSubstr("**Failed**"));
  EXPECT_THAT(r.out, HasSubstr("transfer 1 MiB"));
}

// Tests that a suite still running at --deadline is stopped and reported
// failed, naming the deadline; a malformed deadline is a usage error.
TEST(BenchCommandTest, SuitePastItsDeadlineIsStopped) {
  fs::path dir = FreshDir("deadline");
  fs::path out = dir / "out";
  const absl::Time start = absl::Now();
  Ran r = RunShell(absl::StrCat(Cli(), " bench --quick --only dispatch --deadline=50ms --out ", out.string()),
                   dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("dispatch: FAILED: causeway_dispatch_bench"));
  EXPECT_THAT(r.err, HasSubstr("ran past its deadline of 50.0 ms and was stopped"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  Ran bad = RunShell(absl::StrCat(Cli(), " bench --deadline=soon"), dir);
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--deadline wants a duration"));
}

// The pid of a running process whose command line holds `needle`; 0 if none.
pid_t FindProcess(const std::string& needle) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = ReadFile(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    const std::string stat = ReadFile(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    const bool zombie = paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
    if (!zombie && absl::StrContains(cmdline, needle)) return static_cast<pid_t>(std::stoi(name));
  }
  return 0;
}

// Tests that SIGINT stops `causeway bench` within 2 s with exit code 130,
// and that the suite binary it was running is stopped too.
TEST(BenchCommandTest, SigintStopsTheBenchAndItsSuite) {
  fs::path dir = FreshDir("sigint");
  fs::path out = dir / "out";
  const std::string command =
      absl::StrCat("exec ", Cli(), " bench --only dispatch --out ", out.string(), " >",
                   (dir / "stdout.txt").string(), " 2>", (dir / "stderr.txt").string());
  SpawnOptions options;
  options.argv = {"sh", "-c", command};
  ASSERT_OK_AND_ASSIGN(Subprocess bench, Subprocess::Spawn(options));
  // The suite has started once a process runs with this run's output path.
  const std::string needle = absl::StrCat("--json=", (out / "raw").string());
  pid_t suite = 0;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while ((suite = FindProcess(needle)) == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_NE(suite, 0) << "the suite never started";
  const absl::Time signalled = absl::Now();
  bench.Signal(SIGINT);
  absl::StatusOr<int> ended = bench.Wait(signalled + absl::Seconds(30));
  const absl::Duration took = absl::Now() - signalled;
  const int status = ended.ok() ? *ended : bench.Stop(absl::ZeroDuration());
  const std::string err = ReadFile(dir / "stderr.txt");
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 130) << err;
  EXPECT_THAT(err, HasSubstr("causeway bench: stopped by Interrupt; no accelerator had work in flight"));
  // Leaving takes at most 1.5 s after the signal by construction
  // (tools/interrupt.cc); the suite's slack is for a loaded machine (see
  // RunCommandTest.SigintEndsALongKernelWithin2s).
  EXPECT_LT(took, absl::Seconds(2) + ::causeway::testing::kSchedulingSlack) << err;
  // The suite got SIGTERM from the bench as it left: it ends without
  // writing its results (a suite left running would finish and write them).
  const absl::Time gone_by = absl::Now() + absl::Seconds(60);
  while (suite != 0 && FindProcess(needle) != 0 && absl::Now() < gone_by)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(FindProcess(needle), 0) << "the suite outlived the bench";
  EXPECT_FALSE(fs::exists(out / "raw" / "dispatch.json")) << "the suite ran to its end";
}

// Tests that without gnuplot the plots are skipped with a note, and nothing
// else fails.
TEST(BenchCommandTest, WithoutGnuplotSkipsPlots) {
  fs::path dir = FreshDir("nognuplot");
  fs::path out = dir / "out";
  Ran r = RunShell(
      absl::StrCat("PATH=/nonexistent ", Cli(), " bench --quick --only dcn --out ", out.string()), dir);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("gnuplot is not installed"));
  EXPECT_FALSE(fs::exists(out / "dcn.svg"));
  EXPECT_TRUE(fs::exists(out / "plots.gp"));
  ExpectResults(json::parse(ReadFile(out / "results.json"))["results"], "dcn");
  EXPECT_THAT(ReadFile(out / "BENCHMARKS.md"), Not(HasSubstr(".svg")));
}

// Tests that --update-doc writes the repository's BENCHMARKS.md with the
// plots in docs/bench/.
TEST(BenchCommandTest, UpdateDocWritesRepositoryDoc) {
  fs::path dir = FreshDir("updatedoc");
  fs::path repo = dir / "repo";
  fs::create_directories(repo);
  const std::string begin = "<!-- bench-summary: made by causeway bench --update-doc -->";
  const std::string end = "<!-- bench-summary end -->";
  {
    std::ofstream readme(repo / "README.md");
    readme << "# A project\n\nBefore the table.\n"
           << begin << "\n| an old | table |\n"
           << end << "\nAfter the table.\n";
  }
  Ran r = RunShell(absl::StrCat(Cli(), " bench --quick --only dcn --update-doc --repo ", repo.string(),
                                " --out ", (dir / "out").string()),
                   dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string md = ReadFile(repo / "BENCHMARKS.md");
  EXPECT_THAT(md, HasSubstr("`causeway bench --quick --only dcn --update-doc`"));
  EXPECT_THAT(md, Not(HasSubstr(dir.string())));
  EXPECT_THAT(md, HasSubstr("| transfer 1 MiB |"));
  if (HaveGnuplot()) {
    EXPECT_THAT(md, HasSubstr("](docs/bench/dcn.svg)"));
    EXPECT_TRUE(fs::exists(repo / "docs" / "bench" / "dcn.svg"));
  }

  // The README's table is rewritten from the same results; the rest stays.
  const std::string readme = ReadFile(repo / "README.md");
  EXPECT_TRUE(absl::StartsWith(readme, "# A project\n\nBefore the table.\n" + begin + "\n")) << readme;
  EXPECT_TRUE(absl::EndsWith(readme, end + "\nAfter the table.\n")) << readme;
  EXPECT_THAT(readme, Not(HasSubstr("an old")));
  EXPECT_THAT(readme, HasSubstr("`causeway bench --quick --only dcn --update-doc`"));
  EXPECT_THAT(readme, Not(HasSubstr(dir.string())));
  const json report = json::parse(ReadFile(dir / "out" / "results.json"));
  for (const json& res : report["results"]) {
    // Every row of the quick dcn run (groups of at most four rows), with
    // its table: cases of two tables may share a name (matmul's).
    const std::string row =
        absl::StrCat("| dcn | ", res["group"].get<std::string>(), " | ", res["case"].get<std::string>(), " | ");
    EXPECT_THAT(readme, HasSubstr(row));
    EXPECT_THAT(readme, HasSubstr(absl::StrCat(res["baseline"].get<std::string>(), ": ")));
  }
}

// Tests that --update-doc refuses a README without the summary's markers
// and then writes nothing into the repository.
TEST(BenchCommandTest, UpdateDocRefusesAReadmeWithoutMarkers) {
  fs::path dir = FreshDir("updatedoc-nomarkers");
  fs::path repo = dir / "repo";
  fs::create_directories(repo);
  {
    std::ofstream readme(repo / "README.md");
    readme << "# A project\n\nNo table here.\n";
  }
  Ran r = RunShell(absl::StrCat(Cli(), " bench --quick --only dispatch --update-doc --repo ", repo.string(),
                                " --out ", (dir / "out").string()),
                   dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(
      r.err,
      HasSubstr("README.md lacks the lines '<!-- bench-summary: made by causeway bench --update-doc -->'"));
  EXPECT_FALSE(fs::exists(repo / "BENCHMARKS.md"));
  EXPECT_EQ(ReadFile(repo / "README.md"), "# A project\n\nNo table here.\n");
}

// Tests that --list names every suite and finds its binary.
TEST(BenchCommandTest, ListFindsEveryBinary) {
  fs::path dir = FreshDir("list");
  Ran r = RunShell(Cli() + " bench --list", dir);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> suites;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    ASSERT_EQ(parts.size(), 2u) << line;
    suites.push_back(parts[0]);
    EXPECT_TRUE(fs::exists(parts[1])) << line;
  }
  EXPECT_THAT(suites, ::testing::ElementsAre("dispatch", "scheduler", "ici", "dcn", "island", "matmul", "models"));
}

// Tests every suite in quick mode: each binary's --json output (kept in
// raw/) is a list of its results with positive figures, its text went to
// raw/SUITE.txt and not into the JSON, the report holds them all, and every
// plot was drawn.
TEST(BenchCommandTest, QuickEverySuite) {
  fs::path dir = FreshDir("all");
  fs::path out = dir / "out";
  Ran r = RunShell(absl::StrCat(Cli(), " bench --quick --out ", out.string()), dir);
  ASSERT_EQ(r.code, 0) << r.err;
  json report = json::parse(ReadFile(out / "results.json"));
  size_t total = 0;
  for (const std::string suite : {"dispatch", "scheduler", "ici", "dcn", "island", "matmul", "models"}) {
    SCOPED_TRACE(suite);
    json results = json::parse(ReadFile(out / "raw" / absl::StrCat(suite, ".json")));
    ExpectResults(results, suite);
    total += results.size();
    const std::string text = ReadFile(out / "raw" / absl::StrCat(suite, ".txt"));
    EXPECT_FALSE(text.empty());
    EXPECT_THAT(text, Not(HasSubstr("\"suite\"")));
  }
  EXPECT_EQ(report["results"].size(), total);
  ASSERT_EQ(report["suites"].size(), 7u);
  for (const json& s : report["suites"]) EXPECT_EQ(s["status"], "ok") << s.dump();
  if (HaveGnuplot()) {
    for (const char* plot :
         {"dispatch.svg", "scheduler_dispatch.svg", "pipeline.svg", "tenancy.svg", "ici_copy.svg",
          "allreduce.svg", "dcn.svg", "island_transfer.svg", "island_program.svg", "matmul.svg", "models.svg"}) {
      EXPECT_TRUE(fs::exists(out / plot)) << plot;
    }
  }
}

// Tests that --connect runs the island suite on running islands, started
// here as `causeway island` processes, and only them: with two, the
// transfer table between them (checked once, exactly, by the suite) and a
// note that the program table needs a third; with three, both tables.
TEST(BenchCommandTest, ConnectRunsTheIslandSuiteOnRunningIslands) {
  fs::path dir = FreshDir("connect");
  const std::vector<std::string> flags = {::causeway::testing::DeviceFlag(), "--accelerators=2"};
  ASSERT_OK_AND_ASSIGN(auto a, transport::IslandProcess::Start(Cli(), "bench-a", flags));
  ASSERT_OK_AND_ASSIGN(auto b, transport::IslandProcess::Start(Cli(), "bench-b", flags));
  Ran two = RunShell(absl::StrCat(Cli(), " bench --quick --only island --connect ", a->address(), ",",
                                  b->address(), " --out ", (dir / "two").string()),
                     dir);
  ASSERT_EQ(two.code, 0) << two.err;
  const json report = json::parse(ReadFile(dir / "two" / "results.json"));
  ASSERT_EQ(report["results"].size(), 1u) << report.dump();
  EXPECT_EQ(report["results"][0]["case"], "island transfer 1 MiB");
  EXPECT_THAT(report["suites"][0]["args"].dump(), HasSubstr(absl::StrCat("--connect=", a->address())));
  EXPECT_THAT(ReadFile(dir / "two" / "raw" / "island.txt"), HasSubstr("program: not run"));

  ASSERT_OK_AND_ASSIGN(
      auto c, transport::IslandProcess::Start(Cli(), "bench-c",
                                              {::causeway::testing::DeviceFlag(), "--accelerators=4"}));
  Ran three = RunShell(absl::StrCat(Cli(), " bench --quick --only island --connect ", a->address(), ",",
                                    b->address(), ",", c->address(), " --out ", (dir / "three").string()),
                       dir);
  ASSERT_EQ(three.code, 0) << three.err;
  EXPECT_EQ(json::parse(ReadFile(dir / "three" / "results.json"))["results"].size(), 2u);
  // The islands served it all: none ended.
  for (auto* island : {a.get(), b.get(), c.get()}) EXPECT_EQ(kill(island->pid(), 0), 0) << island->name();
}
#endif  // CAUSEWAY_BENCHMARKS_BUILT

// Tests that --connect is refused where no selected suite runs on islands,
// and --secret-file without it.
TEST(BenchCommandTest, ConnectIsForTheIslandSuite) {
  fs::path dir = FreshDir("connect-usage");
  Ran r = RunShell(absl::StrCat(Cli(), " bench --only dcn --connect 127.0.0.1:1,127.0.0.1:2 --out ",
                                (dir / "out").string()),
                   dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("causeway bench: --connect is for the island suite, which --only leaves out"));
  r = RunShell(absl::StrCat(Cli(), " bench --secret-file /nonexistent --out ", (dir / "out").string()), dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("causeway bench: --secret-file is for --connect"));
  EXPECT_FALSE(fs::exists(dir / "out" / "results.json"));
}

}  // namespace
#ifndef CAUSEWAY_BENCHMARKS_BUILT
// Tests that a causeway built without the benchmarks (the ASan build) says
// so and how to get them, rather than failing obscurely.
TEST(BenchCommandTest, WithoutBenchmarksSaysSo) {
  fs::path dir = FreshDir("not_built");
  Ran r = RunShell(absl::StrCat("CAUSEWAY_BENCH_DIR= ", Cli(), " bench --quick --only dispatch --out ",
                                (dir / "out").string()),
                   dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no benchmark binaries found"));
  EXPECT_THAT(r.err, HasSubstr("CAUSEWAY_BUILD_BENCHMARKS=OFF"));
  EXPECT_EQ(r.out, "");
}
#endif  // CAUSEWAY_BENCHMARKS_BUILT

}  // namespace causeway
