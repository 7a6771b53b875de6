// Overflow-safe arithmetic for sizes that come from outside the process:
// shapes, element counts, byte sizes, offsets and totals from program defs,
// program files, island requests and data headers. Each helper returns the
// value, or InvalidArgument saying what was expected and what came, instead
// of a product or sum that wrapped around 2^64 (a wrapped size makes a small
// buffer that a later copy runs past).
//
// No Vulkan, no state: thread-safe.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(uint64_t bytes, CheckedByteSize(shape, DTypeSize(dtype)));
//   CAUSEWAY_RETURN_IF_ERROR(CheckRange(header.offset(), header.length(), header.total(), "data frame"));
#ifndef CAUSEWAY_BASE_CHECKED_SIZE_H_
#define CAUSEWAY_BASE_CHECKED_SIZE_H_

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway {

// The most elements any shape may have: what an int64_t element count (and
// so NumElements) can hold.
inline constexpr uint64_t kMaxShapeElements = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// a * b and a + b, or InvalidArgument naming `what` when the result does not
// fit in 64 bits.
absl::StatusOr<uint64_t> CheckedMul(uint64_t a, uint64_t b, absl::string_view what);
absl::StatusOr<uint64_t> CheckedAdd(uint64_t a, uint64_t b, absl::string_view what);

// The element count of `shape`: every dimension must be >= 1 and the product
// at most `max_elements` (itself at most kMaxShapeElements). The message
// shows the shape: "shape [4294967296, 4294967296] has more than
// 9223372036854775807 elements".
absl::StatusOr<uint64_t> CheckedElementCount(absl::Span<const int64_t> shape,
                                             uint64_t max_elements = kMaxShapeElements);

// Bytes of `shape` with `element_bytes`-byte elements, at most `max_bytes`;
// the element count as CheckedElementCount.
absl::StatusOr<uint64_t> CheckedByteSize(absl::Span<const int64_t> shape, uint64_t element_bytes,
                                         uint64_t max_bytes = std::numeric_limits<uint64_t>::max());

// OK when [offset, offset + length) lies within a `size`-byte object, without
// computing a sum that could wrap; otherwise InvalidArgument naming `what`:
// "data frame: 16 bytes at offset 18446744073709551615 run past the end of a
// 32-byte object".
absl::Status CheckRange(uint64_t offset, uint64_t length, uint64_t size, absl::string_view what);

}  // namespace causeway

#endif  // CAUSEWAY_BASE_CHECKED_SIZE_H_
