#include "causeway/runtime/kernel_admission.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

#define SPV_ENABLE_UTILITY_CODE
#include <glslang/SPIRV/spirv.hpp>

namespace causeway {
namespace {

constexpr size_t kHeaderWords = 5;

constexpr absl::string_view kPointerReason = "pointers reach memory outside the kernel's bound buffers";
constexpr absl::string_view kVariablePointerReason =
    "variable pointers select between buffers at run time, outside what the bindings bound";
constexpr absl::string_view kNotAllowed = "it is not on the island's allow-list of kernel features";

// A capability on the allow-list, with the device feature it needs, if any.
struct AllowedCapability {
  spv::Capability capability;
  absl::string_view name;
  absl::string_view feature;  // empty: every Vulkan 1.2 device has it
  bool (*enabled)(const KernelDeviceFeatures&);
};

bool Always(const KernelDeviceFeatures&) { return true; }
template <uint32_t kBits>
bool Subgroup(const KernelDeviceFeatures& f) {
  return (f.subgroup_operations & kBits) == kBits;
}

// clang-format off
constexpr AllowedCapability kAllowed[] = {
    {spv::CapabilityMatrix, "Matrix", "", Always},
    {spv::CapabilityShader, "Shader", "", Always},
    {spv::CapabilityFloat16, "Float16", "shaderFloat16", [](const KernelDeviceFeatures& f) { return f.shader_float16; }},
    {spv::CapabilityFloat64, "Float64", "shaderFloat64", [](const KernelDeviceFeatures& f) { return f.shader_float64; }},
    {spv::CapabilityInt8, "Int8", "shaderInt8", [](const KernelDeviceFeatures& f) { return f.shader_int8; }},
    {spv::CapabilityInt16, "Int16", "shaderInt16", [](const KernelDeviceFeatures& f) { return f.shader_int16; }},
    {spv::CapabilityInt64, "Int64", "shaderInt64", [](const KernelDeviceFeatures& f) { return f.shader_int64; }},
    {spv::CapabilityStorageBuffer16BitAccess, "StorageBuffer16BitAccess", "storageBuffer16BitAccess",
     [](const KernelDeviceFeatures& f) { return f.storage_buffer_16bit; }},
    {spv::CapabilityStorageBuffer8BitAccess, "StorageBuffer8BitAccess", "storageBuffer8BitAccess",
     [](const KernelDeviceFeatures& f) { return f.storage_buffer_8bit; }},
    {spv::CapabilityGroupNonUniform, "GroupNonUniform", "subgroup basic operations in compute", Subgroup<kSubgroupBasic>},
    {spv::CapabilityGroupNonUniformVote, "GroupNonUniformVote", "subgroup vote operations", Subgroup<kSubgroupVote>},
    {spv::CapabilityGroupNonUniformArithmetic, "GroupNonUniformArithmetic", "subgroup arithmetic operations",
     Subgroup<kSubgroupArithmetic>},
    {spv::CapabilityGroupNonUniformBallot, "GroupNonUniformBallot", "subgroup ballot operations", Subgroup<kSubgroupBallot>},
    {spv::CapabilityGroupNonUniformShuffle, "GroupNonUniformShuffle", "subgroup shuffle operations",
     Subgroup<kSubgroupShuffle>},
    {spv::CapabilityGroupNonUniformShuffleRelative, "GroupNonUniformShuffleRelative",
     "subgroup relative shuffle operations", Subgroup<kSubgroupShuffleRelative>},
    {spv::CapabilityGroupNonUniformClustered, "GroupNonUniformClustered", "subgroup clustered operations",
     Subgroup<kSubgroupClustered>},
    {spv::CapabilityGroupNonUniformQuad, "GroupNonUniformQuad", "subgroup quad operations", Subgroup<kSubgroupQuad>},
};

// Refused capabilities named in errors, with why (the rest are refused as
// not allowed, by number).
struct RefusedCapability {
  spv::Capability capability;
  absl::string_view name;
  absl::string_view reason;
};
constexpr RefusedCapability kRefused[] = {
    {spv::CapabilityPhysicalStorageBufferAddresses, "PhysicalStorageBufferAddresses", kPointerReason},
    {spv::CapabilityVariablePointers, "VariablePointers", kVariablePointerReason},
    {spv::CapabilityVariablePointersStorageBuffer, "VariablePointersStorageBuffer", kVariablePointerReason},
    {spv::CapabilityAddresses, "Addresses", kPointerReason},
    {spv::CapabilityGenericPointer, "GenericPointer", kPointerReason},
    {spv::CapabilityKernel, "Kernel", kNotAllowed},
    {spv::CapabilityLinkage, "Linkage", kNotAllowed},
    {spv::CapabilityInt64Atomics, "Int64Atomics", kNotAllowed},
    {spv::CapabilityVulkanMemoryModel, "VulkanMemoryModel", kNotAllowed},
    {spv::CapabilityRuntimeDescriptorArray, "RuntimeDescriptorArray", kNotAllowed},
    {spv::CapabilityUniformAndStorageBuffer16BitAccess, "UniformAndStorageBuffer16BitAccess", kNotAllowed},
    {spv::CapabilityStoragePushConstant16, "StoragePushConstant16", kNotAllowed},
    {spv::CapabilityUniformAndStorageBuffer8BitAccess, "UniformAndStorageBuffer8BitAccess", kNotAllowed},
    {spv::CapabilityStoragePushConstant8, "StoragePushConstant8", kNotAllowed},
};
// clang-format on

// Extensions on the allow-list: each only names a storage class or types
// the capability checks already cover.
constexpr absl::string_view kAllowedExtensions[] = {
    "SPV_KHR_storage_buffer_storage_class",
    "SPV_KHR_16bit_storage",
    "SPV_KHR_8bit_storage",
};
struct RefusedExtension {
  absl::string_view name;
  absl::string_view reason;
};
constexpr RefusedExtension kRefusedExtensions[] = {
    {"SPV_KHR_physical_storage_buffer", kPointerReason},
    {"SPV_EXT_physical_storage_buffer", kPointerReason},
    {"SPV_KHR_variable_pointers", kVariablePointerReason},
};

struct StorageClassRule {
  spv::StorageClass storage_class;
  absl::string_view name;
  absl::string_view reason;  // empty: allowed
};
// clang-format off
constexpr StorageClassRule kStorageClasses[] = {
    {spv::StorageClassUniformConstant, "UniformConstant", ""},
    {spv::StorageClassInput, "Input", ""},
    {spv::StorageClassUniform, "Uniform", ""},
    {spv::StorageClassWorkgroup, "Workgroup", ""},
    {spv::StorageClassPrivate, "Private", ""},
    {spv::StorageClassFunction, "Function", ""},
    {spv::StorageClassPushConstant, "PushConstant", ""},
    {spv::StorageClassStorageBuffer, "StorageBuffer", ""},
    {spv::StorageClassPhysicalStorageBuffer, "PhysicalStorageBuffer", kPointerReason},
    {spv::StorageClassGeneric, "Generic", kPointerReason},
    {spv::StorageClassCrossWorkgroup, "CrossWorkgroup", kPointerReason},
    {spv::StorageClassOutput, "Output", kNotAllowed},
    {spv::StorageClassImage, "Image", kNotAllowed},
    {spv::StorageClassAtomicCounter, "AtomicCounter", kNotAllowed},
};
// clang-format on

const AllowedCapability* FindAllowed(uint32_t capability) {
  for (const AllowedCapability& a : kAllowed) {
    if (a.capability == capability) return &a;
  }
  return nullptr;
}

// Reads the literal string at the start of `operands` into `out`; false when
// it has no terminating NUL inside the operands.
bool ReadString(absl::Span<const uint32_t> operands, std::string* out) {
  out->clear();
  for (uint32_t word : operands) {
    for (int byte = 0; byte < 4; ++byte) {
      const char c = static_cast<char>((word >> (8 * byte)) & 0xFF);
      if (c == '\0') return true;
      out->push_back(c);
    }
  }
  return false;
}

// Collects refused items once each, grouped by why, in the order found:
// "capability X and storage class Y are refused: <why>; extension Z is
// refused: <why>".
class Refusals {
 public:
  void Add(std::string item, absl::string_view reason) {
    for (Group& group : groups_) {
      if (group.reason != reason) continue;
      if (std::find(group.items.begin(), group.items.end(), item) == group.items.end()) {
        group.items.push_back(std::move(item));
      }
      return;
    }
    groups_.push_back({std::string(reason), {std::move(item)}});
  }
  absl::Status ToStatus() const {
    if (groups_.empty()) return absl::OkStatus();
    std::vector<std::string> parts;
    for (const Group& group : groups_) {
      const size_t n = group.items.size();
      const std::string items =
          n == 1 ? group.items[0]
                 : absl::StrCat(absl::StrJoin(group.items.begin(), group.items.end() - 1, ", "), " and ",
                                group.items.back());
      parts.push_back(absl::StrCat(items, n == 1 ? " is" : " are", " refused: ", group.reason));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("kernel admission refuses the module: ", absl::StrJoin(parts, "; ")));
  }

 private:
  struct Group {
    std::string reason;
    std::vector<std::string> items;
  };
  std::vector<Group> groups_;
};

void CheckCapability(uint32_t capability, Refusals* refusals) {
  if (FindAllowed(capability) != nullptr) return;
  for (const RefusedCapability& r : kRefused) {
    if (r.capability == capability) {
      refusals->Add(absl::StrCat("capability ", r.name), r.reason);
      return;
    }
  }
  refusals->Add(absl::StrCat("capability ", capability), kNotAllowed);
}

void CheckExtension(const std::string& name, Refusals* refusals) {
  for (absl::string_view allowed : kAllowedExtensions) {
    if (name == allowed) return;
  }
  for (const RefusedExtension& r : kRefusedExtensions) {
    if (name == r.name) {
      refusals->Add(absl::StrCat("extension ", name), r.reason);
      return;
    }
  }
  refusals->Add(absl::StrCat("extension ", name), kNotAllowed);
}

void CheckStorageClass(uint32_t storage_class, Refusals* refusals) {
  for (const StorageClassRule& rule : kStorageClasses) {
    if (rule.storage_class != storage_class) continue;
    if (!rule.reason.empty()) {
      refusals->Add(absl::StrCat("storage class ", rule.name), rule.reason);
    }
    return;
  }
  refusals->Add(absl::StrCat("storage class ", storage_class), kNotAllowed);
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> AdmitSpirv(absl::Span<const uint32_t> words) {
  if (words.size() < kHeaderWords) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel admission: ", words.size(), " words is shorter than a SPIR-V header"));
  }
  Refusals refusals;
  std::vector<uint32_t> capabilities;
  std::string text;
  for (size_t offset = kHeaderWords; offset < words.size();) {
    const uint32_t word_count = words[offset] >> 16;
    const auto op = static_cast<spv::Op>(words[offset] & 0xFFFF);
    if (word_count == 0 || word_count > words.size() - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel admission: malformed instruction at word ", offset));
    }
    const absl::Span<const uint32_t> operands = words.subspan(offset + 1, word_count - 1);
    auto need = [&](size_t n) -> absl::Status {
      if (operands.size() >= n) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("kernel admission: instruction at word ", offset,
                                                     " has ", operands.size(),
                                                     " operands, expected at least ", n));
    };
    switch (op) {
      case spv::OpCapability:
        if (absl::Status s = need(1); !s.ok()) return s;
        CheckCapability(operands[0], &refusals);
        capabilities.push_back(operands[0]);
        break;
      case spv::OpExtension:
        if (!ReadString(operands, &text)) {
          return absl::InvalidArgumentError(
              absl::StrCat("kernel admission: unterminated string at word ", offset));
        }
        CheckExtension(text, &refusals);
        break;
      case spv::OpExtInstImport:
        if (absl::Status s = need(2); !s.ok()) return s;
        if (!ReadString(operands.subspan(1), &text)) {
          return absl::InvalidArgumentError(
              absl::StrCat("kernel admission: unterminated string at word ", offset));
        }
        if (text != "GLSL.std.450") {
          refusals.Add(absl::StrCat("extended instruction set ", text), "only GLSL.std.450 is allowed");
        }
        break;
      case spv::OpMemoryModel:
        if (absl::Status s = need(2); !s.ok()) return s;
        if (operands[0] == spv::AddressingModelPhysicalStorageBuffer64) {
          refusals.Add("addressing model PhysicalStorageBuffer64", kPointerReason);
        } else if (operands[0] != spv::AddressingModelLogical) {
          refusals.Add(absl::StrCat("addressing model ", operands[0]), "expected Logical");
        }
        if (operands[1] != spv::MemoryModelGLSL450 && operands[1] != spv::MemoryModelVulkan) {
          refusals.Add(absl::StrCat("memory model ", operands[1]), "expected GLSL450 or Vulkan");
        }
        break;
      case spv::OpTypePointer:
      case spv::OpTypeForwardPointer:
        if (absl::Status s = need(2); !s.ok()) return s;
        CheckStorageClass(operands[1], &refusals);
        break;
      case spv::OpVariable:
        if (absl::Status s = need(3); !s.ok()) return s;
        CheckStorageClass(operands[2], &refusals);
        break;
      case spv::OpConvertUToPtr:
      case spv::OpConvertPtrToU:
        refusals.Add(op == spv::OpConvertUToPtr ? "OpConvertUToPtr" : "OpConvertPtrToU", kPointerReason);
        break;
      default:
        break;
    }
    offset += word_count;
  }
  if (absl::Status s = refusals.ToStatus(); !s.ok()) return s;
  std::sort(capabilities.begin(), capabilities.end());
  capabilities.erase(std::unique(capabilities.begin(), capabilities.end()), capabilities.end());
  return capabilities;
}

absl::Status CheckKernelCapabilities(absl::Span<const uint32_t> capabilities,
                                     const KernelDeviceFeatures& enabled) {
  for (uint32_t capability : capabilities) {
    const AllowedCapability* allowed = FindAllowed(capability);
    if (allowed == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("capability ", capability, " is refused: ", kNotAllowed));
    }
    if (!allowed->enabled(enabled)) {
      return absl::InvalidArgumentError(absl::StrCat("capability ", allowed->name,
                                                     " needs the device feature ", allowed->feature,
                                                     ", which is not enabled"));
    }
  }
  return absl::OkStatus();
}

}  // namespace causeway
