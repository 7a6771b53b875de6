// The byte ranges of a value taken so far, for a receiver that takes a value
// in pieces (a channel's inbox, an island's upload). A piece that overlaps
// one taken before is refused: counted again, its bytes would complete the
// value with bytes that were never sent.
//
// Not thread-safe: the receiver's lock guards it.
//
// Example:
//   CAUSEWAY_RETURN_IF_ERROR(CheckRange(offset, length, total, "upload"));
//   CAUSEWAY_RETURN_IF_ERROR(ranges.Add(offset, length, "upload to array 3"));
//   if (ranges.bytes() == total) ...  // every byte has come, once
#ifndef CAUSEWAY_BASE_BYTE_RANGES_H_
#define CAUSEWAY_BASE_BYTE_RANGES_H_

#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace causeway {

class ByteRanges {
 public:
  // The most separate pieces kept at once (adjacent pieces join): a sender
  // sends in order, so a few; more is a peer making the receiver keep a
  // table.
  static constexpr size_t kMaxPieces = 4096;

  // Takes [offset, offset + length), which the caller has checked lies
  // within the value (CheckRange). DataLoss naming `what` and both ranges
  // when it overlaps bytes taken before; ResourceExhausted when it would be
  // separate piece kMaxPieces + 1. Nothing is taken on error.
  absl::Status Add(uint64_t offset, uint64_t length, absl::string_view what);

  // Bytes taken, each counted once.
  uint64_t bytes() const { return bytes_; }
  // Separate pieces kept.
  size_t pieces() const { return pieces_.size(); }

 private:
  std::map<uint64_t, uint64_t> pieces_;  // [begin, end) by begin: disjoint, none adjacent
  uint64_t bytes_ = 0;
};

}  // namespace causeway

#endif  // CAUSEWAY_BASE_BYTE_RANGES_H_
