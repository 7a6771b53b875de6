#include "transport/connection.h"

#include <dirent.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"
#include "transport/control.pb.h"
#include "transport/frame.h"
#include "transport/handshake.h"
#include "transport/socket.h"

namespace causeway::transport {
namespace {

using ::causeway::testing::RunConcurrently;
using testing::AddressOf;
using testing::AsBytes;
using ::testing::HasSubstr;
using testing::In;
using testing::ListenOnLoopback;

// Fast heartbeats and a short timeout, so that faults show within a second.
ConnectionOptions FastOptions() {
  ConnectionOptions options;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.peer_timeout = absl::Seconds(1);
  return options;
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
// long first; "fail" answers NotFound.
absl::StatusOr<Response> Echo(const Request& request) {
  const std::string& payload = request.ping().payload();
  if (payload == "fail") return absl::NotFoundError("no program named 'fail'");
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
                       RequestHandler server_handler = Echo) {
  ConnectionPair pair;
  absl::StatusOr<SocketAddress> address = AddressOf(listener);
  EXPECT_TRUE(address.ok()) << address.status();
  if (!address.ok()) return pair;
  RunConcurrently({[&] {
                     absl::StatusOr<std::unique_ptr<Connection>> client =
                         Connection::Connect(*address, ClientOptions(), FastOptions(), client_handler);
                     EXPECT_TRUE(client.ok()) << client.status();
                     if (client.ok()) pair.client = *std::move(client);
                   },
                   [&] {
                     absl::StatusOr<Socket> socket = listener.Accept(In(absl::Seconds(5)));
                     EXPECT_TRUE(socket.ok()) << socket.status();
                     if (!socket.ok()) return;
                     absl::StatusOr<std::unique_ptr<Connection>> server = Connection::Accept(
                         *std::move(socket), ServerOptions(), FastOptions(), server_handler);
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
RawPair ConnectRaw(Socket& listener) {
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
                         Connection::Accept(*std::move(socket), ServerOptions(), FastOptions(), Echo);
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

// Entries of a /proc directory: open descriptors, or threads.
int CountEntries(const char* path) {
  int count = 0;
  DIR* dir = opendir(path);
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
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
  const absl::Time start = absl::Now();
  EXPECT_ERROR(pair_.client->Call(Ping("sleep:300"), In(absl::Milliseconds(50))).status(),
               absl::StatusCode::kDeadlineExceeded, "no response from peer 'server-island'");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(250));
  ASSERT_OK_AND_ASSIGN(Response pong, pair_.client->Call(Ping("after"), In(absl::Seconds(5))));
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
TEST_F(ConnectedTest, HeartbeatsKeepAnIdleConnectionUp) {
  absl::SleepFor(FastOptions().peer_timeout * 1.5);
  EXPECT_OK(pair_.client->status());
  EXPECT_OK(pair_.server->status());
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

// Forks a child that accepts one connection on `listener` and serves it with
// Echo until the connection ends. The parent has no other threads then, so
// the child may make its own.
pid_t ForkServer(Socket& listener) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  absl::StatusOr<Socket> socket = listener.Accept(In(absl::Seconds(10)));
  if (!socket.ok()) _exit(2);
  absl::StatusOr<std::unique_ptr<Connection>> server =
      Connection::Accept(*std::move(socket), ServerOptions(), FastOptions(), Echo);
  if (!server.ok()) _exit(3);
  AwaitFailure(**server, absl::Seconds(20)).IgnoreError();
  _exit(0);  // no destructors, no gtest teardown in the child
}

// A call pending on a connection to a forked server while `fault` is sent to
// the server: how the call ends and how long after the fault.
struct FaultOutcome {
  absl::Status call = absl::UnknownError("not run");
  absl::Duration after_fault;
  std::string port;
};
FaultOutcome CallThrough(int fault) {
  FaultOutcome outcome;
  absl::StatusOr<Socket> listener = ListenOnLoopback();
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return outcome;
  outcome.port = absl::StrCat(":", listener->port());
  absl::StatusOr<SocketAddress> address = AddressOf(*listener);
  const pid_t child = ForkServer(*listener);
  EXPECT_GT(child, 0);
  if (child <= 0) return outcome;
  listener->Close();
  absl::StatusOr<std::unique_ptr<Connection>> client =
      Connection::Connect(*address, ClientOptions(), FastOptions(), Echo);
  EXPECT_TRUE(client.ok()) << client.status();
  if (client.ok()) {
    absl::StatusOr<Response> warmup = (*client)->Call(Ping("warm-up"), In(absl::Seconds(5)));
    EXPECT_TRUE(warmup.ok()) << warmup.status();
    absl::Time fault_time;
    std::thread faulter([&] {
      absl::SleepFor(absl::Milliseconds(100));  // the call below is pending by then
      fault_time = absl::Now();
      kill(child, fault);
    });
    // The child sleeps 10 s in its handler: longer than the whole test waits.
    outcome.call = (*client)->Call(Ping("sleep:10000"), In(absl::Seconds(8))).status();
    outcome.after_fault = absl::Now() - fault_time;
    faulter.join();
  }
  kill(child, SIGKILL);  // a stopped child dies too
  int wstatus = 0;
  EXPECT_EQ(waitpid(child, &wstatus, 0), child);
  return outcome;
}

// Tests that a pending call fails with Unavailable, naming the peer, soon
// after the peer process is killed.
TEST(ConnectionTest, PeerKilledMidCallFailsThePendingCall) {
  FaultOutcome outcome = CallThrough(SIGKILL);
  EXPECT_ERROR(outcome.call, absl::StatusCode::kUnavailable, "'server-island'", "127.0.0.1" + outcome.port);
  EXPECT_LT(outcome.after_fault, FastOptions().peer_timeout + absl::Milliseconds(500));
}

// Tests that a peer that stops (SIGSTOP) with its connection open is caught
// by the heartbeat timeout, and the pending call fails saying how long the
// peer was silent.
TEST(ConnectionTest, StoppedPeerIsCaughtByTheHeartbeat) {
  FaultOutcome outcome = CallThrough(SIGSTOP);
  EXPECT_ERROR(outcome.call, absl::StatusCode::kUnavailable, "'server-island'", "127.0.0.1" + outcome.port,
               "was silent for");
  EXPECT_GT(outcome.after_fault, FastOptions().peer_timeout - FastOptions().heartbeat_interval * 2);
  EXPECT_LT(outcome.after_fault, FastOptions().peer_timeout + absl::Milliseconds(700));
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
  const absl::Time deadline = In(absl::Seconds(2));
  while (CountEntries("/proc/self/task") != threads_before && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(CountEntries("/proc/self/task"), threads_before);
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds_before);
}

}  // namespace
}  // namespace causeway::transport
