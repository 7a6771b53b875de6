#include "causeway/transport/frame.h"

#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "causeway/base/status.h"
#include "causeway/transport/bytes.h"

namespace causeway::transport {
namespace {

// What each type is called and how long it may be, indexed by type - 1.
struct FrameTypeInfo {
  absl::string_view name;
  uint64_t max_length;
};
constexpr FrameTypeInfo kFrameTypes[] = {
    {"hello", kMaxHelloPayload},     {"challenge", kMaxChallengePayload}, {"proof", kMaxProofPayload},
    {"welcome", kMaxWelcomePayload}, {"refused", kMaxRefusedPayload},     {"heartbeat", kMaxHeartbeatPayload},
    {"control", kMaxControlPayload}, {"data", kMaxDataPayload},           {"goodbye", kMaxGoodbyePayload},
};
static_assert(std::size(kFrameTypes) == kMaxFrameType);

bool IsKnownType(uint16_t type) { return type >= 1 && type <= kMaxFrameType; }

// The entry of `type`, or null for a value that is not a FrameType.
const FrameTypeInfo* InfoOf(FrameType type) {
  const auto value = static_cast<uint16_t>(type);
  return IsKnownType(value) ? &kFrameTypes[value - 1] : nullptr;
}

// "7 (control)", for messages.
std::string Describe(FrameType type) {
  return absl::StrCat(static_cast<uint16_t>(type), " (", FrameTypeName(type), ")");
}

// The same status with `context` before its message.
absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace

absl::string_view FrameTypeName(FrameType type) {
  const FrameTypeInfo* info = InfoOf(type);
  return info != nullptr ? info->name : "unknown";
}

uint64_t MaxFrameLength(FrameType type) {
  const FrameTypeInfo* info = InfoOf(type);
  return info != nullptr ? info->max_length : 0;
}

bool IsHandshakeFrame(FrameType type) {
  const auto value = static_cast<uint16_t>(type);
  return value >= static_cast<uint16_t>(FrameType::kHello) &&
         value <= static_cast<uint16_t>(FrameType::kRefused);
}

std::array<uint8_t, kFrameHeaderSize> EncodeFrameHeader(FrameType type, uint64_t length) {
  std::array<uint8_t, kFrameHeaderSize> header;
  StoreLittleEndian(kFrameMagic, &header[0]);
  StoreLittleEndian(kWireVersion, &header[4]);
  StoreLittleEndian(static_cast<uint16_t>(type), &header[6]);
  StoreLittleEndian(length, &header[8]);
  return header;
}

absl::StatusOr<FrameHeader> ParseFrameHeader(absl::Span<const uint8_t> bytes, bool authenticated) {
  if (bytes.size() != kFrameHeaderSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame header is ", kFrameHeaderSize, " bytes, got ", bytes.size()));
  }
  const auto magic = LoadLittleEndian<uint32_t>(&bytes[0]);
  const auto version = LoadLittleEndian<uint16_t>(&bytes[4]);
  const auto type = LoadLittleEndian<uint16_t>(&bytes[6]);
  const auto length = LoadLittleEndian<uint64_t>(&bytes[8]);
  if (magic != kFrameMagic) {
    return absl::DataLossError(absl::StrFormat(
        "bad magic 0x%08x, expected 0x%08x (\"CWDN\"): not a Causeway peer", magic, kFrameMagic));
  }
  if (version != kWireVersion) {
    return absl::UnimplementedError(absl::StrCat(
        "frame version ", version, " is not supported; this build speaks version ", kWireVersion));
  }
  if (!IsKnownType(type)) {
    return absl::DataLossError(
        absl::StrCat("unknown frame type ", type, "; known types are 1 to ", kMaxFrameType));
  }
  const auto frame_type = static_cast<FrameType>(type);
  if (IsHandshakeFrame(frame_type) == authenticated) {
    return absl::PermissionDeniedError(absl::StrCat("frame type ", Describe(frame_type),
                                                    authenticated ? " after" : " before",
                                                    " the handshake finished"));
  }
  if (length > MaxFrameLength(frame_type)) {
    return absl::DataLossError(absl::StrCat("length ", length, " exceeds the ", MaxFrameLength(frame_type),
                                            "-byte bound of a ", FrameTypeName(frame_type), " frame"));
  }
  return FrameHeader{frame_type, length};
}

absl::StatusOr<FrameHeader> ReadFrameHeader(Socket& socket, bool authenticated, uint64_t max_payload,
                                            absl::Time deadline) {
  std::array<uint8_t, kFrameHeaderSize> header_bytes;
  if (absl::Status s = socket.ReadExact(header_bytes.data(), header_bytes.size(), deadline); !s.ok()) {
    return WithContext(s, "reading a frame header");
  }
  CAUSEWAY_ASSIGN_OR_RETURN(FrameHeader header, ParseFrameHeader(header_bytes, authenticated));
  if (header.length > max_payload) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a ", FrameTypeName(header.type), " frame of ", header.length,
                     " bytes exceeds this receiver's limit of ", max_payload, " bytes"));
  }
  return header;
}

absl::StatusOr<Frame> ReadFrame(Socket& socket, bool authenticated, uint64_t max_payload,
                                absl::Time deadline) {
  CAUSEWAY_ASSIGN_OR_RETURN(FrameHeader header,
                            ReadFrameHeader(socket, authenticated, max_payload, deadline));
  Frame frame{header.type, std::vector<uint8_t>(header.length)};
  if (absl::Status s = socket.ReadExact(frame.payload.data(), frame.payload.size(), deadline); !s.ok()) {
    return WithContext(s, absl::StrCat("reading the payload of a ", FrameTypeName(header.type), " frame"));
  }
  return frame;
}

absl::Status WriteFrame(Socket& socket, FrameType type, absl::Span<const absl::Span<const uint8_t>> payload,
                        absl::Time deadline) {
  uint64_t length = 0;
  for (absl::Span<const uint8_t> piece : payload) length += piece.size();
  if (length > MaxFrameLength(type)) {
    return absl::InvalidArgumentError(absl::StrCat("a ", FrameTypeName(type), " frame carries at most ",
                                                   MaxFrameLength(type), " bytes, got ", length));
  }
  const std::array<uint8_t, kFrameHeaderSize> header = EncodeFrameHeader(type, length);
  absl::InlinedVector<absl::Span<const uint8_t>, 8> pieces;
  pieces.reserve(payload.size() + 1);
  pieces.push_back(header);
  pieces.insert(pieces.end(), payload.begin(), payload.end());
  if (absl::Status s = socket.WriteAll(pieces, deadline); !s.ok()) {
    return WithContext(s, absl::StrCat("writing a ", FrameTypeName(type), " frame of ", length, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace causeway::transport
