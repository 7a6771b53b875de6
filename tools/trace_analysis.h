// Reading trace files (docs/trace-format.md) and what the causeway tool
// computes from them: the summary (`causeway trace summarize`) and the gang
// order check (`causeway run --check-order`, `causeway trace check-order`).
#ifndef CAUSEWAY_TOOLS_TRACE_ANALYSIS_H_
#define CAUSEWAY_TOOLS_TRACE_ANALYSIS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace causeway::cli {

// A trace file's events, as the analyses need them. Times in ns.
struct ParsedTrace {
  struct Span {
    std::string name;
    int track = 0;  // host: thread id; device: accelerator index
    int64_t begin_ns = 0, end_ns = 0;
    uint64_t submission = 0;  // device spans, submit spans: the timeline value
    int accelerator = -1;     // submit spans: args.accelerator
    int command = 0;          // device spans: args.command
    std::string list;         // device spans: args.list
    // submit spans: what the submission waited on: (accelerator, value), or
    // (-1, 0) for a host gate.
    std::vector<std::pair<int, uint64_t>> waits;
  };
  struct GangCall {
    std::string island;
    // Which island of that name in the process (args.instance); 0 when the
    // trace does not say.
    uint64_t instance = 0;
    uint64_t sequence = 0;
    uint64_t client = 0;
    std::string node;
    int64_t ns = 0;
    struct Submission {
      int accelerator = 0;
      uint64_t value = 0;
      int commands = 0;
    };
    std::vector<Submission> submissions;
  };
  std::vector<Span> host;    // cat "host"
  std::vector<Span> device;  // cat "device"
  std::vector<GangCall> gang_calls;
  std::vector<std::string> accelerator_names;  // by index; "" when unnamed
  std::vector<std::string> thread_names;       // by thread id; "" when unnamed
  uint64_t dropped_events = 0;
};

// Parses a trace file's text; errors name what is wrong (not JSON, not a
// causeway trace, an event without a field it needs: its index and why).
// Events of other kinds and categories are ignored, so a trace that also
// holds other tools' events loads; a bare array of events (the other form
// of the Chrome format) is read as the traceEvents. `ts` and `dur` become ns,
// rounded to the nearest. ReadTraceFile streams the file: only one event at a
// time is held as JSON.
absl::StatusOr<ParsedTrace> ParseTrace(const std::string& json);
absl::StatusOr<ParsedTrace> ReadTraceFile(const std::string& path);

// One place where an accelerator ran gang calls out of the island's order,
// or a submission that should have run and has no device span.
struct OrderViolation {
  std::string island;
  int accelerator = -1;
  std::string message;  // a sentence naming the calls (sequence, node) and times
};
// Violations in a stable order: out-of-order calls by accelerator, island
// and sequence, then missing device spans in the order of the gang calls.
// A process may make several islands of one name one after another (each
// with its sequence from the start): a sequence that repeats within an
// island's name begins a new instance, checked as an island of its own and
// named "'local' #2" in messages.
// Device spans of submissions no gang call names (uploads, downloads, copies
// outside programs) are not checked. O(n log n) in the number of events.
std::vector<OrderViolation> CheckOrder(const ParsedTrace& trace);

// A distribution of durations. Percentiles are nearest-rank: pP of n sorted
// values is the value at rank ceil(P * n / 100) (1-based), so it is always
// one of the values.
struct Distribution {
  int64_t count = 0;
  int64_t min_ns = 0, p50_ns = 0, p90_ns = 0, p99_ns = 0, max_ns = 0;
  double mean_ns = 0;
  // Buckets [lower_ns, upper_ns) on a 1-2-5 scale (1 ns, 2 ns, 5 ns, 10 ns,
  // ...; values below 0 in one bucket from the smallest value), from the
  // first non-empty bucket to the last, empty ones between included.
  struct Bucket {
    int64_t lower_ns = 0, upper_ns = 0;
    int64_t count = 0;
  };
  std::vector<Bucket> histogram;
};

// What `causeway trace summarize` reports about a trace. Times in ns.
struct TraceSummary {
  // The wall time every utilization is measured against: from the first
  // device span's start to the last device span's end, over all
  // accelerators (so that accelerators are comparable). 0 without spans.
  int64_t wall_begin_ns = 0, wall_end_ns = 0;
  int64_t wall_ns() const { return wall_end_ns - wall_begin_ns; }
  uint64_t dropped_events = 0;
  int64_t gang_calls = 0;

  // Device time per kernel (device span name), most total time first.
  struct Kernel {
    std::string name;
    int64_t count = 0, total_ns = 0;
    double mean_ns = 0;
    int64_t p50_ns = 0, p99_ns = 0;
  };
  std::vector<Kernel> kernels;

  // An idle gap on an accelerator: from the end of its device spans to the
  // start of the next span of a different submission (a pause between the
  // commands of one submission is not a gap). What it waited on is read from
  // the submission that starts after it (docs/trace-format.md, `submit`):
  enum class GapCause {
    kDispatch,     // its submit span began after the gap began: the host was late
    kAccelerator,  // it waited on another accelerator's submission that ended in the gap
    kHostGate,     // it waited on a host gate (a receive, relay or host future)
    kQueue,        // submitted in time with nothing left to wait for: queue or driver latency
    kUnknown,      // no submit span for it in the trace
  };
  struct Gap {
    int64_t begin_ns = 0, end_ns = 0;
    uint64_t submission = 0;  // the submission that started at end_ns
    GapCause cause = GapCause::kUnknown;
    int waited_accelerator = -1;  // kAccelerator: what it waited on
    uint64_t waited_submission = 0;
    // "dispatch", "accelerator 1 (stage0/matmul)" (node/last kernel, or the
    // kernel alone outside gang calls), "host gate (a receive, relay or host
    // future)", "queue (submitted, nothing to wait for)", "unknown".
    std::string waited_on;
  };
  struct CauseTotal {
    std::string waited_on;  // as Gap::waited_on
    GapCause cause = GapCause::kUnknown;
    int64_t count = 0, total_ns = 0;
  };
  struct Accelerator {
    int index = 0;
    std::string name;  // from the trace's metadata; "" when unnamed
    int64_t device_spans = 0;
    int64_t busy_ns = 0;     // the union of its device spans
    double utilization = 0;  // busy_ns / wall_ns()
    int64_t gap_count = 0, gap_total_ns = 0;
    std::vector<Gap> largest_gaps;          // the longest, longest first
    std::vector<CauseTotal> gaps_by_cause;  // most time first
  };
  // Every accelerator with a device span or a name, by index.
  std::vector<Accelerator> accelerators;

  // From each submission's `submit` span start to its first device span's
  // start, over the submissions that have both.
  Distribution dispatch_latency;

  // Host spans per name, most total time first.
  struct HostSpanTotal {
    std::string name;
    int64_t count = 0, total_ns = 0;
  };
  std::vector<HostSpanTotal> host_spans;
};

struct SummaryOptions {
  int top_gaps = 5;  // how many of each accelerator's largest gaps to keep
};

// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(ParsedTrace trace, ReadTraceFile("run.json"));
//   std::printf("%s", SummaryText(Summarize(trace)).c_str());
TraceSummary Summarize(const ParsedTrace& trace, const SummaryOptions& options = {});
// For people: aligned tables, times in ns/µs/ms/s.
std::string SummaryText(const TraceSummary& summary);
// For programs: the same numbers, units in the keys ("total_ns"), as JSON.
std::string SummaryJson(const TraceSummary& summary);
// "dispatch", "accelerator", "host gate", "unknown".
const char* GapCauseName(TraceSummary::GapCause cause);

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_TRACE_ANALYSIS_H_
