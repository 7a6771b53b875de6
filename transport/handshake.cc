#include "transport/handshake.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/status.h"
#include "transport/bytes.h"
#include "transport/frame.h"

namespace causeway::transport {
namespace {

// The fixed parts of the messages; the frame bounds of frame.h follow.
constexpr size_t kHelloFixedBytes = 2 + 2 + 4 + kNonceBytes + 1;
constexpr size_t kChallengeBytes = 2 + 4 + kNonceBytes + kDigestBytes;
constexpr size_t kProofBytes = kDigestBytes;
static_assert(kMaxHelloPayload == kHelloFixedBytes + kMaxPeerNameBytes);
static_assert(kMaxChallengePayload == kChallengeBytes);
static_assert(kMaxProofPayload == kProofBytes);
static_assert(kMaxWelcomePayload == 1 + kMaxPeerNameBytes);
static_assert(kMaxRefusedPayload == kMaxRefusalBytes);

// The labels that make the two directions' MACs differ.
constexpr absl::string_view kServerLabel = "causeway-server-v1";
constexpr absl::string_view kClientLabel = "causeway-client-v1";

absl::Span<const uint8_t> AsBytes(absl::string_view text) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// `text` with every byte outside printable ASCII written as \xNN, so that a
// peer's text cannot forge lines or control sequences in a log.
std::string Printable(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (c >= 0x20 && c <= 0x7e) {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(c));
    }
  }
  return out;
}

// What is wrong with `name` as a peer name; empty when nothing is.
std::string NameProblem(absl::string_view name) {
  if (name.size() > kMaxPeerNameBytes) {
    return absl::StrCat("a name of ", name.size(), " bytes exceeds the ", kMaxPeerNameBytes, "-byte limit");
  }
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::StrFormat("name '%s' holds byte 0x%02x; names are printable ASCII", Printable(name),
                             static_cast<uint8_t>(c));
    }
  }
  return "";
}

// Takes a name of `length` bytes from `reader` and checks it.
absl::StatusOr<std::string> GetName(ByteReader& reader, size_t length, absl::string_view message) {
  absl::string_view name;
  if (!reader.GetText(length, &name)) {
    return absl::DataLossError(absl::StrCat(message, " is truncated in its name"));
  }
  if (std::string problem = NameProblem(name); !problem.empty()) {
    return absl::DataLossError(absl::StrCat(message, ": ", problem));
  }
  return std::string(name);
}

absl::StatusOr<Digest> ServerMac(const Secret& secret, const Nonce& client_nonce, const Nonce& server_nonce) {
  return HmacSha256(secret.bytes(), {AsBytes(kServerLabel), client_nonce, server_nonce});
}

absl::StatusOr<Digest> ClientMac(const Secret& secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return HmacSha256(secret.bytes(), {AsBytes(kClientLabel), server_nonce, client_nonce});
}

// "a challenge or refused frame", for messages.
std::string DescribeTypes(std::initializer_list<FrameType> types) {
  std::string text = "a";
  const char* separator = " ";
  for (FrameType type : types) {
    absl::StrAppend(&text, separator, FrameTypeName(type));
    separator = " or ";
  }
  return absl::StrCat(text, " frame");
}

// One side of a handshake in progress: the connection, its deadline, and
// how the peer is named in messages.
class Exchange {
 public:
  Exchange(Socket& socket, absl::Duration timeout)
      : socket_(socket), deadline_(absl::Now() + timeout), peer_(socket.peer_address().ToString()) {}

  // Sends one handshake message.
  absl::Status Send(FrameType type, absl::Span<const uint8_t> payload) {
    return WriteFrame(socket_, type, {payload}, deadline_);
  }

  // Reads the next frame, which must be one of `types`.
  absl::StatusOr<Frame> Receive(std::initializer_list<FrameType> types) {
    uint64_t max_payload = 0;
    for (FrameType type : types) max_payload = std::max(max_payload, MaxFrameLength(type));
    absl::StatusOr<Frame> frame = ReadFrame(socket_, /*authenticated=*/false, max_payload, deadline_);
    if (!frame.ok()) {
      return absl::Status(frame.status().code(),
                          absl::StrCat("handshake with ", peer_, ", waiting for ", DescribeTypes(types), ": ",
                                       frame.status().message()));
    }
    if (std::find(types.begin(), types.end(), frame->type) == types.end()) {
      return absl::DataLossError(absl::StrCat("handshake with ", peer_, ": expected ", DescribeTypes(types),
                                              ", got a ", FrameTypeName(frame->type), " frame"));
    }
    return frame;
  }

  // Tells the peer why it is refused (as far as the connection allows: the
  // local error matters more) and returns `error`.
  absl::Status Refuse(absl::string_view reason, absl::Status error) {
    const std::vector<uint8_t> payload = EncodeRefused({std::string(reason)});
    WriteFrame(socket_, FrameType::kRefused, {payload}, deadline_).IgnoreError();
    return error;
  }

  // The error for a Refused frame the peer sent.
  absl::Status PeerRefused(const Frame& frame, absl::string_view who) {
    ASSIGN_OR_RETURN(Refused refused, ParseRefused(frame.payload));
    return absl::PermissionDeniedError(
        absl::StrCat(who, " refused the handshake: ", Printable(refused.reason)));
  }

  const std::string& peer() const { return peer_; }

 private:
  Socket& socket_;
  const absl::Time deadline_;
  const std::string peer_;
};

absl::StatusOr<PeerInfo> RunClient(Socket& socket, const ClientHandshakeOptions& options) {
  if (std::string problem = NameProblem(options.name); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("client handshake: ", problem));
  }
  const std::optional<Secret>& secret = options.secret;
  Exchange exchange(socket, options.timeout);
  const std::string server = absl::StrCat("server at ", exchange.peer());

  Hello hello{kMinProtocolVersion, kMaxProtocolVersion, secret ? kHelloHasSecret : 0, {}, options.name};
  RETURN_IF_ERROR(FillRandom(absl::MakeSpan(hello.nonce)));
  ASSIGN_OR_RETURN(std::vector<uint8_t> hello_bytes, EncodeHello(hello));
  RETURN_IF_ERROR(exchange.Send(FrameType::kHello, hello_bytes));

  ASSIGN_OR_RETURN(Frame frame, exchange.Receive({FrameType::kChallenge, FrameType::kRefused}));
  if (frame.type == FrameType::kRefused) return exchange.PeerRefused(frame, server);
  ASSIGN_OR_RETURN(Challenge challenge, ParseChallenge(frame.payload));
  if (challenge.version < hello.min_version || challenge.version > hello.max_version) {
    return exchange.Refuse("the chosen version was not offered",
                           absl::DataLossError(absl::StrCat(server, " chose protocol version ",
                                                            challenge.version, ", outside the offered ",
                                                            hello.min_version, "..", hello.max_version)));
  }
  Proof proof;
  if (secret) {
    if ((challenge.flags & kChallengeRequiresAuth) == 0) {
      return exchange.Refuse(
          "this client has a secret and accepts only servers that require it",
          absl::UnauthenticatedError(absl::StrCat(
              server, " does not require authentication; a client with a secret refuses such a server")));
    }
    ASSIGN_OR_RETURN(Digest expected, ServerMac(*secret, hello.nonce, challenge.nonce));
    if (!ConstantTimeEquals(expected, challenge.mac)) {
      return exchange.Refuse(
          "the server's proof does not match",
          absl::UnauthenticatedError(absl::StrCat(
              server, " failed to prove that it holds the shared secret (a different secret?)")));
    }
    ASSIGN_OR_RETURN(proof.mac, ClientMac(*secret, challenge.nonce, hello.nonce));
  } else if ((challenge.flags & kChallengeRequiresAuth) != 0) {
    return exchange.Refuse("this client has no secret",
                           absl::FailedPreconditionError(absl::StrCat(
                               server,
                               " requires a shared secret and this client has none (set CAUSEWAY_SECRET "
                               "or a secret file)")));
  }
  RETURN_IF_ERROR(exchange.Send(FrameType::kProof, EncodeProof(proof)));

  ASSIGN_OR_RETURN(frame, exchange.Receive({FrameType::kWelcome, FrameType::kRefused}));
  if (frame.type == FrameType::kRefused) return exchange.PeerRefused(frame, server);
  ASSIGN_OR_RETURN(Welcome welcome, ParseWelcome(frame.payload));
  return PeerInfo{std::move(welcome.name), challenge.version, secret.has_value()};
}

absl::StatusOr<PeerInfo> RunServer(Socket& socket, const ServerHandshakeOptions& options) {
  if (std::string problem = NameProblem(options.name); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("server handshake: ", problem));
  }
  const std::optional<Secret>& secret = options.secret;
  Exchange exchange(socket, options.timeout);

  ASSIGN_OR_RETURN(Frame frame, exchange.Receive({FrameType::kHello}));
  ASSIGN_OR_RETURN(Hello hello, ParseHello(frame.payload));
  const std::string client = absl::StrCat("client '", hello.name, "' at ", exchange.peer());
  const uint16_t low = std::max(hello.min_version, kMinProtocolVersion);
  const uint16_t high = std::min(hello.max_version, kMaxProtocolVersion);
  if (low > high) {
    const std::string versions =
        absl::StrCat("the client speaks protocol versions ", hello.min_version, "..", hello.max_version,
                     ", this server ", kMinProtocolVersion, "..", kMaxProtocolVersion);
    return exchange.Refuse(
        absl::StrCat("no common version: ", versions),
        absl::FailedPreconditionError(absl::StrCat(client, ": no common version: ", versions)));
  }
  if (!secret) {
    if (!socket.local_address().IsLoopback()) {
      return exchange.Refuse(
          "this server has no secret and accepts only loopback connections",
          absl::PermissionDeniedError(absl::StrCat(client, " came to ", socket.local_address().ToString(),
                                                   ", not over loopback; without a secret only loopback "
                                                   "connections are accepted")));
    }
  } else if ((hello.flags & kHelloHasSecret) == 0) {
    return exchange.Refuse(
        "this server requires a shared secret and the client has none",
        absl::UnauthenticatedError(absl::StrCat(client, " has no secret; this server requires one")));
  }

  Challenge challenge{high, secret ? kChallengeRequiresAuth : 0, {}, {}};
  RETURN_IF_ERROR(FillRandom(absl::MakeSpan(challenge.nonce)));
  if (secret) {
    ASSIGN_OR_RETURN(challenge.mac, ServerMac(*secret, hello.nonce, challenge.nonce));
  }
  RETURN_IF_ERROR(exchange.Send(FrameType::kChallenge, EncodeChallenge(challenge)));

  ASSIGN_OR_RETURN(frame, exchange.Receive({FrameType::kProof, FrameType::kRefused}));
  if (frame.type == FrameType::kRefused) return exchange.PeerRefused(frame, client);
  ASSIGN_OR_RETURN(Proof proof, ParseProof(frame.payload));
  if (secret) {
    ASSIGN_OR_RETURN(Digest expected, ClientMac(*secret, challenge.nonce, hello.nonce));
    if (!ConstantTimeEquals(expected, proof.mac)) {
      return exchange.Refuse("authentication failed",
                             absl::UnauthenticatedError(
                                 absl::StrCat(client,
                                              " failed to prove that it holds the shared secret (a different "
                                              "secret, or a proof replayed from another connection)")));
    }
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> welcome, EncodeWelcome({options.name}));
  RETURN_IF_ERROR(exchange.Send(FrameType::kWelcome, welcome));
  return PeerInfo{std::move(hello.name), high, secret.has_value()};
}

}  // namespace

absl::Status CheckPeerName(absl::string_view name) {
  std::string problem = NameProblem(name);
  return problem.empty() ? absl::OkStatus() : absl::InvalidArgumentError(problem);
}

absl::StatusOr<std::vector<uint8_t>> EncodeHello(const Hello& hello) {
  RETURN_IF_ERROR(CheckPeerName(hello.name));
  std::vector<uint8_t> bytes;
  bytes.reserve(kHelloFixedBytes + hello.name.size());
  ByteWriter writer(&bytes);
  writer.PutInt(hello.min_version);
  writer.PutInt(hello.max_version);
  writer.PutInt(hello.flags);
  writer.PutBytes(hello.nonce);
  writer.PutInt(static_cast<uint8_t>(hello.name.size()));
  writer.PutBytes(hello.name);
  return bytes;
}

std::vector<uint8_t> EncodeChallenge(const Challenge& challenge) {
  std::vector<uint8_t> bytes;
  bytes.reserve(kChallengeBytes);
  ByteWriter writer(&bytes);
  writer.PutInt(challenge.version);
  writer.PutInt(challenge.flags);
  writer.PutBytes(challenge.nonce);
  writer.PutBytes(challenge.mac);
  return bytes;
}

std::vector<uint8_t> EncodeProof(const Proof& proof) {
  return std::vector<uint8_t>(proof.mac.begin(), proof.mac.end());
}

absl::StatusOr<std::vector<uint8_t>> EncodeWelcome(const Welcome& welcome) {
  RETURN_IF_ERROR(CheckPeerName(welcome.name));
  std::vector<uint8_t> bytes;
  ByteWriter writer(&bytes);
  writer.PutInt(static_cast<uint8_t>(welcome.name.size()));
  writer.PutBytes(welcome.name);
  return bytes;
}

std::vector<uint8_t> EncodeRefused(const Refused& refused) {
  const absl::string_view reason = absl::string_view(refused.reason).substr(0, kMaxRefusalBytes);
  return std::vector<uint8_t>(reason.begin(), reason.end());
}

absl::StatusOr<Hello> ParseHello(absl::Span<const uint8_t> bytes) {
  ByteReader reader(bytes);
  Hello hello;
  uint8_t name_length = 0;
  if (!reader.GetInt(&hello.min_version) || !reader.GetInt(&hello.max_version) ||
      !reader.GetInt(&hello.flags) || !reader.GetBytes(absl::MakeSpan(hello.nonce)) ||
      !reader.GetInt(&name_length)) {
    return absl::DataLossError(
        absl::StrCat("a hello is at least ", kHelloFixedBytes, " bytes, got ", bytes.size()));
  }
  if (reader.remaining() != name_length) {
    return absl::DataLossError(absl::StrCat("a hello with a ", name_length, "-byte name is ",
                                            kHelloFixedBytes + name_length, " bytes, got ", bytes.size()));
  }
  ASSIGN_OR_RETURN(hello.name, GetName(reader, name_length, "hello"));
  if (hello.min_version == 0 || hello.min_version > hello.max_version) {
    return absl::DataLossError(absl::StrCat("hello offers protocol versions ", hello.min_version, "..",
                                            hello.max_version,
                                            ", which is not a range of versions from 1 up"));
  }
  return hello;
}

absl::StatusOr<Challenge> ParseChallenge(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kChallengeBytes) {
    return absl::DataLossError(
        absl::StrCat("a challenge is ", kChallengeBytes, " bytes, got ", bytes.size()));
  }
  ByteReader reader(bytes);
  Challenge challenge;
  // Cannot fail: the size was checked.
  reader.GetInt(&challenge.version);
  reader.GetInt(&challenge.flags);
  reader.GetBytes(absl::MakeSpan(challenge.nonce));
  reader.GetBytes(absl::MakeSpan(challenge.mac));
  if (challenge.version == 0) return absl::DataLossError("challenge chooses protocol version 0");
  return challenge;
}

absl::StatusOr<Proof> ParseProof(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kProofBytes) {
    return absl::DataLossError(absl::StrCat("a proof is ", kProofBytes, " bytes, got ", bytes.size()));
  }
  Proof proof;
  std::copy(bytes.begin(), bytes.end(), proof.mac.begin());
  return proof;
}

absl::StatusOr<Welcome> ParseWelcome(absl::Span<const uint8_t> bytes) {
  ByteReader reader(bytes);
  uint8_t name_length = 0;
  if (!reader.GetInt(&name_length)) return absl::DataLossError("a welcome is at least 1 byte, got 0");
  if (reader.remaining() != name_length) {
    return absl::DataLossError(absl::StrCat("a welcome with a ", name_length, "-byte name is ",
                                            1 + name_length, " bytes, got ", bytes.size()));
  }
  Welcome welcome;
  ASSIGN_OR_RETURN(welcome.name, GetName(reader, name_length, "welcome"));
  return welcome;
}

absl::StatusOr<Refused> ParseRefused(absl::Span<const uint8_t> bytes) {
  if (bytes.size() > kMaxRefusalBytes) {
    return absl::DataLossError(
        absl::StrCat("a refusal is at most ", kMaxRefusalBytes, " bytes, got ", bytes.size()));
  }
  return Refused{std::string(bytes.begin(), bytes.end())};
}

absl::StatusOr<PeerInfo> ClientHandshake(Socket& socket, const ClientHandshakeOptions& options) {
  absl::StatusOr<PeerInfo> peer = RunClient(socket, options);
  if (!peer.ok()) socket.ShutdownBoth();
  return peer;
}

absl::StatusOr<PeerInfo> ServerHandshake(Socket& socket, const ServerHandshakeOptions& options) {
  absl::StatusOr<PeerInfo> peer = RunServer(socket, options);
  if (!peer.ok()) socket.ShutdownBoth();
  return peer;
}

absl::Status CheckListenPolicy(const SocketAddress& address, bool has_secret) {
  if (has_secret || address.IsLoopback()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "refusing to listen on ", address.ToString(),
      " without a shared secret: anyone who can reach it could connect. Listen on a loopback address "
      "(127.0.0.1 or [::1]) or give the server a secret (CAUSEWAY_SECRET or a secret file)"));
}

}  // namespace causeway::transport
