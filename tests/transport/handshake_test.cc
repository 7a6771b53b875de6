#include "causeway/transport/handshake.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/transport/frame.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"

namespace causeway::transport {
namespace {

using ::causeway::testing::RunConcurrently;
using testing::AsBytes;
using testing::ConnectedPair;
using testing::In;

constexpr uint64_t kTiB = uint64_t{1} << 40;

Secret MakeSecret(char fill) { return *Secret::FromBytes(std::string(32, fill)); }

ClientHandshakeOptions ClientOptions(std::optional<Secret> secret) {
  ClientHandshakeOptions options;
  options.secret = std::move(secret);
  options.name = "client-island";
  return options;
}

ServerHandshakeOptions ServerOptions(std::optional<Secret> secret) {
  ServerHandshakeOptions options;
  options.secret = std::move(secret);
  options.name = "server-island";
  return options;
}

// The outcome of a handshake on each side.
struct Outcome {
  absl::StatusOr<PeerInfo> client = absl::UnknownError("not run");
  absl::StatusOr<PeerInfo> server = absl::UnknownError("not run");
};

// Runs both sides of a handshake on a loopback connection, each on a thread
// of its own.
Outcome Handshake(const ClientHandshakeOptions& client, const ServerHandshakeOptions& server) {
  Outcome outcome;
  absl::StatusOr<testing::SocketPair> pair = ConnectedPair();
  EXPECT_TRUE(pair.ok()) << pair.status();
  if (!pair.ok()) return outcome;
  RunConcurrently({[&] { outcome.client = ClientHandshake(pair->client, client); },
                   [&] { outcome.server = ServerHandshake(pair->server, server); }},
                  absl::Seconds(20), "handshake");
  return outcome;
}

// Sends the frame a raw (hand-driven) peer would.
void SendFrame(Socket& socket, FrameType type, absl::Span<const uint8_t> payload) {
  ASSERT_OK(WriteFrame(socket, type, {payload}, In(absl::Seconds(5))));
}

// Reads a handshake frame as a raw peer, expecting `type`.
std::vector<uint8_t> ReceiveFrame(Socket& socket, FrameType type) {
  absl::StatusOr<Frame> frame = ReadFrame(socket, false, kMaxRefusedPayload, In(absl::Seconds(5)));
  EXPECT_TRUE(frame.ok()) << frame.status();
  if (!frame.ok()) return {};
  EXPECT_EQ(frame->type, type) << "got a " << FrameTypeName(frame->type) << " frame";
  return frame->payload;
}

// The bytes of a frame as they go on the wire.
std::vector<uint8_t> WireBytes(const Frame& frame) {
  const auto header = EncodeFrameHeader(frame.type, frame.payload.size());
  std::vector<uint8_t> bytes(header.begin(), header.end());
  bytes.insert(bytes.end(), frame.payload.begin(), frame.payload.end());
  return bytes;
}

Hello SampleHello() {
  Hello hello{1, 1, kHelloHasSecret, {}, "ab"};
  for (size_t i = 0; i < hello.nonce.size(); ++i) hello.nonce[i] = static_cast<uint8_t>(i);
  return hello;
}

// Tests the Hello layout byte for byte, and that every message parses back
// to what was encoded.
TEST(HandshakeMessageTest, EncodesTheDocumentedLayoutsAndParsesThemBack) {
  const Hello hello = SampleHello();
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> hello_bytes, EncodeHello(hello));
  std::vector<uint8_t> expected = {1, 0, 1, 0, 1, 0, 0, 0};
  expected.insert(expected.end(), hello.nonce.begin(), hello.nonce.end());
  expected.insert(expected.end(), {2, 'a', 'b'});
  EXPECT_EQ(hello_bytes, expected);
  ASSERT_OK_AND_ASSIGN(Hello hello_back, ParseHello(hello_bytes));
  EXPECT_EQ(hello_back, hello);

  Challenge challenge{1, kChallengeRequiresAuth, {}, {}};
  challenge.nonce.fill(0x11);
  challenge.mac.fill(0x22);
  const std::vector<uint8_t> challenge_bytes = EncodeChallenge(challenge);
  EXPECT_EQ(challenge_bytes.size(), kMaxChallengePayload);
  EXPECT_EQ(std::vector<uint8_t>(challenge_bytes.begin(), challenge_bytes.begin() + 6),
            (std::vector<uint8_t>{1, 0, 1, 0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(Challenge challenge_back, ParseChallenge(challenge_bytes));
  EXPECT_EQ(challenge_back, challenge);

  Proof proof;
  proof.mac.fill(0x33);
  ASSERT_OK_AND_ASSIGN(Proof proof_back, ParseProof(EncodeProof(proof)));
  EXPECT_EQ(proof_back, proof);

  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> welcome_bytes, EncodeWelcome({"island-7"}));
  EXPECT_EQ(welcome_bytes.front(), 8);
  ASSERT_OK_AND_ASSIGN(Welcome welcome_back, ParseWelcome(welcome_bytes));
  EXPECT_EQ(welcome_back.name, "island-7");

  ASSERT_OK_AND_ASSIGN(Refused refused_back, ParseRefused(EncodeRefused({"no \x01 thanks"})));
  EXPECT_EQ(refused_back.reason, "no \x01 thanks");
  EXPECT_EQ(EncodeRefused({std::string(300, 'r')}).size(), kMaxRefusalBytes);
}

// Tests that each parser refuses what its encoder cannot produce, saying why.
TEST(HandshakeMessageTest, ParsersRefuseMalformedMessages) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> hello, EncodeHello(SampleHello()));
  const absl::Span<const uint8_t> h(hello);
  EXPECT_ERROR(ParseHello(h.first(40)).status(), absl::StatusCode::kDataLoss,
               "a hello is at least 41 bytes, got 40");
  EXPECT_ERROR(ParseHello(h.first(42)).status(), absl::StatusCode::kDataLoss,
               "a hello with a 2-byte name is 43 bytes, got 42");
  std::vector<uint8_t> longer = hello;
  longer.push_back('c');
  EXPECT_ERROR(ParseHello(longer).status(), absl::StatusCode::kDataLoss,
               "a hello with a 2-byte name is 43 bytes, got 44");
  std::vector<uint8_t> bad_name = hello;
  bad_name[42] = '\n';
  EXPECT_ERROR(ParseHello(bad_name).status(), absl::StatusCode::kDataLoss,
               "hello: name 'a\\x0a' holds byte 0x0a");
  std::vector<uint8_t> long_name(h.begin(), h.begin() + 40);
  long_name.push_back(65);
  long_name.insert(long_name.end(), 65, 'n');
  EXPECT_ERROR(ParseHello(long_name).status(), absl::StatusCode::kDataLoss,
               "a name of 65 bytes exceeds the 64-byte limit");
  std::vector<uint8_t> empty_range = hello;
  empty_range[0] = 2;  // min_version 2, max_version 1
  EXPECT_ERROR(ParseHello(empty_range).status(), absl::StatusCode::kDataLoss,
               "hello offers protocol versions 2..1");
  std::vector<uint8_t> zero_version = hello;
  zero_version[0] = 0;
  EXPECT_ERROR(ParseHello(zero_version).status(), absl::StatusCode::kDataLoss,
               "hello offers protocol versions 0..1");

  const std::vector<uint8_t> challenge = EncodeChallenge({1, 0, {}, {}});
  EXPECT_ERROR(ParseChallenge(absl::MakeConstSpan(challenge).first(69)).status(), absl::StatusCode::kDataLoss,
               "a challenge is 70 bytes, got 69");
  std::vector<uint8_t> long_challenge = challenge;
  long_challenge.push_back(0);
  EXPECT_ERROR(ParseChallenge(long_challenge).status(), absl::StatusCode::kDataLoss, "got 71");
  EXPECT_ERROR(ParseChallenge(EncodeChallenge({0, 0, {}, {}})).status(), absl::StatusCode::kDataLoss,
               "challenge chooses protocol version 0");

  EXPECT_ERROR(ParseProof(std::vector<uint8_t>(31)).status(), absl::StatusCode::kDataLoss,
               "a proof is 32 bytes, got 31");
  EXPECT_ERROR(ParseProof(std::vector<uint8_t>(33)).status(), absl::StatusCode::kDataLoss, "got 33");

  EXPECT_ERROR(ParseWelcome({}).status(), absl::StatusCode::kDataLoss, "a welcome is at least 1 byte, got 0");
  EXPECT_ERROR(ParseWelcome(AsBytes("\x05"
                                    "abc"))
                   .status(),
               absl::StatusCode::kDataLoss, "a welcome with a 5-byte name is 6 bytes, got 4");
  EXPECT_ERROR(ParseRefused(std::vector<uint8_t>(257, 'r')).status(), absl::StatusCode::kDataLoss,
               "a refusal is at most 256 bytes, got 257");
}

TEST(HandshakeMessageTest, PeerNamesAreShortPrintableAscii) {
  EXPECT_OK(CheckPeerName(""));
  EXPECT_OK(CheckPeerName(std::string(64, 'n')));
  EXPECT_ERROR(CheckPeerName(std::string(65, 'n')), absl::StatusCode::kInvalidArgument,
               "a name of 65 bytes exceeds the 64-byte limit");
  EXPECT_ERROR(CheckPeerName("tab\there"), absl::StatusCode::kInvalidArgument, "holds byte 0x09");
  EXPECT_ERROR(CheckPeerName("caf\xc3\xa9"), absl::StatusCode::kInvalidArgument, "holds byte 0xc3");
  EXPECT_ERROR(EncodeHello({1, 1, 0, {}, std::string(65, 'n')}).status(), absl::StatusCode::kInvalidArgument,
               "exceeds the 64-byte limit");
}

// Tests a handshake between islands that share a secret: both learn the
// other's name and the version, and know the peer is authenticated.
TEST(HandshakeTest, SucceedsWithTheSameSecret) {
  Outcome outcome = Handshake(ClientOptions(MakeSecret('k')), ServerOptions(MakeSecret('k')));
  ASSERT_TRUE(outcome.client.ok()) << outcome.client.status();
  ASSERT_TRUE(outcome.server.ok()) << outcome.server.status();
  EXPECT_EQ(outcome.client->name, "server-island");
  EXPECT_EQ(outcome.server->name, "client-island");
  EXPECT_EQ(outcome.client->version, 1);
  EXPECT_EQ(outcome.server->version, 1);
  EXPECT_TRUE(outcome.client->authenticated);
  EXPECT_TRUE(outcome.server->authenticated);
}

// Tests that the connection is in step after the handshake: authenticated
// frames flow both ways.
TEST(HandshakeTest, AuthenticatedFramesFollowTheHandshake) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  RunConcurrently(
      {[&] {
         ASSERT_OK(ClientHandshake(pair.client, ClientOptions(MakeSecret('k'))).status());
         ASSERT_OK(WriteFrame(pair.client, FrameType::kControl, {AsBytes("ping")}, In(absl::Seconds(5))));
         absl::StatusOr<Frame> reply = ReadFrame(pair.client, true, kMaxControlPayload, In(absl::Seconds(5)));
         ASSERT_TRUE(reply.ok()) << reply.status();
         EXPECT_EQ(reply->type, FrameType::kControl);
         EXPECT_EQ(std::string(reply->payload.begin(), reply->payload.end()), "pong");
       },
       [&] {
         ASSERT_OK(ServerHandshake(pair.server, ServerOptions(MakeSecret('k'))).status());
         absl::StatusOr<Frame> ping = ReadFrame(pair.server, true, kMaxControlPayload, In(absl::Seconds(5)));
         ASSERT_TRUE(ping.ok()) << ping.status();
         EXPECT_EQ(std::string(ping->payload.begin(), ping->payload.end()), "ping");
         ASSERT_OK(WriteFrame(pair.server, FrameType::kControl, {AsBytes("pong")}, In(absl::Seconds(5))));
       }},
      absl::Seconds(20), "frames after the handshake");
}

// Tests that loopback peers without secrets are accepted, unauthenticated.
TEST(HandshakeTest, SucceedsOnLoopbackWithoutSecrets) {
  Outcome outcome = Handshake(ClientOptions(std::nullopt), ServerOptions(std::nullopt));
  ASSERT_TRUE(outcome.client.ok()) << outcome.client.status();
  ASSERT_TRUE(outcome.server.ok()) << outcome.server.status();
  EXPECT_EQ(outcome.client->name, "server-island");
  EXPECT_FALSE(outcome.client->authenticated);
  EXPECT_FALSE(outcome.server->authenticated);
}

// Tests that different secrets fail on both sides: the client finds the
// server's proof wrong and tells the server so.
TEST(HandshakeTest, WrongSecretFailsOnBothSides) {
  Outcome outcome = Handshake(ClientOptions(MakeSecret('a')), ServerOptions(MakeSecret('b')));
  EXPECT_ERROR(outcome.client.status(), absl::StatusCode::kUnauthenticated,
               "failed to prove that it holds the shared secret");
  EXPECT_ERROR(
      outcome.server.status(), absl::StatusCode::kPermissionDenied,
      "client 'client-island' at 127.0.0.1:", "refused the handshake: the server's proof does not match");
}

// Tests a server with a secret and a client without one.
TEST(HandshakeTest, ClientWithoutSecretIsRefused) {
  Outcome outcome = Handshake(ClientOptions(std::nullopt), ServerOptions(MakeSecret('k')));
  EXPECT_ERROR(outcome.server.status(), absl::StatusCode::kUnauthenticated, "client 'client-island'",
               "has no secret; this server requires one");
  EXPECT_ERROR(outcome.client.status(), absl::StatusCode::kPermissionDenied,
               "refused the handshake: this server requires a shared secret and the client has none");
}

// Tests a client with a secret and a server without one: the client does
// not trust a server that cannot authenticate.
TEST(HandshakeTest, ServerWithoutSecretIsRefusedByClientWithOne) {
  Outcome outcome = Handshake(ClientOptions(MakeSecret('k')), ServerOptions(std::nullopt));
  EXPECT_ERROR(outcome.client.status(), absl::StatusCode::kUnauthenticated,
               "does not require authentication; a client with a secret refuses such a server");
  EXPECT_ERROR(outcome.server.status(), absl::StatusCode::kPermissionDenied,
               "refused the handshake: this client has a secret and accepts only servers that require it");
}

// Tests that a Hello and Proof recorded from a successful connection do not
// authenticate another: a relay records what the client sends on connection
// 1, then a raw socket replays it on connection 2 and is refused, since the
// server's nonce is new.
TEST(HandshakeTest, ReplayedHelloAndProofAreRefused) {
  ASSERT_OK_AND_ASSIGN(Socket server_listener, testing::ListenOnLoopback());
  ASSERT_OK_AND_ASSIGN(SocketAddress server_address, testing::AddressOf(server_listener));
  ASSERT_OK_AND_ASSIGN(Socket relay_listener, testing::ListenOnLoopback());
  ASSERT_OK_AND_ASSIGN(SocketAddress relay_address, testing::AddressOf(relay_listener));

  std::vector<std::vector<uint8_t>> recorded;  // the client's frames, as sent
  RunConcurrently(
      {[&] {
         ASSERT_OK_AND_ASSIGN(Socket conn, server_listener.Accept(In(absl::Seconds(5))));
         EXPECT_OK(ServerHandshake(conn, ServerOptions(MakeSecret('k'))).status());
       },
       [&] {
         ASSERT_OK_AND_ASSIGN(Socket conn, Socket::Connect(relay_address, In(absl::Seconds(5))));
         EXPECT_OK(ClientHandshake(conn, ClientOptions(MakeSecret('k'))).status());
       },
       [&] {
         ASSERT_OK_AND_ASSIGN(Socket from_client, relay_listener.Accept(In(absl::Seconds(5))));
         ASSERT_OK_AND_ASSIGN(Socket to_server, Socket::Connect(server_address, In(absl::Seconds(5))));
         // Hello, Challenge, Proof, Welcome: one way, then the other.
         for (int i = 0; i < 4; ++i) {
           Socket& from = i % 2 == 0 ? from_client : to_server;
           Socket& to = i % 2 == 0 ? to_server : from_client;
           absl::StatusOr<Frame> frame = ReadFrame(from, false, kMaxRefusedPayload, In(absl::Seconds(5)));
           ASSERT_TRUE(frame.ok()) << frame.status();
           if (i % 2 == 0) recorded.push_back(WireBytes(*frame));
           ASSERT_OK(WriteFrame(to, frame->type, {frame->payload}, In(absl::Seconds(5))));
         }
       }},
      absl::Seconds(20), "recorded handshake");
  ASSERT_EQ(recorded.size(), 2u);

  absl::Status replayed_server;
  RunConcurrently({[&] {
                     ASSERT_OK_AND_ASSIGN(Socket conn, server_listener.Accept(In(absl::Seconds(5))));
                     replayed_server = ServerHandshake(conn, ServerOptions(MakeSecret('k'))).status();
                   },
                   [&] {
                     ASSERT_OK_AND_ASSIGN(Socket raw, Socket::Connect(server_address, In(absl::Seconds(5))));
                     ASSERT_OK(raw.WriteAll({recorded[0]}, In(absl::Seconds(5))));
                     ReceiveFrame(raw, FrameType::kChallenge);
                     ASSERT_OK(raw.WriteAll({recorded[1]}, In(absl::Seconds(5))));
                     const std::vector<uint8_t> refusal = ReceiveFrame(raw, FrameType::kRefused);
                     EXPECT_EQ(std::string(refusal.begin(), refusal.end()), "authentication failed");
                   }},
                  absl::Seconds(20), "replayed handshake");
  EXPECT_ERROR(replayed_server, absl::StatusCode::kUnauthenticated,
               "failed to prove that it holds the shared secret", "replayed");
}

// Tests that the server's own MAC, sent back as the client's proof, is
// refused: the two directions use different labels.
TEST(HandshakeTest, ReflectedServerProofIsRefused) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  absl::Status server;
  RunConcurrently({[&] { server = ServerHandshake(pair.server, ServerOptions(MakeSecret('k'))).status(); },
                   [&] {
                     SendFrame(pair.client, FrameType::kHello, *EncodeHello(SampleHello()));
                     ASSERT_OK_AND_ASSIGN(Challenge challenge,
                                          ParseChallenge(ReceiveFrame(pair.client, FrameType::kChallenge)));
                     SendFrame(pair.client, FrameType::kProof, EncodeProof({challenge.mac}));
                     ReceiveFrame(pair.client, FrameType::kRefused);
                   }},
                  absl::Seconds(20), "reflected proof");
  EXPECT_ERROR(server, absl::StatusCode::kUnauthenticated, "failed to prove that it holds the shared secret");
}

// Tests that before authentication the server reads nothing but a handshake
// frame's header when the header is wrong: a 1 TiB control frame is refused
// at once, from its 16 bytes, though the peer keeps the connection open.
TEST(HandshakeTest, ServerRefusesHugeFramesBeforeAuthFromTheHeader) {
  for (const auto& [type, why] : std::vector<std::pair<FrameType, std::string>>{
           {FrameType::kControl, "frame type 7 (control) before the handshake finished"},
           {FrameType::kData, "frame type 8 (data) before the handshake finished"},
           {FrameType::kHello, "length 1099511627776 exceeds the 105-byte bound of a hello frame"},
       }) {
    SCOPED_TRACE(why);
    ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
    ASSERT_OK(pair.client.WriteAll({EncodeFrameHeader(type, kTiB)}, In(absl::Seconds(5))));
    const absl::Time start = absl::Now();
    // A server that waited for the payload would end at its 60 s handshake
    // timeout with DeadlineExceeded.
    ServerHandshakeOptions options = ServerOptions(MakeSecret('k'));
    options.timeout = absl::Seconds(60);
    absl::Status s = ServerHandshake(pair.server, options).status();
    EXPECT_LT(absl::Now() - start, causeway::testing::kSchedulingSlack) << "the server waited for a payload";
    EXPECT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(why));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("waiting for a hello frame"));
  }
}

// Tests that each side gives up on a silent peer at its handshake deadline.
TEST(HandshakeTest, SilentPeersFailAtTheHandshakeDeadline) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  ServerHandshakeOptions server = ServerOptions(MakeSecret('k'));
  server.timeout = absl::Milliseconds(250);
  ClientHandshakeOptions client = ClientOptions(MakeSecret('k'));
  client.timeout = absl::Milliseconds(250);
  // Each side talks to a raw socket that never answers.
  ASSERT_OK_AND_ASSIGN(testing::SocketPair other, ConnectedPair());
  absl::Status server_status;
  absl::Status client_status;
  absl::Duration server_took;
  absl::Duration client_took;
  RunConcurrently({[&] {
                     const absl::Time start = absl::Now();
                     server_status = ServerHandshake(pair.server, server).status();
                     server_took = absl::Now() - start;
                   },
                   [&] {
                     const absl::Time start = absl::Now();
                     client_status = ClientHandshake(other.client, client).status();
                     client_took = absl::Now() - start;
                   }},
                  absl::Seconds(20), "silent peers");
  EXPECT_ERROR(server_status, absl::StatusCode::kDeadlineExceeded, "waiting for a hello frame");
  EXPECT_ERROR(client_status, absl::StatusCode::kDeadlineExceeded,
               "waiting for a challenge or refused frame");
  for (absl::Duration took : {server_took, client_took}) {
    EXPECT_GE(took, absl::Milliseconds(240));
    EXPECT_LT(took, absl::Milliseconds(250) + causeway::testing::kSchedulingSlack);
  }
}

// Tests a client that speaks only versions this server does not.
TEST(HandshakeTest, NoCommonVersionIsRefused) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  absl::Status server;
  std::vector<uint8_t> refusal;
  RunConcurrently({[&] { server = ServerHandshake(pair.server, ServerOptions(MakeSecret('k'))).status(); },
                   [&] {
                     Hello hello = SampleHello();
                     hello.min_version = 2;
                     hello.max_version = 3;
                     SendFrame(pair.client, FrameType::kHello, *EncodeHello(hello));
                     refusal = ReceiveFrame(pair.client, FrameType::kRefused);
                   }},
                  absl::Seconds(20), "version");
  EXPECT_ERROR(server, absl::StatusCode::kFailedPrecondition,
               "no common version: the client speaks protocol versions 2..3, this server 1..1");
  EXPECT_EQ(std::string(refusal.begin(), refusal.end()),
            "no common version: the client speaks protocol versions 2..3, this server 1..1");
}

// Tests that an invalid name is refused before anything is sent.
TEST(HandshakeTest, InvalidOwnNameIsRefusedBeforeSending) {
  ClientHandshakeOptions client = ClientOptions(std::nullopt);
  client.name = std::string(65, 'n');
  Outcome outcome = Handshake(client, ServerOptions(std::nullopt));
  EXPECT_ERROR(outcome.client.status(), absl::StatusCode::kInvalidArgument,
               "client handshake: a name of 65 bytes exceeds the 64-byte limit");
  EXPECT_ERROR(outcome.server.status(), absl::StatusCode::kUnavailable,
               "peer closed the connection after 0 of 16 bytes");
}

// Tests the listening rule: without a secret, loopback only.
// Tests the server handshake as a state machine: one thread, polling,
// serves six clients at once (each on a thread of its own, with the
// secret) and a seventh that sent half a header and went quiet, which ends
// at the deadline while the others are welcomed.
TEST(ServerHandshakeStateTest, OneThreadServesManyHandshakesAtOnce) {
  constexpr int kClients = 6;
  std::vector<testing::SocketPair> pairs;
  for (int i = 0; i <= kClients; ++i) pairs.push_back(*ConnectedPair());
  ServerHandshakeOptions server = ServerOptions(MakeSecret('k'));
  server.timeout = absl::Seconds(3);
  std::vector<std::unique_ptr<ServerHandshakeState>> states;
  for (auto& pair : pairs)
    states.push_back(std::make_unique<ServerHandshakeState>(std::move(pair.server), server));
  const std::array<uint8_t, kFrameHeaderSize> header = EncodeFrameHeader(FrameType::kHello, 50);
  ASSERT_OK(pairs[kClients].client.WriteAll({absl::MakeConstSpan(header).first(8)}, In(absl::Seconds(5))));

  std::vector<absl::StatusOr<PeerInfo>> clients(kClients, absl::UnknownError("not run"));
  std::vector<std::function<void()>> bodies;
  for (int i = 0; i < kClients; ++i) {
    bodies.push_back([&, i] {
      ClientHandshakeOptions options = ClientOptions(MakeSecret('k'));
      options.name = absl::StrCat("client-", i);
      clients[i] = ClientHandshake(pairs[i].client, options);
    });
  }
  bodies.push_back([&] {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<ServerHandshakeState*> waiting;
      absl::Time wake = absl::InfiniteFuture();
      for (auto& state : states) {
        if (state->Advance()) continue;
        fds.push_back({state->fd(), state->events(), 0});
        waiting.push_back(state.get());
        wake = std::min(wake, state->deadline());
      }
      if (waiting.empty()) return;
      poll(fds.data(), fds.size(),
           static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - absl::Now())) + 1));
    }
  });
  RunConcurrently(std::move(bodies), absl::Seconds(30), "one thread serving seven handshakes");
  for (int i = 0; i < kClients; ++i) {
    ASSERT_OK(clients[i].status());
    EXPECT_EQ(clients[i]->name, "server-island");
    ASSERT_OK(states[i]->result().status());
    EXPECT_EQ(states[i]->result()->name, absl::StrCat("client-", i));
    EXPECT_TRUE(states[i]->result()->authenticated);
  }
  EXPECT_ERROR(states[kClients]->result().status(), absl::StatusCode::kDeadlineExceeded,
               "waiting for a hello frame", "8 of 16 header bytes");
}

// Tests that the server reads nothing past the client's proof: a frame the
// client sends with it (in the same write) stays on the socket for the
// connection.
TEST(ServerHandshakeStateTest, LeavesWhatFollowsTheProofOnTheSocket) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  absl::StatusOr<PeerInfo> server = absl::UnknownError("not run");
  RunConcurrently({[&] { server = ServerHandshake(pair.server, ServerOptions(std::nullopt)); },
                   [&] {
                     Hello hello{kMinProtocolVersion, kMaxProtocolVersion, 0, {}, "raw"};
                     ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> hello_bytes, EncodeHello(hello));
                     SendFrame(pair.client, FrameType::kHello, hello_bytes);
                     ReceiveFrame(pair.client, FrameType::kChallenge);
                     std::vector<uint8_t> bytes = WireBytes({FrameType::kProof, EncodeProof(Proof{})});
                     const std::vector<uint8_t> heartbeat = WireBytes({FrameType::kHeartbeat, {1, 2, 3}});
                     bytes.insert(bytes.end(), heartbeat.begin(), heartbeat.end());
                     ASSERT_OK(pair.client.WriteAll({bytes}, In(absl::Seconds(5))));
                     ReceiveFrame(pair.client, FrameType::kWelcome);
                   }},
                  absl::Seconds(20), "handshake");
  ASSERT_OK(server.status());
  EXPECT_EQ(server->name, "raw");
  ASSERT_OK_AND_ASSIGN(Frame next, ReadFrame(pair.server, /*authenticated=*/true, 64, In(absl::Seconds(5))));
  EXPECT_EQ(next.type, FrameType::kHeartbeat);
  EXPECT_EQ(next.payload, (std::vector<uint8_t>{1, 2, 3}));
}

TEST(ListenPolicyTest, NonLoopbackWithoutSecretIsRefused) {
  for (const char* text : {"0.0.0.0:0", "[::]:0", "10.1.2.3:5000"}) {
    ASSERT_OK_AND_ASSIGN(SocketAddress address, SocketAddress::Parse(text));
    EXPECT_ERROR(CheckListenPolicy(address, false), absl::StatusCode::kPermissionDenied,
                 absl::StrCat("refusing to listen on ", address.ToString(), " without a shared secret"),
                 "Listen on a loopback address");
    EXPECT_OK(CheckListenPolicy(address, true));
  }
  for (const char* text : {"127.0.0.1:0", "[::1]:0", "localhost:5000"}) {
    ASSERT_OK_AND_ASSIGN(SocketAddress address, SocketAddress::Parse(text));
    EXPECT_OK(CheckListenPolicy(address, false));
  }
}

// The first IPv4 address of this host that is not loopback, if any.
std::optional<std::string> NonLoopbackAddress() {
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* i = interfaces; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
    if (absl::string_view(text).substr(0, 4) != "127.") found = text;
  }
  freeifaddrs(interfaces);
  return found;
}

// Tests that a server without a secret refuses a connection that did not
// come over loopback, even when its listener was made without the policy
// check.
TEST(ListenPolicyTest, ServerWithoutSecretRefusesNonLoopbackConnections) {
  const std::optional<std::string> host = NonLoopbackAddress();
  if (!host) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  ASSERT_OK_AND_ASSIGN(SocketAddress any_port, SocketAddress::Parse(absl::StrCat(*host, ":0")));
  ASSERT_OK_AND_ASSIGN(Socket listener, Socket::Listen(any_port, 4));
  ASSERT_OK_AND_ASSIGN(SocketAddress address,
                       SocketAddress::Parse(absl::StrCat(*host, ":", listener.port())));
  ASSERT_OK_AND_ASSIGN(Socket client, Socket::Connect(address, In(absl::Seconds(5))));
  ASSERT_OK_AND_ASSIGN(Socket server, listener.Accept(In(absl::Seconds(5))));
  absl::StatusOr<PeerInfo> client_result = absl::UnknownError("not run");
  absl::StatusOr<PeerInfo> server_result = absl::UnknownError("not run");
  RunConcurrently({[&] { client_result = ClientHandshake(client, ClientOptions(std::nullopt)); },
                   [&] { server_result = ServerHandshake(server, ServerOptions(std::nullopt)); }},
                  absl::Seconds(20), "non-loopback");
  EXPECT_ERROR(server_result.status(), absl::StatusCode::kPermissionDenied,
               absl::StrCat("came to ", address.ToString(), ", not over loopback"));
  EXPECT_ERROR(client_result.status(), absl::StatusCode::kPermissionDenied,
               "this server has no secret and accepts only loopback connections");
}

}  // namespace
}  // namespace causeway::transport
