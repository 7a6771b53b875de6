// The start every benchmark binary's main shares, and its flags.
//
// Every benchmark takes three common flags: --quick (small sizes and few
// samples, so that a test runs it in seconds; not for figures),
// --json=FILE (where its Report goes, bench_report.h) and --samples=N (how
// many samples each figure is a median of; the benchmark's own number
// otherwise). Its own flags it declares with BenchFlags, --name=VALUE each,
// and its usage is made from them. A benchmark sets its quick defaults
// before parsing its own flags, so that a flag given still wins.
//
// Example:
//   int main(int argc, char** argv) {
//     const bench::CommonFlags common = bench::StartBenchmark("causeway_dcn_bench", argc, argv);
//     const int runs = common.SamplesOr(common.quick ? 1 : 9);
//     std::vector<uint64_t> sizes = {1 * kMiB, 4 * kMiB};
//     bench::BenchFlags flags;
//     flags.Sizes("sizes", &sizes, kMiB, 2048, "message sizes in MiB");
//     flags.Parse(argc, argv);
//     ...
//   }
#ifndef CAUSEWAY_BENCHMARKS_BENCH_MAIN_H_
#define CAUSEWAY_BENCHMARKS_BENCH_MAIN_H_

#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench_util.h"

namespace causeway::bench {

struct CommonFlags {
  std::string json;  // "" = no JSON
  bool quick = false;
  std::optional<int> samples;
  // --samples when given, else `otherwise`.
  int SamplesOr(int otherwise) const { return samples.value_or(otherwise); }
};

// Everything a benchmark's main does first: names the program (for Die),
// turns off Abseil's mutex deadlock detection (Debian's Abseil is built with
// it on, which walks a lock graph on every lock: the test suite keeps it,
// tools and benchmarks turn it off), ignores SIGPIPE (a peer that closes a
// socket is an error to report, not a reason to die), and takes the common
// flags out of argv. A bad common flag is fatal.
inline CommonFlags StartBenchmark(const char* name, int& argc, char** argv) {
  ProgramName() = name;
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  signal(SIGPIPE, SIG_IGN);
  CommonFlags flags;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (a == "--quick") {
      flags.quick = true;
    } else if (absl::ConsumePrefix(&a, "--json=")) {
      if (a.empty()) Die("--json needs a file name");
      flags.json = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--samples=")) {
      int n = 0;
      if (!absl::SimpleAtoi(a, &n) || n < 1 || n > 1000) Die(absl::StrCat("--samples must be 1..1000, got '", a, "'"));
      flags.samples = n;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return flags;
}

// A benchmark's own flags. Each Add keeps a pointer to where the value goes
// (its default is what is there); Parse fills them.
class BenchFlags {
 public:
  // An integer in [min, max].
  BenchFlags& Int(std::string name, int* value, int min, int max, std::string help) {
    flags_.push_back({std::move(name), std::move(help), absl::StrCat(*value), [=](absl::string_view v) {
                        int n = 0;
                        if (!absl::SimpleAtoi(v, &n) || n < min || n > max) {
                          return absl::StrCat("takes an integer from ", min, " to ", max);
                        }
                        *value = n;
                        return std::string();
                      }});
    return *this;
  }
  // Comma-separated integers from 1 to `max`, each times `unit` (sizes in
  // MiB: unit 1 << 20).
  BenchFlags& Sizes(std::string name, std::vector<uint64_t>* values, uint64_t unit, uint64_t max, std::string help) {
    std::vector<uint64_t> shown;
    for (uint64_t v : *values) shown.push_back(v / unit);
    flags_.push_back({std::move(name), std::move(help), absl::StrJoin(shown, ","), [=](absl::string_view v) {
                        std::vector<uint64_t> out;
                        for (absl::string_view s : absl::StrSplit(v, ',')) {
                          uint64_t n = 0;
                          if (!absl::SimpleAtoi(s, &n) || n == 0 || n > max) {
                            return absl::StrCat("takes integers from 1 to ", max, ", comma-separated; '", s,
                                                "' is not one");
                          }
                          out.push_back(n * unit);
                        }
                        *values = std::move(out);
                        return std::string();
                      }});
    return *this;
  }
  // One of `choices`.
  BenchFlags& Choice(std::string name, std::string* value, std::vector<std::string> choices, std::string help) {
    flags_.push_back({std::move(name), std::move(help), absl::StrJoin(choices, "|"), [=](absl::string_view v) {
                        for (const std::string& c : choices) {
                          if (v == c) {
                            *value = c;
                            return std::string();
                          }
                        }
                        return absl::StrCat("takes one of ", absl::StrJoin(choices, ", "));
                      }});
    return *this;
  }
  // Text the benchmark reads itself (`parse` says what is wrong, or "").
  BenchFlags& Text(std::string name, std::string shown, std::function<std::string(absl::string_view)> parse,
                   std::string help) {
    flags_.push_back({std::move(name), std::move(help), std::move(shown), std::move(parse)});
    return *this;
  }
  // A switch: --name sets it, --no-name clears it.
  BenchFlags& Switch(std::string name, bool* value, std::string help) {
    switches_.push_back({std::move(name), std::move(help), value});
    return *this;
  }

  // Parses what StartBenchmark left of argv. An unknown argument prints the
  // usage and exits 2; a bad value exits 2 naming the flag.
  void Parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      absl::string_view a = argv[i];
      if (!Take(a)) {
        std::fprintf(stderr, "%s: unknown argument '%s'\n%s", ProgramName(), argv[i], Usage().c_str());
        std::exit(2);
      }
    }
  }

  std::string Usage() const {
    std::string out = absl::StrCat("usage: ", ProgramName());
    for (const Flag& f : flags_) absl::StrAppend(&out, " [--", f.name, "=", f.shown, "]");
    for (const SwitchFlag& s : switches_) absl::StrAppend(&out, " [--[no-]", s.name, "]");
    absl::StrAppend(&out, " [--samples=N] [--quick] [--json=FILE]\n");
    for (const Flag& f : flags_) absl::StrAppend(&out, "  --", f.name, ": ", f.help, "\n");
    for (const SwitchFlag& s : switches_) absl::StrAppend(&out, "  --", s.name, ": ", s.help, "\n");
    return out;
  }

 private:
  struct Flag {
    std::string name, help, shown;
    std::function<std::string(absl::string_view)> parse;  // what is wrong, or ""
  };
  struct SwitchFlag {
    std::string name, help;
    bool* value;
  };

  bool Take(absl::string_view a) const {
    if (!absl::ConsumePrefix(&a, "--")) return false;
    for (const SwitchFlag& s : switches_) {
      if (a == s.name || a == "no-" + s.name) {
        *s.value = a == s.name;
        return true;
      }
    }
    for (const Flag& f : flags_) {
      absl::string_view v = a;
      if (!absl::ConsumePrefix(&v, f.name) || !absl::ConsumePrefix(&v, "=")) continue;
      if (std::string wrong = f.parse(v); !wrong.empty()) {
        std::fprintf(stderr, "%s: --%s %s, got '%s'\n", ProgramName(), f.name.c_str(), wrong.c_str(),
                     std::string(v).c_str());
        std::exit(2);
      }
      return true;
    }
    return false;
  }

  std::vector<Flag> flags_;
  std::vector<SwitchFlag> switches_;
};

}  // namespace causeway::bench

#endif  // CAUSEWAY_BENCHMARKS_BENCH_MAIN_H_
