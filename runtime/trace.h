// Tracing hooks: host spans and device timestamps, collected in memory.
//
// Off by default (CAUSEWAY_TRACE=1 or Tracer::Enable turns it on). When off, a
// span costs one relaxed atomic load and command lists are recorded without
// timestamp queries. Thread-safe.
#ifndef CAUSEWAY_RUNTIME_TRACE_H_
#define CAUSEWAY_RUNTIME_TRACE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace causeway {

struct TraceEvent {
  enum Kind { kHost, kDevice } kind = kHost;
  std::string name;
  // kHost: the thread's small id; kDevice: the accelerator index.
  int track = 0;
  // CLOCK_MONOTONIC nanoseconds (device times are placed on this clock).
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  uint64_t timeline_value = 0;  // kDevice: the submission's timeline value
  std::string list;             // kDevice: the command list's label
};

class Tracer {
 public:
  static Tracer& Get();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void Enable(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  void Add(TraceEvent event);
  // Everything collected so far, and clears it.
  std::vector<TraceEvent> Take();
  static int64_t NowNs();  // CLOCK_MONOTONIC
  static int ThreadId();   // small per-thread id, stable for the thread's life

 private:
  Tracer();
  std::atomic<bool> enabled_{false};
  absl::Mutex mu_;
  std::vector<TraceEvent> events_ ABSL_GUARDED_BY(mu_);
};

// Records a host span from construction to destruction when tracing is on.
class HostSpan {
 public:
  explicit HostSpan(const char* name)
      : name_(Tracer::Get().enabled() ? name : nullptr), begin_(name_ ? Tracer::NowNs() : 0) {}
  ~HostSpan() {
    if (name_ != nullptr) {
      Tracer::Get().Add({TraceEvent::kHost, name_, Tracer::ThreadId(), begin_, Tracer::NowNs(), 0, {}});
    }
  }
  HostSpan(const HostSpan&) = delete;
  HostSpan& operator=(const HostSpan&) = delete;

 private:
  const char* name_;
  int64_t begin_;
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_TRACE_H_
