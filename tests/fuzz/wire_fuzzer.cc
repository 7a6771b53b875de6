// Fuzz target over the parsers that see a peer's bytes before it is
// authenticated: the frame header and every handshake message.
//
// Each input is tried as a header on its own (whatever its size), as a frame
// (16 header bytes, then the payload handed to the parser of the header's
// type), and as the payload of each handshake message. Beyond not crashing,
// whatever a parser accepts must satisfy its contract: a header within its
// type's bound and allowed in its state, and a message that encodes back to
// exactly the bytes it came from. A violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "causeway/transport/frame.h"
#include "causeway/transport/handshake.h"
#include "tests/fuzz/fuzz_require.h"

namespace causeway::transport {
namespace {

void Require(bool condition, const char* what) { fuzz::Require(condition, "wire_fuzzer", what); }

std::vector<uint8_t> Bytes(std::vector<uint8_t> bytes) { return bytes; }
std::vector<uint8_t> Bytes(absl::StatusOr<std::vector<uint8_t>> bytes) {
  Require(bytes.ok(), "an encoder refused a message its parser accepted");
  return *std::move(bytes);
}

// Parses `bytes` with `parse`; if that succeeds, the message must encode back
// to `bytes`.
template <typename Parse, typename Encode>
void CheckRoundTrip(absl::Span<const uint8_t> bytes, Parse parse, Encode encode) {
  auto message = parse(bytes);
  if (!message.ok()) return;
  const std::vector<uint8_t> again = Bytes(encode(*message));
  Require(absl::MakeConstSpan(again) == bytes, "a handshake message does not encode back to its bytes");
}

// The parser of a handshake frame's payload, by the frame's type.
void ParsePayload(FrameType type, absl::Span<const uint8_t> payload) {
  // clang-format off
  switch (type) {
    case FrameType::kHello: return CheckRoundTrip(payload, ParseHello, EncodeHello);
    case FrameType::kChallenge: return CheckRoundTrip(payload, ParseChallenge, EncodeChallenge);
    case FrameType::kProof: return CheckRoundTrip(payload, ParseProof, EncodeProof);
    case FrameType::kWelcome: return CheckRoundTrip(payload, ParseWelcome, EncodeWelcome);
    case FrameType::kRefused: return CheckRoundTrip(payload, ParseRefused, EncodeRefused);
    default: return;
  }
  // clang-format on
}

void FuzzOne(absl::Span<const uint8_t> bytes) {
  Require(bytes.size() == kFrameHeaderSize || !ParseFrameHeader(bytes, false).ok(),
          "a header of the wrong size was accepted");
  if (bytes.size() >= kFrameHeaderSize) {
    const absl::Span<const uint8_t> head = bytes.first(kFrameHeaderSize);
    const absl::Span<const uint8_t> payload = bytes.subspan(kFrameHeaderSize);
    for (bool authenticated : {false, true}) {
      absl::StatusOr<FrameHeader> header = ParseFrameHeader(head, authenticated);
      if (!header.ok()) continue;
      Require(header->length <= MaxFrameLength(header->type), "a header over its type's bound was accepted");
      Require(IsHandshakeFrame(header->type) != authenticated,
              "a header not allowed in its state was accepted");
      Require(absl::MakeConstSpan(EncodeFrameHeader(header->type, header->length)) == head,
              "a header does not encode back to its bytes");
      if (payload.size() == header->length) ParsePayload(header->type, payload);
    }
  }
  for (FrameType type : {FrameType::kHello, FrameType::kChallenge, FrameType::kProof, FrameType::kWelcome,
                         FrameType::kRefused}) {
    ParsePayload(type, bytes);
  }
}

}  // namespace
}  // namespace causeway::transport

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  causeway::transport::FuzzOne(absl::Span<const uint8_t>(data, size));
  return 0;
}
