// causeway trace: reads a trace file (docs/trace-format.md) written by
// --trace. `summarize` reports where the time went; `check-order` proves (or
// disproves) that every accelerator ran each island's gang calls in the
// island's one order.
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/trace_analysis.h"

namespace causeway::cli {
namespace {

constexpr char kUsage[] =
    "usage: causeway trace summarize FILE [--json] [--top N]\n"
    "       causeway trace check-order FILE\n"
    "\n"
    "Reads a trace file written by --trace (docs/trace-format.md).\n"
    "  summarize    device time per kernel; per accelerator its utilization, its idle\n"
    "               gaps and what each waited on; host dispatch latency; host spans\n"
    "  check-order  whether every accelerator ran each island's gang calls in the\n"
    "               island's order, and every submission that should have run did;\n"
    "               exits 1 if not\n"
    "'causeway trace SUBCOMMAND --help' for a subcommand's flags.\n";

constexpr char kSummarizeUsage[] =
    "usage: causeway trace summarize FILE [--json] [--top N]\n"
    "\n"
    "Summarizes a trace: device time per kernel (count, total, mean, p50, p99); per\n"
    "accelerator its utilization (busy over the time from the trace's first device\n"
    "span to its last), its idle gaps and what each waited on (dispatch, another\n"
    "accelerator, a host gate); the host's dispatch latency (submit to first device\n"
    "span); time per host span name. --json writes the same numbers as JSON.\n\n";

constexpr char kCheckOrderUsage[] =
    "usage: causeway trace check-order FILE\n"
    "\n"
    "Checks that every accelerator ran each island's gang calls in increasing\n"
    "sequence order, and that every submission with commands has device spans.\n"
    "Prints each violation, or one line saying all is in order; exits 1 on a\n"
    "violation.\n\n";

int Fail(const absl::Status& s, int code) { return cli::Fail("trace", s, code); }

// Parses a subcommand's flags and its one FILE; prints help when asked.
// Returns an exit code when the command is done (help or a usage error).
std::optional<int> ParseSubcommand(const char* name, Flags& flags, const std::vector<std::string>& args,
                                   const char* usage, std::string* path) {
  if (auto done = StartCommand(name, usage, flags, args, {1, "trace file"})) return done;
  *path = flags.positional()[0];
  return std::nullopt;
}

int SummarizeCommand(const std::vector<std::string>& args) {
  Flags flags({
      {"json", "write the summary as JSON", "", true},
      {"top", "how many of each accelerator's largest idle gaps to show", "5"},
  });
  std::string path;
  if (auto done = ParseSubcommand("trace summarize", flags, args, kSummarizeUsage, &path); done.has_value())
    return *done;
  auto top = flags.Int("top");
  if (!top.ok()) return Fail(top.status(), 2);
  if (*top < 0 || *top > 1'000'000) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--top must be 0..1000000, got ", *top)), 2);
  }
  auto trace = ReadTraceFile(path);
  if (!trace.ok()) return Fail(trace.status(), 1);
  SummaryOptions options;
  options.top_gaps = static_cast<int>(*top);
  TraceSummary summary = Summarize(*trace, options);
  std::string out = flags.Bool("json") ? SummaryJson(summary) : SummaryText(summary);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int CheckOrderCommand(const std::vector<std::string>& args) {
  Flags flags({});
  std::string path;
  if (auto done = ParseSubcommand("trace check-order", flags, args, kCheckOrderUsage, &path);
      done.has_value())
    return *done;
  auto trace = ReadTraceFile(path);
  if (!trace.ok()) return Fail(trace.status(), 1);
  std::set<int> accelerators;
  for (const auto& call : trace->gang_calls) {
    for (const auto& sub : call.submissions) accelerators.insert(sub.accelerator);
  }
  if (trace->dropped_events > 0) {
    std::fprintf(
        stderr,
        "causeway trace: note: the trace dropped %llu events; a missing device span may be one of them\n",
        static_cast<unsigned long long>(trace->dropped_events));
  }
  std::vector<OrderViolation> violations = CheckOrder(*trace);
  if (violations.empty()) {
    std::printf("order: %zu gang calls on %zu accelerators, all in order\n", trace->gang_calls.size(),
                accelerators.size());
    return 0;
  }
  for (const auto& v : violations) std::printf("%s\n", v.message.c_str());
  std::printf("order: %zu %s in %zu gang calls on %zu accelerators\n", violations.size(),
              violations.size() == 1 ? "violation" : "violations", trace->gang_calls.size(),
              accelerators.size());
  return 1;
}

}  // namespace

int TraceCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string& sub = args[0];
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::printf("%s", kUsage);
    return 0;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "summarize") return SummarizeCommand(rest);
  if (sub == "check-order") return CheckOrderCommand(rest);
  std::fprintf(stderr, "causeway trace: unknown subcommand '%s' (summarize or check-order)\n", sub.c_str());
  return 2;
}

}  // namespace causeway::cli
