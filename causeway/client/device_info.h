// The plain Device of client.h from what the runtime knows of a physical
// device, and back (Vulkan types stay in this header, which public headers
// do not include).
#ifndef CAUSEWAY_CLIENT_DEVICE_INFO_H_
#define CAUSEWAY_CLIENT_DEVICE_INFO_H_

#include <string>

#include "absl/status/status.h"
#include "causeway/client/client.h"
#include "causeway/runtime/instance.h"

namespace causeway::client {

inline Device DeviceFrom(const PhysicalDeviceInfo& info, absl::Status health, int island, int index,
                         std::string island_name) {
  Device d;
  d.island = island;
  d.index = index;
  d.island_name = std::move(island_name);
  d.name = info.name;
  d.type = DeviceTypeName(info.type);
  d.subgroup_size = info.subgroup_size;
  d.max_workgroup_invocations = info.limits.maxComputeWorkGroupInvocations;
  for (int i = 0; i < 3; ++i) {
    d.max_workgroup_size[i] = info.limits.maxComputeWorkGroupSize[i];
    d.max_workgroup_count[i] = info.limits.maxComputeWorkGroupCount[i];
  }
  d.health = std::move(health);
  return d;
}

// What planners read of a device (causeway/kernels/ops.h: workgroup limits, subgroup
// size, kind), back from a Device: the rest is left zero.
inline PhysicalDeviceInfo InfoFrom(const Device& d) {
  PhysicalDeviceInfo info;
  info.name = d.name;
  info.type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  for (VkPhysicalDeviceType t : {VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU, VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU,
                                 VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU, VK_PHYSICAL_DEVICE_TYPE_CPU}) {
    if (d.type == DeviceTypeName(t)) info.type = t;
  }
  info.subgroup_size = d.subgroup_size;
  info.limits.maxComputeWorkGroupInvocations = d.max_workgroup_invocations;
  for (int i = 0; i < 3; ++i) {
    info.limits.maxComputeWorkGroupSize[i] = d.max_workgroup_size[i];
    info.limits.maxComputeWorkGroupCount[i] = d.max_workgroup_count[i];
  }
  return info;
}

}  // namespace causeway::client

#endif  // CAUSEWAY_CLIENT_DEVICE_INFO_H_
