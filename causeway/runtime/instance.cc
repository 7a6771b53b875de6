#include "causeway/runtime/instance.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/runtime/device.h"
#include "causeway/runtime/vk_status.h"

namespace causeway {
namespace {

std::atomic<uint64_t> validation_errors{0};
std::atomic<uint64_t> suppressed_errors{0};
absl::Mutex host_semaphores_mu;
absl::flat_hash_set<uint64_t>& HostSemaphores() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_semaphores_mu) {
  static auto* set = new absl::flat_hash_set<uint64_t>();
  return *set;
}

// A report known to be wrong: see RegisterHostSignalledSemaphore. Also the
// layer's own timeout while it updates its record of a timeline semaphore
// (UNASSIGNED-VkSemaphore-state-timeout): it waits one second for its
// tracking thread and, under load, gives up even when the payload it prints
// has passed the value waited for; the message itself calls it "most likely
// a validation bug". It says nothing about the application's use of Vulkan.
bool KnownFalseReport(const VkDebugUtilsMessengerCallbackDataEXT* data) {
  if (data->pMessageIdName != nullptr &&
      std::strcmp(data->pMessageIdName, "UNASSIGNED-VkSemaphore-state-timeout") == 0) {
    return true;
  }
  if (data->pMessageIdName == nullptr ||
      std::strcmp(data->pMessageIdName, "VUID-VkSemaphoreSignalInfo-value-03259") != 0) {
    return false;
  }
  absl::MutexLock lock(&host_semaphores_mu);
  for (uint32_t i = 0; i < data->objectCount; ++i) {
    if (data->pObjects[i].objectType == VK_OBJECT_TYPE_SEMAPHORE &&
        HostSemaphores().contains(data->pObjects[i].objectHandle)) {
      return true;
    }
  }
  return false;
}
absl::Mutex last_error_mu;
std::string last_error ABSL_GUARDED_BY(last_error_mu);

VKAPI_ATTR VkBool32 VKAPI_CALL OnValidationMessage(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT && KnownFalseReport(data)) {
    suppressed_errors.fetch_add(1, std::memory_order_relaxed);
    if (EnvFlag("CAUSEWAY_VALIDATION_VERBOSE")) {
      std::fprintf(stderr, "causeway: known false validation report: %s\n",
                   data->pMessage);
    }
  } else if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    validation_errors.fetch_add(1, std::memory_order_relaxed);
    std::string text = data->pMessage != nullptr ? data->pMessage : "(no message)";
    std::fprintf(stderr, "causeway: Vulkan validation error: %s\n", text.c_str());
    absl::MutexLock lock(&last_error_mu);
    last_error = std::move(text);
  } else if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT &&
             EnvFlag("CAUSEWAY_VALIDATION_VERBOSE")) {
    std::fprintf(stderr, "causeway: Vulkan validation warning: %s\n", data->pMessage);
  }
  return VK_FALSE;
}

bool LayerAvailable(const char* name) {
  uint32_t count = 0;
  vkEnumerateInstanceLayerProperties(&count, nullptr);
  std::vector<VkLayerProperties> layers(count);
  vkEnumerateInstanceLayerProperties(&count, layers.data());
  for (const auto& l : layers) {
    if (std::strcmp(l.layerName, name) == 0) return true;
  }
  return false;
}

PhysicalDeviceInfo ReadDevice(VkPhysicalDevice pd, uint32_t index) {
  PhysicalDeviceInfo info;
  info.index = index;
  info.handle = pd;

  uint32_t ext_count = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ext_count, nullptr);
  std::vector<VkExtensionProperties> exts(ext_count);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ext_count, exts.data());
  for (const auto& e : exts) info.extensions.emplace_back(e.extensionName);

  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  driver.pNext = &subgroup;
  VkPhysicalDeviceIDProperties ids{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
  ids.pNext = &driver;
  VkPhysicalDevicePushDescriptorPropertiesKHR push{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &ids;
  if (info.HasExtension(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME)) {
    push.pNext = props.pNext;
    props.pNext = &push;
  }
  vkGetPhysicalDeviceProperties2(pd, &props);
  info.max_push_descriptors = push.maxPushDescriptors;
  info.name = props.properties.deviceName;
  info.type = props.properties.deviceType;
  info.vendor_id = props.properties.vendorID;
  info.device_id = props.properties.deviceID;
  info.api_version = props.properties.apiVersion;
  info.limits = props.properties.limits;
  std::memcpy(info.uuid.data(), ids.deviceUUID, VK_UUID_SIZE);
  info.driver_name = driver.driverName;
  info.driver_info = driver.driverInfo;
  info.subgroup_size = subgroup.subgroupSize;
  if (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) {
    info.subgroup_operations = subgroup.supportedOperations;
  }

  const bool has_robustness2 = info.HasExtension(VK_EXT_ROBUSTNESS_2_EXTENSION_NAME);
  VkPhysicalDeviceRobustness2FeaturesEXT robustness2{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  if (has_robustness2) f12.pNext = &robustness2;
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &f11;
  vkGetPhysicalDeviceFeatures2(pd, &features);
  info.timeline_semaphore = f12.timelineSemaphore;
  info.shader_float16 = f12.shaderFloat16;
  info.storage_buffer_16bit = f11.storageBuffer16BitAccess;
  info.shader_int16 = features.features.shaderInt16;
  info.shader_int64 = features.features.shaderInt64;
  info.shader_float64 = features.features.shaderFloat64;
  info.robust_buffer_access = features.features.robustBufferAccess;
  info.robust_buffer_access2 =
      has_robustness2 && robustness2.robustBufferAccess2 && info.robust_buffer_access;
  info.push_descriptor = info.HasExtension(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  info.external_memory_fd = info.HasExtension(VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME);
  info.calibrated_timestamps = info.HasExtension(VK_EXT_CALIBRATED_TIMESTAMPS_EXTENSION_NAME);

  uint32_t qf_count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qf_count, nullptr);
  std::vector<VkQueueFamilyProperties> qfs(qf_count);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qf_count, qfs.data());
  for (uint32_t i = 0; i < qf_count; ++i) {
    info.queue_families.push_back({i, qfs[i].queueFlags, qfs[i].queueCount, qfs[i].timestampValidBits});
  }

  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(pd, &mem);
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i) {
    info.heaps.push_back({mem.memoryHeaps[i].size,
                          (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  }
  for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
    info.memory_types.push_back({mem.memoryTypes[i].propertyFlags, mem.memoryTypes[i].heapIndex});
  }
  return info;
}

}  // namespace

uint64_t ValidationErrorCount() { return validation_errors.load(std::memory_order_relaxed); }
uint64_t SuppressedValidationErrorCount() { return suppressed_errors.load(std::memory_order_relaxed); }

void RegisterHostSignalledSemaphore(VkSemaphore semaphore) {
  absl::MutexLock lock(&host_semaphores_mu);
  HostSemaphores().insert(reinterpret_cast<uint64_t>(semaphore));
}

void UnregisterHostSignalledSemaphore(VkSemaphore semaphore) {
  absl::MutexLock lock(&host_semaphores_mu);
  HostSemaphores().erase(reinterpret_cast<uint64_t>(semaphore));
}

std::string LastValidationError() {
  absl::MutexLock lock(&last_error_mu);
  return last_error;
}

bool PhysicalDeviceInfo::HasExtension(absl::string_view ext) const {
  for (const auto& e : extensions) {
    if (e == ext) return true;
  }
  return false;
}

int PhysicalDeviceInfo::ComputeQueueFamily() const {
  int best = -1;
  for (const auto& qf : queue_families) {
    if ((qf.flags & VK_QUEUE_COMPUTE_BIT) == 0 || qf.queue_count == 0) continue;
    if (best < 0) best = static_cast<int>(qf.index);
    // A compute-only family (an async compute engine) usually has the most queues.
    if ((qf.flags & VK_QUEUE_GRAPHICS_BIT) == 0 &&
        queue_families[best].flags & VK_QUEUE_GRAPHICS_BIT) {
      best = static_cast<int>(qf.index);
    }
  }
  return best;
}

uint64_t PhysicalDeviceInfo::DeviceLocalHeapSize() const {
  uint64_t best = 0;
  for (const auto& h : heaps) {
    if (h.device_local && h.size > best) best = h.size;
  }
  return best;
}

std::string PhysicalDeviceInfo::UuidString() const {
  std::string s;
  for (uint8_t b : uuid) absl::StrAppendFormat(&s, "%02x", b);
  return s;
}

const char* DeviceTypeName(VkPhysicalDeviceType type) {
  return DeviceKindName(DeviceKindFromValue(type).value_or(DeviceKind::kOther));
}

DeviceCapabilities CapabilitiesOf(const PhysicalDeviceInfo& info) {
  DeviceCapabilities c;
  c.name = info.name;
  c.kind = DeviceKindFromValue(info.type).value_or(DeviceKind::kOther);
  c.subgroup_size = info.subgroup_size;
  c.max_workgroup_invocations = info.limits.maxComputeWorkGroupInvocations;
  for (int d = 0; d < 3; ++d) {
    c.max_workgroup_size[d] = info.limits.maxComputeWorkGroupSize[d];
    c.max_workgroup_count[d] = info.limits.maxComputeWorkGroupCount[d];
  }
  // With push descriptors where the device has them: the lower bound.
  c.max_storage_buffers = MaxStorageBuffersPerKernel(info, info.push_descriptor);
  return c;
}

absl::StatusOr<std::shared_ptr<Instance>> Instance::Create(const InstanceOptions& options) {
  std::shared_ptr<Instance> self(new Instance());
  self->validation_ = options.validation || EnvFlag("CAUSEWAY_VALIDATION");
  const char* kLayer = "VK_LAYER_KHRONOS_validation";
  if (self->validation_ && !LayerAvailable(kLayer)) {
    return absl::FailedPreconditionError(
        absl::StrCat("validation was asked for but ", kLayer,
                     " is not installed (Debian: vulkan-validationlayers)"));
  }

  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "causeway";
  app.pEngineName = "causeway";
  app.apiVersion = VK_API_VERSION_1_2;
  std::vector<const char*> layers;
  std::vector<const char*> extensions;
  if (self->validation_) {
    layers.push_back(kLayer);
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  }
  VkDebugUtilsMessengerCreateInfoEXT messenger_info{
      VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  messenger_info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                                   VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  messenger_info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  messenger_info.pfnUserCallback = &OnValidationMessage;

  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pApplicationInfo = &app;
  info.enabledLayerCount = static_cast<uint32_t>(layers.size());
  info.ppEnabledLayerNames = layers.data();
  info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  info.ppEnabledExtensionNames = extensions.data();
  if (self->validation_) info.pNext = &messenger_info;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateInstance(&info, nullptr, &self->instance_));
  CountVulkanObject(+1);

  if (self->validation_) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(self->instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create == nullptr) return absl::InternalError("vkCreateDebugUtilsMessengerEXT missing");
    CAUSEWAY_VK_RETURN_IF_ERROR(create(self->instance_, &messenger_info, nullptr, &self->messenger_));
  }

  uint32_t count = 0;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkEnumeratePhysicalDevices(self->instance_, &count, nullptr));
  std::vector<VkPhysicalDevice> pds(count);
  CAUSEWAY_VK_RETURN_IF_ERROR(vkEnumeratePhysicalDevices(self->instance_, &count, pds.data()));
  for (uint32_t i = 0; i < count; ++i) self->devices_.push_back(ReadDevice(pds[i], i));
  return self;
}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy != nullptr) destroy(instance_, messenger_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) {
    vkDestroyInstance(instance_, nullptr);
    CountVulkanObject(-1);
  }
}

}  // namespace causeway
