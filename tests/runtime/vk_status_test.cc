// The one VkResult-to-Status converter (causeway/runtime/vk_status.h): which results
// are errors, the code each error becomes, the message it carries, and the
// live-object count that DestroyCounted keeps.
#include "causeway/runtime/vk_status.h"

#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "causeway/base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

// Tests that the results Vulkan does not count as errors (>= 0) are OK.
TEST(VkStatusTest, NonErrorResultsAreOk) {
  for (VkResult result : {VK_SUCCESS, VK_NOT_READY, VK_TIMEOUT, VK_EVENT_SET, VK_EVENT_RESET, VK_INCOMPLETE,
                          VK_SUBOPTIMAL_KHR}) {
    EXPECT_OK(VkStatus(result, "vkSomething"));
  }
}

// Tests that each error result becomes the status code that fits it, with a
// message naming what failed and the result's enumerator.
TEST(VkStatusTest, ErrorsMapToCodesAndNameTheResult) {
  struct Case {
    VkResult result;
    absl::StatusCode code;
    const char* name;
  };
  const Case cases[] = {
      {VK_ERROR_OUT_OF_HOST_MEMORY, absl::StatusCode::kResourceExhausted, "VK_ERROR_OUT_OF_HOST_MEMORY"},
      {VK_ERROR_OUT_OF_DEVICE_MEMORY, absl::StatusCode::kResourceExhausted, "VK_ERROR_OUT_OF_DEVICE_MEMORY"},
      {VK_ERROR_OUT_OF_POOL_MEMORY, absl::StatusCode::kResourceExhausted, "VK_ERROR_OUT_OF_POOL_MEMORY"},
      {VK_ERROR_TOO_MANY_OBJECTS, absl::StatusCode::kResourceExhausted, "VK_ERROR_TOO_MANY_OBJECTS"},
      {VK_ERROR_FRAGMENTED_POOL, absl::StatusCode::kResourceExhausted, "VK_ERROR_FRAGMENTED_POOL"},
      {VK_ERROR_FRAGMENTATION, absl::StatusCode::kResourceExhausted, "VK_ERROR_FRAGMENTATION"},
      {VK_ERROR_DEVICE_LOST, absl::StatusCode::kUnavailable, "VK_ERROR_DEVICE_LOST"},
      {VK_ERROR_LAYER_NOT_PRESENT, absl::StatusCode::kFailedPrecondition, "VK_ERROR_LAYER_NOT_PRESENT"},
      {VK_ERROR_EXTENSION_NOT_PRESENT, absl::StatusCode::kFailedPrecondition,
       "VK_ERROR_EXTENSION_NOT_PRESENT"},
      {VK_ERROR_FEATURE_NOT_PRESENT, absl::StatusCode::kFailedPrecondition, "VK_ERROR_FEATURE_NOT_PRESENT"},
      {VK_ERROR_INCOMPATIBLE_DRIVER, absl::StatusCode::kFailedPrecondition, "VK_ERROR_INCOMPATIBLE_DRIVER"},
      {VK_ERROR_FORMAT_NOT_SUPPORTED, absl::StatusCode::kFailedPrecondition, "VK_ERROR_FORMAT_NOT_SUPPORTED"},
      {VK_ERROR_INVALID_EXTERNAL_HANDLE, absl::StatusCode::kInvalidArgument,
       "VK_ERROR_INVALID_EXTERNAL_HANDLE"},
      {VK_ERROR_INVALID_SHADER_NV, absl::StatusCode::kInvalidArgument, "VK_ERROR_INVALID_SHADER_NV"},
      {VK_ERROR_INITIALIZATION_FAILED, absl::StatusCode::kInternal, "VK_ERROR_INITIALIZATION_FAILED"},
      {VK_ERROR_MEMORY_MAP_FAILED, absl::StatusCode::kInternal, "VK_ERROR_MEMORY_MAP_FAILED"},
      {VK_ERROR_UNKNOWN, absl::StatusCode::kInternal, "VK_ERROR_UNKNOWN"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_STREQ(VkResultName(c.result), c.name);
    const absl::Status status = VkStatus(c.result, "vkCreateBuffer(staging)");
    EXPECT_EQ(status.code(), c.code);
    EXPECT_EQ(status.message(), std::string("vkCreateBuffer(staging) failed: ") + c.name);
  }
}

// Tests that a result missing from the name table still converts to an
// error, named as unknown.
TEST(VkStatusTest, UnlistedErrorIsInternalAndNamedUnknown) {
  const VkResult unlisted = static_cast<VkResult>(-123456);
  EXPECT_STREQ(VkResultName(unlisted), "VK_RESULT_UNKNOWN");
  EXPECT_ERROR(VkStatus(unlisted, "vkFoo"), absl::StatusCode::kInternal, "vkFoo failed: VK_RESULT_UNKNOWN");
}

absl::Status CallThat(VkResult result) {
  CAUSEWAY_VK_RETURN_IF_ERROR(result);
  return absl::AbortedError("reached the end");
}

// Tests that VK_RETURN_IF_ERROR returns the converted error, naming the call
// as written, and goes on after a success.
TEST(VkStatusTest, ReturnIfErrorNamesTheCall) {
  EXPECT_ERROR(CallThat(VK_ERROR_DEVICE_LOST), absl::StatusCode::kUnavailable,
               "result failed: VK_ERROR_DEVICE_LOST");
  EXPECT_ERROR(CallThat(VK_SUCCESS), absl::StatusCode::kAborted, "reached the end");
}

int destroyed_calls = 0;
VkBuffer destroyed_handle = VK_NULL_HANDLE;
void VKAPI_PTR FakeDestroyBuffer(VkDevice, VkBuffer buffer, const VkAllocationCallbacks*) {
  ++destroyed_calls;
  destroyed_handle = buffer;
}

// Tests that DestroyCounted destroys a handle and takes the live count down
// by one, and does neither for a null handle.
TEST(VkStatusTest, DestroyCountedKeepsTheLiveCount) {
  const int64_t before = LiveVulkanObjects();
  CountVulkanObject(+1);
  EXPECT_EQ(LiveVulkanObjects(), before + 1);
  DestroyCounted<VkBuffer>(&FakeDestroyBuffer, VK_NULL_HANDLE, VK_NULL_HANDLE);
  EXPECT_EQ(destroyed_calls, 0);
  EXPECT_EQ(LiveVulkanObjects(), before + 1);
  const VkBuffer fake = reinterpret_cast<VkBuffer>(uintptr_t{0x1230});
  DestroyCounted<VkBuffer>(&FakeDestroyBuffer, VK_NULL_HANDLE, fake);
  EXPECT_EQ(destroyed_calls, 1);
  EXPECT_EQ(destroyed_handle, fake);
  EXPECT_EQ(LiveVulkanObjects(), before);
}

}  // namespace
}  // namespace causeway
