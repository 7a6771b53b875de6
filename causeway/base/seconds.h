// A duration as messages about deadlines and hold limits print it: seconds
// to two places from 0.1 s up ("1.00 s"), milliseconds or microseconds
// below, so that a short deadline never reads as "0.00 s".
#ifndef CAUSEWAY_BASE_SECONDS_H_
#define CAUSEWAY_BASE_SECONDS_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace causeway {

inline std::string FormatSeconds(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "forever";
  if (d >= absl::Milliseconds(100)) return absl::StrFormat("%.2f s", absl::ToDoubleSeconds(d));
  if (d >= absl::Milliseconds(1)) return absl::StrFormat("%.1f ms", absl::ToDoubleMilliseconds(d));
  return absl::StrFormat("%.0f us", absl::ToDoubleMicroseconds(d));
}

}  // namespace causeway

#endif  // CAUSEWAY_BASE_SECONDS_H_
