#include "tools/trace_analysis.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "causeway/base/trace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

// Every synthetic time is this base plus whole µs, so that ts is far from 0
// as on a real host clock.
constexpr int64_t kBase = 5'000'000'000;
int64_t At(int64_t us) { return kBase + us * 1000; }

TraceEvent Device(int accelerator, uint64_t submission, std::string name, int64_t begin_us, int64_t end_us) {
  TraceEvent e;
  e.kind = TraceEvent::kDevice;
  e.name = std::move(name);
  e.track = accelerator;
  e.begin_ns = At(begin_us);
  e.end_ns = At(end_us);
  e.timeline_value = submission;
  e.list = "list";
  return e;
}

TraceEvent Host(std::string name, int64_t begin_us, int64_t end_us, std::string args = "") {
  TraceEvent e;
  e.kind = TraceEvent::kHost;
  e.name = std::move(name);
  e.track = 1;
  e.begin_ns = At(begin_us);
  e.end_ns = At(end_us);
  e.args = std::move(args);
  return e;
}

// A submit span of 1 µs; `waits` is the JSON list's inside.
TraceEvent Submit(int accelerator, uint64_t submission, int64_t begin_us, std::string waits = "") {
  TraceEvent e = Host("submit", begin_us, begin_us + 1,
                      absl::StrCat("\"accelerator\":", accelerator, ",\"submission\":", submission,
                                   ",\"waits\":[", waits, "]"));
  e.flow = TraceFlowId(accelerator, submission);
  return e;
}

// A gang call; `subs` are (accelerator, submission, commands).
TraceEvent GangCall(const std::string& island, uint64_t sequence, const std::string& node, int64_t at_us,
                    const std::vector<std::tuple<int, uint64_t, int>>& subs, uint64_t instance = 0) {
  std::string list;
  for (const auto& [acc, value, commands] : subs) {
    absl::StrAppend(&list, list.empty() ? "" : ",", "{\"accelerator\":", acc, ",\"submission\":", value,
                    ",\"commands\":", commands, "}");
  }
  TraceEvent e;
  e.kind = TraceEvent::kInstant;
  e.name = "gang call";
  e.track = 1;
  e.begin_ns = e.end_ns = At(at_us);
  e.args = absl::StrCat("\"island\":", JsonQuote(island), ",\"sequence\":", sequence,
                        ",\"client\":1,\"node\":", JsonQuote(node), ",\"submissions\":[", list, "]");
  if (instance != 0) absl::StrAppend(&e.args, ",\"instance\":", instance);
  return e;
}

// The summary scenario (times in µs after kBase):
//
//   accelerator 0: sub1 matmul [0,10) add [10,12)
//                  gap [12,20): sub2 submitted at 15           -> dispatch
//                  sub2 matmul [20,30)
//                  gap [30,40): sub3 waits on 2/1 (ends 33) and
//                               1/1 (ends 38)                  -> accelerator 1 (stage1/matmul)
//                  sub3 matmul [40,50)
//                  gap [50,55): sub4 waits on a host gate (and
//                               on 1/1, which ended before)    -> host gate
//                  sub4 add [55,57)
//                  gap [57,60): sub5 waits on nothing          -> queue
//                  sub5 matmul [60,68) add [69,70)  (a pause inside one submission: no gap)
//   accelerator 1: sub1 matmul [28,38); gap [38,80) sub2 submitted at 70 -> dispatch; sub2 matmul [80,100)
//   accelerator 2: sub1 copy [31,33)
std::vector<TraceEvent> SummaryScenario() {
  return {
      Host("build", -100, -80),
      Host("dispatch", -10, -5),
      Host("dispatch", 20, 25),
      Submit(0, 1, -3),
      Submit(0, 2, 15),
      Submit(0, 3, 25, "{\"accelerator\":2,\"submission\":1},{\"accelerator\":1,\"submission\":1}"),
      Submit(0, 4, 45, "{\"host\":true},{\"accelerator\":1,\"submission\":1}"),
      Submit(0, 5, 50),
      Submit(1, 1, 20),
      Submit(1, 2, 70),
      Submit(2, 1, 30),
      GangCall("i0", 1, "stage0", -4, {{0, 1, 2}}),
      GangCall("i0", 2, "stage1", 19, {{1, 1, 1}}),
      GangCall("i0", 3, "stage2", 24, {{0, 3, 1}}),
      Device(0, 1, "matmul", 0, 10),
      Device(0, 1, "add", 10, 12),
      Device(0, 2, "matmul", 20, 30),
      Device(0, 3, "matmul", 40, 50),
      Device(0, 4, "add", 55, 57),
      Device(0, 5, "matmul", 60, 68),
      Device(0, 5, "add", 69, 70),
      Device(1, 1, "matmul", 28, 38),
      Device(1, 2, "matmul", 80, 100),
      Device(2, 1, "copy", 31, 33),
  };
}

// The order scenario: islands "a" (calls 1..3) and "b" (calls 1..2), every
// call on accelerators 0 and 1, interleaved differently on each; an upload
// outside any gang call; a wait-only submission (no commands) of b2.
struct OrderScenario {
  std::vector<TraceEvent> calls = {
      GangCall("a", 1, "a1", 0, {{0, 1, 1}, {1, 1, 1}}),
      GangCall("b", 1, "b1", 1, {{0, 2, 1}, {1, 3, 1}}),
      GangCall("a", 2, "a2", 2, {{0, 3, 1}, {1, 2, 1}}),
      GangCall("b", 2, "b2", 3, {{0, 4, 1}, {1, 5, 1}, {1, 6, 0}}),
      GangCall("a", 3, "a3", 4, {{0, 5, 1}, {1, 4, 1}}),
  };
  std::vector<TraceEvent> device = {
      Device(0, 1, "k", 0, 10),  Device(0, 2, "k", 10, 20), Device(0, 3, "k", 20, 30),
      Device(0, 4, "k", 30, 40), Device(0, 5, "k", 40, 50), Device(0, 7, "upload", 1, 2),
      Device(1, 1, "k", 5, 15),  Device(1, 2, "k", 15, 25), Device(1, 3, "k", 25, 35),
      Device(1, 4, "k", 35, 45), Device(1, 5, "k", 45, 55),
  };
  std::vector<TraceEvent> All() const {
    std::vector<TraceEvent> all = calls;
    all.insert(all.end(), device.begin(), device.end());
    return all;
  }
};

ParsedTrace MustParse(const std::string& text) {
  absl::StatusOr<ParsedTrace> trace = ParseTrace(text);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *std::move(trace) : ParsedTrace();
}

const TraceSummary::Kernel* FindKernel(const TraceSummary& s, const std::string& name) {
  for (const auto& k : s.kernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

// Tests that the writer's JSON reads back with every field the analyses use.
TEST(ParseTraceTest, ReadsWhatTheWriterWrites) {
  ParsedTrace t = MustParse(ChromeTraceJson(SummaryScenario(), 7));
  EXPECT_EQ(t.dropped_events, 7u);
  ASSERT_THAT(t.device, SizeIs(10));
  EXPECT_EQ(t.device[0].name, "matmul");
  EXPECT_EQ(t.device[0].track, 0);
  EXPECT_EQ(t.device[0].begin_ns, At(0));
  EXPECT_EQ(t.device[0].end_ns, At(10));
  EXPECT_EQ(t.device[0].submission, 1u);
  EXPECT_EQ(t.device[0].list, "list");
  ASSERT_THAT(t.host, SizeIs(11));
  const ParsedTrace::Span& submit = t.host[6];  // Submit(0, 4, 45, host gate + 1/1)
  EXPECT_EQ(submit.name, "submit");
  EXPECT_EQ(submit.accelerator, 0);
  EXPECT_EQ(submit.submission, 4u);
  EXPECT_EQ(submit.begin_ns, At(45));
  ASSERT_THAT(submit.waits, SizeIs(2));
  EXPECT_EQ(submit.waits[0], (std::pair<int, uint64_t>{-1, 0}));
  EXPECT_EQ(submit.waits[1], (std::pair<int, uint64_t>{1, 1}));
  ASSERT_THAT(t.gang_calls, SizeIs(3));
  EXPECT_EQ(t.gang_calls[1].island, "i0");
  EXPECT_EQ(t.gang_calls[1].sequence, 2u);
  EXPECT_EQ(t.gang_calls[1].node, "stage1");
  EXPECT_EQ(t.gang_calls[1].client, 1u);
  EXPECT_EQ(t.gang_calls[1].ns, At(19));
  ASSERT_THAT(t.gang_calls[0].submissions, SizeIs(1));
  EXPECT_EQ(t.gang_calls[0].submissions[0].accelerator, 0);
  EXPECT_EQ(t.gang_calls[0].submissions[0].value, 1u);
  EXPECT_EQ(t.gang_calls[0].submissions[0].commands, 2);
}

// Tests that ts and dur become exact ns past what a double holds, rounded to
// the nearest ns, and that names come from the metadata.
TEST(ParseTraceTest, TimesAreExactNanosecondsAndNamesAreRead) {
  ParsedTrace t = MustParse(R"json({"traceEvents":[
    {"ph":"M","name":"thread_name","pid":2,"tid":1,"args":{"name":"accelerator 1 (llvmpipe)","clock":"measured"}},
    {"ph":"M","name":"thread_name","pid":1,"tid":2,"args":{"name":"dispatcher"}},
    {"ph":"X","cat":"device","name":"k","pid":2,"tid":1,"ts":9876543210123.457,"dur":0.0005,
     "args":{"submission":3,"list":"l","command":2}},
    {"ph":"X","cat":"host","name":"h","pid":1,"tid":2,"ts":12,"dur":1.25,"args":{}}]})json");
  ASSERT_THAT(t.device, SizeIs(1));
  EXPECT_EQ(t.device[0].begin_ns, 9876543210123457);
  EXPECT_EQ(t.device[0].end_ns, 9876543210123458);
  EXPECT_EQ(t.device[0].command, 2);
  ASSERT_THAT(t.host, SizeIs(1));
  EXPECT_EQ(t.host[0].begin_ns, 12000);
  EXPECT_EQ(t.host[0].end_ns, 13250);
  EXPECT_EQ(t.host[0].track, 2);
  ASSERT_THAT(t.accelerator_names, SizeIs(2));
  EXPECT_EQ(t.accelerator_names[1], "accelerator 1 (llvmpipe)");
  ASSERT_THAT(t.thread_names, SizeIs(3));
  EXPECT_EQ(t.thread_names[2], "dispatcher");
}

// Tests that events of other kinds and categories (a Perfetto-style file)
// are skipped, and that the bare-list form of the format is read.
TEST(ParseTraceTest, IgnoresOtherEventsAndReadsTheListForm) {
  ParsedTrace t = MustParse(R"([
    {"ph":"B","name":"frame","pid":9,"tid":9,"ts":1},
    {"ph":"X","cat":"gpu","name":"draw","pid":9,"tid":9,"ts":"not ours","dur":1},
    {"ph":"C","name":"ICI bytes","pid":1,"ts":3,"args":{"value":5}},
    {"ph":"i","s":"t","cat":"other","name":"gang call","pid":1,"tid":1,"ts":4},
    {"ph":"s","cat":"dispatch","name":"dispatch","pid":1,"tid":1,"ts":5,"id":7},
    {"ph":"X","cat":"device","name":"k","pid":2,"tid":0,"ts":6,"dur":2,"args":{"submission":1}},
    {"ph":"M","name":"thread_name","pid":77,"tid":123456,"args":{"name":"elsewhere"}}
  ])");
  ASSERT_THAT(t.device, SizeIs(1));
  EXPECT_EQ(t.device[0].begin_ns, 6000);
  EXPECT_EQ(t.device[0].end_ns, 8000);
  EXPECT_THAT(t.host, SizeIs(0));
  EXPECT_THAT(t.gang_calls, SizeIs(0));
}

// Tests that malformed files give errors naming the problem, never a crash.
TEST(ParseTraceTest, MalformedInputNamesTheProblem) {
  auto not_json = ParseTrace("this is not json");
  ASSERT_FALSE(not_json.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(not_json.status()));
  EXPECT_THAT(not_json.status().message(), HasSubstr("not valid JSON"));

  std::string whole = ChromeTraceJson(SummaryScenario());
  auto truncated = ParseTrace(whole.substr(0, whole.size() / 2));
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), HasSubstr("truncated"));

  auto no_events = ParseTrace(R"({"displayTimeUnit":"ns","otherData":{"format":"causeway-trace"}})");
  ASSERT_FALSE(no_events.ok());
  EXPECT_THAT(no_events.status().message(), HasSubstr("no \"traceEvents\""));

  auto events_not_list = ParseTrace(R"({"traceEvents":{"ph":"X"}})");
  ASSERT_FALSE(events_not_list.ok());
  EXPECT_THAT(events_not_list.status().message(), HasSubstr("\"traceEvents\" is an object, not a list"));

  auto bad_ts = ParseTrace(R"({"traceEvents":[
    {"ph":"M","name":"process_name","pid":1,"args":{"name":"host"}},
    {"ph":"X","cat":"device","name":"matmul","pid":2,"tid":0,"ts":"abc","dur":1,"args":{"submission":1}}]})");
  ASSERT_FALSE(bad_ts.ok());
  EXPECT_EQ(bad_ts.status().message(),
            "event 1 (ph \"X\", \"matmul\"): \"ts\" must be a number (µs), got \"abc\"");

  auto no_submission = ParseTrace(R"({"traceEvents":[
    {"ph":"X","cat":"host","name":"submit","pid":1,"tid":1,"ts":1,"dur":1,"args":{"accelerator":0,"waits":[]}}]})");
  ASSERT_FALSE(no_submission.ok());
  EXPECT_EQ(no_submission.status().message(),
            "event 0 (ph \"X\", \"submit\"): \"args.submission\" is missing");

  auto bad_wait = ParseTrace(R"({"traceEvents":[
    {"ph":"X","cat":"host","name":"submit","pid":1,"tid":1,"ts":1,"dur":1,
     "args":{"accelerator":0,"submission":2,"waits":[{"host":true},{"accelerator":-1,"submission":1}]}}]})");
  ASSERT_FALSE(bad_wait.ok());
  EXPECT_EQ(bad_wait.status().message(),
            "event 0 (ph \"X\", \"submit\"): \"args.waits[1].accelerator\" must be 0..65535, got -1");

  auto negative_dur = ParseTrace(R"({"traceEvents":[
    {"ph":"X","cat":"device","name":"k","pid":2,"tid":0,"ts":1,"dur":-2.5,"args":{"submission":1}}]})");
  ASSERT_FALSE(negative_dur.ok());
  EXPECT_THAT(negative_dur.status().message(), HasSubstr("\"dur\" must not be negative, got -2.5"));

  auto not_object = ParseTrace(R"({"traceEvents":[{"ph":"M","name":"x","pid":1}, 42]})");
  ASSERT_FALSE(not_object.ok());
  EXPECT_THAT(not_object.status().message(), HasSubstr("event 1 is a number (42), not an object"));

  auto other_format = ParseTrace(R"({"otherData":{"format":"something-else"},"traceEvents":[]})");
  ASSERT_FALSE(other_format.ok());
  EXPECT_THAT(other_format.status().message(), HasSubstr("not a causeway trace"));

  auto missing_file = ReadTraceFile(::testing::TempDir() + "/no-such-trace.json");
  ASSERT_FALSE(missing_file.ok());
  EXPECT_THAT(missing_file.status().message(), HasSubstr("no-such-trace.json"));
}

// Tests the per-kernel numbers: count, total, mean, nearest-rank p50 and p99.
TEST(SummarizeTest, KernelTimes) {
  TraceSummary s = Summarize(MustParse(ChromeTraceJson(SummaryScenario())));
  ASSERT_THAT(s.kernels, SizeIs(3));
  EXPECT_EQ(s.kernels[0].name, "matmul");  // most total time first
  const TraceSummary::Kernel* matmul = FindKernel(s, "matmul");
  ASSERT_NE(matmul, nullptr);
  // 10, 10, 10, 10, 8, 20 µs.
  EXPECT_EQ(matmul->count, 6);
  EXPECT_EQ(matmul->total_ns, 68000);
  EXPECT_DOUBLE_EQ(matmul->mean_ns, 68000.0 / 6);
  EXPECT_EQ(matmul->p50_ns, 10000);
  EXPECT_EQ(matmul->p99_ns, 20000);
  const TraceSummary::Kernel* add = FindKernel(s, "add");
  ASSERT_NE(add, nullptr);
  // 2, 2, 1 µs.
  EXPECT_EQ(add->count, 3);
  EXPECT_EQ(add->total_ns, 5000);
  EXPECT_DOUBLE_EQ(add->mean_ns, 5000.0 / 3);
  EXPECT_EQ(add->p50_ns, 2000);
  EXPECT_EQ(add->p99_ns, 2000);
  const TraceSummary::Kernel* copy = FindKernel(s, "copy");
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->count, 1);
  EXPECT_EQ(copy->p50_ns, 2000);
}

// Tests busy time and utilization against the whole trace's wall time.
TEST(SummarizeTest, Utilization) {
  TraceSummary s = Summarize(MustParse(ChromeTraceJson(SummaryScenario())));
  EXPECT_EQ(s.wall_begin_ns, At(0));
  EXPECT_EQ(s.wall_end_ns, At(100));
  EXPECT_EQ(s.wall_ns(), 100000);
  ASSERT_THAT(s.accelerators, SizeIs(3));
  EXPECT_EQ(s.accelerators[0].index, 0);
  EXPECT_EQ(s.accelerators[0].device_spans, 7);
  EXPECT_EQ(s.accelerators[0].busy_ns, 43000);
  EXPECT_DOUBLE_EQ(s.accelerators[0].utilization, 0.43);
  EXPECT_EQ(s.accelerators[1].busy_ns, 30000);
  EXPECT_DOUBLE_EQ(s.accelerators[1].utilization, 0.30);
  EXPECT_EQ(s.accelerators[2].busy_ns, 2000);
  EXPECT_DOUBLE_EQ(s.accelerators[2].utilization, 0.02);
}

// Tests that busy time is the union of overlapping spans.
TEST(SummarizeTest, OverlappingSpansCountOnce) {
  TraceSummary s = Summarize(MustParse(ChromeTraceJson({
      Device(0, 1, "a", 0, 10),
      Device(0, 1, "b", 5, 8),
      Device(0, 2, "c", 9, 20),
      Device(1, 1, "d", 0, 40),
  })));
  ASSERT_THAT(s.accelerators, SizeIs(2));
  EXPECT_EQ(s.accelerators[0].busy_ns, 20000);
  EXPECT_DOUBLE_EQ(s.accelerators[0].utilization, 0.5);
  EXPECT_EQ(s.accelerators[0].gap_count, 0);
}

// Tests one gap of each cause, a pause inside one submission that is not a
// gap, and the totals per cause.
TEST(SummarizeTest, GapsAndWhatTheyWaitedOn) {
  TraceSummary s = Summarize(MustParse(ChromeTraceJson(SummaryScenario())));
  ASSERT_THAT(s.accelerators, SizeIs(3));
  const TraceSummary::Accelerator& a0 = s.accelerators[0];
  EXPECT_EQ(a0.gap_count, 4);
  EXPECT_EQ(a0.gap_total_ns, 26000);
  ASSERT_THAT(a0.largest_gaps, SizeIs(4));
  const auto& to_accelerator = a0.largest_gaps[0];
  EXPECT_EQ(to_accelerator.begin_ns, At(30));
  EXPECT_EQ(to_accelerator.end_ns, At(40));
  EXPECT_EQ(to_accelerator.submission, 3u);
  EXPECT_EQ(to_accelerator.cause, TraceSummary::GapCause::kAccelerator);
  EXPECT_EQ(to_accelerator.waited_accelerator, 1);
  EXPECT_EQ(to_accelerator.waited_submission, 1u);
  EXPECT_EQ(to_accelerator.waited_on, "accelerator 1 (stage1/matmul)");
  const auto& dispatch = a0.largest_gaps[1];
  EXPECT_EQ(dispatch.begin_ns, At(12));
  EXPECT_EQ(dispatch.end_ns, At(20));
  EXPECT_EQ(dispatch.cause, TraceSummary::GapCause::kDispatch);
  EXPECT_EQ(dispatch.waited_on, "dispatch");
  const auto& host_gate = a0.largest_gaps[2];
  EXPECT_EQ(host_gate.end_ns - host_gate.begin_ns, 5000);
  EXPECT_EQ(host_gate.submission, 4u);
  EXPECT_EQ(host_gate.cause, TraceSummary::GapCause::kHostGate);
  EXPECT_EQ(host_gate.waited_on, "host gate (a receive, relay or host future)");
  const auto& queue = a0.largest_gaps[3];
  EXPECT_EQ(queue.begin_ns, At(57));
  EXPECT_EQ(queue.end_ns, At(60));
  EXPECT_EQ(queue.cause, TraceSummary::GapCause::kQueue);
  EXPECT_EQ(queue.waited_on, "queue (submitted, nothing to wait for)");
  ASSERT_THAT(a0.gaps_by_cause, SizeIs(4));
  EXPECT_EQ(a0.gaps_by_cause[0].waited_on, "accelerator 1 (stage1/matmul)");
  EXPECT_EQ(a0.gaps_by_cause[0].total_ns, 10000);
  EXPECT_EQ(a0.gaps_by_cause[1].waited_on, "dispatch");
  EXPECT_EQ(a0.gaps_by_cause[1].count, 1);
  EXPECT_EQ(a0.gaps_by_cause[1].total_ns, 8000);

  const TraceSummary::Accelerator& a1 = s.accelerators[1];
  EXPECT_EQ(a1.gap_count, 1);
  EXPECT_EQ(a1.gap_total_ns, 42000);
  ASSERT_THAT(a1.gaps_by_cause, SizeIs(1));
  EXPECT_EQ(a1.gaps_by_cause[0].cause, TraceSummary::GapCause::kDispatch);
  EXPECT_EQ(s.accelerators[2].gap_count, 0);

  // --top keeps the largest.
  SummaryOptions options;
  options.top_gaps = 1;
  TraceSummary top = Summarize(MustParse(ChromeTraceJson(SummaryScenario())), options);
  ASSERT_THAT(top.accelerators[0].largest_gaps, SizeIs(1));
  EXPECT_EQ(top.accelerators[0].largest_gaps[0].submission, 3u);
  EXPECT_EQ(top.accelerators[0].gap_count, 4);
}

// Tests the dispatch latency distribution and its histogram.
TEST(SummarizeTest, DispatchLatency) {
  TraceSummary s = Summarize(MustParse(ChromeTraceJson(SummaryScenario())));
  const Distribution& d = s.dispatch_latency;
  // 1, 3, 5, 8, 10, 10, 10, 15 µs.
  EXPECT_EQ(d.count, 8);
  EXPECT_EQ(d.min_ns, 1000);
  EXPECT_EQ(d.p50_ns, 8000);
  EXPECT_EQ(d.p90_ns, 15000);
  EXPECT_EQ(d.p99_ns, 15000);
  EXPECT_EQ(d.max_ns, 15000);
  EXPECT_DOUBLE_EQ(d.mean_ns, 7750);
  ASSERT_THAT(d.histogram, SizeIs(4));
  EXPECT_EQ(d.histogram[0].lower_ns, 1000);
  EXPECT_EQ(d.histogram[0].upper_ns, 2000);
  EXPECT_EQ(d.histogram[0].count, 1);
  EXPECT_EQ(d.histogram[1].count, 1);
  EXPECT_EQ(d.histogram[2].lower_ns, 5000);
  EXPECT_EQ(d.histogram[2].count, 2);
  EXPECT_EQ(d.histogram[3].lower_ns, 10000);
  EXPECT_EQ(d.histogram[3].upper_ns, 20000);
  EXPECT_EQ(d.histogram[3].count, 4);
}

// Tests host span totals per name, most time first.
TEST(SummarizeTest, HostSpans) {
  TraceSummary s = Summarize(MustParse(ChromeTraceJson(SummaryScenario())));
  ASSERT_THAT(s.host_spans, SizeIs(3));
  EXPECT_EQ(s.host_spans[0].name, "build");
  EXPECT_EQ(s.host_spans[0].count, 1);
  EXPECT_EQ(s.host_spans[0].total_ns, 20000);
  EXPECT_EQ(s.host_spans[1].name, "dispatch");
  EXPECT_EQ(s.host_spans[1].count, 2);
  EXPECT_EQ(s.host_spans[1].total_ns, 10000);
  EXPECT_EQ(s.host_spans[2].name, "submit");
  EXPECT_EQ(s.host_spans[2].count, 8);
  EXPECT_EQ(s.host_spans[2].total_ns, 8000);
}

// Tests that the text and JSON forms carry the numbers.
TEST(SummarizeTest, TextAndJson) {
  TraceSummary s = Summarize(MustParse(ChromeTraceJson(SummaryScenario())));
  std::string text = SummaryText(s);
  EXPECT_THAT(text, HasSubstr("43.0%"));
  EXPECT_THAT(text, HasSubstr("accelerator 1 (stage1/matmul)"));
  EXPECT_THAT(text, HasSubstr("68.0 µs"));  // matmul's total
  nlohmann::json j = nlohmann::json::parse(SummaryJson(s));
  EXPECT_EQ(j["wall_ns"], 100000);
  EXPECT_EQ(j["kernels"][0]["total_ns"], 68000);
  EXPECT_EQ(j["accelerators"][0]["busy_ns"], 43000);
  EXPECT_EQ(j["accelerators"][0]["largest_gaps"][0]["cause"], "accelerator");
  EXPECT_EQ(j["accelerators"][0]["largest_gaps"][0]["waited_accelerator"], 1);
  EXPECT_EQ(j["dispatch_latency"]["p50_ns"], 8000);
  EXPECT_EQ(j["host_spans"][2]["total_ns"], 8000);
}

// Tests that an in-order trace (two accelerators, two islands interleaved
// differently on each, an upload, a wait-only submission) passes.
TEST(CheckOrderTest, InOrderPasses) {
  ParsedTrace t = MustParse(ChromeTraceJson(OrderScenario().All()));
  ASSERT_THAT(t.gang_calls, SizeIs(5));
  std::vector<OrderViolation> v = CheckOrder(t);
  EXPECT_THAT(v, SizeIs(0)) << (v.empty() ? "" : v[0].message);
}

// Tests that swapping two calls' device times on one accelerator is caught,
// naming both calls and the accelerator.
TEST(CheckOrderTest, CatchesSwappedCalls) {
  OrderScenario scenario;
  // Accelerator 1 runs a2 [5,15) before a1 [15,25).
  scenario.device[6] = Device(1, 1, "k", 15, 25);
  scenario.device[7] = Device(1, 2, "k", 5, 15);
  std::vector<OrderViolation> v = CheckOrder(MustParse(ChromeTraceJson(scenario.All())));
  ASSERT_THAT(v, SizeIs(1));
  EXPECT_EQ(v[0].accelerator, 1);
  EXPECT_EQ(v[0].island, "a");
  EXPECT_EQ(
      v[0].message,
      "accelerator 1: island 'a' call 2 (node 'a2') ran from 5000005.000 µs to 5000015.000 µs, entirely "
      "before call 1 (node 'a1'), which ran from 5000015.000 µs to 5000025.000 µs");
}

// Tests that a call starting while an earlier one still runs is caught.
TEST(CheckOrderTest, CatchesOverlap) {
  OrderScenario scenario;
  // On accelerator 0, a1 runs on to 16 µs; a2 starts at 15.
  scenario.device[0] = Device(0, 1, "k", 0, 16);
  scenario.device[2] = Device(0, 3, "k", 15, 30);
  std::vector<OrderViolation> v = CheckOrder(MustParse(ChromeTraceJson(scenario.All())));
  ASSERT_THAT(v, SizeIs(1));
  EXPECT_EQ(v[0].accelerator, 0);
  EXPECT_THAT(v[0].message,
              HasSubstr("call 2 (node 'a2') started at 5000015.000 µs, before call 1 (node 'a1') "
                        "ended at 5000016.000 µs"));
}

// Tests that a submission with commands and no device span is reported.
TEST(CheckOrderTest, CatchesMissingDeviceSpan) {
  OrderScenario scenario;
  scenario.device.erase(scenario.device.begin() + 3);  // b2 on accelerator 0
  std::vector<OrderViolation> v = CheckOrder(MustParse(ChromeTraceJson(scenario.All())));
  ASSERT_THAT(v, SizeIs(1));
  EXPECT_EQ(v[0].accelerator, 0);
  EXPECT_EQ(v[0].island, "b");
  EXPECT_EQ(v[0].message,
            "accelerator 0: island 'b' call 2 (node 'b2') submitted 1 command as submission 4, which has no "
            "device span");
}

// Tests that an island made again under the same name (its sequence starts
// over) is checked as an order of its own, and named apart in messages.
TEST(CheckOrderTest, IslandMadeAgainUnderTheSameName) {
  std::vector<TraceEvent> events = {
      GangCall("local", 1, "s0", 0, {{0, 1, 1}}),
      GangCall("local", 2, "s1", 1, {{0, 2, 1}}),
      Device(0, 1, "k", 0, 10),
      Device(0, 2, "k", 10, 20),
      GangCall("local", 1, "s0", 30, {{0, 3, 1}}),
      GangCall("local", 2, "s1", 31, {{0, 4, 1}}),
      Device(0, 3, "k", 30, 40),
      Device(0, 4, "k", 40, 50),
  };
  EXPECT_THAT(CheckOrder(MustParse(ChromeTraceJson(events))), SizeIs(0));
  // The second instance runs its call 2 before its call 1.
  events[6] = Device(0, 3, "k", 40, 50);
  events[7] = Device(0, 4, "k", 30, 40);
  std::vector<OrderViolation> v = CheckOrder(MustParse(ChromeTraceJson(events)));
  ASSERT_THAT(v, SizeIs(1));
  EXPECT_EQ(v[0].island, "local");
  EXPECT_THAT(v[0].message,
              HasSubstr("accelerator 0: island 'local' #2 call 2 (node 's1') ran from 5000030.000 µs"));
}

// Two islands of one name at once (args.instance tells them apart): their
// calls interleave on a shared accelerator, each island in its own order.
TEST(CheckOrderTest, IslandsOfOneNameToldApartByInstance) {
  std::vector<TraceEvent> events = {
      GangCall("local", 1, "a0", 0, {{0, 1, 1}}, 1),
      GangCall("local", 1, "b0", 1, {{0, 2, 1}}, 2),
      GangCall("local", 2, "a1", 2, {{0, 3, 1}}, 1),
      GangCall("local", 2, "b1", 3, {{0, 4, 1}}, 2),
      Device(0, 1, "k", 0, 10),
      Device(0, 2, "k", 10, 20),
      Device(0, 3, "k", 20, 30),
      Device(0, 4, "k", 30, 40),
  };
  EXPECT_THAT(CheckOrder(MustParse(ChromeTraceJson(events))), SizeIs(0));
  // Island 2 runs its call 2 before its call 1.
  events[5] = Device(0, 2, "k", 30, 40);
  events[7] = Device(0, 4, "k", 10, 20);
  std::vector<OrderViolation> v = CheckOrder(MustParse(ChromeTraceJson(events)));
  ASSERT_THAT(v, SizeIs(1));
  EXPECT_THAT(v[0].message, HasSubstr("island 'local' (instance 2) call 2 (node 'b1')"));
}

// The causeway binary, run through the shell.
struct Cli {
  int exit_code;
  std::string out;
};
Cli RunCli(const std::string& args) {
  std::string command = absl::StrCat("'", ::causeway::testing::CliPath(), "' ", args);
  Cli result{-1, ""};
  std::FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), p)) > 0) result.out.append(buffer, n);
  int status = pclose(p);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Tests `causeway trace summarize`, text and JSON.
TEST(TraceCommandTest, Summarize) {
  std::string path = WriteFile("trace_command_summary.json", ChromeTraceJson(SummaryScenario()));
  Cli text = RunCli(absl::StrCat("trace summarize '", path, "'"));
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_THAT(text.out, HasSubstr("43.0%"));
  EXPECT_THAT(text.out, HasSubstr("host gate (a receive, relay or host future)"));

  Cli json = RunCli(absl::StrCat("trace summarize '", path, "' --json --top 2"));
  ASSERT_EQ(json.exit_code, 0);
  nlohmann::json j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  EXPECT_EQ(j["accelerators"][0]["busy_ns"], 43000);
  EXPECT_EQ(j["accelerators"][0]["largest_gaps"].size(), 2u);
  EXPECT_EQ(j["kernels"][0]["p99_ns"], 20000);
}

// Tests `causeway trace check-order` exit codes and output.
TEST(TraceCommandTest, CheckOrder) {
  OrderScenario good;
  std::string good_path = WriteFile("trace_command_good.json", ChromeTraceJson(good.All()));
  Cli ok = RunCli(absl::StrCat("trace check-order '", good_path, "'"));
  EXPECT_EQ(ok.exit_code, 0);
  EXPECT_EQ(ok.out, "order: 5 gang calls on 2 accelerators, all in order\n");

  OrderScenario bad;
  bad.device[6] = Device(1, 1, "k", 15, 25);
  bad.device[7] = Device(1, 2, "k", 5, 15);
  std::string bad_path = WriteFile("trace_command_bad.json", ChromeTraceJson(bad.All()));
  Cli violation = RunCli(absl::StrCat("trace check-order '", bad_path, "'"));
  EXPECT_EQ(violation.exit_code, 1);
  EXPECT_THAT(violation.out,
              HasSubstr("accelerator 1: island 'a' call 2 (node 'a2') ran from 5000005.000 µs"));
  EXPECT_THAT(violation.out, HasSubstr("order: 1 violation in 5 gang calls on 2 accelerators"));
}

// Tests help, usage errors (exit 2, stderr) and failures (exit 1).
TEST(TraceCommandTest, HelpAndErrors) {
  Cli help = RunCli("trace --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("usage: causeway trace summarize FILE"));
  Cli sub_help = RunCli("trace summarize --help");
  EXPECT_EQ(sub_help.exit_code, 0);
  EXPECT_THAT(sub_help.out, HasSubstr("--top"));

  Cli no_file = RunCli("trace summarize 2>&1");
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_EQ(
      no_file.out,
      "causeway trace summarize: expected one trace file, got none (causeway trace summarize --help)\n");
  Cli two_files = RunCli("trace check-order a.json b.json 2>&1");
  EXPECT_EQ(two_files.exit_code, 2);
  EXPECT_THAT(two_files.out, HasSubstr("causeway trace check-order: expected one trace file, got 2"));
  Cli unknown = RunCli("trace frobnicate 2>/dev/null");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(unknown.out, "");
  Cli bad_top = RunCli("trace summarize x.json --top lots 2>/dev/null");
  EXPECT_EQ(bad_top.exit_code, 2);

  std::string broken = WriteFile("trace_command_broken.json", "{\"traceEvents\": [");
  Cli failed = RunCli(absl::StrCat("trace check-order '", broken, "' 2>&1"));
  EXPECT_EQ(failed.exit_code, 1);
  EXPECT_THAT(failed.out, HasSubstr("causeway trace: trace '"));
  EXPECT_THAT(failed.out, HasSubstr("truncated"));
}

}  // namespace
}  // namespace causeway::cli
