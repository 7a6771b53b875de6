// Shared-secret authentication primitives: the secret every island of a
// deployment holds, HMAC-SHA256, constant-time comparison and random nonces
// (all from OpenSSL's libcrypto).
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(Secret secret, Secret::FromFile(secret_path));
//   CAUSEWAY_ASSIGN_OR_RETURN(Digest mac, HmacSha256(secret.bytes(), {label, nonce}));
#ifndef CAUSEWAY_TRANSPORT_AUTH_H_
#define CAUSEWAY_TRANSPORT_AUTH_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway::transport {

// Bounds on a secret's length. The lower one keeps a guessable secret out:
// anyone who sees one handshake can test guesses offline.
inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;

// The environment variable Secret::FromEnvironment reads by default.
inline constexpr char kSecretEnvironmentVariable[] = "CAUSEWAY_SECRET";

// A shared secret: opaque bytes, from 16 to 4096 of them. Copyable; every
// copy wipes its bytes when destroyed. Its bytes never appear in messages.
class Secret {
 public:
  // Reads a secret from a file that only its owner can use. One trailing
  // newline ("\n" or "\r\n") is dropped, so that a file written by `echo` or
  // `openssl rand -hex 32 >file` holds the same secret as the variable
  // CAUSEWAY_SECRET=$(cat file).
  //
  // Errors:
  //   NotFound, PermissionDenied  the file cannot be opened (errno text).
  //   FailedPrecondition          not a regular file; owned by another user
  //                               than this process's effective one; or
  //                               readable or writable by group or others
  //                               (mode & 077): "secret file 'x' has mode
  //                               0644; it must not be accessible to group or
  //                               others (chmod 600 x)".
  //   InvalidArgument             empty, shorter than 16 bytes, or larger
  //                               than 4 KiB.
  static absl::StatusOr<Secret> FromFile(const std::string& path);

  // Reads a secret from the environment variable `name`, taken as it is (no
  // newline is dropped). NotFound if it is unset or empty; InvalidArgument if
  // it is shorter than 16 bytes or longer than 4 KiB.
  static absl::StatusOr<Secret> FromEnvironment(const char* name = kSecretEnvironmentVariable);

  // A secret from bytes the caller already has. InvalidArgument if shorter
  // than 16 or longer than 4096 bytes; `what` names their source in the
  // message.
  static absl::StatusOr<Secret> FromBytes(absl::string_view bytes, absl::string_view what = "secret");

  Secret(const Secret& other) = default;
  Secret& operator=(const Secret& other);
  Secret(Secret&& other) noexcept;
  Secret& operator=(Secret&& other) noexcept;
  ~Secret();

  absl::Span<const uint8_t> bytes() const { return bytes_; }

 private:
  explicit Secret(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  // Overwrites the bytes (in a way the compiler cannot drop) and empties them.
  void Wipe();

  std::vector<uint8_t> bytes_;
};

// A SHA-256 digest or HMAC.
inline constexpr size_t kDigestBytes = 32;
using Digest = std::array<uint8_t, kDigestBytes>;

// HMAC-SHA256 under `key` of the concatenation of `pieces`. Internal if
// libcrypto fails (it does not for valid input).
absl::StatusOr<Digest> HmacSha256(absl::Span<const uint8_t> key,
                                  absl::Span<const absl::Span<const uint8_t>> pieces);

// Whether `a` and `b` hold the same bytes, in a time that depends only on
// their lengths, never on where they differ. Different lengths are unequal.
bool ConstantTimeEquals(absl::Span<const uint8_t> a, absl::Span<const uint8_t> b);

// Fills `out` from the operating system's cryptographic random generator.
// Internal if libcrypto cannot (e.g. not seeded).
absl::Status FillRandom(absl::Span<uint8_t> out);

}  // namespace causeway::transport

#endif  // CAUSEWAY_TRANSPORT_AUTH_H_
