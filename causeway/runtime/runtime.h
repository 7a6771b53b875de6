// The entry point: a Vulkan instance and the accelerators made from it.
//
// Example:
//   RuntimeOptions options;
//   options.accelerators = 4;
//   CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Create(options));
//   Accelerator* a = rt->accelerator(0);
//   CAUSEWAY_ASSIGN_OR_RETURN(auto x, a->CreateBuffer(1 << 20));
//
// Settings come from RuntimeOptions; a field left at its default takes the
// environment variable named beside it, then the built-in default.
#ifndef CAUSEWAY_RUNTIME_RUNTIME_H_
#define CAUSEWAY_RUNTIME_RUNTIME_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/device.h"
#include "causeway/runtime/instance.h"
#include "causeway/runtime/watchdog.h"

namespace causeway {

struct RuntimeOptions {
  // How many accelerators (CAUSEWAY_ACCELERATORS; default 1).
  int accelerators = 0;
  // Which physical device (CAUSEWAY_DEVICE; default "auto"): "auto" (a discrete
  // GPU, else integrated, virtual, then a CPU driver), a type ("gpu",
  // "discrete", "integrated", "virtual", "cpu"), an index ("1"), or a
  // deviceUUID as 32 hex digits (dashes allowed).
  std::string device;
  // Device-buffer budget per accelerator (CAUSEWAY_MEMORY_BUDGET, e.g.
  // "512MiB"; default: the device-local heap divided among the accelerators).
  uint64_t memory_budget = 0;
  // In-flight submissions per accelerator (CAUSEWAY_RING_SLOTS; default 64).
  uint32_t ring_capacity = 0;
  // VK_LAYER_KHRONOS_validation (also CAUSEWAY_VALIDATION=1).
  bool validation = false;
  // "devices" (and "auto"): one VkDevice per accelerator. "queues": one
  // VkDevice, a compute queue of its own per accelerator (fails where the
  // device has fewer queues than accelerators). "one-device": one VkDevice,
  // its queues shared round-robin where it has fewer than accelerators; queues
  // then wait on each other's timelines directly, as "queues" does on a GPU,
  // which is how CI tests those waits on lavapipe's single queue. Accelerators
  // that share a queue are not independent (one waiting on the host holds the
  // other), so this is for testing. "auto" (or empty) takes CAUSEWAY_SHARING
  // when it is set, else "devices".
  std::string sharing = "auto";
  // Copies between accelerators of at least this many bytes a device go by
  // the destination's copy engine, off its queue, where device memory is
  // host-coherent (CAUSEWAY_COPY_ENGINE: a size such as "4MiB", or "off";
  // default 4 MiB on GPUs, off on CPU drivers, where the engine and the
  // kernels share the same cores).
  std::string copy_engine;
  // How accelerators treat their device memory (empty: CAUSEWAY_DEVICE_MEMORY,
  // else "auto"): "auto" as the driver reports it: mapped by the host where it
  // is host-visible (lavapipe, unified-memory GPUs), so uploads, downloads
  // and DCN bytes go straight in and out of it. "discrete": never mapped,
  // even where it could be; every upload, download, DCN send and receive
  // goes through staging buffers and device copies, exactly as on a
  // discrete GPU, so that those paths run (and are tested) on a CPU driver.
  // There is no copy engine then (it copies between mapped buffers).
  std::string device_memory;
  bool use_push_descriptors = true;   // off: descriptor sets
  bool use_external_memory = true;    // off: copies between VkDevices go through the host
  std::string pipeline_cache_dir;     // see DeviceOptions
  // The watchdog (watchdog.h): a line on stderr and in the trace for each
  // accelerator that has had work in flight and finished nothing for this
  // long. Infinite: no watchdog.
  absl::Duration watchdog = absl::Seconds(10);
};

// What Create would make, without making it: for `causeway devices`.
struct RuntimePlan {
  const PhysicalDeviceInfo* device = nullptr;
  int accelerators = 0;
  bool shared_device = false;  // queues of one VkDevice
  uint64_t memory_budget = 0;
  uint32_t ring_capacity = 0;
  CopyPath copy_path = CopyPath::kSameQueue;  // between two accelerators
  uint64_t copy_engine_min_bytes = UINT64_MAX;  // UINT64_MAX: off
  bool discrete_memory = false;                 // device memory never mapped (RuntimeOptions::device_memory)
};

// Thread-safe. Destroying it waits for in-flight work (bounded) and frees all.
class Runtime {
 public:
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const RuntimeOptions& options = {});
  // Resolves options against the environment and the devices of `instance`.
  static absl::StatusOr<RuntimePlan> Plan(const Instance& instance, const RuntimeOptions& options);
  ~Runtime();

  size_t size() const { return accelerators_.size(); }
  Accelerator* accelerator(size_t i) const { return accelerators_[i].get(); }
  std::vector<Accelerator*> accelerators() const;
  const Instance& instance() const { return *instance_; }
  const RuntimePlan& plan() const { return plan_; }

 private:
  Runtime() = default;
  std::shared_ptr<Instance> instance_;
  RuntimePlan plan_;
  std::vector<std::unique_ptr<Accelerator>> accelerators_;
  std::unique_ptr<Watchdog> watchdog_;  // over accelerators_; goes first
};

// Picks a physical device by selector (see RuntimeOptions::device).
absl::StatusOr<const PhysicalDeviceInfo*> SelectPhysicalDevice(const std::vector<PhysicalDeviceInfo>& devices,
                                                               const std::string& selector);

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_RUNTIME_H_
