// The Vulkan instance and what it can see: physical devices and their limits.
#ifndef CAUSEWAY_RUNTIME_INSTANCE_H_
#define CAUSEWAY_RUNTIME_INSTANCE_H_

#include <vulkan/vulkan.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "causeway/runtime/device_capabilities.h"

namespace causeway {

// What Causeway needs to know of a physical device, read once at start.
struct PhysicalDeviceInfo {
  struct QueueFamily {
    uint32_t index = 0;
    VkQueueFlags flags = 0;
    uint32_t queue_count = 0;
    uint32_t timestamp_valid_bits = 0;
  };
  struct MemoryHeap {
    uint64_t size = 0;
    bool device_local = false;
  };
  struct MemoryType {
    VkMemoryPropertyFlags flags = 0;
    uint32_t heap = 0;
  };

  uint32_t index = 0;  // position in vkEnumeratePhysicalDevices
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  uint32_t api_version = 0;
  std::array<uint8_t, VK_UUID_SIZE> uuid{};  // deviceUUID: equal UUIDs = one device
  std::string driver_name;
  std::string driver_info;
  VkPhysicalDeviceLimits limits{};
  uint32_t subgroup_size = 0;
  std::vector<QueueFamily> queue_families;
  std::vector<MemoryHeap> heaps;
  std::vector<MemoryType> memory_types;
  std::vector<std::string> extensions;

  // Features and extensions Causeway uses.
  bool timeline_semaphore = false;
  bool push_descriptor = false;
  uint32_t max_push_descriptors = 0;  // bindings of a pushed set (VK_KHR_push_descriptor)
  bool external_memory_fd = false;
  bool calibrated_timestamps = false;
  bool shader_float16 = false;
  bool storage_buffer_16bit = false;
  bool shader_int16 = false;
  bool shader_int64 = false;
  bool shader_float64 = false;
  // VkSubgroupFeatureFlags supported in compute shaders (0 when the compute
  // stage has no subgroup operations).
  uint32_t subgroup_operations = 0;
  // Bounds checks the device offers: robustBufferAccess (core), and
  // VK_EXT_robustness2's robustBufferAccess2 (tighter: out-of-bounds reads
  // give zero, writes are dropped, against the exact bound range).
  bool robust_buffer_access = false;
  bool robust_buffer_access2 = false;

  bool HasExtension(absl::string_view name) const;
  // The first queue family with compute, preferring one without graphics.
  int ComputeQueueFamily() const;
  // Size of the largest device-local heap.
  uint64_t DeviceLocalHeapSize() const;
  std::string UuidString() const;  // 32 lowercase hex digits
};

const char* DeviceTypeName(VkPhysicalDeviceType type);  // "discrete-gpu", "cpu", ... (DeviceKindName)
// The plain description of `info` that planners, clients and the wire use.
DeviceCapabilities CapabilitiesOf(const PhysicalDeviceInfo& info);

struct InstanceOptions {
  // Turns on VK_LAYER_KHRONOS_validation (also CAUSEWAY_VALIDATION=1). It is an
  // error to ask for it when the layer is not installed.
  bool validation = false;
};

// Owns the VkInstance (and the validation messenger). Thread-safe after
// creation; outlives every device made from it.
class Instance {
 public:
  static absl::StatusOr<std::shared_ptr<Instance>> Create(const InstanceOptions& options);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  bool validation() const { return validation_; }
  const std::vector<PhysicalDeviceInfo>& physical_devices() const { return devices_; }

 private:
  Instance() = default;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  bool validation_ = false;
  std::vector<PhysicalDeviceInfo> devices_;
};

// Validation messages of error severity seen by any instance of this process,
// and the last one's text. The test suite fails a test that raises this count.
uint64_t ValidationErrorCount();
std::string LastValidationError();
// Timeline semaphores that only the host signals (relays, host gates). The
// validation layers of Debian 12 (1.3.239) sometimes report
// VUID-VkSemaphoreSignalInfo-value-03259 ("less than any pending signal
// operation") for such a semaphore when other threads submit waits on it
// meanwhile: no queue ever signals it, so there is no pending signal
// operation; the layer's tracking of host signals races. Those reports are
// counted apart (SuppressedValidationErrorCount), not as errors; any other
// report, and this one on any other semaphore, still is an error.
void RegisterHostSignalledSemaphore(VkSemaphore semaphore);
void UnregisterHostSignalledSemaphore(VkSemaphore semaphore);
uint64_t SuppressedValidationErrorCount();

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_INSTANCE_H_
