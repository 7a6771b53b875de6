// Per-dispatch cost of Causeway against raw Vulkan calls, in the same binary
// and run, on the same device, queue, pipeline and buffers.
//
//   submit-await: one tiny kernel submitted and awaited, again and again.
//   replay:       a one-dispatch command list submitted N times back to back,
//                 then the last one awaited (the ring and completion path).
//                 Raw: N vkQueueSubmit calls.
//   replay-one-submit: the same Causeway figure against raw Vulkan
//                 submitting the N buffers in one vkQueueSubmit of N submit
//                 infos (what a runtime that batched its submissions would
//                 do).
//   batched:      one command list of N dependent dispatches, submitted and
//                 awaited (recording, barriers and replay of a long list).
//   relay:        N one-dispatch submissions alternating between two
//                 accelerators (separate VkDevices on lavapipe), each waiting
//                 for the one before it on the other: all submitted at once,
//                 the last awaited. Raw: a host thread (started before any
//                 timing, as Causeway's relays are) waits on each
//                 submission's timeline value and signals the next one's
//                 semaphore on the other device, the least a cross-device
//                 dependency costs where semaphores cannot be shared.
//                 Causeway: Submit with the previous future as a wait.
//
// Each case runs raw and Causeway alternately, `--samples` times; the medians and
// their ratio (Causeway / raw; 1.00 = no overhead) are printed.
//
//   causeway_dispatch_bench [--iterations=200] [--n=256] [--samples=9] [--quick] [--json=FILE]
// --quick: 3 samples, 20 iterations, n = 32 (seconds, for tests); the common
// flags: bench_main.h.
// For steadier figures on a small machine: taskset -c 0, LP_NUM_THREADS=0.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench_main.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/kernels/builtin_kernels.h"
#include "causeway/kernels/ops.h"
#include "causeway/runtime/runtime.h"
#include "causeway/runtime/vk_status.h"

namespace causeway {
namespace {

using bench::Median;

constexpr uint32_t kElements = 64;  // a tiny kernel: 64 floats scaled
constexpr int kReplays = 4;         // replay runs of n submissions per timed run

#define CHECK_VK(call)                                                                  \
  do {                                                                                  \
    VkResult r_ = (call);                                                               \
    if (r_ != VK_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s failed: %s\n", #call, VkResultName(r_));                 \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// The raw-Vulkan side: its own command pool, command buffers and timeline,
// recording exactly what Causeway records (a leading barrier, then dispatches
// with barriers between dependent ones).
class Raw {
 public:
  Raw(Accelerator* acc, const Pipeline* pipeline, VkBuffer x, VkBuffer y)
      : acc_(acc), dev_(acc->device().handle()), pipeline_(pipeline), x_(x), y_(y) {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = acc->device().queue_family();
    CHECK_VK(vkCreateCommandPool(dev_, &pi, nullptr, &pool_));
    VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    si.pNext = &type;
    CHECK_VK(vkCreateSemaphore(dev_, &si, nullptr, &timeline_));
    CHECK_VK(vkCreateSemaphore(dev_, &si, nullptr, &relay_));
  }
  ~Raw() {
    vkDeviceWaitIdle(dev_);
    vkDestroySemaphore(dev_, timeline_, nullptr);
    vkDestroySemaphore(dev_, relay_, nullptr);
    vkDestroyCommandPool(dev_, pool_, nullptr);
  }

  // A command buffer of `dispatches` chained scale kernels (x -> y -> x ...).
  VkCommandBuffer Record(int dispatches, bool simultaneous) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb;
    CHECK_VK(vkAllocateCommandBuffers(dev_, &ai, &cb));
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    if (simultaneous) bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;
    CHECK_VK(vkBeginCommandBuffer(cb, &bi));
    Barrier(cb);
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_->pipeline);
    for (int i = 0; i < dispatches; ++i) {
      if (i > 0) Barrier(cb);
      VkBuffer in = i % 2 == 0 ? x_ : y_, out = i % 2 == 0 ? y_ : x_;
      VkDescriptorBufferInfo infos[2] = {{in, 0, kElements * 4}, {out, 0, kElements * 4}};
      VkWriteDescriptorSet w[2];
      for (int j = 0; j < 2; ++j) {
        w[j] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
        w[j].dstBinding = j;
        w[j].descriptorCount = 1;
        w[j].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w[j].pBufferInfo = &infos[j];
      }
      acc_->device().push_descriptor_fn()(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_->layout, 0, 2, w);
      ScaleParams p{kElements, 1.0f};
      vkCmdPushConstants(cb, pipeline_->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(p), &p);
      vkCmdDispatch(cb, 1, 1, 1);
    }
    CHECK_VK(vkEndCommandBuffer(cb));
    return cb;
  }

  // Submits `cb`, after `wait` (a semaphore of this device) reaches
  // `wait_value` if given; returns the timeline value it signals.
  uint64_t Submit(VkCommandBuffer cb, VkSemaphore wait = VK_NULL_HANDLE, uint64_t wait_value = 0) {
    uint64_t value = ++value_;
    VkTimelineSemaphoreSubmitInfo ti{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
    ti.signalSemaphoreValueCount = 1;
    ti.pSignalSemaphoreValues = &value;
    VkPipelineStageFlags stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    if (wait != VK_NULL_HANDLE) {
      ti.waitSemaphoreValueCount = 1;
      ti.pWaitSemaphoreValues = &wait_value;
      si.waitSemaphoreCount = 1;
      si.pWaitSemaphores = &wait;
      si.pWaitDstStageMask = &stage;
    }
    si.pNext = &ti;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    si.signalSemaphoreCount = 1;
    si.pSignalSemaphores = &timeline_;
    CHECK_VK(vkQueueSubmit(acc_->queue(), 1, &si, VK_NULL_HANDLE));
    return value;
  }
  // Submits every buffer of `cbs` in one vkQueueSubmit, one VkSubmitInfo
  // each signalling the next timeline value (the batches run in order).
  void SubmitAll(const std::vector<VkCommandBuffer>& cbs) {
    const size_t n = cbs.size();
    std::vector<uint64_t> values(n);
    std::vector<VkTimelineSemaphoreSubmitInfo> tis(n, {VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO});
    std::vector<VkSubmitInfo> sis(n, {VK_STRUCTURE_TYPE_SUBMIT_INFO});
    for (size_t i = 0; i < n; ++i) {
      values[i] = ++value_;
      tis[i].signalSemaphoreValueCount = 1;
      tis[i].pSignalSemaphoreValues = &values[i];
      sis[i].pNext = &tis[i];
      sis[i].commandBufferCount = 1;
      sis[i].pCommandBuffers = &cbs[i];
      sis[i].signalSemaphoreCount = 1;
      sis[i].pSignalSemaphores = &timeline_;
    }
    CHECK_VK(vkQueueSubmit(acc_->queue(), static_cast<uint32_t>(n), sis.data(), VK_NULL_HANDLE));
  }
  void WaitLast() { Wait(value_); }
  void Wait(uint64_t value) {
    VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wi.semaphoreCount = 1;
    wi.pSemaphores = &timeline_;
    wi.pValues = &value;
    CHECK_VK(vkWaitSemaphores(dev_, &wi, UINT64_MAX));
  }
  // A host-signalled timeline semaphore on this device (the relay's).
  VkSemaphore relay() const { return relay_; }
  void SignalRelay(uint64_t value) {
    VkSemaphoreSignalInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO};
    si.semaphore = relay_;
    si.value = value;
    CHECK_VK(vkSignalSemaphore(dev_, &si));
  }

 private:
  static void Barrier(VkCommandBuffer cb) {
    VkMemoryBarrier b{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    b.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    b.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                      VK_ACCESS_TRANSFER_WRITE_BIT;
    VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(cb, st, st, 0, 1, &b, 0, nullptr, 0, nullptr);
  }
  Accelerator* acc_;
  VkDevice dev_;
  const Pipeline* pipeline_;
  VkBuffer x_, y_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkSemaphore timeline_ = VK_NULL_HANDLE;
  VkSemaphore relay_ = VK_NULL_HANDLE;
  uint64_t value_ = 0;
};

// The raw relay: a host thread, started once before anything is timed, that
// waits on each submission's timeline value and then signals the relay
// semaphore of the device that runs the next one.
class RawRelay {
 public:
  explicit RawRelay(Raw* raw[2]) : raw_{raw[0], raw[1]}, thread_([this] { Loop(); }) {}
  ~RawRelay() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Submission k of a chain of `hops` runs on device k % 2 and waits for
  // submission k - 1 through the relay semaphore of its device. Relay values
  // rise chain after chain.
  void Chain(const std::vector<VkCommandBuffer> cbs[2], int hops) {
    const uint64_t base = relay_value_;
    uint64_t last = 0;
    for (int k = 0; k < hops; ++k) {
      Raw* r = raw_[k % 2];
      last = r->Submit(cbs[k % 2][k / 2], k == 0 ? VK_NULL_HANDLE : r->relay(), base + k);
      if (k + 1 < hops) {
        absl::MutexLock lock(&mu_);
        hops_.push_back({k % 2, last, base + k + 1});
      }
    }
    raw_[(hops - 1) % 2]->Wait(last);
    relay_value_ = base + hops;
  }

 private:
  struct Hop {
    int from;              // the device whose submission is waited on
    uint64_t value;        // its timeline value
    uint64_t relay_value;  // what the other device's relay semaphore is set to
  };
  void Loop() {
    while (true) {
      Hop hop;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this] { return stop_ || !hops_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (hops_.empty()) return;
        hop = hops_.front();
        hops_.pop_front();
      }
      raw_[hop.from]->Wait(hop.value);
      raw_[1 - hop.from]->SignalRelay(hop.relay_value);
    }
  }

  Raw* raw_[2];
  uint64_t relay_value_ = 0;
  absl::Mutex mu_;
  std::deque<Hop> hops_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is built
};

struct Case {
  std::string name;
  std::function<void()> raw, causeway;
  int dispatches;  // per call of raw/causeway
};

int Main(int argc, char** argv) {
  const bench::CommonFlags common = bench::StartBenchmark("causeway_dispatch_bench", argc, argv);
  const int runs = common.SamplesOr(common.quick ? 3 : 9);
  int iterations = common.quick ? 20 : 200, n = common.quick ? 32 : 256;
  bench::BenchFlags flags;
  flags.Int("iterations", &iterations, 1, 1'000'000, "timed calls per sample")
      .Int("n", &n, 1, 65536, "dispatches or submissions per timed call");
  flags.Parse(argc, argv);
  RuntimeOptions options;
  options.accelerators = 2;
  options.device = EnvString("CAUSEWAY_DEVICE").empty() ? "cpu" : "";
  options.ring_capacity = static_cast<uint32_t>(std::max(n, 64));
  auto rt = Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s\n", rt.status().ToString().c_str());
    return 1;
  }
  Accelerator* acc = (*rt)->accelerator(0);
  if (!acc->device().push_descriptors()) {
    std::fprintf(stderr, "the raw baseline needs VK_KHR_push_descriptor\n");
    return 1;
  }
  auto kernel = BuiltinKernel("scale").value();
  const Pipeline* pipeline = acc->device().GetPipeline(kernel).value();
  auto x = acc->CreateBuffer(kElements * 4).value();
  auto y = acc->CreateBuffer(kElements * 4).value();
  std::vector<float> ones(kElements, 1.0f);
  CHECK_OK(acc->UploadSync(x, ones.data(), kElements * 4));
  CHECK_OK(acc->UploadSync(y, ones.data(), kElements * 4));

  Raw raw(acc, pipeline, x->handle(), y->handle());

  // The second accelerator, for the relay case.
  Accelerator* acc1 = (*rt)->accelerator(1);
  const Pipeline* pipeline1 = acc1->device().GetPipeline(kernel).value();
  auto x1 = acc1->CreateBuffer(kElements * 4).value();
  auto y1 = acc1->CreateBuffer(kElements * 4).value();
  CHECK_OK(acc1->UploadSync(x1, ones.data(), kElements * 4));
  CHECK_OK(acc1->UploadSync(y1, ones.data(), kElements * 4));
  Raw raw1(acc1, pipeline1, x1->handle(), y1->handle());
  Raw* raw_pair[2] = {&raw, &raw1};
  std::vector<VkCommandBuffer> relay_cbs[2];
  for (int d = 0; d < 2; ++d) {
    for (int i = 0; i < (n + 1) / 2; ++i) relay_cbs[d].push_back(raw_pair[d]->Record(1, false));
  }
  RawRelay raw_relay(raw_pair);
  auto one1 = acc1->CreateCommandList("one").value();
  CHECK_OK(ops::Scale(*one1, x1, y1, kElements, 1.0f));
  Accelerator* pair[2] = {acc, acc1};
  std::shared_ptr<CommandList> pair_lists[2] = {nullptr, one1};
  // As Causeway does, a separate recording per in-flight replay (one
  // simultaneous-use buffer submitted n times is slower on lavapipe).
  std::vector<VkCommandBuffer> raw_ones;
  for (int i = 0; i < n; ++i) raw_ones.push_back(raw.Record(1, /*simultaneous=*/false));
  VkCommandBuffer raw_one = raw_ones[0];
  VkCommandBuffer raw_many = raw.Record(n, false);

  auto one = acc->CreateCommandList("one").value();
  CHECK_OK(ops::Scale(*one, x, y, kElements, 1.0f));
  pair_lists[0] = one;
  auto many = acc->CreateCommandList("many").value();
  for (int i = 0; i < n; ++i) {
    CHECK_OK(i % 2 == 0 ? ops::Scale(*many, x, y, kElements, 1.0f) : ops::Scale(*many, y, x, kElements, 1.0f));
  }

  // What each case's dispatches are, for the JSON report.
  const int accelerators_of[] = {1, 1, 1, 1, 2};
  std::vector<Case> cases = {
      {"submit-await",
       [&] {
         for (int i = 0; i < iterations; ++i) {
           raw.Submit(raw_one);
           raw.WaitLast();
         }
       },
       [&] {
         for (int i = 0; i < iterations; ++i) CHECK_OK(acc->Submit(one).Await());
       },
       iterations},
      {"replay",
       [&] {
         for (int rep = 0; rep < kReplays; ++rep) {
           for (int i = 0; i < n; ++i) raw.Submit(raw_ones[i]);
           raw.WaitLast();
         }
       },
       [&] {
         for (int rep = 0; rep < kReplays; ++rep) {
           Future<> last;
           for (int i = 0; i < n; ++i) last = acc->Submit(one);
           CHECK_OK(last.Await());
         }
       },
       n * kReplays},
      {"replay-one-submit",
       [&] {
         for (int rep = 0; rep < kReplays; ++rep) {
           raw.SubmitAll(raw_ones);
           raw.WaitLast();
         }
       },
       [&] {
         for (int rep = 0; rep < kReplays; ++rep) {
           Future<> last;
           for (int i = 0; i < n; ++i) last = acc->Submit(one);
           CHECK_OK(last.Await());
         }
       },
       n * kReplays},
      {"batched",
       [&] {
         raw.Submit(raw_many);
         raw.WaitLast();
       },
       [&] { CHECK_OK(acc->Submit(many).Await()); }, n},
      {"relay", [&] { raw_relay.Chain(relay_cbs, n); },
       [&] {
         Future<> prev;
         for (int k = 0; k < n; ++k) {
           Future<> waits[1] = {prev};
           prev = pair[k % 2]->Submit(pair_lists[k % 2], absl::MakeSpan(waits, k == 0 ? 0 : 1));
         }
         CHECK_OK(prev.Await());
       },
       n},
  };

  std::printf("dispatch cost on %s, %d-float kernels, median of %d runs; %s\n", acc->info().name.c_str(),
              kElements, runs, bench::MachineNote().c_str());
  std::printf("%-26s %12s %12s %8s\n", "case", "raw us/disp", "causeway", "ratio");
  bench::Report report("dispatch");
  for (size_t k = 0; k < cases.size(); ++k) {
    Case& c = cases[k];
    c.raw();  // warm up both (pipelines, recordings, staging)
    c.causeway();
    std::vector<double> raw_us, cw_us;
    // Alternate which side goes first, so neither gains from the other's
    // leftovers (a warm cache, a lavapipe thread still spinning).
    for (int r = 0; r < runs; ++r) {
      for (int side : {r % 2, 1 - r % 2}) {
        int64_t t0 = Tracer::NowNs();
        (side == 0 ? c.raw : c.causeway)();
        double us = (Tracer::NowNs() - t0) / 1e3 / c.dispatches;
        (side == 0 ? raw_us : cw_us).push_back(us);
      }
    }
    double mr = Median(raw_us), mc = Median(cw_us);
    std::printf("%-26s %12.2f %12.2f %8.2f\n", c.name.c_str(), mr, mc, mc / mr);
    report.Add("dispatch", c.name, "us/dispatch", /*higher_is_better=*/false)
        .Value(mc)
        .Baseline("raw Vulkan", mr)
        .Samples(runs)
        .Param("dispatches", c.dispatches)
        .Param("accelerators", accelerators_of[k])
        .Param("elements", kElements);
  }
  report.WriteOrDie(common.json);
  return 0;
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) { return causeway::Main(argc, argv); }
