// The handshake that opens every connection between islands: it agrees on a
// protocol version, exchanges names and, when the islands share a secret,
// makes each side prove to the other that it holds the secret.
//
// Four messages, each one frame (frame.h) of fixed layout, little-endian; no
// general-purpose parser runs before the peer is authenticated:
//
//   client -> Hello      min_version u16, max_version u16,
//                        flags u32 (bit 0: the client has a secret),
//                        nonce_c[32], name_len u8, name[name_len <= 64]
//   server -> Challenge  version u16 (chosen from the client's range),
//                        flags u32 (bit 0: the server requires authentication),
//                        nonce_s[32], mac_s[32]
//   client -> Proof      mac_c[32]
//   server -> Welcome    name_len u8, name[name_len <= 64]
//
//   mac_s = HMAC-SHA256(K, "causeway-server-v1" || nonce_c || nonce_s)
//   mac_c = HMAC-SHA256(K, "causeway-client-v1" || nonce_s || nonce_c)
//
// (both zero without a secret). Either side may answer with Refused (a reason
// of up to 256 bytes) instead, and then closes the connection.
//
// Why it holds: nonces are fresh random bytes on every connection, so a
// Hello and Proof recorded from one connection do not prove anything on
// another; the two directions use different labels, so a peer cannot send
// back (reflect) the MAC it was shown; MACs are compared in constant time.
//
// Policy: a client with a secret accepts only a server that requires one and
// proves it; a server with a secret accepts only a client that proves it; a
// server without a secret accepts only connections that arrived over
// loopback, where every local user is trusted.
//
// What it does not do: traffic after the handshake is neither encrypted nor
// integrity-protected, so someone who can alter packets on the path can take
// over an authenticated connection. Authentication keeps out peers that do
// not hold the secret; it is not a secure channel.
//
// Example (server side):
//   ServerHandshakeOptions options;
//   CAUSEWAY_ASSIGN_OR_RETURN(options.secret, Secret::FromEnvironment());
//   options.name = "island-0";
//   CAUSEWAY_RETURN_IF_ERROR(CheckListenPolicy(address, options.secret.has_value()));
//   CAUSEWAY_ASSIGN_OR_RETURN(Socket listener, Socket::Listen(address, 64));
//   CAUSEWAY_ASSIGN_OR_RETURN(Socket conn, listener.Accept(absl::Now() + absl::Seconds(30)));
//   CAUSEWAY_ASSIGN_OR_RETURN(PeerInfo peer, ServerHandshake(conn, options));
//   // ReadFrame(conn, /*authenticated=*/true, ...) from here on.
#ifndef CAUSEWAY_TRANSPORT_HANDSHAKE_H_
#define CAUSEWAY_TRANSPORT_HANDSHAKE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/transport/auth.h"
#include "causeway/transport/frame.h"
#include "causeway/transport/socket.h"

namespace causeway::transport {

// The protocol versions this build speaks (what the frames after the
// handshake mean; the frame header has its own kWireVersion).
inline constexpr uint16_t kMinProtocolVersion = 1;
inline constexpr uint16_t kMaxProtocolVersion = 1;

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMaxPeerNameBytes = 64;
inline constexpr size_t kMaxRefusalBytes = 256;

// Hello.flags: the client holds a secret.
inline constexpr uint32_t kHelloHasSecret = 1u << 0;
// Challenge.flags: the server requires authentication.
inline constexpr uint32_t kChallengeRequiresAuth = 1u << 0;

using Nonce = std::array<uint8_t, kNonceBytes>;

// The handshake messages, as decoded. Flags bits not defined above are
// carried but ignored.
struct Hello {
  uint16_t min_version = 0;
  uint16_t max_version = 0;
  uint32_t flags = 0;
  Nonce nonce{};
  std::string name;

  friend bool operator==(const Hello&, const Hello&) = default;
};
struct Challenge {
  uint16_t version = 0;
  uint32_t flags = 0;
  Nonce nonce{};
  Digest mac{};

  friend bool operator==(const Challenge&, const Challenge&) = default;
};
struct Proof {
  Digest mac{};

  friend bool operator==(const Proof&, const Proof&) = default;
};
struct Welcome {
  std::string name;

  friend bool operator==(const Welcome&, const Welcome&) = default;
};
struct Refused {
  std::string reason;

  friend bool operator==(const Refused&, const Refused&) = default;
};

// OK if `name` can name a peer: at most 64 bytes of printable ASCII (so that
// it can go into logs and messages as it is). InvalidArgument otherwise.
absl::Status CheckPeerName(absl::string_view name);

// Encoders, the exact inverses of the parsers below. EncodeHello and
// EncodeWelcome fail with InvalidArgument on a name CheckPeerName refuses;
// EncodeRefused cuts a reason longer than 256 bytes.
absl::StatusOr<std::vector<uint8_t>> EncodeHello(const Hello& hello);
std::vector<uint8_t> EncodeChallenge(const Challenge& challenge);
std::vector<uint8_t> EncodeProof(const Proof& proof);
absl::StatusOr<std::vector<uint8_t>> EncodeWelcome(const Welcome& welcome);
std::vector<uint8_t> EncodeRefused(const Refused& refused);

// Parsers of a frame's payload: pure functions over untrusted bytes that
// accept exactly what the encoders produce (wrong sizes, a name_len that
// disagrees with the size, a name that CheckPeerName refuses, an empty or
// zero version range, version 0) and fail with DataLoss naming the message
// and what was wrong. A Refused reason may hold any bytes; escape it before
// showing it.
absl::StatusOr<Hello> ParseHello(absl::Span<const uint8_t> bytes);
absl::StatusOr<Challenge> ParseChallenge(absl::Span<const uint8_t> bytes);
absl::StatusOr<Proof> ParseProof(absl::Span<const uint8_t> bytes);
absl::StatusOr<Welcome> ParseWelcome(absl::Span<const uint8_t> bytes);
absl::StatusOr<Refused> ParseRefused(absl::Span<const uint8_t> bytes);

inline constexpr absl::Duration kDefaultHandshakeTimeout = absl::Seconds(5);

struct ClientHandshakeOptions {
  // With a secret, the server must require and prove it. Without one, the
  // client trusts any server (which, if it has no secret either, accepts
  // only loopback connections).
  std::optional<Secret> secret;
  // This island's name, told to the server (CheckPeerName).
  std::string name;
  // The deadline of the whole handshake, from the call.
  absl::Duration timeout = kDefaultHandshakeTimeout;
};

struct ServerHandshakeOptions {
  // With a secret, every client must prove it. Without one, only connections
  // that arrived over loopback are accepted.
  std::optional<Secret> secret;
  // This island's name, told to the client (CheckPeerName).
  std::string name;
  // The deadline of the whole handshake, from the call.
  absl::Duration timeout = kDefaultHandshakeTimeout;
};

// What a finished handshake established about the peer.
struct PeerInfo {
  std::string name;
  // The protocol version both sides speak on this connection.
  uint16_t version = 0;
  // Whether the peer proved the shared secret (false on loopback without
  // one).
  bool authenticated = false;
};

// Runs the client side on a connection just established with
// Socket::Connect. On success the connection carries authenticated frames
// (ReadFrame with authenticated = true). On failure the connection has been
// shut down (after telling the server why, when the client refused it).
//
// Errors:
//   InvalidArgument   `options.name` is not a valid name; nothing was sent.
//   PermissionDenied  the server refused; the message carries its reason.
//   Unauthenticated   the client has a secret and the server did not require
//                     one, or could not prove it.
//   FailedPrecondition the server requires a secret and the client has none.
//   DeadlineExceeded  not finished within `options.timeout`.
//   DataLoss, Unavailable, ...  a malformed message, a lost connection.
absl::StatusOr<PeerInfo> ClientHandshake(Socket& socket, const ClientHandshakeOptions& options);

// Runs the server side on a connection just accepted. The peer is allocated
// nothing but the frames of the handshake (at most 256 bytes each) until it
// has proved the secret. On failure the connection has been shut down,
// after a Refused frame when the server refused the client.
//
// Errors:
//   InvalidArgument   `options.name` is not a valid name; nothing was read.
//   Unauthenticated   the client has no secret, or its proof is wrong (a
//                     different secret, or a proof replayed from another
//                     connection) while the server has one.
//   PermissionDenied  no secret and the connection did not come over
//                     loopback; or the client refused the server.
//   FailedPrecondition no protocol version in common.
//   DeadlineExceeded  not finished within `options.timeout`.
//   DataLoss, Unavailable, ...  a malformed message, a frame that is not
//                     part of the handshake, a lost connection.
absl::StatusOr<PeerInfo> ServerHandshake(Socket& socket, const ServerHandshakeOptions& options);

// The server side of one handshake, driven without blocking: Advance reads
// what has arrived and sends what is due, and says when the handshake has
// ended. One thread serves any number of them (IslandServer serves every
// connection in its handshake from its accept loop, with no thread per
// connection); ServerHandshake drives one to its end. It reads nothing past
// the client's proof, so what the client sends once welcomed stays on the
// socket for the connection. Errors (result()) are ServerHandshake's.
//
//   ServerHandshakeState state(std::move(socket), options);
//   while (!state.Advance()) poll(state.fd(), state.events(), state.deadline());
//   CAUSEWAY_ASSIGN_OR_RETURN(PeerInfo peer, state.result());
//   Socket welcomed = state.TakeSocket();
class ServerHandshakeState {
 public:
  // The handshake's deadline is options.timeout from now.
  ServerHandshakeState(Socket socket, const ServerHandshakeOptions& options);
  ServerHandshakeState(const ServerHandshakeState&) = delete;
  ServerHandshakeState& operator=(const ServerHandshakeState&) = delete;

  // Reads and writes until the socket would block or the handshake ends;
  // true once it has ended (also when the deadline has passed). On failure
  // the socket has been shut down, after a Refused frame when the server
  // refused the client.
  bool Advance();

  // What to wait for before the next Advance: POLLIN or POLLOUT on fd(),
  // until deadline() at most.
  short events() const;
  int fd() const { return socket_.fd(); }
  absl::Time deadline() const { return deadline_; }
  const Socket& socket() const { return socket_; }

  // Once ended: the peer, or why the handshake failed.
  const absl::StatusOr<PeerInfo>& result() const { return result_; }
  // Once ended: the socket (for the connection, when the peer was welcomed).
  Socket TakeSocket() { return std::move(socket_); }

 private:
  enum class Phase { kHello, kProof, kSendingLast, kEnded };
  // The frame types that may come next, for messages and bounds.
  absl::Span<const FrameType> Expected() const;
  // Reads what it can of the next frame; true once `frame_` holds it whole.
  absl::StatusOr<bool> ReadFrameSome();
  // Acts on the whole frame in `frame_`.
  absl::Status OnFrame();
  // Queues a frame to send.
  void Queue(FrameType type, absl::Span<const uint8_t> payload);
  // Queues a Refused frame; the handshake ends with `error` once it is sent
  // (or cannot be).
  void Refuse(absl::string_view reason, absl::Status error);
  absl::StatusOr<PeerInfo> PeerRefused() const;
  void End(absl::StatusOr<PeerInfo> result);

  Socket socket_;
  const ServerHandshakeOptions options_;
  const absl::Time deadline_;
  const std::string peer_;
  Phase phase_ = Phase::kHello;
  // The frame coming in: its header bytes, then its payload.
  std::array<uint8_t, kFrameHeaderSize> header_bytes_{};
  size_t header_got_ = 0;
  std::optional<FrameHeader> header_;
  std::vector<uint8_t> payload_;
  size_t payload_got_ = 0;
  // Bytes to send, and how many are sent.
  std::vector<uint8_t> output_;
  size_t output_sent_ = 0;
  // The result once the last frame (welcome or refusal) is sent.
  absl::StatusOr<PeerInfo> last_ = absl::UnknownError("handshake not ended");
  // From the hello and the challenge.
  Hello hello_;
  std::string client_;
  uint16_t version_ = 0;
  Nonce server_nonce_{};
  absl::StatusOr<PeerInfo> result_ = absl::UnknownError("handshake not ended");
};

// Whether a server may listen on `address`: a server without a secret may
// listen only on a loopback address. Call before Socket::Listen; the server
// handshake enforces the same rule per connection.
// PermissionDenied, saying how to fix it, otherwise.
absl::Status CheckListenPolicy(const SocketAddress& address, bool has_secret);

}  // namespace causeway::transport

#endif  // CAUSEWAY_TRANSPORT_HANDSHAKE_H_
