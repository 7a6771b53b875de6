#include "causeway/runtime/device.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/runtime/vk_status.h"

namespace causeway {
namespace {

// Reads a pipeline cache file, keeping it only if its header names this device
// (drivers check too, but these bytes come from disk and are not trusted).
std::vector<char> ReadCacheFile(const std::string& path, const PhysicalDeviceInfo& info,
                                const uint8_t cache_uuid[VK_UUID_SIZE]) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  VkPipelineCacheHeaderVersionOne header;
  if (data.size() < sizeof(header)) return {};
  std::memcpy(&header, data.data(), sizeof(header));
  if (header.headerSize < sizeof(header) || header.headerSize > data.size() ||
      header.headerVersion != VK_PIPELINE_CACHE_HEADER_VERSION_ONE ||
      header.vendorID != info.vendor_id || header.deviceID != info.device_id ||
      std::memcmp(header.pipelineCacheUUID, cache_uuid, VK_UUID_SIZE) != 0) {
    return {};
  }
  return data;
}

void AppendWord(std::string* bytes, uint32_t word) {
  for (int byte = 0; byte < 4; ++byte) bytes->push_back(static_cast<char>((word >> (8 * byte)) & 0xFF));
}

}  // namespace

PipelineKey MakePipelineKey(const Kernel::Digest& module, const SpecValues& spec) {
  std::string bytes(module.begin(), module.end());
  bytes.reserve(bytes.size() + 4 + spec.size() * 8);
  // Little-endian, the count first.
  AppendWord(&bytes, static_cast<uint32_t>(spec.size()));
  for (const auto& [id, value] : spec) {
    AppendWord(&bytes, id);
    AppendWord(&bytes, value);
  }
  return Sha256(bytes);
}

KernelDeviceFeatures EnabledKernelFeatures(const PhysicalDeviceInfo& info) {
  KernelDeviceFeatures f;
  f.shader_float16 = info.shader_float16;
  f.shader_int16 = info.shader_int16;
  f.shader_int64 = info.shader_int64;
  f.shader_float64 = info.shader_float64;
  f.storage_buffer_16bit = info.storage_buffer_16bit;
  f.subgroup_operations = info.subgroup_operations;
  return f;
}

namespace {

// The most bindings of one kind a kernel's single set may hold, `per_stage`
// and `per_set` being that kind's limits.
uint32_t BindingLimit(const PhysicalDeviceInfo& info, bool push_descriptors, uint32_t per_stage,
                      uint32_t per_set) {
  uint32_t limit = std::min({per_stage, per_set, info.limits.maxPerStageResources});
  if (push_descriptors) limit = std::min(limit, info.max_push_descriptors);
  return limit;
}

}  // namespace

uint32_t MaxStorageBuffersPerKernel(const PhysicalDeviceInfo& info, bool push_descriptors) {
  return BindingLimit(info, push_descriptors, info.limits.maxPerStageDescriptorStorageBuffers,
                      info.limits.maxDescriptorSetStorageBuffers);
}

uint32_t MaxUniformBuffersPerKernel(const PhysicalDeviceInfo& info, bool push_descriptors) {
  return BindingLimit(info, push_descriptors, info.limits.maxPerStageDescriptorUniformBuffers,
                      info.limits.maxDescriptorSetUniformBuffers);
}

std::string RobustAccessSummary(const PhysicalDeviceInfo& info) {
  return absl::StrCat("robustBufferAccess ", info.robust_buffer_access ? "on" : "off (not offered)",
                      ", robustBufferAccess2 ", info.robust_buffer_access2 ? "on" : "off (not offered)");
}

absl::StatusOr<int64_t> Device::CalibrateClock() const {
  if (get_calibrated_timestamps_fn_ == nullptr) {
    return absl::UnimplementedError(absl::StrCat("device '", info_.name, "' has no calibrated timestamps"));
  }
  VkCalibratedTimestampInfoEXT infos[2] = {{VK_STRUCTURE_TYPE_CALIBRATED_TIMESTAMP_INFO_EXT},
                                           {VK_STRUCTURE_TYPE_CALIBRATED_TIMESTAMP_INFO_EXT}};
  infos[0].timeDomain = VK_TIME_DOMAIN_DEVICE_EXT;
  infos[1].timeDomain = VK_TIME_DOMAIN_CLOCK_MONOTONIC_EXT;
  const double period = info_.limits.timestampPeriod;
  uint64_t best_deviation = UINT64_MAX;
  int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    uint64_t stamps[2], deviation = 0;
    CAUSEWAY_VK_RETURN_IF_ERROR(get_calibrated_timestamps_fn_(device_, 2, infos, stamps, &deviation));
    if (deviation < best_deviation) {
      best_deviation = deviation;
      offset = static_cast<int64_t>(stamps[1]) - static_cast<int64_t>(static_cast<double>(stamps[0]) * period);
    }
  }
  return offset;
}

std::string Device::DefaultCacheDir() {
  if (std::string d = EnvString("CAUSEWAY_CACHE_DIR"); !d.empty()) return d;
  if (std::string x = EnvString("XDG_CACHE_HOME"); !x.empty()) {
    return absl::StrCat(x, "/causeway");
  }
  if (std::string h = EnvString("HOME"); !h.empty()) {
    return absl::StrCat(h, "/.cache/causeway");
  }
  return "";
}

absl::StatusOr<std::shared_ptr<Device>> Device::Create(std::shared_ptr<Instance> instance,
                                                       const PhysicalDeviceInfo& info,
                                                       const DeviceOptions& options) {
  std::shared_ptr<Device> self(new Device());
  self->instance_ = std::move(instance);
  self->info_ = info;
  self->capabilities_ = CapabilitiesOf(info);
  if (!info.timeline_semaphore) {
    return absl::FailedPreconditionError(
        absl::StrCat("device '", info.name, "' has no timeline semaphores (Vulkan 1.2 needed)"));
  }
  int family = info.ComputeQueueFamily();
  if (family < 0) {
    return absl::FailedPreconditionError(absl::StrCat("device '", info.name, "' has no compute queue"));
  }
  self->queue_family_ = static_cast<uint32_t>(family);
  const auto& qf = info.queue_families[family];
  if (options.queue_count == 0 || options.queue_count > qf.queue_count) {
    return absl::InvalidArgumentError(absl::StrCat("device '", info.name, "' queue family ", family,
                                                   " has ", qf.queue_count, " queues, asked for ",
                                                   options.queue_count));
  }

  std::vector<float> priorities(options.queue_count, 1.0f);
  VkDeviceQueueCreateInfo queue_info{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue_info.queueFamilyIndex = self->queue_family_;
  queue_info.queueCount = options.queue_count;
  queue_info.pQueuePriorities = priorities.data();

  std::vector<const char*> extensions;
  bool push = options.use_push_descriptors && info.push_descriptor;
  bool external = options.enable_external_memory && info.external_memory_fd;
  if (push) extensions.push_back(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  // Calibrated timestamps need both the device's and the host's monotonic
  // time domain.
  bool calibrated = false;
  if (info.calibrated_timestamps) {
    auto domains_fn = reinterpret_cast<PFN_vkGetPhysicalDeviceCalibrateableTimeDomainsEXT>(
        vkGetInstanceProcAddr(self->instance_->handle(), "vkGetPhysicalDeviceCalibrateableTimeDomainsEXT"));
    uint32_t count = 0;
    if (domains_fn != nullptr && domains_fn(info.handle, &count, nullptr) == VK_SUCCESS) {
      std::vector<VkTimeDomainEXT> domains(count);
      if (domains_fn(info.handle, &count, domains.data()) == VK_SUCCESS) {
        domains.resize(count);
        auto has = [&](VkTimeDomainEXT d) { return std::find(domains.begin(), domains.end(), d) != domains.end(); };
        calibrated = has(VK_TIME_DOMAIN_DEVICE_EXT) && has(VK_TIME_DOMAIN_CLOCK_MONOTONIC_EXT);
      }
    }
  }
  if (calibrated) extensions.push_back(VK_EXT_CALIBRATED_TIMESTAMPS_EXTENSION_NAME);
  if (external) {
    extensions.push_back(VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME);
  }
  // Bounds checks on every access through a binding, wherever offered: a
  // kernel indexing past its buffer reads zeros (or buffer contents) instead
  // of another tenant's memory.
  if (info.robust_buffer_access2) extensions.push_back(VK_EXT_ROBUSTNESS_2_EXTENSION_NAME);

  VkPhysicalDeviceRobustness2FeaturesEXT robustness2{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT};
  robustness2.robustBufferAccess2 = VK_TRUE;
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  f12.timelineSemaphore = VK_TRUE;
  f12.shaderFloat16 = info.shader_float16;
  f12.hostQueryReset = VK_TRUE;
  if (info.robust_buffer_access2) f12.pNext = &robustness2;
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.storageBuffer16BitAccess = info.storage_buffer_16bit;
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &f11;
  features.features.robustBufferAccess = info.robust_buffer_access;
  features.features.shaderInt16 = info.shader_int16;
  features.features.shaderInt64 = info.shader_int64;
  features.features.shaderFloat64 = info.shader_float64;

  VkDeviceCreateInfo create{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  create.pNext = &features;
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue_info;
  create.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  create.ppEnabledExtensionNames = extensions.data();
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateDevice(info.handle, &create, nullptr, &self->device_));
  CountVulkanObject(+1);
  self->robust_buffer_access_ = info.robust_buffer_access;
  self->robust_buffer_access2_ = info.robust_buffer_access2;
  self->kernel_features_ = EnabledKernelFeatures(info);

  for (uint32_t i = 0; i < options.queue_count; ++i) {
    VkQueue q;
    vkGetDeviceQueue(self->device_, self->queue_family_, i, &q);
    self->queues_.push_back(q);
    self->queue_mu_.push_back(std::make_unique<absl::Mutex>());
  }
  if (push) {
    self->push_descriptor_fn_ = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
        vkGetDeviceProcAddr(self->device_, "vkCmdPushDescriptorSetKHR"));
  }
  if (external) {
    self->get_memory_fd_fn_ = reinterpret_cast<PFN_vkGetMemoryFdKHR>(
        vkGetDeviceProcAddr(self->device_, "vkGetMemoryFdKHR"));
  }
  if (calibrated) {
    self->get_calibrated_timestamps_fn_ = reinterpret_cast<PFN_vkGetCalibratedTimestampsEXT>(
        vkGetDeviceProcAddr(self->device_, "vkGetCalibratedTimestampsEXT"));
  }

  // The pipeline cache, kept on disk per physical device and driver.
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(info.handle, &props);
  std::string dir = options.pipeline_cache_dir.empty() ? DefaultCacheDir() : options.pipeline_cache_dir;
  std::vector<char> initial;
  if (!dir.empty() && dir != "-") {
    std::string uuid;
    for (uint8_t b : props.pipelineCacheUUID) absl::StrAppend(&uuid, absl::Hex(b, absl::kZeroPad2));
    self->cache_path_ = absl::StrCat(dir, "/pipelines-", uuid, ".bin");
    initial = ReadCacheFile(self->cache_path_, info, props.pipelineCacheUUID);
  }
  VkPipelineCacheCreateInfo cache_info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  cache_info.initialDataSize = initial.size();
  cache_info.pInitialData = initial.empty() ? nullptr : initial.data();
  if (vkCreatePipelineCache(self->device_, &cache_info, nullptr, &self->pipeline_cache_) != VK_SUCCESS) {
    // A cache the driver rejects is not fatal: start empty.
    cache_info.initialDataSize = 0;
    cache_info.pInitialData = nullptr;
    CAUSEWAY_VK_RETURN_IF_ERROR(
        vkCreatePipelineCache(self->device_, &cache_info, nullptr, &self->pipeline_cache_));
  }
  CountVulkanObject(+1);
  return self;
}

absl::Status Device::SavePipelineCache() {
  if (cache_path_.empty() || pipeline_cache_ == VK_NULL_HANDLE) return absl::OkStatus();
  size_t size = 0;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkGetPipelineCacheData(device_, pipeline_cache_, &size, nullptr));
  std::vector<char> data(size);
  CAUSEWAY_VK_RETURN_IF_ERROR(vkGetPipelineCacheData(device_, pipeline_cache_, &size, data.data()));
  std::error_code ec;
  std::filesystem::path path(cache_path_);
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", path.parent_path().string(), ": ", ec.message()));
  // Write beside and rename, so a reader never sees half a file.
  std::string tmp = absl::StrCat(cache_path_, ".", getpid(), ".", reinterpret_cast<uintptr_t>(this), ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(size));
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat("cannot rename to ", cache_path_));
  }
  return absl::OkStatus();
}

absl::StatusOr<const Pipeline*> Device::GetPipeline(const std::shared_ptr<const Kernel>& kernel,
                                                    const SpecValues& spec_in) {
  SpecValues spec = spec_in;
  std::sort(spec.begin(), spec.end());
  PipelineKey key = MakePipelineKey(kernel->sha256(), spec);
  absl::MutexLock lock(&mu_);
  if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second.get();

  if (absl::Status s = CheckKernelCapabilities(kernel->capabilities(), kernel_features_); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel '", kernel->name(), "' on device '", info_.name, "': ", s.message()));
  }
  const KernelReflection& r = kernel->reflection();
  for (const auto& [id, value] : spec) {
    bool known = false;
    for (const auto& sc : r.spec_constants) known |= sc.id == id;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel->name(),
                                                     "' has no specialization constant ", id));
    }
  }
  std::vector<VkDescriptorSetLayoutBinding> bindings;
  uint32_t storage_buffers = 0, uniform_buffers = 0;
  for (const auto& b : r.bindings) {
    if (b.set != 0) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel->name(), "' binding ", b.binding,
                                                     " is in descriptor set ", b.set,
                                                     "; Causeway binds set 0 only"));
    }
    // A driver sizes the layout by the highest number (lavapipe crashed on
    // 2^32 - 1 and ran out of host memory on 2^31 - 1).
    if (b.binding > kMaxBindingNumber) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel->name(), "' uses binding ", b.binding,
                                                     "; binding numbers are at most ", kMaxBindingNumber));
    }
    ++(b.kind == BindingKind::kUniformBuffer ? uniform_buffers : storage_buffers);
    VkDescriptorSetLayoutBinding lb{};
    lb.binding = b.binding;
    lb.descriptorType = b.kind == BindingKind::kUniformBuffer ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
                                                              : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    lb.descriptorCount = 1;
    lb.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    bindings.push_back(lb);
  }
  // Beyond these limits the layout is invalid usage, which a driver may
  // crash on.
  const bool push = push_descriptors();
  for (const auto& [count, limit, what] :
       {std::tuple{storage_buffers, MaxStorageBuffersPerKernel(info_, push), "storage buffers"},
        std::tuple{uniform_buffers, MaxUniformBuffersPerKernel(info_, push), "uniform buffers"},
        std::tuple{storage_buffers + uniform_buffers,
                   push ? std::min(info_.limits.maxPerStageResources, info_.max_push_descriptors)
                        : info_.limits.maxPerStageResources,
                   "buffers"}}) {
    if (count > limit) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel->name(), "' binds ", count, " ", what,
                                                     "; device '", info_.name,
                                                     "' lets a kernel bind at most ", limit));
    }
  }
  if (r.push_constant_size > info_.limits.maxPushConstantsSize) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel->name(), "' needs ", r.push_constant_size,
                                                   " bytes of push constants; the device allows ",
                                                   info_.limits.maxPushConstantsSize));
  }

  auto p = std::make_unique<Pipeline>();
  p->kernel = kernel;
  p->push_descriptors = push_descriptors();
  absl::flat_hash_map<uint32_t, uint32_t> spec_map(spec.begin(), spec.end());
  p->local_size = ResolveLocalSize(r, spec_map);
  // Beyond the limit a pipeline is invalid usage: lavapipe gives every
  // thread the memory asked (a tenant could take the island's), another
  // driver may fail or crash.
  if (const uint64_t shared = ResolveSharedMemory(r, spec_map);
      shared > info_.limits.maxComputeSharedMemorySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel '", kernel->name(),
                     "': ", shared == UINT64_MAX ? std::string("more than 2^64") : absl::StrCat(shared),
                     " bytes of workgroup (shared) memory on device '", info_.name,
                     "', which allows at most ", info_.limits.maxComputeSharedMemorySize));
  }
  {
    // Vulkan leaves a pipeline beyond the device's workgroup limits
    // undefined; Function::Create's bound (1024) is below no device's
    // invocations limit but above some devices' z size (64).
    const std::array<uint32_t, 3>& local = p->local_size;
    const VkPhysicalDeviceLimits& limits = info_.limits;
    bool fits = true;
    for (int d = 0; d < 3; ++d) fits &= local[d] >= 1 && local[d] <= limits.maxComputeWorkGroupSize[d];
    // Each dimension is at most 2^32 - 1: the product fits in 128 bits, not
    // 64, so it is taken only once each dimension is within the device's.
    if (!fits || uint64_t{local[0]} * local[1] * local[2] > limits.maxComputeWorkGroupInvocations) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kernel '", kernel->name(), "': workgroup size ", local[0], "x", local[1], "x", local[2],
          " on device '", info_.name, "', which allows at most ", limits.maxComputeWorkGroupSize[0], "x",
          limits.maxComputeWorkGroupSize[1], "x", limits.maxComputeWorkGroupSize[2], " and ",
          limits.maxComputeWorkGroupInvocations, " invocations"));
    }
  }
  VkShaderModule module = VK_NULL_HANDLE;
  // Everything made below is destroyed on an error path.
  auto cleanup = absl::MakeCleanup([&] {
    DestroyCounted(vkDestroyShaderModule, device_, module);
    if (p == nullptr) return;
    DestroyCounted(vkDestroyPipeline, device_, p->pipeline);
    DestroyCounted(vkDestroyPipelineLayout, device_, p->layout);
    DestroyCounted(vkDestroyDescriptorSetLayout, device_, p->set_layout);
  });

  VkDescriptorSetLayoutCreateInfo set_info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  if (p->push_descriptors) set_info.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  set_info.bindingCount = static_cast<uint32_t>(bindings.size());
  set_info.pBindings = bindings.data();
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateDescriptorSetLayout(device_, &set_info, nullptr, &p->set_layout));
  CountVulkanObject(+1);

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, r.push_constant_size};
  VkPipelineLayoutCreateInfo layout_info{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout_info.setLayoutCount = 1;
  layout_info.pSetLayouts = &p->set_layout;
  layout_info.pushConstantRangeCount = r.push_constant_size > 0 ? 1 : 0;
  layout_info.pPushConstantRanges = &range;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreatePipelineLayout(device_, &layout_info, nullptr, &p->layout));
  CountVulkanObject(+1);

  VkShaderModuleCreateInfo module_info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  module_info.codeSize = kernel->spirv().size() * sizeof(uint32_t);
  module_info.pCode = kernel->spirv().data();
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateShaderModule(device_, &module_info, nullptr, &module));
  CountVulkanObject(+1);

  std::vector<VkSpecializationMapEntry> entries;
  std::vector<uint32_t> values;
  for (const auto& [id, value] : spec) {
    entries.push_back({id, static_cast<uint32_t>(values.size() * 4), 4});
    values.push_back(value);
  }
  VkSpecializationInfo spec_info{static_cast<uint32_t>(entries.size()), entries.data(),
                                 values.size() * 4, values.data()};
  VkComputePipelineCreateInfo pipe_info{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  pipe_info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  pipe_info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  pipe_info.stage.module = module;
  pipe_info.stage.pName = r.entry_point.c_str();
  pipe_info.stage.pSpecializationInfo = entries.empty() ? nullptr : &spec_info;
  pipe_info.layout = p->layout;
  CAUSEWAY_VK_RETURN_IF_ERROR(
      vkCreateComputePipelines(device_, pipeline_cache_, 1, &pipe_info, nullptr, &p->pipeline));
  CountVulkanObject(+1);

  const Pipeline* result = p.get();
  pipelines_.emplace(key, std::move(p));  // p is null now: cleanup keeps the objects
  return result;
}

Device::~Device() {
  if (device_ == VK_NULL_HANDLE) return;
  vkDeviceWaitIdle(device_);
  (void)SavePipelineCache();
  for (auto& [key, p] : pipelines_) {
    DestroyCounted(vkDestroyPipeline, device_, p->pipeline);
    DestroyCounted(vkDestroyPipelineLayout, device_, p->layout);
    DestroyCounted(vkDestroyDescriptorSetLayout, device_, p->set_layout);
  }
  DestroyCounted(vkDestroyPipelineCache, device_, pipeline_cache_);
  vkDestroyDevice(device_, nullptr);
  CountVulkanObject(-1);
}

}  // namespace causeway
