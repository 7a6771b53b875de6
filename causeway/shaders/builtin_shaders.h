// The built-in compute kernels, compiled from shaders/*.comp at build time and
// embedded in the library as SPIR-V 1.5 (Vulkan 1.2).
//
// The binding, push-constant and dispatch conventions of each kernel are
// documented at the top of its .comp file and summarized in
// causeway/shaders/README.md.
//
// Example:
//   std::optional<absl::Span<const uint32_t>> spirv =
//       causeway::FindBuiltinShader("matmul");
//   if (!spirv.has_value()) return absl::NotFoundError("no matmul kernel");
//   // Hand spirv->data() and spirv->size() * sizeof(uint32_t) to
//   // VkShaderModuleCreateInfo.
//
// Thread-safe: everything here is immutable static data.
#ifndef CAUSEWAY_SHADERS_BUILTIN_SHADERS_H_
#define CAUSEWAY_SHADERS_BUILTIN_SHADERS_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway {

// One embedded kernel. Both views point at static storage that lives for the
// whole program.
struct BuiltinShader {
  // The .comp file's stem, e.g. "reduce_sum".
  absl::string_view name;
  // The optimized, validated SPIR-V module; its entry point is "main".
  absl::Span<const uint32_t> spirv;
};

// All built-in kernels, sorted by name: the basic ones ("add", "combine",
// "combine4", "combine_n", "copy", "fill", "matmul", "mul", "reduce_sum",
// "scale") and the
// model kernels ("adam", "adam_update", "adam_update_multi", "attention",
// "attention_backward", "attention_backward_dot", "attention_backward_lanes",
// "attention_lanes", "bias_gelu", "bias_gelu_backward",
// "cross_entropy", "cross_entropy_backward", "embedding",
// "embedding_backward", "gemm", "layer_norm", "layer_norm_backward", "permute_0213", "sgd",
// "softmax_causal", "softmax_causal_backward").
absl::Span<const BuiltinShader> BuiltinShaders();

// The SPIR-V of the built-in kernel `name`, or nullopt if there is none.
// Names are matched exactly (case-sensitive).
std::optional<absl::Span<const uint32_t>> FindBuiltinShader(absl::string_view name);

}  // namespace causeway

#endif  // CAUSEWAY_SHADERS_BUILTIN_SHADERS_H_
