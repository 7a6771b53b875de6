#include "causeway/transport/frame.h"

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/transport/bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"

namespace causeway::transport {
namespace {

using testing::AsBytes;
using testing::ConnectedPair;
using testing::In;

constexpr uint64_t kTiB = uint64_t{1} << 40;

std::array<uint8_t, kFrameHeaderSize> RawHeader(uint32_t magic, uint16_t version, uint16_t type,
                                                uint64_t length) {
  std::array<uint8_t, kFrameHeaderSize> header;
  StoreLittleEndian(magic, &header[0]);
  StoreLittleEndian(version, &header[4]);
  StoreLittleEndian(type, &header[6]);
  StoreLittleEndian(length, &header[8]);
  return header;
}

std::vector<FrameType> AllTypes() {
  std::vector<FrameType> types;
  for (uint16_t t = 1; t <= kMaxFrameType; ++t) types.push_back(static_cast<FrameType>(t));
  return types;
}

// Expects the next `text.size()` bytes on `socket` to be `text`: what a
// refused frame must leave unread.
void ExpectNextBytes(Socket& socket, absl::string_view text) {
  std::string got(text.size(), '\0');
  ASSERT_OK(socket.ReadExact(got.data(), got.size(), In(absl::Seconds(5))));
  EXPECT_EQ(got, text);
}

// Tests the header layout byte for byte: "CWDN", version, type, length, all
// little-endian.
TEST(FrameHeaderTest, EncodesTheDocumentedLayout) {
  const std::array<uint8_t, kFrameHeaderSize> header =
      EncodeFrameHeader(FrameType::kControl, 0x0102030405060708);
  const std::array<uint8_t, kFrameHeaderSize> expected = {'C', 'W', 'D', 'N', 1, 0, 7, 0,
                                                          8,   7,   6,   5,   4, 3, 2, 1};
  EXPECT_EQ(header, expected);
}

// Tests every type at its bound (accepted in its state, refused in the other)
// and one byte over it.
TEST(FrameHeaderTest, EachTypeIsBoundedAndAllowedOnlyInItsState) {
  const std::vector<std::pair<FrameType, uint64_t>> bounds = {
      {FrameType::kHello, 105},        {FrameType::kChallenge, 70},   {FrameType::kProof, 32},
      {FrameType::kWelcome, 65},       {FrameType::kRefused, 256},    {FrameType::kHeartbeat, 64},
      {FrameType::kControl, 16 << 20}, {FrameType::kData, 256 << 20}, {FrameType::kGoodbye, 1024},
  };
  ASSERT_EQ(bounds.size(), AllTypes().size());
  for (const auto& [type, bound] : bounds) {
    SCOPED_TRACE(FrameTypeName(type));
    EXPECT_EQ(MaxFrameLength(type), bound);
    // Handshake frames belong before authentication, the others after it.
    const bool allowed_state = !IsHandshakeFrame(type);
    const std::string described = absl::StrCat(static_cast<int>(type), " (", FrameTypeName(type), ")");
    ASSERT_OK_AND_ASSIGN(FrameHeader header, ParseFrameHeader(EncodeFrameHeader(type, bound), allowed_state));
    EXPECT_EQ(header, (FrameHeader{type, bound}));
    EXPECT_ERROR(ParseFrameHeader(EncodeFrameHeader(type, bound), !allowed_state).status(),
                 absl::StatusCode::kPermissionDenied,
                 absl::StrCat("frame type ", described, allowed_state ? " before" : " after",
                              " the handshake finished"));
    EXPECT_ERROR(ParseFrameHeader(EncodeFrameHeader(type, bound + 1), allowed_state).status(),
                 absl::StatusCode::kDataLoss,
                 absl::StrCat("length ", bound + 1, " exceeds the ", bound, "-byte bound of a ",
                              FrameTypeName(type), " frame"));
  }
}

// Tests the messages of the errors callers will see most.
TEST(FrameHeaderTest, RefusalsSayWhatWasWrong) {
  EXPECT_ERROR(ParseFrameHeader(AsBytes("AAAAAAAAAAAAAAAA"), false).status(), absl::StatusCode::kDataLoss,
               "bad magic 0x41414141, expected 0x4e445743 (\"CWDN\")");
  EXPECT_ERROR(ParseFrameHeader(EncodeFrameHeader(FrameType::kControl, 10), false).status(),
               absl::StatusCode::kPermissionDenied, "frame type 7 (control) before the handshake finished");
  EXPECT_ERROR(ParseFrameHeader(EncodeFrameHeader(FrameType::kControl, kTiB), true).status(),
               absl::StatusCode::kDataLoss,
               "length 1099511627776 exceeds the 16777216-byte bound of a control frame");
  for (uint16_t version : {0, 2, 0xffff}) {
    EXPECT_ERROR(ParseFrameHeader(RawHeader(kFrameMagic, version, 7, 0), true).status(),
                 absl::StatusCode::kUnimplemented,
                 absl::StrCat("frame version ", version, " is not supported; this build speaks version 1"));
  }
  for (uint16_t type : {0, 10, 0xffff}) {
    for (bool authenticated : {false, true}) {
      EXPECT_ERROR(ParseFrameHeader(RawHeader(kFrameMagic, 1, type, 0), authenticated).status(),
                   absl::StatusCode::kDataLoss,
                   absl::StrCat("unknown frame type ", type, "; known types are 1 to 9"));
    }
  }
  const std::array<uint8_t, 17> long_header{};
  EXPECT_ERROR(ParseFrameHeader(absl::MakeConstSpan(long_header).first(15), false).status(),
               absl::StatusCode::kInvalidArgument, "a frame header is 16 bytes, got 15");
  EXPECT_ERROR(ParseFrameHeader(long_header, false).status(), absl::StatusCode::kInvalidArgument,
               "a frame header is 16 bytes, got 17");
}

// Tests random headers against a direct statement of the rules. Half the
// headers have the right magic and version, so that the later checks are
// reached; both outcomes must occur, or the test proves nothing.
TEST(FrameHeaderTest, RandomHeadersFollowTheRules) {
  std::mt19937_64 random(7);
  int accepted = 0;
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::array<uint8_t, kFrameHeaderSize> header;
    for (uint8_t& byte : header) byte = static_cast<uint8_t>(random());
    if (i % 2 == 0) {
      StoreLittleEndian(kFrameMagic, &header[0]);
      StoreLittleEndian(kWireVersion, &header[4]);
      StoreLittleEndian(static_cast<uint16_t>(random() % 12), &header[6]);
      StoreLittleEndian(random() % 300, &header[8]);
    }
    const bool authenticated = (i / 2) % 2 == 1;
    const auto type = LoadLittleEndian<uint16_t>(&header[6]);
    const auto length = LoadLittleEndian<uint64_t>(&header[8]);
    const bool valid = LoadLittleEndian<uint32_t>(&header[0]) == kFrameMagic &&
                       LoadLittleEndian<uint16_t>(&header[4]) == kWireVersion && type >= 1 && type <= 9 &&
                       (type <= 5) == !authenticated &&
                       length <= MaxFrameLength(static_cast<FrameType>(type));
    absl::StatusOr<FrameHeader> parsed = ParseFrameHeader(header, authenticated);
    ASSERT_EQ(parsed.ok(), valid) << "header #" << i << ": " << parsed.status();
    if (valid) {
      EXPECT_EQ(static_cast<uint16_t>(parsed->type), type);
      EXPECT_EQ(parsed->length, length);
    }
    ++(valid ? accepted : refused);
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
}

// Tests that a frame written from several pieces is read back whole, and
// that frames follow each other on one connection.
TEST(FrameTest, RoundTripsOverLoopback) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  std::vector<uint8_t> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<uint8_t> expected;
  for (absl::Span<const uint8_t> piece : {AsBytes("head"), absl::MakeConstSpan(big), AsBytes("tail")}) {
    expected.insert(expected.end(), piece.begin(), piece.end());
  }
  causeway::testing::RunConcurrently(
      {[&] {
         EXPECT_OK(WriteFrame(pair.client, FrameType::kData, {AsBytes("head"), big, AsBytes("tail")},
                              In(absl::Seconds(10))));
         EXPECT_OK(WriteFrame(pair.client, FrameType::kHeartbeat, {}, In(absl::Seconds(10))));
       },
       [&] {
         absl::StatusOr<Frame> data = ReadFrame(pair.server, true, kMaxDataPayload, In(absl::Seconds(10)));
         ASSERT_TRUE(data.ok()) << data.status();
         EXPECT_EQ(data->type, FrameType::kData);
         EXPECT_TRUE(data->payload == expected) << "payload of " << data->payload.size() << " bytes differs";
         absl::StatusOr<Frame> heartbeat =
             ReadFrame(pair.server, true, kMaxDataPayload, In(absl::Seconds(10)));
         ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
         EXPECT_EQ(heartbeat->type, FrameType::kHeartbeat);
         EXPECT_TRUE(heartbeat->payload.empty());
       }},
      absl::Seconds(30), "frame round trip");
}

// Tests that ReadFrameHeader checks a header and leaves exactly its payload
// on the socket, for the caller to read into its own memory; and that it
// refuses a frame over the caller's limit from the header alone.
TEST(FrameTest, HeaderOnlyReadLeavesThePayloadForTheCaller) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  ASSERT_OK(WriteFrame(pair.client, FrameType::kData, {AsBytes("PAY"), AsBytes("LOAD")}, In(absl::Seconds(5))));
  ASSERT_OK(WriteFrame(pair.client, FrameType::kData, {AsBytes("SENTINEL")}, In(absl::Seconds(5))));
  ASSERT_OK_AND_ASSIGN(FrameHeader header, ReadFrameHeader(pair.server, true, 64, In(absl::Seconds(5))));
  EXPECT_EQ(header, (FrameHeader{FrameType::kData, 7}));
  char payload[7];
  ASSERT_OK(pair.server.ReadExact(payload, sizeof(payload), In(absl::Seconds(5))));
  EXPECT_EQ(std::string(payload, sizeof(payload)), "PAYLOAD");
  EXPECT_ERROR(ReadFrameHeader(pair.server, true, 7, In(absl::Seconds(5))).status(),
               absl::StatusCode::kResourceExhausted,
               "a data frame of 8 bytes exceeds this receiver's limit of 7 bytes");
  ExpectNextBytes(pair.server, "SENTINEL");
}

// Tests that a 1 TiB control frame from a peer not yet authenticated is
// refused from its header alone: at once, not at the deadline, and with the
// bytes after the header still unread (so no payload was read, or allocated).
TEST(FrameTest, NonHandshakeFrameBeforeAuthIsRefusedFromTheHeader) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  const auto header = EncodeFrameHeader(FrameType::kControl, kTiB);
  ASSERT_OK(pair.client.WriteAll({header, AsBytes("SENTINEL")}, In(absl::Seconds(5))));
  const absl::Time start = absl::Now();
  // Waiting for the payload would end at the deadline with DeadlineExceeded;
  // the bound is only a second witness, far from that deadline.
  EXPECT_ERROR(ReadFrame(pair.server, false, kMaxDataPayload, start + absl::Seconds(60)).status(),
               absl::StatusCode::kPermissionDenied, "frame type 7 (control) before the handshake finished");
  EXPECT_LT(absl::Now() - start, causeway::testing::kSchedulingSlack);
  ExpectNextBytes(pair.server, "SENTINEL");
}

// The same after authentication, for a length over the type's bound.
TEST(FrameTest, OversizedFrameIsRefusedFromTheHeader) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  const auto header = EncodeFrameHeader(FrameType::kData, kTiB);
  ASSERT_OK(pair.client.WriteAll({header, AsBytes("SENTINEL")}, In(absl::Seconds(5))));
  EXPECT_ERROR(ReadFrame(pair.server, true, kMaxDataPayload, In(absl::Seconds(5))).status(),
               absl::StatusCode::kDataLoss,
               "length 1099511627776 exceeds the 268435456-byte bound of a data frame");
  ExpectNextBytes(pair.server, "SENTINEL");
}

// Tests the receiver's own limit, below the type's bound.
TEST(FrameTest, FrameOverTheReceiversLimitIsRefusedFromTheHeader) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  ASSERT_OK(WriteFrame(pair.client, FrameType::kData, {AsBytes("SENTINEL")}, In(absl::Seconds(5))));
  EXPECT_ERROR(ReadFrame(pair.server, true, 7, In(absl::Seconds(5))).status(),
               absl::StatusCode::kResourceExhausted,
               "a data frame of 8 bytes exceeds this receiver's limit of 7 bytes");
  ExpectNextBytes(pair.server, "SENTINEL");
}

// Tests a peer that sends noise: refused on the first 16 bytes.
TEST(FrameTest, RandomBytesFromAPeerAreRefused) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  std::mt19937 random(11);
  std::vector<uint8_t> noise(4096);
  for (uint8_t& byte : noise) byte = static_cast<uint8_t>(random());
  noise[0] = 'X';  // not the first byte of the magic, whatever the seed gives
  ASSERT_OK(pair.client.WriteAll({noise}, In(absl::Seconds(5))));
  EXPECT_ERROR(ReadFrame(pair.server, false, kMaxDataPayload, In(absl::Seconds(5))).status(),
               absl::StatusCode::kDataLoss, "bad magic 0x", "expected 0x4e445743");
}

// Tests a peer that closes in the middle of a payload.
TEST(FrameTest, TruncatedPayloadIsUnavailable) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  const std::vector<uint8_t> part(100, 1);
  ASSERT_OK(pair.client.WriteAll({EncodeFrameHeader(FrameType::kData, 1000), part}, In(absl::Seconds(5))));
  pair.client.Close();
  EXPECT_ERROR(ReadFrame(pair.server, true, kMaxDataPayload, In(absl::Seconds(5))).status(),
               absl::StatusCode::kUnavailable, "reading the payload of a data frame",
               "peer closed the connection after 100 of 1000 bytes");
}

// Tests a peer that closes in the middle of a header, and one that closes
// between frames.
TEST(FrameTest, TruncatedHeaderAndCloseBetweenFramesAreUnavailable) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  ASSERT_OK(WriteFrame(pair.client, FrameType::kHeartbeat, {}, In(absl::Seconds(5))));
  ASSERT_OK(pair.client.WriteAll({absl::MakeConstSpan(EncodeFrameHeader(FrameType::kData, 1)).first(5)},
                                 In(absl::Seconds(5))));
  pair.client.Close();
  ASSERT_OK(ReadFrame(pair.server, true, 0, In(absl::Seconds(5))).status());
  EXPECT_ERROR(ReadFrame(pair.server, true, kMaxDataPayload, In(absl::Seconds(5))).status(),
               absl::StatusCode::kUnavailable, "reading a frame header",
               "peer closed the connection after 5 of 16 bytes");

  ASSERT_OK_AND_ASSIGN(testing::SocketPair quiet, ConnectedPair());
  quiet.client.Close();
  EXPECT_ERROR(ReadFrame(quiet.server, true, kMaxDataPayload, In(absl::Seconds(5))).status(),
               absl::StatusCode::kUnavailable, "peer closed the connection after 0 of 16 bytes");
}

// Tests that ReadFrame waits no longer than its deadline.
TEST(FrameTest, ReadFrameFromSilentPeerFailsAtItsDeadline) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  const absl::Time start = absl::Now();
  EXPECT_ERROR(ReadFrame(pair.server, false, kMaxDataPayload, start + absl::Milliseconds(200)).status(),
               absl::StatusCode::kDeadlineExceeded, "reading a frame header", "0 of 16 bytes");
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Milliseconds(200) + causeway::testing::kSchedulingSlack);
}

// Tests that a payload over the type's bound is refused before anything is
// sent.
TEST(FrameTest, WriteFrameOverTheBoundSendsNothing) {
  ASSERT_OK_AND_ASSIGN(testing::SocketPair pair, ConnectedPair());
  const std::vector<uint8_t> payload(kMaxHeartbeatPayload + 1);
  EXPECT_ERROR(WriteFrame(pair.client, FrameType::kHeartbeat, {payload}, In(absl::Seconds(5))),
               absl::StatusCode::kInvalidArgument, "a heartbeat frame carries at most 64 bytes, got 65");
  uint8_t byte;
  EXPECT_EQ(pair.server.ReadExact(&byte, 1, In(absl::Milliseconds(100))).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace causeway::transport
