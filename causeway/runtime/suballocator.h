// SubAllocator: hands out aligned offset ranges inside one memory block of
// fixed capacity. It knows nothing about Vulkan; the runtime keeps one per
// VkDeviceMemory block and binds buffers at the offsets it returns.
#ifndef CAUSEWAY_RUNTIME_SUBALLOCATOR_H_
#define CAUSEWAY_RUNTIME_SUBALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace causeway {

// Best-fit allocator of byte ranges in [0, capacity).
//
// Free ranges are kept twice: ordered by (size, offset) to find the smallest
// range that fits, and by offset to merge a freed range with its free
// neighbours. Free ranges are always maximal: no two of them touch. Live
// allocations are kept in a hash map keyed by offset, so Free() needs only the
// offset.
//
// Sizes are not rounded up to any granularity: the bytes an alignment skips at
// the front of a free range are split off as a free range of their own, so
// nothing is lost to rounding and `bytes_allocated() + bytes_free() ==
// capacity()` always holds exactly. Callers that need a coarser granularity
// (e.g. nonCoherentAtomSize for host-visible memory) round the size and
// alignment before calling.
//
// Cost: Allocate and Free take O(log n) in the number of free ranges, with one
// exception, see Allocate().
//
// Thread-safety: NOT thread-safe. The owner (the memory block that holds this
// allocator) serializes every call, const ones included, under its own lock.
//
// Example:
//   SubAllocator block(64 << 20);
//   CAUSEWAY_ASSIGN_OR_RETURN(SubAllocator::Range range, block.Allocate(4096, 256));
//   // ... vkBindBufferMemory(device, buffer, memory, range.offset) ...
//   CAUSEWAY_RETURN_IF_ERROR(block.Free(range.offset));
class SubAllocator {
 public:
  // A reserved range: bytes [offset, offset + size) of the block.
  struct Range {
    uint64_t offset;
    // The number of bytes reserved. Since sizes are not rounded up, this is
    // the size that was asked for.
    uint64_t size;

    friend bool operator==(const Range&, const Range&) = default;
  };

  // An allocator with all of [0, capacity) free. A capacity of 0 is allowed;
  // every Allocate on it fails with ResourceExhausted.
  explicit SubAllocator(uint64_t capacity);

  // Not copyable: two copies would hand out the same bytes of one block.
  // Movable; a moved-from allocator has capacity 0 and no allocations.
  SubAllocator(const SubAllocator&) = delete;
  SubAllocator& operator=(const SubAllocator&) = delete;
  SubAllocator(SubAllocator&& other) noexcept;
  SubAllocator& operator=(SubAllocator&& other) noexcept;
  ~SubAllocator() = default;

  // Reserves `size` bytes at an offset that is a multiple of `alignment`.
  //
  // Picks the smallest free range that can hold the request once its start is
  // aligned up (best fit); ties go to the lowest offset. Alignment padding at
  // the front of that range, and whatever is left behind the allocation, stay
  // free.
  //
  // Cost: O(log n). When `alignment` > 1 a free range only a little larger than
  // `size` may not fit once aligned; a few such near-misses are tried before
  // falling back to the smallest range of at least size + alignment - 1 bytes,
  // which always fits. Only when no range that large exists is every range of
  // size in [size, size + alignment - 1) tried, so that Allocate fails only if
  // truly nothing fits.
  //
  // Errors:
  //   InvalidArgument   `size` is 0, or `alignment` is not a power of two.
  //   ResourceExhausted no free range can hold the request; the message gives
  //                     the requested size and alignment, the free bytes and
  //                     the largest free range.
  absl::StatusOr<Range> Allocate(uint64_t size, uint64_t alignment);

  // Returns the range that starts at `offset`, which an earlier Allocate
  // returned and no Free has returned since; it is merged with any free
  // neighbours. An `offset` that is not the start of a live allocation
  // (already freed, never allocated, or inside an allocation) is
  // InvalidArgument and changes nothing.
  absl::Status Free(uint64_t offset);

  // Size of the block in bytes.
  uint64_t capacity() const { return capacity_; }
  // Bytes in live allocations; alignment padding is not counted (it is free).
  uint64_t bytes_allocated() const { return capacity_ - bytes_free_; }
  // Bytes in free ranges, including alignment padding.
  uint64_t bytes_free() const { return bytes_free_; }
  // Size of the largest free range; 0 when nothing is free. An allocation of
  // this size with alignment 1 succeeds; with a larger alignment it may not.
  uint64_t largest_free_range() const;
  // Number of live allocations.
  size_t allocation_count() const { return allocations_.size(); }
  // Number of free ranges; a measure of fragmentation (1 when nothing is
  // allocated and the capacity is not 0).
  size_t free_range_count() const { return free_by_offset_.size(); }
  // True when there are no live allocations.
  bool empty() const { return allocations_.empty(); }

  // Checks the internal invariants in O(n): free and allocated ranges tile
  // [0, capacity) without overlap, no two free ranges touch, both free-range
  // indexes agree, and the byte counts match. OK when they hold, Internal
  // naming the first broken one otherwise. For tests and debugging.
  absl::Status CheckInvariants() const;

 private:
  // Free ranges as (size, offset), so begin() is the smallest one.
  using SizeIndex = absl::btree_set<std::pair<uint64_t, uint64_t>>;

  // Returns the free range Allocate should carve `size` bytes aligned to
  // `alignment` from, or free_by_size_.end() if none can hold them.
  SizeIndex::const_iterator FindFit(uint64_t size, uint64_t alignment) const;
  void InsertFree(uint64_t offset, uint64_t size);
  void EraseFree(uint64_t offset, uint64_t size);

  uint64_t capacity_;
  uint64_t bytes_free_;
  // Free ranges: offset -> size.
  absl::btree_map<uint64_t, uint64_t> free_by_offset_;
  SizeIndex free_by_size_;
  // Live allocations: offset -> size.
  absl::flat_hash_map<uint64_t, uint64_t> allocations_;
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_SUBALLOCATOR_H_
