#include "causeway/transport/connection.h"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/transport/control.pb.h"
#include "causeway/transport/frame.h"
#include "causeway/transport/handshake.h"
#include "causeway/transport/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"

namespace causeway::transport {
namespace {

using ::causeway::testing::AwaitEntries;
using ::causeway::testing::CountEntries;
using ::causeway::testing::RunConcurrently;
using testing::AddressOf;
using testing::AsBytes;
using ::testing::HasSubstr;
using testing::In;
using testing::ListenOnLoopback;

// Frequent heartbeats and a patient peer timeout. A killed or closed peer
// shows at once (its socket closes), so only the tests of the timeout itself
// shorten it (WithPeerTimeout): a process descheduled for a second or two
// under sanitizers and load must not pass for a dead peer.
ConnectionOptions TestOptions() {
  ConnectionOptions options;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.peer_timeout = absl::Seconds(30);
  return options;
}

ConnectionOptions WithPeerTimeout(absl::Duration timeout) {
  ConnectionOptions options = TestOptions();
  options.peer_timeout = timeout;
  return options;
}

// A gate that Echo's "gate" payload waits on until the test opens it, so a
// test holds a handler mid-call without guessing how long to sleep.
class Gate {
 public:
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&open_));
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
};
Gate& HandlerGate() {
  static Gate* gate = new Gate;
  return *gate;
}

ClientHandshakeOptions ClientOptions() {
  ClientHandshakeOptions options;
  options.name = "client-island";
  return options;
}

ServerHandshakeOptions ServerOptions() {
  ServerHandshakeOptions options;
  options.name = "server-island";
  return options;
}

Request Ping(absl::string_view payload) {
  Request request;
  request.mutable_ping()->set_payload(std::string(payload));
  return request;
}

// Answers a ping with a pong of the same payload. "sleep:<ms>" sleeps that
// long first; "gate" waits until HandlerGate() is open; "fail" answers
// NotFound.
absl::StatusOr<Response> Echo(const Request& request) {
  const std::string& payload = request.ping().payload();
  if (payload == "fail") return absl::NotFoundError("no program named 'fail'");
  if (payload == "gate") HandlerGate().Wait();
  if (absl::StartsWith(payload, "sleep:")) {
    int ms = 0;
    if (absl::SimpleAtoi(payload.substr(6), &ms)) absl::SleepFor(absl::Milliseconds(ms));
  }
  Response response;
  response.mutable_pong()->set_payload(payload);
  return response;
}

// Both ends of one connection over loopback.
struct ConnectionPair {
  std::unique_ptr<Connection> client;
  std::unique_ptr<Connection> server;
};

// Accepts on `listener` while connecting to it, each on a thread of its own.
ConnectionPair Connect(Socket& listener, RequestHandler client_handler = Echo,
                       RequestHandler server_handler = Echo,
                       const ConnectionOptions& server_options = TestOptions(),
                       const ConnectionOptions& client_options = TestOptions()) {
  ConnectionPair pair;
  absl::StatusOr<SocketAddress> address = AddressOf(listener);
  EXPECT_TRUE(address.ok()) << address.status();
  if (!address.ok()) return pair;
  RunConcurrently({[&] {
                     absl::StatusOr<std::unique_ptr<Connection>> client =
                         Connection::Connect(*address, ClientOptions(), client_options, client_handler);
                     EXPECT_TRUE(client.ok()) << client.status();
                     if (client.ok()) pair.client = *std::move(client);
                   },
                   [&] {
                     absl::StatusOr<Socket> socket = listener.Accept(In(absl::Seconds(5)));
                     EXPECT_TRUE(socket.ok()) << socket.status();
                     if (!socket.ok()) return;
                     absl::StatusOr<std::unique_ptr<Connection>> server = Connection::Accept(
                         *std::move(socket), ServerOptions(), server_options, server_handler);
                     EXPECT_TRUE(server.ok()) << server.status();
                     if (server.ok()) pair.server = *std::move(server);
                   }},
                  absl::Seconds(20), "connect");
  return pair;
}

// A connection whose client side is driven by hand: a socket past the
// handshake, named "raw-client", and the server's Connection.
struct RawPair {
  Socket client;
  std::unique_ptr<Connection> server;
};
RawPair ConnectRaw(Socket& listener, const ConnectionOptions& options = TestOptions(),
                   RequestHandler handler = Echo) {
  RawPair pair;
  absl::StatusOr<SocketAddress> address = AddressOf(listener);
  EXPECT_TRUE(address.ok()) << address.status();
  if (!address.ok()) return pair;
  RunConcurrently({[&] {
                     absl::StatusOr<Socket> socket = Socket::Connect(*address, In(absl::Seconds(5)));
                     ASSERT_TRUE(socket.ok()) << socket.status();
                     ClientHandshakeOptions options = ClientOptions();
                     options.name = "raw-client";
                     ASSERT_OK(ClientHandshake(*socket, options).status());
                     pair.client = *std::move(socket);
                   },
                   [&] {
                     absl::StatusOr<Socket> socket = listener.Accept(In(absl::Seconds(5)));
                     ASSERT_TRUE(socket.ok()) << socket.status();
                     absl::StatusOr<std::unique_ptr<Connection>> server =
                         Connection::Accept(*std::move(socket), ServerOptions(), options, handler);
                     ASSERT_TRUE(server.ok()) << server.status();
                     pair.server = *std::move(server);
                   }},
                  absl::Seconds(20), "raw connect");
  return pair;
}

// Waits until `connection` has failed, or `limit` passes; its status.
absl::Status AwaitFailure(const Connection& connection, absl::Duration limit) {
  const absl::Time deadline = In(limit);
  while (connection.status().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return connection.status();
}

// Records the ping payloads a handler sees, and answers as Echo does.
class Recorder {
 public:
  RequestHandler Handler() {
    return [this](const Request& request) {
      {
        absl::MutexLock lock(&mu_);
        seen_.push_back(request.ping().payload());
      }
      return Echo(request);
    };
  }

  // Waits until `n` requests have been seen, or `limit` passes; those seen.
  std::vector<std::string> AwaitSeen(size_t n, absl::Duration limit) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), limit);
    return seen_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

// A DataHeader's fields: stream, tag, offset, length, total.
using Chunk = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>;
Chunk ChunkOf(const DataHeader& header) {
  return {header.stream(), header.tag(), header.offset(), header.length(), header.total()};
}

// A DataSink that keeps each object, by (stream, tag), in memory of its
// total size, and records the chunks `begin` and `end` see. Must outlive the
// connection that uses it.
class Collector {
 public:
  DataSink Sink() {
    DataSink sink;
    sink.begin = [this](const DataHeader& header) -> absl::StatusOr<uint8_t*> {
      absl::MutexLock lock(&mu_);
      begun_.push_back(ChunkOf(header));
      auto [it, inserted] = objects_.try_emplace({header.stream(), header.tag()}, header.total());
      if (it->second.size() != header.total()) {
        return absl::InvalidArgumentError(
            absl::StrCat("total ", header.total(), ", was ", it->second.size()));
      }
      return it->second.empty() ? &empty_object_ : it->second.data() + header.offset();
    };
    sink.end = [this](const DataHeader& header) {
      absl::MutexLock lock(&mu_);
      ended_.push_back(ChunkOf(header));
    };
    return sink;
  }

  // Waits until `n` chunks have ended, or `limit` passes; whether they have.
  bool AwaitEnded(size_t n, absl::Duration limit) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), limit);
  }

  std::vector<Chunk> begun() {
    absl::MutexLock lock(&mu_);
    return begun_;
  }
  std::vector<Chunk> ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  // The object's bytes; empty if none came. Only once its chunks have ended.
  absl::Span<const uint8_t> object(uint64_t stream, uint64_t tag) {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find({stream, tag});
    return it == objects_.end() ? absl::Span<const uint8_t>() : absl::Span<const uint8_t>(it->second);
  }

 private:
  absl::Mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<uint8_t>> objects_ ABSL_GUARDED_BY(mu_);
  std::vector<Chunk> begun_ ABSL_GUARDED_BY(mu_);
  std::vector<Chunk> ended_ ABSL_GUARDED_BY(mu_);
  uint8_t empty_object_ = 0;  // where a zero-byte object goes
};

// `n` pseudo-random bytes from `seed`.
std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t word = random();
    std::memcpy(&bytes[i], &word, std::min<size_t>(8, n - i));
  }
  return bytes;
}

// "identical", or where `got` first differs from `want`: a readable
// comparison of large buffers.
std::string Compare(absl::Span<const uint8_t> got, absl::Span<const uint8_t> want) {
  if (got.size() != want.size()) return absl::StrCat("size ", got.size(), ", want ", want.size());
  auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
  if (g == got.end()) return "identical";
  return absl::StrCat("first difference at byte ", g - got.begin(), ": ", int{*g}, ", want ", int{*w});
}

// Options whose data sink is `collector`'s.
ConnectionOptions WithSink(Collector& collector) {
  ConnectionOptions options = TestOptions();
  options.data_sink = collector.Sink();
  return options;
}

// Writes an Envelope with `header` as its body in a control frame.
absl::Status WriteDataHeader(Socket& raw, uint64_t stream, uint64_t tag, uint64_t offset, uint64_t length,
                             uint64_t total) {
  Envelope envelope;
  DataHeader& header = *envelope.mutable_data();
  header.set_stream(stream);
  header.set_tag(tag);
  header.set_offset(offset);
  header.set_length(length);
  header.set_total(total);
  const std::string bytes = envelope.SerializeAsString();
  return WriteFrame(raw, FrameType::kControl, {AsBytes(bytes)}, In(absl::Seconds(5)));
}

// Writes `envelope` in a control frame.
absl::Status WriteEnvelope(Socket& raw, const Envelope& envelope) {
  const std::string bytes = envelope.SerializeAsString();
  return WriteFrame(raw, FrameType::kControl, {AsBytes(bytes)}, In(absl::Seconds(5)));
}

// The next frame other than a heartbeat.
absl::StatusOr<Frame> ReadSkippingHeartbeats(Socket& raw, absl::Time deadline) {
  while (true) {
    absl::StatusOr<Frame> frame = ReadFrame(raw, /*authenticated=*/true, kMaxControlPayload, deadline);
    if (!frame.ok() || frame->type != FrameType::kHeartbeat) return frame;
  }
}

// Tests on one healthy connection over loopback, both sides serving Echo.
class ConnectedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(listener_, ListenOnLoopback());
    pair_ = Connect(listener_);
    ASSERT_NE(pair_.client, nullptr);
    ASSERT_NE(pair_.server, nullptr);
  }

  Socket listener_;
  ConnectionPair pair_;
};

// Tests that a ping comes back as a pong with its payload, both ways.
TEST_F(ConnectedTest, PingPongBothWays) {
  EXPECT_EQ(pair_.client->peer().name, "server-island");
  EXPECT_EQ(pair_.server->peer().name, "client-island");

  ASSERT_OK_AND_ASSIGN(Response pong, pair_.client->Call(Ping("hello"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "hello");
  ASSERT_OK_AND_ASSIGN(Response back, pair_.server->Call(Ping("and back"), In(absl::Seconds(5))));
  EXPECT_EQ(back.pong().payload(), "and back");
  EXPECT_OK(pair_.client->status());
  EXPECT_OK(pair_.server->status());
}

// Tests that many concurrent calls from several threads each get their own
// response.
TEST_F(ConnectedTest, ConcurrentCallsAreMatchedToTheirCallers) {
  constexpr int kThreads = 8;
  constexpr int kCallsPerThread = 100;
  std::atomic<int> matched{0};
  std::vector<std::function<void()>> bodies;
  for (int t = 0; t < kThreads; ++t) {
    bodies.push_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        const std::string payload = absl::StrCat("thread ", t, " call ", i);
        absl::StatusOr<Response> response = pair_.client->Call(Ping(payload), In(absl::Seconds(10)));
        ASSERT_TRUE(response.ok()) << response.status();
        EXPECT_EQ(response->pong().payload(), payload);
        if (response->pong().payload() == payload) ++matched;
      }
    });
  }
  RunConcurrently(std::move(bodies), absl::Seconds(30), "concurrent calls");
  EXPECT_EQ(matched.load(), kThreads * kCallsPerThread);
}

// Tests that a handler's error reaches the caller with its code, and that the
// connection stays healthy.
TEST_F(ConnectedTest, HandlerErrorReachesTheCaller) {
  EXPECT_ERROR(pair_.client->Call(Ping("fail"), In(absl::Seconds(5))).status(), absl::StatusCode::kNotFound,
               "'server-island'", "no program named 'fail'");
  EXPECT_OK(pair_.client->status());
}

// Tests that a peer without a handler answers Unimplemented.
TEST(ConnectionTest, NoHandlerAnswersUnimplemented) {
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, /*server_handler=*/nullptr);
  ASSERT_NE(pair.client, nullptr);
  EXPECT_ERROR(pair.client->Call(Ping("x"), In(absl::Seconds(5))).status(), absl::StatusCode::kUnimplemented,
               "no handler");
}

// Tests that a call not answered by its deadline fails with DeadlineExceeded,
// that the late response is dropped, and that the connection still works.
TEST_F(ConnectedTest, DeadlineExceededThenTheConnectionStillWorks) {
  // The handler holds its response until the gate opens, after the call has
  // returned: the call can only have ended at its deadline.
  HandlerGate().Close();
  const absl::Time start = absl::Now();
  EXPECT_ERROR(pair_.client->Call(Ping("gate"), In(absl::Milliseconds(50))).status(),
               absl::StatusCode::kDeadlineExceeded, "no response from peer 'server-island'");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  HandlerGate().Open();
  // The late response is dropped; the next call gets its own.
  ASSERT_OK_AND_ASSIGN(Response pong, pair_.client->Call(Ping("after"), In(absl::Seconds(15))));
  EXPECT_EQ(pong.pong().payload(), "after");
  EXPECT_OK(pair_.client->status());
}

// Tests that a request too large for a control frame fails alone: nothing
// is sent and the connection stays healthy.
TEST_F(ConnectedTest, OversizedRequestFailsWithoutHarm) {
  EXPECT_ERROR(pair_.client->Call(Ping(std::string(kMaxControlPayload, 'x')), In(absl::Seconds(5))).status(),
               absl::StatusCode::kInvalidArgument, "control frame carries at most");
  ASSERT_OK_AND_ASSIGN(Response pong, pair_.client->Call(Ping("small"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "small");
}

// Tests that heartbeats keep an idle connection alive past peer_timeout.
// Idleness is the feature, so this test sleeps: 1.5 times a peer timeout of
// 3 s, 30 heartbeats, which a process descheduled under load still sends.
TEST(HeartbeatTest, HeartbeatsKeepAnIdleConnectionUp) {
  const ConnectionOptions options = WithPeerTimeout(absl::Seconds(3));
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, Echo, options, options);
  ASSERT_NE(pair.client, nullptr);
  ASSERT_NE(pair.server, nullptr);
  absl::SleepFor(options.peer_timeout * 1.5);
  EXPECT_OK(pair.client->status());
  EXPECT_OK(pair.server->status());
  ASSERT_OK_AND_ASSIGN(Response pong, pair.client->Call(Ping("still up"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "still up");
}

// Tests that Close tells the peer why, and fails later calls on both sides.
TEST_F(ConnectedTest, CloseGivesThePeerTheReason) {
  pair_.client->Close("maintenance window");
  EXPECT_ERROR(pair_.client->status(), absl::StatusCode::kCancelled, "maintenance window");
  EXPECT_ERROR(AwaitFailure(*pair_.server, absl::Seconds(5)), absl::StatusCode::kUnavailable,
               "'client-island'", "closed the connection: maintenance window");
  EXPECT_ERROR(pair_.client->Call(Ping("x"), In(absl::Seconds(1))).status(), absl::StatusCode::kCancelled,
               "maintenance window");
  EXPECT_ERROR(pair_.server->Call(Ping("x"), In(absl::Seconds(1))).status(), absl::StatusCode::kUnavailable,
               "maintenance window");
}

// Tests on a connection whose client is driven by hand (ConnectRaw).
class RawClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(listener_, ListenOnLoopback());
    raw_ = ConnectRaw(listener_);
    ASSERT_NE(raw_.server, nullptr);
  }

  Socket listener_;
  RawPair raw_;
};

// Tests that a control frame whose payload is not an Envelope closes that
// connection with a reason naming it (told to the sender in a goodbye),
// while another connection to the same server keeps working.
TEST_F(RawClientTest, MalformedControlMessageClosesOnlyThatConnection) {
  Socket& raw = raw_.client;
  Connection* victim = raw_.server.get();
  ConnectionPair healthy = Connect(listener_);
  ASSERT_NE(healthy.client, nullptr);

  // A valid header; the payload is an unterminated varint, no protobuf.
  const uint8_t garbage[] = {0xff, 0xff, 0xff};
  ASSERT_OK(WriteFrame(raw, FrameType::kControl, {absl::MakeConstSpan(garbage)}, In(absl::Seconds(5))));

  EXPECT_ERROR(AwaitFailure(*victim, absl::Seconds(5)), absl::StatusCode::kDataLoss, "'raw-client'",
               "control frame of 3 bytes", "is not a control message");
  // The sender is told why: skip its heartbeats up to the goodbye.
  absl::StatusOr<Frame> frame;
  do {
    frame = ReadFrame(raw, /*authenticated=*/true, kMaxControlPayload, In(absl::Seconds(5)));
    ASSERT_TRUE(frame.ok()) << frame.status();
  } while (frame->type == FrameType::kHeartbeat);
  ASSERT_EQ(frame->type, FrameType::kGoodbye);
  Envelope goodbye;
  ASSERT_TRUE(goodbye.ParseFromArray(frame->payload.data(), static_cast<int>(frame->payload.size())));
  EXPECT_THAT(goodbye.goodbye().reason(), HasSubstr("is not a control message"));

  ASSERT_OK_AND_ASSIGN(Response pong, healthy.client->Call(Ping("still here"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "still here");
  EXPECT_OK(healthy.server->status());
}

// Tests that a frame header this side refuses (bad magic) closes the
// connection with DataLoss naming the peer.
TEST_F(RawClientTest, MalformedFrameHeaderClosesTheConnection) {
  ASSERT_OK(raw_.client.WriteAll({AsBytes("XXXXXXXXXXXXXXXX")}, In(absl::Seconds(5))));
  EXPECT_ERROR(AwaitFailure(*raw_.server, absl::Seconds(5)), absl::StatusCode::kDataLoss,
               "malformed frame from peer 'raw-client'", "magic");
}

// Forks a child that accepts one connection on `listener` and serves it
// until the connection ends: Echo, except that a "hold" call writes a byte to
// `held` and never returns. The parent has no other threads then, so the
// child may make its own.
pid_t ForkServer(Socket& listener, const ConnectionOptions& options, int held) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  absl::StatusOr<Socket> socket = listener.Accept(In(absl::Seconds(30)));
  if (!socket.ok()) _exit(2);
  auto handler = [held](const Request& request) -> absl::StatusOr<Response> {
    if (request.ping().payload() != "hold") return Echo(request);
    const char byte = 'h';
    if (write(held, &byte, 1) != 1) _exit(4);
    for (;;) pause();
  };
  absl::StatusOr<std::unique_ptr<Connection>> server =
      Connection::Accept(*std::move(socket), ServerOptions(), options, handler);
  if (!server.ok()) _exit(3);
  AwaitFailure(**server, absl::Seconds(120)).IgnoreError();
  _exit(0);  // no destructors, no gtest teardown in the child
}

// A call pending on a connection to a forked server while `fault` is sent to
// the server: how the call ends and how long after the fault.
struct FaultOutcome {
  absl::Status call = absl::UnknownError("not run");
  absl::Duration after_fault = absl::InfiniteDuration();
  std::string port;
};
// The fault is sent once the server's handler holds the call (it says so on a
// pipe), so the call is pending then whatever the scheduling. `options` are
// the client's; the child is patient, so only the client's timeout counts.
FaultOutcome CallThrough(int fault, const ConnectionOptions& options, absl::Duration call_deadline) {
  FaultOutcome outcome;
  int held[2];
  if (pipe(held) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return outcome;
  }
  absl::StatusOr<Socket> listener = ListenOnLoopback();
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return outcome;
  outcome.port = absl::StrCat(":", listener->port());
  absl::StatusOr<SocketAddress> address = AddressOf(*listener);
  const pid_t child = ForkServer(*listener, TestOptions(), held[1]);
  EXPECT_GT(child, 0);
  if (child <= 0) return outcome;
  listener->Close();
  close(held[1]);
  absl::StatusOr<std::unique_ptr<Connection>> client =
      Connection::Connect(*address, ClientOptions(), options, Echo);
  EXPECT_TRUE(client.ok()) << client.status();
  if (client.ok()) {
    absl::StatusOr<Response> warmup = (*client)->Call(Ping("warm-up"), In(absl::Seconds(30)));
    EXPECT_TRUE(warmup.ok()) << warmup.status();
    std::optional<absl::Time> fault_time;
    std::thread faulter([&] {
      char byte;
      if (read(held[0], &byte, 1) != 1) return;  // the child died first
      fault_time = absl::Now();
      kill(child, fault);
    });
    outcome.call = (*client)->Call(Ping("hold"), In(call_deadline)).status();
    const absl::Time ended = absl::Now();
    if (!outcome.call.ok()) kill(child, SIGKILL);  // unblocks the faulter if the fault never came
    faulter.join();
    if (fault_time.has_value()) outcome.after_fault = ended - *fault_time;
  }
  close(held[0]);
  kill(child, SIGKILL);  // a stopped child dies too
  int wstatus = 0;
  EXPECT_EQ(waitpid(child, &wstatus, 0), child);
  return outcome;
}

// Tests that a pending call fails with Unavailable, naming the peer, soon
// after the peer process is killed.
TEST(ConnectionTest, PeerKilledMidCallFailsThePendingCall) {
  // A peer timeout and a call deadline of 30 s: the kill must be seen from the
  // closed socket, not from silence.
  FaultOutcome outcome = CallThrough(SIGKILL, TestOptions(), absl::Seconds(30));
  EXPECT_ERROR(outcome.call, absl::StatusCode::kUnavailable, "'server-island'", "127.0.0.1" + outcome.port);
  // The close is seen at once; 10 s tells that from the 30 s timeouts with
  // room for a loaded sanitizer build.
  EXPECT_LT(outcome.after_fault, absl::Seconds(10));
}

// Tests that a peer that stops (SIGSTOP) with its connection open is caught
// by the heartbeat timeout, and the pending call fails saying how long the
// peer was silent.
TEST(ConnectionTest, StoppedPeerIsCaughtByTheHeartbeat) {
  // 3 s of silence (30 heartbeats missed) is a stopped peer, not a loaded one.
  const ConnectionOptions options = WithPeerTimeout(absl::Seconds(3));
  FaultOutcome outcome = CallThrough(SIGSTOP, options, absl::Seconds(30));
  EXPECT_ERROR(outcome.call, absl::StatusCode::kUnavailable, "'server-island'", "127.0.0.1" + outcome.port,
               "was silent for");
  // Not much before the peer timeout (silence counts from the child's last
  // heartbeat, which a loaded child may have sent a while before it was
  // stopped), and long before the call's own deadline (30 s), which would
  // fail it with DeadlineExceeded.
  EXPECT_GT(outcome.after_fault, options.peer_timeout / 2);
  EXPECT_LT(outcome.after_fault, options.peer_timeout + causeway::testing::kSchedulingSlack);
}

// Tests that destroying connections, healthy or failed, leaves no thread and
// no file descriptor behind.
TEST(ConnectionTest, DestructionLeaksNoThreadOrDescriptor) {
  const int fds_before = CountEntries("/proc/self/fd");
  const int threads_before = CountEntries("/proc/self/task");
  ASSERT_GT(fds_before, 0);
  {
    ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
    ConnectionPair healthy = Connect(listener);
    ConnectionPair closed = Connect(listener);
    ASSERT_NE(healthy.client, nullptr);
    ASSERT_NE(closed.client, nullptr);
    ASSERT_OK(healthy.client->Call(Ping("x"), In(absl::Seconds(5))).status());
    closed.server->Close("going away");
    EXPECT_FALSE(AwaitFailure(*closed.client, absl::Seconds(5)).ok());
    // Reader and heartbeat threads of the healthy pair (a failed connection's
    // threads end on their own).
    EXPECT_GE(CountEntries("/proc/self/task"), threads_before + 4);
  }
  // A joined thread may linger in /proc for a moment after it exits.
  EXPECT_EQ(AwaitEntries("/proc/self/task", threads_before), threads_before);
  EXPECT_EQ(AwaitEntries("/proc/self/fd", fds_before), fds_before);
}

// Tests that a notification reaches the peer's handler, and that a call
// after it still gets its own response.
TEST(NotifyTest, NotificationReachesTheHandler) {
  Recorder recorder;
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, recorder.Handler());
  ASSERT_NE(pair.client, nullptr);

  ASSERT_OK(pair.client->Notify(Ping("note"), In(absl::Seconds(5))));
  ASSERT_OK_AND_ASSIGN(Response pong, pair.client->Call(Ping("call"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "call");
  EXPECT_THAT(recorder.AwaitSeen(2, absl::Seconds(5)), ::testing::ElementsAre("note", "call"));
  // A notification whose handler fails is dropped quietly too.
  ASSERT_OK(pair.client->Notify(Ping("fail"), In(absl::Seconds(5))));
  ASSERT_OK_AND_ASSIGN(pong, pair.client->Call(Ping("after"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "after");
  EXPECT_THAT(recorder.AwaitSeen(4, absl::Seconds(5)),
              ::testing::ElementsAre("note", "call", "fail", "after"));
  EXPECT_OK(pair.client->status());
  EXPECT_OK(pair.server->status());
}

// Tests on the wire that a request with id 0 is handled and not answered:
// the first frame back is the response to the call that followed it, and
// nothing else but heartbeats comes afterwards.
TEST(NotifyTest, NotificationGetsNoResponseOnTheWire) {
  Recorder recorder;
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  RawPair raw = ConnectRaw(listener, TestOptions(), recorder.Handler());
  ASSERT_NE(raw.server, nullptr);

  Envelope note;
  note.set_request_id(0);
  *note.mutable_request() = Ping("note");
  Envelope call;
  call.set_request_id(7);
  *call.mutable_request() = Ping("call");
  ASSERT_OK(WriteEnvelope(raw.client, note));
  ASSERT_OK(WriteEnvelope(raw.client, call));

  ASSERT_OK_AND_ASSIGN(Frame frame, ReadSkippingHeartbeats(raw.client, In(absl::Seconds(5))));
  ASSERT_EQ(frame.type, FrameType::kControl);
  Envelope reply;
  ASSERT_TRUE(reply.ParseFromArray(frame.payload.data(), static_cast<int>(frame.payload.size())));
  EXPECT_EQ(reply.request_id(), 7u);
  EXPECT_EQ(reply.response().pong().payload(), "call");
  EXPECT_THAT(recorder.AwaitSeen(2, absl::Seconds(5)), ::testing::ElementsAre("note", "call"));
  // Nothing but heartbeats for a while (less than peer_timeout: this side
  // sends none).
  absl::StatusOr<Frame> more = ReadSkippingHeartbeats(raw.client, In(absl::Milliseconds(400)));
  EXPECT_EQ(more.status().code(), absl::StatusCode::kDeadlineExceeded) << more.status();
  EXPECT_OK(raw.server->status());
}

// Tests that calls and notifications sent from several threads at once all
// arrive, each thread's in the order sent, and every call gets its own
// response.
TEST(NotifyTest, CallsAndNotificationsFromSeveralThreads) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 50;
  Recorder recorder;
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, recorder.Handler());
  ASSERT_NE(pair.client, nullptr);

  std::vector<std::function<void()>> bodies;
  for (int t = 0; t < kThreads; ++t) {
    bodies.push_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        ASSERT_OK(pair.client->Notify(Ping(absl::StrCat(t, " note ", i)), In(absl::Seconds(10))));
        const std::string payload = absl::StrCat(t, " call ", i);
        absl::StatusOr<Response> response = pair.client->Call(Ping(payload), In(absl::Seconds(10)));
        ASSERT_TRUE(response.ok()) << response.status();
        EXPECT_EQ(response->pong().payload(), payload);
      }
    });
  }
  RunConcurrently(std::move(bodies), absl::Seconds(30), "calls and notifications");

  const std::vector<std::string> seen = recorder.AwaitSeen(2 * kThreads * kRounds, absl::Seconds(5));
  ASSERT_EQ(seen.size(), 2u * kThreads * kRounds);
  for (int t = 0; t < kThreads; ++t) {
    std::vector<std::string> want;
    for (int i = 0; i < kRounds; ++i) {
      want.push_back(absl::StrCat(t, " note ", i));
      want.push_back(absl::StrCat(t, " call ", i));
    }
    std::vector<std::string> got;
    for (const std::string& payload : seen) {
      if (absl::StartsWith(payload, absl::StrCat(t, " "))) got.push_back(payload);
    }
    EXPECT_EQ(got, want) << "thread " << t;
  }
  EXPECT_OK(pair.client->status());
}

// Tests that a notification too large for a control frame fails alone, and
// that Notify and SendData on a failed connection give its status.
TEST_F(ConnectedTest, NotifyErrors) {
  EXPECT_ERROR(pair_.client->Notify(Ping(std::string(kMaxControlPayload, 'x')), In(absl::Seconds(5))),
               absl::StatusCode::kInvalidArgument, "control frame carries at most");
  ASSERT_OK_AND_ASSIGN(Response pong, pair_.client->Call(Ping("small"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "small");

  pair_.client->Close("done here");
  EXPECT_ERROR(pair_.client->Notify(Ping("x"), In(absl::Seconds(1))), absl::StatusCode::kCancelled,
               "done here");
  const uint8_t byte = 1;
  EXPECT_ERROR(pair_.client->SendData(1, 1, 0, 1, absl::MakeConstSpan(&byte, 1), In(absl::Seconds(1))),
               absl::StatusCode::kCancelled, "done here");
}

// Tests that objects of 0, 1, 1 MiB + 3 and 150 MiB bytes, sent in one or two
// SendData calls each, arrive bit-exact at their offsets, in chunks of at
// most kDataChunkBytes, with begin and end called once per chunk with the
// right header.
TEST(SendDataTest, ArrivesBitExactInChunks) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  ASSERT_EQ(kDataChunkBytes, 64 * kMiB);
  struct Case {
    uint64_t stream, tag, total;
    std::vector<std::pair<uint64_t, uint64_t>> calls;  // offset, size
    std::vector<Chunk> want;
  };
  const std::vector<Case> cases = {
      {4, 40, 0, {{0, 0}}, {{4, 40, 0, 0, 0}}},
      {1, 10, 1, {{0, 1}}, {{1, 10, 0, 1, 1}}},
      {2, 20, kMiB + 3, {{0, 3}, {3, kMiB}}, {{2, 20, 0, 3, kMiB + 3}, {2, 20, 3, kMiB, kMiB + 3}}},
      {3,
       30,
       150 * kMiB,
       {{0, 100 * kMiB}, {100 * kMiB, 50 * kMiB}},
       {{3, 30, 0, 64 * kMiB, 150 * kMiB},
        {3, 30, 64 * kMiB, 36 * kMiB, 150 * kMiB},
        {3, 30, 100 * kMiB, 50 * kMiB, 150 * kMiB}}},
  };
  Collector collector;
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, Echo, WithSink(collector));
  ASSERT_NE(pair.client, nullptr);

  std::vector<Chunk> want;
  for (const Case& c : cases) {
    const std::vector<uint8_t> bytes = RandomBytes(c.total, /*seed=*/c.stream);
    for (const auto& [offset, size] : c.calls) {
      ASSERT_OK(pair.client->SendData(c.stream, c.tag, offset, c.total,
                                      absl::MakeConstSpan(bytes).subspan(offset, size),
                                      In(absl::Seconds(30))));
    }
    want.insert(want.end(), c.want.begin(), c.want.end());
    ASSERT_TRUE(collector.AwaitEnded(want.size(), absl::Seconds(30))) << "object " << c.stream;
    EXPECT_EQ(Compare(collector.object(c.stream, c.tag), bytes), "identical") << "object " << c.stream;
  }
  EXPECT_EQ(collector.begun(), want);
  EXPECT_EQ(collector.ended(), want);
  ASSERT_OK_AND_ASSIGN(Response pong, pair.client->Call(Ping("after"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "after");
  EXPECT_OK(pair.server->status());
}

// Tests that SendData from two threads at once, with calls in between, on
// one connection delivers every object intact: chunks may alternate, but
// nothing comes inside one.
TEST(SendDataTest, ConcurrentSendsDoNotInterleaveInsideAChunk) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const std::vector<uint64_t> sizes = {5 * kMiB + 17, 70 * kMiB, kMiB};  // 70 MiB: two chunks
  Collector collector;
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, Echo, WithSink(collector));
  ASSERT_NE(pair.client, nullptr);

  std::map<std::pair<uint64_t, uint64_t>, std::vector<uint8_t>> objects;  // by (stream, tag)
  for (uint64_t stream = 1; stream <= 2; ++stream) {
    for (uint64_t tag = 0; tag < sizes.size(); ++tag) {
      objects[{stream, tag}] = RandomBytes(sizes[tag], /*seed=*/stream * 100 + tag);
    }
  }
  std::atomic<int> calls{0};
  std::vector<std::function<void()>> bodies;
  for (uint64_t stream = 1; stream <= 2; ++stream) {
    bodies.push_back([&, stream] {
      for (uint64_t tag = 0; tag < sizes.size(); ++tag) {
        const std::vector<uint8_t>& bytes = objects.at({stream, tag});
        ASSERT_OK(pair.client->SendData(stream, tag, 0, bytes.size(), bytes, In(absl::Seconds(30))));
        const std::string payload = absl::StrCat("after ", stream, "/", tag);
        absl::StatusOr<Response> response = pair.client->Call(Ping(payload), In(absl::Seconds(30)));
        ASSERT_TRUE(response.ok()) << response.status();
        EXPECT_EQ(response->pong().payload(), payload);
        ++calls;
      }
    });
  }
  bodies.push_back([&] {  // small calls all along
    for (int i = 0; i < 50; ++i) {
      const std::string payload = absl::StrCat("meanwhile ", i);
      absl::StatusOr<Response> response = pair.client->Call(Ping(payload), In(absl::Seconds(30)));
      ASSERT_TRUE(response.ok()) << response.status();
      EXPECT_EQ(response->pong().payload(), payload);
      ++calls;
    }
  });
  RunConcurrently(std::move(bodies), absl::Seconds(60), "concurrent SendData");

  EXPECT_EQ(calls.load(), 2 * 3 + 50);
  ASSERT_TRUE(collector.AwaitEnded(2 * 4, absl::Seconds(10)));
  for (const auto& [key, bytes] : objects) {
    EXPECT_EQ(Compare(collector.object(key.first, key.second), bytes), "identical")
        << "stream " << key.first << " tag " << key.second;
  }
  EXPECT_EQ(collector.begun().size(), 8u);
  EXPECT_EQ(collector.begun(), collector.ended());  // each chunk ends before the next begins
  EXPECT_OK(pair.server->status());
}

// Tests that bytes a sink declines (nullptr) are read and dropped without
// `end`, and the connection stays healthy and in step.
TEST(SendDataTest, DeclinedBytesAreDropped) {
  std::atomic<int> begun{0};
  std::atomic<int> ended{0};
  ConnectionOptions options = TestOptions();
  options.data_sink.begin = [&](const DataHeader&) -> absl::StatusOr<uint8_t*> {
    ++begun;
    return nullptr;
  };
  options.data_sink.end = [&](const DataHeader&) { ++ended; };
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, Echo, options);
  ASSERT_NE(pair.client, nullptr);

  const std::vector<uint8_t> bytes = RandomBytes((3 << 20) + 1, /*seed=*/7);  // 4 pieces of up to 1 MiB
  ASSERT_OK(pair.client->SendData(1, 2, 0, bytes.size(), bytes, In(absl::Seconds(10))));
  ASSERT_OK_AND_ASSIGN(Response pong, pair.client->Call(Ping("after"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "after");
  EXPECT_EQ(begun.load(), 1);
  EXPECT_EQ(ended.load(), 0);
  EXPECT_OK(pair.client->status());
  EXPECT_OK(pair.server->status());
}

// Tests that a sink's error fails the connection with DataLoss carrying its
// message, and that the sender is told that reason in a goodbye.
TEST(SendDataTest, SinkErrorFailsTheConnection) {
  ConnectionOptions options = TestOptions();
  options.data_sink.begin = [](const DataHeader& header) -> absl::StatusOr<uint8_t*> {
    return absl::ResourceExhaustedError(absl::StrCat("no room for stream ", header.stream()));
  };
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ConnectionPair pair = Connect(listener, Echo, Echo, options);
  ASSERT_NE(pair.client, nullptr);

  const std::vector<uint8_t> bytes = RandomBytes(1000, /*seed=*/1);
  // Whether this returns OK or the connection's failure depends on timing.
  pair.client->SendData(9, 0, 0, bytes.size(), bytes, In(absl::Seconds(5))).IgnoreError();
  EXPECT_ERROR(AwaitFailure(*pair.server, absl::Seconds(5)), absl::StatusCode::kDataLoss, "'client-island'",
               "no room for stream 9");
  EXPECT_ERROR(AwaitFailure(*pair.client, absl::Seconds(5)), absl::StatusCode::kUnavailable,
               "'server-island'", "closed the connection", "no room for stream 9");
}

// Tests that offset + size beyond total, overflow included, is refused
// before anything is sent, and the connection stays healthy.
TEST_F(ConnectedTest, SendDataPastTheObjectIsInvalid) {
  const std::vector<uint8_t> bytes(5, 0xab);
  EXPECT_ERROR(pair_.client->SendData(1, 2, 10, 12, bytes, In(absl::Seconds(5))),
               absl::StatusCode::kInvalidArgument, "5 bytes at offset 10", "12-byte object");
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_ERROR(pair_.client->SendData(1, 2, kMax - 1, kMax, bytes, In(absl::Seconds(5))),
               absl::StatusCode::kInvalidArgument, absl::StrCat("at offset ", kMax - 1));
  EXPECT_ERROR(pair_.client->SendData(1, 2, 13, 12, {}, In(absl::Seconds(5))),
               absl::StatusCode::kInvalidArgument, "0 bytes at offset 13");
  ASSERT_OK_AND_ASSIGN(Response pong, pair_.client->Call(Ping("still"), In(absl::Seconds(5))));
  EXPECT_EQ(pong.pong().payload(), "still");
  EXPECT_OK(pair_.server->status());
}

// Tests a raw peer's bad bulk traffic against a server with a sink: each
// must fail only that connection with DataLoss (told to the raw peer in a
// goodbye), while another connection to the same server keeps working.
class BadDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(listener_, ListenOnLoopback());
    raw_ = ConnectRaw(listener_, WithSink(collector_));
    ASSERT_NE(raw_.server, nullptr);
    healthy_ = Connect(listener_, Echo, Echo, WithSink(collector_));
    ASSERT_NE(healthy_.client, nullptr);
  }

  void ExpectOnlyThatConnectionFails(absl::string_view want) {
    EXPECT_ERROR(AwaitFailure(*raw_.server, absl::Seconds(5)), absl::StatusCode::kDataLoss, "'raw-client'",
                 std::string(want));
    absl::StatusOr<Frame> frame = ReadSkippingHeartbeats(raw_.client, In(absl::Seconds(5)));
    ASSERT_TRUE(frame.ok()) << frame.status();
    ASSERT_EQ(frame->type, FrameType::kGoodbye);
    Envelope goodbye;
    ASSERT_TRUE(goodbye.ParseFromArray(frame->payload.data(), static_cast<int>(frame->payload.size())));
    EXPECT_THAT(goodbye.goodbye().reason(), HasSubstr(std::string(want)));

    const std::vector<uint8_t> bytes = RandomBytes(100, /*seed=*/3);
    ASSERT_OK(healthy_.client->SendData(5, 5, 0, bytes.size(), bytes, In(absl::Seconds(5))));
    ASSERT_OK_AND_ASSIGN(Response pong, healthy_.client->Call(Ping("still here"), In(absl::Seconds(5))));
    EXPECT_EQ(pong.pong().payload(), "still here");
    EXPECT_EQ(Compare(collector_.object(5, 5), bytes), "identical");
    EXPECT_OK(healthy_.server->status());
  }

  Collector collector_;  // outlives the connections
  Socket listener_;
  RawPair raw_;
  ConnectionPair healthy_;
};

// Tests that a data frame with no DataHeader before it is DataLoss.
TEST_F(BadDataTest, DataFrameWithoutHeader) {
  const std::vector<uint8_t> bytes(10, 1);
  ASSERT_OK(WriteFrame(raw_.client, FrameType::kData, {absl::MakeConstSpan(bytes)}, In(absl::Seconds(5))));
  ExpectOnlyThatConnectionFails("data frame of 10 bytes from peer 'raw-client'");
  EXPECT_THAT(raw_.server->status().message(), HasSubstr("without a DataHeader"));
  EXPECT_EQ(collector_.begun().size(), 1u);  // the healthy connection's only
}

// Tests that a DataHeader followed by a data frame of another length is
// DataLoss naming both lengths.
TEST_F(BadDataTest, DataFrameOfTheWrongLength) {
  const std::vector<uint8_t> bytes(50, 1);
  ASSERT_OK(WriteDataHeader(raw_.client, 1, 1, 0, 100, 100));
  ASSERT_OK(WriteFrame(raw_.client, FrameType::kData, {absl::MakeConstSpan(bytes)}, In(absl::Seconds(5))));
  ExpectOnlyThatConnectionFails(
      "must be followed by a data frame of 100 bytes, got a data frame of 50 bytes");
}

// Tests that a DataHeader followed by some other frame is DataLoss.
TEST_F(BadDataTest, HeaderFollowedByAnotherFrame) {
  ASSERT_OK(WriteDataHeader(raw_.client, 1, 1, 0, 100, 100));
  ASSERT_OK(WriteFrame(raw_.client, FrameType::kHeartbeat, {}, In(absl::Seconds(5))));
  ExpectOnlyThatConnectionFails("got a heartbeat frame of 0 bytes");
}

// Tests that a DataHeader whose bytes run past the end of its object is
// DataLoss, before the sink sees it.
TEST_F(BadDataTest, HeaderPastTheObject) {
  ASSERT_OK(WriteDataHeader(raw_.client, 1, 1, 10, 100, 50));
  ExpectOnlyThatConnectionFails("100 bytes at offset 10 run past the end of the 50-byte object");
  EXPECT_EQ(collector_.begun().size(), 1u);  // the healthy connection's only
}

// Tests that a DataHeader whose offset + length overflows is DataLoss.
TEST_F(BadDataTest, HeaderWhoseEndOverflows) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  ASSERT_OK(WriteDataHeader(raw_.client, 1, 1, kMax - 5, 10, kMax));
  ExpectOnlyThatConnectionFails(absl::StrCat("10 bytes at offset ", kMax - 5, " run past the end"));
}

// Tests that a peer that goes silent halfway through a data frame's payload
// fails the connection with Unavailable once peer_timeout has passed, and
// that nothing waits longer.
TEST(SendDataTest, PeerSilentMidPayloadTimesOut) {
  constexpr uint64_t kLength = uint64_t{1} << 20;
  Collector collector;
  ConnectionOptions options = WithSink(collector);
  // Long enough that the raw client, which sends no heartbeats, is not
  // timed out before it stalls, even when descheduled under load.
  options.peer_timeout = absl::Seconds(2);
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  RawPair raw = ConnectRaw(listener, options);
  ASSERT_NE(raw.server, nullptr);

  const std::vector<uint8_t> half(kLength / 2, 7);
  const std::array<uint8_t, kFrameHeaderSize> data_frame = EncodeFrameHeader(FrameType::kData, kLength);
  ASSERT_OK(WriteDataHeader(raw.client, 1, 1, 0, kLength, kLength));
  ASSERT_OK(raw.client.WriteAll({data_frame, half}, In(absl::Seconds(5))));
  const absl::Time stalled = absl::Now();

  EXPECT_ERROR(AwaitFailure(*raw.server, absl::Seconds(30)), absl::StatusCode::kUnavailable, "'raw-client'",
               "was silent for", "reading the payload of data (stream 1, tag 1");
  const absl::Duration waited = absl::Now() - stalled;
  // Not before the timeout (load only delays the reader); the upper bound
  // tells the timeout from a read that would wait for ever, with seconds of
  // room for a loaded sanitizer build.
  EXPECT_GT(waited, options.peer_timeout - absl::Milliseconds(100));
  EXPECT_LT(waited, options.peer_timeout + causeway::testing::kSchedulingSlack);
  EXPECT_EQ(collector.begun().size(), 1u);
  EXPECT_TRUE(collector.ended().empty());
}

}  // namespace
}  // namespace causeway::transport
