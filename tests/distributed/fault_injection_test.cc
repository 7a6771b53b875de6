// Fault injection (causeway/base/fault_injection.h) walked over a representative
// program: two island servers and a controller in this process, over
// loopback. For every allocation, submission, send and receive the program
// makes, that one call fails, and the test checks that the error reaches the
// caller (no hang, no wrong result), that the islands go on serving, and that
// nothing is left behind: descriptors, threads, Vulkan objects, memory
// budget bytes, sessions.
#include "causeway/base/fault_injection.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/distributed/controller.h"
#include "causeway/distributed/island_server.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/vk_status.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/program_def.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_support.h"

namespace causeway::transport {
namespace {

using ::causeway::testing::CountEntries;
using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(20);
constexpr int kRows = 32, kCols = 32;

// No heartbeats, so the socket calls counted are the program's own and every
// walk reaches the same points. Every fault here closes a socket, which both
// ends see at once; a peer that went quiet instead would show as a
// DeadlineExceeded episode, which the walk fails.
ConnectionOptions QuietConnections() {
  ConnectionOptions options;
  options.heartbeat_interval = absl::Hours(1);
  options.peer_timeout = absl::Hours(2);
  return options;
}

// Two islands of two accelerators, each on a runtime of its own.
struct Islands {
  std::unique_ptr<Runtime> rt_a, rt_b;
  std::unique_ptr<IslandServer> a, b;

  std::vector<Accelerator*> accelerators() const {
    std::vector<Accelerator*> all = rt_a->accelerators();
    for (Accelerator* acc : rt_b->accelerators()) all.push_back(acc);
    return all;
  }
};

std::unique_ptr<Islands> StartIslands() {
  auto islands = std::make_unique<Islands>();
  islands->rt_a = MakeRuntime(2);
  islands->rt_b = MakeRuntime(2);
  if (islands->rt_a == nullptr || islands->rt_b == nullptr) return nullptr;
  for (auto [name, rt, server] : {std::tuple{"isl-a", islands->rt_a.get(), &islands->a},
                                  std::tuple{"isl-b", islands->rt_b.get(), &islands->b}}) {
    IslandServerOptions options;
    options.name = name;
    options.connection = QuietConnections();
    auto s = IslandServer::Create(rt, options);
    if (!s.ok()) {
      ADD_FAILURE() << s.status();
      return nullptr;
    }
    *server = *std::move(s);
  }
  return islands;
}

// The program: on island a (split by rows) t = (x + y) / 2; t crosses to
// island b, where u = t w and out = all-reduce(u) over b's two devices (u
// is replicated there, so out = 2 t w). Kernels, a transfer over DCN and a
// collective over ICI.
absl::StatusOr<ProgramDef> WalkProgram(int devices = 2) {
  CAUSEWAY_ASSIGN_OR_RETURN(auto add, Function::Elementwise("add", {kRows / devices, kCols}));
  CAUSEWAY_ASSIGN_OR_RETURN(auto half, Function::Scale({kRows / devices, kCols}, 0.5f));
  CAUSEWAY_ASSIGN_OR_RETURN(auto mm, Function::Matmul(kRows, kCols, kCols));
  ProgramDefBuilder b("walk");
  b.Mesh("a", {devices}).Mesh("b", {devices});
  b.Parameter("x", "a", {kRows, kCols}, DType::kF32, Sharding::Split(0));
  b.Parameter("y", "a", {kRows, kCols}, DType::kF32, Sharding::Split(0));
  b.Parameter("w", "b", {kCols, kCols});
  b.Call("sum", add, "a", {"x", "y"}, {"s"});
  b.Call("halve", half, "a", {"s"}, {"t"});
  b.Call("matmul", mm, "b", {"t", "w"}, {"u"});
  b.AllReduce("reduce", "b", "u", "out");
  b.Output("out");
  return b.Build();
}

std::vector<float> WalkReference(const std::vector<float>& x, const std::vector<float>& y,
                                 const std::vector<float>& w, int devices) {
  std::vector<float> t(x.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = (x[i] + y[i]) * 0.5f;
  std::vector<float> u = reference::Matmul(t, w, kRows, kCols, kCols);
  for (float& v : u) v *= static_cast<float>(devices);
  return u;
}

// One controller's whole life: connect, allocate, load, upload, two runs in
// flight at once, download and check both, disconnect. The first error, or
// OK once both results match the CPU. `devices`: per mesh, as `def` was made.
absl::Status RunEpisode(const Islands& islands, const ProgramDef& def, int seed, int devices = 2) {
  ControllerOptions options;
  options.connection = QuietConnections();
  options.call_timeout = kWait;
  CAUSEWAY_ASSIGN_OR_RETURN(
      auto c,
      Controller::Connect({islands.a->address().ToString(), islands.b->address().ToString()}, options));
  CAUSEWAY_ASSIGN_OR_RETURN(RemoteMesh ma, c->AllocateMesh(0, {devices}));
  CAUSEWAY_ASSIGN_OR_RETURN(RemoteMesh mb, c->AllocateMesh(1, {devices}));
  CAUSEWAY_ASSIGN_OR_RETURN(auto program, c->Load(def, {{"a", ma}, {"b", mb}}));
  CAUSEWAY_ASSIGN_OR_RETURN(RemoteArray w, c->CreateArray(mb, {kCols, kCols}, DType::kF32));
  const std::vector<float> wh = RandomFloats(kCols * kCols, seed);
  CAUSEWAY_RETURN_IF_ERROR(c->Upload(w, wh.data(), wh.size() * 4));
  struct Run {
    std::vector<float> want;
    RemoteRun run;
  };
  std::vector<Run> runs;
  for (int r = 0; r < 2; ++r) {
    std::vector<float> xh = RandomFloats(kRows * kCols, seed + 1 + 2 * r);
    std::vector<float> yh = RandomFloats(kRows * kCols, seed + 2 + 2 * r);
    CAUSEWAY_ASSIGN_OR_RETURN(RemoteArray x,
                              c->CreateArray(ma, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
    CAUSEWAY_ASSIGN_OR_RETURN(RemoteArray y,
                              c->CreateArray(ma, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
    CAUSEWAY_RETURN_IF_ERROR(c->Upload(x, xh.data(), xh.size() * 4));
    CAUSEWAY_RETURN_IF_ERROR(c->Upload(y, yh.data(), yh.size() * 4));
    CAUSEWAY_ASSIGN_OR_RETURN(RemoteRun run, c->Execute(program, {x, y, w}));
    runs.push_back({WalkReference(xh, yh, wh, devices), std::move(run)});
  }
  for (Run& r : runs) {
    CAUSEWAY_RETURN_IF_ERROR(r.run.done.AwaitStatus(absl::Now() + kWait));
    std::vector<float> got(kRows * kCols);
    CAUSEWAY_RETURN_IF_ERROR(c->Download(r.run.outputs[0], got.data(), got.size() * 4, absl::Now() + kWait));
    const double error = reference::MaxRelativeError(got, r.want);
    if (!(error < 1e-4)) return absl::DataLossError(absl::StrCat("wrong result: max relative error ", error));
  }
  return absl::OkStatus();
}

// What must come back to where it was once a controller has gone.
struct Held {
  int fds = 0, threads = 0;
  int64_t vulkan_objects = 0;
  std::vector<uint64_t> memory;  // per accelerator, in use
  size_t sessions = 0;
  bool operator==(const Held&) const = default;
  std::string ToString() const {
    return absl::StrCat("fds ", fds, ", threads ", threads, ", Vulkan objects ", vulkan_objects, ", memory [",
                        absl::StrJoin(memory, " "), "], sessions ", sessions);
  }
};

Held Measure(const Islands& islands) {
  Held h;
  h.fds = CountEntries("/proc/self/fd");
  h.threads = CountEntries("/proc/self/task");
  h.vulkan_objects = LiveVulkanObjects();
  for (Accelerator* acc : islands.accelerators()) h.memory.push_back(acc->memory_in_use());
  h.sessions = islands.a->sessions() + islands.b->sessions();
  return h;
}

// Waits (sessions closing, threads ending, devices retiring released work)
// until what is held equals `want`, or kWait; returns what it saw last.
Held SettleTo(const Islands& islands, const Held& want) {
  const absl::Time deadline = absl::Now() + kWait;
  Held now;
  do {
    for (Accelerator* acc : islands.accelerators()) (void)acc->Flush(absl::Now() + kWait);
    now = Measure(islands);
    if (now == want) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  return now;
}

// What is held once nothing changes any more (sessions of a controller that
// has gone closed, their threads ended): the same for half a second.
Held Quiesce(const Islands& islands) {
  const absl::Time deadline = absl::Now() + kWait;
  Held last = Measure(islands);
  int same = 0;
  while (same < 10 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    for (Accelerator* acc : islands.accelerators()) (void)acc->Flush(absl::Now() + kWait);
    Held now = Measure(islands);
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

// Tests the injector itself: counting, arming, the string form.
TEST(FaultInjectionTest, ArmsTheNthCallAtOnePoint) {
  CountFaultPoints();
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(ShouldInjectFault(FaultPoint::kSend));
  EXPECT_EQ(FaultPointCalls(FaultPoint::kSend), 3);
  EXPECT_EQ(FaultPointCalls(FaultPoint::kReceive), 0);
  ASSERT_OK(ArmFaultFromString("receive:2"));
  EXPECT_FALSE(ShouldInjectFault(FaultPoint::kSend));
  EXPECT_FALSE(ShouldInjectFault(FaultPoint::kReceive));
  EXPECT_FALSE(FaultInjected());
  EXPECT_TRUE(ShouldInjectFault(FaultPoint::kReceive));
  EXPECT_TRUE(FaultInjected());
  EXPECT_FALSE(ShouldInjectFault(FaultPoint::kReceive));  // once only
  EXPECT_THAT(std::string(InjectedFaultError(absl::StatusCode::kUnavailable, FaultPoint::kReceive, "read").message()),
              HasSubstr("injected fault: receive 2"));
  DisarmFaults();
  EXPECT_FALSE(ShouldInjectFault(FaultPoint::kReceive));
  EXPECT_ERROR(ArmFaultFromString("disk:3"), absl::StatusCode::kInvalidArgument, "unknown point 'disk'");
  EXPECT_ERROR(ArmFaultFromString("send:0"), absl::StatusCode::kInvalidArgument, "N >= 1");
  EXPECT_ERROR(ArmFaultFromString("send"), absl::StatusCode::kInvalidArgument, "POINT:N");
  ASSERT_OK(ArmFaultFromString(""));
}

// Tests the device-wait fault point over the same program: the Nth wait on
// a device, on whichever accelerator makes it, reports the device lost. A
// lost accelerator is out of service for good, so each N gets islands of its
// own (1, 2 and at most 12 Ns spread over the episode's count: a pair of
// islands costs a second or more). The controller sees the loss as
// Unavailable naming the accelerator, or nothing when the work the loss
// failed had already been delivered; never a hang or a wrong result; that accelerator alone is out
// of service; and the next controller is served on the rest of the islands
// (meshes of one device, which avoid the lost one).
TEST(FaultInjectionTest, EachDeviceWaitOfAProgramLosesOneAcceleratorAndNothingElse) {
  ASSERT_OK_AND_ASSIGN(ProgramDef def, WalkProgram());
  ASSERT_OK_AND_ASSIGN(ProgramDef small, WalkProgram(1));
  // The count, on islands warmed as every N's are.
  int64_t calls = 0;
  {
    auto islands = StartIslands();
    ASSERT_NE(islands, nullptr);
    ASSERT_OK(RunEpisode(*islands, def, 1));
    Quiesce(*islands);
    CountFaultPoints();
    ASSERT_OK(RunEpisode(*islands, def, 1));
    calls = FaultPointCalls(FaultPoint::kDeviceWait);
    DisarmFaults();
  }
  ASSERT_GT(calls, 0);
  // Most waits are time slices (WaitAndRetire), so how many an episode
  // makes follows how loaded the machine is: under a sanitizer and a full
  // suite, an episode can make a fraction of the waits the counted one made.
  // So the Ns are 1, 2 and a geometric spread over the count, the last
  // among them: most fall where any episode reaches (its first submissions
  // and transfers), a few late. Fewer under a sanitizer (sanitizers.h).
  constexpr int64_t kSpread = testing::Repeats(12, 4);
  std::vector<int64_t> ns = {1, 2};
  for (int64_t i = 0; i < kSpread; ++i) {
    const double at = std::pow(static_cast<double>(calls), static_cast<double>(i) / (kSpread - 1));
    ns.push_back(std::clamp<int64_t>(std::llround(at), 1, calls));
  }
  std::sort(ns.begin(), ns.end());
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  int injected = 0, failed = 0;
  for (int64_t n : ns) {
    SCOPED_TRACE(absl::StrCat("device wait ", n, " of ", calls));
    auto islands = StartIslands();
    ASSERT_NE(islands, nullptr);
    ASSERT_OK(RunEpisode(*islands, def, 1));
    // The islands end the first controller's session after it has gone;
    // the walk counts waits from the episode's own first.
    Quiesce(*islands);
    ArmFault(FaultPoint::kDeviceWait, n);
    const absl::Status status = RunEpisode(*islands, def, static_cast<int>(10 + n));
    const bool hit = FaultInjected();
    DisarmFaults();
    EXPECT_FALSE(absl::IsDeadlineExceeded(status)) << status;
    EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr("wrong result")));
    if (!hit) {
      // Every episode makes at least two waits: each island's work is
      // waited for.
      EXPECT_GT(n, 2) << "the episode made fewer than " << n << " device waits";
      EXPECT_OK(status);
      continue;
    }
    ++injected;
    std::printf("device wait %lld: %s\n", static_cast<long long>(n), status.ToString().c_str());
    std::vector<std::string> lost;
    for (Accelerator* acc : islands->accelerators()) {
      if (absl::Status health = acc->health(); !health.ok()) {
        lost.push_back(std::string(health.message()));
        EXPECT_THAT(lost.back(), HasSubstr(absl::StrCat(acc->name(), " is lost: ")));
        EXPECT_THAT(lost.back(), HasSubstr("VK_ERROR_DEVICE_LOST"));
      }
    }
    EXPECT_EQ(lost.size(), 1u) << absl::StrJoin(lost, "; ");
    // The first wait is on work every later step of the episode needs.
    if (n == 1) {
      EXPECT_FALSE(status.ok()) << "the first device wait's loss did not reach the controller";
    }
    if (!status.ok()) {
      ++failed;
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr(" is lost: ")) << status;
    }
    const absl::Status next = RunEpisode(*islands, small, 2, 1);
    EXPECT_TRUE(next.ok()) << next << "; after the loss: " << status;
    if (::testing::Test::HasFailure()) return;
  }
  std::printf(
      "device wait: %zu of %lld points walked, %d faults injected, %d reached the controller as errors\n",
      ns.size(), static_cast<long long>(calls), injected, failed);
  // Whether a later loss reaches the controller depends on whether the
  // work it fails was already delivered, which follows the load: either is
  // right, as long as nothing else is lost and the next controller is served.
}

// Tests every fault point of the program, one at a time: the Nth
// allocation, submission, send and receive for every N the program reaches.
TEST(FaultInjectionTest, EveryFaultPointOfAProgramOverTwoIslands) {
  // A lost device (kDeviceWait) quarantines its accelerator for good, so the
  // islands could not serve the next controller in full after it: that point
  // is walked on islands of its own (the test above).
  constexpr int kWalkedPoints = static_cast<int>(FaultPoint::kDeviceWait);
  auto islands = StartIslands();
  ASSERT_NE(islands, nullptr);
  ASSERT_OK_AND_ASSIGN(ProgramDef def, WalkProgram());

  // A first episode warms what stays (pipelines, the links between the
  // islands, the protobuf runtime); what is held after it is the baseline.
  ASSERT_OK(RunEpisode(*islands, def, 1));
  const Held baseline = Quiesce(*islands);
  CountFaultPoints();
  ASSERT_OK(RunEpisode(*islands, def, 1));
  int64_t calls[kWalkedPoints];
  for (int p = 0; p < kWalkedPoints; ++p) calls[p] = FaultPointCalls(static_cast<FaultPoint>(p));
  DisarmFaults();
  {
    Held settled = SettleTo(*islands, baseline);
    ASSERT_EQ(settled, baseline) << "without faults: " << settled.ToString() << "; baseline " << baseline.ToString();
  }
  for (int p = 0; p < kWalkedPoints; ++p) {
    ASSERT_GT(calls[p], 0) << FaultPointName(static_cast<FaultPoint>(p));
  }

  // CAUSEWAY_FAULT_WALK=POINT:N walks that point only, from N on (to study
  // one).
  int only_point = -1;
  int64_t only_n = 0;
  if (const char* only = std::getenv("CAUSEWAY_FAULT_WALK"); only != nullptr) {
    ASSERT_OK(ArmFaultFromString(only));
    for (int p = 0; p < kWalkedPoints; ++p) {
      if (absl::StartsWith(only, FaultPointName(static_cast<FaultPoint>(p)))) only_point = p;
    }
    only_n = std::atoll(std::strchr(only, ':') + 1);
    DisarmFaults();
  }
  int walked = 0;
  for (int p = 0; p < kWalkedPoints; ++p) {
    const FaultPoint point = static_cast<FaultPoint>(p);
    if (only_point >= 0 && p != only_point) continue;
    int failed = 0, injected = 0;
    int64_t first_missed = 0;  // the first point the walk armed and did not reach
    for (int64_t n = only_point >= 0 ? only_n : 1; n <= calls[p]; ++n) {
      SCOPED_TRACE(absl::StrCat(FaultPointName(point), " ", n, " of ", calls[p]));
      ArmFault(point, n);
      const absl::Status status = RunEpisode(*islands, def, static_cast<int>(10 + n));
      const bool hit = FaultInjected();
      DisarmFaults();
      if (std::getenv("CAUSEWAY_FAULT_WALK_VERBOSE") != nullptr) {
        std::printf("%s %lld: %s\n", FaultPointName(point), static_cast<long long>(n), status.ToString().c_str());
        std::fflush(stdout);
      }
      ++walked;
      injected += hit;
      if (!hit && first_missed == 0) first_missed = n;
      // Never a hang (every wait above has a deadline), never a wrong result.
      EXPECT_FALSE(absl::IsDeadlineExceeded(status)) << status;
      EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr("wrong result")));
      if (!hit) EXPECT_OK(status);
      failed += !status.ok();
      // The islands lost nothing: the next controller is served in full, and
      // then everything is back where it was.
      const absl::Status next = RunEpisode(*islands, def, 2);
      EXPECT_TRUE(next.ok()) << next << "; after the fault: " << status;
      Held settled = SettleTo(*islands, baseline);
      EXPECT_EQ(settled, baseline) << "after " << status << ": " << settled.ToString() << "; baseline "
                                   << baseline.ToString();
      if (::testing::Test::HasFailure()) return;
    }
    if (only_point >= 0) return;
    std::printf("%s: %lld points walked, %d faults injected, %d reached the controller as errors\n",
                FaultPointName(point), static_cast<long long>(calls[p]), injected, failed);
    // Every point the program counted was reached again, and its failure
    // was seen by the controller (a fault off the program's path, e.g. on a
    // link after the last result, may pass unnoticed; most may not). Only
    // the walk's last two points may go unreached: a connection's reader
    // starts its read of the next frame after the last one it got, and
    // whether it had when the counted episode ended is a matter of timing
    // (seen: receive 130 counted, 129 reached).
    EXPECT_TRUE(first_missed == 0 || first_missed > calls[p] - 2)
        << FaultPointName(point) << " " << first_missed << " of " << calls[p] << " was not reached";
    EXPECT_GE(injected, calls[p] - 2) << FaultPointName(point);
    EXPECT_GT(failed, calls[p] / 2) << FaultPointName(point);
  }
  std::printf("%d fault points walked\n", walked);
}

}  // namespace
}  // namespace causeway::transport
