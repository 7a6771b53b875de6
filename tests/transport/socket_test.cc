#include "causeway/transport/socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"

namespace causeway::transport {
namespace {

using ::causeway::testing::RunConcurrently;
using testing::AsBytes;
using testing::ConnectedPair;
using ::testing::HasSubstr;
using testing::In;
using testing::ListenOnLoopback;

constexpr size_t kMiB = size_t{1} << 20;

// Deterministic bytes that differ at every offset of a large buffer (a
// repeating pattern could hide pieces sent in the wrong order).
std::vector<uint8_t> PatternBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> bytes(n);
  uint64_t state = seed;
  for (size_t i = 0; i < n; i += 8) {
    state += 0x9e3779b97f4a7c15;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    z ^= z >> 31;
    std::memcpy(&bytes[i], &z, std::min<size_t>(8, n - i));
  }
  return bytes;
}

// The offset of the first byte where `a` and `b` differ, or -1.
int64_t FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// Sends `sent` cut into `pieces` (offsets into it, in order) from one end of a
// loopback connection and reads it at the other in reads of `read_size`
// bytes; returns what arrived.
std::vector<uint8_t> RoundTrip(const std::vector<uint8_t>& sent, const std::vector<size_t>& cuts,
                               size_t read_size) {
  auto pair = ConnectedPair();
  EXPECT_TRUE(pair.ok()) << pair.status();
  if (!pair.ok()) return {};
  std::vector<absl::Span<const uint8_t>> pieces;
  size_t from = 0;
  for (size_t cut : cuts) {
    pieces.push_back(absl::MakeConstSpan(sent).subspan(from, cut - from));
    from = cut;
  }
  pieces.push_back(absl::MakeConstSpan(sent).subspan(from));
  std::vector<uint8_t> received(sent.size());
  RunConcurrently({[&] { EXPECT_OK(pair->client.WriteAll(pieces, In(absl::Seconds(20)))); },
                   [&] {
                     for (size_t at = 0; at < received.size(); at += read_size) {
                       const size_t n = std::min(read_size, received.size() - at);
                       absl::Status s = pair->server.ReadExact(&received[at], n, In(absl::Seconds(20)));
                       ASSERT_TRUE(s.ok()) << s;
                     }
                   }},
                  absl::Seconds(60), "round trip");
  return received;
}

// Tests the forms of address the transport is configured with.
TEST(SocketAddressTest, ParsesNumericAddressesAndLocalhost) {
  struct Case {
    const char* text;
    int family;
    uint16_t port;
    const char* canonical;
    bool loopback;
  };
  for (const Case& c : std::vector<Case>{
           {"127.0.0.1:5000", AF_INET, 5000, "127.0.0.1:5000", true},
           {"localhost:0", AF_INET, 0, "127.0.0.1:0", true},
           {"LocalHost:65535", AF_INET, 65535, "127.0.0.1:65535", true},
           {"[::1]:5000", AF_INET6, 5000, "[::1]:5000", true},
           {"0.0.0.0:5000", AF_INET, 5000, "0.0.0.0:5000", false},
           {"[::]:7", AF_INET6, 7, "[::]:7", false},
           {"10.1.2.3:80", AF_INET, 80, "10.1.2.3:80", false},
           {"127.255.0.1:1", AF_INET, 1, "127.255.0.1:1", true},
           {"[::ffff:127.0.0.1]:1", AF_INET6, 1, "[::ffff:127.0.0.1]:1", true},
           {"[::ffff:10.0.0.1]:1", AF_INET6, 1, "[::ffff:10.0.0.1]:1", false},
       }) {
    SCOPED_TRACE(c.text);
    ASSERT_OK_AND_ASSIGN(SocketAddress address, SocketAddress::Parse(c.text));
    EXPECT_EQ(address.family(), c.family);
    EXPECT_EQ(address.port(), c.port);
    EXPECT_EQ(address.ToString(), c.canonical);
    EXPECT_EQ(address.IsLoopback(), c.loopback);
  }
}

// Tests that malformed addresses are refused with a message that quotes them
// and says what is wrong.
TEST(SocketAddressTest, RefusesJunkWithAClearError) {
  struct Case {
    std::string text;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {"", "no port"},
           {"abc", "no port"},
           {"1.2.3.4", "no port"},
           {"1.2.3.4:", "port '' is not a number from 0 to 65535"},
           {"1.2.3.4:65536", "port '65536'"},
           {"1.2.3.4:5x", "port '5x'"},
           {"1.2.3.4:-1", "port '-1'"},
           {"1.2.3.4:+80", "port '+80'"},
           {"1.2.3.4:000080", "port '000080'"},
           {":5000", "no host"},
           {"::1:5000", "needs brackets"},
           {"[::1:5000", "'[' without ']'"},
           {"[::1]5000", "no ':' and port after ']'"},
           {"[1.2.3.4]:80", "'1.2.3.4' is not an IPv6 address"},
           {"256.1.1.1:80", "'256.1.1.1' is not an IPv4 address"},
           {"1.2.3:80", "'1.2.3' is not an IPv4 address"},
           {"a b:1", "'a b' is not a host name"},
           {std::string("ho\0st:1", 7), "is not a host name"},
       }) {
    SCOPED_TRACE(c.text);
    EXPECT_ERROR(SocketAddress::Parse(c.text).status(), absl::StatusCode::kInvalidArgument, c.why,
                 "expected host:port");
  }
}

// Tests that a listener on port 0 gets a real port, and that both ends of a
// connection know each other's address.
TEST(SocketTest, ListensOnAnyPortAndConnects) {
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  EXPECT_NE(listener.port(), 0);
  EXPECT_EQ(listener.local_address().ToString(), absl::StrCat("127.0.0.1:", listener.port()));
  ASSERT_OK_AND_ASSIGN(SocketAddress address, testing::AddressOf(listener));
  ASSERT_OK_AND_ASSIGN(Socket client, Socket::Connect(address, In(absl::Seconds(5))));
  ASSERT_OK_AND_ASSIGN(Socket server, listener.Accept(In(absl::Seconds(5))));
  EXPECT_EQ(client.peer_address().port(), listener.port());
  EXPECT_EQ(server.local_address().port(), listener.port());
  EXPECT_EQ(server.peer_address().ToString(), client.local_address().ToString());
  EXPECT_TRUE(server.local_address().IsLoopback());
}

// Tests the descriptor flags every socket is made with.
TEST(SocketTest, DescriptorsAreCloseOnExecNonBlockingAndNoDelay) {
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ASSERT_OK_AND_ASSIGN(SocketAddress address, testing::AddressOf(listener));
  ASSERT_OK_AND_ASSIGN(Socket client, Socket::Connect(address, In(absl::Seconds(5))));
  ASSERT_OK_AND_ASSIGN(Socket server, listener.Accept(In(absl::Seconds(5))));
  for (const Socket* s : {&listener, &client, &server}) {
    EXPECT_NE(fcntl(s->fd(), F_GETFD) & FD_CLOEXEC, 0);
    EXPECT_NE(fcntl(s->fd(), F_GETFL) & O_NONBLOCK, 0);
  }
  for (const Socket* s : {&client, &server}) {
    int nodelay = 0;
    socklen_t length = sizeof(nodelay);
    ASSERT_EQ(getsockopt(s->fd(), IPPROTO_TCP, TCP_NODELAY, &nodelay, &length), 0);
    EXPECT_NE(nodelay, 0);
  }
}

// Tests that 64 MiB sent as a gather list of uneven pieces (an empty one
// among them) arrives whole and in order, checked byte for byte.
TEST(SocketTest, LargeGatherWriteArrivesByteForByte) {
  const std::vector<uint8_t> sent = PatternBytes(64 * kMiB, 1);
  const std::vector<size_t> cuts = {1, 1, 4096 + 3, 17 * kMiB, 17 * kMiB + 5, 40 * kMiB};
  const std::vector<uint8_t> received = RoundTrip(sent, cuts, kMiB + 7);
  EXPECT_EQ(FirstDifference(sent, received), -1);
}

// Tests a gather list longer than the kernel takes in one call (IOV_MAX).
TEST(SocketTest, GatherListsLongerThanIovMaxAreSentInTurn) {
  const std::vector<uint8_t> sent = PatternBytes(3000 * 50, 2);
  std::vector<size_t> cuts;
  for (size_t at = 0, i = 0; i < 2999; ++i) {
    at += 1 + (i * 7) % 97;  // 1 to 97 bytes each, the rest in the last piece
    cuts.push_back(at);
  }
  const std::vector<uint8_t> received = RoundTrip(sent, cuts, 4096);
  EXPECT_EQ(FirstDifference(sent, received), -1);
}

// Tests that a read from a peer that never writes ends at its deadline, and
// says what it waited for.
TEST(SocketTest, ReadFromSilentPeerFailsAtItsDeadline) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  uint8_t buffer[16];
  const absl::Time start = absl::Now();
  absl::Status s = pair.server.ReadExact(buffer, sizeof(buffer), start + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_ERROR(s, absl::StatusCode::kDeadlineExceeded, "0 of 16 bytes received after waiting 200ms");
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Milliseconds(200) + causeway::testing::kSchedulingSlack);
}

// Tests that bytes that did come are counted in the deadline's message.
TEST(SocketTest, PartialReadThenDeadlineSaysHowMuchCame) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  ASSERT_OK(pair.client.WriteAll({AsBytes("12345")}, In(absl::Seconds(5))));
  uint8_t buffer[16];
  EXPECT_ERROR(pair.server.ReadExact(buffer, sizeof(buffer), In(absl::Milliseconds(100))),
               absl::StatusCode::kDeadlineExceeded, "5 of 16 bytes");
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buffer), 5), "12345");
}

// Tests that Accept with nobody connecting ends at its deadline.
TEST(SocketTest, AcceptWithoutPeerFailsAtItsDeadline) {
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  const absl::Time start = absl::Now();
  EXPECT_ERROR(listener.Accept(start + absl::Milliseconds(150)).status(), absl::StatusCode::kDeadlineExceeded,
               absl::StrCat("accept on 127.0.0.1:", listener.port(), ": no connection after 150ms"));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(150) + causeway::testing::kSchedulingSlack);
}

// Tests that a write to a peer that never reads ends at its deadline, once
// the socket buffers are full, and says how much was sent.
TEST(SocketTest, WriteToPeerThatDoesNotReadFailsAtItsDeadline) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  const std::vector<uint8_t> bytes(64 * kMiB, 0x5a);
  const absl::Time start = absl::Now();
  absl::Status s = pair.client.WriteAll({bytes}, start + absl::Milliseconds(300));
  EXPECT_ERROR(s, absl::StatusCode::kDeadlineExceeded, "of 67108864 bytes sent after 300ms");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(300) + causeway::testing::kSchedulingSlack);
}

// Tests that Connect to a listener whose queue is full ends at its deadline.
// (With a backlog of 0 Linux queues one connection and drops the SYNs of the
// next ones, so their connects hang until the deadline.)
TEST(SocketTest, ConnectThatIsNotAnsweredFailsAtItsDeadline) {
  ASSERT_OK_AND_ASSIGN(SocketAddress any_port, SocketAddress::Parse("127.0.0.1:0"));
  ASSERT_OK_AND_ASSIGN(Socket listener, Socket::Listen(any_port, 0));
  ASSERT_OK_AND_ASSIGN(SocketAddress address, testing::AddressOf(listener));
  std::vector<Socket> queued;
  absl::Status last;
  for (int i = 0; i < 8 && last.ok(); ++i) {
    absl::StatusOr<Socket> client = Socket::Connect(address, In(absl::Milliseconds(150)));
    if (client.ok()) queued.push_back(*std::move(client));
    last = client.status();
  }
  EXPECT_ERROR(last, absl::StatusCode::kDeadlineExceeded,
               absl::StrCat("connect to ", address.ToString(), ": not established after 150ms"));
}

// Tests that end of stream in the middle of a read is Unavailable and says
// how much of the read came.
TEST(SocketTest, PeerClosingMidReadIsUnavailable) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  ASSERT_OK(pair.client.WriteAll({AsBytes("abc")}, In(absl::Seconds(5))));
  pair.client.Close();
  uint8_t buffer[10];
  EXPECT_ERROR(pair.server.ReadExact(buffer, sizeof(buffer), In(absl::Seconds(5))),
               absl::StatusCode::kUnavailable, "peer closed the connection after 3 of 10 bytes");
}

// Tests that writing to a closed peer is an error, not SIGPIPE (which would
// end this test binary).
TEST(SocketTest, WriteToClosedPeerFailsWithoutSignal) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  pair.server.Close();
  const std::vector<uint8_t> bytes(kMiB, 1);
  absl::Status s;
  // The first writes may still be buffered; the peer's reset fails a later one.
  for (int i = 0; i < 100 && s.ok(); ++i) s = pair.client.WriteAll({bytes}, In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("write to 127.0.0.1:"));
}

// Tests that a connection refused by the peer's kernel is Unavailable.
TEST(SocketTest, ConnectToClosedPortIsUnavailable) {
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ASSERT_OK_AND_ASSIGN(SocketAddress address, testing::AddressOf(listener));
  listener.Close();
  EXPECT_ERROR(Socket::Connect(address, In(absl::Seconds(5))).status(), absl::StatusCode::kUnavailable,
               absl::StrCat("connect to ", address.ToString(), ": Connection refused"));
}

// Tests that binding a port in use names the address and the reason.
TEST(SocketTest, ListenOnBusyPortNamesTheAddress) {
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  ASSERT_OK_AND_ASSIGN(SocketAddress address, testing::AddressOf(listener));
  absl::Status s = Socket::Listen(address, 4).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("bind ", address.ToString(), ": Address already in use")));
}

// Tests that ShutdownBoth from another thread wakes a reader blocked with a
// long deadline.
TEST(SocketTest, ShutdownWakesABlockedReader) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  absl::Status read_status;
  absl::Duration took;
  std::atomic<pid_t> reader{0};
  bool reader_slept = false;
  RunConcurrently({[&] {
                     uint8_t buffer[16];
                     const absl::Time start = absl::Now();
                     reader = ::causeway::testing::CurrentThreadId();
                     read_status = pair.server.ReadExact(buffer, sizeof(buffer), start + absl::Seconds(30));
                     took = absl::Now() - start;
                   },
                   [&] {
                     while (reader.load() == 0) std::this_thread::yield();
                     // Asleep once it has set its id: only the read can put it there.
                     reader_slept = ::causeway::testing::AwaitThreadSleeping(reader.load());
                     pair.server.ShutdownBoth();
                   }},
                  absl::Seconds(20), "shutdown");
  EXPECT_TRUE(reader_slept) << "the reader never blocked";
  EXPECT_ERROR(read_status, absl::StatusCode::kUnavailable, "after 0 of 16 bytes");
  EXPECT_LT(took, absl::Seconds(20));  // not its 30 s deadline
}

// Tests ownership: a move leaves the source invalid, and destruction closes
// the descriptor.
TEST(SocketTest, MoveTransfersTheDescriptorAndDestructionClosesIt) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  const int fd = pair.client.fd();
  Socket moved = std::move(pair.client);
  EXPECT_FALSE(pair.client.valid());  // NOLINT(bugprone-use-after-move): the contract under test
  EXPECT_EQ(moved.fd(), fd);
  uint8_t byte;
  EXPECT_ERROR(pair.client.ReadExact(&byte, 1, In(absl::Seconds(1))), absl::StatusCode::kFailedPrecondition,
               "closed or moved-from socket");
  { Socket gone = std::move(moved); }
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
}  // namespace causeway::transport
