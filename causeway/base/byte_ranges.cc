#include "causeway/base/byte_ranges.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace causeway {

absl::Status ByteRanges::Add(uint64_t offset, uint64_t length, absl::string_view what) {
  const uint64_t end = offset + length;
  auto after = pieces_.upper_bound(offset);  // the first piece that begins past offset
  auto before = after == pieces_.begin() ? pieces_.end() : std::prev(after);
  const bool overlaps_after = after != pieces_.end() && after->first < end;
  if (overlaps_after || (before != pieces_.end() && before->second > offset)) {
    const auto& [first, last] = overlaps_after ? *after : *before;
    return absl::DataLossError(absl::StrCat(what, " sent bytes [", offset, ", ", end,
                                            ") of its value, overlapping bytes [", first, ", ", last,
                                            ") it had sent already"));
  }
  const bool joins_before = before != pieces_.end() && before->second == offset;
  const bool joins_after = after != pieces_.end() && after->first == end;
  if (!joins_before && !joins_after && pieces_.size() >= kMaxPieces) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " sent its value in more than ", kMaxPieces, " separate pieces"));
  }
  if (joins_before && joins_after) {
    before->second = after->second;
    pieces_.erase(after);
  } else if (joins_before) {
    before->second = end;
  } else if (joins_after) {
    const uint64_t last = after->second;
    pieces_.erase(after);
    pieces_.emplace(offset, last);
  } else {
    pieces_.emplace(offset, end);
  }
  bytes_ += length;
  return absl::OkStatus();
}

}  // namespace causeway
