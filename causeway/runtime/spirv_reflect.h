// Reflection of a SPIR-V compute module: what a pipeline needs to know about
// a kernel (its buffers, push constants, workgroup size and specialization
// constants) read straight from the words, without a device.
//
// The parser walks the instruction stream itself and treats every input as
// untrusted: each instruction's word count, every string and every operand is
// bound-checked, ids are checked against the header's bound, and type nesting
// is limited, so malformed words give an absl::Status error and never a crash,
// a hang or an out-of-bounds read. It does not replace the spirv-tools
// validator (ValidateSpirv in kernel.h); Kernel runs both.
#ifndef CAUSEWAY_RUNTIME_SPIRV_REFLECT_H_
#define CAUSEWAY_RUNTIME_SPIRV_REFLECT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace causeway {

// The SPIR-V magic number, as the first word of a module in host byte order.
inline constexpr uint32_t kSpirvMagic = 0x07230203;

// The kinds of descriptor a kernel may bind. Images, samplers and texel
// buffers are not supported: ReflectSpirv refuses them with Unimplemented.
enum class BindingKind {
  kStorageBuffer,  // GLSL `buffer`: StorageBuffer class, or Uniform + BufferBlock.
  kUniformBuffer,  // GLSL `uniform` block: Uniform class + Block.
};

// One descriptor binding of a kernel.
struct KernelBinding {
  uint32_t set = 0;
  uint32_t binding = 0;
  BindingKind kind = BindingKind::kStorageBuffer;
  // NonWritable on the variable or on every member of its block (GLSL
  // `readonly`). Always true for uniform buffers.
  bool read_only = false;
  // NonReadable on the variable or on every member (GLSL `writeonly`).
  bool write_only = false;
  // Bytes of the fixed part of the block: the end of its last sized member,
  // or, when the block ends in a runtime array, at least that array's offset
  // (so 0 for a block that is only a runtime array). A smaller buffer must be
  // refused. Arrays sized by a specialization constant count at its default.
  uint64_t min_size = 0;
  // The variable's OpName, or its block type's when the variable is unnamed;
  // empty if neither is named.
  std::string name;

  friend bool operator==(const KernelBinding&, const KernelBinding&) = default;
};

// The scalar type of a specialization constant.
enum class SpecConstantType { kBool, kInt32, kUint32, kFloat32 };

// One specialization constant (an OpSpecConstant* with a SpecId decoration).
struct SpecConstant {
  uint32_t id = 0;  // the SpecId (GLSL constant_id)
  SpecConstantType type = SpecConstantType::kUint32;
  // The default value's 32 bits: 0 or 1 for kBool, the two's-complement bits
  // for kInt32, the IEEE-754 bits for kFloat32.
  uint32_t default_bits = 0;
  std::string name;  // OpName of the constant, empty if none

  friend bool operator==(const SpecConstant&, const SpecConstant&) = default;
};

// A part of a kernel's workgroup (shared) memory: `bytes` times the value of
// each specialization constant in `spec_ids` (the SpecIds of the array
// lengths it sits in; empty for a part of fixed size).
struct SharedMemoryTerm {
  uint64_t bytes = 0;
  std::vector<uint32_t> spec_ids;  // sorted

  friend bool operator==(const SharedMemoryTerm&, const SharedMemoryTerm&) = default;
};

// Everything a device needs to build a compute pipeline for a module.
struct KernelReflection {
  // The name of the module's only GLCompute entry point.
  std::string entry_point;
  // Sorted by (set, binding); a (set, binding) pair appears once.
  std::vector<KernelBinding> bindings;
  // Bytes of the push-constant block (the end of its last member, from the
  // members' Offset decorations and sizes), 0 if the kernel has none.
  uint32_t push_constant_size = 0;
  // The workgroup size, with specialization constants at their defaults.
  std::array<uint32_t, 3> local_size{};
  // For each dimension that comes from a specialization constant (the
  // LocalSizeId execution mode, or the WorkgroupSize built-in, as GLSL's
  // local_size_x_id makes), that constant's SpecId.
  std::array<std::optional<uint32_t>, 3> local_size_spec_id;
  // Sorted by id.
  std::vector<SpecConstant> spec_constants;
  // The module's Workgroup variables (GLSL `shared`): their bytes are the
  // sum of these terms (ResolveSharedMemory), without padding. At most
  // kMaxSharedMemoryTerms.
  std::vector<SharedMemoryTerm> shared_memory;
};

inline constexpr size_t kMaxSharedMemoryTerms = 64;

// OK if `words` is long enough for a SPIR-V header and starts with the magic
// number in host byte order; otherwise InvalidArgument saying what came
// (empty, too short, a byte-swapped magic, or another magic).
absl::Status CheckSpirvHeader(absl::Span<const uint32_t> words);

// Reflects a compute module. InvalidArgument for malformed words or a module
// that is not exactly one GLCompute kernel (the message names the word offset
// or the id at fault); Unimplemented for well-formed features Causeway does
// not support (image or sampler bindings, descriptor arrays, specialization
// constants wider than 32 bits, array sizes given by OpSpecConstantOp).
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(KernelReflection reflection, ReflectSpirv(words));
//   for (const KernelBinding& b : reflection.bindings) { ... }
absl::StatusOr<KernelReflection> ReflectSpirv(absl::Span<const uint32_t> words);

// The workgroup size after specialization: each dimension whose
// local_size_spec_id is in `spec_values` (SpecId -> 32-bit value) takes that
// value, the others keep their default.
std::array<uint32_t, 3> ResolveLocalSize(const KernelReflection& reflection,
                                         const absl::flat_hash_map<uint32_t, uint32_t>& spec_values);

// Bytes of workgroup memory after specialization: each term's constants take
// their value in `spec_values`, or their default. UINT64_MAX if the sum
// overflows 64 bits (beyond every device's limit).
uint64_t ResolveSharedMemory(const KernelReflection& reflection,
                             const absl::flat_hash_map<uint32_t, uint32_t>& spec_values);

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_SPIRV_REFLECT_H_
