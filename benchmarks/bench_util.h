// Helpers shared by the benchmarks: medians, alternating samples, and
// aborting with a clear message (a benchmark that cannot run or gets a wrong
// result stops; it never prints figures for work it did not do).
#ifndef CAUSEWAY_BENCHMARKS_BENCH_UTIL_H_
#define CAUSEWAY_BENCHMARKS_BENCH_UTIL_H_

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "causeway/base/env.h"

namespace causeway::bench {

// The name printed before a benchmark's fatal messages; set by main.
inline const char*& ProgramName() {
  static const char* name = "bench";
  return name;
}

// What a benchmark's heading says of where it ran: "; N CPUs" (those this
// process may use) and ", LP_NUM_THREADS=N" when lavapipe's threads are set.
inline std::string MachineNote() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  sched_getaffinity(0, sizeof(cpus), &cpus);
  std::string note = absl::StrCat(CPU_COUNT(&cpus), " CPUs");
  if (std::optional<std::string> lp = EnvValue("LP_NUM_THREADS"); lp.has_value()) {
    absl::StrAppend(&note, ", LP_NUM_THREADS=", *lp);
  }
  return note;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", ProgramName(), what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

inline void CheckOk(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return std::move(v).value();
}

// Runs `samples` rounds; in each, every case once, the order rotated round by
// round so no case always follows the same one. Returns each case's values.
inline std::vector<std::vector<double>> Alternate(int samples, const std::vector<std::function<double()>>& cases) {
  std::vector<std::vector<double>> out(cases.size());
  for (int r = 0; r < samples; ++r) {
    for (size_t j = 0; j < cases.size(); ++j) {
      size_t c = (j + r) % cases.size();
      out[c].push_back(cases[c]());
    }
  }
  return out;
}

}  // namespace causeway::bench

#define CHECK_OK(expr) ::causeway::bench::CheckOk((expr), #expr)

#endif  // CAUSEWAY_BENCHMARKS_BENCH_UTIL_H_
