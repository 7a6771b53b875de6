// Values crossing islands: the inbox that matches arriving bytes with receive
// steps, and programs split over two islands of one process joined by local
// channels (send and receive steps in the gang order).
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/scheduler/inbox.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/local_channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;
using ::causeway::testing::ValueOrThrow;
using ::testing::HasSubstr;

constexpr absl::Duration kRunTimeout = absl::Seconds(20);

// Host-visible buffers standing in for receive staging.
std::vector<Channel::Target> Targets(Accelerator* acc, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  std::vector<Channel::Target> targets;
  for (auto [offset, size] : ranges) targets.push_back({offset, *acc->CreateStagingBuffer(size)});
  return targets;
}

std::vector<uint8_t> Bytes(const Channel::Target& t) {
  const uint8_t* p = static_cast<const uint8_t*>(t.staging->mapped());
  return std::vector<uint8_t>(p, p + t.staging->size());
}

std::vector<uint8_t> Pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed);
  return v;
}

// Tests that bytes arriving before and after the receive land in every target
// that holds them, across ranges that straddle targets.
TEST(InboxTest, EarlyAndLateBytesReachEveryTarget) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  const std::vector<uint8_t> value = Pattern(1000, 3);
  for (bool early : {true, false}) {
    Inbox inbox("test inbox");
    // Two halves, and a replica of the whole.
    auto targets = Targets(acc, {{0, 500}, {500, 500}, {0, 1000}});
    Future<> done;
    if (!early) done = inbox.Expect(7, 1000, targets);
    // Sender pieces in thirds: the middle one straddles the two halves.
    ASSERT_OK(inbox.Deliver(7, 0, 1000, value.data(), 333));
    ASSERT_OK(inbox.Deliver(7, 666, 1000, value.data() + 666, 334));
    if (!early) {
      EXPECT_FALSE(done.IsReady());
    }
    ASSERT_OK(inbox.Deliver(7, 333, 1000, value.data() + 333, 333));
    if (early) done = inbox.Expect(7, 1000, targets);
    ASSERT_OK(done.AwaitStatus(absl::Now() + kRunTimeout));
    EXPECT_EQ(Bytes(targets[0]), std::vector<uint8_t>(value.begin(), value.begin() + 500));
    EXPECT_EQ(Bytes(targets[1]), std::vector<uint8_t>(value.begin() + 500, value.end()));
    EXPECT_EQ(Bytes(targets[2]), value);
    EXPECT_EQ(inbox.pending(), 0u);
  }
}

// Tests that a value larger than the receive declared is refused from its
// header, before the inbox allocates anything for it, and that ranges whose
// end would wrap past 2^64 are refused.
TEST(InboxTest, ValueLargerThanTheReceiveIsRefusedBeforeAllocating) {
  Inbox inbox("bounded inbox", /*max_total=*/1000);
  const uint8_t bytes[2] = {1, 2};
  EXPECT_ERROR(inbox.Deliver(7, 0, uint64_t{1} << 62, bytes, 1), absl::StatusCode::kInvalidArgument,
               "bounded inbox: run 7", "4611686018427387904 bytes", "at most 1000");
  EXPECT_EQ(inbox.pending(), 0u);
  EXPECT_ERROR(inbox.Deliver(8, UINT64_MAX, 1000, bytes, 2), absl::StatusCode::kInvalidArgument,
               "run past the end");
  EXPECT_EQ(inbox.pending(), 0u);
  // Within the bound, early bytes are kept for the receive.
  ASSERT_OK(inbox.Deliver(9, 0, 1000, bytes, 2));
  EXPECT_EQ(inbox.pending(), 1u);
  // A bound lowered later holds for what comes next.
  inbox.set_max_total(0);
  EXPECT_ERROR(inbox.Deliver(10, 0, 2, bytes, 2), absl::StatusCode::kInvalidArgument, "at most 0");
}

// Tests that a receive dispatched while bytes are still being written into
// the inbox's own memory (they began before it) gets them once written.
TEST(InboxTest, ReceiveArrivingMidWriteGetsTheBytes) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  const std::vector<uint8_t> value = Pattern(4096, 9);
  Inbox inbox("test inbox");
  ASSERT_OK_AND_ASSIGN(Inbox::Slot first, inbox.Begin(3, 0, 2048, 4096));
  auto targets = Targets(acc, {{0, 4096}});
  Future<> done = inbox.Expect(3, 4096, targets);  // while `first` is open
  std::memcpy(first.data, value.data(), 2048);     // the writer goes on
  inbox.End(first);
  EXPECT_FALSE(done.IsReady());
  ASSERT_OK(inbox.Deliver(3, 2048, 4096, value.data() + 2048, 2048));
  ASSERT_OK(done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_EQ(Bytes(targets[0]), value);
  EXPECT_EQ(inbox.pending(), 0u);
}

// Tests that a receive expected while another thread still writes an early
// range leaves that range to its writer (whose End places it) and places
// the early bytes already in: it reads nothing the writer is writing (under
// ThreadSanitizer, a race).
TEST(InboxTest, ReceiveDuringAnEarlyWriteLeavesTheOpenRangeToItsWriter) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  const std::vector<uint8_t> value = Pattern(4096, 5);
  Inbox inbox("test inbox");
  ASSERT_OK(inbox.Deliver(4, 2048, 4096, value.data() + 2048, 2048));  // early, complete
  ASSERT_OK_AND_ASSIGN(Inbox::Slot open, inbox.Begin(4, 0, 2048, 4096));  // early, being written
  auto targets = Targets(acc, {{0, 4096}});
  std::thread writer([&] {
    for (int i = 0; i < 2048; ++i) open.data[i] = value[i];
  });
  Future<> done = inbox.Expect(4, 4096, targets);
  writer.join();
  EXPECT_FALSE(done.IsReady());
  inbox.End(open);
  ASSERT_OK(done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_EQ(Bytes(targets[0]), value);
  EXPECT_EQ(inbox.pending(), 0u);
}

// Tests that ranges outside the value, a disagreeing total and bytes sent
// twice are refused, and a failed run fails its receive whenever it comes.
TEST(InboxTest, RefusesBadRangesAndPropagatesFailure) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  Inbox inbox("channel 1 from island 'a'");
  std::vector<uint8_t> bytes(64);
  EXPECT_ERROR(inbox.Deliver(1, 60, 64, bytes.data(), 8), absl::StatusCode::kInvalidArgument, "8 bytes at offset 60",
               "channel 1 from island 'a'");
  EXPECT_ERROR(inbox.Deliver(1, UINT64_MAX - 2, 64, bytes.data(), 8), absl::StatusCode::kInvalidArgument);
  EXPECT_ERROR(inbox.Deliver(1, 0, 64, bytes.data(), 0), absl::StatusCode::kInvalidArgument);
  ASSERT_OK(inbox.Deliver(2, 0, 64, bytes.data(), 64));
  EXPECT_ERROR(inbox.Deliver(2, 0, 64, bytes.data(), 1), absl::StatusCode::kDataLoss, "bytes [0, 1)",
               "overlapping bytes [0, 64)");
  ASSERT_OK(inbox.Deliver(3, 0, 64, bytes.data(), 8));
  EXPECT_ERROR(inbox.Deliver(3, 8, 128, bytes.data(), 8), absl::StatusCode::kInvalidArgument, "128 bytes where 64");
  // Failed before its receive: the receive fails at once.
  inbox.Fail(4, absl::AbortedError("sender's run failed"));
  EXPECT_ERROR(inbox.Expect(4, 64, Targets(acc, {{0, 64}})).AwaitStatus(absl::Now() + kRunTimeout),
               absl::StatusCode::kAborted, "sender's run failed");
  // Failed while it waits.
  Future<> waiting = inbox.Expect(5, 64, Targets(acc, {{0, 64}}));
  inbox.Fail(5, absl::UnavailableError("peer lost"));
  EXPECT_ERROR(waiting.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kUnavailable, "peer lost");
  // Closed: what waits and what comes later fail.
  Future<> waiting2 = inbox.Expect(6, 64, Targets(acc, {{0, 64}}));
  inbox.Close(absl::UnavailableError("island 'a' lost"));
  EXPECT_ERROR(waiting2.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kUnavailable, "island 'a' lost");
  EXPECT_ERROR(inbox.Expect(8, 64, Targets(acc, {{0, 64}})).AwaitStatus(absl::Now() + kRunTimeout),
               absl::StatusCode::kUnavailable, "island 'a' lost");
  EXPECT_ERROR(inbox.Deliver(9, 0, 64, bytes.data(), 64), absl::StatusCode::kUnavailable);
}

// Tests that bytes sent twice, the same range or an overlapping one, fail
// the value with DataLoss whether they come before or after the receive:
// counted as received, they would complete it with bytes never sent.
TEST(InboxTest, BytesSentTwiceFailTheValue) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  const std::vector<uint8_t> value = Pattern(64, 1);
  for (bool early : {true, false}) {
    SCOPED_TRACE(early ? "before the receive" : "after the receive");
    Inbox inbox("channel 2 from island 'b'");
    Future<> same, overlap;
    if (!early) {
      same = inbox.Expect(1, 64, Targets(acc, {{0, 64}}));
      overlap = inbox.Expect(2, 64, Targets(acc, {{0, 64}}));
    }
    // The first half twice: 64 bytes counted, the second half never sent.
    ASSERT_OK(inbox.Deliver(1, 0, 64, value.data(), 32));
    EXPECT_ERROR(inbox.Deliver(1, 0, 64, value.data(), 32), absl::StatusCode::kDataLoss,
                 "channel 2 from island 'b': run 1 sent bytes [0, 32)", "overlapping bytes [0, 32)");
    // Overlapping the end of what came, then the start of what came.
    ASSERT_OK(inbox.Deliver(2, 16, 64, value.data() + 16, 16));
    ASSERT_OK(inbox.Deliver(2, 40, 64, value.data() + 40, 24));
    EXPECT_ERROR(inbox.Deliver(2, 24, 64, value.data() + 24, 24), absl::StatusCode::kDataLoss,
                 "bytes [24, 48)", "overlapping bytes [40, 64)");
    // Failed: what comes next for the run is refused with the same error.
    EXPECT_ERROR(inbox.Deliver(2, 0, 64, value.data(), 16), absl::StatusCode::kDataLoss, "bytes [24, 48)");
    if (early) {
      same = inbox.Expect(1, 64, Targets(acc, {{0, 64}}));
      overlap = inbox.Expect(2, 64, Targets(acc, {{0, 64}}));
    }
    EXPECT_ERROR(same.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kDataLoss, "bytes [0, 32)");
    EXPECT_ERROR(overlap.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kDataLoss,
                 "bytes [24, 48)");
    EXPECT_EQ(inbox.pending(), 0u);
    // Adjacent pieces in any order are one value, not an overlap.
    auto targets = Targets(acc, {{0, 64}});
    Future<> whole = inbox.Expect(3, 64, targets);
    for (uint64_t offset : {32, 0, 48, 16})
      ASSERT_OK(inbox.Deliver(3, offset, 64, value.data() + offset, 16));
    ASSERT_OK(whole.AwaitStatus(absl::Now() + kRunTimeout));
    EXPECT_EQ(Bytes(targets[0]), value);
    // Over: bytes sent again are refused, not kept for a receive to come.
    EXPECT_ERROR(inbox.Deliver(3, 0, 64, value.data(), 16), absl::StatusCode::kFailedPrecondition,
                 "run 3 has had its value");
    EXPECT_EQ(inbox.pending(), 0u);
  }
}

// Tests that a value sent in more separate pieces than an inbox keeps track
// of fails with ResourceExhausted, while one sent in order in as many pieces
// (each joining the last) is received.
TEST(InboxTest, AValueInTooManySeparatePiecesIsRefused) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  constexpr uint64_t kPieces = ByteRanges::kMaxPieces + 1;
  const std::vector<uint8_t> value = Pattern(2 * kPieces, 4);
  Inbox inbox("test inbox");
  // Every other byte: each piece stands alone.
  for (uint64_t i = 0; i < ByteRanges::kMaxPieces; ++i)
    ASSERT_OK(inbox.Deliver(1, 2 * i, value.size(), &value[2 * i], 1));
  EXPECT_ERROR(
      inbox.Deliver(1, 2 * ByteRanges::kMaxPieces, value.size(), &value[2 * ByteRanges::kMaxPieces], 1),
      absl::StatusCode::kResourceExhausted, "run 1 sent its value in more than 4096 separate pieces");
  // In order, byte by byte, each piece joins the last: one piece at a time.
  auto targets = Targets(acc, {{0, value.size()}});
  Future<> done = inbox.Expect(2, value.size(), targets);
  for (uint64_t i = 0; i < value.size(); ++i) ASSERT_OK(inbox.Deliver(2, i, value.size(), &value[i], 1));
  ASSERT_OK(done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_EQ(Bytes(targets[0]), value);
  EXPECT_EQ(inbox.pending(), 1u);  // run 1, failed, waits for its receive
}

// Tests that values come before their receives are charged to the budget
// given with their bytes: one past it fails its run with ResourceExhausted
// naming the budget, and the bytes are given back once placed, once their
// run fails, and when the inbox closes.
TEST(InboxTest, EarlyValuesAreChargedToTheSendersHostBudget) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  auto budget = std::make_shared<HostBudget>("peer 'p'", 1000);
  const std::vector<uint8_t> value = Pattern(600, 5);
  Inbox inbox("test inbox");
  auto begin = [&](uint64_t tag, uint64_t offset, uint64_t length) -> absl::Status {
    CAUSEWAY_ASSIGN_OR_RETURN(Inbox::Slot slot, inbox.Begin(tag, offset, length, value.size(), budget));
    std::memcpy(slot.data, value.data() + offset, length);
    inbox.End(slot);
    return absl::OkStatus();
  };
  ASSERT_OK(begin(1, 0, 100));
  EXPECT_EQ(budget->in_use(), 600u);
  EXPECT_ERROR(begin(2, 0, 100), absl::StatusCode::kResourceExhausted,
               "test inbox: run 2's value, come before its receive, needs 600 B of host memory, past the "
               "budget of peer 'p': 600 B of 1000 B in use");
  EXPECT_EQ(budget->in_use(), 600u);
  EXPECT_ERROR(inbox.Expect(2, value.size(), Targets(acc, {{0, 600}})).AwaitStatus(absl::Now() + kRunTimeout),
               absl::StatusCode::kResourceExhausted, "past the budget of peer 'p'");
  // Placed: given back, and the rest goes straight to the targets.
  auto targets = Targets(acc, {{0, 600}});
  Future<> done = inbox.Expect(1, value.size(), targets);
  EXPECT_EQ(budget->in_use(), 0u);
  ASSERT_OK(begin(1, 100, 500));
  ASSERT_OK(done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_EQ(Bytes(targets[0]), value);
  // Failed before its receive: given back at once.
  ASSERT_OK(begin(3, 0, 100));
  EXPECT_EQ(budget->in_use(), 600u);
  inbox.Fail(3, absl::AbortedError("the sender gave up"));
  EXPECT_EQ(budget->in_use(), 0u);
  // Closed: given back.
  ASSERT_OK(begin(4, 0, 100));
  EXPECT_EQ(budget->in_use(), 600u);
  inbox.Close(absl::UnavailableError("the sender is gone"));
  EXPECT_EQ(budget->in_use(), 0u);
}

// Tests that a run abandoning its value (it failed before its receive) has
// its receive fail with its own status only once the writer holding part of
// its target has ended, and that its later bytes are dropped without an
// error to the sender: they go nowhere, and nothing is written any more.
TEST(InboxTest, AbandonedValueWaitsForItsWriterAndDropsLaterBytes) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  const std::vector<uint8_t> value = Pattern(600, 9);
  Inbox inbox("test inbox");
  auto targets = Targets(acc, {{0, 600}});
  std::memset(targets[0].staging->mapped(), 0xEE, 600);
  Future<> received = inbox.Expect(1, value.size(), targets);
  ASSERT_OK_AND_ASSIGN(Inbox::Slot writing, inbox.Begin(1, 0, 200, value.size()));
  ASSERT_NE(writing.data, nullptr);
  inbox.Abandon(1, absl::DeadlineExceededError("run 1 passed its deadline"));
  // The writer still holds part of the target: not resolved yet.
  EXPECT_FALSE(received.IsReady());
  std::memcpy(writing.data, value.data(), 200);
  inbox.End(writing);
  EXPECT_ERROR(received.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kDeadlineExceeded,
               "run 1 passed its deadline");
  // Later bytes: a null slot (dropped), and Deliver succeeds writing nothing.
  ASSERT_OK_AND_ASSIGN(Inbox::Slot late, inbox.Begin(1, 200, 200, value.size()));
  EXPECT_EQ(late.data, nullptr);
  ASSERT_OK(inbox.Deliver(1, 400, value.size(), value.data() + 400, 200));
  std::vector<uint8_t> want(600, 0xEE);
  std::memcpy(want.data(), value.data(), 200);
  EXPECT_EQ(Bytes(targets[0]), want);
  EXPECT_EQ(inbox.pending(), 0u);
  // A value that has come is not abandoned after the fact.
  auto whole = Targets(acc, {{0, 600}});
  Future<> done = inbox.Expect(2, value.size(), whole);
  ASSERT_OK(inbox.Deliver(2, 0, value.size(), value.data(), value.size()));
  inbox.Abandon(2, absl::CancelledError("too late"));
  ASSERT_OK(done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_EQ(Bytes(whole[0]), value);
  // Another run's failure stays what its late bytes get.
  Future<> failed = inbox.Expect(3, value.size(), Targets(acc, {{0, 600}}));
  inbox.Fail(3, absl::AbortedError("the sender gave up"));
  EXPECT_ERROR(inbox.Begin(3, 0, 100, value.size()).status(), absl::StatusCode::kAborted,
               "the sender gave up");
  EXPECT_ERROR(failed.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kAborted,
               "the sender gave up");
}

// Tests that a range written after its receive, but straddling two targets
// (so held in a copy of the inbox's own until its End), is charged to the
// sender's budget while it is written: past the budget its run fails with
// ResourceExhausted; a range within one target is written in place, free.
TEST(InboxTest, RangesAcrossTargetsAreChargedWhileTheyAreWritten) {
  auto rt = MakeRuntime(1);
  Accelerator* acc = rt->accelerator(0);
  auto budget = std::make_shared<HostBudget>("peer 'p'", 300);
  const std::vector<uint8_t> value = Pattern(1000, 9);
  Inbox inbox("test inbox");
  auto targets = Targets(acc, {{0, 500}, {500, 500}});
  Future<> done = inbox.Expect(1, value.size(), targets);
  // Within the first target: in place, nothing charged.
  ASSERT_OK_AND_ASSIGN(Inbox::Slot in_place, inbox.Begin(1, 0, 400, value.size(), budget));
  EXPECT_EQ(in_place.data, static_cast<uint8_t*>(targets[0].staging->mapped()));
  EXPECT_EQ(budget->in_use(), 0u);
  std::memcpy(in_place.data, value.data(), 400);
  inbox.End(in_place);
  // Across both: charged from Begin to End.
  ASSERT_OK_AND_ASSIGN(Inbox::Slot across, inbox.Begin(1, 400, 200, value.size(), budget));
  EXPECT_EQ(budget->in_use(), 200u);
  std::memcpy(across.data, value.data() + 400, 200);
  inbox.End(across);
  EXPECT_EQ(budget->in_use(), 0u);
  ASSERT_OK(inbox.Deliver(1, 600, value.size(), value.data() + 600, 400));
  ASSERT_OK(done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_EQ(Bytes(targets[0]), std::vector<uint8_t>(value.begin(), value.begin() + 500));
  EXPECT_EQ(Bytes(targets[1]), std::vector<uint8_t>(value.begin() + 500, value.end()));

  // Past the budget: the run fails, and nothing stays charged.
  auto targets2 = Targets(acc, {{0, 500}, {500, 500}});
  Future<> failed = inbox.Expect(2, value.size(), targets2);
  EXPECT_ERROR(
      inbox.Begin(2, 100, 800, value.size(), budget).status(), absl::StatusCode::kResourceExhausted,
      "test inbox: run 2's 800 bytes at 100, across receive targets, needs 800 B of host memory, past "
      "the budget of peer 'p'");
  EXPECT_ERROR(failed.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kResourceExhausted,
               "past the budget of peer 'p'");
  EXPECT_EQ(budget->in_use(), 0u);
  EXPECT_EQ(inbox.pending(), 0u);
}

// Two islands in one process, each over a runtime of its own.
struct TwoIslands {
  std::unique_ptr<Runtime> rt_a, rt_b;
  std::unique_ptr<Island> a, b;
  std::shared_ptr<Client> ca, cb;
  TwoIslands(int devices_a, int devices_b) {
    rt_a = MakeRuntime(devices_a);
    rt_b = MakeRuntime(devices_b);
    IslandOptions oa, ob;
    oa.name = "a";
    ob.name = "b";
    a = ValueOrThrow(Island::Create(rt_a.get(), oa));
    b = ValueOrThrow(Island::Create(rt_b.get(), ob));
    ca = ValueOrThrow(a->Connect("controller"));
    cb = ValueOrThrow(b->Connect("controller"));
  }
  ~TwoIslands() {
    ca->Close();
    cb->Close();
  }
};

ArrayRef UploadArray(Client& c, const std::shared_ptr<Mesh>& mesh, const Shape& shape, Sharding sharding,
                     const std::vector<float>& host) {
  ArrayRef x = ValueOrThrow(c.CreateArray(mesh, shape, DType::kF32, sharding));
  EXPECT_OK(x->Upload(host.data(), host.size() * sizeof(float)));
  return x;
}

std::vector<float> DownloadArray(const ArrayRef& a) {
  std::vector<float> out(NumElements(a->shape()));
  EXPECT_OK(a->Download(out.data(), out.size() * sizeof(float)));
  return out;
}

// Tests a two-stage pipeline across islands with every sender/receiver
// layout pair that channels take (replicated or split(0), meshes of 1-3
// devices, pieces that straddle the receiver's shards), many runs in flight.
TEST(CrossIslandTest, PipelineMatchesReferenceForEveryLayout) {
  const int64_t n = 12 * 1024 + 12;  // divisible by 1, 2, 3 and 4
  for (int ma : {1, 2}) {
    for (int mb : {1, 3}) {
      for (bool split_a : {false, true}) {
        for (bool split_b : {false, true}) {
          SCOPED_TRACE(absl::StrCat("a: ", ma, split_a ? " split" : " replicated", "; b: ", mb,
                                    split_b ? " split" : " replicated"));
          TwoIslands t(ma, mb);
          auto mesh_a = ValueOrThrow(t.ca->AllocateMesh({ma}));
          auto mesh_b = ValueOrThrow(t.cb->AllocateMesh({mb}));
          const Sharding sa = split_a ? Sharding::Split(0) : Sharding::Replicated();
          const Sharding sb = split_b ? Sharding::Split(0) : Sharding::Replicated();
          auto channel = LocalChannel::Create("channel 1 from island 'a'");
          auto scale = ValueOrThrow(Function::Scale({split_a ? n / ma : n}, 3.0f));
          auto add = ValueOrThrow(Function::Elementwise("add", {split_b ? n / mb : n}));

          ProgramBuilder pa("stage-a");
          pa.Parameter("x", mesh_a, {n}, DType::kF32, sa);
          pa.Call("scale", scale, mesh_a, {"x"}, {"y"});
          pa.Send("send-y", "y", channel);
          ASSERT_OK_AND_ASSIGN(auto prog_a, pa.Build());
          ProgramBuilder pb("stage-b");
          pb.Parameter("z", mesh_b, {n}, DType::kF32, sb);
          pb.Receive("recv-y", mesh_b, "y", {n}, DType::kF32, sb, channel);
          pb.Call("add", add, mesh_b, {"y", "z"}, {"out"});
          pb.Output("out");
          ASSERT_OK_AND_ASSIGN(auto prog_b, pb.Build());
          ASSERT_OK_AND_ASSIGN(auto exe_a, t.ca->Load(prog_a));
          ASSERT_OK_AND_ASSIGN(auto exe_b, t.cb->Load(prog_b));

          // More than two runs, so that runs wait for instances (two in
          // flight per executable); fewer under a sanitizer (sanitizers.h).
          constexpr int kRuns = testing::Repeats(6, 3);
          std::vector<std::vector<float>> xs, zs;
          std::vector<Execution> runs_a, runs_b;
          // Each receiving run is queued before its sender: its devices wait.
          // (Both from one thread: with two runs in flight per executable,
          // Execute blocks on the run before last.)
          for (int r = 0; r < kRuns; ++r) {
            zs.push_back(RandomFloats(n, 100 + r));
            ArrayRef z = UploadArray(*t.cb, mesh_b, {n}, sb, zs.back());
            ASSERT_OK_AND_ASSIGN(Execution run_b, t.cb->Execute(exe_b, {z}, {.tag = 1000 + static_cast<uint64_t>(r)}));
            runs_b.push_back(run_b);
            xs.push_back(RandomFloats(n, r));
            ArrayRef x = UploadArray(*t.ca, mesh_a, {n}, sa, xs.back());
            ASSERT_OK_AND_ASSIGN(Execution run_a, t.ca->Execute(exe_a, {x}, {.tag = 1000 + static_cast<uint64_t>(r)}));
            runs_a.push_back(run_a);
          }
          for (int r = 0; r < kRuns; ++r) {
            ASSERT_OK(runs_a[r].Await(absl::Now() + kRunTimeout));
            ASSERT_OK(runs_b[r].Await(absl::Now() + kRunTimeout));
            std::vector<float> got = DownloadArray(runs_b[r].outputs[0]);
            for (int64_t i = 0; i < n; ++i) {
              ASSERT_EQ(got[i], xs[r][i] * 3.0f + zs[r][i]) << "run " << r << " element " << i;
            }
          }
          EXPECT_EQ(channel->inbox().pending(), 0u);
        }
      }
    }
  }
}

// Tests that two islands exchanging values both ways in every run (data
// parallelism across islands) never deadlock: each sends before it receives
// in its gang order, with 16 runs in flight.
TEST(CrossIslandTest, ExchangeBothWaysDoesNotDeadlock) {
  const int64_t n = 4096;
  TwoIslands t(2, 2);
  auto mesh_a = ValueOrThrow(t.ca->AllocateMesh({2}));
  auto mesh_b = ValueOrThrow(t.cb->AllocateMesh({2}));
  auto a_to_b = LocalChannel::Create("a->b");
  auto b_to_a = LocalChannel::Create("b->a");
  auto scale = ValueOrThrow(Function::Scale({n / 2}, 2.0f));
  auto add = ValueOrThrow(Function::Elementwise("add", {n / 2}));
  std::vector<std::shared_ptr<Executable>> exes;
  for (int side = 0; side < 2; ++side) {
    auto mesh = side == 0 ? mesh_a : mesh_b;
    ProgramBuilder b(side == 0 ? "a" : "b");
    b.Parameter("g", mesh, {n}, DType::kF32, Sharding::Split(0));
    b.Call("local", scale, mesh, {"g"}, {"mine"});
    // Added first, to show that the builder's order puts the receive where
    // it was added, not where it became ready.
    b.Send("send", "mine", side == 0 ? a_to_b : b_to_a);
    b.Receive("recv", mesh, "theirs", {n}, DType::kF32, Sharding::Split(0), side == 0 ? b_to_a : a_to_b);
    b.Call("sum", add, mesh, {"mine", "theirs"}, {"total"});
    b.Output("total");
    ASSERT_OK_AND_ASSIGN(auto prog, b.Build());
    // The send precedes the receive in the dispatch order.
    ASSERT_EQ(prog->steps()[1].kind, ProgramStep::kSend) << prog->DebugString();
    ASSERT_EQ(prog->steps()[2].kind, ProgramStep::kReceive) << prog->DebugString();
    exes.push_back(*(side == 0 ? t.ca : t.cb)->Load(prog));
  }
  constexpr int kRuns = 16;
  std::vector<std::vector<float>> ga, gb;
  std::vector<Execution> ra, rb;
  std::thread other([&] {
    for (int r = 0; r < kRuns; ++r) {
      ArrayRef g = UploadArray(*t.cb, mesh_b, {n}, Sharding::Split(0), RandomFloats(n, 500 + r));
      rb.push_back(*t.cb->Execute(exes[1], {g}));
    }
  });
  for (int r = 0; r < kRuns; ++r) {
    ga.push_back(RandomFloats(n, r));
    gb.push_back(RandomFloats(n, 500 + r));
    ArrayRef g = UploadArray(*t.ca, mesh_a, {n}, Sharding::Split(0), ga.back());
    ra.push_back(*t.ca->Execute(exes[0], {g}));
  }
  other.join();
  for (int r = 0; r < kRuns; ++r) {
    ASSERT_OK(ra[r].Await(absl::Now() + kRunTimeout));
    ASSERT_OK(rb[r].Await(absl::Now() + kRunTimeout));
    std::vector<float> got_a = DownloadArray(ra[r].outputs[0]), got_b = DownloadArray(rb[r].outputs[0]);
    for (int64_t i = 0; i < n; ++i) {
      const float want = 2.0f * ga[r][i] + 2.0f * gb[r][i];
      ASSERT_EQ(got_a[i], want) << "run " << r << " element " << i;
      ASSERT_EQ(got_b[i], want) << "run " << r << " element " << i;
    }
  }
}

// Island b of two, with a program on one device that receives y and outputs
// 2y, and its runs 1 and 2 queued (the first waits for its value).
struct TwoQueuedReceives {
  TwoIslands t{1, 1};
  std::shared_ptr<LocalChannel> channel = LocalChannel::Create("channel 1 from island 'a'");
  std::shared_ptr<Mesh> mesh;
  std::vector<Execution> runs;
  explicit TwoQueuedReceives(int64_t n) {
    mesh = ValueOrThrow(t.cb->AllocateMesh({1}));
    auto add = ValueOrThrow(Function::Elementwise("add", {n}));
    ProgramBuilder pb("stage-b");
    pb.Receive("recv", mesh, "y", {n}, DType::kF32, Sharding::Replicated(), channel);
    pb.Call("add", add, mesh, {"y", "y"}, {"out"});
    pb.Output("out");
    auto exe = ValueOrThrow(t.cb->Load(ValueOrThrow(pb.Build())));
    for (uint64_t tag : {1, 2}) runs.push_back(ValueOrThrow(t.cb->Execute(exe, {}, {.tag = tag})));
  }
};

// Tests that a lost sender fails the receiving runs with its status instead
// of hanging their devices, and that the receiving island keeps working.
TEST(CrossIslandTest, LostSenderFailsReceiversAndTheIslandGoesOn) {
  const int64_t n = 1024;
  TwoQueuedReceives q(n);
  // Both runs asked the channel for their values as they were queued.
  EXPECT_EQ(q.channel->inbox().pending(), 2u);
  EXPECT_FALSE(q.runs[0].state->Await(absl::Now()).ok());  // still waiting
  q.channel->Close(absl::UnavailableError("island 'a' (127.0.0.1:7001) was silent for 5s"));
  for (auto& run : q.runs) {
    EXPECT_ERROR(run.Await(absl::Now() + kRunTimeout), absl::StatusCode::kUnavailable, "island 'a'");
  }
  // The island still runs other programs on the same device.
  auto scale = ValueOrThrow(Function::Scale({n}, 2.0f));
  ProgramBuilder other("other");
  other.Parameter("x", q.mesh, {n}, DType::kF32);
  other.Call("scale", scale, q.mesh, {"x"}, {"y"});
  other.Output("y");
  auto exe2 = ValueOrThrow(q.t.cb->Load(*other.Build()));
  std::vector<float> x = RandomFloats(n, 1);
  ArrayRef xa = UploadArray(*q.t.cb, q.mesh, {n}, Sharding::Replicated(), x);
  ASSERT_OK_AND_ASSIGN(Execution run, q.t.cb->Execute(exe2, {xa}));
  ASSERT_OK(run.Await(absl::Now() + kRunTimeout));
  std::vector<float> got = DownloadArray(run.outputs[0]);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 2.0f * x[i]);
}

// Tests that a run's value goes straight into its own buffers even while the
// run is queued behind another that waits for its value: the bytes of the
// second run, sent first, need no copy in the inbox's host memory (here a
// budget of nothing, which such a copy would exceed), and both runs compute
// from the right bytes.
TEST(CrossIslandTest, QueuedRunsReceiveStraightIntoTheirBuffers) {
  const int64_t n = 1024;
  const uint64_t bytes = n * sizeof(float);
  TwoQueuedReceives q(n);
  auto none = std::make_shared<HostBudget>("peer 'a'", 0);
  std::vector<std::vector<float>> ys = {RandomFloats(n, 1), RandomFloats(n, 2)};
  for (uint64_t tag : {2, 1}) {
    ASSERT_OK_AND_ASSIGN(Inbox::Slot slot, q.channel->inbox().Begin(tag, 0, bytes, bytes, none));
    ASSERT_NE(slot.data, nullptr);
    std::memcpy(slot.data, ys[tag - 1].data(), bytes);
    q.channel->inbox().End(slot);
  }
  EXPECT_EQ(none->in_use(), 0u);
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK(q.runs[r].Await(absl::Now() + kRunTimeout));
    std::vector<float> got = DownloadArray(q.runs[r].outputs[0]);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 2.0f * ys[r][i]) << "run " << r << " element " << i;
  }
  EXPECT_EQ(q.channel->inbox().pending(), 0u);
}

// Tests that a received value is not zeroed before it comes (the receive
// writes every byte of it) and still never shows what its memory held:
// another tenant's freed array lies where the run's output goes, half the
// value comes, then the sender is lost. The output reads as the sender's
// error, not as the other tenant's bytes; a later run's value comes whole
// and reads as sent.
TEST(CrossIslandTest, AReceivedValueIsWrittenWholeOrNeverRead) {
  const int64_t n = 10 << 20;  // 40 MiB: a block of its own, reused whole
  const uint64_t bytes = n * sizeof(float);
  TwoIslands t(1, 1);
  auto mesh = ValueOrThrow(t.cb->AllocateMesh({1}));
  auto channel = LocalChannel::Create("channel 1 from island 'a'");
  ProgramBuilder pb("receive");
  pb.Receive("recv-x", mesh, "x", {n}, DType::kF32, Sharding::Replicated(), channel);
  pb.Output("x");
  ASSERT_OK_AND_ASSIGN(auto exe, t.cb->Load(ValueOrThrow(pb.Build())));

  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> other, t.b->Connect("other tenant"));
  auto other_mesh = ValueOrThrow(other->AllocateMesh({1}));
  std::vector<float> secret = RandomFloats(n, 5);
  for (float& v : secret) v += 2.0f;  // no zeros
  ArrayRef theirs = UploadArray(*other, other_mesh, {n}, Sharding::Replicated(), secret);
  ASSERT_OK(theirs->Await(absl::Now() + kRunTimeout));
  std::shared_ptr<Buffer> freed = ValueOrThrow(theirs->shard(0));
  const MemoryBlock* block = freed->block();
  const uint64_t offset = freed->block_offset();
  freed.reset();
  theirs->Release();

  ASSERT_OK_AND_ASSIGN(Execution lost, t.cb->Execute(exe, {}, {.tag = 1}));
  std::shared_ptr<Buffer> shard = ValueOrThrow(lost.outputs[0]->shard(0));
  // The same memory, or this test shows nothing.
  ASSERT_EQ(shard->block(), block);
  ASSERT_EQ(shard->block_offset(), offset);
  const std::vector<float> x = RandomFloats(n, 6);
  ASSERT_OK(channel->inbox().Deliver(1, 0, bytes, x.data(), bytes / 2));
  channel->Close(absl::UnavailableError("island 'a' was lost mid-value"));
  EXPECT_ERROR(lost.Await(absl::Now() + kRunTimeout), absl::StatusCode::kUnavailable, "lost mid-value");
  std::vector<float> got(n, -1.0f);
  EXPECT_ERROR(lost.outputs[0]->Download(got.data(), bytes), absl::StatusCode::kUnavailable,
               "lost mid-value");
  EXPECT_EQ(got, std::vector<float>(n, -1.0f)) << "a failed receive gave bytes to its tenant";
  if (const float* held = static_cast<const float*>(shard->mapped()); held != nullptr) {
    // What came, then what was there: the receive did not zero it first.
    EXPECT_TRUE(std::equal(held, held + n / 2, x.begin()));
    EXPECT_TRUE(std::equal(held + n / 2, held + n, secret.begin() + n / 2));
  }
  shard.reset();
  lost.outputs[0]->Release();

  auto channel2 = LocalChannel::Create("channel 2 from island 'a'");
  ProgramBuilder pb2("receive-again");
  pb2.Receive("recv-x", mesh, "x", {n}, DType::kF32, Sharding::Replicated(), channel2);
  pb2.Output("x");
  ASSERT_OK_AND_ASSIGN(auto exe2, t.cb->Load(ValueOrThrow(pb2.Build())));
  ASSERT_OK_AND_ASSIGN(Execution whole, t.cb->Execute(exe2, {}, {.tag = 2}));
  ASSERT_OK(channel2->inbox().Deliver(2, 0, bytes, x.data(), bytes));
  ASSERT_OK(whole.Await(absl::Now() + kRunTimeout));
  EXPECT_EQ(DownloadArray(whole.outputs[0]), x);
}

// Tests that runs dropped before their receive (their client closed) abandon
// the values they asked for: nothing waits in the inbox, and bytes sent
// after for them are dropped without failing the sender.
TEST(CrossIslandTest, RunsDroppedBeforeTheirReceiveAbandonTheirValues) {
  const int64_t n = 1024;
  const uint64_t bytes = n * sizeof(float);
  TwoQueuedReceives q(n);
  EXPECT_EQ(q.channel->inbox().pending(), 2u);
  q.t.cb->Close();
  for (auto& run : q.runs) EXPECT_FALSE(run.Await(absl::Now() + kRunTimeout).ok());
  EXPECT_EQ(q.channel->inbox().pending(), 0u);
  const std::vector<float> y = RandomFloats(n, 3);
  for (uint64_t tag : {1, 2}) {
    ASSERT_OK_AND_ASSIGN(Inbox::Slot slot, q.channel->inbox().Begin(tag, 0, bytes, bytes));
    EXPECT_EQ(slot.data, nullptr) << "run " << tag;
    ASSERT_OK(q.channel->inbox().Deliver(tag, 0, bytes, y.data(), bytes));
  }
  EXPECT_EQ(q.channel->inbox().pending(), 0u);
}

// Tests that a send from, and a receive into, memory the host reads and
// writes directly need no device submission: the bytes go between the
// arrays and the sockets, and the gang calls that carry them are in the
// gang order with no submission. Elsewhere (staging) each device submits
// its copy. Either way the value arrives whole.
TEST(CrossIslandTest, SendAndReceiveOfHostMemorySubmitNothing) {
  const int64_t n = 4096;
  TwoIslands t(1, 1);
  auto mesh_a = ValueOrThrow(t.ca->AllocateMesh({1}));
  auto mesh_b = ValueOrThrow(t.cb->AllocateMesh({1}));
  auto channel = LocalChannel::Create("channel 1 from island 'a'");
  ProgramBuilder pa("send");
  pa.Parameter("x", mesh_a, {n}, DType::kF32);
  pa.Send("send-x", "x", channel);
  ASSERT_OK_AND_ASSIGN(auto exe_a, t.ca->Load(ValueOrThrow(pa.Build())));
  ProgramBuilder pb("receive");
  pb.Receive("recv-x", mesh_b, "x", {n}, DType::kF32, Sharding::Replicated(), channel);
  pb.Output("x");
  ASSERT_OK_AND_ASSIGN(auto exe_b, t.cb->Load(ValueOrThrow(pb.Build())));
  const std::vector<float> x = RandomFloats(n, 4);
  ArrayRef xa = UploadArray(*t.ca, mesh_a, {n}, Sharding::Replicated(), x);
  const bool host_a = ValueOrThrow(xa->shard(0))->host_coherent();
  Accelerator* acc_a = mesh_a->device(0);
  Accelerator* acc_b = mesh_b->device(0);
  // Settle the upload first: what the runs submit is counted from here.
  ASSERT_OK(xa->ShardReady(0).AwaitStatus(absl::Now() + kRunTimeout));
  const uint64_t submitted_a = acc_a->submitted_value(), submitted_b = acc_b->submitted_value();
  t.a->scheduler().RecordOrder(true);
  t.b->scheduler().RecordOrder(true);
  constexpr int kRuns = 3;
  std::vector<ArrayRef> received;
  for (uint64_t tag = 1; tag <= kRuns; ++tag) {
    ASSERT_OK_AND_ASSIGN(Execution run_b, t.cb->Execute(exe_b, {}, {.tag = tag}));
    ASSERT_OK_AND_ASSIGN(Execution run_a, t.ca->Execute(exe_a, {xa}, {.tag = tag}));
    ASSERT_OK(run_a.Await(absl::Now() + kRunTimeout));
    ASSERT_OK(run_b.Await(absl::Now() + kRunTimeout));
    received.push_back(run_b.outputs[0]);
  }
  const bool host_b = ValueOrThrow(received[0]->shard(0))->host_coherent();
  EXPECT_EQ(acc_a->submitted_value() - submitted_a, host_a ? 0u : kRuns);
  EXPECT_EQ(acc_b->submitted_value() - submitted_b, host_b ? 0u : kRuns);
  for (const ArrayRef& r : received) EXPECT_EQ(DownloadArray(r), x);
  for (auto [island, host] : {std::pair{t.a.get(), host_a}, std::pair{t.b.get(), host_b}}) {
    std::vector<GangCall> order = island->scheduler().TakeOrder();
    ASSERT_EQ(order.size(), static_cast<size_t>(kRuns)) << island->name();
    for (const GangCall& call : order) EXPECT_EQ(call.submissions.size(), host ? 0u : 1u) << call.node;
  }
}

// Tests that a value crossing islands must have contiguous shards, and that
// send and receive nodes need a channel.
TEST(CrossIslandTest, BuilderRefusesWhatCannotCross) {
  TwoIslands t(2, 1);
  auto mesh = ValueOrThrow(t.ca->AllocateMesh({2}));
  auto channel = LocalChannel::Create("c");
  auto scale = ValueOrThrow(Function::Scale({8, 2}, 2.0f));
  ProgramBuilder b("bad");
  b.Parameter("x", mesh, {8, 4}, DType::kF32, Sharding::Split(1));
  b.Call("scale", scale, mesh, {"x"}, {"y"});
  b.Send("send", "y", channel);
  EXPECT_ERROR(b.Build().status(), absl::StatusCode::kInvalidArgument, "node 'send'", "split(axis 1",
               "replicated or split along array axis 0");
  ProgramBuilder c("no-channel");
  c.Receive("recv", mesh, "y", {8}, DType::kF32, Sharding::Replicated(), nullptr);
  c.Output("y");
  EXPECT_ERROR(c.Build().status(), absl::StatusCode::kInvalidArgument, "node 'recv'", "no channel");
}

}  // namespace
}  // namespace causeway
