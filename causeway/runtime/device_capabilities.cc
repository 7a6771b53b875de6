#include "causeway/runtime/device_capabilities.h"

namespace causeway {

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kDiscreteGpu:
      return "discrete-gpu";
    case DeviceKind::kIntegratedGpu:
      return "integrated-gpu";
    case DeviceKind::kVirtualGpu:
      return "virtual-gpu";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kOther:
      break;
  }
  return "other";
}

std::optional<DeviceKind> DeviceKindFromValue(int64_t value) {
  if (value < static_cast<int64_t>(DeviceKind::kOther) || value > static_cast<int64_t>(DeviceKind::kCpu)) {
    return std::nullopt;
  }
  return static_cast<DeviceKind>(value);
}

}  // namespace causeway
