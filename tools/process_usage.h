// A process's memory, descriptors and threads from /proc, the check that
// they stayed flat over a long run, and the verdict line (causeway soak).
#ifndef CAUSEWAY_TOOLS_PROCESS_USAGE_H_
#define CAUSEWAY_TOOLS_PROCESS_USAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace causeway::cli {

// -1 where /proc could not tell.
struct Usage {
  int64_t rss_kib = -1;
  int fds = -1;
  int threads = -1;
};
// Of "/proc/self" or "/proc/PID".
Usage ReadUsage(const std::string& proc);

// "12.5" MiB of `kib`, or "-" if unknown; a count or "-".
std::string Mib(int64_t kib);
std::string Count(int v);

// One usage sample of a run, `seconds` into it.
struct UsageSample {
  double seconds = 0;
  Usage self;
};

// Flat: the highest of the last third against the first sample after the
// warm-up (the first quarter, in which connections, caches and arenas reach
// their working size). Descriptors may grow by max(8, `fd_allowance`);
// RSS by 64 MiB (not checked under a sanitizer, whose allocator holds
// memory). Appends what grew to `failures`; returns the line that says what
// was checked.
std::string CheckFlat(const std::vector<UsageSample>& samples, absl::Duration duration,
                      absl::Duration report_every, int fd_allowance, std::vector<std::string>& failures);

// Prints a soak's last line, "soak: PASS: COUNTS" or "soak: FAIL: COUNTS;
// FAILURES" (and the failures on stderr); its exit code, 0 or 1.
int SoakVerdict(const std::string& counts, const std::vector<std::string>& failures);

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_PROCESS_USAGE_H_
