// Training throughput of the benchmark language model (models/) in the
// layouts of the Pathways paper's Table 2, all on the same accelerators and
// global batch: SPMD data parallelism over all of them (the baseline), and
// GPipe-style pipelines of S stages with M micro-batches.
//
// Each layout trains `--steps` steps after 2 warm-up steps (programs built,
// pipelines compiled); a sample is one step's wall time from the trainer's
// progress reports (steps are queued one ahead, so this is the steady-state
// rate), and tokens/s is the global batch's tokens over the median step.
//
//   causeway_models_bench [--steps=9] [--accelerators=4] [--quick] [--json=FILE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "models/trainer.h"
#include "runtime/runtime.h"
#include "scheduler/island.h"

namespace causeway {
namespace {

using bench::Median;
using bench::Must;

struct Layout {
  std::string name;   // as in the table
  std::vector<int> stages;
  uint32_t micro_batches;
};

int Main(int argc, char** argv) {
  const bench::CommonFlags common = bench::TakeCommonFlags(argc, argv);
  int steps = 9, accelerators = 4;
  models::TransformerConfig config;
  config.d_model = 128;
  config.heads = 4;
  config.d_ff = 512;
  config.layers = 4;
  config.seq_len = 64;
  uint32_t batch = 32;
  if (common.quick) {
    steps = 2;
    config.d_model = 32;
    config.d_ff = 64;
    config.seq_len = 16;
    batch = 16;
  }
  const char* usage = "usage: %s [--steps=9] [--accelerators=4] [--quick] [--json=FILE]\n";
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--steps=")) {
      if (!absl::SimpleAtoi(a, &steps) || steps < 1) return std::fprintf(stderr, usage, argv[0]), 2;
    } else if (absl::ConsumePrefix(&a, "--accelerators=")) {
      if (!absl::SimpleAtoi(a, &accelerators) || accelerators < 4 || accelerators % 4 != 0) {
        std::fprintf(stderr, "--accelerators must be a multiple of 4\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, usage, argv[0]);
      return 2;
    }
  }

  const std::string corpus_path = std::string(CAUSEWAY_SOURCE_DIR) + "/data/kjv-genesis-exodus.txt";
  const models::TextCorpus corpus = Must(models::TextCorpus::Load(corpus_path), "TextCorpus::Load");
  RuntimeOptions options;
  options.accelerators = accelerators;
  auto rt = Must(Runtime::Create(options), "Runtime::Create");
  auto island = Must(Island::Create(rt.get()), "Island::Create");
  auto client = Must(island->Connect("models_bench"), "Connect");

  const int n = accelerators;
  std::vector<Layout> layouts = {{"SPMD", {n}, 1},
                                 {"pipeline S=2 M=8", std::vector<int>(2, n / 2), 8},
                                 {"pipeline S=2 M=16", std::vector<int>(2, n / 2), 16},
                                 {"pipeline S=4 M=8", std::vector<int>(4, n / 4), 8},
                                 {"pipeline S=4 M=16", std::vector<int>(4, n / 4), 16}};
  if (common.quick) layouts = {layouts[0], {"pipeline S=2 M=8", std::vector<int>(2, n / 2), 8}};
  std::printf("model: %u layers, d_model %u, %u heads, d_ff %u, context %u; global batch %u; %d accelerators (%s)\n",
              config.layers, config.d_model, config.heads, config.d_ff, config.seq_len, batch, n,
              rt->accelerator(0)->info().name.c_str());
  std::printf("%-20s %12s %10s %12s\n", "layout", "tokens/s", "vs SPMD", "final loss");
  bench::Report report("models");
  double spmd = 0;
  for (const Layout& layout : layouts) {
    models::TrainOptions o;
    o.config = config;
    o.layout = models::TrainLayout{batch, layout.micro_batches};
    o.stages = layout.stages;
    auto trainer = Must(models::Trainer::Create(client.get(), corpus, o), "Trainer::Create");
    Must(trainer->Train(2), "warm-up");
    std::vector<double> seconds;
    auto losses = Must(trainer->Train(steps, [&](const models::StepReport& r) { seconds.push_back(r.seconds); }),
                       "Train");
    const double tokens = static_cast<double>(batch) * config.seq_len;
    const double rate = tokens / Median(seconds);
    if (layout.name == "SPMD") spmd = rate;
    std::printf("%-20s %12.0f %10.3f %12.4f\n", layout.name.c_str(), rate, rate / spmd, losses.back());
    std::fflush(stdout);
    report.Add("train", layout.name, "tokens/s")
        .Value(rate)
        .Baseline("SPMD", spmd)
        .Samples(steps)
        .Param("stages", static_cast<double>(layout.stages.size()))
        .Param("micro_batches", layout.micro_batches)
        .Param("accelerators", n)
        .Param("batch", batch)
        .Extra("final_loss", losses.back());
  }
  std::printf("tokens/s: global batch tokens over the median step time of %d steps (after 2 warm-up steps).\n",
              steps);
  report.WriteOrDie(common.json);
  return 0;
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) {
  // Debian's abseil is built with mutex deadlock detection on, which walks a
  // lock graph on every lock; the test suite keeps it, tools turn it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  causeway::bench::ProgramName() = "models_bench";
  return causeway::Main(argc, argv);
}
