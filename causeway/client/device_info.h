// A client Device from what an island knows of one of its accelerators.
#ifndef CAUSEWAY_CLIENT_DEVICE_INFO_H_
#define CAUSEWAY_CLIENT_DEVICE_INFO_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "causeway/client/client.h"
#include "causeway/runtime/device_capabilities.h"

namespace causeway::client {

inline Device DeviceFrom(DeviceCapabilities capabilities, absl::Status health, int island, int index,
                         std::string island_name) {
  Device d;
  d.island = island;
  d.index = index;
  d.island_name = std::move(island_name);
  d.capabilities = std::move(capabilities);
  d.health = std::move(health);
  return d;
}

}  // namespace causeway::client

#endif  // CAUSEWAY_CLIENT_DEVICE_INFO_H_
