#include "causeway/transport/auth.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace causeway::transport {
namespace {

// Owns an open file descriptor.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Wipes a buffer when it goes out of scope, however the scope is left.
class WipeOnExit {
 public:
  WipeOnExit(void* data, size_t size) : data_(data), size_(size) {}
  WipeOnExit(const WipeOnExit&) = delete;
  WipeOnExit& operator=(const WipeOnExit&) = delete;
  ~WipeOnExit() { OPENSSL_cleanse(data_, size_); }

 private:
  void* data_;
  size_t size_;
};

// The text of libcrypto's oldest queued error, which is then cleared.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no error queued";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

struct MacContextDeleter {
  void operator()(EVP_MAC_CTX* context) const { EVP_MAC_CTX_free(context); }
};

// The HMAC implementation, fetched once (a lookup in libcrypto's provider
// tables) and kept for the life of the process. EVP_MAC objects may be
// shared between threads.
EVP_MAC* HmacAlgorithm() {
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr);
  return hmac;
}

}  // namespace

absl::StatusOr<Secret> Secret::FromBytes(absl::string_view bytes, absl::string_view what) {
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (bytes.size() < kMinSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds ", bytes.size(),
                                                   " bytes; a secret needs at least ", kMinSecretBytes,
                                                   " (e.g. openssl rand -hex 32)"));
  }
  if (bytes.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", bytes.size(), " bytes; a secret has at most ", kMaxSecretBytes));
  }
  return Secret(std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

absl::StatusOr<Secret> Secret::FromFile(const std::string& path) {
  const std::string what = absl::StrCat("secret file '", path, "'");
  // The checks below are made on the open descriptor (fstat), so the file
  // read is the file checked, even if the path is replaced meanwhile.
  FileDescriptor file(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (file.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", what));
  struct stat info {};
  if (fstat(file.get(), &info) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", what));
  if (!S_ISREG(info.st_mode))
    return absl::FailedPreconditionError(absl::StrCat(what, " is not a regular file"));
  if (info.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is owned by user ", info.st_uid, "; it must be owned by this process's user, ", geteuid()));
  }
  if ((info.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s has mode %04o; it must not be accessible to group or others (chmod 600 '%s')",
                        what, info.st_mode & 07777, path));
  }
  if (info.st_size > static_cast<off_t>(kMaxSecretBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", info.st_size, " bytes; a secret has at most ", kMaxSecretBytes));
  }
  // One byte more than allowed, so that a file that grew after fstat is
  // still caught; and a "\r\n" to drop.
  std::array<char, kMaxSecretBytes + 3> buffer;
  WipeOnExit wipe(buffer.data(), buffer.size());
  size_t size = 0;
  while (size < buffer.size()) {
    const ssize_t n = read(file.get(), buffer.data() + size, buffer.size() - size);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", what));
    }
    size += n;
  }
  absl::string_view bytes(buffer.data(), size);
  if (absl::ConsumeSuffix(&bytes, "\n")) absl::ConsumeSuffix(&bytes, "\r");
  return FromBytes(bytes, what);
}

absl::StatusOr<Secret> Secret::FromEnvironment(const char* name) {
  // Read in place, not through causeway/base/env.h: a copy of the secret
  // would stay in freed memory, where Secret could not wipe it.
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return absl::NotFoundError(
        absl::StrCat("environment variable ", name, " is ", value == nullptr ? "not set" : "empty"));
  }
  return FromBytes(value, absl::StrCat("environment variable ", name));
}

Secret& Secret::operator=(const Secret& other) {
  if (this != &other) {
    Wipe();
    bytes_ = other.bytes_;
  }
  return *this;
}

Secret::Secret(Secret&& other) noexcept : bytes_(std::move(other.bytes_)) { other.bytes_.clear(); }

Secret& Secret::operator=(Secret&& other) noexcept {
  if (this != &other) {
    Wipe();
    bytes_ = std::move(other.bytes_);
    other.bytes_.clear();
  }
  return *this;
}

Secret::~Secret() { Wipe(); }

void Secret::Wipe() {
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
  bytes_.clear();
}

absl::StatusOr<Digest> HmacSha256(absl::Span<const uint8_t> key,
                                  absl::Span<const absl::Span<const uint8_t>> pieces) {
  EVP_MAC* hmac = HmacAlgorithm();
  if (hmac == nullptr) return absl::InternalError(absl::StrCat("libcrypto has no HMAC: ", OpenSslError()));
  std::unique_ptr<EVP_MAC_CTX, MacContextDeleter> context(EVP_MAC_CTX_new(hmac));
  if (context == nullptr) return absl::InternalError(absl::StrCat("EVP_MAC_CTX_new: ", OpenSslError()));
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
      OSSL_PARAM_construct_end(),
  };
  // A null key means "the key of the last init" to libcrypto; an empty key
  // (valid for HMAC) needs a non-null pointer.
  static const uint8_t kNoKey = 0;
  if (EVP_MAC_init(context.get(), key.empty() ? &kNoKey : key.data(), key.size(), params) != 1) {
    return absl::InternalError(
        absl::StrCat("HMAC-SHA256 init with a ", key.size(), "-byte key: ", OpenSslError()));
  }
  for (absl::Span<const uint8_t> piece : pieces) {
    if (EVP_MAC_update(context.get(), piece.data(), piece.size()) != 1) {
      return absl::InternalError(absl::StrCat("HMAC-SHA256 update: ", OpenSslError()));
    }
  }
  Digest digest;
  size_t length = 0;
  if (EVP_MAC_final(context.get(), digest.data(), &length, digest.size()) != 1 || length != digest.size()) {
    return absl::InternalError(absl::StrCat("HMAC-SHA256 final (", length, " bytes): ", OpenSslError()));
  }
  return digest;
}

bool ConstantTimeEquals(absl::Span<const uint8_t> a, absl::Span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Status FillRandom(absl::Span<uint8_t> out) {
  if (out.empty()) return absl::OkStatus();
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return absl::InternalError(absl::StrCat("RAND_bytes for ", out.size(), " bytes: ", OpenSslError()));
  }
  return absl::OkStatus();
}

}  // namespace causeway::transport
