// causeway train: trains the benchmark language model (models/) on the
// shipped corpus, showing progress, then prints a summary and writes a trace
// of the last steps.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "causeway/base/env.h"
#include "causeway/base/fault_injection.h"
#include "causeway/client/local_client.h"
#include "causeway/client/remote_client.h"
#include "causeway/distributed/controller.h"
#include "causeway/distributed/island_process.h"
#include "causeway/models/elastic_trainer.h"
#include "causeway/models/trainer.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/island.h"
#include "tools/build_paths.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/trace_analysis.h"

namespace causeway::cli {
namespace {

// "single", "dp", "pipeline": the stages of a layout on `accelerators`.
absl::StatusOr<std::vector<int>> Stages(const std::string& layout, int accelerators, int stages) {
  if (layout == "single") return std::vector<int>{1};
  if (layout == "dp") return std::vector<int>{accelerators};
  if (layout == "pipeline") {
    if (stages < 1 || accelerators % stages != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stages ", stages, " must divide the ", accelerators, " accelerators"));
    }
    return std::vector<int>(stages, accelerators / stages);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--layout must be single, dp or pipeline, got '", layout, "'"));
}

std::string Bar(double fraction, int width) {
  const int filled = std::clamp(static_cast<int>(fraction * width + 0.5), 0, width);
  return std::string(filled, '#') + std::string(width - filled, '.');
}

}  // namespace

int TrainCommand(const std::vector<std::string>& args) {
  auto specs = RuntimeFlagSpecs();
  specs.push_back({"corpus", "the text to train on (default: the shipped corpus)", ""});
  specs.push_back({"steps", "training steps", "200"});
  specs.push_back({"layout", "single (one accelerator), dp (data parallel over all), pipeline", "single"});
  specs.push_back({"stages", "pipeline stages (--layout pipeline; each gets accelerators / stages)", "2"});
  specs.push_back({"micro-batches", "micro-batches per step (pipeline)", "4"});
  specs.push_back({"batch", "sequences per step (global)", "16"});
  specs.push_back({"seq-len", "characters per sequence", "64"});
  specs.push_back({"layers", "Transformer blocks", "2"});
  specs.push_back({"d-model", "model width", "64"});
  specs.push_back({"heads", "attention heads", "4"});
  specs.push_back({"d-ff", "MLP width", "256"});
  specs.push_back({"lr", "Adam learning rate", "0.003"});
  specs.push_back({"seed", "initial weights and batch order", "1"});
  specs.push_back({"eval-batches", "held-out batches for the final evaluation", "8"});
  specs.push_back({"trace-steps", "trace this many of the last steps into --trace FILE (0: none)", "5"});
  specs.push_back({"islands", "data parallel across this many islands: island server processes started here, "
                              "each with accelerators / islands (1: all in this process)", "1"});
  specs.push_back({"connect", "data parallel across running island servers (HOST:PORT,...; see causeway island)",
                   ""});
  specs.push_back({"secret-file", "shared secret for --connect beyond loopback (or CAUSEWAY_SECRET)", ""});
  specs.push_back(
      {"spares", "islands (HOST:PORT,...) to admit in place of lost ones (--islands, --connect)", ""});
  specs.push_back({"admit-every",
                   "steps between the boundaries at which lost islands are sought and admitted back", "10"});
  specs.push_back(
      {"losses", "write each step's loss to this file (\"STEP LOSS\" lines, full precision)", ""});
  specs.push_back({"checkpoint",
                   "write checkpoints into this directory (weights, Adam moments, step, data "
                   "position), every --checkpoint-every steps and at the end",
                   ""});
  specs.push_back({"checkpoint-every", "steps between checkpoints (--checkpoint)", "50"});
  specs.push_back({"resume",
                   "continue from the newest checkpoint in this directory (or this checkpoint file) up to "
                   "--steps in all, on any layout; model flags not given come from it",
                   ""});
  specs.push_back({"deadline",
                   "fail a step (or evaluation batch) that takes longer (e.g. 10s), naming its kernel and "
                   "accelerator; an accelerator its work still holds is quarantined",
                   ""});
  Flags flags(specs);
  auto fail = [](const absl::Status& s, int code) { return Fail("train", s, code); };
  if (auto done = StartCommand("train",
                               "usage: causeway train [flags]\n\nTrains a character-level Transformer "
                               "language model on a text corpus "
                               "(forward,\nbackward and Adam as one Causeway program per step), showing "
                               "step, loss and\ntokens/s (over the last 10 steps); then "
                               "prints the final training and held-out loss, tokens/s and "
                               "each\naccelerator's utilization, and writes a "
                               "trace of the last steps\n(--trace, default causeway-train.trace.json).\n\n",
                               flags, args)) {
    return *done;
  }
  auto runtime_options = RuntimeOptionsFromFlags(flags);
  if (!runtime_options.ok()) return fail(runtime_options.status(), 2);
  const std::string layout = flags.Get("layout");
  if (!flags.Has("accelerators") && EnvString("CAUSEWAY_ACCELERATORS").empty()) {
    runtime_options->accelerators = layout == "single" ? 1 : 4;
  }
  struct IntFlag {
    const char* name;
    int64_t min, max;
    int64_t value = 0;
  };
  std::vector<IntFlag> ints = {{"steps", 1, 1000000},      {"stages", 1, 64},
                               {"micro-batches", 1, 1024}, {"batch", 1, 65536},
                               {"seq-len", 1, 4096},       {"layers", 1, 256},
                               {"d-model", 1, 8192},       {"heads", 1, 1024},
                               {"d-ff", 1, 65536},         {"eval-batches", 1, 10000},
                               {"seed", 0, INT64_MAX},     {"trace-steps", 0, 1000000},
                               {"islands", 1, 64},         {"checkpoint-every", 1, 1000000},
                               {"admit-every", 1, 1000000}};
  for (IntFlag& f : ints) {
    auto v = flags.Int(f.name);
    if (!v.ok()) return fail(v.status(), 2);
    if (*v < f.min || *v > f.max) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--", f.name, " must be in ", f.min, "..", f.max)), 2);
    }
    f.value = *v;
  }
  auto get = [&ints](const char* name) {
    for (const IntFlag& f : ints) {
      if (std::string(f.name) == name) return f.value;
    }
    return int64_t{0};
  };
  double lr = 0;
  if (!absl::SimpleAtod(flags.Get("lr"), &lr) || !(lr > 0)) {
    return fail(absl::InvalidArgumentError("--lr must be a number > 0"), 2);
  }
  const std::string corpus_path = flags.Has("corpus") ? flags.Get("corpus") : ShippedCorpus();
  const std::string trace_path = flags.Has("trace") ? flags.Get("trace") : "causeway-train.trace.json";

  if (std::optional<std::string> fault = EnvValue("CAUSEWAY_FAULT"); fault.has_value()) {
    if (absl::Status s = ArmFaultFromString(*fault); !s.ok()) return fail(s, 2);
  }
  auto corpus = models::TextCorpus::Load(corpus_path);
  if (!corpus.ok()) return fail(corpus.status(), 1);

  models::TrainOptions options;
  options.config.d_model = static_cast<uint32_t>(get("d-model"));
  options.config.heads = static_cast<uint32_t>(get("heads"));
  options.config.d_ff = static_cast<uint32_t>(get("d-ff"));
  options.config.layers = static_cast<uint32_t>(get("layers"));
  options.config.seq_len = static_cast<uint32_t>(get("seq-len"));
  options.layout.batch = static_cast<uint32_t>(get("batch"));
  options.layout.micro_batches = layout == "pipeline" ? static_cast<uint32_t>(get("micro-batches")) : 1;
  options.adam.lr = static_cast<float>(lr);
  options.seed = static_cast<uint64_t>(get("seed"));
  if (flags.Has("checkpoint")) {
    options.checkpoint_dir = flags.Get("checkpoint");
    options.checkpoint_every = static_cast<uint64_t>(get("checkpoint-every"));
  } else if (flags.Has("checkpoint-every")) {
    return fail(absl::InvalidArgumentError("--checkpoint-every needs --checkpoint DIR"), 2);
  }
  // A checkpoint to continue from: the model, batch, learning rate and seed
  // it was trained with, unless given; a model flag that differs is an error.
  std::optional<models::CheckpointState> resume;
  if (flags.Has("resume")) {
    auto read = models::ReadCheckpoint(flags.Get("resume"));
    if (!read.ok()) return fail(read.status(), 1);
    resume = *std::move(read);
    if (resume->vocabulary != corpus->vocab().chars()) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "the checkpoint in ", flags.Get("resume"),
                      " was trained on another corpus: its vocabulary of ", resume->vocabulary.size(),
                      " characters differs from the ", corpus->vocab().size(), " of ", corpus_path)),
                  2);
    }
    const models::TransformerConfig& c = resume->config;
    for (auto [flag, value, field] : {std::tuple{"d-model", c.d_model, &options.config.d_model},
                                      std::tuple{"heads", c.heads, &options.config.heads},
                                      std::tuple{"d-ff", c.d_ff, &options.config.d_ff},
                                      std::tuple{"layers", c.layers, &options.config.layers},
                                      std::tuple{"seq-len", c.seq_len, &options.config.seq_len}}) {
      if (flags.Has(flag) && *field != value) {
        return fail(
            absl::InvalidArgumentError(absl::StrCat("--", flag, " ", *field, " differs from the ", value,
                                                    " of the checkpoint in ", flags.Get("resume"))),
            2);
      }
      *field = value;
    }
    options.config.vocab = c.vocab;
    options.config.ln_eps = c.ln_eps;
    if (!flags.Has("batch")) options.layout.batch = resume->batch;
    if (!flags.Has("lr")) options.adam = resume->adam;
    if (!flags.Has("seed")) options.seed = resume->seed;
  }
  options.eval_batches = static_cast<uint32_t>(get("eval-batches"));
  if (flags.Has("deadline")) {
    auto deadline = flags.Duration("deadline");
    if (!deadline.ok()) return fail(deadline.status(), 2);
    options.run_deadline = *deadline;
  }

  // Where it runs: this process's accelerators, or islands (started here or
  // running elsewhere), one replica of the layout on each.
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<Island> island;
  std::vector<std::unique_ptr<transport::IslandProcess>> processes;
  std::unique_ptr<client::Client> client;
  models::ElasticOptions elastic_options;
  std::vector<std::string> island_args;  // of the island processes started here
  std::string where;
  const int islands = static_cast<int>(get("islands"));
  if (islands > 1 && flags.Has("connect")) {
    return fail(absl::InvalidArgumentError("--islands and --connect do not go together"), 2);
  }
  const bool remote = islands > 1 || flags.Has("connect");
  if (remote) {
    std::vector<std::string> addresses;
    if (flags.Has("connect")) {
      addresses = absl::StrSplit(flags.Get("connect"), ',', absl::SkipEmpty());
      if (addresses.empty()) return fail(absl::InvalidArgumentError("--connect names no island"), 2);
    } else {
      if (runtime_options->accelerators % islands != 0) {
        return fail(absl::InvalidArgumentError(absl::StrCat("--islands ", islands, " must divide the ",
                                                            runtime_options->accelerators, " accelerators")),
                    2);
      }
      island_args = {absl::StrCat("--accelerators=", runtime_options->accelerators / islands)};
      if (!runtime_options->device.empty()) island_args.push_back(absl::StrCat("--device=", runtime_options->device));
      if (runtime_options->validation) island_args.push_back("--validation");
      for (int i = 0; i < islands; ++i) {
        auto p = transport::IslandProcess::Start("/proc/self/exe", absl::StrCat("island-", i), island_args);
        if (!p.ok()) return fail(p.status(), 1);
        addresses.push_back((*p)->address());
        processes.push_back(*std::move(p));
      }
    }
    auto controller_options = ControllerOptionsFromFlags(flags, "train");
    if (!controller_options.ok()) return fail(controller_options.status(), 2);
    elastic_options.islands = addresses;
    elastic_options.spares = absl::StrSplit(flags.Get("spares"), ',', absl::SkipEmpty());
    elastic_options.controller = *controller_options;
    elastic_options.admit_every = static_cast<uint64_t>(get("admit-every"));
    elastic_options.report = [](const std::string& line) {
      std::printf("islands: %s\n", line.c_str());
      std::fflush(stdout);
    };
    auto connected = client::RemoteClient::Connect(addresses, *controller_options);
    if (!connected.ok()) return fail(connected.status(), 1);
    client = *std::move(connected);
    auto devices = client->Devices();
    if (!devices.ok()) return fail(devices.status(), 1);
    // Replica r on island r: each island as many accelerators as the first.
    std::vector<std::string> names(static_cast<size_t>(client->island_count()));
    int per_island = 0;
    for (const client::Device& d : *devices) {
      names.at(d.island) = d.island_name;
      if (d.island == 0) ++per_island;
    }
    auto stages = Stages(layout, per_island, static_cast<int>(get("stages")));
    if (!stages.ok()) return fail(stages.status(), 2);
    options.stages = *stages;
    options.layout.replicas = static_cast<uint32_t>(client->island_count());
    where =
        absl::StrCat(client->island_count(), " islands (", absl::StrJoin(names, ", "), ") of ", per_island,
                     " accelerator", per_island == 1 ? "" : "s", " each, ", layout, " (",
                     absl::StrJoin(options.stages, " + "), ") in each; ", devices->front().capabilities.name);
  } else {
    auto made_rt = Runtime::Create(*runtime_options);
    if (!made_rt.ok()) return fail(made_rt.status(), 1);
    rt = *std::move(made_rt);
    auto stages = Stages(layout, static_cast<int>(rt->size()), static_cast<int>(get("stages")));
    if (!stages.ok()) return fail(stages.status(), 2);
    auto made_island = Island::Create(rt.get());
    if (!made_island.ok()) return fail(made_island.status(), 1);
    island = *std::move(made_island);
    auto made_client = client::LocalClient::Connect(island.get(), "train");
    if (!made_client.ok()) return fail(made_client.status(), 1);
    client = *std::move(made_client);
    options.stages = *stages;
    where = absl::StrCat(layout, " on ", rt->size(), " accelerator", rt->size() == 1 ? "" : "s", " (",
                         absl::StrJoin(options.stages, " + "), ") of ", rt->plan().device->name);
  }
  // Across islands, elastic: a lost island's replica drops out and a
  // returning one is admitted (models/elastic_trainer.h).
  std::unique_ptr<models::ElasticTrainer> elastic;
  std::unique_ptr<models::Trainer> local_trainer;
  if (remote) {
    client.reset();  // it only described the islands
    auto made = models::ElasticTrainer::Create(*corpus, options, elastic_options);
    if (!made.ok()) return fail(made.status(), 1);
    elastic = *std::move(made);
  } else {
    auto made = models::Trainer::Create(client.get(), *corpus, options);
    if (!made.ok()) return fail(made.status(), 1);
    local_trainer = *std::move(made);
  }
  // The trainer of the moment (an elastic one rebuilds its own).
  auto trainer = [&]() -> models::Trainer* { return elastic ? &elastic->trainer() : local_trainer.get(); };
  auto train = [&](uint64_t n, const std::function<void(const models::StepReport&)>& progress) {
    return elastic ? elastic->Train(n, progress) : local_trainer->Train(n, progress);
  };
  const models::TrainOptions o = trainer()->options();
  std::printf("causeway train: %s, %zu characters (%d distinct), %.0f%% held out\n", corpus_path.c_str(),
              static_cast<size_t>(corpus->bytes()), corpus->vocab().size(),
              100.0 * static_cast<double>(corpus->held_out().size()) / static_cast<double>(corpus->bytes()));
  std::printf("model: %u layers, d_model %u, %u heads, d_ff %u, context %u: %s parameters\n", o.config.layers,
              o.config.d_model, o.config.heads, o.config.d_ff, o.config.seq_len,
              absl::StrFormat("%.2fM", static_cast<double>(o.config.ParameterCount()) / 1e6).c_str());
  std::printf("layout: %s; batch %u%s\n", where.c_str(), o.layout.batch,
              layout == "pipeline" ? absl::StrCat(" in ", o.layout.micro_batches, " micro-batches").c_str() : "");

  const uint64_t first = resume ? resume->step : 0;
  if (resume) {
    if (resume->step >= static_cast<uint64_t>(get("steps"))) {
      return fail(absl::InvalidArgumentError(
                      absl::StrCat("the checkpoint in ", flags.Get("resume"), " is at step ", resume->step,
                                   "; --steps ", get("steps"), " (steps in all) leaves none to train")),
                  2);
    }
    if (absl::Status s = trainer()->Restore(*resume); !s.ok()) return fail(s, 1);
    std::printf("resumed: step %llu from %s (written by %s)\n", static_cast<unsigned long long>(first),
                flags.Get("resume").c_str(), resume->layout.c_str());
  }
  const uint64_t total = static_cast<uint64_t>(get("steps"));
  const uint64_t steps = total - first;  // to run here
  // Island processes trace on their own (causeway island --trace).
  const uint64_t traced =
      remote ? 0 : std::min<uint64_t>(static_cast<uint64_t>(get("trace-steps")), steps - 1);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> losses_file(nullptr, &std::fclose);
  if (flags.Has("losses")) {
    losses_file.reset(std::fopen(flags.Get("losses").c_str(), "w"));
    if (losses_file == nullptr) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--losses: cannot write ", flags.Get("losses"),
                                                          ": ", std::strerror(errno))),
                  1);
    }
  }
  const bool tty = isatty(STDOUT_FILENO);
  std::vector<double> rates, losses;
  // The progress lines' rate: over the last kWindow steps. A step's seconds
  // run from the previous loss read to its own; with steps queued ahead two
  // losses can be read almost back to back, so one step's rate swings far
  // above and below the sustained one (25570 tokens/s against a median of
  // 719 across islands).
  constexpr size_t kWindow = 10;
  std::deque<std::pair<double, double>> window;  // (tokens, seconds) per step
  auto progress = [&](const models::StepReport& r) {
    // An island process started here that ended starts again at its
    // address, to be admitted back at a step boundary.
    for (size_t i = 0; i < processes.size(); ++i) {
      std::string how;
      if (processes[i] == nullptr || !processes[i]->Ended(&how)) continue;
      const std::string address = processes[i]->address();
      std::vector<std::string> args = island_args;
      args.push_back("--listen=" + address);
      auto again = transport::IslandProcess::Start("/proc/self/exe", absl::StrCat("island-", i), args);
      std::printf("islands: island-%zu %s; %s\n", i, how.c_str(),
                  again.ok() ? absl::StrCat("restarted at ", address).c_str()
                             : absl::StrCat("not restarted: ", again.status().message()).c_str());
      processes[i] = again.ok() ? *std::move(again) : nullptr;
    }
    const double rate = r.seconds > 0 ? r.tokens / r.seconds : 0;
    window.emplace_back(r.tokens, r.seconds);
    if (window.size() > kWindow) window.pop_front();
    double window_tokens = 0, window_seconds = 0;
    for (const auto& [tokens, seconds] : window) window_tokens += tokens, window_seconds += seconds;
    const double shown = window_seconds > 0 ? window_tokens / window_seconds : 0;
    losses.push_back(r.loss);
    if (losses_file != nullptr)
      std::fprintf(losses_file.get(), "%llu %.17g\n", static_cast<unsigned long long>(r.step), r.loss);
    // Untraced, past the first.
    if (r.step > first + 1 && r.step <= total - traced) rates.push_back(rate);
    if (tty) {
      std::printf("\r[%s] step %llu/%llu  loss %.4f  %8.0f tokens/s ",
                  Bar(double(r.step) / total, 30).c_str(), static_cast<unsigned long long>(r.step),
                  static_cast<unsigned long long>(total), r.loss, shown);
      if (r.step == total) std::printf("\n");
      std::fflush(stdout);
    } else if (r.step == first + 1 || r.step % 10 == 0 || r.step == total) {
      std::printf("step %llu/%llu  loss %.4f  %.0f tokens/s\n", static_cast<unsigned long long>(r.step),
                  static_cast<unsigned long long>(total), r.loss, shown);
      std::fflush(stdout);
    }
  };
  const absl::Time start = absl::Now();
  auto run = train(steps - traced, progress);
  if (!run.ok()) return fail(run.status(), 1);
  if (traced > 0) {
    auto session = TraceSession::Start(trace_path);
    if (!session.ok()) return fail(session.status(), 1);
    run = train(traced, progress);
    if (!run.ok()) return fail(run.status(), 1);
    if (absl::Status s = (*session)->Finish(); !s.ok()) return fail(s, 1);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (losses_file != nullptr && std::fclose(losses_file.release()) != 0) {
    return fail(absl::InternalError(absl::StrCat("--losses: writing ", flags.Get("losses"), " failed")), 1);
  }
  if (!o.checkpoint_dir.empty() && trainer()->checkpointed_step() != trainer()->steps_done()) {
    if (absl::Status s = trainer()->SaveCheckpoint(); !s.ok()) return fail(s, 1);
  }
  if (!o.checkpoint_dir.empty()) {
    std::printf("checkpoint: step %llu in %s\n",
                static_cast<unsigned long long>(trainer()->checkpointed_step()), o.checkpoint_dir.c_str());
  }
  auto held_out = trainer()->Evaluate();
  if (!held_out.ok()) return fail(held_out.status(), 1);

  const size_t tail = std::min<size_t>(10, losses.size());
  double train_loss = 0;
  for (size_t i = losses.size() - tail; i < losses.size(); ++i) train_loss += losses[i] / tail;
  std::sort(rates.begin(), rates.end());
  const double rate = rates.empty() ? 0 : rates[rates.size() / 2];
  std::printf("\nsummary\n");
  std::printf("  training loss     %.4f (mean of the last %zu steps; step %llu: %.4f)\n", train_loss, tail,
              static_cast<unsigned long long>(first + 1), losses.front());
  std::printf("  held-out loss     %.4f (%u batches of %u)\n", *held_out, o.eval_batches, o.layout.batch);
  std::printf("  tokens/s          %.0f (median over %zu untraced steps; %llu steps in %.1f s)\n", rate, rates.size(),
              static_cast<unsigned long long>(steps), seconds);
  if (remote) {
    std::printf("  utilization       not collected: the accelerators are in the island processes\n");
  } else if (traced > 0) {
    auto parsed = ReadTraceFile(trace_path);
    if (!parsed.ok()) return fail(parsed.status(), 1);
    const TraceSummary summary = Summarize(*parsed);
    std::printf("  utilization       over the last %llu steps (traced):\n", static_cast<unsigned long long>(traced));
    for (const TraceSummary::Accelerator& a : summary.accelerators) {
      std::printf("    %-24s %5.1f%% busy  [%s]\n", a.name.empty() ? absl::StrCat("accelerator ", a.index).c_str()
                                                                    : a.name.c_str(),
                  100.0 * a.utilization, Bar(a.utilization, 20).c_str());
    }
    std::printf("  trace             %s (causeway trace summarize %s)\n", trace_path.c_str(), trace_path.c_str());
  }
  return 0;
}

}  // namespace causeway::cli
