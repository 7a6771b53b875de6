// What planners, clients and the wire know of an accelerator: its kind,
// subgroup size and compute limits, in plain types (no Vulkan), so that
// public headers above the runtime (kernel plans, models, the client, the
// controller) carry none. The runtime fills it from the physical device
// (CapabilitiesOf in causeway/runtime/instance.h); a controller, from an
// island's description.
#ifndef CAUSEWAY_RUNTIME_DEVICE_CAPABILITIES_H_
#define CAUSEWAY_RUNTIME_DEVICE_CAPABILITIES_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace causeway {

// The kind of device. The values are VkPhysicalDeviceType's, which is what
// the wire carries.
enum class DeviceKind : int32_t {
  kOther = 0,
  kIntegratedGpu = 1,
  kDiscreteGpu = 2,
  kVirtualGpu = 3,
  kCpu = 4,
};

// "other", "integrated-gpu", "discrete-gpu", "virtual-gpu" or "cpu".
const char* DeviceKindName(DeviceKind kind);
// The kind a wire value names; nullopt for a value no kind has.
std::optional<DeviceKind> DeviceKindFromValue(int64_t value);

struct DeviceCapabilities {
  std::string name;  // the driver's device name, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
  DeviceKind kind = DeviceKind::kOther;
  uint32_t subgroup_size = 0;  // 0: unknown
  uint32_t max_workgroup_invocations = 0;
  std::array<uint32_t, 3> max_workgroup_size{};
  std::array<uint32_t, 3> max_workgroup_count{};
  // Storage buffers one kernel may bind (0: unknown, as from an island
  // that does not say).
  uint32_t max_storage_buffers = 0;

  friend bool operator==(const DeviceCapabilities&, const DeviceCapabilities&) = default;
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_DEVICE_CAPABILITIES_H_
