// Training throughput of the benchmark language model (models/) in the
// layouts of the Pathways paper's Table 2, all on the same accelerators and
// global batch: SPMD data parallelism over all of them (the baseline), and
// GPipe-style pipelines of S stages with M micro-batches; then the same SPMD
// step on island server processes through a controller, as one island of
// all the accelerators (the baseline of this pair) against two islands of
// half each, data parallel across them over DCN (loopback). And the SPMD
// step with a checkpoint after every step (models/checkpoint.h: downloaded
// and written by a thread of its own while the next steps run) against the
// same step without: the cost of one checkpoint, at most, in step time; a
// checkpoint every N steps costs at most 1/N of it.
//
// Every layout is built and trains 2 warm-up steps (programs built, pipelines
// compiled); then the layouts take turns of 3 steps each, the order rotating
// from turn to turn, so that noise on the machine falls on all of them alike,
// until each has at least `--samples` samples. A sample is one step's wall
// time from the trainer's progress reports, the first step of a turn not
// counted (steps are queued one ahead, so the rest are the steady state);
// tokens/s is the global batch's tokens over the median step. Every row runs
// on the same device: CAUSEWAY_DEVICE, else the CPU driver.
//
//   causeway_models_bench [--accelerators=4] [--[no-]islands] [--samples=9] [--quick] [--json=FILE]
// --quick: 2 samples of a small model (seconds, for tests); the common flags:
// bench_main.h.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench_main.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "causeway/base/env.h"
#include "causeway/client/local_client.h"
#include "causeway/client/remote_client.h"
#include "causeway/distributed/controller.h"
#include "causeway/distributed/island_process.h"
#include "causeway/models/trainer.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/island.h"

namespace causeway {
namespace {

using bench::Median;
using bench::Must;

struct Layout {
  std::string name;   // as in the table
  std::vector<int> stages;
  uint32_t micro_batches;
  int islands = 0;    // 0: in this process; else island processes, one replica each
  bool checkpoint = false;  // a checkpoint after every step
};

// A layout being trained: its island processes and controller (for the
// island rows; declared first, so the trainer goes before them), its trainer
// and its samples.
struct Running {
  const Layout* layout = nullptr;
  std::vector<std::unique_ptr<transport::IslandProcess>> processes;
  std::unique_ptr<client::Client> remote;  // of the island processes
  std::unique_ptr<models::Trainer> trainer;
  std::vector<double> seconds;
  double loss = 0;
};

// Steps a layout trains per turn; the first of a turn starts with nothing
// queued, so only the rest are samples of the steady state.
constexpr int kStepsPerTurn = 3;

std::unique_ptr<transport::IslandProcess> StartIsland(const std::string& name, int accelerators,
                                                      const std::string& device) {
  const std::string cli = EnvString("CAUSEWAY_CLI");
  return Must(transport::IslandProcess::Start(
                  !cli.empty() ? cli : CAUSEWAY_CLI, name,
                  {absl::StrCat("--device=", device), absl::StrCat("--accelerators=", accelerators)}),
              "start an island");
}

int Main(int argc, char** argv) {
  const bench::CommonFlags common = bench::StartBenchmark("causeway_models_bench", argc, argv);
  const int steps = common.SamplesOr(common.quick ? 2 : 9);
  int accelerators = 4;
  models::TransformerConfig config;
  config.d_model = 128;
  config.heads = 4;
  config.d_ff = 512;
  config.layers = 4;
  config.seq_len = 64;
  uint32_t batch = 32;
  if (common.quick) {
    config.d_model = 32;
    config.d_ff = 64;
    config.seq_len = 16;
    batch = 16;
  }
  bool islands = true;
  bench::BenchFlags flags;
  flags.Int("accelerators", &accelerators, 4, 64, "accelerators of the largest layout, a multiple of 4")
      .Switch("islands", &islands, "also the two-island row (island processes)");
  flags.Parse(argc, argv);
  if (accelerators % 4 != 0) bench::Die("--accelerators must be a multiple of 4");

  // The shipped corpus, where the source tree was, or where CAUSEWAY_CORPUS
  // says (binaries packed for another machine, scripts/gpu-check.sh).
  const std::string corpus_env = EnvString("CAUSEWAY_CORPUS");
  const std::string corpus_path =
      !corpus_env.empty() ? corpus_env : std::string(CAUSEWAY_SOURCE_DIR) + "/data/kjv-genesis-exodus.txt";
  const models::TextCorpus corpus = Must(models::TextCorpus::Load(corpus_path), "TextCorpus::Load");
  // Every row on the same device: CAUSEWAY_DEVICE, else the CPU driver.
  const std::string device_env = EnvString("CAUSEWAY_DEVICE");
  const std::string device = !device_env.empty() ? device_env : "cpu";
  RuntimeOptions options;
  options.accelerators = accelerators;
  options.device = device;
  // Every layout's trainer is alive at once (they take turns): on the CPU
  // driver, whose device memory is host memory, room for all of them.
  if (device == "cpu") options.memory_budget = uint64_t{2} << 30;
  auto rt = Must(Runtime::Create(options), "Runtime::Create");
  auto island = Must(Island::Create(rt.get()), "Island::Create");
  auto local = Must(client::LocalClient::Connect(island.get(), "models_bench"), "LocalClient::Connect");

  const int n = accelerators;
  std::vector<Layout> layouts = {{"SPMD", {n}, 1},
                                 {"pipeline S=2 M=8", std::vector<int>(2, n / 2), 8},
                                 {"pipeline S=2 M=16", std::vector<int>(2, n / 2), 16},
                                 {"pipeline S=4 M=8", std::vector<int>(4, n / 4), 8},
                                 {"pipeline S=4 M=16", std::vector<int>(4, n / 4), 16}};
  if (common.quick) layouts = {layouts[0], {"pipeline S=2 M=8", std::vector<int>(2, n / 2), 8}};
  layouts.push_back({"SPMD, checkpoints", {n}, 1, 0, true});
  if (islands) {
    layouts.push_back({"SPMD, 1 island", {n}, 1, 1});
    layouts.push_back({"SPMD, 2 islands", {n / 2}, 1, 2});
  }
  std::printf("model: %u layers, d_model %u, %u heads, d_ff %u, context %u; global batch %u; %d accelerators (%s)\n",
              config.layers, config.d_model, config.heads, config.d_ff, config.seq_len, batch, n,
              rt->accelerator(0)->info().name.c_str());

  char dir_template[] = "/tmp/causeway_models_bench_XXXXXX";
  if (mkdtemp(dir_template) == nullptr) bench::Die("mkdtemp failed");
  const std::string checkpoint_dir = dir_template;

  // Every layout is built and warmed up (2 steps: programs built, pipelines
  // compiled), then they take turns, kStepsPerTurn steps each, the order
  // rotating, so that a busy spell of the machine falls on all of them.
  std::vector<Running> running(layouts.size());
  for (size_t l = 0; l < layouts.size(); ++l) {
    const Layout& layout = layouts[l];
    Running& r = running[l];
    r.layout = &layout;
    models::TrainOptions o;
    o.config = config;
    o.layout = models::TrainLayout{batch, layout.micro_batches, static_cast<uint32_t>(std::max(layout.islands, 1))};
    o.stages = layout.stages;
    if (layout.checkpoint) {
      o.checkpoint_dir = checkpoint_dir;
      o.checkpoint_every = 1;
    }
    if (layout.islands == 0) {
      r.trainer = Must(models::Trainer::Create(local.get(), corpus, o), "Trainer::Create");
    } else {
      std::vector<std::string> addresses;
      for (int i = 0; i < layout.islands; ++i) {
        r.processes.push_back(
            StartIsland(absl::StrCat("of", layout.islands, "-island-", i), n / layout.islands, device));
        addresses.push_back(r.processes.back()->address());
      }
      r.remote = Must(client::RemoteClient::Connect(addresses), "RemoteClient::Connect");
      r.trainer = Must(models::Trainer::Create(r.remote.get(), corpus, o), "Trainer::Create");
    }
    Must(r.trainer->Train(2), "warm-up");
  }
  const int turns = (steps + kStepsPerTurn - 2) / (kStepsPerTurn - 1);
  for (int turn = 0; turn < turns; ++turn) {
    for (size_t k = 0; k < running.size(); ++k) {
      Running& r = running[(k + turn) % running.size()];
      int step = 0;
      auto losses = Must(r.trainer->Train(kStepsPerTurn,
                                          [&](const models::StepReport& report) {
                                            if (step++ > 0) r.seconds.push_back(report.seconds);
                                          }),
                         "Train");
      r.loss = losses.back();
    }
  }

  std::printf("%-20s %12s %10s %12s\n", "layout", "tokens/s", "vs SPMD", "final loss");
  bench::Report report("models");
  const double tokens = static_cast<double>(batch) * config.seq_len;
  double spmd = 0, one_island = 0;
  for (const Running& r : running) {
    const double rate = tokens / Median(r.seconds);
    if (r.layout->name == "SPMD") spmd = rate;
    if (r.layout->islands == 1) one_island = rate;
  }
  for (const Running& r : running) {
    const Layout& layout = *r.layout;
    const double rate = tokens / Median(r.seconds);
    // Islands against one island; the rest against SPMD in this process.
    const double base = layout.islands > 0 ? one_island : spmd;
    std::printf("%-20s %12.0f %10.3f %12.4f\n", layout.name.c_str(), rate, rate / spmd, r.loss);
    if (layout.islands > 1) std::printf("%-20s %12s %10.3f (vs 1 island)\n", "", "", rate / one_island);
    if (layout.checkpoint) {
      std::printf("%-20s %12s %10s a checkpoint costs %.1f%% of a step: every 50 steps, %.2f%%\n", "", "", "",
                  100.0 * (spmd / rate - 1), 100.0 * (spmd / rate - 1) / 50);
    }
    report.Add("train", layout.name, "tokens/s")
        .Value(rate)
        .Baseline(layout.islands > 0 ? "SPMD, 1 island" : "SPMD", base)
        .Samples(static_cast<int>(r.seconds.size()))
        .Param("stages", static_cast<double>(layout.stages.size()))
        .Param("micro_batches", layout.micro_batches)
        .Param("accelerators", n)
        .Param("batch", batch)
        .Param("islands", layout.islands)
        .Param("device", device)
        .Param("checkpoint_every", layout.checkpoint ? 1 : 0)
        .Extra("final_loss", r.loss);
  }
  std::printf(
      "tokens/s: global batch tokens over the median step time of %d steps a layout (turns of %d steps, "
      "layouts interleaved, the first step of a turn not counted).\n",
      turns * (kStepsPerTurn - 1), kStepsPerTurn);
  running.clear();
  std::filesystem::remove_all(checkpoint_dir);
  report.WriteOrDie(common.json);
  return 0;
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) { return causeway::Main(argc, argv); }
