#include "runtime/trace.h"

#include <time.h>

#include "runtime/instance.h"

namespace causeway {

Tracer::Tracer() { enabled_ = EnvFlag("CAUSEWAY_TRACE"); }

Tracer& Tracer::Get() {
  static Tracer* tracer = new Tracer();
  return *tracer;
}

void Tracer::Add(TraceEvent event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

std::vector<TraceEvent> Tracer::Take() {
  absl::MutexLock lock(&mu_);
  std::vector<TraceEvent> out;
  out.swap(events_);
  return out;
}

int64_t Tracer::NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int Tracer::ThreadId() {
  static std::atomic<int> next{1};
  thread_local int id = next.fetch_add(1);
  return id;
}

}  // namespace causeway
