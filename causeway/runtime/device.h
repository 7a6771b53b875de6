// A logical device (VkDevice) and what is per device: queues, extension entry
// points, the on-disk pipeline cache and the pipelines built on it.
//
// Accelerators are queues. On a GPU with several compute queues, accelerators
// share one Device; on lavapipe (one queue per VkDevice) each has its own.
#ifndef CAUSEWAY_RUNTIME_DEVICE_H_
#define CAUSEWAY_RUNTIME_DEVICE_H_

#include <vulkan/vulkan.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "causeway/runtime/instance.h"
#include "causeway/runtime/kernel.h"

namespace causeway {

// A kernel built for one device with one set of specialization values.
// Owned by its Device; immutable after creation.
struct Pipeline {
  std::shared_ptr<const Kernel> kernel;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  std::array<uint32_t, 3> local_size{};
  bool push_descriptors = false;
};

// Specialization values: constant id -> 32-bit value (floats by bit pattern).
using SpecValues = std::vector<std::pair<uint32_t, uint32_t>>;

// What keys a device's pipelines: SHA-256 over the module's digest (the
// kernel's sha256(), SHA-256 of its whole words) and every specialization
// value (`spec` sorted by id, the count first), so that no two different
// (module, values) pairs share a pipeline short of a SHA-256 collision. Made
// for every dispatch recorded: the module is hashed once, when its Kernel is
// made, not here.
using PipelineKey = std::array<uint8_t, 32>;
PipelineKey MakePipelineKey(const Kernel::Digest& module, const SpecValues& spec);

// The optional features a device made from `info` enables (every one it
// offers), as kernel admission sees them.
KernelDeviceFeatures EnabledKernelFeatures(const PhysicalDeviceInfo& info);

// The highest binding number a kernel may use. Causeway binds buffers by
// position, so a kernel needs no more numbers than buffers; a driver sizes a
// set layout by its highest number (lavapipe allocates an entry for each
// number up to it).
inline constexpr uint32_t kMaxBindingNumber = 1023;

// The most storage buffers one kernel may bind on a device made from `info`
// (its per-stage, per-set and per-stage-resource limits, and with
// `push_descriptors` the pushed set's); likewise uniform buffers.
uint32_t MaxStorageBuffersPerKernel(const PhysicalDeviceInfo& info, bool push_descriptors);
uint32_t MaxUniformBuffersPerKernel(const PhysicalDeviceInfo& info, bool push_descriptors);

// The bounds checks a device made from `info` turns on, for `causeway
// devices`: "robustBufferAccess on, robustBufferAccess2 on" (each on where
// the device offers it).
std::string RobustAccessSummary(const PhysicalDeviceInfo& info);

struct DeviceOptions {
  uint32_t queue_count = 1;
  bool use_push_descriptors = true;  // when the extension exists
  bool enable_external_memory = true;  // VK_KHR_external_memory_fd when it exists
  std::string pipeline_cache_dir;      // "" = default (see DefaultCacheDir), "-" = none
};

// Thread-safe. Outlives its accelerators, buffers and pipelines.
class Device {
 public:
  static absl::StatusOr<std::shared_ptr<Device>> Create(std::shared_ptr<Instance> instance,
                                                        const PhysicalDeviceInfo& info,
                                                        const DeviceOptions& options);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice handle() const { return device_; }
  const PhysicalDeviceInfo& info() const { return info_; }
  const DeviceCapabilities& capabilities() const { return capabilities_; }
  uint32_t queue_family() const { return queue_family_; }
  VkQueue queue(uint32_t i) const { return queues_[i]; }
  uint32_t queue_count() const { return static_cast<uint32_t>(queues_.size()); }
  // Held around every vkQueueSubmit and vkQueueWaitIdle on queue i: Vulkan
  // wants a queue's use externally synchronized, and accelerators may share
  // one (sharing "one-device" with fewer queues than accelerators).
  absl::Mutex& queue_mutex(uint32_t i) const { return *queue_mu_[i]; }
  bool push_descriptors() const { return push_descriptor_fn_ != nullptr; }
  bool external_memory() const { return get_memory_fd_fn_ != nullptr; }
  // The bounds checks this device has on (see RobustAccessSummary).
  bool robust_buffer_access() const { return robust_buffer_access_; }
  bool robust_buffer_access2() const { return robust_buffer_access2_; }
  const KernelDeviceFeatures& kernel_features() const { return kernel_features_; }

  // The pipeline for `kernel` with `spec` on this device, built at first use
  // through the pipeline cache and kept for the device's lifetime.
  // InvalidArgument when the kernel declares a capability whose feature this
  // device has not enabled (CheckKernelCapabilities), or when its workgroup
  // size or workgroup (shared) memory, after specialization, is beyond the
  // device's limits.
  absl::StatusOr<const Pipeline*> GetPipeline(const std::shared_ptr<const Kernel>& kernel,
                                              const SpecValues& spec = {});

  // Writes the pipeline cache to disk now (also done on destruction).
  absl::Status SavePipelineCache();
  const std::string& pipeline_cache_path() const { return cache_path_; }

  PFN_vkCmdPushDescriptorSetKHR push_descriptor_fn() const { return push_descriptor_fn_; }
  PFN_vkGetMemoryFdKHR get_memory_fd_fn() const { return get_memory_fd_fn_; }

  // Whether the device's timestamps can be read against CLOCK_MONOTONIC
  // (VK_EXT_calibrated_timestamps with both time domains).
  bool calibrated_timestamps() const { return get_calibrated_timestamps_fn_ != nullptr; }
  // Host CLOCK_MONOTONIC ns minus device timestamp ns, read now (the pair of
  // readings with the least deviation of three); Unimplemented without
  // calibrated_timestamps().
  absl::StatusOr<int64_t> CalibrateClock() const;

  // $CAUSEWAY_CACHE_DIR, else $XDG_CACHE_HOME/causeway, else $HOME/.cache/causeway.
  static std::string DefaultCacheDir();

 private:
  Device() = default;
  std::shared_ptr<Instance> instance_;
  PhysicalDeviceInfo info_;
  DeviceCapabilities capabilities_;
  VkDevice device_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  std::vector<VkQueue> queues_;
  std::vector<std::unique_ptr<absl::Mutex>> queue_mu_;
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  std::string cache_path_;
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_fn_ = nullptr;
  PFN_vkGetMemoryFdKHR get_memory_fd_fn_ = nullptr;
  PFN_vkGetCalibratedTimestampsEXT get_calibrated_timestamps_fn_ = nullptr;
  bool robust_buffer_access_ = false;
  bool robust_buffer_access2_ = false;
  KernelDeviceFeatures kernel_features_;

  absl::Mutex mu_;
  absl::flat_hash_map<PipelineKey, std::unique_ptr<Pipeline>> pipelines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_DEVICE_H_
