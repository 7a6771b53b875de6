// Copy bandwidth between two accelerators (the "interconnect" of a Causeway
// island) against memcpy of the same bytes, in the same run.
//
// For each size (1, 4, 16, 64 and 256 MiB by default):
//
//   memcpy:  memcpy between the two device buffers the copies move, through
//            their mappings (lavapipe's device memory is host-visible and
//            coherent; where it is not, between two host buffers of the size,
//            said in the report), in one call and in 8 MiB chunks; the better
//            median of the two is the baseline (the bound: on a CPU driver a
//            device copy is a memcpy too).
//   list:    a device-to-device copy of a buffer on accelerator 0 into a
//            buffer on accelerator 1, by a command list of accelerator 1
//            recorded once (list->Copy(src, dst)). Timed: Submit + Await, and
//            nothing else. The list imports the peer's memory block when the
//            copy is appended (the import cache keeps it), and the first
//            submit records it, both before timing: this is the steady state.
//   Copy:    the same copy by Accelerator::Copy + Await, which makes, records
//            and submits a new list each time (the import comes from the
//            cache).
//
// Between VkDevices (one per accelerator where a device has a single queue,
// as lavapipe does) the copy reads the source through this device's import
// of the peer's memory (VK_KHR_external_memory_fd); on queues of one VkDevice
// it is a plain vkCmdCopyBuffer. The path is printed.
//
// A sample is one untimed copy, then the copy repeated until it has moved at
// least sample_bytes (so the small sizes are not one timer tick); its figure
// is bytes / seconds per timed copy, in GB/s (1e9 bytes). The three cases
// alternate sample by sample (the order rotates), `--samples` samples each;
// medians are printed, with each Causeway case's median as a fraction of
// memcpy's. Before timing, each size
// checks both Causeway copies once: the source holds a known pattern
// (uploaded), the destination is cleared, the copy runs, the destination is
// downloaded and compared byte for byte; a mismatch aborts the benchmark.
//
// All-reduce: a program of one all-reduce (sum, f32) over a mesh of n = 2, 4,
// 8 accelerators, each device holding S bytes, iterations streamed (up to 3
// runs in flight, awaited at the end of the sample, as nccl-tests times
// back-to-back iterations):
// the algorithm kAuto picks (by size and whether the devices share memory:
// direct below 256 KiB a device; above, direct-read where they share memory,
// as lavapipe's do, else ring), and in the same run, samples alternating, the
// ring and direct-read programs on the same input, for comparison. Bus
// bandwidth as nccl-tests defines it: busbw = S / t * 2(n - 1)/n, which a
// ring reaches at the bandwidth of one link when all links run at once. It
// is compared with the copy bandwidth (the `list` case) of the same S
// measured in the same run; `dr/ring` is direct-read's busbw over ring's.
// Each program is checked once: device d holds d + 1 everywhere, so every
// element of the result must be n(n + 1)/2.
//
// `bound` is the most busbw / copy can be when all devices share one memory
// system, as a CPU driver's do: the plan's bytes read and written on every
// device (a copy 2 per byte, a two-operand combine 3, a reduction of n
// operands n + 1), at the rate a copy moves bytes. busbw assumes a link per
// device; here every device's traffic shares the one bus. The ring moves
// 7(n - 1)S/n a device (each of the n - 1 steps of its reduce-scatter copies
// and combines S/n: 5S/n; each of its all-gather copies S/n: 2S/n), so its
// bound is 4/(7n): 0.29 at n = 2, 0.14 at 4, 0.07 at 8. Direct-read moves
// (n + 1)S/n (its one reduction reads n slices of S/n and writes one) +
// 2(n - 1)S/n (its all-gather) = (3n - 1)S/n a device: bound
// 4(n - 1)/(n(3n - 1)), 0.40 at n = 2, 0.27 at 4, 0.15 at 8. No algorithm
// exceeds 2(n - 1)/n^2 (each device must at least read its input and write
// its output, 2S): 0.5 at n = 2, 0.38 at 4, 0.22 at 8; far below the 0.7 a
// machine with real links reaches.
//
//   causeway_ici_bench [--sizes=1,4,16,64,256] [--allreduce-sizes=1,16,64] [--overlap-sizes=4,16,64]
//                      [--only=copy|allreduce|overlap] [--samples=9] [--quick] [--json=FILE]   (sizes in MiB)
// --quick: 1 sample of at least 16 MiB moved, sizes 1 and 4 MiB, all-reduce
// 1 MiB, overlap 4 MiB (seconds, for tests); the common flags: bench_main.h.
// For steadier figures on a small machine: LP_NUM_THREADS=0 taskset -c 0.
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench_main.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "causeway/base/env.h"
#include "causeway/base/trace.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"

namespace causeway {
namespace {

using bench::Alternate;
using bench::Die;
using bench::Median;
using bench::Must;

constexpr uint64_t kMiB = 1ull << 20;
uint64_t sample_bytes = 64 * kMiB;  // a sample moves at least this much (--quick: 16 MiB)
constexpr uint32_t kClearWord = 0xdeadbeef;   // the destination before a checked copy
constexpr uint64_t kMemcpyChunk = 8 * kMiB;
constexpr int kAllReduceWindow = 3;  // all-reduce runs in flight (their outputs fit the budget)  // the
                                     // chunked memcpy's (the copy engine's chunk)

// Tells the compiler that memory may be read here, so that a memcpy whose
// destination is not read before the next identical one is not elided.
inline void ClobberMemory() { asm volatile("" : : : "memory"); }

// Page-aligned host memory, as a driver's allocations are.
struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using HostBytes = std::unique_ptr<uint8_t[], FreeDeleter>;
HostBytes AllocateHost(uint64_t size) {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, size));
  if (p == nullptr) Die(absl::StrCat("cannot allocate ", FormatBytes(size), " of host memory"));
  return HostBytes(p);
}

// A pattern that differs word by word and from size to size.
void FillPattern(uint8_t* bytes, uint64_t size) {
  auto* words = reinterpret_cast<uint32_t*>(bytes);
  const uint32_t seed = static_cast<uint32_t>(size / kMiB) * 0x01000193u;
  for (uint64_t i = 0; i < size / 4; ++i) words[i] = static_cast<uint32_t>(i) * 2654435761u + seed;
}

// `accelerators` on the CPU driver (or CAUSEWAY_DEVICE), each with `budget`
// bytes whatever the heap's share would be.
RuntimeOptions Options(int accelerators, uint64_t budget) {
  RuntimeOptions options;
  options.accelerators = accelerators;
  options.device = EnvString("CAUSEWAY_DEVICE").empty() ? "cpu" : "";
  options.memory_budget = budget;
  return options;
}

// GB/s of `copy` (one copy of `size` bytes) repeated `reps` times, after
// one untimed copy: each case is timed with its own buffers in the state its
// repetition leaves them, whichever case ran before (at sizes near the last
// level cache's, the first copy after another case's would gain or lose by
// what that case left in the cache).
double Bandwidth(uint64_t size, int reps, const std::function<void()>& copy) {
  copy();
  int64_t t0 = Tracer::NowNs();
  for (int i = 0; i < reps; ++i) copy();
  double seconds = (Tracer::NowNs() - t0) / 1e9;
  return size * static_cast<double>(reps) / seconds / 1e9;
}

// The copies of one size: host buffers for memcpy (the source also holds the
// pattern the device copies are checked against), a source on accelerator 0,
// a destination on accelerator 1 and the recorded list.
class SizeCase {
 public:
  SizeCase(Accelerator* from, Accelerator* to, uint64_t size) : from_(from), to_(to), size_(size) {
    host_src_ = AllocateHost(size);
    host_dst_ = AllocateHost(size);
    FillPattern(host_src_.get(), size);
    std::memset(host_dst_.get(), 0, size);
    src_ = Must(from->CreateBuffer(size), "CreateBuffer on accelerator 0");
    dst_ = Must(to->CreateBuffer(size), "CreateBuffer on accelerator 1");
    CHECK_OK(from->UploadSync(src_, host_src_.get(), size));
    list_ = Must(to->CreateCommandList("ici-copy"), "CreateCommandList");
    CHECK_OK(list_->Copy(src_, dst_));
    clear_ = Must(to->CreateCommandList("ici-clear"), "CreateCommandList");
    CHECK_OK(clear_->Fill(dst_, kClearWord));
  }

  // Checks that each Causeway copy delivers the source's bytes.
  void Verify() {
    Clear();
    CHECK_OK(to_->Submit(list_).Await());
    Expect("a recorded list's copy");
    Clear();
    CHECK_OK(to_->Copy(src_, dst_).Await());
    Expect("Accelerator::Copy");
    if (to_->copy_engine() != nullptr) {
      Clear();
      EngineCopy();
      Expect("the copy engine");
    }
  }

  // Whether the host reaches both device buffers through their mappings
  // (lavapipe; GPUs whose device memory is host-visible and coherent).
  bool mapped() const {
    return src_->mapped() != nullptr && dst_->mapped() != nullptr && src_->host_coherent() &&
           dst_->host_coherent();
  }
  // memcpy of the bytes the device copies move: between the mapped device
  // buffers where the host reaches them, else between the host buffers. One
  // call, or (`chunked`) one call per kMemcpyChunk.
  void Memcpy(bool chunked) {
    auto* dst = static_cast<uint8_t*>(mapped() ? dst_->mapped() : host_dst_.get());
    const auto* src = static_cast<const uint8_t*>(mapped() ? src_->mapped() : host_src_.get());
    const uint64_t step = chunked ? kMemcpyChunk : size_;
    for (uint64_t at = 0; at < size_; at += step) std::memcpy(dst + at, src + at, std::min(step, size_ - at));
    ClobberMemory();
  }
  void ListCopy() { CHECK_OK(to_->Submit(list_).Await()); }
  void AcceleratorCopy() { CHECK_OK(to_->Copy(src_, dst_).Await()); }
  void EngineCopy() { CHECK_OK(to_->copy_engine()->Copy(src_, dst_, {{0, 0, size_}}, {}).Await()); }

 private:
  void Clear() { CHECK_OK(to_->Submit(clear_).Await()); }

  // Downloads the destination and aborts unless it equals the pattern.
  void Expect(const char* what) {
    std::memset(host_dst_.get(), 0, size_);
    CHECK_OK(to_->DownloadSync(dst_, host_dst_.get(), size_));
    if (std::memcmp(host_dst_.get(), host_src_.get(), size_) == 0) return;
    const auto* got = reinterpret_cast<const uint32_t*>(host_dst_.get());
    const auto* want = reinterpret_cast<const uint32_t*>(host_src_.get());
    uint64_t i = 0, wrong = 0;
    while (got[i] == want[i]) ++i;
    for (uint64_t j = i; j < size_ / 4; ++j) wrong += got[j] != want[j];
    Die(absl::StrFormat("%s of %s from accelerator 0 to 1: word %d (byte %d) is 0x%08x, expected 0x%08x",
                        what, FormatBytes(size_), i, 4 * i, got[i], want[i]) +
        absl::StrFormat("; %d of %d words differ", wrong, size_ / 4));
  }

  Accelerator* from_;
  Accelerator* to_;
  uint64_t size_;
  HostBytes host_src_, host_dst_;
  std::shared_ptr<Buffer> src_, dst_;
  std::shared_ptr<CommandList> list_, clear_;
};

// One all-reduce size over a mesh of n: one input, and a program per
// algorithm compared, each checked.
class AllReduceCase {
 public:
  AllReduceCase(Island& island, int n, uint64_t bytes) : n_(n), elements_(bytes / 4) {
    client_ = Must(island.Connect(absl::StrCat("allreduce", n)), "Connect");
    mesh_ = Must(client_->AllocateMesh({n}), "AllocateMesh");
    const int64_t global = static_cast<int64_t>(elements_) * n;
    x_ = Must(client_->CreateArray(mesh_, {global}, DType::kF32, Sharding::Split(0), "x"), "CreateArray");
    std::vector<float> host(global);
    for (int d = 0; d < n; ++d) std::fill_n(host.begin() + d * elements_, elements_, d + 1.0f);
    CHECK_OK(x_->Upload(host.data(), host.size() * 4));
  }
  ~AllReduceCase() { client_->Close(); }

  // Loads the all-reduce by `algorithm` and checks it once; returns its index.
  size_t Add(CollectiveAlgorithm algorithm) {
    Variant p;
    ProgramBuilder b(absl::StrCat("allreduce", n_, "-", CollectiveAlgorithmName(algorithm)));
    b.Parameter("x", mesh_, {static_cast<int64_t>(elements_) * n_}, DType::kF32, Sharding::Split(0));
    b.AllReduce("sum", mesh_, "x", "y", ReduceOp::kSum, algorithm);
    b.Output("y");
    auto program = Must(b.Build(), "Build");
    const CollectivePlan& plan = *program->steps()[0].collective;
    p.algorithm = plan.algorithm;
    p.description = plan.ToString();
    // Bytes read and written on all devices: a copy reads and writes its
    // elements, a combine reads two operands and writes one, a reduction
    // reads every position's operand and writes one.
    for (const CollectivePhase& phase : plan.phases) {
      for (const auto& ops : phase.ops) {
        for (const CollectiveOp& op : ops) {
          const int touches = op.kind == CollectiveOp::kCombine  ? 3
                              : op.kind == CollectiveOp::kReduce ? plan.devices + 1
                                                                 : 2;
          p.traffic += static_cast<double>(op.elements * DTypeSize(plan.dtype) * touches);
        }
      }
    }
    p.exe = Must(client_->Load(program), "Load");
    programs_.push_back(std::move(p));
    Verify(programs_.size() - 1);
    return programs_.size() - 1;
  }
  CollectiveAlgorithm algorithm(size_t i) const { return programs_[i].algorithm; }
  const std::string& description(size_t i) const { return programs_[i].description; }
  // busbw / copy bandwidth if all devices share one memory system (as on a
  // CPU driver) and every byte of the plan moved at the copy's speed: a copy
  // of S moves 2S bytes in S / copy, so the plan takes traffic / (2 copy)
  // and busbw / copy = 4 (n - 1) S / (n traffic).
  double SharedMemoryBound(size_t i) const {
    return 4.0 * (n_ - 1) * elements_ * 4 / (n_ * programs_[i].traffic);
  }
  void Run(size_t i) { last_ = Must(client_->Execute(programs_[i].exe, {x_}), "Execute"), CHECK_OK(last_.Await()); }
  // Runs program `i` `count` times back to back (iterations streamed, as
  // nccl-tests times them), at most kAllReduceWindow in flight; returns once
  // all have finished.
  void Stream(size_t i, int count) {
    std::deque<Execution> runs;
    for (int r = 0; r < count; ++r) {
      runs.push_back(Must(client_->Execute(programs_[i].exe, {x_}), "Execute"));
      if (static_cast<int>(runs.size()) > kAllReduceWindow) {
        CHECK_OK(runs.front().Await());
        runs.pop_front();
      }
    }
    for (const Execution& run : runs) CHECK_OK(run.Await());
  }

 private:
  struct Variant {
    std::shared_ptr<Executable> exe;
    CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto;
    std::string description;
    double traffic = 0;
  };
  void Verify(size_t i) {
    Run(i);
    std::vector<float> got(elements_);
    CHECK_OK(last_.outputs[0]->Download(got.data(), got.size() * 4));
    const float want = n_ * (n_ + 1) / 2.0f;
    for (uint64_t e = 0; e < elements_; ++e) {
      if (got[e] != want) {
        Die(absl::StrCat(description(i), ": element ", e, " is ", got[e], ", expected ", want));
      }
    }
  }

  int n_;
  uint64_t elements_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Mesh> mesh_;
  ArrayRef x_;
  std::vector<Variant> programs_;
  Execution last_;
};

void AllReduceTable(const std::vector<uint64_t>& sizes, int runs, bench::Report& report) {
  constexpr int kMaxDevices = 8;
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  RuntimeOptions options;
  options.accelerators = kMaxDevices;
  options.device = EnvString("CAUSEWAY_DEVICE").empty() ? "cpu" : "";
  // Per device: the input, the checked run's output, the outputs of a
  // stream's runs in flight and the one being made, the ring's chunk, and on
  // accelerators 0 and 1 the copy's buffers, with room to spare.
  options.memory_budget = (kAllReduceWindow + 8) * largest;
  auto rt = Must(Runtime::Create(options), "Runtime::Create");
  auto island = Must(Island::Create(rt.get()), "Island::Create");
  std::printf("\nall-reduce (sum, f32) over n accelerators; S bytes a device; busbw = S/t * 2(n-1)/n; "
              "GB/s, median of %d samples;\n/copy: busbw over copy; bound: its most on one shared memory bus "
              "(no algorithm's above 2(n-1)/n^2)\n",
              runs);
  std::printf("%8s %3s %8s | %-12s %8s %6s %6s | %8s %6s %6s | %8s %6s %6s | %7s\n", "S", "n", "copy", "auto",
              "busbw", "/copy", "bound", "ring", "/copy", "bound", "d-read", "/copy", "bound", "dr/ring");
  for (uint64_t size : sizes) {
    SizeCase copy(rt->accelerator(0), rt->accelerator(1), size);
    copy.Verify();
    const int copy_reps = static_cast<int>(std::max<uint64_t>(1, sample_bytes / size));
    for (int n : {2, 4, 8}) {
      AllReduceCase ar(*island, n, size);
      const size_t automatic = ar.Add(CollectiveAlgorithm::kAuto);
      // The comparisons; kAuto's own program stands for the one it picked.
      size_t ring = automatic, read = automatic;
      if (ar.algorithm(automatic) != CollectiveAlgorithm::kRing) ring = ar.Add(CollectiveAlgorithm::kRing);
      if (ar.algorithm(automatic) != CollectiveAlgorithm::kDirectRead) read = ar.Add(CollectiveAlgorithm::kDirectRead);
      const double moved = size * 2.0 * (n - 1) / n;  // per device, per all-reduce
      const int reps = static_cast<int>(std::max<double>(1, sample_bytes / moved));
      std::vector<std::function<double()>> cases = {
          [&] { return Bandwidth(size, copy_reps, [&] { copy.ListCopy(); }); },
      };
      std::vector<size_t> timed = {automatic};
      if (ring != automatic) timed.push_back(ring);
      if (read != automatic) timed.push_back(read);
      for (size_t program : timed) {
        cases.push_back([&, program] {
          ar.Stream(program, 1);  // as Bandwidth: one untimed iteration first
          const int64_t t0 = Tracer::NowNs();
          ar.Stream(program, reps);
          return moved * reps / ((Tracer::NowNs() - t0) / 1e9) / 1e9;
        });
      }
      for (auto& run : cases) run();  // warm-up
      auto samples = Alternate(runs, cases);
      const double c = Median(samples[0]);
      auto busbw = [&](size_t program) {
        return Median(samples[1 + (std::find(timed.begin(), timed.end(), program) - timed.begin())]);
      };
      std::printf("%8s %3d %8.2f | %-12s %8.2f %6.2f %6.2f | %8.2f %6.2f %6.2f | %8.2f %6.2f %6.2f | %7.2f\n",
                  FormatBytes(size).c_str(), n, c, CollectiveAlgorithmName(ar.algorithm(automatic)),
                  busbw(automatic), busbw(automatic) / c, ar.SharedMemoryBound(automatic), busbw(ring),
                  busbw(ring) / c, ar.SharedMemoryBound(ring), busbw(read), busbw(read) / c,
                  ar.SharedMemoryBound(read), busbw(read) / busbw(ring));
      for (size_t program : timed) {
        const bool picked = program == automatic;
        report
            .Add("allreduce",
                 absl::StrCat("all-reduce ", FormatBytes(size), " n=", n,
                              picked ? "" : absl::StrCat(" ", CollectiveAlgorithmName(ar.algorithm(program)))),
                 "busbw GB/s")
            .Value(busbw(program))
            .Baseline("copy", c)
            .Samples(runs)
            .Param("bytes", static_cast<double>(size))
            .Param("accelerators", n)
            .Param("algorithm", ar.description(program))
            .Param("picked by auto", picked ? "yes" : "no")
            .Extra("shared_memory_bound", ar.SharedMemoryBound(program))
            .Extra("direct_read_over_ring", busbw(read) / busbw(ring));
      }
      std::fflush(stdout);
    }
  }
}

// A two-stage pipeline across accelerators 0 and 1, runs streamed: stage
// one scales x (S bytes) on accelerator 0; its result moves to accelerator 1,
// where stage two adds w to it `passes` times (one pass reads 2S and writes
// S). Loaded twice: once with the move as a copy at the head of stage two's
// command list (accelerator 1's queue copies, then computes) and once by
// accelerator 1's copy engine (the queue computes run i while the engine
// moves run i + 1).
class OverlapCase {
 public:
  OverlapCase(Island& island, uint64_t bytes, int passes) : elements_(bytes / 4), passes_(passes) {
    client_ = Must(island.Connect("overlap"), "Connect");
    auto a = Must(client_->AllocateMesh({1}), "AllocateMesh");
    auto b = Must(client_->AllocateMesh({1}), "AllocateMesh");
    if (a->device(0) == b->device(0)) Die("the two stages got one accelerator");
    const Shape shape = {static_cast<int64_t>(elements_)};
    ProgramBuilder builder("overlap");
    builder.Parameter("x", a, shape, DType::kF32);
    builder.Parameter("w", b, shape, DType::kF32);
    builder.Call("scale", Must(Function::Scale(shape, 2.0f), "Scale"), a, {"x"}, {"y"});
    builder.Call("add", Must(Function::RepeatedAdd(shape, passes), "RepeatedAdd"), b, {"y", "w"}, {"z"});
    builder.Output("z");
    auto program = Must(builder.Build(), "Build");
    Accelerator* to = b->device(0);
    if (to->copy_engine() == nullptr) Die(absl::StrCat(to->info().name, " has no copy engine (device memory is not host-coherent)"));
    const uint64_t threshold = to->copy_engine_min_bytes();
    to->set_copy_engine_min_bytes(UINT64_MAX);
    in_list_ = Must(client_->Load(program), "Load");
    to->set_copy_engine_min_bytes(1);
    by_engine_ = Must(client_->Load(program), "Load");
    to->set_copy_engine_min_bytes(threshold);
    engine_ = to->copy_engine();
    x_ = Must(client_->CreateArray(a, shape, DType::kF32, Sharding::Replicated(), "x"), "CreateArray");
    w_ = Must(client_->CreateArray(b, shape, DType::kF32, Sharding::Replicated(), "w"), "CreateArray");
    std::vector<float> host(elements_);
    for (uint64_t i = 0; i < elements_; ++i) host[i] = static_cast<float>(i % 1000);
    CHECK_OK(x_->Upload(host.data(), bytes));
    std::fill(host.begin(), host.end(), 0.5f);
    CHECK_OK(w_->Upload(host.data(), bytes));
  }
  ~OverlapCase() { client_->Close(); }

  // `runs` runs streamed, then awaited; the last run's output is kept.
  void Stream(bool engine, int runs) {
    const auto& exe = engine ? by_engine_ : in_list_;
    std::vector<Execution> pending;
    for (int r = 0; r < runs; ++r) pending.push_back(Must(client_->Execute(exe, {x_, w_}), "Execute"));
    for (const Execution& e : pending) CHECK_OK(e.Await());
    last_ = pending.back();
  }
  // Checks both executables against the CPU, and that the engine moved the
  // second's bytes (and not the first's).
  void Verify() {
    for (bool engine : {false, true}) {
      const uint64_t before = engine_->copies();
      Stream(engine, 2);
      const uint64_t copies = engine_->copies() - before;
      if (copies != (engine ? 2u : 0u)) Die(absl::StrCat("the copy engine made ", copies, " copies for ", engine ? "the engine's" : "the list's", " 2 runs"));
      std::vector<float> got(elements_);
      CHECK_OK(last_.outputs[0]->Download(got.data(), elements_ * 4));
      for (uint64_t i = 0; i < elements_; ++i) {
        const float want = 2.0f * static_cast<float>(i % 1000) + 0.5f * passes_;
        if (got[i] != want) Die(absl::StrCat("overlap, ", engine ? "copy engine" : "in the list", ": element ", i, " is ", got[i], ", expected ", want));
      }
    }
  }

 private:
  uint64_t elements_;
  int passes_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Executable> in_list_, by_engine_;
  CopyEngine* engine_ = nullptr;
  ArrayRef x_, w_;
  Execution last_;
};

void OverlapTable(const std::vector<uint64_t>& sizes, int runs, bench::Report& report) {
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  // x, and y for each instance, on 0; w, y's copy for each instance and the
  // outputs of a sample's runs (all held until it ends) on 1.
  auto rt = Must(Runtime::Create(Options(2, 24 * largest)), "Runtime::Create");
  auto island = Must(Island::Create(rt.get()), "Island::Create");
  constexpr int kStream = 8;  // runs a sample streams
  std::printf("\npipeline over accelerators 0 -> 1, %d runs streamed: S bytes cross per run; stage two makes "
              "`passes` passes over them; runs/s, median of %d samples\n",
              kStream, runs);
  std::printf("%8s %7s %12s %12s %9s\n", "S", "passes", "copy in list", "copy engine", "engine/list");
  for (uint64_t size : sizes) {
    for (int passes : {1, 4}) {
      OverlapCase c(*island, size, passes);
      c.Verify();
      auto rate = [&](bool engine) {
        const int64_t t0 = Tracer::NowNs();
        c.Stream(engine, kStream);
        return kStream / ((Tracer::NowNs() - t0) / 1e9);
      };
      std::vector<std::function<double()>> cases = {[&] { return rate(false); }, [&] { return rate(true); }};
      for (auto& run : cases) run();  // warm-up
      auto samples = Alternate(runs, cases);
      const double list = Median(samples[0]), engine = Median(samples[1]);
      std::printf("%8s %7d %12.1f %12.1f %9.2f\n", FormatBytes(size).c_str(), passes, list, engine, engine / list);
      report.Add("overlap", absl::StrCat("pipeline ", FormatBytes(size), " passes=", passes), "runs/s")
          .Value(engine)
          .Baseline("copy in list", list)
          .Samples(runs)
          .Param("bytes", static_cast<double>(size))
          .Param("passes", passes);
      std::fflush(stdout);
    }
  }
}

int Main(int argc, char** argv) {
  const bench::CommonFlags common = bench::StartBenchmark("causeway_ici_bench", argc, argv);
  const int runs = common.SamplesOr(common.quick ? 1 : 9);
  std::vector<uint64_t> sizes = {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB};
  std::vector<uint64_t> allreduce_sizes = {1 * kMiB, 16 * kMiB, 64 * kMiB};
  std::vector<uint64_t> overlap_sizes = {4 * kMiB, 16 * kMiB, 64 * kMiB};
  if (common.quick) {
    overlap_sizes = {4 * kMiB};
    sample_bytes = 16 * kMiB;
    sizes = {1 * kMiB, 4 * kMiB};
    allreduce_sizes = {1 * kMiB};
  }
  std::string only;
  bench::BenchFlags flags;
  flags.Sizes("sizes", &sizes, kMiB, 2048, "copy sizes in MiB")
      .Sizes("allreduce-sizes", &allreduce_sizes, kMiB, 2048, "all-reduce sizes in MiB")
      .Sizes("overlap-sizes", &overlap_sizes, kMiB, 2048, "sizes of the copy-and-compute overlap, in MiB")
      .Choice("only", &only, {"copy", "allreduce", "overlap"}, "run only this table (default: all)");
  flags.Parse(argc, argv);
  bench::Report report("ici");
  if (only == "allreduce" || only == "overlap") {
    if (only == "allreduce") AllReduceTable(allreduce_sizes, runs, report);
    if (only == "overlap") OverlapTable(overlap_sizes, runs, report);
    report.WriteOrDie(common.json);
    return 0;
  }
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());

  // Room for a source and a destination of the largest size on each
  // accelerator, whatever the heap's share would be (a size's buffers are
  // freed before the next size's are made).
  auto rt = Must(Runtime::Create(Options(2, 2 * largest)), "Runtime::Create");
  Accelerator* from = rt->accelerator(0);
  Accelerator* to = rt->accelerator(1);
  CopyPath path = to->PathFrom(*from);
  if (path == CopyPath::kHostStaged) {
    Die(absl::StrCat("no device path from accelerator 0 to 1 on ", from->info().name,
                     " (they are separate VkDevices without VK_KHR_external_memory_fd): a recorded list "
                     "cannot copy between them"));
  }

  std::printf("copy accelerator 0 -> 1 on %s, path %s; GB/s (1e9 B/s), median of %d samples; %s\n",
              from->info().name.c_str(), CopyPathName(path), runs, bench::MachineNote().c_str());
  const bool engine = to->copy_engine() != nullptr;
  std::printf("%8s %10s %10s %8s %10s %8s %10s %8s\n", "size", "memcpy", "list", "/memcpy", "Copy", "/memcpy",
              "engine", "/memcpy");
  for (uint64_t size : sizes) {
    SizeCase c(from, to, size);
    c.Verify();
    const int reps = static_cast<int>(std::max<uint64_t>(1, sample_bytes / size));
    std::vector<std::function<double()>> cases = {
        [&] { return Bandwidth(size, reps, [&] { c.Memcpy(false); }); },
        [&] { return Bandwidth(size, reps, [&] { c.Memcpy(true); }); },
        [&] { return Bandwidth(size, reps, [&] { c.ListCopy(); }); },
        [&] { return Bandwidth(size, reps, [&] { c.AcceleratorCopy(); }); },
    };
    if (engine) cases.push_back([&] { return Bandwidth(size, reps, [&] { c.EngineCopy(); }); });
    for (auto& run : cases) run();  // warm-up, outside the samples
    auto samples = Alternate(runs, cases);
    // The baseline is the better of the whole and the chunked memcpy.
    const double whole = Median(samples[0]), chunked = Median(samples[1]), m = std::max(whole, chunked);
    const double l = Median(samples[2]), a = Median(samples[3]);
    double e = engine ? Median(samples[4]) : 0;
    std::printf("%8s %10.2f %10.2f %8.2f %10.2f %8.2f %10.2f %8.2f   (memcpy whole %.2f, chunked %.2f)\n",
                FormatBytes(size).c_str(), m, l, l / m, a, a / m, e, e / m, whole, chunked);
    const std::string baseline =
        c.mapped() ? "memcpy between the mapped buffers" : "memcpy between host buffers";
    std::vector<std::pair<const char*, double>> methods = {{"list", l}, {"Copy", a}};
    if (engine) methods.push_back({"engine", e});
    for (auto [method, value] : methods) {
      report.Add("copy", absl::StrCat(method, " copy ", FormatBytes(size)), "GB/s")
          .Value(value)
          .Baseline(baseline, m)
          .Extra("memcpy_whole_gbps", whole)
          .Extra("memcpy_chunked_gbps", chunked)
          .Samples(runs)
          .Param("bytes", static_cast<double>(size))
          .Param("method", method)
          .Param("path", CopyPathName(path));
    }
    std::fflush(stdout);
  }
  if (only.empty()) {
    rt.reset();  // its memory, before the all-reduce runtime's
    AllReduceTable(allreduce_sizes, runs, report);
    OverlapTable(overlap_sizes, runs, report);
  }
  report.WriteOrDie(common.json);
  return 0;
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) { return causeway::Main(argc, argv); }
