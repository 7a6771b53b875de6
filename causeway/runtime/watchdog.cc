#include "causeway/runtime/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/seconds.h"
#include "causeway/base/trace.h"

namespace causeway {

std::string DescribeWorkInFlight(const WorkInFlight& work) {
  return absl::StrCat(
      work.what, ", in flight for ", FormatSeconds(work.since_submit),
      work.in_flight > 1 ? absl::StrCat(" (", work.in_flight, " submissions in flight)") : "");
}

Watchdog::Watchdog(std::vector<Accelerator*> accelerators, absl::Duration after, Report report)
    : accelerators_(std::move(accelerators)), after_(after), report_(std::move(report)) {
  thread_ = std::thread([this] { Loop(); });
}

Watchdog::~Watchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int Watchdog::reports() const {
  absl::MutexLock lock(&mu_);
  return reports_;
}

void Watchdog::Loop() {
  Tracer::NameThread("watchdog");
  const absl::Duration period = std::clamp(after_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    // Wakes at once when told to stop.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period);
    if (!stop_) Look();
  }
}

void Watchdog::Look() {
  for (const Accelerator* a : accelerators_) {
    const std::optional<WorkInFlight> work = a->OldestInFlight();
    // Stuck: nothing finished for `after`, and its oldest unfinished
    // submission was there all that time (an idle accelerator given new work
    // is not).
    if (!work.has_value() || work->since_progress < after_ || work->since_submit < after_) continue;
    auto [it, fresh] = reported_.try_emplace(a, work->value);
    if (!fresh && it->second == work->value) continue;
    it->second = work->value;
    ++reports_;
    const std::string line = absl::StrCat(
        "causeway: watchdog: ", a->name(), " has finished nothing for ", FormatSeconds(work->since_progress),
        "; its oldest unfinished submission: ", DescribeWorkInFlight(*work));
    if (report_) {
      report_(line);
      continue;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    Tracer::Get().Instant("watchdog",
                          absl::StrCat("\"accelerator\":", a->index(), ",\"what\":", JsonQuote(work->what),
                                       ",\"in_flight_s\":", absl::ToDoubleSeconds(work->since_submit)));
  }
}

}  // namespace causeway
