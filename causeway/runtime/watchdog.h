// A watchdog over accelerators: heartbeats catch dead processes, this catches
// stuck ones. When an accelerator has work in flight and has finished nothing
// for `after`, it reports one line naming the accelerator, its oldest
// unfinished submission (client, program, gang call, kernel:
// SubmitOptions::what) and how long that has been in flight; once per stuck
// submission, and again only when a later one is stuck. A busy accelerator
// that keeps finishing work is never reported.
//
//   Watchdog dog(runtime->accelerators(), absl::Seconds(10));  // stderr and trace
//
// A Runtime keeps one (RuntimeOptions::watchdog). Thread-safe.
#ifndef CAUSEWAY_RUNTIME_WATCHDOG_H_
#define CAUSEWAY_RUNTIME_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "causeway/runtime/accelerator.h"

namespace causeway {

// What an accelerator is running, for the watchdog and for a command stopped
// by a signal: "gang call 'spin' (kernel 'spin') of program 'p', in flight
// for 3.20 s (2 submissions in flight)".
std::string DescribeWorkInFlight(const WorkInFlight& work);

class Watchdog {
 public:
  // Called with each report's line (no newline), on the watchdog's thread;
  // must not call back into the watchdog. Default: the line on stderr and an
  // instant event "watchdog" in the trace.
  using Report = std::function<void(const std::string& line)>;
  // Watches `accelerators`, which must outlive it, looking every quarter of
  // `after` (at most every second). `after` must be finite and > 0.
  Watchdog(std::vector<Accelerator*> accelerators, absl::Duration after, Report report = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  absl::Duration after() const { return after_; }
  // How many lines it has reported.
  int reports() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  // Reports every accelerator stuck now that has not been reported for its
  // oldest submission yet.
  void Look() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<Accelerator*> accelerators_;
  const absl::Duration after_;
  const Report report_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int reports_ ABSL_GUARDED_BY(mu_) = 0;
  // Per accelerator, the timeline value of the submission last reported.
  absl::flat_hash_map<const Accelerator*, uint64_t> reported_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_WATCHDOG_H_
