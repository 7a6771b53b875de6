// The one place where a VkResult becomes an absl::Status.
#ifndef CAUSEWAY_RUNTIME_VK_STATUS_H_
#define CAUSEWAY_RUNTIME_VK_STATUS_H_

#include <vulkan/vulkan.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace causeway {

// The enumerator's name, e.g. "VK_ERROR_DEVICE_LOST".
const char* VkResultName(VkResult result);

// OK for VK_SUCCESS (and the non-error codes VK_INCOMPLETE, VK_SUBOPTIMAL_KHR);
// otherwise a status whose code fits the result (out of memory becomes
// ResourceExhausted, device lost becomes Unavailable, ...) and whose message
// names `what` and the result.
absl::Status VkStatus(VkResult result, absl::string_view what);

// Live Vulkan objects that Causeway made in this process, for leak checks:
// instances, devices, buffers, device memory, semaphores, pipelines with
// their layouts, shader modules, pipeline caches and pools. Command buffers
// and descriptor sets go with their pools and are not counted.
int64_t LiveVulkanObjects();
void CountVulkanObject(int delta);  // +1 after each create, -1 at each destroy

// destroy(device, handle) and the count taken down; nothing for a null handle.
template <typename Handle>
void DestroyCounted(void(VKAPI_PTR* destroy)(VkDevice, Handle, const VkAllocationCallbacks*), VkDevice device,
                    Handle handle) {
  if (handle == VK_NULL_HANDLE) return;
  destroy(device, handle, nullptr);
  CountVulkanObject(-1);
}

}  // namespace causeway

#define CAUSEWAY_VK_RETURN_IF_ERROR(call) CAUSEWAY_RETURN_IF_ERROR(::causeway::VkStatus((call), #call))

#endif  // CAUSEWAY_RUNTIME_VK_STATUS_H_
