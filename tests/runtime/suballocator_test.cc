#include "causeway/runtime/suballocator.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace causeway {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Range = SubAllocator::Range;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// Everything observable about an allocator, to check that a failed call
// changed nothing.
struct Snapshot {
  uint64_t bytes_allocated;
  uint64_t bytes_free;
  uint64_t largest_free_range;
  size_t allocation_count;
  size_t free_range_count;

  friend bool operator==(const Snapshot&, const Snapshot&) = default;
};

Snapshot Snap(const SubAllocator& allocator) {
  return {allocator.bytes_allocated(), allocator.bytes_free(),
          allocator.largest_free_range(), allocator.allocation_count(),
          allocator.free_range_count()};
}

// A piece of a layout built by MakeLayout.
struct Piece {
  uint64_t size;
  bool free;
};

// Returns an allocator whose block is cut into `pieces` in order, the ones
// marked free left free, and the offsets at which the pieces start.
std::pair<SubAllocator, std::vector<uint64_t>> MakeLayout(
    const std::vector<Piece>& pieces) {
  uint64_t capacity = 0;
  for (const Piece& piece : pieces) capacity += piece.size;
  SubAllocator allocator(capacity);
  std::vector<uint64_t> offsets;
  for (const Piece& piece : pieces) {
    // With one free range left, each allocation starts where the last ended.
    absl::StatusOr<Range> range = allocator.Allocate(piece.size, 1);
    EXPECT_TRUE(range.ok()) << range.status();
    offsets.push_back(range.ok() ? range->offset : kMax);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].free) {
      EXPECT_TRUE(allocator.Free(offsets[i]).ok());
    }
  }
  EXPECT_TRUE(allocator.CheckInvariants().ok());
  return {std::move(allocator), std::move(offsets)};
}

// Tests that a fresh allocator has one free range of its whole capacity.
TEST(SubAllocatorTest, StartsEmpty) {
  SubAllocator allocator(4096);
  EXPECT_EQ(allocator.capacity(), 4096u);
  EXPECT_EQ(allocator.bytes_allocated(), 0u);
  EXPECT_EQ(allocator.bytes_free(), 4096u);
  EXPECT_EQ(allocator.largest_free_range(), 4096u);
  EXPECT_EQ(allocator.allocation_count(), 0u);
  EXPECT_EQ(allocator.free_range_count(), 1u);
  EXPECT_TRUE(allocator.empty());
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that exact-fit allocations fill the block, the next one is
// ResourceExhausted with a message naming the sizes, and a free makes room.
TEST(SubAllocatorTest, FillToCapacityThenExhaustedThenFreeMakesRoom) {
  SubAllocator allocator(4 * kKiB);
  for (uint64_t i = 0; i < 4; ++i) {
    absl::StatusOr<Range> range = allocator.Allocate(kKiB, 1);
    ASSERT_TRUE(range.ok()) << range.status();
    EXPECT_EQ(*range, (Range{i * kKiB, kKiB}));
  }
  EXPECT_EQ(allocator.bytes_allocated(), 4 * kKiB);
  EXPECT_EQ(allocator.bytes_free(), 0u);
  EXPECT_EQ(allocator.largest_free_range(), 0u);
  EXPECT_EQ(allocator.allocation_count(), 4u);
  EXPECT_EQ(allocator.free_range_count(), 0u);
  EXPECT_FALSE(allocator.empty());

  absl::StatusOr<Range> full = allocator.Allocate(16, 8);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(),
              AllOf(HasSubstr("16 bytes"), HasSubstr("aligned to 8"),
                    HasSubstr("0 of 4096 bytes free"),
                    HasSubstr("largest free range 0 bytes")));

  ASSERT_TRUE(allocator.Free(kKiB).ok());
  EXPECT_EQ(allocator.bytes_free(), kKiB);
  EXPECT_EQ(allocator.largest_free_range(), kKiB);
  absl::StatusOr<Range> too_big = allocator.Allocate(kKiB + 1, 1);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(),
              AllOf(HasSubstr("1025 bytes"), HasSubstr("1024 of 4096 bytes"),
                    HasSubstr("largest free range 1024 bytes")));
  absl::StatusOr<Range> again = allocator.Allocate(kKiB, kKiB);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, (Range{kKiB, kKiB}));
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that a single allocation may take the whole block.
TEST(SubAllocatorTest, WholeBlockInOneAllocation) {
  SubAllocator allocator(1 << 20);
  absl::StatusOr<Range> range = allocator.Allocate(1 << 20, 1 << 16);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, (Range{0, 1 << 20}));
  EXPECT_EQ(allocator.bytes_free(), 0u);
  ASSERT_TRUE(allocator.Free(0).ok());
  EXPECT_TRUE(allocator.empty());
  EXPECT_EQ(allocator.largest_free_range(), 1u << 20);
}

// Tests that size 0 and non-power-of-two alignments are InvalidArgument and
// change nothing.
TEST(SubAllocatorTest, InvalidArgumentsChangeNothing) {
  SubAllocator allocator(4096);
  ASSERT_TRUE(allocator.Allocate(100, 4).ok());
  const Snapshot before = Snap(allocator);

  absl::StatusOr<Range> zero = allocator.Allocate(0, 4);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("size > 0, got 0"));
  for (uint64_t alignment : {uint64_t{0}, uint64_t{3}, uint64_t{6},
                             uint64_t{100}, (uint64_t{1} << 63) + 1, kMax}) {
    absl::StatusOr<Range> bad = allocator.Allocate(16, alignment);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
        << alignment;
    EXPECT_THAT(
        bad.status().message(),
        HasSubstr("power-of-two alignment, got " + std::to_string(alignment)));
  }
  EXPECT_EQ(Snap(allocator), before);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that alignments from 1 byte to 64 KiB are honoured and that the front
// padding an alignment skips is free and reusable.
TEST(SubAllocatorTest, AlignmentHonouredAndFrontPaddingReusable) {
  for (uint64_t alignment = 1; alignment <= 64 * kKiB; alignment *= 2) {
    SCOPED_TRACE(alignment);
    SubAllocator allocator(256 * kKiB);
    // Misalign the start of the remaining free range.
    ASSERT_TRUE(allocator.Allocate(1, 1).ok());

    absl::StatusOr<Range> aligned = allocator.Allocate(100, alignment);
    ASSERT_TRUE(aligned.ok()) << aligned.status();
    EXPECT_EQ(aligned->offset % alignment, 0u);
    EXPECT_EQ(aligned->offset, alignment == 1 ? 1 : alignment);
    EXPECT_EQ(aligned->size, 100u);
    EXPECT_EQ(allocator.bytes_allocated(), 101u);
    EXPECT_EQ(allocator.bytes_allocated() + allocator.bytes_free(),
              allocator.capacity());
    ASSERT_TRUE(allocator.CheckInvariants().ok());
    if (alignment <= 2) continue;  // No padding worth reusing.

    // The padding [1, alignment) is a free range of its own; best fit puts
    // an exact-size request there.
    absl::StatusOr<Range> padding = allocator.Allocate(alignment - 1, 1);
    ASSERT_TRUE(padding.ok()) << padding.status();
    EXPECT_EQ(*padding, (Range{1, alignment - 1}));
    // A smaller, aligned request also lands in the padding when it fits.
    ASSERT_TRUE(allocator.Free(1).ok());
    absl::StatusOr<Range> inside = allocator.Allocate(2, 2);
    ASSERT_TRUE(inside.ok()) << inside.status();
    EXPECT_EQ(*inside, (Range{2, 2}));
    EXPECT_TRUE(allocator.CheckInvariants().ok());
  }
}

// Tests that many allocations with mixed alignments are all aligned, in
// bounds and disjoint.
TEST(SubAllocatorTest, MixedAlignmentsAreDisjointAndAligned) {
  SubAllocator allocator(4 << 20);
  std::vector<Range> ranges;
  for (int i = 0; i < 200; ++i) {
    const uint64_t alignment = uint64_t{1} << (i % 17);
    const uint64_t size = 1 + (i * 37) % 3000;
    absl::StatusOr<Range> range = allocator.Allocate(size, alignment);
    ASSERT_TRUE(range.ok()) << range.status();
    EXPECT_EQ(range->offset % alignment, 0u);
    EXPECT_LE(range->offset + range->size, allocator.capacity());
    ranges.push_back(*range);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].offset + ranges[i - 1].size, ranges[i].offset);
  }
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that best fit picks the smallest hole that fits, lowest offset first.
TEST(SubAllocatorTest, BestFitPicksSmallestHole) {
  auto [allocator, offsets] = MakeLayout({{300, true},
                                          {1, false},
                                          {100, true},
                                          {1, false},
                                          {200, true},
                                          {1, false},
                                          {200, true},
                                          {1, false}});
  absl::StatusOr<Range> range = allocator.Allocate(150, 1);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->offset, offsets[4]);
  range = allocator.Allocate(150, 1);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->offset, offsets[6]);
  range = allocator.Allocate(100, 1);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->offset, offsets[2]);
  EXPECT_EQ(allocator.largest_free_range(), 300u);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that best fit looks past a few holes too misaligned to fit and still
// takes the smallest hole that fits.
TEST(SubAllocatorTest, BestFitSkipsMisalignedHoles) {
  // Three 100-byte holes at offsets = 1 (mod 64), where 64 aligned bytes do
  // not fit, one 100-byte hole at a multiple of 64, and a large free tail.
  auto [allocator, offsets] = MakeLayout({{1, false},
                                          {100, true},  // At 1.
                                          {28, false},
                                          {100, true},  // At 129.
                                          {28, false},
                                          {100, true},  // At 257.
                                          {27, false},
                                          {100, true},  // At 384.
                                          {28, false},
                                          {4096, true}});
  for (int hole : {1, 3, 5}) ASSERT_EQ(offsets[hole] % 64, 1u);
  ASSERT_EQ(offsets[7] % 64, 0u);
  absl::StatusOr<Range> range = allocator.Allocate(64, 64);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, (Range{offsets[7], 64}));
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that when no free range is large enough to fit regardless of
// alignment, every near miss is tried, so a lone aligned hole behind many
// misaligned ones is still found.
TEST(SubAllocatorTest, FindsLoneFittingHoleAmongManyNearMisses) {
  // 50 holes of 100 bytes at offsets = 1 (mod 64), then one at a multiple of
  // 64; nothing free is 127 bytes or larger.
  std::vector<Piece> pieces = {{1, false}};
  for (int i = 0; i < 50; ++i) {
    pieces.push_back({100, true});
    pieces.push_back({28, false});
  }
  pieces.push_back({63, false});  // Brings the next hole to 6464 = 101 * 64.
  pieces.push_back({100, true});
  pieces.push_back({1, false});
  auto [allocator, offsets] = MakeLayout(pieces);
  const uint64_t lone_hole = offsets[offsets.size() - 2];
  ASSERT_EQ(lone_hole % 64, 0u);
  ASSERT_EQ(allocator.largest_free_range(), 100u);

  absl::StatusOr<Range> range = allocator.Allocate(64, 64);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, (Range{lone_hole, 64}));
  // Now nothing fits 64 aligned bytes, although 5036 bytes are free.
  EXPECT_EQ(allocator.bytes_free(), 5036u);
  absl::StatusOr<Range> none = allocator.Allocate(64, 64);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(),
              HasSubstr("largest free range 100 bytes"));
  // Unaligned, the same request fits in the first hole.
  range = allocator.Allocate(64, 1);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->offset, offsets[1]);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that freeing in any order (forward, backward, interleaved, shuffled)
// coalesces back into one free range of the full capacity.
TEST(SubAllocatorTest, CoalescesInEveryFreeOrder) {
  constexpr int kCount = 64;
  std::vector<std::pair<std::string, std::vector<int>>> orders;
  std::vector<int> forward(kCount);
  for (int i = 0; i < kCount; ++i) forward[i] = i;
  std::vector<int> backward(forward.rbegin(), forward.rend());
  std::vector<int> interleaved;  // Evens, then odds: every free of an odd
                                 // one merges on both sides.
  for (int i = 0; i < kCount; i += 2) interleaved.push_back(i);
  for (int i = 1; i < kCount; i += 2) interleaved.push_back(i);
  std::vector<int> outside_in;  // 0, 63, 1, 62, ...
  for (int i = 0; i < kCount / 2; ++i) {
    outside_in.push_back(i);
    outside_in.push_back(kCount - 1 - i);
  }
  std::vector<int> shuffled = forward;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  orders = {{"forward", forward},
            {"backward", backward},
            {"interleaved", interleaved},
            {"outside_in", outside_in},
            {"shuffled", shuffled}};

  for (const auto& [name, order] : orders) {
    SCOPED_TRACE(name);
    // Mixed sizes and alignments, with a free tail at the end.
    SubAllocator allocator(1 << 20);
    std::vector<uint64_t> offsets;
    for (int i = 0; i < kCount; ++i) {
      absl::StatusOr<Range> range =
          allocator.Allocate(1 + i * 97 % 5000, uint64_t{1} << (i % 9));
      ASSERT_TRUE(range.ok()) << range.status();
      offsets.push_back(range->offset);
    }
    for (int index : order) {
      ASSERT_TRUE(allocator.Free(offsets[index]).ok());
      ASSERT_TRUE(allocator.CheckInvariants().ok());
    }
    EXPECT_TRUE(allocator.empty());
    EXPECT_EQ(allocator.free_range_count(), 1u);
    EXPECT_EQ(allocator.largest_free_range(), allocator.capacity());
    EXPECT_EQ(allocator.bytes_free(), allocator.capacity());
    absl::StatusOr<Range> whole = allocator.Allocate(1 << 20, 1);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(*whole, (Range{0, 1 << 20}));
  }
}

// Tests that a double free and offsets that are not the start of a live
// allocation are InvalidArgument and change nothing.
TEST(SubAllocatorTest, DoubleFreeAndForeignOffsetsAreRejected) {
  SubAllocator allocator(4096);
  absl::StatusOr<Range> a = allocator.Allocate(100, 1);
  absl::StatusOr<Range> b = allocator.Allocate(100, 64);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(allocator.Free(a->offset).ok());
  const Snapshot before = Snap(allocator);

  absl::Status twice = allocator.Free(a->offset);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("offset of a live allocation, got 0"));
  for (uint64_t offset :
       {b->offset + 1, b->offset - 1, b->offset + b->size, uint64_t{100},
        uint64_t{4095}, uint64_t{4096}, kMax}) {
    absl::Status foreign = allocator.Free(offset);
    EXPECT_EQ(foreign.code(), absl::StatusCode::kInvalidArgument) << offset;
    EXPECT_THAT(foreign.message(), HasSubstr("got " + std::to_string(offset)));
  }
  EXPECT_EQ(Snap(allocator), before);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
  // The live allocation is still freeable.
  EXPECT_TRUE(allocator.Free(b->offset).ok());
  EXPECT_TRUE(allocator.empty());
}

// Tests that largest_free_range reflects holes, and that a request larger
// than every hole fails even when enough bytes are free in total.
TEST(SubAllocatorTest, LargestFreeRangeReflectsHoles) {
  SubAllocator allocator(1000);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<Range> range = allocator.Allocate(100, 1);
    ASSERT_TRUE(range.ok()) << range.status();
    offsets.push_back(range->offset);
  }
  EXPECT_EQ(allocator.largest_free_range(), 0u);
  // Holes: [100, 200), [300, 500), [700, 800).
  for (int i : {1, 3, 4, 7}) ASSERT_TRUE(allocator.Free(offsets[i]).ok());
  EXPECT_EQ(allocator.bytes_free(), 400u);
  EXPECT_EQ(allocator.largest_free_range(), 200u);
  EXPECT_EQ(allocator.free_range_count(), 3u);

  absl::StatusOr<Range> too_big = allocator.Allocate(300, 1);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(),
              AllOf(HasSubstr("300 bytes"), HasSubstr("400 of 1000 bytes free"),
                    HasSubstr("largest free range 200 bytes")));

  // Freeing [200, 300) joins two holes into [100, 500).
  ASSERT_TRUE(allocator.Free(offsets[2]).ok());
  EXPECT_EQ(allocator.largest_free_range(), 400u);
  EXPECT_EQ(allocator.free_range_count(), 2u);
  absl::StatusOr<Range> fits = allocator.Allocate(300, 1);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(*fits, (Range{100, 300}));
  EXPECT_EQ(allocator.largest_free_range(), 100u);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that an allocator of capacity 0 refuses every allocation.
TEST(SubAllocatorTest, ZeroCapacity) {
  SubAllocator allocator(0);
  EXPECT_TRUE(allocator.empty());
  EXPECT_EQ(allocator.largest_free_range(), 0u);
  EXPECT_EQ(allocator.free_range_count(), 0u);
  EXPECT_EQ(allocator.Allocate(1, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(allocator.Free(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that offsets, sizes and alignments near 2^64 do not overflow.
TEST(SubAllocatorTest, HugeValuesDoNotOverflow) {
  SubAllocator allocator(kMax);
  ASSERT_TRUE(allocator.Allocate(1, 1).ok());
  // From offset 1, alignment 2 skips a byte: kMax - 1 bytes no longer fit.
  EXPECT_EQ(allocator.Allocate(kMax - 1, 2).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(allocator.Allocate(kMax, uint64_t{1} << 63).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<Range> top = allocator.Allocate(kMax - 2, 2);
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(*top, (Range{2, kMax - 2}));
  EXPECT_EQ(allocator.bytes_free(), 1u);
  ASSERT_TRUE(allocator.Free(2).ok());
  absl::StatusOr<Range> high = allocator.Allocate(16, uint64_t{1} << 63);
  ASSERT_TRUE(high.ok()) << high.status();
  EXPECT_EQ(*high, (Range{uint64_t{1} << 63, 16}));
  EXPECT_EQ(allocator.bytes_allocated() + allocator.bytes_free(), kMax);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

// Tests that a move transfers the block and its allocations and leaves the
// source with capacity 0.
TEST(SubAllocatorTest, MoveTransfersState) {
  SubAllocator source(4096);
  absl::StatusOr<Range> range = source.Allocate(100, 16);
  ASSERT_TRUE(range.ok());
  SubAllocator moved(std::move(source));
  EXPECT_EQ(moved.capacity(), 4096u);
  EXPECT_EQ(moved.allocation_count(), 1u);
  EXPECT_TRUE(moved.CheckInvariants().ok());
  EXPECT_EQ(source.capacity(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(source.empty());
  EXPECT_TRUE(source.CheckInvariants().ok());

  SubAllocator assigned(8);
  assigned = std::move(moved);
  EXPECT_EQ(assigned.capacity(), 4096u);
  EXPECT_TRUE(assigned.Free(range->offset).ok());
  EXPECT_TRUE(assigned.empty());
  EXPECT_TRUE(assigned.CheckInvariants().ok());
}

// Reference model for the randomized test: the live ranges, by offset.
class ReferenceModel {
 public:
  explicit ReferenceModel(uint64_t capacity) : capacity_(capacity) {}

  // Whether [offset, offset + size) lies in the block and overlaps no live
  // range.
  bool IsFree(uint64_t offset, uint64_t size) const {
    if (offset > capacity_ || size > capacity_ - offset) return false;
    auto next = live_.lower_bound(offset);
    if (next != live_.end() && next->first < offset + size) return false;
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second > offset) return false;
    }
    return true;
  }
  void Add(uint64_t offset, uint64_t size) {
    live_.emplace(offset, size);
    bytes_ += size;
  }
  void Remove(uint64_t offset) {
    bytes_ -= live_.at(offset);
    live_.erase(offset);
  }
  bool Contains(uint64_t offset) const { return live_.contains(offset); }

  // The gaps between live ranges, as (offset, size).
  std::vector<std::pair<uint64_t, uint64_t>> Gaps() const {
    std::vector<std::pair<uint64_t, uint64_t>> gaps;
    uint64_t cursor = 0;
    for (const auto& [offset, size] : live_) {
      if (offset > cursor) gaps.emplace_back(cursor, offset - cursor);
      cursor = offset + size;
    }
    if (capacity_ > cursor) gaps.emplace_back(cursor, capacity_ - cursor);
    return gaps;
  }
  uint64_t LargestGap() const {
    uint64_t largest = 0;
    for (const auto& [offset, size] : Gaps()) largest = std::max(largest, size);
    return largest;
  }
  // Whether any gap holds `size` bytes aligned to `alignment`.
  bool AnyGapFits(uint64_t size, uint64_t alignment) const {
    for (const auto& [offset, gap] : Gaps()) {
      const uint64_t start = (offset + alignment - 1) & ~(alignment - 1);
      if (start + size <= offset + gap) return true;
    }
    return false;
  }

  uint64_t bytes() const { return bytes_; }
  size_t count() const { return live_.size(); }

 private:
  uint64_t capacity_;
  uint64_t bytes_ = 0;
  std::map<uint64_t, uint64_t> live_;
};

// Tests ~100k random allocations and frees (fixed seed) against a reference
// model: every range is aligned, in bounds and disjoint from the live ones,
// ResourceExhausted only when no gap fits, bad frees are rejected, and the
// byte accounting holds after every operation.
TEST(SubAllocatorTest, RandomizedAgainstReferenceModel) {
  constexpr uint64_t kCapacity = 1 << 20;
  constexpr int kOps = 100'000;
  SubAllocator allocator(kCapacity);
  ReferenceModel model(kCapacity);
  std::vector<uint64_t> live;  // Offsets, for picking one to free.
  std::mt19937_64 rng(0xC0FFEE);
  auto uniform = [&rng](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };

  int allocations = 0, exhausted = 0, frees = 0, bad_frees = 0;
  for (int op = 0; op < kOps; ++op) {
    SCOPED_TRACE(op);
    const uint64_t action = uniform(0, 99);
    if (action < 55 || live.empty()) {
      // Mostly small sizes, some large; alignments 1 B .. 64 KiB.
      const uint64_t size =
          uniform(0, 9) == 0 ? uniform(1, 64 * kKiB) : uniform(1, 4 * kKiB);
      const uint64_t alignment = uint64_t{1} << uniform(0, 16);
      absl::StatusOr<Range> range = allocator.Allocate(size, alignment);
      if (range.ok()) {
        ++allocations;
        ASSERT_EQ(range->size, size);
        ASSERT_EQ(range->offset % alignment, 0u);
        ASSERT_TRUE(model.IsFree(range->offset, range->size))
            << "overlap or out of bounds at " << range->offset;
        model.Add(range->offset, range->size);
        live.push_back(range->offset);
      } else {
        ++exhausted;
        ASSERT_EQ(range.status().code(), absl::StatusCode::kResourceExhausted)
            << range.status();
        ASSERT_FALSE(model.AnyGapFits(size, alignment))
            << "refused " << size << " aligned to " << alignment
            << " although a gap fits";
      }
    } else if (action < 97) {
      ++frees;
      const size_t index = uniform(0, live.size() - 1);
      ASSERT_TRUE(allocator.Free(live[index]).ok());
      model.Remove(live[index]);
      live[index] = live.back();
      live.pop_back();
    } else {
      ++bad_frees;
      uint64_t offset = uniform(0, kCapacity);
      if (model.Contains(offset)) ++offset;
      if (model.Contains(offset)) continue;  // Unlucky twice; skip.
      ASSERT_EQ(allocator.Free(offset).code(),
                absl::StatusCode::kInvalidArgument);
    }
    ASSERT_EQ(allocator.bytes_allocated(), model.bytes());
    ASSERT_EQ(allocator.bytes_allocated() + allocator.bytes_free(), kCapacity);
    ASSERT_EQ(allocator.allocation_count(), model.count());
    ASSERT_EQ(allocator.largest_free_range(), model.LargestGap());
    if (op % 100 == 0) {
      ASSERT_TRUE(allocator.CheckInvariants().ok());
    }
  }
  // The mix must have exercised every path, exhaustion included.
  EXPECT_GT(allocations, 10'000);
  EXPECT_GT(exhausted, 1'000);
  EXPECT_GT(frees, 10'000);
  EXPECT_GT(bad_frees, 1'000);

  for (uint64_t offset : live) ASSERT_TRUE(allocator.Free(offset).ok());
  EXPECT_TRUE(allocator.empty());
  EXPECT_EQ(allocator.free_range_count(), 1u);
  EXPECT_EQ(allocator.largest_free_range(), kCapacity);
  EXPECT_TRUE(allocator.CheckInvariants().ok());
}

}  // namespace
}  // namespace causeway
