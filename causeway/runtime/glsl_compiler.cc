#include "causeway/runtime/glsl_compiler.h"

#include <glslang/Public/ResourceLimits.h>
#include <glslang/Public/ShaderLang.h>
#include <glslang/SPIRV/GlslangToSpv.h>

#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway {
namespace {

// glslang's process state (built-in symbol tables) is set up exactly once and
// kept for the life of the process: FinalizeProcess would race with
// compilations still running on other threads.
bool InitializeGlslangOnce() {
  static const bool initialized = glslang::InitializeProcess();
  return initialized;
}

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::string> BuildPreamble(absl::string_view name,
                                          absl::Span<const std::pair<std::string, std::string>> defines) {
  std::string preamble;
  for (const auto& [macro, value] : defines) {
    if (!IsIdentifier(macro)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GLSL '", name, "': define name '", macro, "' is not an identifier"));
    }
    if (absl::StrContains(value, '\n') || absl::StrContains(value, '\r') || absl::StrContains(value, '\0')) {
      return absl::InvalidArgumentError(
          absl::StrCat("GLSL '", name, "': the value of define ", macro, " spans more than one line"));
    }
    absl::StrAppend(&preamble, "#define ", macro, " ", value, "\n");
  }
  return preamble;
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> CompileGlsl(
    absl::string_view name, absl::string_view source,
    absl::Span<const std::pair<std::string, std::string>> defines) {
  if (source.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GLSL '", name, "': source of ", source.size(), " bytes is too long"));
  }
  absl::StatusOr<std::string> preamble = BuildPreamble(name, defines);
  if (!preamble.ok()) return preamble.status();
  if (!InitializeGlslangOnce()) {
    return absl::InternalError("glslang::InitializeProcess failed");
  }

  const std::string source_name(name);
  const char* const strings[] = {source.data()};
  const int lengths[] = {static_cast<int>(source.size())};
  const char* const names[] = {source_name.c_str()};
  const auto messages = static_cast<EShMessages>(EShMsgSpvRules | EShMsgVulkanRules);

  // The program refers to the shader, so it is declared after it and
  // destroyed first.
  glslang::TShader shader(EShLangCompute);
  shader.setStringsWithLengthsAndNames(strings, lengths, names, 1);
  shader.setPreamble(preamble->c_str());
  shader.setEnvInput(glslang::EShSourceGlsl, EShLangCompute, glslang::EShClientVulkan, 100);
  shader.setEnvClient(glslang::EShClientVulkan, glslang::EShTargetVulkan_1_2);
  shader.setEnvTarget(glslang::EShTargetSpv, glslang::EShTargetSpv_1_5);
  if (!shader.parse(GetDefaultResources(), /*defaultVersion=*/450,
                    /*forwardCompatible=*/false, messages)) {
    return absl::InvalidArgumentError(absl::StrCat("GLSL '", name, "' failed to compile:\n",
                                                   absl::StripTrailingAsciiWhitespace(shader.getInfoLog())));
  }
  glslang::TProgram program;
  program.addShader(&shader);
  if (!program.link(messages)) {
    return absl::InvalidArgumentError(absl::StrCat("GLSL '", name, "' failed to link:\n",
                                                   absl::StripTrailingAsciiWhitespace(program.getInfoLog())));
  }
  const glslang::TIntermediate* intermediate = program.getIntermediate(EShLangCompute);
  if (intermediate == nullptr) {
    return absl::InternalError(absl::StrCat("GLSL '", name, "': glslang produced no compute stage"));
  }
  glslang::SpvOptions options;
  options.disableOptimizer = true;
  options.validate = false;  // Kernel validates with spirv-tools itself.
  spv::SpvBuildLogger logger;
  std::vector<unsigned int> spirv;
  glslang::GlslangToSpv(*intermediate, spirv, &logger, &options);
  if (spirv.empty()) {
    return absl::InternalError(
        absl::StrCat("GLSL '", name, "': SPIR-V generation produced nothing: ", logger.getAllMessages()));
  }
  return std::vector<uint32_t>(spirv.begin(), spirv.end());
}

}  // namespace causeway
