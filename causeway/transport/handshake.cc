#include "causeway/transport/handshake.h"

#include <poll.h>

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
#include "causeway/base/status.h"
#include "causeway/transport/bytes.h"
#include "causeway/transport/frame.h"

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
std::string DescribeTypes(absl::Span<const FrameType> types) {
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
    CAUSEWAY_ASSIGN_OR_RETURN(Refused refused, ParseRefused(frame.payload));
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
  CAUSEWAY_RETURN_IF_ERROR(FillRandom(absl::MakeSpan(hello.nonce)));
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<uint8_t> hello_bytes, EncodeHello(hello));
  CAUSEWAY_RETURN_IF_ERROR(exchange.Send(FrameType::kHello, hello_bytes));

  CAUSEWAY_ASSIGN_OR_RETURN(Frame frame, exchange.Receive({FrameType::kChallenge, FrameType::kRefused}));
  if (frame.type == FrameType::kRefused) return exchange.PeerRefused(frame, server);
  CAUSEWAY_ASSIGN_OR_RETURN(Challenge challenge, ParseChallenge(frame.payload));
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
    CAUSEWAY_ASSIGN_OR_RETURN(Digest expected, ServerMac(*secret, hello.nonce, challenge.nonce));
    if (!ConstantTimeEquals(expected, challenge.mac)) {
      return exchange.Refuse(
          "the server's proof does not match",
          absl::UnauthenticatedError(absl::StrCat(
              server, " failed to prove that it holds the shared secret (a different secret?)")));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(proof.mac, ClientMac(*secret, challenge.nonce, hello.nonce));
  } else if ((challenge.flags & kChallengeRequiresAuth) != 0) {
    return exchange.Refuse("this client has no secret",
                           absl::FailedPreconditionError(absl::StrCat(
                               server,
                               " requires a shared secret and this client has none (set CAUSEWAY_SECRET "
                               "or a secret file)")));
  }
  CAUSEWAY_RETURN_IF_ERROR(exchange.Send(FrameType::kProof, EncodeProof(proof)));

  CAUSEWAY_ASSIGN_OR_RETURN(frame, exchange.Receive({FrameType::kWelcome, FrameType::kRefused}));
  if (frame.type == FrameType::kRefused) return exchange.PeerRefused(frame, server);
  CAUSEWAY_ASSIGN_OR_RETURN(Welcome welcome, ParseWelcome(frame.payload));
  return PeerInfo{std::move(welcome.name), challenge.version, secret.has_value()};
}

}  // namespace

absl::Status CheckPeerName(absl::string_view name) {
  std::string problem = NameProblem(name);
  return problem.empty() ? absl::OkStatus() : absl::InvalidArgumentError(problem);
}

absl::StatusOr<std::vector<uint8_t>> EncodeHello(const Hello& hello) {
  CAUSEWAY_RETURN_IF_ERROR(CheckPeerName(hello.name));
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
  CAUSEWAY_RETURN_IF_ERROR(CheckPeerName(welcome.name));
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
  CAUSEWAY_ASSIGN_OR_RETURN(hello.name, GetName(reader, name_length, "hello"));
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
  CAUSEWAY_ASSIGN_OR_RETURN(welcome.name, GetName(reader, name_length, "welcome"));
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
  ServerHandshakeState state(std::move(socket), options);
  while (!state.Advance()) {
    // A failed poll ends the handshake at its deadline; Advance then says so.
    state.socket().Wait(state.events(), state.deadline()).IgnoreError();
  }
  socket = state.TakeSocket();
  return state.result();
}

ServerHandshakeState::ServerHandshakeState(Socket socket, const ServerHandshakeOptions& options)
    : socket_(std::move(socket)),
      options_(options),
      deadline_(absl::Now() + options.timeout),
      peer_(socket_.peer_address().ToString()) {
  if (std::string problem = NameProblem(options_.name); !problem.empty()) {
    End(absl::InvalidArgumentError(absl::StrCat("server handshake: ", problem)));
  }
}

absl::Span<const FrameType> ServerHandshakeState::Expected() const {
  static constexpr FrameType kHello[] = {FrameType::kHello};
  static constexpr FrameType kProof[] = {FrameType::kProof, FrameType::kRefused};
  if (phase_ == Phase::kHello) return kHello;
  return kProof;
}

short ServerHandshakeState::events() const { return output_sent_ < output_.size() ? POLLOUT : POLLIN; }

void ServerHandshakeState::End(absl::StatusOr<PeerInfo> result) {
  phase_ = Phase::kEnded;
  result_ = std::move(result);
  if (!result_.ok()) socket_.ShutdownBoth();
}

void ServerHandshakeState::Queue(FrameType type, absl::Span<const uint8_t> payload) {
  const std::array<uint8_t, kFrameHeaderSize> header = EncodeFrameHeader(type, payload.size());
  output_.insert(output_.end(), header.begin(), header.end());
  output_.insert(output_.end(), payload.begin(), payload.end());
}

void ServerHandshakeState::Refuse(absl::string_view reason, absl::Status error) {
  Queue(FrameType::kRefused, EncodeRefused({std::string(reason)}));
  last_ = std::move(error);
  phase_ = Phase::kSendingLast;
}

absl::StatusOr<PeerInfo> ServerHandshakeState::PeerRefused() const {
  CAUSEWAY_ASSIGN_OR_RETURN(Refused refused, ParseRefused(payload_));
  return absl::PermissionDeniedError(
      absl::StrCat(client_, " refused the handshake: ", Printable(refused.reason)));
}

bool ServerHandshakeState::Advance() {
  while (phase_ != Phase::kEnded) {
    if (absl::Now() >= deadline_) {
      // A refusal that could not be sent in time: the refusal's error
      // matters more than the send's.
      if (phase_ == Phase::kSendingLast && !last_.ok()) {
        End(std::move(last_));
      } else {
        End(absl::DeadlineExceededError(absl::StrCat(
            "handshake with ", peer_, ", ",
            phase_ == Phase::kSendingLast ? "sending its welcome"
                                          : absl::StrCat("waiting for ", DescribeTypes(Expected())),
            ": not done within ", absl::FormatDuration(options_.timeout), " (", header_got_, " of ",
            kFrameHeaderSize, " header bytes and ", payload_got_, " payload bytes of a frame received, ",
            output_sent_, " of ", output_.size(), " bytes sent)")));
      }
      break;
    }
    if (output_sent_ < output_.size()) {
      absl::StatusOr<size_t> sent = socket_.WriteSome(absl::MakeSpan(output_).subspan(output_sent_));
      if (!sent.ok()) {
        End(phase_ == Phase::kSendingLast && !last_.ok()
                ? std::move(last_)
                : absl::StatusOr<PeerInfo>(absl::Status(
                      sent.status().code(),
                      absl::StrCat("handshake with ", peer_, ": sending: ", sent.status().message()))));
        break;
      }
      if (*sent == 0) return false;  // the kernel takes no more now: POLLOUT
      output_sent_ += *sent;
      continue;
    }
    if (phase_ == Phase::kSendingLast) {
      End(std::move(last_));
      break;
    }
    absl::StatusOr<bool> whole = ReadFrameSome();
    if (!whole.ok()) {
      End(absl::Status(whole.status().code(),
                       absl::StrCat("handshake with ", peer_, ", waiting for ", DescribeTypes(Expected()),
                                    ": ", whole.status().message())));
      break;
    }
    if (!*whole) return false;  // nothing more has arrived: POLLIN
    if (absl::Status s = OnFrame(); !s.ok()) {
      End(s);
      break;
    }
    header_got_ = payload_got_ = 0;
    header_.reset();
    payload_.clear();
  }
  return true;
}

absl::StatusOr<bool> ServerHandshakeState::ReadFrameSome() {
  while (!header_.has_value()) {
    absl::StatusOr<size_t> got =
        socket_.ReadSome(&header_bytes_[header_got_], kFrameHeaderSize - header_got_);
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat("reading a frame header: ", got.status().message(), " after ",
                                       header_got_, " of ", kFrameHeaderSize, " bytes"));
    }
    if (*got == 0) return false;
    header_got_ += *got;
    if (header_got_ < kFrameHeaderSize) continue;
    CAUSEWAY_ASSIGN_OR_RETURN(FrameHeader header, ParseFrameHeader(header_bytes_, /*authenticated=*/false));
    uint64_t max_payload = 0;
    for (FrameType type : Expected()) max_payload = std::max(max_payload, MaxFrameLength(type));
    if (header.length > max_payload) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a ", FrameTypeName(header.type), " frame of ", header.length,
                       " bytes exceeds this receiver's limit of ", max_payload, " bytes"));
    }
    header_ = header;
    payload_.resize(header.length);  // at most kMaxRefusedPayload
  }
  while (payload_got_ < payload_.size()) {
    absl::StatusOr<size_t> got = socket_.ReadSome(&payload_[payload_got_], payload_.size() - payload_got_);
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat("reading the payload of a ", FrameTypeName(header_->type),
                                       " frame: ", got.status().message(), " after ", payload_got_, " of ",
                                       payload_.size(), " bytes"));
    }
    if (*got == 0) return false;
    payload_got_ += *got;
  }
  const absl::Span<const FrameType> expected = Expected();
  if (std::find(expected.begin(), expected.end(), header_->type) == expected.end()) {
    return absl::DataLossError(absl::StrCat("expected ", DescribeTypes(expected), ", got a ",
                                            FrameTypeName(header_->type), " frame"));
  }
  return true;
}

absl::Status ServerHandshakeState::OnFrame() {
  const std::optional<Secret>& secret = options_.secret;
  if (phase_ == Phase::kHello) {
    CAUSEWAY_ASSIGN_OR_RETURN(hello_, ParseHello(payload_));
    client_ = absl::StrCat("client '", hello_.name, "' at ", peer_);
    const uint16_t low = std::max(hello_.min_version, kMinProtocolVersion);
    version_ = std::min(hello_.max_version, kMaxProtocolVersion);
    if (low > version_) {
      const std::string versions =
          absl::StrCat("the client speaks protocol versions ", hello_.min_version, "..", hello_.max_version,
                       ", this server ", kMinProtocolVersion, "..", kMaxProtocolVersion);
      Refuse(absl::StrCat("no common version: ", versions),
             absl::FailedPreconditionError(absl::StrCat(client_, ": no common version: ", versions)));
      return absl::OkStatus();
    }
    if (!secret) {
      if (!socket_.local_address().IsLoopback()) {
        Refuse(
            "this server has no secret and accepts only loopback connections",
            absl::PermissionDeniedError(absl::StrCat(client_, " came to ", socket_.local_address().ToString(),
                                                     ", not over loopback; without a secret only loopback "
                                                     "connections are accepted")));
        return absl::OkStatus();
      }
    } else if ((hello_.flags & kHelloHasSecret) == 0) {
      Refuse("this server requires a shared secret and the client has none",
             absl::UnauthenticatedError(absl::StrCat(client_, " has no secret; this server requires one")));
      return absl::OkStatus();
    }
    Challenge challenge{version_, secret ? kChallengeRequiresAuth : 0, {}, {}};
    CAUSEWAY_RETURN_IF_ERROR(FillRandom(absl::MakeSpan(challenge.nonce)));
    server_nonce_ = challenge.nonce;
    if (secret) {
      CAUSEWAY_ASSIGN_OR_RETURN(challenge.mac, ServerMac(*secret, hello_.nonce, challenge.nonce));
    }
    Queue(FrameType::kChallenge, EncodeChallenge(challenge));
    phase_ = Phase::kProof;
    return absl::OkStatus();
  }
  // The proof, or the client's refusal of this server.
  if (header_->type == FrameType::kRefused) return PeerRefused().status();
  CAUSEWAY_ASSIGN_OR_RETURN(Proof proof, ParseProof(payload_));
  if (secret) {
    CAUSEWAY_ASSIGN_OR_RETURN(Digest expected, ClientMac(*secret, server_nonce_, hello_.nonce));
    if (!ConstantTimeEquals(expected, proof.mac)) {
      Refuse("authentication failed",
             absl::UnauthenticatedError(absl::StrCat(client_,
                                                     " failed to prove that it holds the shared secret (a "
                                                     "different secret, or a proof replayed from another "
                                                     "connection)")));
      return absl::OkStatus();
    }
  }
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<uint8_t> welcome, EncodeWelcome({options_.name}));
  Queue(FrameType::kWelcome, welcome);
  last_ = PeerInfo{hello_.name, version_, secret.has_value()};
  phase_ = Phase::kSendingLast;
  return absl::OkStatus();
}

absl::Status CheckListenPolicy(const SocketAddress& address, bool has_secret) {
  if (has_secret || address.IsLoopback()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "refusing to listen on ", address.ToString(),
      " without a shared secret: anyone who can reach it could connect. Listen on a loopback address "
      "(127.0.0.1 or [::1]) or give the server a secret (CAUSEWAY_SECRET or a secret file)"));
}

}  // namespace causeway::transport
