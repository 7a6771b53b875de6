#include "causeway/runtime/suballocator.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace causeway {
namespace {

// How many free ranges smaller than size + alignment - 1 bytes (which may or
// may not fit once aligned) Allocate tries before taking the smallest range
// that is sure to fit. Bounds the common-case cost; see Allocate().
constexpr int kMaxNearMissProbes = 8;

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Bytes to skip from `offset` to the next multiple of `alignment` (a power of
// two). Cannot overflow, unlike aligning `offset` up.
uint64_t AlignmentPadding(uint64_t offset, uint64_t alignment) {
  return (alignment - (offset & (alignment - 1))) & (alignment - 1);
}

// Whether `size` bytes aligned to `alignment` fit in the free range
// [offset, offset + range_size).
bool Fits(uint64_t offset, uint64_t range_size, uint64_t size,
          uint64_t alignment) {
  const uint64_t padding = AlignmentPadding(offset, alignment);
  return padding <= range_size && size <= range_size - padding;
}

}  // namespace

SubAllocator::SubAllocator(uint64_t capacity)
    : capacity_(capacity), bytes_free_(0) {
  if (capacity > 0) InsertFree(0, capacity);
}

SubAllocator::SubAllocator(SubAllocator&& other) noexcept
    : capacity_(std::exchange(other.capacity_, 0)),
      bytes_free_(std::exchange(other.bytes_free_, 0)),
      free_by_offset_(std::exchange(other.free_by_offset_, {})),
      free_by_size_(std::exchange(other.free_by_size_, {})),
      allocations_(std::exchange(other.allocations_, {})) {}

SubAllocator& SubAllocator::operator=(SubAllocator&& other) noexcept {
  if (this != &other) {
    capacity_ = std::exchange(other.capacity_, 0);
    bytes_free_ = std::exchange(other.bytes_free_, 0);
    free_by_offset_ = std::exchange(other.free_by_offset_, {});
    free_by_size_ = std::exchange(other.free_by_size_, {});
    allocations_ = std::exchange(other.allocations_, {});
  }
  return *this;
}

uint64_t SubAllocator::largest_free_range() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void SubAllocator::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
  bytes_free_ += size;
}

void SubAllocator::EraseFree(uint64_t offset, uint64_t size) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({size, offset});
  bytes_free_ -= size;
}

SubAllocator::SizeIndex::const_iterator SubAllocator::FindFit(
    uint64_t size, uint64_t alignment) const {
  auto it = free_by_size_.lower_bound({size, 0});
  if (alignment == 1) return it;
  // A range of at least `sure_fit` bytes holds the request wherever it starts.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const uint64_t sure_fit =
      size > max - (alignment - 1) ? max : size + (alignment - 1);
  // Best fit among the smallest candidates, which may fail to fit once
  // aligned.
  for (int probes = 0; it != free_by_size_.end() && it->first < sure_fit &&
                       probes < kMaxNearMissProbes;
       ++it, ++probes) {
    if (Fits(it->second, it->first, size, alignment)) return it;
  }
  if (it == free_by_size_.end() || it->first >= sure_fit) return it;
  // More near misses remain. Skip them if a sure fit exists ...
  auto sure = free_by_size_.lower_bound({sure_fit, 0});
  if (sure != free_by_size_.end()) return sure;
  // ... else every remaining range is a near miss; try them all rather than
  // fail a request that some range could hold.
  for (; it != free_by_size_.end(); ++it) {
    if (Fits(it->second, it->first, size, alignment)) return it;
  }
  return it;
}

absl::StatusOr<SubAllocator::Range> SubAllocator::Allocate(uint64_t size,
                                                           uint64_t alignment) {
  if (size == 0) {
    return absl::InvalidArgumentError(
        "SubAllocator::Allocate expects a size > 0, got 0");
  }
  if (!IsPowerOfTwo(alignment)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SubAllocator::Allocate expects a power-of-two "
                     "alignment, got ",
                     alignment));
  }
  auto fit = FindFit(size, alignment);
  if (fit == free_by_size_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SubAllocator cannot allocate ", size, " bytes aligned to ", alignment,
        ": ", bytes_free_, " of ", capacity_,
        " bytes free, largest free range ", largest_free_range(), " bytes"));
  }
  const uint64_t range_size = fit->first;
  const uint64_t range_offset = fit->second;
  const uint64_t padding = AlignmentPadding(range_offset, alignment);
  const uint64_t offset = range_offset + padding;
  const uint64_t tail = range_size - padding - size;

  // The range was maximal, so neither the padding nor the tail touches another
  // free range: no merging needed.
  EraseFree(range_offset, range_size);
  if (padding > 0) InsertFree(range_offset, padding);
  if (tail > 0) InsertFree(offset + size, tail);
  allocations_.emplace(offset, size);
  return Range{offset, size};
}

absl::Status SubAllocator::Free(uint64_t offset) {
  auto allocation = allocations_.find(offset);
  if (allocation == allocations_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SubAllocator::Free expects the offset of a live "
                     "allocation, got ",
                     offset, " (", allocations_.size(),
                     " live allocations, capacity ", capacity_, ")"));
  }
  uint64_t start = offset;
  uint64_t size = allocation->second;
  allocations_.erase(allocation);

  // Merge with the free ranges that touch it on either side, if any.
  if (auto next = free_by_offset_.find(offset + size);
      next != free_by_offset_.end()) {
    size += next->second;
    EraseFree(next->first, next->second);
  }
  if (auto after = free_by_offset_.lower_bound(offset);
      after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      size += prev->second;
      EraseFree(prev->first, prev->second);
    }
  }
  InsertFree(start, size);
  return absl::OkStatus();
}

absl::Status SubAllocator::CheckInvariants() const {
  if (free_by_offset_.size() != free_by_size_.size()) {
    return absl::InternalError(absl::StrCat(
        "SubAllocator free-range indexes disagree: ", free_by_offset_.size(),
        " by offset, ", free_by_size_.size(), " by size"));
  }
  struct Piece {
    uint64_t offset;
    uint64_t size;
    bool free;
  };
  std::vector<Piece> pieces;
  pieces.reserve(free_by_offset_.size() + allocations_.size());
  uint64_t free_sum = 0;
  for (const auto& [offset, size] : free_by_offset_) {
    if (!free_by_size_.contains({size, offset})) {
      return absl::InternalError(absl::StrCat("SubAllocator free range at ",
                                              offset, " of ", size,
                                              " bytes is missing by size"));
    }
    pieces.push_back({offset, size, true});
    free_sum += size;
  }
  for (const auto& [offset, size] : allocations_) {
    pieces.push_back({offset, size, false});
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  uint64_t cursor = 0;
  bool previous_free = false;
  for (const Piece& piece : pieces) {
    const char* kind = piece.free ? "free range" : "allocation";
    if (piece.size == 0) {
      return absl::InternalError(absl::StrCat("SubAllocator ", kind, " at ",
                                              piece.offset, " is empty"));
    }
    if (piece.offset != cursor) {
      return absl::InternalError(
          absl::StrCat("SubAllocator expects the range after byte ", cursor,
                       " to start there, got a ", kind, " at ", piece.offset));
    }
    if (piece.size > capacity_ - piece.offset) {
      return absl::InternalError(
          absl::StrCat("SubAllocator ", kind, " at ", piece.offset, " of ",
                       piece.size, " bytes overruns the capacity ", capacity_));
    }
    if (piece.free && previous_free) {
      return absl::InternalError(absl::StrCat(
          "SubAllocator free range at ", piece.offset,
          " touches the free range before it; they should be one"));
    }
    cursor = piece.offset + piece.size;
    previous_free = piece.free;
  }
  if (cursor != capacity_) {
    return absl::InternalError(absl::StrCat(
        "SubAllocator ranges cover ", cursor, " bytes, expected ", capacity_));
  }
  if (free_sum != bytes_free_) {
    return absl::InternalError(
        absl::StrCat("SubAllocator counts ", bytes_free_,
                     " free bytes, its free ranges hold ", free_sum));
  }
  return absl::OkStatus();
}

}  // namespace causeway
