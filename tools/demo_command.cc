// causeway demo: a pipeline of matmuls, one stage per accelerator.
//
// Stage s on accelerator s holds a weight W_s and computes Y = X * W_s; its
// output is copied to the next accelerator (the ICI path) for the next stage.
// Several batches flow through the pipeline. In asynchronous mode every step
// of every batch is submitted before any has run (dependencies are timeline
// waits and host relays); in sequential mode each step is awaited before the
// next is submitted. The result is checked against a CPU reference.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/memory.h"
#include "runtime/ops.h"
#include "runtime/reference.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace causeway::cli {
namespace {

struct Stage {
  Accelerator* acc;
  std::shared_ptr<Buffer> in, weight, out;
  std::shared_ptr<CommandList> copy_in;  // previous stage's out -> in (stages >= 1)
  std::shared_ptr<CommandList> compute;
};

// Runs all batches through the stages; returns the outputs.
absl::StatusOr<std::vector<std::vector<float>>> RunPipeline(std::vector<Stage>& stages,
                                                            const std::vector<std::vector<float>>& inputs,
                                                            uint32_t n, bool async) {
  size_t bytes = size_t{n} * n * 4;
  std::vector<std::vector<float>> outputs(inputs.size(), std::vector<float>(size_t{n} * n));
  std::vector<Future<>> last_copy(stages.size());  // per stage, the last copy into it
  std::vector<Future<>> done;
  auto step = [&](Future<> f) -> absl::Status {
    if (!async) return f.Await();
    return f.IsReady() ? f.AwaitStatus() : absl::OkStatus();
  };
  for (size_t b = 0; b < inputs.size(); ++b) {
    Stage& first = stages[0];
    Future<> f = first.acc->Upload(first.in, inputs[b].data(), bytes);
    RETURN_IF_ERROR(step(f));
    for (size_t s = 0; s < stages.size(); ++s) {
      Stage& st = stages[s];
      if (s > 0) {
        f = st.acc->Submit(st.copy_in, {f});
        last_copy[s] = f;
        RETURN_IF_ERROR(step(f));
      }
      // The next stage must have copied the previous batch out of this
      // stage's output before it is overwritten.
      std::vector<Future<>> waits;
      if (s + 1 < stages.size() && last_copy[s + 1].valid()) waits.push_back(last_copy[s + 1]);
      f = st.acc->Submit(st.compute, waits);
      RETURN_IF_ERROR(step(f));
    }
    Stage& last = stages.back();
    f = last.acc->Download(last.out, outputs[b].data(), bytes);
    RETURN_IF_ERROR(step(f));
    done.push_back(f);
  }
  for (auto& f : done) RETURN_IF_ERROR(f.Await());
  return outputs;
}

}  // namespace

int DemoCommand(const std::vector<std::string>& args) {
  auto specs = RuntimeFlagSpecs();
  specs.push_back({"size", "matrix size n (each stage multiplies n x n by n x n)", "256"});
  specs.push_back({"batches", "batches flowing through the pipeline", "8"});
  specs.push_back({"repeats", "timed runs of each mode (the median is reported)", "5"});
  Flags flags(specs);
  auto fail = [](const absl::Status& s, int code) {
    std::fprintf(stderr, "causeway demo: %s\n", std::string(s.message()).c_str());
    return code;
  };
  if (absl::Status s = flags.Parse(args); !s.ok()) return fail(s, 2);
  if (flags.Bool("help")) {
    std::printf("usage: causeway demo [flags]\n\nA chain of matmuls, one stage per accelerator, checked against "
                "a CPU reference and timed\nin asynchronous and sequential dispatch.\n\n%s",
                flags.Help().c_str());
    return 0;
  }
  auto options = RuntimeOptionsFromFlags(flags);
  if (!options.ok()) return fail(options.status(), 2);
  if (!flags.Has("accelerators") && std::getenv("CAUSEWAY_ACCELERATORS") == nullptr) options->accelerators = 4;
  auto n64 = flags.Int("size");
  auto batches64 = flags.Int("batches");
  auto repeats64 = flags.Int("repeats");
  if (!n64.ok()) return fail(n64.status(), 2);
  if (!batches64.ok()) return fail(batches64.status(), 2);
  if (!repeats64.ok()) return fail(repeats64.status(), 2);
  if (*n64 < 1 || *n64 > 4096 || *batches64 < 1 || *batches64 > 1024 || *repeats64 < 1 || *repeats64 > 100) {
    return fail(absl::InvalidArgumentError("--size must be 1..4096, --batches 1..1024, --repeats 1..100"), 2);
  }
  uint32_t n = static_cast<uint32_t>(*n64);
  int batches = static_cast<int>(*batches64), repeats = static_cast<int>(*repeats64);

  auto rt_or = Runtime::Create(*options);
  if (!rt_or.ok()) return fail(rt_or.status(), 1);
  Runtime& rt = **rt_or;
  std::printf("causeway demo: %zu accelerators on %s (%s copies), %d batches of %ux%u through a matmul "
              "per accelerator\n",
              rt.size(), rt.plan().device->name.c_str(), CopyPathName(rt.plan().copy_path), batches, n, n);

  // Weights scaled so that values stay near 1 through the chain.
  float scale = 1.0f / std::sqrt(static_cast<float>(n));
  std::vector<std::vector<float>> weights;
  std::vector<Stage> stages;
  size_t bytes = size_t{n} * n * 4;
  absl::Status status;
  for (size_t s = 0; s < rt.size() && status.ok(); ++s) {
    Stage st;
    st.acc = rt.accelerator(s);
    weights.push_back(reference::RandomFloats(size_t{n} * n, 100 + s, -scale * 1.7f, scale * 1.7f));
    auto in = st.acc->CreateBuffer(bytes);
    auto w = st.acc->CreateBuffer(bytes);
    auto out = st.acc->CreateBuffer(bytes);
    if (!in.ok() || !w.ok() || !out.ok()) {
      status = !in.ok() ? in.status() : !w.ok() ? w.status() : out.status();
      break;
    }
    st.in = *in;
    st.weight = *w;
    st.out = *out;
    status = st.acc->UploadSync(st.weight, weights.back().data(), bytes);
    if (!status.ok()) break;
    auto compute = st.acc->CreateCommandList(absl::StrCat("stage", s));
    if (!compute.ok()) return fail(compute.status(), 1);
    st.compute = *compute;
    status = ops::Matmul(*st.compute, st.in, st.weight, st.out, n, n, n);
    if (!status.ok()) break;
    if (s > 0) {
      auto copy = st.acc->CreateCommandList(absl::StrCat("copy-into-stage", s));
      if (!copy.ok()) return fail(copy.status(), 1);
      st.copy_in = *copy;
      status = st.copy_in->Copy(stages.back().out, st.in);
    }
    stages.push_back(std::move(st));
  }
  if (!status.ok()) return fail(status, 1);

  std::vector<std::vector<float>> inputs;
  for (int b = 0; b < batches; ++b) inputs.push_back(reference::RandomFloats(size_t{n} * n, 7 + b));

  // Check: the asynchronous run against the CPU reference.
  auto outputs = RunPipeline(stages, inputs, n, /*async=*/true);
  if (!outputs.ok()) return fail(outputs.status(), 1);
  double max_err = 0;
  for (int b = 0; b < batches; ++b) {
    std::vector<float> x = inputs[b];
    for (size_t s = 0; s < stages.size(); ++s) x = reference::Matmul(x, weights[s], n, n, n);
    max_err = std::max(max_err, reference::MaxRelativeError((*outputs)[b], x));
  }
  bool ok = max_err < 1e-3;
  std::printf("check: max relative error %.3g against the CPU reference: %s\n", max_err, ok ? "PASS" : "FAIL");

  // Timing: median of `repeats` runs of each mode.
  double flops = 2.0 * n * n * n * stages.size() * batches;
  double ms[2];
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      absl::Time t0 = absl::Now();
      auto run = RunPipeline(stages, inputs, n, mode == 0);
      if (!run.ok()) return fail(run.status(), 1);
      times.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
    std::sort(times.begin(), times.end());
    ms[mode] = times[times.size() / 2];
    std::printf("%-12s %8.2f ms per run (median of %d), %6.2f GFLOP/s\n",
                mode == 0 ? "asynchronous" : "sequential", ms[mode], repeats, flops / (ms[mode] * 1e6));
  }
  std::printf("asynchronous dispatch is %.2fx sequential\n", ms[1] / ms[0]);
  for (size_t s = 0; s < rt.size(); ++s) {
    Accelerator* a = rt.accelerator(s);
    std::printf("  %s: %s of %s budget in use, %llu submissions\n", a->name().c_str(),
                FormatBytes(a->memory_in_use()).c_str(), FormatBytes(a->memory_budget()).c_str(),
                static_cast<unsigned long long>(a->submitted_value()));
  }
  return ok ? 0 : 1;
}

}  // namespace causeway::cli
