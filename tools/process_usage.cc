#include "tools/process_usage.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace causeway::cli {
namespace {

// Descriptors may grow this much at least after the warm-up.
constexpr int kFdAllowanceLeast = 8;
// Memory: a leak of anything a soak's run or step makes goes past 64 MiB in
// minutes. Below that, RSS moves for reasons that are not leaks: malloc's
// arenas (one per thread, up to 8 per core, which reconnects' new threads
// may touch for the first time late in a run) and heap fragmentation.
constexpr int64_t kRssAllowanceKib = 64 * 1024;
// Under AddressSanitizer freed memory waits in a quarantine (256 MiB by
// default) and ThreadSanitizer keeps a history per thread, so RSS climbs
// with no leak at all: there only descriptors are checked.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCheckRss = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kCheckRss = false;
#else
constexpr bool kCheckRss = true;
#endif
#else
constexpr bool kCheckRss = true;
#endif

}  // namespace

Usage ReadUsage(const std::string& proc) {
  Usage u;
  std::ifstream status(proc + "/status");
  std::string line;
  while (std::getline(status, line)) {
    int64_t v = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %" SCNd64, &v) == 1) u.rss_kib = v;
    if (std::sscanf(line.c_str(), "Threads: %" SCNd64, &v) == 1) u.threads = static_cast<int>(v);
  }
  std::error_code ec;
  int fds = 0;
  for (auto it = std::filesystem::directory_iterator(proc + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  if (!ec) u.fds = fds;
  return u;
}

std::string Mib(int64_t kib) {
  return kib < 0 ? "-" : absl::StrFormat("%.1f", static_cast<double>(kib) / 1024);
}

std::string Count(int v) { return v < 0 ? "-" : absl::StrCat(v); }

std::string CheckFlat(const std::vector<UsageSample>& samples, absl::Duration duration,
                      absl::Duration report_every, int fd_allowance, std::vector<std::string>& failures) {
  fd_allowance = std::max(fd_allowance, kFdAllowanceLeast);
  const double warm = absl::ToDoubleSeconds(duration) / 4, tail = absl::ToDoubleSeconds(duration) * 2 / 3;
  const UsageSample* base = nullptr;
  for (const UsageSample& s : samples) {
    if (s.seconds >= warm) {
      base = &s;
      break;
    }
  }
  int max_fds = -1;
  int64_t max_rss = -1;
  for (const UsageSample& s : samples) {
    if (&s == base || s.seconds < tail) continue;
    max_fds = std::max(max_fds, s.self.fds);
    max_rss = std::max(max_rss, s.self.rss_kib);
  }
  if (base == nullptr || max_fds < 0) {
    return absl::StrCat("not checked: no samples after the warm-up and in the last third (--report-every ",
                        absl::FormatDuration(report_every), " for --duration ",
                        absl::FormatDuration(duration), ")");
  }
  if (max_fds > base->self.fds + fd_allowance) {
    failures.push_back(absl::StrCat("descriptors grew from ", base->self.fds, " to ", max_fds));
  }
  if (kCheckRss && max_rss > base->self.rss_kib + kRssAllowanceKib) {
    failures.push_back(absl::StrCat("RSS grew from ", Mib(base->self.rss_kib), " to ", Mib(max_rss), " MiB"));
  }
  return absl::StrFormat("fds %d -> at most %d (allowed +%d), RSS %s -> at most %s MiB %s", base->self.fds,
                         max_fds, fd_allowance, Mib(base->self.rss_kib), Mib(max_rss),
                         kCheckRss ? absl::StrCat("(allowed +", Mib(kRssAllowanceKib), ")")
                                   : "(not checked: a sanitizer's allocator holds memory)");
}

int SoakVerdict(const std::string& counts, const std::vector<std::string>& failures) {
  const std::string joined = absl::StrJoin(failures, "; ");
  std::printf("soak: %s: %s%s\n", failures.empty() ? "PASS" : "FAIL", counts.c_str(),
              failures.empty() ? "" : absl::StrCat("; ", joined).c_str());
  std::fflush(stdout);
  if (failures.empty()) return 0;
  std::fprintf(stderr, "causeway soak: %s\n", joined.c_str());
  return 1;
}

}  // namespace causeway::cli
