// Traces of a known program: the file is Chrome trace JSON with the tracks,
// events, flows, gang calls and counters that docs/trace-format.md promises,
// and device times sit on the host clock.
#include "causeway/base/trace.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/island.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr uint32_t kRows = 64, kK = 64;
constexpr int kRuns = 3;

int64_t Ns(const json& micros) { return static_cast<int64_t>(std::llround(micros.get<double>() * 1000)); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct TracedRun {
  json trace;
  int64_t begin_ns = 0, end_ns = 0;
};

// Runs a two-stage program (matmul on mesh A, its result moved to mesh B,
// matmul there, then an all-reduce on B) `kRuns` times in flight under a
// trace session; checks the results against the CPU; parses the file.
void RunTraced(const std::string& path, TracedRun* out) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto client, island->Connect("tracer"));
  ASSERT_OK_AND_ASSIGN(auto a, client->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(auto b, client->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(auto mm, Function::Matmul(kRows / 2, kK, kK));

  ASSERT_OK_AND_ASSIGN(auto session, TraceSession::Start(path));
  out->begin_ns = Tracer::NowNs();
  ProgramBuilder builder("traced");
  builder.Parameter("x", a, {kRows, kK}, DType::kF32, Sharding::Split(0));
  builder.Parameter("w", a, {kK, kK}, DType::kF32);
  builder.Parameter("v", b, {kK, kK}, DType::kF32);
  builder.Call("first", mm, a, {"x", "w"}, {"y"});
  builder.Call("second", mm, b, {"y", "v"}, {"z"});
  builder.AllReduce("sum", b, "z", "s");
  builder.Output("s");
  ASSERT_OK_AND_ASSIGN(auto program, builder.Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client->Load(program));

  std::vector<float> x = reference::RandomFloats(size_t{kRows} * kK, 1, -1, 1);
  std::vector<float> w = reference::RandomFloats(size_t{kK} * kK, 2, -0.3f, 0.3f);
  std::vector<float> v = reference::RandomFloats(size_t{kK} * kK, 3, -0.3f, 0.3f);
  ASSERT_OK_AND_ASSIGN(auto xa, client->CreateArray(a, {kRows, kK}, DType::kF32, Sharding::Split(0)));
  ASSERT_OK_AND_ASSIGN(auto wa, client->CreateArray(a, {kK, kK}, DType::kF32));
  ASSERT_OK_AND_ASSIGN(auto va, client->CreateArray(b, {kK, kK}, DType::kF32));
  ASSERT_OK(xa->Upload(x.data(), x.size() * 4));
  ASSERT_OK(wa->Upload(w.data(), w.size() * 4));
  ASSERT_OK(va->Upload(v.data(), v.size() * 4));
  std::vector<Execution> runs;
  for (int r = 0; r < kRuns; ++r) {
    ASSERT_OK_AND_ASSIGN(Execution run, client->Execute(exe, {xa, wa, va}));
    runs.push_back(run);
  }
  // z is split by rows over B: the all-reduce sums the two row blocks.
  std::vector<float> z = reference::Matmul(reference::Matmul(x, w, kRows, kK, kK), v, kRows, kK, kK);
  std::vector<float> expect(size_t{kRows / 2} * kK);
  for (size_t i = 0; i < expect.size(); ++i) expect[i] = z[i] + z[i + expect.size()];
  for (const Execution& run : runs) {
    ASSERT_OK(run.Await(absl::Now() + absl::Seconds(20)));
    std::vector<float> got(expect.size());
    ASSERT_OK(run.outputs[0]->Download(got.data(), got.size() * 4));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expect[i], 1e-3) << i;
  }
  out->end_ns = Tracer::NowNs();
  ASSERT_OK(session->Finish());
  out->trace = json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
}

TEST(TraceTest, KnownProgramHasTracksEventsFlowsGangCallsAndCounters) {
  const std::string path = ::testing::TempDir() + "/trace_test_known.json";
  TracedRun run;
  ASSERT_NO_FATAL_FAILURE(RunTraced(path, &run));
  const json& t = run.trace;
  ASSERT_FALSE(t.is_discarded()) << "not JSON: " << path;
  EXPECT_EQ(t["otherData"]["format"], "causeway-trace");
  EXPECT_EQ(t["otherData"]["dropped_events"], 0);
  ASSERT_TRUE(t["traceEvents"].is_array());

  std::map<int, std::string> accelerator_tracks;  // tid -> name
  std::map<std::string, int> host_spans;
  std::map<int, std::vector<json>> device;  // by accelerator
  std::map<int, std::vector<json>> host_by_tid;
  std::map<uint64_t, json> flow_starts, flow_ends;
  std::vector<json> gang_calls;
  std::map<std::string, std::vector<double>> counters;
  for (const json& e : t["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "thread_name" && e["pid"] == 2) {
      accelerator_tracks[e["tid"]] = e["args"]["name"];
      EXPECT_EQ(e["args"]["clock"], "calibrated") << "lavapipe has VK_EXT_calibrated_timestamps";
    } else if (ph == "X" && e["cat"] == "host") {
      host_spans[e["name"]]++;
      host_by_tid[e["tid"]].push_back(e);
    } else if (ph == "X" && e["cat"] == "device") {
      device[e["tid"]].push_back(e);
    } else if (ph == "s") {
      flow_starts[e["id"]] = e;
    } else if (ph == "f") {
      EXPECT_EQ(e["bp"], "e");
      flow_ends[e["id"]] = e;
    } else if (ph == "i" && e["name"] == "gang call") {
      gang_calls.push_back(e);
    } else if (ph == "C") {
      counters[e["name"]].push_back(e["args"]["value"]);
    }
  }

  // One track per accelerator, named.
  ASSERT_EQ(accelerator_tracks.size(), 4u);
  for (const auto& [tid, name] : accelerator_tracks) EXPECT_THAT(name, HasSubstr(absl::StrCat("accelerator ", tid)));
  // The host's steps.
  for (const char* name : {"build", "lower", "schedule", "dispatch", "submit", "complete"}) {
    EXPECT_GT(host_spans[name], 0) << name;
  }
  EXPECT_EQ(host_spans["build"], 1);
  EXPECT_EQ(host_spans["lower"], 1);

  // Device spans: two matmuls per device per run; on the host clock, inside
  // the session's window.
  int matmuls = 0;
  std::map<std::pair<int, uint64_t>, int64_t> first_start;  // (acc, submission) -> first span start
  for (const auto& [acc, spans] : device) {
    for (const json& e : spans) {
      matmuls += e["name"] == "matmul";
      int64_t begin = Ns(e["ts"]), end = begin + Ns(e["dur"]);
      EXPECT_GE(begin, run.begin_ns);
      EXPECT_LE(end, run.end_ns);
      auto key = std::make_pair(acc, e["args"]["submission"].get<uint64_t>());
      if (!first_start.count(key) || begin < first_start[key]) first_start[key] = begin;
    }
  }
  EXPECT_EQ(matmuls, kRuns * 4);

  // Flows: every submission that ran has one, from inside its submit span on
  // the submitting thread to its first device span.
  EXPECT_EQ(flow_ends.size(), first_start.size());
  for (const auto& [key, begin] : first_start) {
    uint64_t id = TraceFlowId(key.first, key.second);
    ASSERT_TRUE(flow_ends.count(id)) << "no flow into accelerator " << key.first << " submission " << key.second;
    ASSERT_TRUE(flow_starts.count(id)) << "no flow out for accelerator " << key.first << " submission " << key.second;
    EXPECT_EQ(flow_ends[id]["tid"], key.first);
    EXPECT_EQ(Ns(flow_ends[id]["ts"]), begin);
    const json& s = flow_starts[id];
    bool inside = false;
    for (const json& span : host_by_tid[s["tid"]]) {
      if (span["name"] != "submit") continue;
      if (span["args"]["accelerator"] == key.first && span["args"]["submission"] == key.second) {
        inside = Ns(span["ts"]) <= Ns(s["ts"]) && Ns(s["ts"]) <= Ns(span["ts"]) + Ns(span["dur"]);
        // The device starts after the host submits (the clocks agree to
        // well under the time a submission takes).
        EXPECT_GE(begin + 50'000, Ns(span["ts"]));
      }
    }
    EXPECT_TRUE(inside) << "flow " << id << " starts outside its submit span";
  }

  // Gang calls: one order; each call's submissions are the device spans'.
  ASSERT_EQ(gang_calls.size(), static_cast<size_t>(kRuns * 3));
  uint64_t last = 0;
  std::set<std::string> nodes;
  for (const json& g : gang_calls) {
    uint64_t seq = g["args"]["sequence"];
    EXPECT_GT(seq, last);
    last = seq;
    EXPECT_EQ(g["args"]["island"], "local");
    nodes.insert(g["args"]["node"].get<std::string>());
    ASSERT_EQ(g["args"]["submissions"].size(), 2u);
    for (const json& sub : g["args"]["submissions"]) {
      EXPECT_GT(sub["commands"].get<int>(), 0);
      EXPECT_TRUE(first_start.count({sub["accelerator"].get<int>(), sub["submission"].get<uint64_t>()}))
          << g.dump();
    }
  }
  EXPECT_EQ(nodes.size(), 3u);  // first, second (with its transfer), sum

  // Counters.
  for (int acc = 0; acc < 4; ++acc) {
    EXPECT_FALSE(counters[absl::StrCat("ring occupancy: accelerator ", acc)].empty()) << acc;
  }
  ASSERT_FALSE(counters["memory in use: accelerator 2"].empty());
  EXPECT_GT(*std::max_element(counters["memory in use: accelerator 2"].begin(),
                              counters["memory in use: accelerator 2"].end()),
            0);
  // y moves from A to B each run: its bytes over ICI, at least.
  ASSERT_FALSE(counters["ICI bytes"].empty());
  EXPECT_GE(counters["ICI bytes"].back(), kRuns * double{kRows} * kK * 4);
  std::remove(path.c_str());
}

TEST(TraceTest, SessionRefusesAnUnwritableFileAndASecondSession) {
  auto bad = TraceSession::Start("/nonexistent-dir/trace.json");
  EXPECT_ERROR(bad, absl::StatusCode::kInvalidArgument, "trace: cannot write '/nonexistent-dir/trace.json'");
  const std::string path = ::testing::TempDir() + "/trace_test_twice.json";
  auto first = TraceSession::Start(path);
  ASSERT_OK(first.status());
  auto second = TraceSession::Start(path);
  EXPECT_ERROR(second, absl::StatusCode::kFailedPrecondition,
               "a trace session is already open in this process");
  ASSERT_OK((*first)->Finish());
  EXPECT_FALSE(Tracer::Get().enabled());
  // An empty trace is still a valid file.
  json t = json::parse(ReadFile(path), nullptr, false);
  ASSERT_FALSE(t.is_discarded());
  EXPECT_TRUE(t["traceEvents"].is_array());
  std::remove(path.c_str());
}

TEST(TraceTest, JsonQuoteEscapes) {
  EXPECT_EQ(JsonQuote("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
  json parsed = json::parse(JsonQuote("tab\there \"quoted\""));
  EXPECT_EQ(parsed.get<std::string>(), "tab\there \"quoted\"");
}

// The measured clock offset (the fallback for drivers without calibrated
// timestamps) agrees with the calibrated one within half its bracket: the
// device's start lies between the host's two reads. The bracket is what the
// host's load made it, so the bound is its own, not a fixed time.
TEST(TraceTest, MeasuredClockOffsetAgreesWithCalibrated) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  ASSERT_EQ(acc->clock_source(), "calibrated");
  ASSERT_OK_AND_ASSIGN(Accelerator::ClockMeasurement measured, acc->MeasureClockOffset());
  ASSERT_OK(acc->CalibrateClock());
  EXPECT_GT(measured.bracket_ns, 0);
  // Plus 100 us for the calibrated reading's own deviation and the
  // timestamp's placement within the command list.
  EXPECT_NEAR(static_cast<double>(measured.offset_ns), static_cast<double>(acc->clock_offset_ns()),
              static_cast<double>(measured.bracket_ns) / 2 + 1e5)
      << "bracket " << measured.bracket_ns << " ns";
}

}  // namespace
}  // namespace causeway
