// causeway devices: what Vulkan offers and what Causeway would make of it.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "causeway/runtime/device.h"
#include "causeway/runtime/memory.h"
#include "causeway/runtime/runtime.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace causeway::cli {
namespace {

std::string QueueFlags(VkQueueFlags f) {
  std::vector<std::string> parts;
  if (f & VK_QUEUE_GRAPHICS_BIT) parts.push_back("graphics");
  if (f & VK_QUEUE_COMPUTE_BIT) parts.push_back("compute");
  if (f & VK_QUEUE_TRANSFER_BIT) parts.push_back("transfer");
  return absl::StrJoin(parts, "+");
}

std::string Version(uint32_t v) {
  return absl::StrCat(VK_API_VERSION_MAJOR(v), ".", VK_API_VERSION_MINOR(v), ".", VK_API_VERSION_PATCH(v));
}

}  // namespace

// Whether the device's first device-local memory type, which device
// buffers take, is one the host can map.
bool DeviceMemoryMapped(const PhysicalDeviceInfo& device) {
  for (const PhysicalDeviceInfo::MemoryType& t : device.memory_types) {
    if (t.flags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
      return (t.flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;
  }
  return false;
}

int DevicesCommand(const std::vector<std::string>& args) {
  Flags flags(RuntimeFlagSpecs());
  if (auto done = StartCommand("devices", "usage: causeway devices [flags]\n\n", flags, args)) return *done;
  auto options = RuntimeOptionsFromFlags(flags);
  if (!options.ok()) return Fail("devices", options.status(), 2);
  auto trace = flags.StartTrace();
  if (!trace.ok()) return Fail("devices", trace.status(), 2);
  InstanceOptions io;
  io.validation = options->validation;
  auto instance = Instance::Create(io);
  if (!instance.ok()) return Fail("devices", instance.status(), 1);
  std::printf("physical devices:\n");
  for (const auto& d : (*instance)->physical_devices()) {
    const auto& l = d.limits;
    std::printf("  [%u] %s\n", d.index, d.name.c_str());
    std::printf("      type %s, vendor 0x%04x, device 0x%04x, Vulkan %s\n", DeviceTypeName(d.type), d.vendor_id,
                d.device_id, Version(d.api_version).c_str());
    std::printf("      uuid %s\n", d.UuidString().c_str());
    std::printf("      driver %s (%s)\n", d.driver_name.c_str(), d.driver_info.c_str());
    for (const auto& q : d.queue_families) {
      std::printf("      queue family %u: %u x %s, timestamp bits %u\n", q.index, q.queue_count,
                  QueueFlags(q.flags).c_str(), q.timestamp_valid_bits);
    }
    for (size_t h = 0; h < d.heaps.size(); ++h) {
      std::printf("      heap %zu: %s%s\n", h, FormatBytes(d.heaps[h].size).c_str(),
                  d.heaps[h].device_local ? " device-local" : "");
    }
    std::printf("      limits: storage binding %s, push constants %u B, shared memory %s, workgroup %u "
                "invocations (%u,%u,%u), groups (%u,%u,%u), subgroup %u, timestamp period %g ns\n",
                FormatBytes(l.maxStorageBufferRange).c_str(), l.maxPushConstantsSize,
                FormatBytes(l.maxComputeSharedMemorySize).c_str(), l.maxComputeWorkGroupInvocations,
                l.maxComputeWorkGroupSize[0], l.maxComputeWorkGroupSize[1], l.maxComputeWorkGroupSize[2],
                l.maxComputeWorkGroupCount[0], l.maxComputeWorkGroupCount[1], l.maxComputeWorkGroupCount[2],
                d.subgroup_size, l.timestampPeriod);
    std::printf("      features: timeline %s, push descriptors %s, external memory fd %s, calibrated "
                "timestamps %s, f16 %s, 16-bit storage %s\n",
                d.timeline_semaphore ? "yes" : "no", d.push_descriptor ? "yes" : "no",
                d.external_memory_fd ? "yes" : "no", d.calibrated_timestamps ? "yes" : "no",
                d.shader_float16 ? "yes" : "no", d.storage_buffer_16bit ? "yes" : "no");
  }
  auto plan = Runtime::Plan(**instance, *options);
  if (!plan.ok()) return Fail("devices", plan.status(), 1);
  std::printf("\naccelerators that would be made: %d on [%u] %s\n", plan->accelerators, plan->device->index,
              plan->device->name.c_str());
  if (plan->shared_device) {
    const uint32_t queues = plan->device->queue_families[plan->device->ComputeQueueFamily()].queue_count;
    if (queues >= static_cast<uint32_t>(plan->accelerators)) {
      std::printf("  layout: one VkDevice, a compute queue per accelerator\n");
    } else {
      std::printf("  layout: one VkDevice, its %u compute queue%s shared by %d accelerators (for testing)\n",
                  queues, queues == 1 ? "" : "s", plan->accelerators);
    }
  } else {
    std::printf("  layout: one VkDevice per accelerator\n");
  }
  std::printf("  bounds checks: %s\n", RobustAccessSummary(*plan->device).c_str());
  std::printf("  memory budget: %s each\n", FormatBytes(plan->memory_budget).c_str());
  std::printf("  ring: %u in-flight submissions each\n", plan->ring_capacity);
  std::printf("  device memory: %s\n",
              plan->discrete_memory ? "discrete (never mapped by the host: staging for every byte in or out)"
              : DeviceMemoryMapped(*plan->device)
                  ? "mapped by the host (uploads, downloads and DCN bytes go straight in and out)"
                  : "not host-visible (staging for every byte in or out)");
  std::printf("  copies between accelerators: %s\n", CopyPathName(plan->copy_path));
  if (plan->discrete_memory) {
    std::printf("  copy engine: none (it copies between mapped buffers)\n");
  } else if (plan->copy_engine_min_bytes == UINT64_MAX) {
    std::printf("  copy engine: off (CAUSEWAY_COPY_ENGINE=SIZE moves copies of SIZE or more off the queues)\n");
  } else {
    std::printf("  copy engine: copies of %s or more, where device memory is host-coherent\n",
                FormatBytes(plan->copy_engine_min_bytes).c_str());
  }
  return 0;
}

}  // namespace causeway::cli
