// The scheduler's dispatch paths with tiny kernels, so that what is measured
// is the cost of getting work onto the accelerators, not the work itself.
//
//   dispatch:  Pathways' dispatch microbenchmark (paper section 5.1, Figure 5).
//              A computation is a scalar all-reduce over a mesh of n
//              accelerators (the direct collective: each device reads every
//              peer's value and reduces them) plus a scalar add; each
//              computation's output is the next one's input. The reduction is
//              a max, so values stay exact (x + 0.5 per computation); the
//              scalar is 4 floats.
//                OpByOp:  one program per computation, each run awaited
//                         before the next starts (the client in the loop).
//                Chained: one program of 128 chained computations, one run.
//                Fused:   the baseline, without Causeway: Chained's device
//                         commands (per computation and accelerator, n - 1
//                         peer copies, n - 1 combines and an add) recorded in
//                         one list per accelerator and replayed (FusedLists):
//                         what a compiler fusing the whole loop, exchange
//                         included, would run, with no scheduling and no
//                         wait between accelerators. Chained / Fused is the
//                         cost of dispatch at equal work; commands per second
//                         are reported beside computations per second.
//                Fused-adds: one program of one gang call on one accelerator
//                         whose function holds the 128 computations' n adds
//                         each, with no copies (informative: less work than
//                         Chained does).
//   pipeline:  S stages (1..8), each on its own accelerator, each scaling 64
//              floats by 2, with a transfer between stages. Causeway: one
//              program on an island dispatching asynchronously. The baseline,
//              hand-written: the same commands (per stage a copy from the
//              previous accelerator and the scale), recorded once per stage
//              and instance and submitted with Accelerator::Submit, each
//              waiting on the previous stage's future: what an expert writes
//              on the runtime without a scheduler. Beside it, op-by-op: one
//              program per stage, each executed with the previous stage's
//              output array without waiting (the host prepares each step in
//              turn, the devices never wait for it: eager asynchronous
//              dispatch, Pathways' sequential dispatch); and synchronous: the
//              program on an island that awaits every gang call before the
//              next (DispatchMode::kSynchronous, informative: a weak
//              baseline). runs_in_flight = 8 throughout. Latency: one run at
//              a time; streamed: up to 16 runs in flight.
//   tenancy:   1, 2, 4 and 8 clients, each on its own thread, submitting small
//              programs (3 chained scales on a mesh of both accelerators of a
//              2-accelerator island) as fast as backpressure lets them; the
//              aggregate programs per second (the total work of a sample is the
//              same for every client count), and the process's CPU time and
//              context switches (all threads, lavapipe's included) per program,
//              averaged over the samples. Each client keeps 5 runs in flight
//              and its executable 2 (runs_in_flight), so N clients have N
//              times one client's window: the baseline of N clients is one
//              client given their window together (5N runs, on an island of
//              2N runs in flight per executable), in the same alternation;
//              the plain 1-client figure stays beside it.
//   shares:    the weighted policy's precision: four clients of weights
//              1:2:4:8 on one accelerator, each fed back to back by a thread
//              of its own with one-call programs of a rows x 128 by 128 x 128
//              matmul, calls of equal cost (128 rows each) and of unequal cost
//              (256, 128, 128, 64 rows: the lightest weight runs the longest
//              calls). A sample measures each client's device time (the
//              scheduler's own timestamps of every submission) over a window;
//              the figure is the largest relative deviation of a client's
//              share from its weight's share, in percent. The unit tests
//              assert the policy with a wide margin; this is its precision.
//
// Configurations of a table alternate sample by sample (the order rotates),
// `--samples` samples each; medians are printed, and the ratios of medians taken
// in the same run. A sample lasts about sample_seconds: its size is set from
// the rate seen in a warm-up. Every sample's result is downloaded and checked
// (outside the timed part); a wrong value aborts the benchmark.
//
//   causeway_scheduler_bench [--only=dispatch|pipeline|tenancy|shares] [--samples=9] [--quick] [--json=FILE]
// --quick: 1 sample of about 10 ms per figure (seconds, for tests); --json:
// the figures as a list of results (bench_report.h).
// For steadier figures on a small machine: LP_NUM_THREADS=0 taskset -c 0.
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "benchmarks/bench_main.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/kernels/ops.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"

namespace causeway {
namespace {

using bench::Alternate;
using bench::Die;
using bench::Median;
using bench::Must;

double sample_seconds = 0.1;  // the length of one timed sample (--quick: 0.01)
constexpr int kChain = 128;             // computations in a Chained or Fused program
constexpr uint32_t kScalar = 4;         // a scalar, padded to 4 floats
constexpr uint32_t kStageFloats = 64;   // per pipeline stage
constexpr int kMaxAccelerators = 8;
constexpr uint32_t kTenantFloats = 128;  // per tenant program (64 per accelerator)
constexpr int kTenantClients[] = {1, 2, 4, 8};
constexpr int kTenantWindow = 5;  // runs a tenant keeps in flight

double Seconds(int64_t t0) { return (Tracer::NowNs() - t0) / 1e9; }

// How many items (a multiple of `unit`, at least one unit) take about
// sample_seconds at `per_second`.
int SampleSize(double per_second, int unit) {
  int units = static_cast<int>(per_second * sample_seconds / unit);
  return unit * std::clamp(units, 1, 1 << 20);
}

// CPU time and context switches of the whole process (every thread).
struct Usage {
  double cpu_seconds = 0;
  double switches = 0;
};
Usage ProcessUsage() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6,
          static_cast<double>(u.ru_nvcsw + u.ru_nivcsw)};
}

ArrayRef MakeArray(Client& client, const std::shared_ptr<Mesh>& mesh, const std::vector<float>& host,
                   Sharding sharding, const std::string& label) {
  ArrayRef a =
      Must(client.CreateArray(mesh, {static_cast<int64_t>(host.size())}, DType::kF32, sharding, label),
           "CreateArray");
  CHECK_OK(a->Upload(host.data(), host.size() * sizeof(float)));
  return a;
}

// Downloads `a` and aborts unless it equals `want` exactly (every value in
// these benchmarks is a small multiple of 0.5, exact in f32).
void ExpectEquals(const ArrayRef& a, const std::vector<float>& want, const std::string& what) {
  std::vector<float> got(want.size());
  CHECK_OK(a->Download(got.data(), got.size() * sizeof(float)));
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      Die(absl::StrCat(what, ": element ", i, " is ", got[i], ", expected ", want[i]));
    }
  }
}

std::unique_ptr<Runtime> MakeRuntime(int accelerators) {
  RuntimeOptions options;
  options.accelerators = accelerators;
  options.device = EnvString("CAUSEWAY_DEVICE").empty() ? "cpu" : "";
  return Must(Runtime::Create(options), "Runtime::Create");
}

// --- dispatch: Pathways Figure 5 ------------------------------------------

// One mesh count of the dispatch benchmark: a client with a mesh of n
// accelerators and the three executables.
class Reduction {
 public:
  Reduction(Island& island, int n) : n_(n) {
    client_ = Must(island.Connect(absl::StrCat("reduce", n)), "Connect");
    mesh_ = Must(client_->AllocateMesh({n}), "AllocateMesh");
    single_ = Must(client_->AllocateMesh({1}), "AllocateMesh");
    add_ = Must(Function::Elementwise("add", {kScalar}), "add");
    b_ = MakeArray(*client_, mesh_, std::vector<float>(kScalar, kStep), Sharding::Replicated(), "b");
    fused_b_ = MakeArray(*client_, single_, std::vector<float>(kScalar, kStep), Sharding::Replicated(), "fb");
    zero_ = MakeArray(*client_, single_, std::vector<float>(kScalar, 0.0f), Sharding::Replicated(), "zero");
    op_by_op_ = Load(ChainProgram(1));
    chained_ = Load(ChainProgram(kChain));
    fused_ = Load(FusedProgram());
  }
  ~Reduction() { client_->Close(); }

  // Each runs about `target` computations from x = 1 and checks the result;
  // returns computations per second.
  double OpByOp(int target) { return Time(op_by_op_, 1, target, mesh_, {b_}, "OpByOp"); }
  double Chained(int target) { return Time(chained_, kChain, target, mesh_, {b_}, "Chained"); }
  double Fused(int target) { return Time(fused_, kChain, target, single_, {fused_b_, zero_}, "Fused"); }

 private:
  static constexpr float kStep = 0.5f;

  std::shared_ptr<Executable> Load(absl::StatusOr<std::shared_ptr<const Program>> program) {
    return Must(client_->Load(Must(std::move(program), "Build")), "Load");
  }

  // `count` chained computations: y_k = all-reduce max(x_k), x_{k+1} = y_k + b.
  absl::StatusOr<std::shared_ptr<const Program>> ChainProgram(int count) {
    ProgramBuilder b(absl::StrCat("reduce", n_, "x", count));
    b.Parameter("x0", mesh_, {kScalar}, DType::kF32);
    b.Parameter("b", mesh_, {kScalar}, DType::kF32);
    for (int k = 0; k < count; ++k) {
      b.AllReduce(absl::StrCat("r", k), mesh_, absl::StrCat("x", k), absl::StrCat("y", k), ReduceOp::kMax,
                  CollectiveAlgorithm::kDirect);
      b.Call(absl::StrCat("a", k), add_, mesh_, {absl::StrCat("y", k), "b"}, {absl::StrCat("x", k + 1)});
    }
    b.Output(absl::StrCat("x", count));
    return b.Build();
  }

  // One call of one function holding all kChain computations' n adds each:
  // x = x + 0 (n - 1 times, standing for the reductions), then x = x + b.
  absl::StatusOr<std::shared_ptr<const Program>> FusedProgram() {
    CAUSEWAY_ASSIGN_OR_RETURN(auto add, BuiltinKernel("add"));
    CountParams count{kScalar};
    std::vector<uint8_t> push(sizeof(count));
    std::memcpy(push.data(), &count, sizeof(count));
    // Buffers: x, b, zero, then the output and a scratch to alternate with
    // (a kernel never reads and writes one buffer).
    const int out = 3, tmp = 4;
    std::vector<KernelStep> steps;
    int cur = 0, kernels = kChain * n_;
    for (int i = 0; i < kernels; ++i) {
      int dst = (kernels - 1 - i) % 2 == 0 ? out : tmp;
      int operand = i % n_ == n_ - 1 ? 1 : 2;
      steps.push_back({add, {cur, operand, dst}, push, Groups1D(kScalar, 256), {}});
      cur = dst;
    }
    TensorSpec t{{kScalar}, DType::kF32};
    CAUSEWAY_ASSIGN_OR_RETURN(auto fused, Function::Create(absl::StrCat("reduce", n_, "_fused", kChain),
                                                           {t, t, t}, {t}, {t}, std::move(steps)));
    ProgramBuilder b(absl::StrCat("reduce", n_, "fused"));
    b.Parameter("x", single_, {kScalar}, DType::kF32);
    b.Parameter("fb", single_, {kScalar}, DType::kF32);
    b.Parameter("zero", single_, {kScalar}, DType::kF32);
    b.Call("fused", fused, single_, {"x", "fb", "zero"}, {"y"});
    b.Output("y");
    return b.Build();
  }

  // Runs `exe` (of `per_run` computations) back to back, each run's output
  // the next one's input, until at least `target` computations are done.
  double Time(const std::shared_ptr<Executable>& exe, int per_run, int target, const std::shared_ptr<Mesh>& mesh,
              const std::vector<ArrayRef>& consts, const char* mode) {
    ArrayRef x = MakeArray(*client_, mesh, std::vector<float>(kScalar, 1.0f), Sharding::Replicated(), "x0");
    CHECK_OK(x->Await());
    std::vector<ArrayRef> inputs = {x};
    inputs.insert(inputs.end(), consts.begin(), consts.end());
    int runs = std::max(1, target / per_run);
    int64_t t0 = Tracer::NowNs();
    for (int r = 0; r < runs; ++r) {
      Execution run = Must(client_->Execute(exe, inputs), "Execute");
      CHECK_OK(run.Await());
      inputs[0] = run.outputs[0];
    }
    double seconds = Seconds(t0);
    int computations = runs * per_run;
    ExpectEquals(inputs[0], std::vector<float>(kScalar, 1.0f + computations * kStep),
                 absl::StrCat(mode, " on ", n_, " accelerators after ", computations, " computations"));
    return computations / seconds;
  }

  int n_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Mesh> mesh_, single_;
  std::shared_ptr<const Function> add_;
  ArrayRef b_, fused_b_, zero_;
  std::shared_ptr<Executable> op_by_op_, chained_, fused_;
};

// Chained's device commands without Causeway: per accelerator d of n, one
// list holding all kChain computations' commands as the direct all-reduce
// and the add lower them (per computation: n - 1 copies of a peer's scalar
// into a receive buffer, n - 1 max-combines and one add; for n = 1 the
// all-reduce is one local copy), replayed back to back. The copies read a
// buffer that each peer never writes (zeros; max(x, 0) = x for these
// values), so the lists need no wait between accelerators and every
// accelerator computes the same chain; each list maps its x buffer back into
// itself (+kChain * kStep), so replays chain. What a compiler that fused the
// whole loop, exchange included, into one list per accelerator would run: the
// bound Chained approaches with the same work.
class FusedLists {
 public:
  FusedLists(Runtime& rt, int n) : n_(n) {
    auto add = Must(BuiltinKernel("add"), "add kernel");
    const uint64_t bytes = kScalar * sizeof(float);
    std::vector<std::shared_ptr<Buffer>> zeros;
    for (int d = 0; d < n; ++d) {
      Accelerator* acc = rt.accelerator(d);
      accelerators_.push_back(acc);
      zeros.push_back(Filled(acc, bytes, 0.0f));
    }
    for (int d = 0; d < n; ++d) {
      Accelerator* acc = accelerators_[d];
      // x and its partner alternate as a computation's input and output;
      // partials alternate between w1 and w2.
      auto x = Filled(acc, bytes, 1.0f), other = Filled(acc, bytes, 0.0f), w1 = Filled(acc, bytes, 0.0f),
           w2 = Filled(acc, bytes, 0.0f), b = Filled(acc, bytes, kStep),
           recv = Filled(acc, bytes * std::max(1, n - 1), 0.0f);
      auto list = Must(acc->CreateCommandList(absl::StrCat("fused", n, "-", d)), "CreateCommandList");
      std::shared_ptr<Buffer> cur = x, next = other;
      for (int k = 0; k < kChain; ++k) {
        std::shared_ptr<Buffer> partial = w1;
        if (n == 1) {
          CHECK_OK(list->Copy(cur, w1));
        } else {
          int slot = 0;
          for (int e = 0; e < n; ++e) {
            if (e == d) continue;
            CHECK_OK(list->Copy(zeros[e], BufferArg(recv, slot++ * bytes, bytes)));
          }
          std::shared_ptr<Buffer> a = cur;
          for (int k2 = 1; k2 < n; ++k2) {
            partial = k2 % 2 == 1 ? w1 : w2;
            CHECK_OK(ops::Combine(*list, /*max=*/true, /*i32=*/false, {a, 0},
                                  {recv, uint64_t(k2 - 1) * kScalar}, {partial, 0}, kScalar));
            a = partial;
          }
        }
        CHECK_OK(list->Dispatch(add, {partial, b, next}, CountParams{kScalar}, Groups1D(kScalar, 256)));
        std::swap(cur, next);
      }
      if (cur != x) Die("fused lists: an odd chain does not end in x");
      commands_ += list->size();
      lists_.push_back(std::move(list));
      x_.push_back(x);
    }
  }

  // Replays every accelerator's list until at least `target` computations
  // are done; checks every accelerator's x; computations per second.
  double Time(int target) {
    const int replays = std::max(1, target / kChain);
    std::vector<Future<>> last(n_);
    int64_t t0 = Tracer::NowNs();
    for (int r = 0; r < replays; ++r) {
      for (int d = 0; d < n_; ++d) last[d] = accelerators_[d]->Submit(lists_[d]);
    }
    for (auto& f : last) CHECK_OK(f.Await());
    double seconds = Seconds(t0);
    done_ += replays * kChain;
    for (int d = 0; d < n_; ++d) {
      std::vector<float> got(kScalar);
      CHECK_OK(accelerators_[d]->DownloadSync(x_[d], got.data(), got.size() * sizeof(float)));
      if (got[0] != 1.0f + done_ * kStep) {
        Die(absl::StrCat("fused lists on ", n_, " accelerators: accelerator ", d, " holds ", got[0],
                         ", expected ", 1.0f + done_ * kStep));
      }
    }
    return replays * kChain / seconds;
  }

  // Device commands per computation, over all accelerators (as Chained's).
  double commands_per_computation() const { return static_cast<double>(commands_) / kChain; }

 private:
  static constexpr float kStep = 0.5f;

  static std::shared_ptr<Buffer> Filled(Accelerator* acc, uint64_t bytes, float value) {
    auto buffer = Must(acc->CreateBuffer(bytes), "CreateBuffer");
    std::vector<float> host(bytes / sizeof(float), value);
    CHECK_OK(acc->UploadSync(buffer, host.data(), bytes));
    return buffer;
  }

  int n_;
  int64_t done_ = 0;  // computations since x was 1
  size_t commands_ = 0;
  std::vector<Accelerator*> accelerators_;
  std::vector<std::shared_ptr<CommandList>> lists_;
  std::vector<std::shared_ptr<Buffer>> x_;
};

void DispatchTable(Runtime& rt, int runs, bench::Report& report) {
  auto island = Must(Island::Create(&rt, {}), "Island::Create");
  std::printf(
      "\n1. dispatch (Pathways Fig. 5): computations/s; a computation = scalar all-reduce over n "
      "accelerators + scalar add;\n   Chained and Fused run %d computations per program; "
      "Fused: Chained's device commands (cmds/comp, all accelerators)\n   in one list per accelerator, "
      "replayed; Fused-adds: n adds on one accelerator; median of %d samples\n",
      kChain, runs);
  std::printf("%4s %10s %10s %10s %10s %9s %9s %12s\n", "n", "OpByOp", "Chained", "Fused", "Fused-adds",
              "Ch/Fused", "Ch/OpBy", "cmds/comp");
  for (int n : {1, 2, 4, 8}) {
    Reduction red(*island, n);
    FusedLists fused_lists(rt, n);
    // Warm-up (instances, pipelines, recordings), then sizes for ~equal time.
    red.OpByOp(8);
    red.Chained(kChain);
    red.Fused(kChain);
    fused_lists.Time(kChain);
    const int op = SampleSize(red.OpByOp(16), 1), chained = SampleSize(red.Chained(kChain), kChain),
              fused = SampleSize(fused_lists.Time(kChain), kChain),
              adds = SampleSize(red.Fused(kChain), kChain);
    auto samples =
        Alternate(runs, {[&] { return red.OpByOp(op); }, [&] { return red.Chained(chained); },
                         [&] { return fused_lists.Time(fused); }, [&] { return red.Fused(adds); }});
    const double o = Median(samples[0]), c = Median(samples[1]), f = Median(samples[2]),
                 a = Median(samples[3]);
    const double commands = fused_lists.commands_per_computation();
    std::printf("%4d %10.0f %10.0f %10.0f %10.0f %9.2f %9.2f %12.0f\n", n, o, c, f, a, c / f, c / o,
                commands);
    for (auto [mode, value, per_program] : {std::tuple("OpByOp", o, 1), std::tuple("Chained", c, kChain)}) {
      report.Add("dispatch", absl::StrCat(mode, " n=", n), "computations/s")
          .Value(value)
          .Baseline("Fused lists", f)
          .Samples(runs)
          .Param("mode", mode)
          .Param("accelerators", n)
          .Param("computations_per_program", per_program)
          .Param("commands_per_computation", commands)
          .Extra("commands_per_s", value * commands)
          .Extra("fused_lists_commands_per_s", f * commands)
          .Extra("fused_adds_computations_per_s", a);
    }
    std::fflush(stdout);
  }
}

// --- pipeline: Causeway against hand-written and op-by-op dispatch --------

constexpr int kPipelineWindow = 16;  // runs a streamed sample keeps in flight

// Seconds per run of `count` runs of `submit` (which starts run r and returns
// what to await for it): each awaited before the next starts, or (`streamed`)
// up to kPipelineWindow in flight, the oldest awaited first.
template <typename Submit>
double TimeRuns(int count, bool streamed, Submit submit) {
  std::deque<std::function<void()>> awaits;
  int64_t t0 = Tracer::NowNs();
  for (int r = 0; r < count; ++r) {
    awaits.push_back(submit(r));
    if (!streamed || static_cast<int>(awaits.size()) > kPipelineWindow) {
      awaits.front()();
      awaits.pop_front();
    }
  }
  for (auto& await : awaits) await();
  return Seconds(t0) / count;
}

// A client of `island` with an S-stage pipeline: one program of S gang calls
// (Causeway's dispatch), or (`op_by_op`) one program per stage, each run's
// stages executed one after another with the previous stage's output array
// and no wait for the devices: the host prepares each step in turn but never
// waits for a device to enqueue the next (eager asynchronous dispatch, as JAX
// runs op by op; Pathways' sequential dispatch).
class Pipeline {
 public:
  Pipeline(Island& island, int stages, bool op_by_op) : stages_(stages), op_by_op_(op_by_op) {
    client_ = Must(island.Connect(absl::StrCat(op_by_op ? "op-by-op" : "pipeline", stages)), "Connect");
    auto scale = Must(Function::Scale({kStageFloats}, 2.0f), "Scale");
    std::vector<std::shared_ptr<Mesh>> meshes;
    for (int s = 0; s < stages; ++s) meshes.push_back(Must(client_->AllocateMesh({1}), "AllocateMesh"));
    if (op_by_op) {
      for (int s = 0; s < stages; ++s) {
        ProgramBuilder b(absl::StrCat("stage", s));
        b.Parameter("in", meshes[std::max(0, s - 1)], {kStageFloats}, DType::kF32);
        b.Call("scale", scale, meshes[s], {"in"}, {"out"});
        b.Output("out");
        exes_.push_back(Must(client_->Load(Must(b.Build(), "Build")), "Load"));
      }
    } else {
      ProgramBuilder b(absl::StrCat("pipeline", stages));
      b.Parameter("y0", meshes[0], {kStageFloats}, DType::kF32);
      for (int s = 0; s < stages; ++s) {
        b.Call(absl::StrCat("stage", s), scale, meshes[s], {absl::StrCat("y", s)},
               {absl::StrCat("y", s + 1)});
      }
      b.Output(absl::StrCat("y", stages));
      exes_.push_back(Must(client_->Load(Must(b.Build(), "Build")), "Load"));
    }
    std::vector<float> x(kStageFloats);
    for (uint32_t i = 0; i < kStageFloats; ++i) x[i] = static_cast<float>(i);
    x_ = MakeArray(*client_, meshes[0], x, Sharding::Replicated(), "y0");
    for (float& v : x) v = std::ldexp(v, stages);
    want_ = x;
  }
  ~Pipeline() { client_->Close(); }

  double Time(int count, bool streamed) {
    ArrayRef last;
    double seconds = TimeRuns(count, streamed, [&](int) {
      ArrayRef a = x_;
      std::vector<Execution> runs;
      for (const auto& exe : exes_) {
        runs.push_back(Must(client_->Execute(exe, {a}), "Execute"));
        a = runs.back().outputs[0];
      }
      last = a;
      return std::function<void()>([runs = std::move(runs)] {
        for (const Execution& run : runs) CHECK_OK(run.Await());
      });
    });
    ExpectEquals(last, want_, absl::StrCat(stages_, "-stage ", op_by_op_ ? "op-by-op " : "", "pipeline"));
    return seconds;
  }

 private:
  int stages_;
  bool op_by_op_;
  std::shared_ptr<Client> client_;
  std::vector<std::shared_ptr<Executable>> exes_;
  ArrayRef x_;
  std::vector<float> want_;
};

// The baseline, without Causeway's scheduler: the pipeline written by hand on
// the accelerators. Per stage and instance one command list, recorded once
// (stage s > 0 copies the previous stage's output from accelerator s - 1,
// then scales it: the commands Causeway's gang calls hold) and replayed with
// Accelerator::Submit, whose waits are the previous stage's future and, when
// an instance is reused, the future of the last reader of its output. Runs
// cycle through kMaxAccelerators instances (Causeway's runs_in_flight here).
class HandPipeline {
 public:
  HandPipeline(Runtime& rt, int stages) : stages_(stages) {
    const uint64_t bytes = kStageFloats * sizeof(float);
    std::vector<float> x(kStageFloats);
    for (uint32_t i = 0; i < kStageFloats; ++i) x[i] = static_cast<float>(i);
    x_ = Must(rt.accelerator(0)->CreateBuffer(bytes), "CreateBuffer");
    CHECK_OK(rt.accelerator(0)->UploadSync(x_, x.data(), bytes));
    for (float& v : x) v = std::ldexp(v, stages);
    want_ = x;
    for (int i = 0; i < kInstances; ++i) {
      std::vector<std::shared_ptr<Buffer>> in(stages), out(stages);
      for (int s = 0; s < stages; ++s) {
        Accelerator* acc = rt.accelerator(s);
        out[s] = Must(acc->CreateBuffer(bytes), "CreateBuffer");
        in[s] = s == 0 ? x_ : Must(acc->CreateBuffer(bytes), "CreateBuffer");
        auto list =
            Must(acc->CreateCommandList(absl::StrCat("hand", stages, "-", i, "-", s)), "CreateCommandList");
        if (s > 0) CHECK_OK(list->Copy(out[s - 1], in[s]));
        CHECK_OK(ops::Scale(*list, in[s], out[s], kStageFloats, 2.0f));
        lists_[i].push_back(std::move(list));
        accelerators_.push_back(acc);
      }
      out_[i] = out[stages - 1];
      futures_[i].resize(stages);
    }
  }

  double Time(int count, bool streamed) {
    int last = 0;
    double seconds = TimeRuns(count, streamed, [&](int r) {
      const int i = r % kInstances;
      std::vector<Future<>>& f = futures_[i];
      for (int s = 0; s < stages_; ++s) {
        std::vector<Future<>> waits;
        if (s > 0) waits.push_back(f[s - 1]);  // this run's previous stage
        // The instance's last run: its next stage still reads out[s].
        if (s + 1 < stages_ && f[s + 1].valid()) waits.push_back(f[s + 1]);
        f[s] = accelerators_[s]->Submit(lists_[i][s], waits);
      }
      last = i;
      return std::function<void()>([done = f[stages_ - 1]] { CHECK_OK(done.Await()); });
    });
    std::vector<float> got(kStageFloats);
    CHECK_OK(accelerators_[stages_ - 1]->DownloadSync(out_[last], got.data(), got.size() * sizeof(float)));
    for (uint32_t e = 0; e < kStageFloats; ++e) {
      if (got[e] != want_[e]) {
        Die(absl::StrCat(stages_, "-stage hand-written pipeline: element ", e, " is ", got[e], ", expected ",
                         want_[e]));
      }
    }
    return seconds;
  }

 private:
  static constexpr int kInstances = kMaxAccelerators;
  int stages_;
  std::shared_ptr<Buffer> x_;
  std::vector<float> want_;
  std::vector<Accelerator*> accelerators_;  // by stage
  std::vector<std::shared_ptr<CommandList>> lists_[kInstances];
  std::shared_ptr<Buffer> out_[kInstances];
  std::vector<Future<>> futures_[kInstances];  // the instance's last run, by stage
};

void PipelineTable(Runtime& rt, int runs, bench::Report& report) {
  IslandOptions async_options, synchronous_options;
  async_options.name = "async";
  synchronous_options.name = "synchronous";
  synchronous_options.dispatch = DispatchMode::kSynchronous;
  // Enough instances for a run in every stage at once when streamed.
  async_options.runs_in_flight = synchronous_options.runs_in_flight = kMaxAccelerators;
  auto async_island = Must(Island::Create(&rt, async_options), "Island::Create");
  auto synchronous_island = Must(Island::Create(&rt, synchronous_options), "Island::Create");
  std::printf(
      "\n2. pipeline: S stages (scale %u floats on accelerator s, then a transfer to the next); "
      "us per run, median of %d samples;\n   latency: one run at a time; streamed: up to %d runs in flight.\n"
      "   Causeway: one program; hand: the same commands submitted by hand (Accelerator::Submit chained\n"
      "   by futures); op-by-op: a program per stage, enqueued without waiting; sync: Causeway awaiting\n"
      "   every gang call (informative)\n",
      kStageFloats, runs, kPipelineWindow);
  std::printf("%6s %8s | %9s %9s %9s %9s | %10s %10s %8s\n", "stages", "mode", "Causeway", "hand", "op-by-op",
              "sync", "hand/Cw", "op-by-op/Cw", "sync/Cw");
  for (int stages = 1; stages <= kMaxAccelerators; ++stages) {
    Pipeline causeway_pipe(*async_island, stages, false), op_by_op_pipe(*async_island, stages, true),
        synchronous_pipe(*synchronous_island, stages, false);
    HandPipeline hand_pipe(rt, stages);
    for (int streamed : {0, 1}) {
      std::vector<std::function<double(int, bool)>> ways = {
          [&](int c, bool st) { return causeway_pipe.Time(c, st); },
          [&](int c, bool st) { return hand_pipe.Time(c, st); },
          [&](int c, bool st) { return op_by_op_pipe.Time(c, st); },
          [&](int c, bool st) { return synchronous_pipe.Time(c, st); }};
      std::vector<std::function<double()>> timed;
      for (auto& way : ways) {
        way(4, streamed);  // warm-up
        int count = SampleSize(1 / way(8, streamed), 1);
        timed.push_back([&way, count, streamed] { return way(count, streamed); });
      }
      auto samples = Alternate(runs, timed);
      std::vector<double> us;
      for (auto& s : samples) us.push_back(Median(s) * 1e6);
      const char* mode = streamed ? "streamed" : "latency";
      // Ratios of runs per second: Causeway's over the other's.
      std::printf("%6d %8s | %9.1f %9.1f %9.1f %9.1f | %10.2f %10.2f %8.2f\n", stages, mode, us[0], us[1],
                  us[2], us[3], us[1] / us[0], us[2] / us[0], us[3] / us[0]);
      report.Add("pipeline", absl::StrCat(mode, " ", stages, stages == 1 ? " stage" : " stages"), "runs/s")
          .Value(1e6 / us[0])
          .Baseline("hand-written async chain", 1e6 / us[1])
          .Extra("op_by_op_runs_per_s", 1e6 / us[2])
          .Extra("synchronous_runs_per_s", 1e6 / us[3])
          .Samples(runs)
          .Param("mode", mode)
          .Param("stages", stages)
          .Param("floats_per_stage", kStageFloats)
          .Param("runs_in_flight", streamed ? kPipelineWindow : 1);
      std::fflush(stdout);
    }
  }
}

// --- tenancy: many clients on one island -----------------------------------

class Tenant {
 public:
  // Keeps up to `window` runs in flight (the island's runs_in_flight bounds
  // how many of them have instances at once).
  Tenant(Island& island, int id, int window = kTenantWindow) : id_(id), window_(window) {
    client_ = Must(island.Connect(absl::StrCat("tenant", id)), "Connect");
    auto mesh = Must(client_->AllocateMesh({static_cast<int>(island.runtime().size())}), "AllocateMesh");
    Shape shard = {kTenantFloats / mesh->size()};
    auto scale = Must(Function::Scale(shard, 2.0f), "Scale");
    ProgramBuilder b(absl::StrCat("tenant", id));
    b.Parameter("x", mesh, {kTenantFloats}, DType::kF32, Sharding::Split(0));
    b.Call("a", scale, mesh, {"x"}, {"y1"});
    b.Call("b", scale, mesh, {"y1"}, {"y2"});
    b.Call("c", scale, mesh, {"y2"}, {"y3"});
    b.Output("y3");
    exe_ = Must(client_->Load(Must(b.Build(), "Build")), "Load");
    std::vector<float> x(kTenantFloats);
    for (uint32_t i = 0; i < kTenantFloats; ++i) x[i] = static_cast<float>(i + id);
    x_ = MakeArray(*client_, mesh, x, Sharding::Split(0), "x");
    for (float& v : x) v *= 8;
    want_ = x;
  }
  ~Tenant() { client_->Close(); }

  // Submits `count` programs, keeping a few in flight; checks the last.
  void Run(int count) {
    std::deque<Execution> in_flight;
    for (int p = 0; p < count; ++p) {
      in_flight.push_back(Must(client_->Execute(exe_, {x_}), "Execute"));
      if (static_cast<int>(in_flight.size()) >= window_) {
        CHECK_OK(in_flight.front().Await());
        in_flight.pop_front();
      }
    }
    for (auto& run : in_flight) CHECK_OK(run.Await());
    ExpectEquals(in_flight.back().outputs[0], want_, absl::StrCat("tenant ", id_));
  }

 private:
  int id_;
  int window_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Executable> exe_;
  ArrayRef x_;
  std::vector<float> want_;
};

// Programs per second of `tenants` together, each on its own thread, running
// `total` programs in all; adds the process's usage to `usage`.
double RunTenants(std::vector<std::unique_ptr<Tenant>>& tenants, int total, Usage* usage = nullptr) {
  int each = total / static_cast<int>(tenants.size());
  absl::Notification start;
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (auto& t : tenants) {
    threads.emplace_back([&, tenant = t.get()] {
      ready.fetch_add(1);
      start.WaitForNotification();
      tenant->Run(each);
    });
  }
  while (ready.load() < static_cast<int>(tenants.size())) std::this_thread::yield();
  Usage u0 = ProcessUsage();
  int64_t t0 = Tracer::NowNs();
  start.Notify();
  for (auto& t : threads) t.join();
  double seconds = Seconds(t0);
  if (usage != nullptr) {
    Usage u1 = ProcessUsage();
    usage->cpu_seconds += u1.cpu_seconds - u0.cpu_seconds;
    usage->switches += u1.switches - u0.switches;
  }
  return each * tenants.size() / seconds;
}

void TenancyTable(int runs, bench::Report& report) {
  constexpr int kTenancyAccelerators = 2;
  auto rt = MakeRuntime(kTenancyAccelerators);
  IslandOptions options;
  auto island = Must(Island::Create(rt.get(), options), "Island::Create");
  constexpr int kUnit = 8;  // programs per sample: a multiple of every client count
  // groups[g]: kTenantClients[g] clients on `island`; wide[g]: one client
  // with their total window, on an island giving one executable as many
  // runs in flight as they have together (N clients have N executables).
  // The islands outlive their tenants (declared first, destroyed last).
  std::vector<std::unique_ptr<Island>> wide_islands;
  std::vector<std::vector<std::unique_ptr<Tenant>>> groups, wide;
  int id = 0, total = 0;
  for (int c : kTenantClients) {
    groups.emplace_back();
    for (int i = 0; i < c; ++i) groups.back().push_back(std::make_unique<Tenant>(*island, id++));
    RunTenants(groups.back(), 64);  // warm-up
    if (c == 1) total = SampleSize(RunTenants(groups.back(), 128), kUnit);
    wide.emplace_back();
    if (c == 1) continue;
    IslandOptions wide_options;
    wide_options.name = absl::StrCat("wide", c);
    wide_options.runs_in_flight = options.runs_in_flight * c;
    wide_islands.push_back(Must(Island::Create(rt.get(), wide_options), "Island::Create"));
    wide.back().push_back(std::make_unique<Tenant>(*wide_islands.back(), id++, kTenantWindow * c));
    RunTenants(wide.back(), 64);
  }
  std::printf(
      "\n3. tenancy: clients on their own threads, each submitting programs of 3 chained scales on a "
      "mesh of %d accelerators\n   (%d runs in flight per client, %d per executable); 1 client, same window: "
      "one client with N clients' windows together;\n   %d programs per sample in all; median of %d samples; "
      "cpu and context switches of the whole process\n",
      kTenancyAccelerators, kTenantWindow, options.runs_in_flight, total, runs);
  std::vector<Usage> usage(groups.size());
  std::vector<std::function<double()>> cases;
  for (size_t g = 0; g < groups.size(); ++g) {
    cases.push_back([&, g] { return RunTenants(groups[g], total, &usage[g]); });
  }
  for (size_t g = 1; g < wide.size(); ++g) cases.push_back([&, g] { return RunTenants(wide[g], total); });
  auto samples = Alternate(runs, cases);
  std::printf("%8s %12s %12s %14s %16s %14s %14s\n", "clients", "programs/s", "vs 1 client", "1 client, same",
              "vs 1, same window", "cpu us/program", "switches/prog");
  double one = Median(samples[0]);
  for (size_t g = 0; g < groups.size(); ++g) {
    const double m = Median(samples[g]);
    const double same = g == 0 ? one : Median(samples[groups.size() + g - 1]);
    const double programs = static_cast<double>(total) * runs;
    std::printf("%8d %12.0f %12.2f %14.0f %16.2f %14.1f %14.1f\n", kTenantClients[g], m, m / one, same,
                m / same, usage[g].cpu_seconds / programs * 1e6, usage[g].switches / programs);
    report
        .Add("tenancy", absl::StrCat(kTenantClients[g], kTenantClients[g] == 1 ? " client" : " clients"),
             "programs/s")
        .Value(m)
        .Baseline("1 client, same window", same)
        .Samples(runs)
        .Param("clients", kTenantClients[g])
        .Param("accelerators", kTenancyAccelerators)
        .Param("programs_per_sample", total)
        .Param("window", kTenantWindow * kTenantClients[g])
        .Extra("one_client_programs_per_s", one)
        .Extra("cpu_us_per_program", usage[g].cpu_seconds / programs * 1e6)
        .Extra("switches_per_program", usage[g].switches / programs);
  }
  std::fflush(stdout);
}

// --- shares: the weighted policy's precision ---------------------------------

constexpr double kShareWeights[] = {1, 2, 4, 8};
constexpr uint32_t kShareK = 128;  // 128 x 128 by 128 x 128: about 1 ms a call on lavapipe

// A client of weight `weight` with a one-call program of a rows x 128 by
// 128 x 128 matmul of ones by halves (every output is 64, exact in f32).
class Weighted {
 public:
  Weighted(Island& island, double weight, uint32_t rows) : rows_(rows) {
    client_ = Must(island.Connect(absl::StrCat("weight", weight, "-rows", rows), weight), "Connect");
    auto mesh = Must(client_->AllocateMesh({1}), "AllocateMesh");
    auto mm = Must(Function::Matmul(rows, kShareK, kShareK), "Matmul");
    ProgramBuilder b(absl::StrCat("share", weight, "x", rows));
    b.Parameter("x", mesh, {rows, kShareK}, DType::kF32);
    b.Parameter("w", mesh, {kShareK, kShareK}, DType::kF32);
    b.Call("mm", mm, mesh, {"x", "w"}, {"y"});
    b.Output("y");
    exe_ = Must(client_->Load(Must(b.Build(), "Build")), "Load");
    x_ = Upload(mesh, {rows, kShareK}, 1.0f);
    w_ = Upload(mesh, {kShareK, kShareK}, 0.5f);
  }
  ~Weighted() { client_->Close(); }

  ClientId id() const { return client_->id(); }
  // Submits runs back to back until `stop`; checks the last one's output.
  void Feed(const std::atomic<bool>& stop) {
    Execution last;
    while (!stop.load()) last = Must(client_->Execute(exe_, {x_, w_}), "Execute");
    CHECK_OK(last.Await());
    ExpectEquals(last.outputs[0], std::vector<float>(size_t{rows_} * kShareK, 0.5f * kShareK),
                 absl::StrCat(client_->name(), "'s matmul"));
  }

 private:
  ArrayRef Upload(const std::shared_ptr<Mesh>& mesh, Shape shape, float value) {
    ArrayRef a =
        Must(client_->CreateArray(mesh, shape, DType::kF32, Sharding::Replicated(), "in"), "CreateArray");
    std::vector<float> host(NumElements(shape), value);
    CHECK_OK(a->Upload(host.data(), host.size() * sizeof(float)));
    return a;
  }

  uint32_t rows_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Executable> exe_;
  ArrayRef x_, w_;
};

// One sample: every client fed for `warmup` + `window`; each client's share of
// the device time measured in the window. Returns the largest relative
// deviation from the weights' shares, in percent; adds the shares to `sum`.
double ShareSample(Island& island, std::vector<std::unique_ptr<Weighted>>& clients, double window,
                   std::vector<double>& sum) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (auto& c : clients) threads.emplace_back([&, c = c.get()] { c->Feed(stop); });
  absl::SleepFor(absl::Seconds(window / 4));  // every client's queue filled
  auto before = island.scheduler().DeviceTime();
  // Device time is counted as calls finish: on a loaded machine a short
  // window can close before the first one does, so it stretches until one has.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  double total = 0, weights = 0, worst = 0;
  std::vector<double> ns;
  do {
    absl::SleepFor(absl::Seconds(window));
    auto after = island.scheduler().DeviceTime();
    total = 0;
    ns.clear();
    for (size_t i = 0; i < clients.size(); ++i) {
      ns.push_back(static_cast<double>(after[clients[i]->id()] - before[clients[i]->id()]));
      total += ns.back();
    }
  } while (total <= 0 && absl::Now() < give_up);
  stop.store(true);
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < clients.size(); ++i) weights += kShareWeights[i];
  if (total <= 0) Die("shares: no gang call finished in 30 s");
  for (size_t i = 0; i < clients.size(); ++i) {
    const double share = ns[i] / total, target = kShareWeights[i] / weights;
    sum[i] += share;
    worst = std::max(worst, std::abs(share - target) / target * 100);
  }
  return worst;
}

void SharesTable(int runs, bench::Report& report) {
  auto rt = MakeRuntime(1);
  IslandOptions options;
  options.name = "weighted";
  options.policy = SchedulingPolicy::kWeighted;
  options.runs_in_flight = 8;
  auto island = Must(Island::Create(rt.get(), options), "Island::Create");
  const double window = sample_seconds * 10;  // 1 s (--quick: 0.1 s)
  std::printf(
      "\n4. shares: weights 1:2:4:8 on one accelerator, each client fed back to back with "
      "rows x %u by %u x %u matmuls;\n   each client's share of device time over %.1f s; "
      "median of %d samples\n",
      kShareK, kShareK, kShareK, window, runs);
  std::printf("%14s %26s %30s %14s\n", "calls", "rows per weight 1/2/4/8",
              "share % (target 6.7/13.3/26.7/53.3)", "max dev %");
  const std::vector<std::pair<const char*, std::vector<uint32_t>>> configs = {
      {"equal", {128, 128, 128, 128}}, {"unequal", {256, 128, 128, 64}}};
  for (const auto& [name, rows] : configs) {
    std::vector<std::unique_ptr<Weighted>> clients;
    for (size_t i = 0; i < rows.size(); ++i) {
      clients.push_back(std::make_unique<Weighted>(*island, kShareWeights[i], rows[i]));
    }
    std::vector<double> sum(clients.size(), 0), warm(clients.size(), 0);
    ShareSample(*island, clients, window / 4, warm);  // pipelines, recordings, cost estimates
    std::vector<double> worst;
    for (int r = 0; r < runs; ++r) worst.push_back(ShareSample(*island, clients, window, sum));
    const double median = Median(worst);
    std::printf("%14s %26s %30s %14.1f\n", name, absl::StrJoin(rows, "/").c_str(),
                absl::StrJoin(sum, "/",
                              [&](std::string* out, double v) {
                                absl::StrAppend(out, absl::StrFormat("%.1f", v / runs * 100));
                              })
                    .c_str(),
                median);
    auto& result =
        report.Add("shares", absl::StrCat(name, " calls"), "max deviation %", /*higher_is_better=*/false)
            .Value(median)
            .Samples(runs)
            .Param("rows", absl::StrJoin(rows, "/"))
            .Param("window_s", window);
    for (size_t i = 0; i < clients.size(); ++i) {
      result.Extra(absl::StrCat("share_weight_", kShareWeights[i]), sum[i] / runs);
    }
    std::fflush(stdout);
  }
}

int Main(int argc, char** argv) {
  const bench::CommonFlags common = bench::StartBenchmark("causeway_scheduler_bench", argc, argv);
  const int runs = common.SamplesOr(common.quick ? 1 : 9);
  if (common.quick) sample_seconds = 0.01;
  std::string only;
  bench::BenchFlags flags;
  flags.Choice("only", &only, {"dispatch", "pipeline", "tenancy", "shares"},
               "run only this table (default: all)");
  flags.Parse(argc, argv);
  bench::Report report("scheduler");
  std::printf("scheduler dispatch benchmarks: %d samples per figure, %s\n", runs,
              bench::MachineNote().c_str());
  if (only.empty() || only == "dispatch" || only == "pipeline") {
    auto rt = MakeRuntime(kMaxAccelerators);
    std::printf("%zu accelerators on %s\n", rt->size(), rt->accelerator(0)->info().name.c_str());
    if (only.empty() || only == "dispatch") DispatchTable(*rt, runs, report);
    if (only.empty() || only == "pipeline") PipelineTable(*rt, runs, report);
  }
  if (only.empty() || only == "tenancy") TenancyTable(runs, report);
  if (only.empty() || only == "shares") SharesTable(runs, report);
  report.WriteOrDie(common.json);
  return 0;
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) { return causeway::Main(argc, argv); }
