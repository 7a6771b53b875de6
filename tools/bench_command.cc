// causeway bench: runs the benchmark suite and writes its report.
//
// Each suite is a benchmark binary (benchmarks/), run as a child process with
// --json=FILE (and --quick, --samples when asked); its text goes to
// OUT/raw/SUITE.txt, its stderr to OUT/raw/SUITE.stderr.txt, its results
// (benchmarks/bench_report.h) to OUT/raw/SUITE.json. Then, in OUT:
//
//   results.json   {"schema": "causeway-bench/1", "command", "date", "quick",
//                   "git": {"commit", "dirty"}, "machine": {...},
//                   "suites": [{"name", "binary", "args", "status", ...}],
//                   "results": [every suite's results, as the binaries wrote them]}
//   results.csv    one row per result, the same rows in the same order
//   *.svg          plots drawn by gnuplot from plots.gp (skipped, with a
//                  note, when gnuplot is not installed)
//   BENCHMARKS.md  the machine, the command, one table per benchmark group,
//                  the plots
//
// --update-doc also writes the repository's BENCHMARKS.md, with the plots in
// docs/bench/. A suite that fails is reported with its stderr; the others
// still run and the command exits 1. Adding a suite is adding an entry to
// kSuites (and its plots to kPlots): a suite binary starts with
// benchmarks/bench_main.h.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/env.h"
#include "causeway/base/seconds.h"
#include "causeway/base/status.h"
#include "causeway/base/subprocess.h"
#include "causeway/runtime/instance.h"
#include "causeway/runtime/memory.h"
#include "causeway/runtime/runtime.h"
#include "tools/build_paths.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/interrupt.h"

extern char** environ;

namespace causeway::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps the order the benchmarks wrote

// --- the suites and their plots ---------------------------------------------

// One benchmark binary. It takes the common flags of benchmarks/bench_main.h:
// --quick (small sizes, few samples: seconds), --json=FILE and --samples=N.
struct Suite {
  const char* name;
  const char* binary;
  const char* what;  // one line, for --list and BENCHMARKS.md
  // Runs on running islands with --connect (and --secret-file).
  bool connects = false;
};

const Suite kSuites[] = {
    {"dispatch", "causeway_dispatch_bench", "per-dispatch cost against raw Vulkan calls"},
    {"scheduler", "causeway_scheduler_bench",
     "Pathways dispatch (OpByOp, Chained, Fused), pipeline dispatch, multi-tenancy"},
    {"ici", "causeway_ici_bench",
     "copies between accelerators against memcpy; all-reduce bus bandwidth against the copy"},
    {"dcn", "causeway_dcn_bench", "transfers between two processes against plain TCP"},
    {"island", "causeway_island_bench",
     "island processes: transfers against plain TCP; a program over two islands against one", true},
    {"matmul", "causeway_matmul_bench", "GEMM kernels in GFLOP/s against OpenBLAS sgemm on the same cores"},
    {"models", "causeway_models_bench",
     "the language model's training tokens/s: SPMD against GPipe pipelines and two islands (Pathways' Table "
     "2), and with a checkpoint every step"},
};

// A plot of one group of a suite's results. Bars (x_param empty): one
// cluster per case, the baseline's median beside Causeway's. Lines: the
// value against params[x_param] / x_scale, one line per value of
// params[series_param] (one line when empty; a number is labelled
// series_prefix + number), and the baselines as dashed lines of their own
// (one per series when baseline_per_series, else one: the first value at
// each x).
struct Plot {
  const char* file;
  const char* title;
  const char* suite;
  const char* group;
  const char* x_param;
  const char* x_label;
  double x_scale;
  const char* series_param;
  const char* series_prefix;
  bool log_x, log_y, baseline_per_series;
};

const Plot kPlots[] = {
    {"dispatch.svg", "Per-dispatch cost: Causeway against raw Vulkan", "dispatch", "dispatch", "", "", 1, "",
     "", false, false, false},
    {"scheduler_dispatch.svg", "Pathways dispatch microbenchmark (paper Fig. 5)", "scheduler", "dispatch",
     "accelerators", "accelerators", 1, "mode", "", true, true, false},
    {"pipeline.svg", "Pipeline: Causeway against a hand-written async chain", "scheduler", "pipeline",
     "stages", "stages", 1, "mode", "", false, false, true},
    {"tenancy.svg", "Multi-tenancy: clients on one island", "scheduler", "tenancy", "clients", "clients", 1,
     "", "", true, false, false},
    {"ici_copy.svg", "Copy between accelerators against memcpy", "ici", "copy", "bytes", "size (MiB)",
     1 << 20, "method", "", true, false, false},
    {"allreduce.svg", "All-reduce bus bandwidth against copy bandwidth", "ici", "allreduce", "bytes",
     "size a device (MiB)", 1 << 20, "accelerators", "all-reduce, n=", true, true, false},
    {"dcn.svg", "DCN transfer between processes against TCP", "dcn", "transfer", "bytes", "size (MiB)",
     1 << 20, "", "", true, false, false},
    {"island_transfer.svg", "Transfer between island processes against TCP", "island", "transfer", "bytes",
     "size (MiB)", 1 << 20, "", "", true, false, false},
    {"island_program.svg", "A program over two islands against one island", "island", "program", "", "", 1,
     "", "", false, false, false},
    {"matmul.svg", "GEMM kernel against OpenBLAS sgemm (GFLOP/s)", "matmul", "gemm", "", "", 1, "", "", false,
     false, false},
    {"models.svg", "Language model training: tokens/s by layout", "models", "train", "", "", 1, "", "", false,
     false, false},
};

const Suite* FindSuite(absl::string_view name) {
  for (const Suite& s : kSuites) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::string SuiteNames() {
  std::vector<std::string> names;
  for (const Suite& s : kSuites) names.push_back(s.name);
  return absl::StrJoin(names, ", ");
}

// --- finding the binaries -----------------------------------------------------

std::string SelfDirectory() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "" : self.parent_path().string();
}

// Where the benchmark binaries may be, in order: $CAUSEWAY_BENCH_DIR, the
// build tree's benchmarks directory (when this causeway was built with
// them), beside the causeway binary, and the installed libexec directory.
std::vector<std::string> BenchDirectories() {
  std::vector<std::string> dirs;
  if (std::string env = EnvString("CAUSEWAY_BENCH_DIR"); !env.empty()) dirs.push_back(env);
  if (std::string built = BuiltBenchDirectory(); !built.empty()) dirs.push_back(built);
  if (std::string self = SelfDirectory(); !self.empty()) {
    dirs.push_back(self);
    dirs.push_back((fs::path(self).parent_path() / "libexec" / "causeway").string());
  }
  dirs.push_back(LibexecDirectory());
  std::vector<std::string> unique;
  for (const std::string& d : dirs) {
    if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
  }
  return unique;
}

// The path of `binary` in the first of `dirs` that holds it, or "".
std::string FindBinary(const std::vector<std::string>& dirs, const std::string& binary) {
  for (const std::string& d : dirs) {
    std::string path = (fs::path(d) / binary).string();
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// --- small helpers --------------------------------------------------------------

absl::Status WriteFile(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last `lines` lines of `text`.
std::string Tail(const std::string& text, int lines) {
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (int n = 0; n < lines && pos != std::string::npos && pos > 0; ++n) pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos || pos == 0 ? text : text.substr(pos + 1);
}

std::string ShellQuote(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=/.,:@+") ==
          std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string FormatDuration(double seconds) {
  int s = static_cast<int>(seconds);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// A figure with as many digits as it needs to be read: 292288, 19.3, 1.05.
std::string Figure(double v) {
  if (!std::isfinite(v)) return "-";
  double a = std::fabs(v);
  if (a >= 1000) return absl::StrFormat("%.0f", v);
  if (a >= 100) return absl::StrFormat("%.1f", v);
  if (a >= 0.1 || a == 0) return absl::StrFormat("%.2f", v);
  return absl::StrFormat("%.3g", v);
}

double Number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}
std::string Text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// A param as text: strings as they are, numbers without a trailing ".0".
std::string ParamText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return absl::StrFormat("%.12g", v.get<double>());
  return v.dump();
}

// Runs `argv` with stdin from /dev/null and stdout and stderr into files (""
// = /dev/null), calling `tick` about every 100 ms while it runs. Returns the
// wait status; `argv[0]` is looked up in PATH when it has no slash. Still
// running `deadline` from now, it gets SIGTERM, then SIGKILL 2 s later, and
// the result is DeadlineExceeded saying so.
absl::StatusOr<int> Spawn(const std::vector<std::string>& argv, const std::string& out,
                          const std::string& err, const std::function<void()>& tick,
                          absl::Duration deadline = absl::InfiniteDuration()) {
  SpawnOptions options;
  options.argv = argv;
  options.stdout_path = out.empty() ? "/dev/null" : out;
  options.stderr_path = err.empty() ? "/dev/null" : err;
  // The child starts with no signal blocked (SpawnOptions' default): this
  // process blocks the stop signals (interrupt.h), and a child that
  // inherited that could not be stopped.
  CAUSEWAY_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(options));
  const pid_t pid = child.pid();
  // Stopped by a signal, bench stops what it runs.
  SetInterruptHook([pid] { kill(pid, SIGTERM); });
  struct ClearHook {
    ~ClearHook() { SetInterruptHook(nullptr); }
  } clear_hook;
  const absl::Time start = absl::Now();
  std::optional<int> stopped_with;  // the signal sent past the deadline
  for (;;) {
    const absl::Duration ran = absl::Now() - start;
    absl::StatusOr<int> status =
        child.Wait(absl::Now() + std::clamp(deadline - ran, absl::Milliseconds(1), absl::Milliseconds(100)));
    if (status.ok()) {
      if (!stopped_with.has_value()) return *status;
      return absl::DeadlineExceededError(absl::StrCat("ran past its deadline of ", FormatSeconds(deadline),
                                                      " and was stopped (", strsignal(*stopped_with), ")"));
    }
    if (!absl::IsDeadlineExceeded(status.status())) return status.status();
    if (!stopped_with.has_value() && absl::Now() - start > deadline) {
      stopped_with = SIGTERM;
      child.Signal(SIGTERM);
    } else if (stopped_with == SIGTERM && absl::Now() - start > deadline + absl::Seconds(2)) {
      stopped_with = SIGKILL;
      child.Signal(SIGKILL);
    }
    if (tick) tick();
  }
}

// Runs a shell command and returns its stdout without the trailing newline,
// or "" when it failed.
std::string CommandOutput(const std::string& command) {
  std::FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return "";
  return std::string(absl::StripTrailingAsciiWhitespace(out));
}

// --- the machine ------------------------------------------------------------

json MachineFacts() {
  json m;
  std::string cpuinfo = ReadFile("/proc/cpuinfo");
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    if (absl::StartsWith(line, "model name")) {
      m["cpu"] = std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      break;
    }
  }
  m["cores"] = std::thread::hardware_concurrency();
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) m["usable_cores"] = CPU_COUNT(&cpus);
  for (absl::string_view line : absl::StrSplit(ReadFile("/proc/meminfo"), '\n')) {
    uint64_t kib = 0;
    if (absl::ConsumePrefix(&line, "MemTotal:") &&
        absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line), " kB"), &kib)) {
      m["memory_bytes"] = kib * 1024;
    }
  }
  utsname u;
  if (uname(&u) == 0) m["kernel"] = absl::StrCat(u.sysname, " ", u.release, " ", u.machine);
  for (absl::string_view line : absl::StrSplit(ReadFile("/etc/os-release"), '\n')) {
    if (absl::ConsumePrefix(&line, "PRETTY_NAME="))
      m["os"] = std::string(absl::StripPrefix(absl::StripSuffix(line, "\""), "\""));
  }
  // The devices the benchmarks see, and the one they use (the CPU driver
  // unless CAUSEWAY_DEVICE says otherwise).
  auto instance = Instance::Create({});
  if (!instance.ok()) {
    m["vulkan_error"] = std::string(instance.status().message());
  } else {
    json devices = json::array();
    for (const PhysicalDeviceInfo& d : (*instance)->physical_devices()) {
      devices.push_back({{"name", d.name},
                         {"type", DeviceTypeName(d.type)},
                         {"driver", d.driver_name},
                         {"driver_info", d.driver_info},
                         {"vulkan", absl::StrCat(VK_API_VERSION_MAJOR(d.api_version), ".",
                                                 VK_API_VERSION_MINOR(d.api_version), ".",
                                                 VK_API_VERSION_PATCH(d.api_version))}});
    }
    m["vulkan_devices"] = devices;
    RuntimeOptions options;
    options.device = EnvString("CAUSEWAY_DEVICE").empty() ? "cpu" : "";
    if (auto plan = Runtime::Plan(**instance, options); plan.ok())
      m["benchmark_device"] = plan->device->index;
  }
  json env = json::object();
  for (const char* name : {"LP_NUM_THREADS", "CAUSEWAY_DEVICE", "CAUSEWAY_ACCELERATORS",
                           "CAUSEWAY_MEMORY_BUDGET", "CAUSEWAY_RING_SLOTS", "CAUSEWAY_VALIDATION"}) {
    if (std::optional<std::string> v = EnvValue(name); v.has_value()) env[name] = *v;
  }
  m["environment"] = env;
  return m;
}

json GitFacts() {
  std::string src = SourceDirectory();
  if (src.empty() || !fs::exists(fs::path(src) / ".git")) return nullptr;
  std::string commit = CommandOutput(absl::StrCat("git -C ", ShellQuote(src), " rev-parse HEAD 2>/dev/null"));
  if (commit.empty()) return nullptr;
  std::string changes = CommandOutput(
      absl::StrCat("git -C ", ShellQuote(src), " status --porcelain --untracked-files=no 2>/dev/null"));
  return {{"commit", commit}, {"dirty", !changes.empty()}};
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string MachineLine(const json& m, const char* key) {
  return m.contains(key) ? ParamText(m[key]) : "unknown";
}

// --- the report -------------------------------------------------------------

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string ParamsText(const json& r) {
  std::vector<std::string> parts;
  if (auto it = r.find("params"); it != r.end() && it->is_object()) {
    for (auto& [k, v] : it->items()) parts.push_back(absl::StrCat(k, "=", ParamText(v)));
  }
  return absl::StrJoin(parts, "; ");
}

std::string Csv(const json& results) {
  std::string out =
      "suite,group,case,metric,higher_is_better,value,baseline,baseline_value,ratio,samples,params\n";
  auto num = [](const json& r, const char* key) {
    double v = Number(r, key);
    return std::isfinite(v) ? absl::StrFormat("%.12g", v) : std::string();
  };
  for (const json& r : results) {
    std::vector<std::string> row = {Text(r, "suite"),
                                    Text(r, "group"),
                                    Text(r, "case"),
                                    Text(r, "metric"),
                                    r.value("higher_is_better", true) ? "true" : "false",
                                    num(r, "value"),
                                    Text(r, "baseline"),
                                    num(r, "baseline_value"),
                                    num(r, "ratio"),
                                    num(r, "samples"),
                                    ParamsText(r)};
    for (std::string& f : row) f = CsvField(f);
    absl::StrAppend(&out, absl::StrJoin(row, ","), "\n");
  }
  return out;
}

// The results of `suite`'s `group`, in order.
std::vector<const json*> Group(const json& results, const std::string& suite, const std::string& group) {
  std::vector<const json*> out;
  for (const json& r : results) {
    if (Text(r, "suite") == suite && Text(r, "group") == group) out.push_back(&r);
  }
  return out;
}

std::string GnuplotString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The gnuplot commands drawing `plot` into `svg`, or "" when there is
// nothing to draw.
std::string PlotScript(const Plot& plot, const json& results, const fs::path& svg, int index) {
  std::vector<const json*> rows = Group(results, plot.suite, plot.group);
  if (rows.empty()) return "";
  const std::string metric = Text(*rows[0], "metric");
  const bool higher = rows[0]->value("higher_is_better", true);
  std::string s =
      absl::StrCat("reset\nset output ", GnuplotString(svg.string()), "\nset title ",
                   GnuplotString(plot.title), " noenhanced\nset ylabel ",
                   GnuplotString(absl::StrCat(metric, higher ? " (higher is better)" : " (lower is better)")),
                   " noenhanced\nset grid\nset key below noenhanced\n");
  if (std::string(plot.x_param).empty()) {
    // Bars: baseline and Causeway side by side for every case.
    std::string baseline = Text(*rows[0], "baseline");
    std::string block = absl::StrCat("$bars", index);
    absl::StrAppend(&s, "set style data histograms\nset style histogram clustered gap 1\n",
                    "set style fill solid 0.8 border -1\nset yrange [0:*]\nset xtics noenhanced\n", block,
                    " << EOD\n");
    for (const json* r : rows) {
      absl::StrAppend(&s, GnuplotString(Text(*r, "case")), " ",
                      absl::StrFormat("%.12g", Number(*r, "value")));
      if (!baseline.empty()) absl::StrAppend(&s, " ", absl::StrFormat("%.12g", Number(*r, "baseline_value")));
      s += "\n";
    }
    absl::StrAppend(&s, "EOD\nplot ");
    if (!baseline.empty()) {
      absl::StrAppend(&s, block, " using 3:xtic(1) title ", GnuplotString(baseline), ", ", block,
                      " using 2 title \"Causeway\"\n");
    } else {
      absl::StrAppend(&s, block, " using 2:xtic(1) title \"Causeway\"\n");
    }
    return s;
  }
  // Lines: series in the order they first appear.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<double, double>>> points;
  std::map<std::string, std::set<double>> baseline_xs;
  std::set<std::string> baselines;  // drawn dashed
  for (const json* r : rows) {
    const json params = r->value("params", json::object());
    if (!params.contains(plot.x_param) || !params[plot.x_param].is_number()) continue;
    const double x = params[plot.x_param].get<double>() / plot.x_scale;
    std::string series = "Causeway";
    if (std::string key = plot.series_param; !key.empty() && params.contains(key)) {
      series = params[key].is_number() ? absl::StrCat(plot.series_prefix, ParamText(params[key]))
                                       : ParamText(params[key]);
    }
    auto add = [&](const std::string& name, double y) {
      if (!std::isfinite(y) || (plot.log_y && y <= 0)) return;
      if (!points.count(name)) order.push_back(name);
      points[name].push_back({x, y});
    };
    add(series, Number(*r, "value"));
    if (std::string b = Text(*r, "baseline"); !b.empty()) {
      std::string name =
          plot.baseline_per_series && series != "Causeway" ? absl::StrCat(b, " (", series, ")") : b;
      baselines.insert(name);
      if (baseline_xs[name].insert(x).second) add(name, Number(*r, "baseline_value"));
    }
  }
  if (order.empty()) return "";
  // Causeway's lines first, then the baselines'.
  std::stable_partition(order.begin(), order.end(),
                        [&](const std::string& n) { return !baselines.count(n); });
  absl::StrAppend(&s, "set xlabel ", GnuplotString(plot.x_label), " noenhanced\n");
  if (plot.log_x) s += "set logscale x 2\n";
  if (plot.log_y) {
    s += "set logscale y 10\n";
  } else {
    s += "set yrange [0:*]\n";
  }
  std::vector<std::string> plots;
  for (size_t k = 0; k < order.size(); ++k) {
    std::string block = absl::StrCat("$p", index, "s", k);
    absl::StrAppend(&s, block, " << EOD\n");
    auto& pts = points[order[k]];
    std::stable_sort(pts.begin(), pts.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (auto [x, y] : pts) absl::StrAppend(&s, absl::StrFormat("%.12g %.12g\n", x, y));
    s += "EOD\n";
    plots.push_back(absl::StrCat(block, " using 1:2 with linespoints lw 2 ",
                                 baselines.count(order[k]) ? "pt 6 dt 2" : "pt 7", " title ",
                                 GnuplotString(order[k])));
  }
  absl::StrAppend(&s, "plot ", absl::StrJoin(plots, ", \\\n     "), "\n");
  return s;
}

// Writes OUT/plots.gp and runs gnuplot on it. Returns the plots drawn;
// notes on stderr what went wrong (plots are never fatal).
std::vector<std::string> DrawPlots(const json& results, const fs::path& out) {
  std::string script =
      "# Made by causeway bench: gnuplot plots.gp redraws the plots from the data below.\n"
      "set terminal svg size 800,520 dynamic enhanced font \"sans,12\" background rgb \"white\"\n";
  std::vector<std::string> files;
  int index = 0;
  for (const Plot& plot : kPlots) {
    std::string part = PlotScript(plot, results, out / plot.file, index++);
    if (part.empty()) continue;
    script += part;
    files.push_back(plot.file);
  }
  if (files.empty()) return {};
  script += "unset output\n";
  if (absl::Status s = WriteFile(out / "plots.gp", script); !s.ok()) {
    std::fprintf(stderr, "causeway bench: %s; no plots\n", std::string(s.message()).c_str());
    return {};
  }
  const std::string log = (out / "raw" / "gnuplot.log").string();
  absl::StatusOr<int> status = Spawn({"gnuplot", (out / "plots.gp").string()}, log, log, nullptr);
  if (!status.ok()) {
    std::fprintf(stderr,
                 "causeway bench: gnuplot is not installed (not found in PATH), so no plots were drawn; "
                 "install it (apt-get install gnuplot-nox) and run: gnuplot %s\n",
                 (out / "plots.gp").string().c_str());
    return {};
  }
  std::vector<std::string> drawn;
  for (const std::string& f : files) {
    if (fs::exists(out / f) && fs::file_size(out / f) > 0) drawn.push_back(f);
  }
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0 || drawn.size() != files.size()) {
    std::fprintf(stderr, "causeway bench: gnuplot failed (%s); %zu of %zu plots drawn:\n%s\n",
                 DescribeWaitStatus(*status).c_str(), drawn.size(), files.size(),
                 Tail(ReadFile(log), 10).c_str());
  }
  return drawn;
}

// One finished suite.
struct SuiteRun {
  const Suite* suite;
  std::string binary;  // "" = not found
  std::vector<std::string> args;
  bool ok = false;
  std::string error;  // why it failed
  std::string stderr_text;
  double seconds = 0;
  int results = 0;
};

// The Markdown report. `plot_dir` is the plots' directory relative to the
// document ("" = beside it).
std::string Markdown(const json& report, const std::vector<SuiteRun>& runs,
                     const std::vector<std::string>& plots, const std::string& plot_dir, bool raw_links) {
  const json& m = report["machine"];
  const json& results = report["results"];
  std::string md = "# Benchmarks\n\n";
  absl::StrAppend(&md, "Made by `", report["command"].get<std::string>(), "` on ",
                  report["date"].get<std::string>());
  if (report["git"].is_object()) {
    absl::StrAppend(&md, " at commit `", report["git"]["commit"].get<std::string>().substr(0, 12), "`",
                    report["git"]["dirty"].get<bool>() ? " (with local changes)" : "");
  }
  md +=
      ". Each figure is a median of the samples shown; every baseline was measured in the same run, and the "
      "ratio is Causeway's figure over the baseline's (see the metric for which way is better). ";
  md += raw_links ? "All results: `results.json`, `results.csv`.\n\n"
                  : "All results: `results.json` and `results.csv` in the run's output directory "
                    "(`bench-results/` by default).\n\n";
  if (report["quick"].get<bool>()) {
    md +=
        "**Quick mode**: small sizes and one to three samples, to check that the suite runs; these figures "
        "are "
        "not representative.\n\n";
  }
  md += "## Machine\n\n| | |\n| --- | --- |\n";
  std::string cores = MachineLine(m, "cores");
  if (m.contains("usable_cores") && m["usable_cores"] != m["cores"]) {
    absl::StrAppend(&cores, " (", ParamText(m["usable_cores"]), " usable)");
  }
  absl::StrAppend(&md, "| CPU | ", MachineLine(m, "cpu"), ", ", cores, " cores |\n");
  if (m.contains("memory_bytes"))
    absl::StrAppend(&md, "| memory | ", FormatBytes(m["memory_bytes"].get<uint64_t>()), " |\n");
  if (m.contains("vulkan_devices")) {
    for (size_t i = 0; i < m["vulkan_devices"].size(); ++i) {
      const json& d = m["vulkan_devices"][i];
      const bool used = m.value("benchmark_device", -1) == static_cast<int>(i);
      absl::StrAppend(&md, "| Vulkan device ", i, used ? " (used)" : "", " | ", Text(d, "name"), " (",
                      Text(d, "type"), "), driver ", Text(d, "driver"), " ", Text(d, "driver_info"),
                      ", Vulkan ", Text(d, "vulkan"), " |\n");
    }
  } else {
    absl::StrAppend(&md, "| Vulkan | ", m.value("vulkan_error", std::string("unknown")), " |\n");
  }
  absl::StrAppend(&md, "| OS | ", MachineLine(m, "os"), ", ", MachineLine(m, "kernel"), " |\n");
  std::vector<std::string> env;
  for (auto& [k, v] : m["environment"].items()) env.push_back(absl::StrCat(k, "=", ParamText(v)));
  if (!env.empty()) absl::StrAppend(&md, "| environment | `", absl::StrJoin(env, " "), "` |\n");
  md += "\n";

  for (const SuiteRun& run : runs) {
    const Suite& suite = *run.suite;
    absl::StrAppend(&md, "## ", suite.name, ": ", suite.what, "\n\n");
    if (!run.ok) {
      absl::StrAppend(&md, "**Failed**: ", run.error, "\n\n");
      if (!run.stderr_text.empty()) absl::StrAppend(&md, "```\n", Tail(run.stderr_text, 20), "\n```\n\n");
      continue;
    }
    // The suite's command as one would type it, without the --json file.
    std::vector<std::string> shown = {fs::path(run.binary).filename().string()};
    for (size_t a = 1; a < run.args.size(); ++a) {
      if (!absl::StartsWith(run.args[a], "--json=")) shown.push_back(run.args[a]);
    }
    absl::StrAppend(
        &md, "`", absl::StrJoin(shown, " "), "`, ", absl::StrFormat("%.1f", run.seconds), " s",
        raw_links ? absl::StrCat("; its text output: [raw/", suite.name, ".txt](raw/", suite.name, ".txt)")
                  : "",
        "\n\n");
    for (const Plot& plot : kPlots) {
      if (plot.suite != std::string(suite.name)) continue;
      if (std::find(plots.begin(), plots.end(), plot.file) == plots.end()) continue;
      absl::StrAppend(&md, "![", plot.title, "](", plot_dir.empty() ? "" : plot_dir + "/", plot.file,
                      ")\n\n");
    }
    // One table per group, in the order the groups first appear.
    std::vector<std::string> groups;
    for (const json& r : results) {
      if (Text(r, "suite") == suite.name &&
          std::find(groups.begin(), groups.end(), Text(r, "group")) == groups.end()) {
        groups.push_back(Text(r, "group"));
      }
    }
    for (const std::string& group : groups) {
      std::vector<const json*> rows = Group(results, suite.name, group);
      bool uniform = true;  // one metric and one baseline: named in the header
      for (const json* r : rows) {
        uniform &= Text(*r, "metric") == Text(*rows[0], "metric") &&
                   Text(*r, "baseline") == Text(*rows[0], "baseline");
      }
      const std::string metric = Text(*rows[0], "metric"), baseline = Text(*rows[0], "baseline");
      absl::StrAppend(&md, "### ", group, "\n\n");
      if (uniform) {
        absl::StrAppend(&md, "| case | Causeway ", metric, " |",
                        baseline.empty() ? "" : absl::StrCat(" ", baseline, " ", metric, " | ratio |"),
                        " samples | parameters |\n| --- | ---: |", baseline.empty() ? "" : " ---: | ---: |",
                        " ---: | --- |\n");
      } else {
        md +=
            "| case | Causeway | baseline | ratio | samples | parameters |\n| --- | ---: | ---: | ---: | "
            "---: | --- |\n";
      }
      for (const json* r : rows) {
        std::string value = Figure(Number(*r, "value")), base = Figure(Number(*r, "baseline_value"));
        if (!uniform) {
          value += " " + Text(*r, "metric");
          base = Text(*r, "baseline").empty() ? "-" : absl::StrCat(Text(*r, "baseline"), ": ", base);
        }
        absl::StrAppend(&md, "| ", Text(*r, "case"), " | ", value, " |");
        if (!uniform || !baseline.empty()) {
          absl::StrAppend(&md, " ", Text(*r, "baseline").empty() ? "-" : base, " | ",
                          Text(*r, "baseline").empty() ? "-" : Figure(Number(*r, "ratio")), " |");
        }
        absl::StrAppend(&md, " ", ParamText(r->value("samples", json(0))), " | ", ParamsText(*r), " |\n");
      }
      md += "\n";
    }
  }
  return md;
}

// The README's benchmark table lies between these lines; --update-doc
// rewrites what is between them from the same results as BENCHMARKS.md.
constexpr char kReadmeBegin[] = "<!-- bench-summary: made by causeway bench --update-doc -->";
constexpr char kReadmeEnd[] = "<!-- bench-summary end -->";

// The headline table for the README: per suite and group, every result of a
// group of at most four, else its first and last (the smallest and largest
// size, stage or device count), with the run's commit and date.
std::string ReadmeSummary(const json& report) {
  const json& results = report["results"];
  std::string md = absl::StrCat("Made by `", report["command"].get<std::string>(), "` on ",
                                report["date"].get<std::string>());
  if (report["git"].is_object()) {
    absl::StrAppend(&md, " at commit `", report["git"]["commit"].get<std::string>().substr(0, 12), "`");
  }
  absl::StrAppend(&md, " (", report["machine"].value("cpu", std::string("?")), ", ",
                  report["machine"].value("cores", 0),
                  " cores); every figure in [BENCHMARKS.md](BENCHMARKS.md). ",
                  "Ratio: Causeway's figure over the baseline's, measured in the same run.\n\n",
                  "| suite | table | case | Causeway | baseline | ratio |\n| --- | --- | --- | ---: | --- | ---: |\n");
  std::vector<std::pair<std::string, std::string>> groups;
  for (const json& r : results) {
    std::pair<std::string, std::string> g = {Text(r, "suite"), Text(r, "group")};
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  for (const auto& [suite, group] : groups) {
    std::vector<const json*> rows = Group(results, suite, group);
    if (rows.size() > 4) rows = {rows.front(), rows.back()};
    for (const json* r : rows) {
      const std::string baseline = Text(*r, "baseline");
      absl::StrAppend(
          &md, "| ", suite, " | ", group, " | ", Text(*r, "case"), " | ", Figure(Number(*r, "value")), " ",
          Text(*r, "metric"), " | ",
          baseline.empty() ? "-" : absl::StrCat(baseline, ": ", Figure(Number(*r, "baseline_value"))), " | ",
          baseline.empty() ? "-" : Figure(Number(*r, "ratio")), " |\n");
    }
  }
  return md;
}

// `readme` with the text between its summary markers replaced by `summary`;
// FailedPrecondition if the markers are missing or out of order.
absl::StatusOr<std::string> ReplaceReadmeSummary(const std::string& readme, const std::string& summary) {
  const size_t begin = readme.find(kReadmeBegin);
  const size_t end = readme.find(kReadmeEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) {
    return absl::FailedPreconditionError(absl::StrCat("README.md lacks the lines '", kReadmeBegin, "' and '",
                                                      kReadmeEnd, "' around its benchmark table"));
  }
  const size_t from = begin + std::strlen(kReadmeBegin);
  return absl::StrCat(readme.substr(0, from), "\n", summary, readme.substr(end));
}

// The summary on stdout: one line per result.
void PrintSummary(const json& results) {
  std::vector<std::vector<std::string>> rows = {{"suite", "case", "Causeway", "baseline", "ratio"}};
  for (const json& r : results) {
    std::string baseline = Text(r, "baseline");
    rows.push_back({Text(r, "suite"), Text(r, "case"),
                    absl::StrCat(Figure(Number(r, "value")), " ", Text(r, "metric")),
                    baseline.empty() ? "-" : absl::StrCat(baseline, " ", Figure(Number(r, "baseline_value"))),
                    baseline.empty() ? "-" : Figure(Number(r, "ratio"))});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool right = c == 2 || c == 4;
      std::string pad(width[c] - row[c].size(), ' ');
      absl::StrAppend(&line, c == 0 ? "" : "  ",
                      right ? pad + row[c] : row[c] + (c + 1 < row.size() ? pad : ""));
    }
    std::printf("%s\n", line.c_str());
  }
}

// Checks that `j` is a list of results of `suite`.
absl::Status CheckResults(const json& j, const std::string& suite) {
  if (!j.is_array()) return absl::InvalidArgumentError("its --json output is not a list");
  for (size_t i = 0; i < j.size(); ++i) {
    const json& r = j[i];
    if (!r.is_object() || Text(r, "case").empty() || Text(r, "metric").empty() || !r.contains("value")) {
      return absl::InvalidArgumentError(
          absl::StrCat("result ", i, " lacks a case, metric or value: ", r.dump()));
    }
    if (Text(r, "suite") != suite) {
      return absl::InvalidArgumentError(
          absl::StrCat("result ", i, " is of suite '", Text(r, "suite"), "', expected '", suite, "'"));
    }
  }
  return absl::OkStatus();
}

// Shows the progress on stderr: a bar redrawn in place on a terminal.
class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(2) == 1), start_(Clock::now()) {}

  void Start(int index, const std::string& name) {
    index_ = index;
    name_ = name;
    suite_start_ = Clock::now();
    Draw();
  }
  // Redraws the bar (on a terminal; otherwise nothing).
  void Draw() {
    if (!tty_) return;
    constexpr int kWidth = 24;
    const int filled = kWidth * index_ / total_;
    std::fprintf(stderr, "\r\033[K[%s%s] suite %d of %d: %s  %s (total %s)", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), index_ + 1, total_, name_.c_str(),
                 FormatDuration(Seconds(suite_start_)).c_str(), FormatDuration(Seconds(start_)).c_str());
    std::fflush(stderr);
  }
  // A line for a finished suite (above the bar on a terminal).
  void Finished(const std::string& line) {
    std::fprintf(stderr, "%s[%d/%d] %s\n", tty_ ? "\r\033[K" : "", index_ + 1, total_, line.c_str());
    std::fflush(stderr);
  }
  double SuiteSeconds() const { return Seconds(suite_start_); }

 private:
  using Clock = std::chrono::steady_clock;
  static double Seconds(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  int total_;
  bool tty_;
  Clock::time_point start_, suite_start_;
  int index_ = 0;
  std::string name_;
};

SuiteRun RunSuite(const Suite& suite, const std::string& binary, const std::vector<std::string>& extra_args,
                  const fs::path& raw, absl::Duration deadline, Progress& progress, json* results) {
  SuiteRun run{&suite, binary};
  const fs::path json_path = raw / absl::StrCat(suite.name, ".json");
  const fs::path out_path = raw / absl::StrCat(suite.name, ".txt");
  const fs::path err_path = raw / absl::StrCat(suite.name, ".stderr.txt");
  std::error_code ec;
  fs::remove(json_path, ec);
  run.args = {binary};
  run.args.insert(run.args.end(), extra_args.begin(), extra_args.end());
  run.args.push_back(absl::StrCat("--json=", json_path.string()));
  absl::StatusOr<int> status = Spawn(
      run.args, out_path.string(), err_path.string(), [&] { progress.Draw(); }, deadline);
  run.seconds = progress.SuiteSeconds();
  run.stderr_text = ReadFile(err_path);
  if (!status.ok()) {
    run.error = absl::IsDeadlineExceeded(status.status())
                    ? absl::StrCat(suite.binary, " ", status.status().message())
                    : std::string(status.status().message());
    return run;
  }
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    run.error = absl::StrCat(suite.binary, " failed (", DescribeWaitStatus(*status), ")");
    return run;
  }
  if (!fs::exists(json_path)) {
    run.error = absl::StrCat(suite.binary, " wrote no results to ", json_path.string());
    return run;
  }
  json j = json::parse(ReadFile(json_path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    run.error = absl::StrCat(suite.binary, " wrote invalid JSON to ", json_path.string());
    return run;
  }
  if (absl::Status s = CheckResults(j, suite.name); !s.ok()) {
    run.error = absl::StrCat(suite.binary, ": ", s.message());
    return run;
  }
  for (json& r : j) results->push_back(std::move(r));
  run.results = static_cast<int>(j.size());
  run.ok = true;
  return run;
}

int Fail(const std::string& message, int code) { return cli::Fail("bench", message, code); }

}  // namespace

int BenchCommand(const std::vector<std::string>& args) {
  Flags flags({
      {"only", "run only these suites, comma-separated (see --list)", ""},
      {"quick", "small sizes and few samples: checks that the suite runs, in seconds; not for figures", "",
       true},
      {"samples", "samples per figure, passed to every suite (default: each suite's own)", ""},
      {"out", "directory for results.json, results.csv, the plots and BENCHMARKS.md", "bench-results"},
      {"update-doc", "also write the repository's BENCHMARKS.md and its plots in docs/bench/", "", true},
      {"repo", "the repository --update-doc writes", SourceDirectory()},
      {"list", "list the suites and where their binaries are, then exit", "", true},
      {"deadline", "the most each suite may take (e.g. 20m): past it, it is stopped and reported failed", ""},
      {"connect",
       "run the island suite on these running islands (causeway island): A,B for its transfer, A,B,C for its "
       "program too (C of four accelerators, A and B of two) instead of starting them",
       ""},
      {"secret-file", "the --connect islands' shared secret (or CAUSEWAY_SECRET)", ""},
  });
  if (auto done = StartCommand(
          "bench",
          absl::StrCat(
              "usage: causeway bench [--only SUITE,...] [--quick] [--samples N] [--out DIR] "
              "[--update-doc] [--connect A,B[,C]]\n\n"
              "Runs the benchmark suites (each a benchmark binary, as a child process), each comparing "
              "Causeway\n"
              "against a baseline measured in the same run, and writes DIR/results.json, results.csv, SVG "
              "plots\n"
              "(with gnuplot) and BENCHMARKS.md. Prints a summary of the results on stdout. Suites: ",
              SuiteNames(), ".\n\n"),
          flags, args)) {
    return *done;
  }
  auto trace = flags.StartTrace();
  if (!trace.ok()) return Fail(std::string(trace.status().message()), 1);

  std::vector<const Suite*> selected;
  if (flags.Has("only")) {
    for (absl::string_view name : absl::StrSplit(flags.Get("only"), ',', absl::SkipWhitespace())) {
      const Suite* suite = FindSuite(absl::StripAsciiWhitespace(name));
      if (suite == nullptr) {
        return Fail(absl::StrCat("unknown suite '", name, "' in --only; the suites are ", SuiteNames()), 2);
      }
      if (std::find(selected.begin(), selected.end(), suite) == selected.end()) selected.push_back(suite);
    }
    if (selected.empty())
      return Fail(absl::StrCat("--only names no suite; the suites are ", SuiteNames()), 2);
  } else {
    for (const Suite& s : kSuites) selected.push_back(&s);
  }
  absl::Duration deadline = absl::InfiniteDuration();
  if (flags.Has("deadline")) {
    auto d = flags.Duration("deadline");
    if (!d.ok()) return Fail(std::string(d.status().message()), 2);
    deadline = *d;
  }
  if (flags.Has("connect") &&
      std::none_of(selected.begin(), selected.end(), [](const Suite* s) { return s->connects; })) {
    return Fail("--connect is for the island suite, which --only leaves out", 2);
  }
  if (flags.Has("secret-file") && !flags.Has("connect")) return Fail("--secret-file is for --connect", 2);
  int64_t samples = 0;  // 0 = each suite's own
  if (flags.Has("samples")) {
    auto n = flags.Int("samples");
    if (!n.ok() || *n < 1 || *n > 1000) {
      return Fail(absl::StrCat("--samples must be 1..1000, got '", flags.Get("samples"), "'"), 2);
    }
    samples = *n;
  }

  const std::vector<std::string> dirs = BenchDirectories();
  std::map<const Suite*, std::string> binaries;
  for (const Suite& s : kSuites) binaries[&s] = FindBinary(dirs, s.binary);
  if (flags.Bool("list")) {
    for (const Suite& s : kSuites) {
      std::printf("%-10s %s\n", s.name, binaries[&s].empty() ? "(not found)" : binaries[&s].c_str());
    }
    return 0;
  }
  if (std::all_of(selected.begin(), selected.end(), [&](const Suite* s) { return binaries[s].empty(); })) {
    const char* why =
        !BuiltBenchDirectory().empty()
            ? "they are not built yet: build them with `ninja causeway_benchmarks` in the build directory"
            : "this causeway was built without them (CAUSEWAY_BUILD_BENCHMARKS=OFF, as in the ASan build): "
              "configure a build with -DCAUSEWAY_BUILD_BENCHMARKS=ON and run its causeway, or install them";
    return Fail(
        absl::StrCat("no benchmark binaries found (looked in ", absl::StrJoin(dirs, ", "), "); ", why), 1);
  }

  const fs::path out = flags.Get("out");
  std::error_code ec;
  fs::create_directories(out / "raw", ec);
  if (ec) return Fail(absl::StrCat("cannot create ", (out / "raw").string(), ": ", ec.message()), 1);

  // The command as it measured: where its outputs went (--out, --repo,
  // --trace) is left out, so that no machine's paths reach the report or a
  // committed BENCHMARKS.md.
  std::vector<std::string> command = {"causeway", "bench"};
  for (size_t i = 0; i < args.size(); ++i) {
    bool location = false;
    for (absl::string_view flag : {"--out", "--repo", "--trace"}) {
      if (args[i] == flag) {
        location = true;
        ++i;  // and its value
      } else if (absl::StartsWith(args[i], absl::StrCat(flag, "="))) {
        location = true;
      }
      if (location) break;
    }
    if (!location) command.push_back(ShellQuote(args[i]));
  }
  json report = {{"schema", "causeway-bench/1"},
                 {"command", absl::StrJoin(command, " ")},
                 {"date", UtcNow()},
                 {"quick", flags.Bool("quick")},
                 {"git", GitFacts()},
                 {"machine", MachineFacts()}};
  // The island suite starts island servers from this causeway binary.
  if (std::string self = SelfDirectory(); !self.empty())
    setenv("CAUSEWAY_CLI", (fs::path(self) / "causeway").c_str(), 1);

  json results = json::array();
  std::vector<SuiteRun> runs;
  Progress progress(static_cast<int>(selected.size()));
  for (size_t i = 0; i < selected.size(); ++i) {
    const Suite& suite = *selected[i];
    progress.Start(static_cast<int>(i), suite.name);
    std::vector<std::string> suite_args;
    if (flags.Bool("quick")) suite_args.push_back("--quick");
    if (samples > 0) suite_args.push_back(absl::StrCat("--samples=", samples));
    if (suite.connects && flags.Has("connect")) {
      suite_args.push_back(absl::StrCat("--connect=", flags.Get("connect")));
      if (flags.Has("secret-file"))
        suite_args.push_back(absl::StrCat("--secret-file=", flags.Get("secret-file")));
    }
    SuiteRun run;
    if (binaries[&suite].empty()) {
      run = {&suite, "", suite_args};
      run.error = absl::StrCat(suite.binary, " not found (looked in ", absl::StrJoin(dirs, ", "), ")");
    } else {
      run = RunSuite(suite, binaries[&suite], suite_args, out / "raw", deadline, progress, &results);
    }
    if (run.ok) {
      progress.Finished(absl::StrFormat("%s: %d results in %.1f s", suite.name, run.results, run.seconds));
    } else {
      std::string tail = Tail(run.stderr_text, 20);
      progress.Finished(
          absl::StrCat(suite.name, ": FAILED: ", run.error, tail.empty() ? "" : "; its stderr:"));
      for (absl::string_view line : absl::StrSplit(tail, '\n', absl::SkipEmpty())) {
        std::fprintf(stderr, "    %s\n", std::string(line).c_str());
      }
    }
    runs.push_back(std::move(run));
  }

  json suites = json::array();
  for (const SuiteRun& run : runs) {
    json s = {{"name", run.suite->name}, {"binary", run.binary},
              {"args", run.args},        {"status", run.ok ? "ok" : "failed"},
              {"seconds", run.seconds},  {"results", run.results}};
    if (!run.ok) {
      s["error"] = run.error;
      s["stderr"] = Tail(run.stderr_text, 50);
    }
    suites.push_back(s);
  }
  report["suites"] = suites;
  report["results"] = results;

  int code = 0;
  auto write = [&](const fs::path& path, const std::string& content) {
    if (absl::Status s = WriteFile(path, content); !s.ok()) code = Fail(std::string(s.message()), 1);
  };
  write(out / "results.json", report.dump(2) + "\n");
  write(out / "results.csv", Csv(results));
  std::vector<std::string> plots = DrawPlots(results, out);
  write(out / "BENCHMARKS.md", Markdown(report, runs, plots, "", /*raw_links=*/true));

  std::vector<std::string> failed;
  for (const SuiteRun& run : runs) {
    if (!run.ok) failed.push_back(run.suite->name);
  }
  if (flags.Bool("update-doc")) {
    const fs::path repo = flags.Get("repo");
    if (!failed.empty()) {
      Fail(absl::StrCat("not updating ", (repo / "BENCHMARKS.md").string(), ": ", failed.size(),
                        failed.size() == 1 ? " suite" : " suites", " failed"),
           1);
    } else if (repo.empty() || !fs::is_directory(repo)) {
      code = Fail(absl::StrCat("--update-doc: no repository at '", repo.string(), "' (give --repo)"), 1);
    } else {
      // The README's table comes from the same results (one source); a
      // README without its markers leaves the repository untouched.
      std::ifstream in(repo / "README.md");
      std::stringstream readme;
      readme << in.rdbuf();
      absl::StatusOr<std::string> updated = ReplaceReadmeSummary(readme.str(), ReadmeSummary(report));
      if (!updated.ok()) {
        code = Fail(
            absl::StrCat("--update-doc: ", (repo / "README.md").string(), ": ", updated.status().message()),
            1);
      } else {
        fs::create_directories(repo / "docs" / "bench", ec);
        for (const std::string& p : plots) {
          fs::copy_file(out / p, repo / "docs" / "bench" / p, fs::copy_options::overwrite_existing, ec);
          if (ec)
            code = Fail(absl::StrCat("cannot copy ", p, " to ", (repo / "docs" / "bench").string(), ": ",
                                     ec.message()),
                        1);
        }
        write(repo / "BENCHMARKS.md", Markdown(report, runs, plots, "docs/bench", /*raw_links=*/false));
        write(repo / "README.md", *updated);
      }
    }
  }

  PrintSummary(results);
  std::fprintf(stderr, "causeway bench: results in %s\n", out.string().c_str());
  if (!failed.empty()) {
    return Fail(
        absl::StrCat(failed.size(), " of ", runs.size(), " suites failed: ", absl::StrJoin(failed, ", ")), 1);
  }
  return code;
}

}  // namespace causeway::cli
