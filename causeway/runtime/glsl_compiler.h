// Run-time GLSL compilation with the glslang library, for kernels that are
// generated or specialized by source (shaders known at build time are
// compiled by glslangValidator instead and embedded).
#ifndef CAUSEWAY_RUNTIME_GLSL_COMPILER_H_
#define CAUSEWAY_RUNTIME_GLSL_COMPILER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway {

// Compiles a GLSL compute shader to SPIR-V 1.5 for Vulkan 1.2. `name` labels
// the source in messages; `source` needs a #version line (450 is assumed
// without one); each `defines` pair {NAME, VALUE} becomes `#define NAME VALUE`
// ahead of the source, without shifting its line numbers. NAME must be an
// identifier and VALUE a single line, else InvalidArgument. A compile or link
// error is InvalidArgument carrying glslang's log, whose lines read
// "ERROR: <name>:<line>: ...".
//
// Thread-safe: glslang is initialized once per process on first use, and
// compilations may run concurrently.
//
// Unlike the SPIR-V checks in kernel.h, this is not safe against hostile
// source: glslang's preprocessor expands macros without a budget, so a few
// lines of nested #defines can take minutes and gigabytes. Compile source
// from untrusted parties in a process that can be killed on a time limit.
absl::StatusOr<std::vector<uint32_t>> CompileGlsl(
    absl::string_view name, absl::string_view source,
    absl::Span<const std::pair<std::string, std::string>> defines = {});

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_GLSL_COMPILER_H_
