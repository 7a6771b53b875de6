// Tracing: host spans, device timestamps, flows, gang calls and counters,
// collected in memory and written as Chrome trace JSON (docs/trace-format.md).
//
// Off by default (CAUSEWAY_TRACE=1, Tracer::Enable or a TraceSession turns it
// on). When off, a span or counter costs one relaxed atomic load and command
// lists are recorded without timestamp queries. Thread-safe.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(auto session, TraceSession::Start("run.json"));
//   ... run programs ...
//   CAUSEWAY_RETURN_IF_ERROR(session->Finish());   // writes run.json
#ifndef CAUSEWAY_BASE_TRACE_H_
#define CAUSEWAY_BASE_TRACE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace causeway {

struct TraceEvent {
  enum Kind {
    kHost,     // a span on a host thread
    kDevice,   // a span on an accelerator (one command of a submission)
    kInstant,  // a point on a host thread (gang calls)
    kCounter,  // a counter's new value
  } kind = kHost;
  std::string name;
  // kHost, kInstant: the thread's small id; kDevice: the accelerator index;
  // kCounter: the accelerator index, or -1 for a host-wide counter.
  int track = 0;
  // CLOCK_MONOTONIC nanoseconds (device times are placed on this clock).
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  uint64_t timeline_value = 0;  // kDevice: the submission's timeline value
  std::string list;             // kDevice: the command list's label
  // Nonzero: a flow from a host span (the submit) to a device span (the
  // first command of the submission), both carrying the same id.
  uint64_t flow = 0;
  double value = 0;  // kCounter
  // Further members of the event's "args" object, as JSON text without the
  // braces ("\"node\":\"mm\",\"bytes\":4096"); empty for none.
  std::string args;
};

// The flow id of accelerator `accelerator`'s submission `value`.
inline uint64_t TraceFlowId(int accelerator, uint64_t value) {
  return (static_cast<uint64_t>(accelerator) << 40) + value;
}

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(const std::string& s);

class Tracer {
 public:
  // Events kept before further ones are dropped (and counted).
  static constexpr size_t kMaxEvents = size_t{1} << 22;

  static Tracer& Get();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void Enable(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  void Add(TraceEvent event);
  // A counter's new value (when enabled); `track` as in TraceEvent.
  void Counter(std::string name, int track, double value);
  // A point event on this thread (when enabled).
  void Instant(std::string name, std::string args);
  // Everything collected so far, and clears it (and the dropped count).
  std::vector<TraceEvent> Take();
  uint64_t dropped() const;

  // Names this thread's track ("dispatcher", "completion 2"). Cheap; call it
  // when a thread starts, whether or not tracing is on.
  static void NameThread(std::string name);
  // Names an accelerator's track, with how its clock was placed on the
  // host's ("calibrated" or "measured").
  void NameAccelerator(int index, std::string name, std::string clock);
  // Every named thread and accelerator so far.
  absl::flat_hash_map<int, std::string> ThreadNames() const;
  absl::flat_hash_map<int, std::pair<std::string, std::string>> AcceleratorNames() const;

  static int64_t NowNs();  // CLOCK_MONOTONIC
  static int ThreadId();   // small per-thread id, stable for the thread's life

 private:
  Tracer();
  std::atomic<bool> enabled_{false};
  mutable absl::Mutex mu_;
  std::vector<TraceEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int, std::string> thread_names_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::pair<std::string, std::string>> accelerators_ ABSL_GUARDED_BY(mu_);
};

// Records a host span from construction to destruction when tracing is on.
// `args` (JSON members, as TraceEvent::args) may be set while the span is
// open, when it is worth building (active()).
class HostSpan {
 public:
  explicit HostSpan(const char* name)
      : name_(Tracer::Get().enabled() ? name : nullptr), begin_(name_ ? Tracer::NowNs() : 0) {}
  ~HostSpan();
  HostSpan(const HostSpan&) = delete;
  HostSpan& operator=(const HostSpan&) = delete;
  bool active() const { return name_ != nullptr; }
  void set_args(std::string args) { args_ = std::move(args); }
  void set_flow(uint64_t flow) { flow_ = flow; }

 private:
  const char* name_;
  int64_t begin_;
  uint64_t flow_ = 0;
  std::string args_;
};

// The Chrome trace JSON of `events` (docs/trace-format.md), with the names
// of threads and accelerators known to the tracer.
std::string ChromeTraceJson(const std::vector<TraceEvent>& events, uint64_t dropped = 0);

// Turns tracing on for its lifetime and writes everything recorded to a file.
// One at a time per process.
class TraceSession {
 public:
  // Fails at once if `path` cannot be written.
  static absl::StatusOr<std::unique_ptr<TraceSession>> Start(std::string path);
  // Writes the file (once) and turns tracing off; the path's events so far.
  absl::Status Finish();
  ~TraceSession();  // finishes, if not yet
  const std::string& path() const { return path_; }

 private:
  explicit TraceSession(std::string path) : path_(std::move(path)) {}
  std::string path_;
  bool finished_ = false;
};

}  // namespace causeway

#endif  // CAUSEWAY_BASE_TRACE_H_
