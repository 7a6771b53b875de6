#include "causeway/runtime/kernel.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <spirv-tools/libspirv.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "causeway/base/status.h"
#include "causeway/runtime/glsl_compiler.h"
#include "causeway/runtime/spirv_reflect.h"

namespace causeway {
namespace {

// Larger files are refused before they are read whole; real kernels are
// kilobytes.
constexpr size_t kMaxSpirvFileBytes = size_t{256} << 20;

// Same code, message prefixed with "kernel '<name>': ".
absl::Status InKernel(absl::string_view name, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("kernel '", name, "': ", status.message()));
}

// Reads a regular file whole. Opened non-blocking so that a FIFO without a
// writer cannot hang the open; anything but a regular file is refused.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot open kernel file '", path, "': ", std::strerror(error));
    switch (error) {
      case ENOENT:
      case ENOTDIR:
        return absl::NotFoundError(message);
      case EACCES:
      case EPERM:
        return absl::PermissionDeniedError(message);
      default:
        return absl::UnavailableError(message);
    }
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot stat kernel file '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("kernel file '", path, "' is not a regular file"));
  }
  if (static_cast<uint64_t>(info.st_size) > kMaxSpirvFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("kernel file '", path, "' is ", info.st_size,
                                                   " bytes, more than the limit of ", kMaxSpirvFileBytes));
  }
  std::string contents;
  char chunk[64 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("cannot read kernel file '", path, "': ", std::strerror(errno)));
    }
    if (n == 0) break;
    contents.append(chunk, static_cast<size_t>(n));
    // The file may have grown since fstat.
    if (contents.size() > kMaxSpirvFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel file '", path, "' is more than the limit of ", kMaxSpirvFileBytes, " bytes"));
    }
  }
  return contents;
}

}  // namespace

absl::Status ValidateSpirv(absl::Span<const uint32_t> words, spv_target_env env) {
  if (words.empty()) {
    return absl::InvalidArgumentError("SPIR-V validation failed: empty module");
  }
  spvtools::SpirvTools tools(env);
  if (!tools.IsValid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SPIR-V validation: unsupported target environment ", static_cast<int>(env)));
  }
  std::string log;
  // The messages name the instruction at fault themselves; the position
  // spirv-tools reports alongside is not always a word offset in the module.
  tools.SetMessageConsumer(
      [&log](spv_message_level_t level, const char*, const spv_position_t&, const char* message) {
        if (level > SPV_MSG_ERROR) return;  // warnings and info
        if (!log.empty()) log += "\n";
        log += message;
      });
  if (!tools.Validate(words.data(), words.size(), spvtools::ValidatorOptions())) {
    return absl::InvalidArgumentError(absl::StrCat("SPIR-V validation failed (", spvTargetEnvDescription(env),
                                                   "): ", log.empty() ? "no message" : log));
  }
  return absl::OkStatus();
}

Kernel::Digest Sha256(absl::string_view bytes) {
  Kernel::Digest digest{};
  unsigned int size = 0;
  // EVP_Digest fails only when libcrypto cannot allocate its context; a
  // zero digest then matches no real module's.
  if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), &size, EVP_sha256(), nullptr) != 1 ||
      size != digest.size()) {
    digest.fill(0);
  }
  return digest;
}

Kernel::Kernel(std::string name, std::vector<uint32_t> words, KernelReflection reflection,
               std::vector<uint32_t> capabilities)
    : name_(std::move(name)),
      words_(std::move(words)),
      reflection_(std::move(reflection)),
      capabilities_(std::move(capabilities)),
      sha256_(Sha256(absl::string_view(reinterpret_cast<const char*>(words_.data()),
                                       words_.size() * sizeof(uint32_t)))) {}

absl::StatusOr<std::shared_ptr<const Kernel>> Kernel::FromSpirv(std::string name,
                                                                absl::Span<const uint32_t> words) {
  if (absl::Status s = CheckSpirvHeader(words); !s.ok()) return InKernel(name, s);
  if (absl::Status s = ValidateSpirv(words); !s.ok()) return InKernel(name, s);
  absl::StatusOr<std::vector<uint32_t>> capabilities = AdmitSpirv(words);
  if (!capabilities.ok()) return InKernel(name, capabilities.status());
  absl::StatusOr<KernelReflection> reflection = ReflectSpirv(words);
  if (!reflection.ok()) return InKernel(name, reflection.status());
  return std::shared_ptr<const Kernel>(new Kernel(std::move(name),
                                                  std::vector<uint32_t>(words.begin(), words.end()),
                                                  *std::move(reflection), *std::move(capabilities)));
}

absl::StatusOr<std::shared_ptr<const Kernel>> Kernel::FromSpirvBytes(std::string name,
                                                                     absl::string_view bytes) {
  if (bytes.empty()) {
    return InKernel(name, absl::InvalidArgumentError("empty SPIR-V module: 0 bytes"));
  }
  if (bytes.size() % 4 != 0) {
    return InKernel(name, absl::InvalidArgumentError(absl::StrCat("truncated SPIR-V: ", bytes.size(),
                                                                  " bytes is not a whole number of words")));
  }
  // Copied rather than reinterpreted: `bytes` need not be 4-byte aligned.
  std::vector<uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return FromSpirv(std::move(name), words);
}

absl::StatusOr<std::shared_ptr<const Kernel>> Kernel::FromFile(const std::string& path) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return FromSpirvBytes(std::filesystem::path(path).stem().string(), bytes);
}

absl::StatusOr<std::shared_ptr<const Kernel>> Kernel::FromGlsl(
    std::string name, absl::string_view source,
    absl::Span<const std::pair<std::string, std::string>> defines) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<uint32_t> words, CompileGlsl(name, source, defines));
  return FromSpirv(std::move(name), words);
}

}  // namespace causeway
