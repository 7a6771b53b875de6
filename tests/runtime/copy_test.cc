// Tests of copies between accelerators: exact bytes over every path, waits on
// producers on other VkDevices, chains, the import cache, and bad arguments.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "causeway/base/trace.h"
#include "causeway/kernels/ops.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/copy_engine.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::TestOptions;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1ull << 20;

// Deterministic pseudo-random bytes.
std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  if (i < n) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, n - i);
  }
  return out;
}

// Compares n bytes and names the first that differs.
::testing::AssertionResult SameBytes(const uint8_t* got, const uint8_t* want, size_t n,
                                     const std::string& what) {
  if (std::memcmp(got, want, n) == 0) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (got[i] == want[i]) ++i;
  size_t bad = 0;
  for (size_t j = i; j < n; ++j) bad += got[j] != want[j];
  return ::testing::AssertionFailure()
         << what << ": byte " << i << " of " << n << " is " << static_cast<int>(got[i]) << ", expected "
         << static_cast<int>(want[i]) << " (" << bad << " bytes differ)";
}

// The message of `s`, as a std::string that gMock prints readably.
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Accelerators on VkDevices of their own, whatever CAUSEWAY_SHARING says: the
// paths these tests choose between (imported memory or the host) are those
// between VkDevices.
std::unique_ptr<Runtime> MakeRuntimeWith(int accelerators, bool external_memory) {
  RuntimeOptions options = TestOptions(accelerators);
  options.sharing = "devices";
  options.use_external_memory = external_memory;
  return MakeRuntime(options);
}

// As MakeRuntimeWith(2, true), with device memory as the driver reports it
// whatever CAUSEWAY_DEVICE_MEMORY says: the copy engine copies between
// mapped buffers, and there is none where device memory is not mapped.
std::unique_ptr<Runtime> MakeEngineRuntime() {
  RuntimeOptions options = TestOptions(2);
  options.sharing = "devices";
  options.device_memory = "auto";
  return MakeRuntime(options);
}

// One copy: `size` bytes from src offset to dst offset.
struct CopyCase {
  uint64_t size;
  uint64_t src_offset;
  uint64_t dst_offset;
};

// Sizes from one byte to 64 MiB, at offsets that are odd, word-aligned and
// page-aligned (vkCmdCopyBuffer allows any offset).
const std::vector<CopyCase>& CopyCases() {
  static const auto* cases = new std::vector<CopyCase>{
      {1, 5, 3},
      {3, 1, 7},
      {4, 4, 8},
      {255, 17, 33},
      {4096, 4096, 256},
      {kMiB + 7, 3, 1001},
      {16 * kMiB, 12345, 77},
      {64 * kMiB, 9, 64 * 1024 + 1},
  };
  return *cases;
}

enum class Method {
  kAcceleratorCopy,
  kCommandListCopy,
  kKernelRead,  // a kernel on the destination's accelerator reads the source in place
  kCopyEngine,
};

// Copies `src` into `dst` by `method` after `waits`; the copy's future.
Future<> CopyBy(Method method, Accelerator* to, const BufferArg& src, const BufferArg& dst,
                std::vector<Future<>> waits = {}) {
  switch (method) {
    case Method::kAcceleratorCopy:
      return to->Copy(src, dst, waits);
    case Method::kCommandListCopy:
    case Method::kKernelRead: {
      auto list = to->CreateCommandList("copy-test");
      if (!list.ok()) return Future<>::Ready(list.status());
      absl::Status s;
      if (method == Method::kKernelRead) {
        // A one-operand fold: the operand's words, as they are (whole words only).
        if (src.offset % 4 != 0 || dst.offset % 4 != 0 || src.resolved_size() % 4 != 0) {
          return Future<>::Ready(absl::InvalidArgumentError("a kernel read moves whole words"));
        }
        s = ops::CombineN(**list, /*max=*/false, /*i32=*/true, {{src.buffer, src.offset / 4}},
                          {dst.buffer, dst.offset / 4}, src.resolved_size() / 4);
      } else {
        s = (*list)->Copy(src, dst);
      }
      if (!s.ok()) return Future<>::Ready(s);
      return to->Submit(*list, waits);
    }
    case Method::kCopyEngine:
      if (to->copy_engine() == nullptr) return Future<>::Ready(absl::FailedPreconditionError("no copy engine"));
      return to->copy_engine()->Copy(src.buffer, dst.buffer, {{src.offset, dst.offset, src.resolved_size()}},
                                     std::move(waits));
  }
  return Future<>::Ready(absl::InternalError("unknown method"));
}

// Bytes after each range, to see that nothing beyond it is written.
constexpr uint64_t kTail = 29;

// Copies `c` from a buffer on `from` to one on `to` and checks every byte of
// the destination buffer: the range holds the source bytes, the rest is as it
// was.
void CheckCopy(Accelerator* from, Accelerator* to, const CopyCase& c, Method method, uint64_t seed) {
  SCOPED_TRACE(absl::StrCat("copy of ", c.size, " bytes from ", from->index(), "@", c.src_offset, " to ",
                            to->index(), "@", c.dst_offset));
  const uint64_t src_size = c.src_offset + c.size + kTail;
  const uint64_t dst_size = c.dst_offset + c.size + kTail;
  std::vector<uint8_t> src_bytes = RandomBytes(src_size, seed);
  std::vector<uint8_t> dst_bytes = RandomBytes(dst_size, seed ^ 0x9e3779b97f4a7c15ull);
  ASSERT_OK_AND_ASSIGN(auto src, from->CreateBuffer(src_size));
  ASSERT_OK_AND_ASSIGN(auto dst, to->CreateBuffer(dst_size));
  ASSERT_OK(from->UploadSync(src, src_bytes.data(), src_size));
  ASSERT_OK(to->UploadSync(dst, dst_bytes.data(), dst_size));

  ASSERT_OK(CopyBy(method, to, BufferArg(src, c.src_offset, c.size), BufferArg(dst, c.dst_offset, c.size)).Await());

  std::vector<uint8_t> got(dst_size);
  ASSERT_OK(to->DownloadSync(dst, got.data(), dst_size));
  EXPECT_TRUE(SameBytes(got.data(), dst_bytes.data(), c.dst_offset, "bytes before the destination range"));
  EXPECT_TRUE(SameBytes(got.data() + c.dst_offset, src_bytes.data() + c.src_offset, c.size, "copied bytes"));
  EXPECT_TRUE(SameBytes(got.data() + c.dst_offset + c.size, dst_bytes.data() + c.dst_offset + c.size, kTail,
                        "bytes after the destination range"));
}

// Runs every copy case in both directions between accelerators 0 and 1.
void CheckAllCopies(Runtime& rt, Method method) {
  Accelerator* a = rt.accelerator(0);
  Accelerator* b = rt.accelerator(1);
  uint64_t seed = 1;
  for (const CopyCase& c : CopyCases()) {
    CheckCopy(a, b, c, method, seed++);
    if (::testing::Test::HasFatalFailure()) return;
    CheckCopy(b, a, c, method, seed++);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_EQ(a->memory_in_use(), 0u);
  EXPECT_EQ(b->memory_in_use(), 0u);
}

// Tests that with external memory on, accelerators on separate VkDevices copy
// through imported memory.
TEST(CopyTest, PathIsExternalMemoryWhenEnabled) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->plan().copy_path, CopyPath::kExternalMemory);
  EXPECT_EQ(rt->accelerator(1)->PathFrom(*rt->accelerator(0)), CopyPath::kExternalMemory);
  EXPECT_EQ(rt->accelerator(0)->PathFrom(*rt->accelerator(1)), CopyPath::kExternalMemory);
  EXPECT_EQ(rt->accelerator(0)->PathFrom(*rt->accelerator(0)), CopyPath::kSameQueue);
  EXPECT_STREQ(CopyPathName(CopyPath::kExternalMemory), "external-memory");
}

// Tests that with external memory off, copies between VkDevices go through the host.
TEST(CopyTest, PathIsHostStagedWhenExternalMemoryIsOff) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->plan().copy_path, CopyPath::kHostStaged);
  EXPECT_EQ(rt->accelerator(1)->PathFrom(*rt->accelerator(0)), CopyPath::kHostStaged);
  EXPECT_EQ(rt->accelerator(0)->PathFrom(*rt->accelerator(1)), CopyPath::kHostStaged);
  EXPECT_EQ(rt->accelerator(1)->PathFrom(*rt->accelerator(1)), CopyPath::kSameQueue);
  EXPECT_STREQ(CopyPathName(CopyPath::kHostStaged), "host-staged");
}

// Tests that Accelerator::Copy over external memory moves exactly the range's
// bytes, 1 B to 64 MiB, at odd offsets, both ways.
TEST(CopyTest, AcceleratorCopyExternalMemoryMovesExactBytes) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(rt->accelerator(1)->PathFrom(*rt->accelerator(0)), CopyPath::kExternalMemory);
  CheckAllCopies(*rt, Method::kAcceleratorCopy);
}

// Tests that CommandList::Copy over external memory moves exactly the range's
// bytes, 1 B to 64 MiB, at odd offsets, both ways.
TEST(CopyTest, CommandListCopyExternalMemoryMovesExactBytes) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  CheckAllCopies(*rt, Method::kCommandListCopy);
}

// Tests that the copy engine moves exactly the range's bytes, 1 B to 64 MiB
// (eight chunks), at odd offsets, both ways.
TEST(CopyTest, CopyEngineMovesExactBytes) {
  auto rt = MakeEngineRuntime();
  ASSERT_NE(rt, nullptr);
  ASSERT_NE(rt->accelerator(0)->copy_engine(), nullptr) << "lavapipe's device memory is host-coherent";
  CheckAllCopies(*rt, Method::kCopyEngine);
  EXPECT_EQ(rt->accelerator(1)->copy_engine()->copies(), CopyCases().size());
}

// Tests that Accelerator::Copy staged through the host moves exactly the
// range's bytes, 1 B to 64 MiB, at odd offsets, both ways.
TEST(CopyTest, AcceleratorCopyHostStagedMovesExactBytes) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(rt->accelerator(1)->PathFrom(*rt->accelerator(0)), CopyPath::kHostStaged);
  CheckAllCopies(*rt, Method::kAcceleratorCopy);
}

// Tests that copies within one accelerator (one queue) move exactly the
// range's bytes, 1 B to 64 MiB, at odd offsets.
TEST(CopyTest, SameQueueCopyMovesExactBytes) {
  auto rt = MakeRuntimeWith(1, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  uint64_t seed = 100;
  for (const CopyCase& c : CopyCases()) {
    CheckCopy(a, a, c, seed % 2 ? Method::kAcceleratorCopy : Method::kCommandListCopy, seed);
    ++seed;
    if (HasFatalFailure()) return;
  }
}

// Tests that a command list refuses a copy with no device path, pointing to
// Accelerator::Copy.
TEST(CopyTest, CommandListCopyHostStagedIsRefused) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  ASSERT_OK_AND_ASSIGN(auto src, a->CreateBuffer(64));
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(64));
  ASSERT_OK_AND_ASSIGN(auto list, b->CreateCommandList());
  absl::Status s = list->Copy(src, dst);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr("Accelerator::Copy"));
  EXPECT_EQ(list->size(), 0u);
}

// Fills `words` 32-bit words of a fresh buffer on `producer` with `word` and,
// without awaiting that, copies the buffer to `consumer` after it; checks the
// copy saw the filled words.
void CheckCopyAfterProducer(Accelerator* producer, Accelerator* consumer, uint32_t words, uint32_t word,
                            Method method) {
  SCOPED_TRACE(absl::StrCat("fill on ", producer->index(), ", copy to ", consumer->index(), ", word ", word));
  const uint64_t bytes = uint64_t{words} * 4;
  std::vector<uint8_t> zeros(bytes, 0);
  ASSERT_OK_AND_ASSIGN(auto src, producer->CreateBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(auto dst, consumer->CreateBuffer(bytes));
  ASSERT_OK(producer->UploadSync(src, zeros.data(), bytes));
  ASSERT_OK(consumer->UploadSync(dst, zeros.data(), bytes));

  ASSERT_OK_AND_ASSIGN(auto fill, producer->CreateCommandList("fill"));
  ASSERT_OK(ops::FillWords(*fill, src, words, word));
  Future<> produced = producer->Submit(fill);
  Future<> copied = CopyBy(method, consumer, src, dst, {produced});
  ASSERT_OK(copied.Await());
  EXPECT_TRUE(produced.IsReady());
  EXPECT_OK(produced.Await());

  std::vector<uint32_t> got(words);
  ASSERT_OK(consumer->DownloadSync(dst, got.data(), bytes));
  for (uint32_t i = 0; i < words; ++i) ASSERT_EQ(got[i], word) << "word " << i;
}

// Tests that a copy over external memory waiting on an unawaited fill on the
// other VkDevice (the host relay) sees the filled data, both ways.
TEST(CopyTest, ExternalMemoryCopyWaitsForProducerOnOtherDevice) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  for (uint32_t round = 0; round < 3; ++round) {
    CheckCopyAfterProducer(a, b, 4u << 20, 0xA0000000u + round, Method::kAcceleratorCopy);
    CheckCopyAfterProducer(b, a, 4u << 20, 0xB0000000u + round, Method::kAcceleratorCopy);
    CheckCopyAfterProducer(a, b, 4u << 20, 0xC0000000u + round, Method::kCommandListCopy);
    CheckCopyAfterProducer(b, a, 4u << 20, 0xD0000000u + round, Method::kCommandListCopy);
    CheckCopyAfterProducer(a, b, 4u << 20, 0xE0000000u + round, Method::kKernelRead);
    CheckCopyAfterProducer(b, a, 4u << 20, 0xF0000000u + round, Method::kKernelRead);
    // No copy engine where the host does not map device memory.
    ASSERT_EQ(b->copy_engine() == nullptr, rt->plan().discrete_memory);
    if (rt->plan().discrete_memory) continue;
    CheckCopyAfterProducer(a, b, 4u << 20, 0x30000000u + round, Method::kCopyEngine);
    CheckCopyAfterProducer(b, a, 4u << 20, 0x40000000u + round, Method::kCopyEngine);
  }
}

// Tests that a kernel reads buffers of other accelerators in place: combine_n
// on each accelerator in turn sums operands held by accelerators 0, 1 and 2
// (buffers placed after others in their memory blocks, at element offsets
// that are multiples of 4 and that are not) exactly as the CPU does, and the
// list counts the bytes it reads from peers.
TEST(CopyTest, KernelReadsPeerMemoryInPlace) {
  auto rt = MakeRuntimeWith(3, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(rt->accelerator(1)->PathFrom(*rt->accelerator(0)), CopyPath::kExternalMemory);
  constexpr uint32_t kWords = 5000;
  std::vector<std::vector<int32_t>> values;
  std::vector<std::shared_ptr<Buffer>> spacers, operands;
  for (int d = 0; d < 3; ++d) {
    Accelerator* acc = rt->accelerator(d);
    ASSERT_OK_AND_ASSIGN(auto spacer, acc->CreateBuffer(4096 + 64 * d));
    spacers.push_back(std::move(spacer));
    std::mt19937 gen(70 + d);
    std::uniform_int_distribution<int32_t> dist(-1000000, 1000000);
    values.emplace_back(kWords);
    for (int32_t& v : values.back()) v = dist(gen);
    ASSERT_OK_AND_ASSIGN(auto buffer, acc->CreateBuffer(kWords * 4));
    ASSERT_OK(acc->UploadSync(buffer, values.back().data(), kWords * 4));
    operands.push_back(std::move(buffer));
  }
  EXPECT_GT(operands[0]->block_offset(), 0u) << "a buffer at the start of its block tests no shift";
  for (uint64_t offset : {8, 13}) {
    for (int reader = 0; reader < 3; ++reader) {
      SCOPED_TRACE(absl::StrCat("accelerator ", reader, " reads at element ", offset));
      Accelerator* acc = rt->accelerator(reader);
      const uint64_t count = kWords - 16;
      ASSERT_OK_AND_ASSIGN(auto out, acc->CreateBuffer(count * 4));
      ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList("read-peers"));
      ASSERT_OK(ops::CombineN(*list, /*max=*/false, /*i32=*/true,
                              {{operands[0], offset}, {operands[1], offset}, {operands[2], offset}}, {out, 0},
                              count));
      // The two peers' ranges, each bound from an aligned offset at most
      // 256 bytes before it.
      EXPECT_GE(list->peer_read_bytes(), 2 * count * 4);
      EXPECT_LE(list->peer_read_bytes(), 2 * (count * 4 + 256));
      ASSERT_OK(acc->Submit(list).Await());
      std::vector<int32_t> got(count);
      ASSERT_OK(acc->DownloadSync(out, got.data(), count * 4));
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[i], values[0][offset + i] + values[1][offset + i] + values[2][offset + i]) << "element " << i;
      }
    }
  }
}

// Tests that a kernel never writes another accelerator's memory, and reads
// none it has no device path to (host-staged), with errors that name the
// binding, the accelerators and the path; nothing is appended.
TEST(CopyTest, KernelPeerBindingsRefused) {
  {
    auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
    ASSERT_NE(rt, nullptr);
    ASSERT_OK_AND_ASSIGN(auto mine, rt->accelerator(1)->CreateBuffer(256));
    ASSERT_OK_AND_ASSIGN(auto theirs, rt->accelerator(0)->CreateBuffer(256));
    ASSERT_OK_AND_ASSIGN(auto list, rt->accelerator(1)->CreateCommandList("write-peer"));
    absl::Status s = ops::CombineN(*list, false, false, {{mine, 0}}, {theirs, 0}, 64);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Msg(s), HasSubstr("binding 8 is written"));
    EXPECT_THAT(Msg(s), HasSubstr("accelerator 0"));
    EXPECT_EQ(list->size(), 0u);
  }
  auto rt = MakeRuntimeWith(2, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto mine, rt->accelerator(1)->CreateBuffer(256));
  ASSERT_OK_AND_ASSIGN(auto theirs, rt->accelerator(0)->CreateBuffer(256));
  ASSERT_OK_AND_ASSIGN(auto list, rt->accelerator(1)->CreateCommandList("read-staged"));
  ASSERT_OK_AND_ASSIGN(auto out, rt->accelerator(1)->CreateBuffer(256));
  absl::Status s = ops::CombineN(*list, false, false, {{mine, 0}, {theirs, 0}}, {out, 0}, 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr("binding 1"));
  EXPECT_THAT(Msg(s), HasSubstr("256 bytes on accelerator 0"));
  EXPECT_THAT(Msg(s), HasSubstr("host-staged"));
  EXPECT_EQ(list->size(), 0u);
}

// Tests that a host-staged copy waiting on an unawaited fill on the other
// VkDevice sees the filled data, both ways.
TEST(CopyTest, HostStagedCopyWaitsForProducerOnOtherDevice) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  for (uint32_t round = 0; round < 3; ++round) {
    CheckCopyAfterProducer(a, b, 4u << 20, 0x10000000u + round, Method::kAcceleratorCopy);
    CheckCopyAfterProducer(b, a, 4u << 20, 0x20000000u + round, Method::kAcceleratorCopy);
  }
}

// How long a test waits for work that should take well under a second before
// it calls it stuck.
constexpr absl::Duration kStuck = absl::Seconds(8);

// Ends work that can never finish, so that the runtime's teardown does not wait
// for it (30 s per accelerator): fails each accelerator that still has work in
// flight as if its device were lost, which also lets its queue drain.
void AbandonStuckWork(Runtime& rt) {
  for (Accelerator* acc : rt.accelerators()) {
    if (acc->in_flight() == 0) continue;
    acc->faults().lose_device_countdown = 1;
    (void)acc->Flush(absl::Now() + absl::Seconds(1));
  }
}

// Awaits `futures` in order, each for at most kStuck; true if all resolved
// OK. A future still unresolved then fails the test as a deadlock and ends the
// stuck work.
bool AwaitAll(Runtime& rt, const std::vector<Future<>>& futures, const std::string& what) {
  bool ok = true;
  for (size_t i = 0; i < futures.size(); ++i) {
    absl::Status s = futures[i].Await(absl::Now() + kStuck);
    if (absl::IsDeadlineExceeded(s)) {
      ADD_FAILURE() << what << ": step " << i << " did not finish in " << kStuck << " (deadlock)";
      AbandonStuckWork(rt);
      return false;
    }
    if (!s.ok()) {
      ADD_FAILURE() << what << ": step " << i << " failed: " << s;
      ok = false;
    }
  }
  return ok;
}

// Uploads a pattern to accelerator 0 and copies it 0->1->2->3, all submitted
// before anything is awaited; checks the last buffer.
void CheckChain(Runtime& rt) {
  ASSERT_EQ(rt.size(), 4u);
  const uint64_t size = 8 * kMiB + 5;
  std::vector<uint8_t> bytes = RandomBytes(size, 42);
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (Accelerator* acc : rt.accelerators()) {
    ASSERT_OK_AND_ASSIGN(auto b, acc->CreateBuffer(size));
    buffers.push_back(b);
  }
  std::vector<Future<>> steps;
  steps.push_back(rt.accelerator(0)->Upload(buffers[0], bytes.data(), size));
  for (size_t i = 1; i < 4; ++i) {
    steps.push_back(rt.accelerator(i)->Copy(buffers[i - 1], buffers[i], {steps.back()}));
  }
  if (!AwaitAll(rt, steps, "chain 0->1->2->3")) return;
  std::vector<uint8_t> got(size);
  ASSERT_OK(rt.accelerator(3)->DownloadSync(buffers[3], got.data(), size));
  EXPECT_TRUE(SameBytes(got.data(), bytes.data(), size, "bytes at the end of the chain"));
}

// Tests a chain of copies 0->1->2->3 over external memory submitted at once.
TEST(CopyTest, ExternalMemoryChainAcrossFourAccelerators) {
  auto rt = MakeRuntimeWith(4, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(rt->accelerator(3)->PathFrom(*rt->accelerator(2)), CopyPath::kExternalMemory);
  CheckChain(*rt);
}

// Tests a chain of host-staged copies 0->1->2->3 submitted at once: each copy
// waits on the future of the copy before it.
TEST(CopyTest, HostStagedChainAcrossFourAccelerators) {
  auto rt = MakeRuntimeWith(4, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(rt->accelerator(3)->PathFrom(*rt->accelerator(2)), CopyPath::kHostStaged);
  CheckChain(*rt);
}

// Copies a pattern from accelerator 0 to 1 and, without awaiting the copy,
// submits work on accelerator 1 that waits on it (a scale by 1.0 into a second
// buffer, then a download); checks both.
void CheckWorkAfterCopyOnDestination(Runtime& rt) {
  Accelerator* a = rt.accelerator(0);
  Accelerator* b = rt.accelerator(1);
  const uint32_t n = 1 << 20;
  const uint64_t bytes = uint64_t{n} * 4;
  std::vector<float> values = testing::RandomFloats(n, 9);
  ASSERT_OK_AND_ASSIGN(auto src, a->CreateBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(auto out, b->CreateBuffer(bytes));
  ASSERT_OK(a->UploadSync(src, values.data(), bytes));
  ASSERT_OK_AND_ASSIGN(auto scale, b->CreateCommandList("scale"));
  ASSERT_OK(ops::Scale(*scale, dst, out, n, 1.0f));

  std::vector<float> copied(n), scaled(n);
  std::vector<Future<>> steps;
  steps.push_back(b->Copy(src, dst));
  steps.push_back(b->Download(dst, copied.data(), bytes, 0, {steps[0]}));
  steps.push_back(b->Submit(scale, {steps[0]}));
  steps.push_back(b->Download(out, scaled.data(), bytes, 0, {steps[2]}));
  if (!AwaitAll(rt, steps, "copy, then work on the destination")) return;
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(copied[i], values[i]) << "copied value " << i;
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(scaled[i], values[i]) << "scaled value " << i;
}

// Tests that work on the destination waiting on an unawaited external-memory
// copy runs after it.
TEST(CopyTest, ExternalMemoryWorkAfterCopyOnDestination) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  CheckWorkAfterCopyOnDestination(*rt);
}

// Tests that work on the destination waiting on an unawaited host-staged copy
// runs after it.
TEST(CopyTest, HostStagedWorkAfterCopyOnDestination) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  CheckWorkAfterCopyOnDestination(*rt);
}

// Tests that copies from one source block share one import, and that freeing
// a block (here: a 40 MiB buffer's own block) drops its import.
TEST(CopyTest, ImportIsReusedPerBlockAndDroppedWithIt) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  ImportCache* imports = b->imports_for_peers();
  ASSERT_EQ(imports->size(), 0u);

  // Made first, so that no shared block exists yet: a block of its own.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Buffer> big, a->CreateBuffer(40 * kMiB));
  ASSERT_EQ(a->device_pool().block_count(), 1u);
  ASSERT_EQ(big->block()->size, big->reserved_size());
  // Two small buffers share another block.
  ASSERT_OK_AND_ASSIGN(auto small1, a->CreateBuffer(4096));
  ASSERT_OK_AND_ASSIGN(auto small2, a->CreateBuffer(4096));
  ASSERT_EQ(small1->block(), small2->block());
  ASSERT_NE(small1->block(), big->block());
  ASSERT_EQ(a->device_pool().block_count(), 2u);
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(48 * kMiB));

  // Copies from both small buffers, many times and in one list, import their
  // block once.
  std::vector<uint8_t> pattern = RandomBytes(4096, 7);
  ASSERT_OK(a->UploadSync(small1, pattern.data(), 4096));
  ASSERT_OK(a->UploadSync(small2, pattern.data(), 4096));
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(b->Copy(i % 2 ? small1 : small2, BufferArg(dst, 4096 * i, 4096)).Await());
    EXPECT_EQ(imports->size(), 1u) << "after copy " << i;
  }
  ASSERT_OK_AND_ASSIGN(auto list, b->CreateCommandList());
  ASSERT_OK(list->Copy(small1, BufferArg(dst, 0, 4096)));
  ASSERT_OK(list->Copy(BufferArg(small2, 1, 100), BufferArg(dst, 8192, 100)));
  EXPECT_EQ(imports->size(), 1u);
  for (int i = 0; i < 3; ++i) ASSERT_OK(b->Submit(list).Await());
  EXPECT_EQ(imports->size(), 1u);
  // Copies within b import nothing.
  ASSERT_OK(b->Copy(BufferArg(dst, 0, 4096), BufferArg(dst, 4096, 4096)).Await());
  EXPECT_EQ(imports->size(), 1u);
  EXPECT_EQ(a->imports_for_peers()->size(), 0u);

  // The big buffer's block is a second import, reused by a second copy.
  std::vector<uint8_t> big_bytes = RandomBytes(40 * kMiB, 8);
  ASSERT_OK(a->UploadSync(big, big_bytes.data(), big_bytes.size()));
  ASSERT_OK(b->Copy(BufferArg(big, 0, 4096), BufferArg(dst, 0, 4096)).Await());
  EXPECT_EQ(imports->size(), 2u);
  ASSERT_OK(b->Copy(BufferArg(big, 40 * kMiB - 4096, 4096), BufferArg(dst, 4096, 4096)).Await());
  EXPECT_EQ(imports->size(), 2u);

  // Release the buffer while a copy from it is in flight: the copy keeps it
  // alive; once the copy is done the block is kept as a spare, with its
  // import, for the next buffer of its size.
  const uint64_t big_block = big->block()->id;
  Future<> last = b->Copy(big, BufferArg(dst, 0, 40 * kMiB));
  big.reset();
  ASSERT_OK(last.Await());
  EXPECT_EQ(a->device_pool().bytes_spare(), 40 * kMiB);
  EXPECT_EQ(a->memory_in_use(), small1->reserved_size() + small2->reserved_size());
  EXPECT_EQ(imports->size(), 2u);
  std::vector<uint8_t> got(40 * kMiB);
  ASSERT_OK(b->DownloadSync(dst, got.data(), got.size()));
  EXPECT_TRUE(SameBytes(got.data(), big_bytes.data(), got.size(), "bytes copied from the released buffer"));

  // A buffer of about its size takes the spare block, and copies from it use
  // the import already made.
  ASSERT_OK_AND_ASSIGN(auto again, a->CreateBuffer(39 * kMiB));
  EXPECT_EQ(again->block()->id, big_block);
  EXPECT_EQ(a->device_pool().bytes_spare(), 0u);
  std::vector<uint8_t> again_bytes = RandomBytes(39 * kMiB, 9);
  ASSERT_OK(a->UploadSync(again, again_bytes.data(), again_bytes.size()));
  ASSERT_OK(b->Copy(again, BufferArg(dst, 0, 39 * kMiB)).Await());
  EXPECT_EQ(imports->size(), 2u);
  ASSERT_OK(b->DownloadSync(dst, got.data(), 39 * kMiB));
  EXPECT_TRUE(SameBytes(got.data(), again_bytes.data(), 39 * kMiB, "bytes copied from the reused block"));

  // Freed for good (the spares released), the block's import is dropped.
  again.reset();
  a->device_pool().ReleaseSpare();
  EXPECT_EQ(a->device_pool().bytes_spare(), 0u);
  EXPECT_EQ(imports->size(), 1u);
  EXPECT_EQ(a->device_pool().block_count(), 1u);

  // The small block's import still works.
  ASSERT_OK(b->Copy(small1, BufferArg(dst, 0, 4096)).Await());
  EXPECT_EQ(imports->size(), 1u);
  ASSERT_OK(b->DownloadSync(dst, got.data(), 4096));
  EXPECT_TRUE(SameBytes(got.data(), pattern.data(), 4096, "bytes copied from the small block"));
}

// Tests that copying from a peer's host-visible staging buffer works over
// external memory (the source may be any buffer of any accelerator).
TEST(CopyTest, ExternalMemoryCopyFromPeerStagingBuffer) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  std::vector<uint8_t> bytes = RandomBytes(1000, 3);
  ASSERT_OK_AND_ASSIGN(auto staging, a->CreateStagingBuffer(1000));
  std::memcpy(staging->mapped(), bytes.data(), bytes.size());
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(1000));
  ASSERT_OK(b->Copy(staging, dst).Await());
  std::vector<uint8_t> got(1000);
  ASSERT_OK(b->DownloadSync(dst, got.data(), got.size()));
  EXPECT_TRUE(SameBytes(got.data(), bytes.data(), got.size(), "bytes copied from the staging buffer"));
}

// Checks that bad copies into `b` fail with clear errors and that a good copy
// works afterwards.
void CheckBadCopies(Accelerator* a, Accelerator* b) {
  ASSERT_OK_AND_ASSIGN(auto src, a->CreateBuffer(4096));
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(4096));
  std::vector<uint8_t> bytes = RandomBytes(4096, 11);
  std::vector<uint8_t> before = RandomBytes(4096, 12);
  ASSERT_OK(a->UploadSync(src, bytes.data(), 4096));
  ASSERT_OK(b->UploadSync(dst, before.data(), 4096));

  {
    SCOPED_TRACE("sizes differ");
    absl::Status s = b->Copy(BufferArg(src, 0, 100), BufferArg(dst, 0, 99)).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Msg(s), HasSubstr("100"));
    EXPECT_THAT(Msg(s), HasSubstr("99"));
    EXPECT_THAT(Msg(s), HasSubstr("match"));
  }
  {
    SCOPED_TRACE("zero bytes");
    absl::Status s = b->Copy(BufferArg(src, 0, 0), BufferArg(dst, 0, 0)).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Msg(s), HasSubstr("source has 0 bytes, destination 0 (they must match and be > 0)"));
  }
  {
    SCOPED_TRACE("source range past the end");
    absl::Status s = b->Copy(BufferArg(src, 4000, 200), BufferArg(dst, 0, 200)).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_THAT(Msg(s), HasSubstr("outside"));
    EXPECT_THAT(Msg(s), HasSubstr("4096"));
  }
  {
    SCOPED_TRACE("destination range past the end");
    absl::Status s = b->Copy(BufferArg(src, 0, 200), BufferArg(dst, 4000, 200)).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_THAT(Msg(s), HasSubstr("outside"));
    EXPECT_THAT(Msg(s), HasSubstr("4096"));
  }
  {
    SCOPED_TRACE("source offset past the end");
    absl::Status s = b->Copy(BufferArg(src, 5000, VK_WHOLE_SIZE), BufferArg(dst, 0, 100)).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_THAT(Msg(s), HasSubstr("outside"));
  }
  {
    SCOPED_TRACE("destination on the copying accelerator's peer");
    absl::Status s = a->Copy(src, dst).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Msg(s), HasSubstr("destination"));
    EXPECT_THAT(Msg(s), HasSubstr("accelerator 1"));
    EXPECT_THAT(Msg(s), HasSubstr("accelerator 0"));
  }
  {
    SCOPED_TRACE("failed input");
    absl::Status s = b->Copy(src, dst, {Future<>::Ready(absl::DataLossError("producer broke"))}).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(Msg(s), HasSubstr("producer broke"));
  }
  {
    SCOPED_TRACE("null buffer");
    absl::Status s = b->Copy(BufferArg(nullptr), dst).Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Msg(s), HasSubstr("null"));
  }
  // Nothing was written, and both accelerators are healthy.
  std::vector<uint8_t> got(4096);
  ASSERT_OK(b->DownloadSync(dst, got.data(), 4096));
  EXPECT_TRUE(SameBytes(got.data(), before.data(), 4096, "destination after bad copies"));
  EXPECT_OK(a->health());
  EXPECT_OK(b->health());

  // A good copy afterwards works.
  ASSERT_OK(b->Copy(BufferArg(src, 1, 4000), BufferArg(dst, 3, 4000)).Await());
  ASSERT_OK(b->DownloadSync(dst, got.data(), 4096));
  EXPECT_TRUE(SameBytes(got.data() + 3, bytes.data() + 1, 4000, "good copy after bad ones"));
  EXPECT_TRUE(SameBytes(got.data(), before.data(), 3, "bytes before the good copy"));
  EXPECT_TRUE(SameBytes(got.data() + 4003, before.data() + 4003, 93, "bytes after the good copy"));
}

// Tests that bad Accelerator::Copy calls over external memory fail clearly.
TEST(CopyTest, BadCopiesExternalMemory) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  CheckBadCopies(rt->accelerator(0), rt->accelerator(1));
}

// Tests that bad Accelerator::Copy calls staged through the host fail clearly.
TEST(CopyTest, BadCopiesHostStaged) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/false);
  ASSERT_NE(rt, nullptr);
  CheckBadCopies(rt->accelerator(0), rt->accelerator(1));
}

// Tests that CommandList::Copy rejects bad copies when they are appended,
// including ranges whose end overflows 64 bits, and appends nothing.
TEST(CopyTest, BadCommandListCopiesAreRejectedAtAppend) {
  auto rt = MakeRuntimeWith(2, /*external_memory=*/true);
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  ASSERT_OK_AND_ASSIGN(auto src, a->CreateBuffer(4096));
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(4096));
  ASSERT_OK_AND_ASSIGN(auto list, b->CreateCommandList("bad"));

  absl::Status s = list->Copy(BufferArg(src, 0, 64), BufferArg(dst, 0, 65));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), HasSubstr("64"));
  EXPECT_THAT(Msg(s), HasSubstr("65"));

  s = list->Copy(BufferArg(src, 4095, 2), BufferArg(dst, 0, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_THAT(Msg(s), HasSubstr("outside"));

  s = list->Copy(src, BufferArg(dst, 1, VK_WHOLE_SIZE));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), HasSubstr("4096"));
  EXPECT_THAT(Msg(s), HasSubstr("4095"));

  // offset + size wraps around 2^64 to a value inside the buffer.
  const uint64_t huge = UINT64_MAX - 8;
  s = list->Copy(BufferArg(src, 16, huge), BufferArg(dst, 16, huge));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;

  ASSERT_OK_AND_ASSIGN(auto on_a, a->CreateCommandList("on a"));
  s = on_a->Copy(src, dst);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), HasSubstr("destination"));
  EXPECT_THAT(Msg(s), HasSubstr("accelerator 1"));
  EXPECT_EQ(on_a->size(), 0u);

  // Only the rejected commands are missing: the list is still usable (it is
  // never submitted with a bad command in it).
  if (list->size() != 0) GTEST_FAIL() << list->size() << " bad copies were appended";
  std::vector<uint8_t> bytes = RandomBytes(4096, 5);
  ASSERT_OK(a->UploadSync(src, bytes.data(), 4096));
  ASSERT_OK(list->Copy(src, dst));
  ASSERT_OK(b->Submit(list).Await());
  std::vector<uint8_t> got(4096);
  ASSERT_OK(b->DownloadSync(dst, got.data(), 4096));
  EXPECT_TRUE(SameBytes(got.data(), bytes.data(), 4096, "good copy after rejected ones"));
}

// --- The copy engine --------------------------------------------------------------------

// Tests that a copy engine's copy of several regions, each over several
// chunks, waits for a producer held back by a host gate, and that work on the
// destination waiting for the copy sees its bytes: nothing moves before the
// producer is done.
TEST(CopyTest, CopyEngineWaitsForItsInputAndGatesItsConsumer) {
  auto rt = MakeEngineRuntime();
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  CopyEngine engine("test engine", /*chunk_bytes=*/64 << 10);
  constexpr uint32_t kWords = 256 << 10;  // 1 MiB
  const uint64_t bytes = uint64_t{kWords} * 4;
  ASSERT_OK_AND_ASSIGN(auto src, a->CreateBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(auto out, b->CreateBuffer(bytes));
  const std::vector<float> zeros(kWords, 0.0f);
  ASSERT_OK(b->UploadSync(dst, zeros.data(), bytes));

  // The producer fills src with 3.0f, once the host lets it.
  auto [open, opened] = MakePromise();
  ASSERT_OK_AND_ASSIGN(auto fill, a->CreateCommandList("fill"));
  float three = 3.0f;
  uint32_t word;
  std::memcpy(&word, &three, 4);
  ASSERT_OK(ops::FillWords(*fill, src, kWords, word));
  Future<> produced = a->Submit(fill, {opened});
  // Two regions swap the halves; a third, unaligned, overlaps nothing else.
  const uint64_t half = bytes / 2;
  Future<> copied = engine.Copy(src, dst, {{0, half, half - 12}, {half, 0, half}, {half - 12, bytes - 12, 12}},
                                {produced});
  // The destination doubles what the copy brought.
  ASSERT_OK_AND_ASSIGN(auto twice, b->CreateCommandList("double"));
  ASSERT_OK(ops::Scale(*twice, dst, out, kWords, 2.0f));
  Future<> consumed = b->Submit(twice, {copied});

  EXPECT_FALSE(copied.IsReady()) << "the copy ran before its producer";
  EXPECT_FALSE(consumed.IsReady());
  // (Read through the mapping: a download would queue behind the consumer.)
  std::vector<float> early(kWords, -1.0f);
  ASSERT_NE(dst->mapped(), nullptr);
  std::memcpy(early.data(), dst->mapped(), bytes);
  EXPECT_EQ(early, zeros) << "bytes moved before the producer ran";

  open.Set(absl::OkStatus());
  ASSERT_OK(consumed.AwaitStatus(absl::Now() + kStuck));
  EXPECT_TRUE(copied.IsReady());
  std::vector<float> got(kWords);
  ASSERT_OK(b->DownloadSync(out, got.data(), bytes));
  for (uint32_t i = 0; i < kWords; ++i) ASSERT_EQ(got[i], 6.0f) << "word " << i;
  EXPECT_EQ(engine.copies(), 1u);
  EXPECT_EQ(engine.bytes_copied(), bytes);
}

// Tests that a copy whose input failed fails with that input's error and
// writes nothing, that work waiting on it fails too, and that the engine
// goes on with the next copy.
TEST(CopyTest, CopyEngineFailedInputFailsTheCopyAndWritesNothing) {
  auto rt = MakeEngineRuntime();
  ASSERT_NE(rt, nullptr);
  Accelerator* a = rt->accelerator(0);
  Accelerator* b = rt->accelerator(1);
  CopyEngine* engine = b->copy_engine();
  ASSERT_NE(engine, nullptr);
  const std::vector<uint8_t> src_bytes = RandomBytes(8192, 1), dst_bytes = RandomBytes(8192, 2);
  ASSERT_OK_AND_ASSIGN(auto src, a->CreateBuffer(8192));
  ASSERT_OK_AND_ASSIGN(auto dst, b->CreateBuffer(8192));
  ASSERT_OK(a->UploadSync(src, src_bytes.data(), 8192));
  ASSERT_OK(b->UploadSync(dst, dst_bytes.data(), 8192));

  // A real failure: the producer's submission fails in vkQueueSubmit.
  ASSERT_OK_AND_ASSIGN(auto fill, a->CreateCommandList("fill"));
  ASSERT_OK(ops::FillWords(*fill, src, 2048, 0));
  a->faults().fail_submit_countdown = 1;
  Future<> produced = a->Submit(fill);
  Future<> copied = engine->Copy(src, dst, {{0, 0, 8192}}, {produced});
  // (Work whose input fails after it was queued may still run: it writes
  // elsewhere, and its future carries the error.)
  ASSERT_OK_AND_ASSIGN(auto elsewhere, b->CreateBuffer(4096));
  ASSERT_OK_AND_ASSIGN(auto after, b->CreateCommandList("after"));
  ASSERT_OK(ops::FillWords(*after, elsewhere, 1, 0));
  Future<> consumer = b->Submit(after, {copied});

  absl::Status s = copied.AwaitStatus(absl::Now() + kStuck);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("an input of this copy failed"));
  EXPECT_EQ(s.code(), produced.AwaitStatus().code()) << s;
  EXPECT_FALSE(consumer.AwaitStatus(absl::Now() + kStuck).ok());
  std::vector<uint8_t> got(8192);
  ASSERT_OK(b->DownloadSync(dst, got.data(), 8192));
  EXPECT_TRUE(SameBytes(got.data(), dst_bytes.data(), 8192, "destination after a failed copy"));

  ASSERT_OK(engine->Copy(src, dst, {{0, 0, 8192}}, {}).AwaitStatus(absl::Now() + kStuck));
  ASSERT_OK(b->DownloadSync(dst, got.data(), 8192));
  EXPECT_TRUE(SameBytes(got.data(), src_bytes.data(), 8192, "the next copy"));
}

// Tests that the engine refuses, at once and with the range named, regions
// outside either buffer (also when offset + size wraps around 2^64).
TEST(CopyTest, CopyEngineRefusesRangesOutsideItsBuffers) {
  auto rt = MakeEngineRuntime();
  ASSERT_NE(rt, nullptr);
  CopyEngine* engine = rt->accelerator(1)->copy_engine();
  ASSERT_NE(engine, nullptr);
  ASSERT_OK_AND_ASSIGN(auto src, rt->accelerator(0)->CreateBuffer(4096));
  ASSERT_OK_AND_ASSIGN(auto dst, rt->accelerator(1)->CreateBuffer(1024));
  struct Case {
    CommandList::CopyRegion region;
    const char* names;
  };
  const Case cases[] = {{{4000, 0, 97}, "source range [4000, +97)"},
                        {{0, 1000, 25}, "destination range [1000, +25)"},
                        {{16, 16, UINT64_MAX - 8}, "source range"},
                        {{5000, 0, 0}, "source range [5000, +0)"}};
  for (const Case& c : cases) {
    Future<> f = engine->Copy(src, dst, {{0, 0, 16}, c.region}, {});
    ASSERT_TRUE(f.IsReady()) << c.names;
    absl::Status s = f.AwaitStatus();
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_THAT(Msg(s), HasSubstr(c.names));
  }
  EXPECT_EQ(engine->Copy(nullptr, dst, {}, {}).AwaitStatus().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->copies(), 0u);
}

// Tests that stopping an engine fails the copy it is waiting on and the ones
// queued behind it (Cancelled, naming the engine) within a bounded time, and
// every copy asked for afterwards at once.
TEST(CopyTest, CopyEngineStopFailsQueuedCopiesAndLaterOnes) {
  auto rt = MakeEngineRuntime();
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto src, rt->accelerator(0)->CreateBuffer(4096));
  ASSERT_OK_AND_ASSIGN(auto dst, rt->accelerator(1)->CreateBuffer(4096));
  auto engine = std::make_unique<CopyEngine>("stopped engine");
  auto [never, never_ready] = MakePromise();
  std::vector<Future<>> copies;
  for (int i = 0; i < 4; ++i) copies.push_back(engine->Copy(src, dst, {{0, 0, 4096}}, {never_ready}));
  const absl::Time start = absl::Now();
  engine->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (const Future<>& f : copies) {
    ASSERT_TRUE(f.IsReady());
    absl::Status s = f.AwaitStatus();
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_THAT(Msg(s), HasSubstr("stopped engine"));
  }
  absl::Status later = engine->Copy(src, dst, {{0, 0, 4096}}, {}).AwaitStatus(absl::Now() + kStuck);
  EXPECT_EQ(later.code(), absl::StatusCode::kCancelled) << later;
  EXPECT_EQ(engine->copies(), 0u);
  never.Set(absl::OkStatus());
}

// Tests that a traced copy shows one "copy-engine" span per chunk on the
// engine's own thread, whose bytes add up to the copy.
TEST(CopyTest, CopyEngineChunksAreTracedOnItsThread) {
  auto rt = MakeEngineRuntime();
  ASSERT_NE(rt, nullptr);
  CopyEngine engine("traced engine", /*chunk_bytes=*/1 << 20);
  const uint64_t bytes = (5 << 20) + 4096;  // five whole chunks and a part
  ASSERT_OK_AND_ASSIGN(auto src, rt->accelerator(0)->CreateBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(auto dst, rt->accelerator(1)->CreateBuffer(bytes));
  Tracer& tracer = Tracer::Get();
  (void)tracer.Take();
  tracer.Enable(true);
  absl::Status s = engine.Copy(src, dst, {{0, 0, bytes}}, {}).AwaitStatus(absl::Now() + kStuck);
  tracer.Enable(false);
  ASSERT_OK(s);
  std::vector<TraceEvent> events = tracer.Take();
  uint64_t traced = 0;
  int spans = 0, track = -1;
  for (const TraceEvent& e : events) {
    if (e.name != "copy-engine") continue;
    ++spans;
    EXPECT_EQ(e.kind, TraceEvent::kHost);
    EXPECT_LE(e.begin_ns, e.end_ns);
    if (track >= 0) {
      EXPECT_EQ(e.track, track) << "chunks on several threads";
    }
    track = e.track;
    uint64_t n = 0;
    ASSERT_EQ(std::sscanf(e.args.c_str(), "\"bytes\":%lu", &n), 1) << e.args;
    traced += n;
  }
  EXPECT_EQ(spans, 6);
  EXPECT_EQ(traced, bytes);
  EXPECT_EQ(tracer.ThreadNames()[track], "traced engine");
}

}  // namespace
}  // namespace causeway
