// Run deadlines, cancellation and quarantined accelerators: a run past its
// deadline fails naming what it was doing, an accelerator its work still
// holds is taken out of service (and only that one), a lost device does the
// same, and a cancelled run (or a closed client's) dispatches nothing more.
//
// The long kernel here (test_support.h) is sized to run about 4 s on this
// machine's CPU driver, longer than any deadline below, unless released:
// Spin::Release writes the release word through the output's mapping and the
// kernel ends within a round. Tests release it before the runtime goes.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/fault_injection.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/kernel.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::HasSubstr;

constexpr absl::Duration kRunTimeout = absl::Seconds(20);

// lavapipe runs the dispatches of every VkDevice on one shared pool of
// threads; with LP_NUM_THREADS=0 each queue runs its dispatches on its own
// thread. Set before any Vulkan instance exists. Even so, lavapipe (Mesa
// 22.3) runs the compute dispatches of a process's VkDevices one at a time:
// while the spin kernel runs, the other accelerator's
// dispatches wait for it, so the other client below is checked for correct
// results around the kernel, not for progress during it; that needs a GPU.
const bool kQueueThreadsOwnDispatches = setenv("LP_NUM_THREADS", "0", 1) == 0;

// The spin kernel as a function (input: one i32, unused; output: 65 i32,
// word 0 the release): about 4 s of work unless released, longer than any
// deadline here.
absl::StatusOr<std::shared_ptr<const Function>> SpinFunction() {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Kernel> kernel,
                            Kernel::FromGlsl("spin", testing::kSpinGlsl));
  KernelStep step;
  step.kernel = kernel;
  step.args = {0, 1};
  step.groups = {4096, 1, 1};
  step.push_constants = testing::SpinPushConstants(testing::SpinRoundsFor(4096, absl::Seconds(4)));
  return Function::Create("spin", {{{1}, DType::kI32}}, {{{65}, DType::kI32}}, {}, {step});
}

// A program of one gang call running the spin kernel on `mesh`.
absl::StatusOr<std::shared_ptr<const Program>> SpinProgram(const std::shared_ptr<Mesh>& mesh) {
  CAUSEWAY_ASSIGN_OR_RETURN(auto fn, SpinFunction());
  ProgramBuilder b("spinner");
  b.Parameter("x", mesh, {1}, DType::kI32);
  b.Call("spin", fn, mesh, {"x"}, {"out"});
  b.Output("out");
  return b.Build();
}

// A spin kernel's run. Release writes the magic into the run's output,
// which the kernel reads atomically each round: it ends within a round.
struct Spin {
  Execution run;
  std::shared_ptr<Buffer> out;
  void Release() const {
    std::atomic_ref<uint32_t>(*static_cast<uint32_t*>(out->mapped())).store(testing::kSpinReleaseMagic);
  }
  // Releases the kernel and waits until `acc`'s queue is idle (until the
  // kernel has ended, however it ends). Only for a
  // quarantined accelerator: it submits nothing more and waits on nothing,
  // so nothing else touches its queue meanwhile.
  void ReleaseAndDrain(Accelerator& acc) const {
    Release();
    vkQueueWaitIdle(acc.queue());
  }
};

absl::StatusOr<Spin> StartSpin(Client& client, const std::shared_ptr<Executable>& exe, const ArrayRef& x,
                               const ExecuteOptions& options = {}) {
  Spin spin;
  CAUSEWAY_ASSIGN_OR_RETURN(spin.run, client.Execute(exe, {x}, options));
  CAUSEWAY_ASSIGN_OR_RETURN(spin.out, spin.run.outputs[0]->shard(0));
  if (!spin.out->host_coherent()) {
    spin.Release();  // not reached on lavapipe; a device without mapped memory cannot run this test
    return absl::FailedPreconditionError("the spin kernel's output is not mapped host-coherent");
  }
  return spin;
}

absl::StatusOr<ArrayRef> SpinInput(Client& client, const std::shared_ptr<Mesh>& mesh) {
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef x, client.CreateArray(mesh, {1}, DType::kI32));
  const int32_t zero = 0;
  CAUSEWAY_RETURN_IF_ERROR(x->Upload(&zero, sizeof(zero)));
  return x;
}

// y = a + b on `mesh`, checked against the CPU; `seed` varies the inputs.
absl::Status AddAndCheck(Client& client, const std::shared_ptr<Mesh>& mesh, int seed) {
  constexpr int kN = 4096;
  CAUSEWAY_ASSIGN_OR_RETURN(auto add, Function::Elementwise("add", {kN}));
  ProgramBuilder b(absl::StrCat("add-", seed));
  b.Parameter("a", mesh, {kN}, DType::kF32);
  b.Parameter("b", mesh, {kN}, DType::kF32);
  b.Call("add", add, mesh, {"a", "b"}, {"y"});
  b.Output("y");
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Program> program, b.Build());
  CAUSEWAY_ASSIGN_OR_RETURN(auto exe, client.Load(program));
  const std::vector<float> ah = reference::RandomFloats(kN, seed), bh = reference::RandomFloats(kN, seed + 1);
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef a, client.CreateArray(mesh, {kN}, DType::kF32));
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef bb, client.CreateArray(mesh, {kN}, DType::kF32));
  CAUSEWAY_RETURN_IF_ERROR(a->Upload(ah.data(), ah.size() * sizeof(float)));
  CAUSEWAY_RETURN_IF_ERROR(bb->Upload(bh.data(), bh.size() * sizeof(float)));
  CAUSEWAY_ASSIGN_OR_RETURN(Execution run, client.Execute(exe, {a, bb}));
  CAUSEWAY_RETURN_IF_ERROR(run.Await(absl::Now() + kRunTimeout));
  std::vector<float> got(kN);
  CAUSEWAY_RETURN_IF_ERROR(run.outputs[0]->Download(got.data(), got.size() * sizeof(float)));
  for (int i = 0; i < kN; ++i) {
    if (got[i] != ah[i] + bh[i]) return absl::InternalError(absl::StrCat("wrong result at ", i));
  }
  return absl::OkStatus();
}

// Waits until `acc` is quarantined, or `limit` passes.
bool AwaitQuarantine(const Accelerator& acc, absl::Duration limit) {
  const absl::Time until = absl::Now() + limit;
  while (!acc.quarantined() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  return acc.quarantined();
}

// Tests that a kernel running past its run's 1 s deadline fails the run with
// DeadlineExceeded naming the program, gang call, kernel and accelerator; that
// its accelerator is quarantined (its later work fails fast with Unavailable,
// new meshes avoid it) while a second client on the island's other
// accelerator runs correctly throughout.
TEST(DeadlineTest, LongKernelFailsAtItsDeadlineAndOthersGoOn) {
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto spinner, island->Connect("spinner"));
  ASSERT_OK_AND_ASSIGN(auto other, island->Connect("other"));
  ASSERT_OK_AND_ASSIGN(auto spin_mesh, spinner->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto other_mesh, other->AllocateMesh({1}));
  Accelerator* stuck = spin_mesh->device(0);
  ASSERT_NE(stuck, other_mesh->device(0));
  ASSERT_OK_AND_ASSIGN(auto program, SpinProgram(spin_mesh));
  ASSERT_OK_AND_ASSIGN(auto exe, spinner->Load(program));
  ASSERT_OK_AND_ASSIGN(ArrayRef x, SpinInput(*spinner, spin_mesh));

  ExecuteOptions options;
  options.deadline = absl::Seconds(1);
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(Spin spin, StartSpin(*spinner, exe, x, options));
  // However the test ends, the kernel ends with it, and before the runtime
  // goes (which would otherwise abandon the quarantined queue after a second).
  absl::Cleanup release = [&spin, stuck] { spin.ReleaseAndDrain(*stuck); };
  const Execution& run = spin.run;
  // The other client runs before and after the deadline (on lavapipe its
  // dispatches wait for the kernel; see kQueueThreadsOwnDispatches).
  int other_runs = 0;
  while (absl::Now() < start + absl::Milliseconds(800)) {
    ASSERT_OK(AddAndCheck(*other, other_mesh, ++other_runs));
  }
  const absl::Status status = run.Await(absl::Now() + kRunTimeout);
  const absl::Duration waited = absl::Now() - start;
  // From the deadline watch ("passed its deadline ... had not finished"), or
  // from the accelerator when its quarantine came first ("ran on ... for").
  EXPECT_ERROR(status, absl::StatusCode::kDeadlineExceeded, "program 'spinner'", "deadline of 1.00 s",
               "gang call 'spin'", "kernel 'spin'", stuck->name());
  // The run's own deadline ended the wait, not the kernel; the slack is for
  // a loaded machine (the deadline thread and this one being scheduled).
  EXPECT_GE(waited, absl::Seconds(1));
  EXPECT_LT(waited, absl::Seconds(1) + testing::kSchedulingSlack);

  // Its work still holds the accelerator: quarantined, and the output says so.
  ASSERT_TRUE(AwaitQuarantine(*stuck, testing::kSchedulingSlack)) << "the accelerator was not quarantined";
  EXPECT_ERROR(stuck->health(), absl::StatusCode::kUnavailable, stuck->name(), "is quarantined",
               "kernel 'spin'", "held it for", "past its limit of 1.00 s");
  EXPECT_ERROR(run.outputs[0]->Await(absl::Now() + kRunTimeout), absl::StatusCode::kDeadlineExceeded,
               "kernel 'spin'", "ran on", stuck->name(), "quarantined");
  // Later work there fails fast, naming it; the other accelerator is untouched.
  EXPECT_FALSE(other_mesh->device(0)->quarantined());
  ASSERT_OK_AND_ASSIGN(Execution later, spinner->Execute(exe, {x}));
  EXPECT_ERROR(later.Await(absl::Now() + absl::Seconds(5)), absl::StatusCode::kUnavailable, stuck->name(),
               "is quarantined");
  for (int r = 0; r < 3; ++r) ASSERT_OK(AddAndCheck(*other, other_mesh, 100 + r));
  // New meshes avoid it.
  EXPECT_ERROR(spinner->AllocateMesh({2}).status(), absl::StatusCode::kResourceExhausted, "1 out of service",
               "is quarantined");
  ASSERT_OK_AND_ASSIGN(auto fresh, spinner->AllocateMesh({1}));
  EXPECT_EQ(fresh->device(0), other_mesh->device(0));
  EXPECT_GE(other_runs, 1);
}

// Tests that a run whose deadline passes while its work waits in the queue
// behind another client's long kernel fails with DeadlineExceeded, but
// quarantines nothing: its work never held the accelerator, and runs once
// the queue moves.
TEST(DeadlineTest, QueuedRunPastItsDeadlineQuarantinesNothing) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto spinner, island->Connect("spinner"));
  ASSERT_OK_AND_ASSIGN(auto hurried, island->Connect("hurried"));
  ASSERT_OK_AND_ASSIGN(auto spin_mesh, spinner->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto program, SpinProgram(spin_mesh));
  ASSERT_OK_AND_ASSIGN(auto exe, spinner->Load(program));
  ASSERT_OK_AND_ASSIGN(ArrayRef spin_x, SpinInput(*spinner, spin_mesh));

  ASSERT_OK_AND_ASSIGN(auto mesh, hurried->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto scale, Function::Scale({256}, 2.0f));
  ProgramBuilder b("double");
  b.Parameter("x", mesh, {256}, DType::kF32);
  b.Call("twice", scale, mesh, {"x"}, {"y"});
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto doubled, b.Build());
  ASSERT_OK_AND_ASSIGN(auto hurried_exe, hurried->Load(doubled));
  const std::vector<float> xh = reference::RandomFloats(256, 7);
  ASSERT_OK_AND_ASSIGN(ArrayRef x, hurried->CreateArray(mesh, {256}, DType::kF32));
  // An upload would queue behind the kernel too: the input goes first.
  ASSERT_OK(x->Upload(xh.data(), xh.size() * sizeof(float)));
  // No deadline for the spinner: it holds the accelerator until released.
  ASSERT_OK_AND_ASSIGN(Spin spin, StartSpin(*spinner, exe, spin_x));
  absl::Cleanup release = [&spin] { spin.Release(); };
  ExecuteOptions options;
  options.deadline = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(Execution run, hurried->Execute(hurried_exe, {x}, options));
  EXPECT_ERROR(run.Await(absl::Now() + kRunTimeout), absl::StatusCode::kDeadlineExceeded, "program 'double'",
               "deadline of 0.30 s", "gang call 'twice'", "had not finished");
  // Well past the 300 ms: still not quarantined (its work never ran).
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_OK(spin_mesh->device(0)->health());
  // Once the spinner lets go, everything behind it runs, correctly.
  spin.Release();
  EXPECT_OK(spin.run.Await(absl::Now() + kRunTimeout));
  std::vector<float> got(256);
  ASSERT_OK(run.outputs[0]->Download(got.data(), got.size() * sizeof(float)));
  for (int i = 0; i < 256; ++i) ASSERT_EQ(got[i], 2.0f * xh[i]) << i;
  EXPECT_OK(spin_mesh->device(0)->health());
}

// Tests that deadlines below the island's least are refused, and that the
// island's run_deadline applies to runs that ask for none.
TEST(DeadlineTest, IslandBoundsDeadlines) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  IslandOptions island_options;
  island_options.min_deadline = absl::Milliseconds(500);
  island_options.run_deadline = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get(), island_options));
  ASSERT_OK_AND_ASSIGN(auto client, island->Connect("c"));
  ASSERT_OK_AND_ASSIGN(auto mesh, client->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto program, SpinProgram(mesh));
  ASSERT_OK_AND_ASSIGN(auto exe, client->Load(program));
  ASSERT_OK_AND_ASSIGN(ArrayRef x, SpinInput(*client, mesh));
  ExecuteOptions hurried;
  hurried.deadline = absl::Milliseconds(10);
  EXPECT_ERROR(client->Execute(exe, {x}, hurried).status(), absl::StatusCode::kInvalidArgument,
               "program 'spinner'", "below island 'local''s least of 500ms");
  // No deadline asked: the island's second applies.
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(Spin spin, StartSpin(*client, exe, x));
  absl::Cleanup release = [&spin, acc = mesh->device(0)] { spin.ReleaseAndDrain(*acc); };
  EXPECT_ERROR(spin.run.Await(absl::Now() + kRunTimeout), absl::StatusCode::kDeadlineExceeded,
               "deadline of 1.00 s");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1) + testing::kSchedulingSlack);
  EXPECT_TRUE(AwaitQuarantine(*mesh->device(0), testing::kSchedulingSlack));
}

// Tests that a device lost on one accelerator (the device-wait fault point:
// the wait reports VK_ERROR_DEVICE_LOST) quarantines it and nothing else:
// its work fails with Unavailable naming it, the other accelerator's goes on,
// and meshes avoid it.
TEST(DeadlineTest, LostDeviceQuarantinesOnlyItsAccelerator) {
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto a, island->Connect("a"));
  ASSERT_OK_AND_ASSIGN(auto b, island->Connect("b"));
  ASSERT_OK_AND_ASSIGN(auto mesh_a, a->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto mesh_b, b->AllocateMesh({1}));
  Accelerator* lost = mesh_a->device(0);
  ASSERT_NE(lost, mesh_b->device(0));
  ASSERT_OK(AddAndCheck(*a, mesh_a, 1));
  // Only A waits on a device from here until its run fails, so the next
  // device wait is A's accelerator's.
  ArmFault(FaultPoint::kDeviceWait, 1);
  absl::Cleanup disarm = [] { DisarmFaults(); };
  const absl::Status status = AddAndCheck(*a, mesh_a, 2);
  EXPECT_TRUE(FaultInjected());
  DisarmFaults();
  EXPECT_ERROR(status, absl::StatusCode::kUnavailable, lost->name(), "is lost",
               "injected fault: device-wait 1", "VK_ERROR_DEVICE_LOST");
  EXPECT_TRUE(lost->quarantined());
  EXPECT_FALSE(mesh_b->device(0)->quarantined());
  EXPECT_ERROR(AddAndCheck(*a, mesh_a, 3), absl::StatusCode::kUnavailable, lost->name());
  for (int r = 0; r < 3; ++r) ASSERT_OK(AddAndCheck(*b, mesh_b, 10 + r));
  ASSERT_OK_AND_ASSIGN(auto fresh, a->AllocateMesh({1}));
  EXPECT_EQ(fresh->device(0), mesh_b->device(0));
  ASSERT_OK(AddAndCheck(*a, fresh, 20));
}

// A client's stoppable run, in synchronous dispatch: gang call 'spin' (the
// spin kernel on mesh `a`), then gang call 'twice' (doubling 256 floats on
// mesh `b`), which dispatch reaches only once 'spin' has ended. Each test
// first holds the island's scheduler in a short run of another program
// ('first', on `b`) so that this run is queued and goes to the dispatcher
// thread, whose await hook then says when 'spin' is on the device.
struct TwoCalls {
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<Island> island;
  std::shared_ptr<Client> client;
  std::shared_ptr<Mesh> a, b;
  std::shared_ptr<Executable> exe, first;
  ArrayRef x, y;
  absl::Notification first_inside, spin_queued, spin_inside;
  std::thread first_thread;

  ~TwoCalls() {
    if (first_thread.joinable()) first_thread.join();
  }

  absl::Status Set() {
    rt = MakeRuntime(1);
    if (rt == nullptr) return absl::InternalError("no runtime");
    IslandOptions options;
    options.dispatch = DispatchMode::kSynchronous;
    CAUSEWAY_ASSIGN_OR_RETURN(island, Island::Create(rt.get(), options));
    island->scheduler().RecordOrder(true);
    island->scheduler().SetSynchronousAwaitHookForTesting([this](ClientId, size_t step) {
      if (!first_inside.HasBeenNotified()) {
        first_inside.Notify();
        spin_queued.WaitForNotification();
      } else if (!spin_inside.HasBeenNotified() && step == 0) {
        spin_inside.Notify();
      }
    });
    CAUSEWAY_ASSIGN_OR_RETURN(client, island->Connect("canceller"));
    CAUSEWAY_ASSIGN_OR_RETURN(a, client->AllocateMesh({1}));
    CAUSEWAY_ASSIGN_OR_RETURN(b, client->AllocateMesh({1}));
    CAUSEWAY_ASSIGN_OR_RETURN(auto spin, SpinFunction());
    CAUSEWAY_ASSIGN_OR_RETURN(auto scale, Function::Scale({256}, 2.0f));
    ProgramBuilder pb("two-calls");
    pb.Parameter("x", a, {1}, DType::kI32);
    pb.Parameter("y", b, {256}, DType::kF32);
    pb.Call("spin", spin, a, {"x"}, {"out"});
    pb.Call("twice", scale, b, {"y"}, {"z"});
    pb.Output("out");
    pb.Output("z");
    CAUSEWAY_ASSIGN_OR_RETURN(auto program, pb.Build());
    CAUSEWAY_ASSIGN_OR_RETURN(exe, client->Load(program));
    ProgramBuilder fb("first");
    fb.Parameter("y", b, {256}, DType::kF32);
    fb.Call("first", scale, b, {"y"}, {"z"});
    fb.Output("z");
    CAUSEWAY_ASSIGN_OR_RETURN(auto first_program, fb.Build());
    CAUSEWAY_ASSIGN_OR_RETURN(first, client->Load(first_program));
    CAUSEWAY_ASSIGN_OR_RETURN(x, SpinInput(*client, a));
    CAUSEWAY_ASSIGN_OR_RETURN(y, client->CreateArray(b, {256}, DType::kF32));
    const std::vector<float> yh = reference::RandomFloats(256, 5);
    return y->Upload(yh.data(), yh.size() * sizeof(float));
  }

  // Runs 'first' on a thread of its own (it holds the scheduler in the
  // await hook until `spin_queued`), then queues the two-call run.
  absl::StatusOr<Spin> Start() {
    first_thread = std::thread([this] { EXPECT_OK(client->Execute(first, {y}).status()); });
    first_inside.WaitForNotification();
    Spin spin;
    absl::StatusOr<Execution> run = client->Execute(exe, {x, y});
    spin_queued.Notify();
    if (!run.ok()) return run.status();
    spin.run = *std::move(run);
    CAUSEWAY_ASSIGN_OR_RETURN(spin.out, spin.run.outputs[0]->shard(0));
    if (!spin.out->host_coherent()) {
      spin.Release();
      return absl::FailedPreconditionError("the spin kernel's output is not mapped host-coherent");
    }
    return spin;
  }

  // The nodes of the gang calls dispatched so far, in order.
  std::vector<std::string> Dispatched() {
    std::vector<std::string> nodes;
    for (const GangCall& call : island->scheduler().TakeOrder()) nodes.push_back(call.node);
    return nodes;
  }
};

// Tests that a client cancelling its run while the run's first gang call is
// on the device gets Cancelled from Await at once (not when the kernel ends),
// naming the run and what it was doing; that the run's later gang call, and
// a run cancelled while still queued, are never dispatched, and the outputs
// they would have written carry the error; and that the client and the
// accelerator go on as before (no quarantine: a cancel holds no deadline).
TEST(DeadlineTest, CancelledRunDispatchesNothingMore) {
  TwoCalls t;
  ASSERT_OK(t.Set());
  ASSERT_OK_AND_ASSIGN(Spin spin, t.Start());
  absl::Cleanup release = [&spin] { spin.Release(); };
  // Queued once 'spin' is on the device, so that the dispatcher is busy with
  // run 1: queued while the scheduler was idle (after 'first' and before the
  // dispatcher thread woke), this run was dispatched on this thread, run 1
  // with it, and both ran to their ends before the cancel.
  t.spin_inside.WaitForNotification();
  ASSERT_OK_AND_ASSIGN(Execution queued, t.client->Execute(t.exe, {t.x, t.y}));

  ASSERT_OK(t.client->Cancel(queued));
  EXPECT_ERROR(queued.Await(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled,
               "run 2 of program 'two-calls'", "cancelled by client 'canceller'", "gang call 'spin'",
               "was not yet dispatched", "queued behind other work");
  ASSERT_OK(t.client->Cancel(spin.run));
  // The kernel runs for seconds yet (released only below): only the cancel
  // can end this wait with Cancelled.
  EXPECT_ERROR(spin.run.Await(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled,
               "run 1 of program 'two-calls'", "cancelled by client 'canceller'", "gang call 'spin'",
               "kernel 'spin'", "had not finished");
  EXPECT_ERROR(spin.run.outputs[0]->Await(absl::Now()), absl::StatusCode::kDeadlineExceeded);
  spin.Release();
  EXPECT_ERROR(spin.run.outputs[1]->Await(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled,
               "cancelled");
  EXPECT_ERROR(queued.outputs[0]->Await(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled,
               "cancelled");
  // The gang call on the device ran to its end, writing its output.
  ASSERT_OK(spin.run.outputs[0]->Await(absl::Now() + kRunTimeout));
  t.first_thread.join();

  // The client goes on, with correct results, on the accelerator that ran
  // the cancelled kernel; dispatch took nothing more of either run.
  ASSERT_OK(AddAndCheck(*t.client, t.b, 1));
  EXPECT_THAT(t.Dispatched(), ::testing::ElementsAre("first", "spin", "add"));
  EXPECT_OK(t.a->device(0)->health());
  // A run that has ended keeps its result; another client's run is not its to cancel.
  ASSERT_OK_AND_ASSIGN(Execution done, t.client->Execute(t.first, {t.y}));
  ASSERT_OK(done.Await(absl::Now() + kRunTimeout));
  ASSERT_OK(t.client->Cancel(done));
  EXPECT_OK(done.Await());
  ASSERT_OK_AND_ASSIGN(auto other, t.island->Connect("other"));
  EXPECT_ERROR(other->Cancel(done), absl::StatusCode::kInvalidArgument, "client 'other'", "did not start");
  // Nor is a run of another island's client, though the ids match (each
  // island counts its clients from 1).
  auto rt2 = MakeRuntime(1);
  ASSERT_NE(rt2, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island2, Island::Create(rt2.get()));
  ASSERT_OK_AND_ASSIGN(auto twin, island2->Connect("twin"));
  ASSERT_EQ(twin->id(), t.client->id());
  EXPECT_ERROR(twin->Cancel(done), absl::StatusCode::kInvalidArgument, "client 'twin'", "did not start");
  EXPECT_ERROR(twin->Execute(t.first, {t.y}).status(), absl::StatusCode::kPermissionDenied,
               "did not load that executable");
  twin->Close();
}

// Tests that closing a client while its run's first gang call is on the
// device stops the run there: Await says so at once and the run's later gang
// call is never dispatched (once, that call ran after its client was gone).
TEST(DeadlineTest, ClosingAClientStopsItsRunInProgress) {
  TwoCalls t;
  ASSERT_OK(t.Set());
  ASSERT_OK_AND_ASSIGN(Spin spin, t.Start());
  absl::Cleanup release = [&spin] { spin.Release(); };
  t.spin_inside.WaitForNotification();

  t.client->Close();
  EXPECT_ERROR(spin.run.Await(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled,
               "run 1 of program 'two-calls'", "client 'canceller' closed");
  spin.Release();
  t.first_thread.join();
  // Another client's run, queued after the close, marks when dispatch has
  // passed the closed client's run.
  ASSERT_OK_AND_ASSIGN(auto other, t.island->Connect("other"));
  ASSERT_OK_AND_ASSIGN(auto mesh, other->AllocateMesh({1}));
  ASSERT_OK(AddAndCheck(*other, mesh, 1));
  EXPECT_THAT(t.Dispatched(), ::testing::ElementsAre("first", "spin", "add"));
}

}  // namespace
}  // namespace causeway
