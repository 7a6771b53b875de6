// A compute kernel before any device sees it: SPIR-V that has been loaded,
// validated and reflected. Devices build pipelines from a Kernel; nothing here
// touches a driver, so every check in this file runs on untrusted input
// without risk to the process.
#ifndef CAUSEWAY_RUNTIME_KERNEL_H_
#define CAUSEWAY_RUNTIME_KERNEL_H_

#include <spirv-tools/libspirv.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "causeway/runtime/glsl_compiler.h"     // IWYU pragma: export
#include "causeway/runtime/kernel_admission.h"  // IWYU pragma: export
#include "causeway/runtime/spirv_reflect.h"     // IWYU pragma: export

namespace causeway {

// Validates `words` with the spirv-tools validator for `env`. InvalidArgument
// carrying the validator's message (which names the offending instruction)
// when the module is invalid or empty.
absl::Status ValidateSpirv(absl::Span<const uint32_t> words, spv_target_env env = SPV_ENV_VULKAN_1_2);

// A validated, reflected compute kernel, independent of any device.
//
// Every factory checks, in order: that the words look like SPIR-V (not empty,
// the magic in host byte order, a whole header), the spirv-tools validator
// (Vulkan 1.2 rules), admission (kernel_admission.h: no pointers or other
// features that reach memory outside the bound buffers), then reflection.
// Errors name the kernel:
//   "kernel 'matmul': not SPIR-V: magic 0x464c457f (expected 0x07230203)".
//
// Immutable after creation, and so thread-safe; shared by every device and
// pipeline cache that uses it.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Kernel> kernel,
//                    Kernel::FromGlsl("scale", R"(
//     #version 450
//     layout(local_size_x = 64) in;
//     layout(set = 0, binding = 0) buffer Data { float values[]; };
//     layout(push_constant) uniform Params { float factor; };
//     void main() { values[gl_GlobalInvocationID.x] *= factor; }
//   )"));
//   const KernelReflection& r = kernel->reflection();
//   // r.bindings[0]: set 0, binding 0, storage buffer, min_size 0.
//   // r.push_constant_size == 4, r.local_size == {64, 1, 1}.
//   const Kernel::Digest& identity = kernel->sha256();
class Kernel {
 public:
  // Takes a copy of `words`.
  static absl::StatusOr<std::shared_ptr<const Kernel>> FromSpirv(std::string name,
                                                                 absl::Span<const uint32_t> words);

  // `bytes` is a SPIR-V binary as stored on disk, in host byte order. Its
  // size must be a multiple of 4; a byte-swapped module is refused rather
  // than converted.
  static absl::StatusOr<std::shared_ptr<const Kernel>> FromSpirvBytes(std::string name,
                                                                      absl::string_view bytes);

  // Reads a SPIR-V binary (.spv) file; the kernel's name is the file stem.
  // NotFound naming the path when it does not exist, PermissionDenied when it
  // cannot be opened, InvalidArgument when it is larger than 256 MiB.
  static absl::StatusOr<std::shared_ptr<const Kernel>> FromFile(const std::string& path);

  // Compiles GLSL with CompileGlsl (see glsl_compiler.h), then as FromSpirv.
  static absl::StatusOr<std::shared_ptr<const Kernel>> FromGlsl(
      std::string name, absl::string_view source,
      absl::Span<const std::pair<std::string, std::string>> defines = {});

  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  using Digest = std::array<uint8_t, 32>;

  const std::string& name() const { return name_; }
  absl::Span<const uint32_t> spirv() const { return words_; }
  const KernelReflection& reflection() const { return reflection_; }
  // The capabilities the module declares, sorted; a device checks them
  // against its enabled features (CheckKernelCapabilities) before building.
  const std::vector<uint32_t>& capabilities() const { return capabilities_; }

  // SHA-256 of the whole module's bytes (the words in host byte order, as
  // stored on disk): the kernel's identity. Two kernels with equal digests
  // are the same code; a different module cannot be made to match one. The
  // name does not enter it.
  const Digest& sha256() const { return sha256_; }

 private:
  Kernel(std::string name, std::vector<uint32_t> words, KernelReflection reflection,
         std::vector<uint32_t> capabilities);

  const std::string name_;
  const std::vector<uint32_t> words_;
  const KernelReflection reflection_;
  const std::vector<uint32_t> capabilities_;
  const Digest sha256_;
};

// SHA-256 of `bytes` (libcrypto).
Kernel::Digest Sha256(absl::string_view bytes);

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_KERNEL_H_
