#include "causeway/base/checked_size.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "causeway/base/byte_ranges.h"
#include "causeway/runtime/host_budget.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// Tests that products and sums that fit are exact and those that do not are
// InvalidArgument naming what was computed.
TEST(CheckedSizeTest, MulAndAddRefuseOverflow) {
  ASSERT_OK_AND_ASSIGN(uint64_t product, CheckedMul(uint64_t{1} << 31, uint64_t{1} << 32, "bytes"));
  EXPECT_EQ(product, uint64_t{1} << 63);
  EXPECT_ERROR(CheckedMul(uint64_t{1} << 32, uint64_t{1} << 32, "bytes"), absl::StatusCode::kInvalidArgument,
               "bytes: 4294967296 x 4294967296 does not fit in 64 bits");
  ASSERT_OK_AND_ASSIGN(uint64_t sum, CheckedAdd(kMax - 1, 1, "end"));
  EXPECT_EQ(sum, kMax);
  EXPECT_ERROR(CheckedAdd(kMax, 1, "end"), absl::StatusCode::kInvalidArgument, "end:", "does not fit");
}

// Tests element counts: exact below the limits, refused at a dimension < 1,
// past the caller's limit, and where the product would wrap.
TEST(CheckedSizeTest, ElementCounts) {
  ASSERT_OK_AND_ASSIGN(uint64_t n, CheckedElementCount({4, 128, 3}));
  EXPECT_EQ(n, 4u * 128 * 3);
  ASSERT_OK_AND_ASSIGN(uint64_t scalar, CheckedElementCount({}));
  EXPECT_EQ(scalar, 1u);
  EXPECT_ERROR(CheckedElementCount({4, 0}), absl::StatusCode::kInvalidArgument, "shape [4, 0]",
               "dimension 1 = 0");
  EXPECT_ERROR(CheckedElementCount({4, -2}), absl::StatusCode::kInvalidArgument, "dimension 1 = -2");
  EXPECT_ERROR(CheckedElementCount({1000, 1000}, 999999), absl::StatusCode::kInvalidArgument,
               "more than 999999 elements");
  const int64_t k2to32 = int64_t{1} << 32;
  // 2^64 wraps to 0 in unchecked arithmetic.
  EXPECT_ERROR(CheckedElementCount({k2to32, k2to32}), absl::StatusCode::kInvalidArgument,
               "shape [4294967296, 4294967296] has more than 9223372036854775807 elements");
  EXPECT_ERROR(CheckedElementCount({int64_t{1} << 62, 2}), absl::StatusCode::kInvalidArgument, "more than");
}

// Tests byte sizes: elements times the element size, refused when the
// product passes 2^64 or the caller's limit.
TEST(CheckedSizeTest, ByteSizes) {
  ASSERT_OK_AND_ASSIGN(uint64_t bytes, CheckedByteSize({4, 128}, 4));
  EXPECT_EQ(bytes, 2048u);
  EXPECT_ERROR(CheckedByteSize({int64_t{1} << 62}, 4), absl::StatusCode::kInvalidArgument,
               "shape [4611686018427387904] of 4-byte elements is more than");
  EXPECT_ERROR(CheckedByteSize({1024}, 4, 4095), absl::StatusCode::kInvalidArgument, "more than 4095 bytes");
  ASSERT_OK_AND_ASSIGN(uint64_t exact, CheckedByteSize({1024}, 4, 4096));
  EXPECT_EQ(exact, 4096u);
}

// Tests ranges: inside (including empty at the end) is OK; past the end, or
// where offset + length would wrap, is refused.
TEST(CheckedSizeTest, Ranges) {
  EXPECT_OK(CheckRange(0, 32, 32, "frame"));
  EXPECT_OK(CheckRange(32, 0, 32, "frame"));
  EXPECT_ERROR(CheckRange(16, 17, 32, "frame"), absl::StatusCode::kInvalidArgument,
               "frame: 17 bytes at offset 16 run past the end of a 32-byte object");
  EXPECT_ERROR(CheckRange(kMax, 16, 32, "frame"), absl::StatusCode::kInvalidArgument, "run past the end");
  EXPECT_ERROR(CheckRange(16, kMax, 32, "frame"), absl::StatusCode::kInvalidArgument, "run past the end");
}

// Tests that byte ranges count each byte once: pieces in any order join,
// and a piece that overlaps one taken (the same bytes, a part of them, or
// bytes on both sides) is DataLoss naming both and takes nothing.
// Tests that a host budget takes charges up to its limit exactly, refuses
// one past it naming the owner, what asked and the figures (taking
// nothing), and gets each charge back when it is reset, moved over or
// destroyed, even after the budget's owner let go of it.
TEST(HostBudgetTest, ChargesUpToTheLimitAndGivesBack) {
  auto budget = std::make_shared<HostBudget>("session 7", 1024);
  absl::StatusOr<HostCharge> a = HostBudget::Charge(budget, 1000, "a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes(), 1000u);
  absl::StatusOr<HostCharge> b = HostBudget::Charge(budget, 25, "the upload to array 3");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.status().message(),
            "the upload to array 3 needs 25 B of host memory, past the budget of session 7: 1000 B of 1 KiB "
            "in use");
  EXPECT_EQ(budget->in_use(), 1000u);
  absl::StatusOr<HostCharge> c = HostBudget::Charge(budget, 24, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(budget->in_use(), 1024u);
  EXPECT_FALSE(HostBudget::Charge(budget, 1, "d").ok());
  EXPECT_FALSE(HostBudget::Charge(budget, UINT64_MAX, "e").ok());
  c->Reset();
  EXPECT_EQ(budget->in_use(), 1000u);
  HostCharge moved = *std::move(a);
  EXPECT_EQ(budget->in_use(), 1000u);
  moved = HostCharge();
  EXPECT_EQ(budget->in_use(), 0u);
  {
    HostCharge held = *HostBudget::Charge(budget, 512, "f");
    std::weak_ptr<HostBudget> weak = budget;
    budget.reset();  // the charge keeps the budget
    EXPECT_EQ(weak.lock()->in_use(), 512u);
  }
}

// Tests that a budget with a parent (an island's total over its sessions)
// charges both, is held to both limits (the parent's refusal names the
// parent and takes nothing from the child), and gives both back.
TEST(HostBudgetTest, ChargesReachTheParentAndAreHeldToItsLimit) {
  auto island = std::make_shared<HostBudget>("island 'i'", 1000);
  auto s1 = std::make_shared<HostBudget>("session 1", 800, island);
  auto s2 = std::make_shared<HostBudget>("session 2", 800, island);
  ASSERT_OK_AND_ASSIGN(HostCharge a, HostBudget::Charge(s1, 700, "a"));
  EXPECT_EQ(island->in_use(), 700u);
  EXPECT_ERROR(HostBudget::Charge(s2, 400, "b").status(), absl::StatusCode::kResourceExhausted,
               "b needs 400 B of host memory, past the budget of island 'i': 700 B of 1000 B in use");
  EXPECT_EQ(s2->in_use(), 0u);
  EXPECT_ERROR(HostBudget::Charge(s1, 200, "c").status(), absl::StatusCode::kResourceExhausted,
               "past the budget of session 1");
  EXPECT_EQ(island->in_use(), 700u);
  ASSERT_OK_AND_ASSIGN(HostCharge d, HostBudget::Charge(s2, 300, "d"));
  EXPECT_EQ(island->in_use(), 1000u);
  a.Reset();
  EXPECT_EQ(s1->in_use(), 0u);
  EXPECT_EQ(island->in_use(), 300u);
  d.Reset();
  EXPECT_EQ(island->in_use(), 0u);
}

TEST(ByteRangesTest, CountsEachByteOnceAndRefusesOverlaps) {
  ByteRanges ranges;
  ASSERT_OK(ranges.Add(100, 50, "upload"));
  ASSERT_OK(ranges.Add(0, 50, "upload"));
  EXPECT_EQ(ranges.pieces(), 2u);
  EXPECT_ERROR(ranges.Add(100, 50, "upload"), absl::StatusCode::kDataLoss,
               "upload sent bytes [100, 150) of its value, overlapping bytes [100, 150) it had sent already");
  EXPECT_ERROR(ranges.Add(40, 20, "upload"), absl::StatusCode::kDataLoss, "bytes [40, 60)", "bytes [0, 50)");
  EXPECT_ERROR(ranges.Add(60, 50, "upload"), absl::StatusCode::kDataLoss, "bytes [60, 110)",
               "bytes [100, 150)");
  EXPECT_ERROR(ranges.Add(10, 200, "upload"), absl::StatusCode::kDataLoss, "bytes [10, 210)");
  EXPECT_ERROR(ranges.Add(149, 1, "upload"), absl::StatusCode::kDataLoss, "bytes [149, 150)");
  EXPECT_EQ(ranges.bytes(), 100u);
  // The gap, exactly: one piece.
  ASSERT_OK(ranges.Add(50, 50, "upload"));
  EXPECT_EQ(ranges.pieces(), 1u);
  EXPECT_EQ(ranges.bytes(), 150u);
  // At the top of the 64-bit range.
  ASSERT_OK(ranges.Add(kMax - 10, 10, "upload"));
  EXPECT_ERROR(ranges.Add(kMax - 1, 1, "upload"), absl::StatusCode::kDataLoss);
}

// Tests that a piece standing alone past kMaxPieces is ResourceExhausted,
// while one joining a piece kept is taken whatever the count.
TEST(ByteRangesTest, BoundsTheSeparatePiecesKept) {
  ByteRanges ranges;
  for (uint64_t i = 0; i < ByteRanges::kMaxPieces; ++i) ASSERT_OK(ranges.Add(2 * i, 1, "value"));
  EXPECT_ERROR(ranges.Add(2 * ByteRanges::kMaxPieces, 1, "value"), absl::StatusCode::kResourceExhausted,
               "value sent its value in more than 4096 separate pieces");
  ASSERT_OK(ranges.Add(2 * ByteRanges::kMaxPieces - 1, 1, "value"));  // joins the last piece
  ASSERT_OK(ranges.Add(1, 1, "value"));                               // joins the first two
  EXPECT_EQ(ranges.pieces(), ByteRanges::kMaxPieces - 1);
  EXPECT_EQ(ranges.bytes(), ByteRanges::kMaxPieces + 2);
}

}  // namespace
}  // namespace causeway
