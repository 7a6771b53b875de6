// Tests of device memory: the per-accelerator budget, sub-allocation into
// blocks, uploads and downloads at offsets, and byte-size parsing.
#include "causeway/runtime/memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "causeway/base/fault_injection.h"
#include "causeway/kernels/ops.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::TestOptions;
using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
// PoolOptions' default block size.
constexpr uint64_t kBlockSize = 64 * kMiB;

// The message of `s`, as a std::string that gMock prints readably.
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// `device_memory`: RuntimeOptions::device_memory (empty:
// CAUSEWAY_DEVICE_MEMORY's).
std::unique_ptr<Runtime> MakeRuntimeWithBudget(uint64_t budget, const std::string& device_memory = "") {
  RuntimeOptions options = TestOptions(1);
  options.memory_budget = budget;
  options.device_memory = device_memory;
  return MakeRuntime(options);
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

uint64_t SumReserved(const std::vector<std::shared_ptr<Buffer>>& buffers) {
  uint64_t sum = 0;
  for (const auto& b : buffers) sum += b->reserved_size();
  return sum;
}

// Checks that no two live buffers share bytes of a block and that each lies
// inside its block.
void ExpectDisjoint(const std::vector<std::shared_ptr<Buffer>>& buffers) {
  std::map<const MemoryBlock*, std::vector<std::pair<uint64_t, uint64_t>>> by_block;
  for (const auto& b : buffers) {
    EXPECT_LE(b->block_offset() + b->reserved_size(), b->block()->size);
    by_block[b->block()].push_back({b->block_offset(), b->reserved_size()});
  }
  for (auto& [block, ranges] : by_block) {
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      ASSERT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first)
          << "buffers at " << ranges[i - 1].first << " and " << ranges[i].first << " overlap";
    }
  }
}

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// Tests that allocations up to the budget succeed, the next one fails with the
// figures, in-use bytes are exactly the reserved sizes, and the accelerator
// works on afterwards.
TEST(MemoryTest, BudgetAllowsUpToItAndNoMore) {
  auto rt = MakeRuntimeWithBudget(8 * kMiB);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  EXPECT_EQ(acc->memory_budget(), 8 * kMiB);
  EXPECT_EQ(acc->memory_in_use(), 0u);

  std::vector<std::shared_ptr<Buffer>> buffers;
  for (int i = 0; i < 8; ++i) {
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(kMiB));
    EXPECT_EQ(b->size(), kMiB);
    EXPECT_EQ(b->reserved_size(), kMiB);
    buffers.push_back(b);
    EXPECT_EQ(acc->memory_in_use(), SumReserved(buffers));
  }
  EXPECT_EQ(acc->memory_in_use(), 8 * kMiB);
  ExpectDisjoint(buffers);
  const uint64_t reserved = acc->memory_reserved();
  const size_t blocks = acc->device_pool().block_count();
  EXPECT_GE(reserved, 8 * kMiB);

  auto over = acc->CreateBuffer(kMiB);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(Msg(over.status()), HasSubstr("budget"));
  EXPECT_THAT(Msg(over.status()), HasSubstr("8 MiB"));  // the budget and the bytes in use
  EXPECT_THAT(Msg(over.status()), HasSubstr("1 MiB"));  // the request
  EXPECT_THAT(Msg(over.status()), HasSubstr("accelerator 0"));
  auto one_byte = acc->CreateBuffer(1);
  EXPECT_EQ(one_byte.status().code(), absl::StatusCode::kResourceExhausted) << one_byte.status();
  // A refused request changes nothing.
  EXPECT_EQ(acc->memory_in_use(), 8 * kMiB);
  EXPECT_EQ(acc->memory_reserved(), reserved);
  EXPECT_EQ(acc->device_pool().block_count(), blocks);

  // The accelerator still works: a dispatch and a copy on full memory.
  const uint32_t words = kMiB / 4;
  ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList("fill and copy"));
  ASSERT_OK(ops::FillWords(*list, buffers[3], words, 0x5eed1234u));
  ASSERT_OK(list->Copy(buffers[3], buffers[4]));
  ASSERT_OK(acc->Submit(list).Await());
  std::vector<uint32_t> got(words);
  ASSERT_OK(acc->DownloadSync(buffers[4], got.data(), kMiB));
  for (uint32_t i = 0; i < words; ++i) ASSERT_EQ(got[i], 0x5eed1234u) << "word " << i;

  // Freeing one makes room for exactly one more.
  buffers.erase(buffers.begin() + 2);
  EXPECT_EQ(acc->memory_in_use(), 7 * kMiB);
  ASSERT_OK_AND_ASSIGN(auto again, acc->CreateBuffer(kMiB));
  buffers.push_back(std::move(again));
  EXPECT_EQ(acc->memory_in_use(), 8 * kMiB);
  EXPECT_EQ(acc->CreateBuffer(kMiB).status().code(), absl::StatusCode::kResourceExhausted);

  // Freeing everything returns in-use to exactly where it started.
  list.reset();
  buffers.clear();
  EXPECT_EQ(acc->memory_in_use(), 0u);
  EXPECT_LE(acc->device_pool().block_count(), 1u);
}

// Tests that in-use bytes are exactly the sum of reserved sizes for buffers of
// odd sizes, and return to 0 in any freeing order.
TEST(MemoryTest, InUseIsSumOfReservedSizes) {
  auto rt = MakeRuntimeWithBudget(8 * kMiB);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const std::vector<uint64_t> sizes = {1, 3, 4, 100, 255, 4097, 65537, kMiB - 1, 12345, 2 * kMiB + 3};
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (uint64_t size : sizes) {
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(size));
    EXPECT_EQ(b->size(), size);
    EXPECT_GE(b->reserved_size(), size);
    EXPECT_LT(b->reserved_size(), size + 64 * kKiB) << "size " << size;
    EXPECT_EQ(b->kind(), MemoryKind::kDevice);
    EXPECT_EQ(b->accelerator(), acc);
    buffers.push_back(b);
    EXPECT_EQ(acc->memory_in_use(), SumReserved(buffers));
  }
  ExpectDisjoint(buffers);
  // Staging buffers do not count against the budget.
  ASSERT_OK_AND_ASSIGN(auto staging, acc->CreateStagingBuffer(16 * kMiB));
  EXPECT_EQ(acc->memory_in_use(), SumReserved(buffers));
  staging.reset();

  std::mt19937 rng(3);
  std::shuffle(buffers.begin(), buffers.end(), rng);
  while (!buffers.empty()) {
    buffers.pop_back();
    EXPECT_EQ(acc->memory_in_use(), SumReserved(buffers));
  }
  EXPECT_EQ(acc->memory_in_use(), 0u);
}

// Tests that a request larger than the whole budget fails cleanly without
// reserving memory, and that a request of exactly the budget fits.
TEST(MemoryTest, RequestLargerThanBudgetFails) {
  auto rt = MakeRuntimeWithBudget(8 * kMiB);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  for (uint64_t size : {8 * kMiB + 1, 9 * kMiB, 1 * kGiB}) {
    SCOPED_TRACE(absl::StrCat("request of ", size, " bytes"));
    auto b = acc->CreateBuffer(size);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
    EXPECT_THAT(Msg(b.status()), HasSubstr("budget"));
    EXPECT_THAT(Msg(b.status()), HasSubstr(FormatBytes(8 * kMiB)));
    EXPECT_EQ(acc->memory_in_use(), 0u);
    EXPECT_EQ(acc->memory_reserved(), 0u);
    EXPECT_EQ(acc->device_pool().block_count(), 0u);
  }
  auto zero = acc->CreateBuffer(0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument) << zero.status();

  ASSERT_OK_AND_ASSIGN(auto whole, acc->CreateBuffer(8 * kMiB));
  EXPECT_EQ(acc->memory_in_use(), 8 * kMiB);
  std::vector<uint8_t> bytes = RandomBytes(8 * kMiB, 1), got(8 * kMiB);
  ASSERT_OK(acc->UploadSync(whole, bytes.data(), bytes.size()));
  ASSERT_OK(acc->DownloadSync(whole, got.data(), got.size()));
  EXPECT_TRUE(bytes == got);
  whole.reset();
  EXPECT_EQ(acc->memory_in_use(), 0u);
}

// Tests that a budget of exactly one buffer's reserved size fits that buffer
// and nothing more.
TEST(MemoryTest, BudgetOfOneReservedSizeFitsOneBuffer) {
  const uint64_t size = 1000;
  uint64_t reserved;
  {
    auto probe = MakeRuntimeWithBudget(8 * kMiB);
    ASSERT_NE(probe, nullptr);
    ASSERT_OK_AND_ASSIGN(auto b, probe->accelerator(0)->CreateBuffer(size));
    reserved = b->reserved_size();
  }
  ASSERT_GE(reserved, size);
  auto rt = MakeRuntimeWithBudget(reserved);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  ASSERT_EQ(acc->memory_budget(), reserved);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(size));
    EXPECT_EQ(b->reserved_size(), reserved);
    EXPECT_EQ(acc->memory_in_use(), reserved);
    auto second = acc->CreateBuffer(1);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
    std::vector<uint8_t> bytes = RandomBytes(size, 2), got(size);
    ASSERT_OK(acc->UploadSync(b, bytes.data(), size));
    ASSERT_OK(acc->DownloadSync(b, got.data(), size));
    EXPECT_TRUE(bytes == got);
    b.reset();
    EXPECT_EQ(acc->memory_in_use(), 0u);
  }
}

// Tests that thousands of small buffers sub-allocate from few blocks without
// overlapping, and that freeing them all keeps at most one empty block.
TEST(MemoryTest, ManySmallBuffersShareFewBlocks) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  ASSERT_GE(acc->memory_budget(), 1 * kGiB);
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (int i = 0; i < 5000; ++i) {
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(200 + i % 57));
    buffers.push_back(b);
  }
  EXPECT_EQ(acc->device_pool().block_count(), 1u);
  EXPECT_EQ(acc->memory_reserved(), kBlockSize);
  // 1500 buffers of 100 KiB + 1 are about 147 MiB: three blocks.
  for (int i = 0; i < 1500; ++i) {
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(100 * kKiB + 1));
    buffers.push_back(b);
  }
  const uint64_t in_use = SumReserved(buffers);
  EXPECT_EQ(acc->memory_in_use(), in_use);
  const size_t blocks = acc->device_pool().block_count();
  EXPECT_GE(blocks * kBlockSize, in_use);
  EXPECT_LE(blocks, (in_use + kBlockSize - 1) / kBlockSize + 1);
  EXPECT_EQ(acc->memory_reserved(), blocks * kBlockSize);
  ExpectDisjoint(buffers);

  // Data written to neighbours stays apart.
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, size_t{4999}, size_t{5000}, size_t{5001}}) {
    std::vector<uint8_t> fill(buffers[i]->size(), static_cast<uint8_t>(i + 1));
    ASSERT_OK(acc->UploadSync(buffers[i], fill.data(), fill.size()));
  }
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, size_t{4999}, size_t{5000}, size_t{5001}}) {
    std::vector<uint8_t> got(buffers[i]->size());
    ASSERT_OK(acc->DownloadSync(buffers[i], got.data(), got.size()));
    EXPECT_EQ(std::count(got.begin(), got.end(), static_cast<uint8_t>(i + 1)), static_cast<long>(got.size()))
        << "buffer " << i;
  }

  std::mt19937 rng(5);
  std::shuffle(buffers.begin(), buffers.end(), rng);
  buffers.clear();
  EXPECT_EQ(acc->memory_in_use(), 0u);
  EXPECT_LE(acc->device_pool().block_count(), 1u);
  EXPECT_EQ(acc->memory_reserved(), acc->device_pool().block_count() * kBlockSize);

  // The kept block serves the next request.
  const size_t kept = acc->device_pool().block_count();
  ASSERT_OK_AND_ASSIGN(auto next, acc->CreateBuffer(4096));
  EXPECT_EQ(acc->device_pool().block_count(), std::max<size_t>(kept, 1));
}

// Tests that threads allocating and freeing at once keep the accounting
// exact and never exceed the budget: of 4 threads asking for 4 MiB each in
// 1 MiB buffers under an 8 MiB budget, exactly 8 requests succeed.
TEST(MemoryTest, ConcurrentAllocationsRespectBudget) {
  auto rt = MakeRuntimeWithBudget(8 * kMiB);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  // Warm-up churn: many threads allocate and free small buffers.
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([acc, t] {
        std::vector<std::shared_ptr<Buffer>> mine;
        for (int i = 0; i < 300; ++i) {
          auto b = acc->CreateBuffer(1 + (i * 37 + t) % 3000);
          if (b.ok()) mine.push_back(*b);
          if (i % 3 == 0 && !mine.empty()) mine.erase(mine.begin());
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(acc->memory_in_use(), 0u);

  std::vector<std::vector<std::shared_ptr<Buffer>>> got(4);
  std::vector<int> refused(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([acc, t, &got, &refused] {
      for (int i = 0; i < 4; ++i) {
        auto b = acc->CreateBuffer(kMiB);
        if (b.ok()) {
          got[t].push_back(*b);
        } else if (absl::IsResourceExhausted(b.status())) {
          ++refused[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<std::shared_ptr<Buffer>> all;
  int refusals = 0;
  for (int t = 0; t < 4; ++t) {
    all.insert(all.end(), got[t].begin(), got[t].end());
    refusals += refused[t];
  }
  EXPECT_EQ(all.size(), 8u);
  EXPECT_EQ(refusals, 8);
  EXPECT_EQ(acc->memory_in_use(), SumReserved(all));
  ExpectDisjoint(all);
  got.clear();
  all.clear();
  EXPECT_EQ(acc->memory_in_use(), 0u);
}

// Tests that a buffer of over half the block size gets a block of its own even
// when a shared block has room, so freeing it returns its memory (once the
// spare blocks are released), and that releasing the unused memory frees the
// empty standard block too.
TEST(MemoryTest, LargeBufferGetsItsOwnBlock) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  ASSERT_OK_AND_ASSIGN(auto small, acc->CreateBuffer(4096));
  ASSERT_EQ(acc->memory_reserved(), kBlockSize);
  ASSERT_OK_AND_ASSIGN(auto large, acc->CreateBuffer(40 * kMiB));
  EXPECT_NE(large->block(), small->block());
  EXPECT_EQ(large->block()->size, large->reserved_size());
  EXPECT_EQ(acc->memory_reserved(), kBlockSize + large->reserved_size());
  large.reset();
  EXPECT_EQ(acc->memory_in_use(), small->reserved_size());
  acc->device_pool().ReleaseSpare();
  EXPECT_EQ(acc->memory_reserved(), kBlockSize);
  // Empty, the standard block is kept for reuse, until the unused memory is
  // released.
  small.reset();
  EXPECT_EQ(acc->memory_reserved(), kBlockSize);
  acc->ReleaseUnusedMemory();
  EXPECT_EQ(acc->memory_reserved(), 0u);
  EXPECT_EQ(acc->device_pool().block_count(), 0u);
}

// Tests uploads and downloads of sub-ranges at odd offsets.
TEST(MemoryTest, UploadDownloadRoundTripAtOffsets) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const uint64_t size = 10000;
  ASSERT_OK_AND_ASSIGN(auto buffer, acc->CreateBuffer(size));
  std::vector<uint8_t> expected = RandomBytes(size, 10);
  ASSERT_OK(acc->UploadSync(buffer, expected.data(), size));

  struct Range {
    uint64_t offset, size;
  };
  uint32_t seed = 11;
  for (Range r :
       {Range{123, 777}, Range{1, 1}, Range{9999, 1}, Range{0, 3}, Range{4095, 4097}, Range{17, 9983}}) {
    SCOPED_TRACE(absl::StrCat(r.size, " bytes at ", r.offset));
    std::vector<uint8_t> part = RandomBytes(r.size, seed++);
    ASSERT_OK(acc->UploadSync(buffer, part.data(), r.size, r.offset));
    std::copy(part.begin(), part.end(), expected.begin() + r.offset);
    std::vector<uint8_t> got(r.size);
    ASSERT_OK(acc->DownloadSync(buffer, got.data(), r.size, r.offset));
    EXPECT_TRUE(got == part);
    std::vector<uint8_t> all(size);
    ASSERT_OK(acc->DownloadSync(buffer, all.data(), size));
    EXPECT_TRUE(all == expected);
  }
}

// Tests that uploads and downloads outside the buffer are OutOfRange and
// change nothing, on the device or in the host memory.
TEST(MemoryTest, OutOfRangeUploadDownloadChangeNothing) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const uint64_t size = 10000;
  ASSERT_OK_AND_ASSIGN(auto buffer, acc->CreateBuffer(size));
  std::vector<uint8_t> expected = RandomBytes(size, 20);
  ASSERT_OK(acc->UploadSync(buffer, expected.data(), size));
  std::vector<uint8_t> data(20000, 0xAB);

  struct Range {
    uint64_t offset, size;
  };
  for (Range r : {Range{9901, 100}, Range{10000, 1}, Range{0, 10001}, Range{20000, 5}, Range{0, 0},
                  Range{UINT64_MAX - 10, 100}, Range{100, UINT64_MAX - 50}}) {
    SCOPED_TRACE(absl::StrCat(r.size, " bytes at ", r.offset));
    absl::Status up = acc->UploadSync(buffer, data.data(), r.size, r.offset);
    EXPECT_EQ(up.code(), absl::StatusCode::kOutOfRange) << up;
    EXPECT_THAT(Msg(up), HasSubstr(absl::StrCat(r.offset)));
    EXPECT_THAT(Msg(up), HasSubstr(absl::StrCat(size)));
    std::vector<uint8_t> out(64, 0xCD);
    absl::Status down = acc->DownloadSync(buffer, out.data(), r.size, r.offset);
    EXPECT_EQ(down.code(), absl::StatusCode::kOutOfRange) << down;
    EXPECT_THAT(Msg(down), HasSubstr(absl::StrCat(size)));
    EXPECT_EQ(std::count(out.begin(), out.end(), 0xCD), 64) << "the host memory was written";
  }
  // Async forms fail the same way, at once.
  Future<> up = acc->Upload(buffer, data.data(), 2, size - 1);
  EXPECT_TRUE(up.IsReady());
  EXPECT_EQ(up.Await().code(), absl::StatusCode::kOutOfRange);
  std::vector<uint8_t> all(size);
  ASSERT_OK(acc->DownloadSync(buffer, all.data(), size));
  EXPECT_TRUE(all == expected) << "a refused upload changed the buffer";
  EXPECT_OK(acc->health());
}

// Tests that ParseByteSize takes numbers with binary units and refuses other text.
TEST(MemoryTest, ParseByteSize) {
  struct Good {
    const char* text;
    uint64_t bytes;
  };
  for (Good g : {Good{"512MiB", 512 * kMiB}, Good{"1g", kGiB}, Good{"4096", 4096}, Good{"64 MiB", 64 * kMiB},
                 Good{"2GiB", 2 * kGiB}, Good{" 8k ", 8 * kKiB}, Good{"1.5KiB", 1536}, Good{"7b", 7},
                 Good{"3MB", 3 * kMiB}, Good{"1T", 1ull << 40}, Good{"0", 0}}) {
    auto v = ParseByteSize(g.text);
    ASSERT_TRUE(v.ok()) << "'" << g.text << "': " << v.status();
    EXPECT_EQ(*v, g.bytes) << "'" << g.text << "'";
  }
  for (const char* bad : {"abc", "12parsecs", "", "-1", "MiB", "1.2.3k", "12 34", "0x10"}) {
    auto v = ParseByteSize(bad);
    EXPECT_FALSE(v.ok()) << "'" << bad << "' gave " << (v.ok() ? *v : 0);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_THAT(Msg(v.status()), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

// Tests that ParseByteSize refuses sizes beyond 2^64 bytes instead of
// returning a wrapped or undefined value.
TEST(MemoryTest, ParseByteSizeRejectsOverflow) {
  for (const char* bad : {"20000000TiB", "18446744073709551616"}) {
    auto v = ParseByteSize(bad);
    EXPECT_FALSE(v.ok()) << "'" << bad << "' gave " << (v.ok() ? *v : 0);
    EXPECT_ERROR(v, absl::StatusCode::kInvalidArgument, absl::StrCat("byte size '", bad, "' is too large"));
  }
  // An exponent is not a unit: refused before any size is computed.
  EXPECT_ERROR(ParseByteSize("1e30"), absl::StatusCode::kInvalidArgument,
               "unknown unit 'e30' in byte size '1e30'");
}

// Tests the human-readable sizes that budget errors show.
TEST(MemoryTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(8 * kMiB), "8 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB), "3 GiB");
}

// Tests that CAUSEWAY_MEMORY_BUDGET sets the budget when the option is 0 and
// that the option wins over it.
TEST(MemoryTest, BudgetFromEnvironment) {
  {
    ScopedEnv env("CAUSEWAY_MEMORY_BUDGET", "24MiB");
    auto rt = MakeRuntime(TestOptions(1));
    ASSERT_NE(rt, nullptr);
    EXPECT_EQ(rt->plan().memory_budget, 24 * kMiB);
    Accelerator* acc = rt->accelerator(0);
    EXPECT_EQ(acc->memory_budget(), 24 * kMiB);
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(24 * kMiB));
    auto over = acc->CreateBuffer(1);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
    EXPECT_THAT(Msg(over.status()), HasSubstr("24 MiB"));
  }
  {
    ScopedEnv env("CAUSEWAY_MEMORY_BUDGET", "24MiB");
    RuntimeOptions options = TestOptions(2);
    options.memory_budget = 16 * kMiB;
    auto rt = MakeRuntime(options);
    ASSERT_NE(rt, nullptr);
    EXPECT_EQ(rt->accelerator(0)->memory_budget(), 16 * kMiB);
    EXPECT_EQ(rt->accelerator(1)->memory_budget(), 16 * kMiB);
  }
  {
    ScopedEnv env("CAUSEWAY_MEMORY_BUDGET", "lots");
    auto rt = Runtime::Create(TestOptions(1));
    ASSERT_FALSE(rt.ok());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument) << rt.status();
    EXPECT_THAT(Msg(rt.status()), HasSubstr("lots"));
  }
  {
    ScopedEnv env("CAUSEWAY_MEMORY_BUDGET", "0");
    auto rt = Runtime::Create(TestOptions(1));
    ASSERT_FALSE(rt.ok());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument) << rt.status();
  }
  // Unset, the budget is the device-local heap's share.
  ASSERT_EQ(std::getenv("CAUSEWAY_MEMORY_BUDGET"), nullptr);
  auto rt = MakeRuntime(TestOptions(2));
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->accelerator(0)->memory_budget(), rt->plan().device->DeviceLocalHeapSize() / 2);
}

// Tests the spare blocks: a buffer of its own block, freed, leaves the block
// (its memory held, not in use) for the next buffer of about its size; a
// buffer much smaller or larger does not take it; small buffers never land
// in it; no more than four are kept; and a new block that would take the
// memory held over the budget frees the spares first.
TEST(MemoryTest, SpareBlocksAreReusedAndBounded) {
  auto rt = MakeRuntimeWithBudget(256 * kMiB);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  MemoryPool& pool = acc->device_pool();

  ASSERT_OK_AND_ASSIGN(auto big, acc->CreateBuffer(48 * kMiB));
  const MemoryBlock* block = big->block();
  big.reset();
  EXPECT_EQ(acc->memory_in_use(), 0u);
  EXPECT_EQ(pool.bytes_spare(), 48 * kMiB);
  EXPECT_EQ(acc->memory_reserved(), 48 * kMiB);

  // A small buffer gets a standard block, not the spare.
  ASSERT_OK_AND_ASSIGN(auto small, acc->CreateBuffer(4096));
  EXPECT_NE(small->block(), block);
  EXPECT_EQ(pool.bytes_spare(), 48 * kMiB);
  // Too small (more than a quarter of the block would be idle): a new block.
  ASSERT_OK_AND_ASSIGN(auto b33, acc->CreateBuffer(33 * kMiB));
  EXPECT_NE(b33->block(), block);
  // About its size: the spare itself.
  ASSERT_OK_AND_ASSIGN(auto b38, acc->CreateBuffer(40 * kMiB));
  EXPECT_EQ(b38->block(), block);
  EXPECT_EQ(pool.bytes_spare(), 0u);
  EXPECT_EQ(acc->memory_in_use(), small->reserved_size() + b33->reserved_size() + b38->reserved_size());
  b33.reset();
  b38.reset();
  EXPECT_EQ(pool.bytes_spare(), 33 * kMiB + 48 * kMiB);

  // At most four spares: five freed blocks of 33..37 MiB leave four.
  small.reset();
  pool.ReleaseSpare();
  std::vector<std::shared_ptr<Buffer>> five;
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer((33 + i) * kMiB));
    five.push_back(b);
  }
  five.clear();
  EXPECT_LE(pool.bytes_spare(), 4 * 37 * kMiB);
  EXPECT_EQ(pool.block_count(), 4u + 1u);  // four spares and the standard block kept empty
  EXPECT_EQ(acc->memory_in_use(), 0u);

  // A 200 MiB block would take the memory held over the budget while the
  // spares are kept: they go first.
  ASSERT_OK_AND_ASSIGN(auto huge, acc->CreateBuffer(200 * kMiB));
  EXPECT_EQ(pool.bytes_spare(), 0u);
  EXPECT_EQ(acc->memory_reserved(), 200 * kMiB + kBlockSize);
  EXPECT_EQ(acc->memory_in_use(), 200 * kMiB);
  huge.reset();
  pool.ReleaseSpare();
  EXPECT_EQ(pool.bytes_spare(), 0u);
}

// Tests that a buffer never holds the bytes of a freed one: a small buffer
// (sub-allocated in a shared block) and a large one (a block of its own, kept
// as a spare) are filled, freed, and their ranges handed out again, which
// read as zeros. Buffers of different clients and sessions share an
// accelerator's pool, so without this one tenant could read another's data
// through an array it never wrote. A buffer whose first bytes its caller
// promises to overwrite (a receive's value) keeps them as they were, so a
// large value is not written twice, and only the rest (past the last whole
// word before them, on memory the host does not map) is zeroed.
// Both ways of zeroing run: memset where the host maps device memory, a
// fill on the queue where it does not (the discrete setting).
TEST(MemoryTest, FreedBytesNeverReachTheNextBuffer) {
  for (const std::string memory : {"auto", "discrete"}) {
    SCOPED_TRACE(memory);
    auto rt = MakeRuntimeWithBudget(256 * kMiB, memory);
    ASSERT_NE(rt, nullptr);
    Accelerator* acc = rt->accelerator(0);
    for (const auto [size, overwritten] :
         {std::pair{uint64_t{4096} + 12, uint64_t{0}}, std::pair{40 * kMiB, uint64_t{0}},
          std::pair{uint64_t{4096} + 12, uint64_t{4096} + 5}, std::pair{40 * kMiB, 40 * kMiB - 6}}) {
      SCOPED_TRACE(absl::StrCat(size, " bytes, ", overwritten, " to be overwritten"));
      const std::vector<uint8_t> secret = RandomBytes(size, 7);
      const MemoryBlock* block = nullptr;
      uint64_t offset = 0;
      {
        ASSERT_OK_AND_ASSIGN(auto first, acc->CreateBuffer(size));
        ASSERT_OK(acc->UploadSync(first, secret.data(), size));
        block = first->block();
        offset = first->block_offset();
      }
      ASSERT_OK_AND_ASSIGN(auto next, acc->CreateBuffer(size, overwritten));
      // The same bytes of the same block, or this test shows nothing.
      ASSERT_EQ(next->block(), block);
      ASSERT_EQ(next->block_offset(), offset);
      std::vector<uint8_t> got(size, 0xAB);
      ASSERT_OK(acc->DownloadSync(next, got.data(), size));
      EXPECT_EQ(std::count(got.begin() + overwritten, got.end(), 0),
                static_cast<std::ptrdiff_t>(size - overwritten))
          << "a new buffer holds a freed buffer's bytes";
      const uint64_t kept = overwritten / 4 * 4;
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + kept, secret.begin()))
          << "bytes the caller overwrites were zeroed first";
    }
  }
}

// Tests that a new buffer whose zeroing fill could not be submitted (memory
// the host does not map is zeroed on the queue) is refused, not handed out
// holding a freed buffer's bytes; the next one is zero.
TEST(MemoryTest, ABufferThatCouldNotBeZeroedIsRefused) {
  auto rt = MakeRuntimeWithBudget(64 * kMiB, "discrete");
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const uint64_t size = 4096 + 12;
  {
    ASSERT_OK_AND_ASSIGN(auto first, acc->CreateBuffer(size));
    const std::vector<uint8_t> secret = RandomBytes(size, 9);
    ASSERT_OK(acc->UploadSync(first, secret.data(), size));
  }
  ArmFault(FaultPoint::kSubmission, 1);
  absl::StatusOr<std::shared_ptr<Buffer>> refused = acc->CreateBuffer(size);
  const bool injected = FaultInjected();
  DisarmFaults();
  ASSERT_TRUE(injected);
  ASSERT_FALSE(refused.ok()) << "a buffer that was never zeroed was handed out";
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("zeroing a new buffer"));
  ASSERT_OK_AND_ASSIGN(auto next, acc->CreateBuffer(size));
  std::vector<uint8_t> got(size, 0xAB);
  ASSERT_OK(acc->DownloadSync(next, got.data(), size));
  EXPECT_EQ(got, std::vector<uint8_t>(size, 0));
}

// Tests the discrete setting (RuntimeOptions::device_memory): on a driver
// whose device memory the host could map (lavapipe), no device buffer is
// mapped, so every byte in or out goes through staging and device copies as
// on a discrete GPU, and they arrive exact; there is no copy engine; staging
// is still mapped. "auto" maps it, and any other value is refused, naming
// the setting.
TEST(MemoryTest, DiscreteDeviceMemoryIsNeverMapped) {
  auto mapped = MakeRuntimeWithBudget(64 * kMiB, "auto");
  ASSERT_NE(mapped, nullptr);
  ASSERT_OK_AND_ASSIGN(auto host_visible, mapped->accelerator(0)->CreateBuffer(4096));
  ASSERT_NE(host_visible->mapped(), nullptr) << "lavapipe's device memory is host-visible";
  EXPECT_FALSE(mapped->plan().discrete_memory);

  auto rt = MakeRuntimeWithBudget(64 * kMiB, "discrete");
  ASSERT_NE(rt, nullptr);
  EXPECT_TRUE(rt->plan().discrete_memory);
  Accelerator* acc = rt->accelerator(0);
  EXPECT_EQ(acc->copy_engine(), nullptr);
  for (const uint64_t size : {uint64_t{1}, uint64_t{4097}, 3 * kMiB + 5, 40 * kMiB}) {
    SCOPED_TRACE(size);
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(size));
    EXPECT_EQ(b->mapped(), nullptr);
    EXPECT_FALSE(b->host_coherent());
    const std::vector<uint8_t> bytes = RandomBytes(size, 11);
    ASSERT_OK(acc->UploadSync(b, bytes.data(), size));
    std::vector<uint8_t> got(size, 0xAB);
    ASSERT_OK(acc->DownloadSync(b, got.data(), size));
    EXPECT_EQ(got, bytes);
  }
  ASSERT_OK_AND_ASSIGN(auto staging, acc->CreateStagingBuffer(4096));
  EXPECT_NE(staging->mapped(), nullptr);

  RuntimeOptions bad = TestOptions(1);
  bad.device_memory = "unified";
  absl::StatusOr<std::unique_ptr<Runtime>> refused = Runtime::Create(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("CAUSEWAY_DEVICE_MEMORY"));
}

}  // namespace
}  // namespace causeway
