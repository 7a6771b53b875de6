// causeway demo: a pipeline of matmuls as a Causeway program, one stage per
// accelerator.
//
// Stage s runs on a one-accelerator mesh of its own and computes
// x_{s+1} = x_s * W_s; lowering turns each edge between stages into a
// transfer (a device-to-device copy). Several batches flow through: each is
// one run of the program. With asynchronous dispatch every run is queued
// before the first has finished (the gang scheduler submits each step with
// waits on its inputs); with synchronous dispatch each step is awaited before
// the next one is submitted. Results are checked against a CPU reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/memory.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/island.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace causeway::cli {
namespace {

struct Pipeline {
  std::unique_ptr<Island> island;
  std::shared_ptr<Client> client;
  std::vector<std::shared_ptr<Mesh>> meshes;
  std::vector<ArrayRef> weights;
  std::shared_ptr<Executable> executable;
};

absl::StatusOr<Pipeline> Build(Runtime& rt, DispatchMode mode, uint32_t n, int batches,
                               const std::vector<std::vector<float>>& weights) {
  Pipeline p;
  IslandOptions options;
  options.dispatch = mode;
  options.runs_in_flight = std::max(2, batches);
  CAUSEWAY_ASSIGN_OR_RETURN(p.island, Island::Create(&rt, options));
  CAUSEWAY_ASSIGN_OR_RETURN(p.client, p.island->Connect("demo"));
  CAUSEWAY_ASSIGN_OR_RETURN(auto matmul, Function::Matmul(n, n, n));
  ProgramBuilder b("matmul-pipeline");
  Shape square = {n, n};
  for (size_t s = 0; s < rt.size(); ++s) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto mesh, p.client->AllocateMesh({1}));
    p.meshes.push_back(mesh);
    std::string w = absl::StrCat("w", s);
    if (s == 0) b.Parameter("x0", mesh, square, DType::kF32);
    b.Parameter(w, mesh, square, DType::kF32);
    b.Call(absl::StrCat("stage", s), matmul, mesh, {absl::StrCat("x", s), w}, {absl::StrCat("x", s + 1)});
    CAUSEWAY_ASSIGN_OR_RETURN(auto wa,
                              p.client->CreateArray(mesh, square, DType::kF32, Sharding::Replicated(), w));
    CAUSEWAY_RETURN_IF_ERROR(wa->Upload(weights[s].data(), weights[s].size() * sizeof(float)));
    p.weights.push_back(wa);
  }
  b.Output(absl::StrCat("x", rt.size()));
  CAUSEWAY_ASSIGN_OR_RETURN(auto program, b.Build());
  CAUSEWAY_ASSIGN_OR_RETURN(p.executable, p.client->Load(program));
  return p;
}

// Runs every batch through the pipeline; returns the outputs.
absl::StatusOr<std::vector<std::vector<float>>> RunBatches(Pipeline& p, const std::vector<std::vector<float>>& inputs,
                                                           uint32_t n, bool await_each) {
  std::vector<Execution> runs;
  for (const auto& x : inputs) {
    CAUSEWAY_ASSIGN_OR_RETURN(
        auto xa, p.client->CreateArray(p.meshes[0], {n, n}, DType::kF32, Sharding::Replicated(), "x0"));
    CAUSEWAY_RETURN_IF_ERROR(xa->Upload(x.data(), x.size() * sizeof(float)));
    std::vector<ArrayRef> args = {xa};
    args.insert(args.end(), p.weights.begin(), p.weights.end());
    CAUSEWAY_ASSIGN_OR_RETURN(Execution run, p.client->Execute(p.executable, args));
    if (await_each) CAUSEWAY_RETURN_IF_ERROR(run.Await());
    runs.push_back(std::move(run));
  }
  std::vector<std::vector<float>> outputs;
  for (Execution& run : runs) {
    CAUSEWAY_RETURN_IF_ERROR(run.Await());
    outputs.emplace_back(size_t{n} * n);
    CAUSEWAY_RETURN_IF_ERROR(
        run.outputs[0]->Download(outputs.back().data(), outputs.back().size() * sizeof(float)));
  }
  return outputs;
}

}  // namespace

int DemoCommand(const std::vector<std::string>& args) {
  auto specs = RuntimeFlagSpecs();
  specs.push_back({"size", "matrix size n (each stage multiplies n x n by n x n)", "256"});
  specs.push_back({"batches", "batches flowing through the pipeline (one program run each)", "8"});
  specs.push_back({"repeats", "timed runs of each mode (the median is reported)", "5"});
  Flags flags(specs);
  auto fail = [](const absl::Status& s, int code) { return Fail("demo", s, code); };
  if (auto done =
          StartCommand("demo",
                       "usage: causeway demo [flags]\n\nA pipeline of matmuls, one stage per accelerator, "
                       "run as a Causeway program,\nchecked against a CPU reference and timed in "
                       "asynchronous and synchronous dispatch.\n\n",
                       flags, args)) {
    return *done;
  }
  auto options = RuntimeOptionsFromFlags(flags);
  if (!options.ok()) return fail(options.status(), 2);
  if (!flags.Has("accelerators") && EnvString("CAUSEWAY_ACCELERATORS").empty()) options->accelerators = 4;
  auto n64 = flags.Int("size");
  auto batches64 = flags.Int("batches");
  auto repeats64 = flags.Int("repeats");
  if (!n64.ok()) return fail(n64.status(), 2);
  if (!batches64.ok()) return fail(batches64.status(), 2);
  if (!repeats64.ok()) return fail(repeats64.status(), 2);
  if (*n64 < 1 || *n64 > 4096 || *batches64 < 1 || *batches64 > 256 || *repeats64 < 1 || *repeats64 > 100) {
    return fail(absl::InvalidArgumentError("--size must be 1..4096, --batches 1..256, --repeats 1..100"), 2);
  }
  uint32_t n = static_cast<uint32_t>(*n64);
  int batches = static_cast<int>(*batches64), repeats = static_cast<int>(*repeats64);

  auto trace = flags.StartTrace();
  if (!trace.ok()) return fail(trace.status(), 2);
  auto rt = Runtime::Create(*options);
  if (!rt.ok()) return fail(rt.status(), 1);
  size_t stages = (*rt)->size();
  std::printf("causeway demo: %zu accelerators on %s (%s copies); a program of %zu matmul stages (%ux%u), %d "
              "batches\n",
              stages, (*rt)->plan().device->name.c_str(), CopyPathName((*rt)->plan().copy_path), stages, n, n,
              batches);

  // Weights scaled so that values stay near 1 through the chain.
  float bound = 1.7f / std::sqrt(static_cast<float>(n));
  std::vector<std::vector<float>> weights, inputs;
  for (size_t s = 0; s < stages; ++s) weights.push_back(reference::RandomFloats(size_t{n} * n, 100 + s, -bound, bound));
  for (int b = 0; b < batches; ++b) inputs.push_back(reference::RandomFloats(size_t{n} * n, 7 + b));

  double flops = 2.0 * n * n * n * stages * batches;
  double ms[2] = {0, 0};
  bool ok = true;
  for (int mode = 0; mode < 2; ++mode) {
    bool async = mode == 0;
    auto p = Build(**rt, async ? DispatchMode::kAsync : DispatchMode::kSynchronous, n, batches, weights);
    if (!p.ok()) return fail(p.status(), 1);
    if (async) {
      auto outputs = RunBatches(*p, inputs, n, false);
      if (!outputs.ok()) return fail(outputs.status(), 1);
      double max_err = 0;
      for (int b = 0; b < batches; ++b) {
        std::vector<float> x = inputs[b];
        for (size_t s = 0; s < stages; ++s) x = reference::Matmul(x, weights[s], n, n, n);
        max_err = std::max(max_err, reference::MaxRelativeError((*outputs)[b], x));
      }
      ok = max_err < 1e-3;
      std::printf("check: max relative error %.3g against the CPU reference: %s\n", max_err, ok ? "PASS" : "FAIL");
    }
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      absl::Time t0 = absl::Now();
      auto run = RunBatches(*p, inputs, n, !async);
      if (!run.ok()) return fail(run.status(), 1);
      times.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
    std::sort(times.begin(), times.end());
    ms[mode] = times[times.size() / 2];
    std::printf("%-12s %8.2f ms for %d batches (median of %d), %6.2f GFLOP/s\n",
                async ? "asynchronous" : "synchronous", ms[mode], batches, repeats, flops / (ms[mode] * 1e6));
    if (async) {
      for (size_t s = 0; s < stages; ++s) {
        Accelerator* a = (*rt)->accelerator(s);
        std::printf("  %s: %s of %s budget in use\n", a->name().c_str(), FormatBytes(a->memory_in_use()).c_str(),
                    FormatBytes(a->memory_budget()).c_str());
      }
    }
  }
  std::printf("asynchronous dispatch is %.2fx synchronous\n", ms[1] / ms[0]);
  return ok ? 0 : 1;
}

}  // namespace causeway::cli
