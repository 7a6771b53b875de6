#include "causeway/runtime/vk_status.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace causeway {
namespace {
std::atomic<int64_t> g_live_vulkan_objects{0};
}  // namespace

int64_t LiveVulkanObjects() { return g_live_vulkan_objects.load(); }
void CountVulkanObject(int delta) { g_live_vulkan_objects.fetch_add(delta, std::memory_order_relaxed); }

const char* VkResultName(VkResult result) {
  switch (result) {
#define CASE(x) \
  case x:       \
    return #x
    CASE(VK_SUCCESS);
    CASE(VK_NOT_READY);
    CASE(VK_TIMEOUT);
    CASE(VK_EVENT_SET);
    CASE(VK_EVENT_RESET);
    CASE(VK_INCOMPLETE);
    CASE(VK_ERROR_OUT_OF_HOST_MEMORY);
    CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY);
    CASE(VK_ERROR_INITIALIZATION_FAILED);
    CASE(VK_ERROR_DEVICE_LOST);
    CASE(VK_ERROR_MEMORY_MAP_FAILED);
    CASE(VK_ERROR_LAYER_NOT_PRESENT);
    CASE(VK_ERROR_EXTENSION_NOT_PRESENT);
    CASE(VK_ERROR_FEATURE_NOT_PRESENT);
    CASE(VK_ERROR_INCOMPATIBLE_DRIVER);
    CASE(VK_ERROR_TOO_MANY_OBJECTS);
    CASE(VK_ERROR_FORMAT_NOT_SUPPORTED);
    CASE(VK_ERROR_FRAGMENTED_POOL);
    CASE(VK_ERROR_UNKNOWN);
    CASE(VK_ERROR_OUT_OF_POOL_MEMORY);
    CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE);
    CASE(VK_ERROR_FRAGMENTATION);
    CASE(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS);
    CASE(VK_PIPELINE_COMPILE_REQUIRED);
    CASE(VK_ERROR_INVALID_SHADER_NV);
#undef CASE
    default:
      return "VK_RESULT_UNKNOWN";
  }
}

absl::Status VkStatus(VkResult result, absl::string_view what) {
  if (result >= 0) return absl::OkStatus();
  std::string message = absl::StrCat(what, " failed: ", VkResultName(result));
  switch (result) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_TOO_MANY_OBJECTS:
    case VK_ERROR_FRAGMENTED_POOL:
    case VK_ERROR_FRAGMENTATION:
      return absl::ResourceExhaustedError(message);
    case VK_ERROR_DEVICE_LOST:
      return absl::UnavailableError(message);
    case VK_ERROR_LAYER_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_INCOMPATIBLE_DRIVER:
    case VK_ERROR_FORMAT_NOT_SUPPORTED:
      return absl::FailedPreconditionError(message);
    case VK_ERROR_INVALID_EXTERNAL_HANDLE:
    case VK_ERROR_INVALID_SHADER_NV:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace causeway
