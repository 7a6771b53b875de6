// Frames: the unit of everything sent between islands.
//
// A frame is a fixed 16-byte header followed by `length` payload bytes:
//
//   offset  size  field
//        0     4  magic    the bytes "CWDN" (0x4e445743 little-endian)
//        4     2  version  kWireVersion
//        6     2  type     FrameType
//        8     8  length   payload bytes that follow
//
// Integers are little-endian. Each type has a bound on its length, and
// before the handshake has authenticated the peer only the handshake types
// are accepted. Both are checked on the header alone, so a receiver never
// allocates or reads more than a handshake message for a peer it has not
// authenticated, nor more than the type's bound for one it has.
#ifndef CAUSEWAY_TRANSPORT_FRAME_H_
#define CAUSEWAY_TRANSPORT_FRAME_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/transport/socket.h"

namespace causeway::transport {

// "CWDN" read as a little-endian u32.
inline constexpr uint32_t kFrameMagic = 0x4e445743;
// The version of the frame format (this header). The handshake agrees on the
// protocol version of what the frames carry (see handshake.h).
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kFrameHeaderSize = 16;

enum class FrameType : uint16_t {
  // The handshake (see handshake.h): the only types before authentication.
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kWelcome = 4,
  kRefused = 5,
  // After the handshake.
  kHeartbeat = 6,
  kControl = 7,  // a control message (its encoding belongs to the layer above)
  kData = 8,     // bulk bytes, e.g. a buffer's contents
  kGoodbye = 9,  // the sender closes the connection; the payload may say why
};

// The largest valid type value; types run from 1 to this.
inline constexpr uint16_t kMaxFrameType = 9;

// Payload bounds, per type. The handshake messages (laid out in
// handshake.h, which checks these sizes against its layouts) have fixed
// sizes or a name or reason of bounded length.
inline constexpr uint64_t kMaxHelloPayload = 105;     // 41 bytes and a name of up to 64
inline constexpr uint64_t kMaxChallengePayload = 70;  // exactly
inline constexpr uint64_t kMaxProofPayload = 32;      // exactly
inline constexpr uint64_t kMaxWelcomePayload = 65;    // 1 byte and a name of up to 64
inline constexpr uint64_t kMaxRefusedPayload = 256;   // a reason of up to 256
inline constexpr uint64_t kMaxHeartbeatPayload = 64;
inline constexpr uint64_t kMaxGoodbyePayload = 1024;
inline constexpr uint64_t kMaxControlPayload = uint64_t{16} << 20;
inline constexpr uint64_t kMaxDataPayload = uint64_t{256} << 20;

// "hello", "control", ...; "unknown" for a value that is not a FrameType.
absl::string_view FrameTypeName(FrameType type);

// The most payload bytes a frame of `type` may carry: the size of its
// message for the handshake types, the bounds above for the others; 0 for a
// value that is not a FrameType.
uint64_t MaxFrameLength(FrameType type);

// Hello to Refused: the types allowed before authentication, and only then.
bool IsHandshakeFrame(FrameType type);

// A checked header: `type` is a known type and `length` within its bound.
struct FrameHeader {
  FrameType type;
  uint64_t length;

  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

// The 16 header bytes of a frame of `type` with `length` payload bytes. Does
// not check the bound (so that tests can build invalid frames).
std::array<uint8_t, kFrameHeaderSize> EncodeFrameHeader(FrameType type, uint64_t length);

// Checks the 16 bytes of a header. `authenticated` says whether the
// handshake has finished: before it only handshake types are accepted,
// after it only the others.
//
// Errors (the message carries the values that were wrong):
//   InvalidArgument   `bytes` is not 16 bytes long.
//   DataLoss          bad magic, unknown type, or a length over the type's
//                     bound: "length 1099511627776 exceeds the
//                     16777216-byte bound of a control frame".
//   Unimplemented     a version other than kWireVersion.
//   PermissionDenied  a type not allowed in this state: "frame type 7
//                     (control) before the handshake finished".
absl::StatusOr<FrameHeader> ParseFrameHeader(absl::Span<const uint8_t> bytes, bool authenticated);

// A received frame.
struct Frame {
  FrameType type;
  std::vector<uint8_t> payload;
};

// Reads one frame: its header, which is checked (ParseFrameHeader) and held
// to `max_payload` as well, and only then its payload. A refused header is
// reported after reading exactly its 16 bytes, none of the payload. The
// whole frame must arrive before `deadline`.
//
// Errors: those of ParseFrameHeader; ResourceExhausted for a length over
// `max_payload`; those of Socket::ReadExact (DeadlineExceeded, Unavailable
// when the peer closes, "after 0 of 16 bytes" between frames or later in a
// truncated one), prefixed with the part of the frame being read.
absl::StatusOr<Frame> ReadFrame(Socket& socket, bool authenticated, uint64_t max_payload,
                                absl::Time deadline);

// Reads and checks one frame header as ReadFrame does, and leaves its
// payload on the socket for the caller to read (Socket::ReadExact) straight
// into its own memory, e.g. a staging buffer: bulk data is never copied
// through a frame's vector. Errors: those of ReadFrame's header.
absl::StatusOr<FrameHeader> ReadFrameHeader(Socket& socket, bool authenticated, uint64_t max_payload,
                                            absl::Time deadline);

// Sends a frame of `type` whose payload is the concatenation of `payload`:
// the header and every piece go to the socket in one gather write, with no
// copy of the payload. Errors: InvalidArgument for a payload over the type's
// bound (nothing is sent); those of Socket::WriteAll.
absl::Status WriteFrame(Socket& socket, FrameType type, absl::Span<const absl::Span<const uint8_t>> payload,
                        absl::Time deadline);

}  // namespace causeway::transport

#endif  // CAUSEWAY_TRANSPORT_FRAME_H_
