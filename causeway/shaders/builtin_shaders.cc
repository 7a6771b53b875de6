#include "causeway/shaders/builtin_shaders.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway {
namespace {

// Defines the k<Name>Spirv arrays and kEmbeddedShaders, sorted by name.
// Generated at build time by cmake/EmbedSpirv.cmake from shaders/*.comp.
#include "builtin_shaders_embedded.inc"

}  // namespace

absl::Span<const BuiltinShader> BuiltinShaders() { return kEmbeddedShaders; }

std::optional<absl::Span<const uint32_t>> FindBuiltinShader(absl::string_view name) {
  absl::Span<const BuiltinShader> shaders = BuiltinShaders();
  auto it =
      std::lower_bound(shaders.begin(), shaders.end(), name,
                       [](const BuiltinShader& shader, absl::string_view key) { return shader.name < key; });
  if (it == shaders.end() || it->name != name) return std::nullopt;
  return it->spirv;
}

}  // namespace causeway
