// Kernel admission: which SPIR-V a tenant may run on an island's devices.
//
// spirv-val checks that a module is well formed, not that it stays inside its
// buffers. A module that declares PhysicalStorageBuffer pointers (GLSL's
// GL_EXT_buffer_reference) can turn any 64-bit number, say one from its push
// constants, into an address and read or write the process's memory; variable
// pointers and the other features refused here reach memory by other roads than
// the bound buffers. So every module is held to an allow-list, in two steps:
//
//   1. AdmitSpirv, when a Kernel is made (no device needed): every capability,
//      extension, extended instruction set, addressing model, memory model and
//      storage class must be on the list below. Anything that reaches memory
//      outside the bound buffers is never on it.
//   2. CheckKernelCapabilities, when a device builds a pipeline: each optional
//      capability the module declares (16-bit types, subgroup operations, ...)
//      must match a feature that device has enabled.
//
// Nothing here touches a driver; both run on untrusted words without risk.
#ifndef CAUSEWAY_RUNTIME_KERNEL_ADMISSION_H_
#define CAUSEWAY_RUNTIME_KERNEL_ADMISSION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace causeway {

// The device features that optional capabilities need, as a device enabled
// them. Vulkan-free, so that admission is testable without a device.
struct KernelDeviceFeatures {
  bool shader_float16 = false;        // Float16
  bool shader_float64 = false;        // Float64
  bool shader_int8 = false;           // Int8
  bool shader_int16 = false;          // Int16
  bool shader_int64 = false;          // Int64
  bool storage_buffer_16bit = false;  // StorageBuffer16BitAccess
  bool storage_buffer_8bit = false;   // StorageBuffer8BitAccess
  // VkSubgroupFeatureFlags the device supports in compute shaders (0 when
  // subgroup operations are not supported in the compute stage).
  uint32_t subgroup_operations = 0;
};

// The subgroup operation bits of VkSubgroupFeatureFlagBits, repeated here so
// that this header needs no Vulkan.
inline constexpr uint32_t kSubgroupBasic = 0x1;
inline constexpr uint32_t kSubgroupVote = 0x2;
inline constexpr uint32_t kSubgroupArithmetic = 0x4;
inline constexpr uint32_t kSubgroupBallot = 0x8;
inline constexpr uint32_t kSubgroupShuffle = 0x10;
inline constexpr uint32_t kSubgroupShuffleRelative = 0x20;
inline constexpr uint32_t kSubgroupClustered = 0x40;
inline constexpr uint32_t kSubgroupQuad = 0x80;

// Checks `words` (a module spirv-val has accepted, though malformed words give
// an error here too, never a crash) against the allow-list. Returns the
// capabilities the module declares, sorted, for CheckKernelCapabilities.
// InvalidArgument naming every refused item and why, e.g.
//   "kernel admission refuses the module: capability
//    PhysicalStorageBufferAddresses, addressing model PhysicalStorageBuffer64
//    and storage class PhysicalStorageBuffer are refused: pointers reach
//    memory outside the kernel's bound buffers".
absl::StatusOr<std::vector<uint32_t>> AdmitSpirv(absl::Span<const uint32_t> words);

// OK when every capability in `capabilities` (as AdmitSpirv returned them) is
// one `enabled` allows; otherwise InvalidArgument naming the capability and
// the device feature it needs, e.g. "capability Int64 needs the device
// feature shaderInt64, which is not enabled".
absl::Status CheckKernelCapabilities(absl::Span<const uint32_t> capabilities,
                                     const KernelDeviceFeatures& enabled);

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_KERNEL_ADMISSION_H_
