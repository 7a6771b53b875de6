// Machine-readable benchmark results: every benchmark binary takes
// --json=FILE and writes there, besides its text on stdout, the figures it
// printed as a JSON list (`causeway bench` runs the binaries and merges the
// lists). Header-only and written by hand, so that a benchmark needs no JSON
// library.
//
// One result is one figure: a median of `samples` samples, and where the
// benchmark measured a baseline in the same run, the baseline's median and
// the ratio value / baseline_value:
//
//   {"suite": "ici", "group": "copy", "case": "list copy 16 MiB",
//    "metric": "GB/s", "higher_is_better": true, "value": 18.1,
//    "baseline": "memcpy", "baseline_value": 22.0, "ratio": 0.823,
//    "samples": 9, "params": {"bytes": 16777216, "path": "external-memory"},
//    "extra": {}}
//
// `group` is the table of the suite the figure belongs to; `params` say what
// was measured (sizes, accelerators, ...), `extra` holds further measurements
// of the same samples (CPU time per program, a bound). A result without a
// baseline has neither "baseline", "baseline_value" nor "ratio". Numbers that
// are not finite are written as null.
//
// Example:
//   bench::Report report("dispatch");
//   report.Add("dispatch", "submit-await", "us/dispatch", /*higher_is_better=*/false)
//       .Value(14.4).Baseline("raw Vulkan", 13.7).Samples(9).Param("dispatches", 200);
//   report.WriteOrDie(json_path);  // no-op when json_path is empty
#ifndef CAUSEWAY_BENCHMARKS_BENCH_REPORT_H_
#define CAUSEWAY_BENCHMARKS_BENCH_REPORT_H_

#include <cmath>
#include <cstdio>
#include <deque>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "benchmarks/bench_util.h"
#include "causeway/base/trace.h"

namespace causeway::bench {

// `s` as a JSON string literal, quotes included (causeway/base/trace.h's JsonQuote:
// `"` and `\` escaped, control characters as \n, \t, ... or \u00XX).
inline std::string JsonString(absl::string_view s) { return JsonQuote(std::string(s)); }

// `v` as a JSON number with 12 significant digits (integers up to 1e12 are
// exact), or null when it is not finite (JSON has no NaN or infinity).
inline std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.12g", v);
}

// One figure; see the file comment. Built fluently from Report::Add.
struct Result {
  using Field = std::pair<std::string, std::variant<double, std::string>>;

  std::string suite, group, name, metric;
  bool higher_is_better = true;
  double value = 0;
  std::string baseline;  // "" = no baseline
  double baseline_value = 0;
  int samples = 0;
  std::vector<Field> params, extra;

  Result& Value(double v) { return value = v, *this; }
  Result& Baseline(std::string baseline_name, double v) {
    baseline = std::move(baseline_name);
    baseline_value = v;
    return *this;
  }
  Result& Samples(int n) { return samples = n, *this; }
  Result& Param(std::string key, double v) { return params.emplace_back(std::move(key), v), *this; }
  Result& Param(std::string key, std::string v) {
    return params.emplace_back(std::move(key), std::move(v)), *this;
  }
  Result& Param(std::string key, const char* v) { return Param(std::move(key), std::string(v)); }
  Result& Extra(std::string key, double v) { return extra.emplace_back(std::move(key), v), *this; }

  double ratio() const { return value / baseline_value; }

  std::string ToJson() const {
    std::string out = absl::StrCat("{\"suite\": ", JsonString(suite), ", \"group\": ", JsonString(group),
                                   ", \"case\": ", JsonString(name), ", \"metric\": ", JsonString(metric),
                                   ", \"higher_is_better\": ", higher_is_better ? "true" : "false",
                                   ", \"value\": ", JsonNumber(value));
    if (!baseline.empty()) {
      absl::StrAppend(&out, ", \"baseline\": ", JsonString(baseline),
                      ", \"baseline_value\": ", JsonNumber(baseline_value),
                      ", \"ratio\": ", JsonNumber(ratio()));
    }
    absl::StrAppend(&out, ", \"samples\": ", samples, ", \"params\": ", Object(params),
                    ", \"extra\": ", Object(extra), "}");
    return out;
  }

 private:
  static std::string Object(const std::vector<Field>& fields) {
    std::string out = "{";
    for (size_t i = 0; i < fields.size(); ++i) {
      const auto& [key, v] = fields[i];
      absl::StrAppend(&out, i == 0 ? "" : ", ", JsonString(key), ": ",
                      std::holds_alternative<double>(v) ? JsonNumber(std::get<double>(v))
                                                        : JsonString(std::get<std::string>(v)));
    }
    return out + "}";
  }
};

// The results of one benchmark run. Not thread-safe: benchmarks add results
// from their main thread.
class Report {
 public:
  explicit Report(std::string suite) : suite_(std::move(suite)) {}

  // Adds a result and returns it to be filled in (the reference stays valid).
  Result& Add(std::string group, std::string name, std::string metric, bool higher_is_better = true) {
    Result& r = results_.emplace_back();
    r.suite = suite_;
    r.group = std::move(group);
    r.name = std::move(name);
    r.metric = std::move(metric);
    r.higher_is_better = higher_is_better;
    return r;
  }

  const std::deque<Result>& results() const { return results_; }

  // The results as a JSON list, one result a line.
  std::string ToJson() const {
    std::string out = "[";
    for (size_t i = 0; i < results_.size(); ++i)
      absl::StrAppend(&out, i == 0 ? "\n  " : ",\n  ", results_[i].ToJson());
    return out + "\n]\n";
  }

  // Writes ToJson() to `path`, or does nothing when `path` is empty (no
  // --json); aborts the benchmark when the file cannot be written.
  void WriteOrDie(const std::string& path) const {
    if (path.empty()) return;
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) Die(absl::StrCat("cannot write ", path));
    const std::string json = ToJson();
    const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
    if (std::fclose(f) != 0 || !ok) Die(absl::StrCat("cannot write ", path));
  }

 private:
  std::string suite_;
  std::deque<Result> results_;  // a deque: Add's references stay valid
};

}  // namespace causeway::bench

#endif  // CAUSEWAY_BENCHMARKS_BENCH_REPORT_H_
