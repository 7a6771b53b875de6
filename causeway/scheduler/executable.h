// A program loaded by one client: its lowered steps, recorded once per
// accelerator into command lists and replayed run after run.
//
// Runs rotate over a few instances (sets of intermediate buffers and their
// recorded lists); a run takes the least recently used one and, if all are in
// use, waits for that instance's previous run to end: this is the client's
// backpressure. Consecutive steps on the same mesh form one gang call: one
// command list (one submission) per device. Gang calls that touch only an
// instance's own buffers are replayed; those that bind a run's inputs or
// outputs (fresh arrays each run) are recorded for that run.
#ifndef CAUSEWAY_SCHEDULER_EXECUTABLE_H_
#define CAUSEWAY_SCHEDULER_EXECUTABLE_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/future.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/program.h"

namespace causeway {

class Executable;
class RunState;

// Measured device time of each gang call (per device submission, a moving
// average), for charging clients before their work has run. Lock-free;
// shared with the retirement callbacks, which may outlive the executable.
class GangCallCosts {
 public:
  explicit GangCallCosts(size_t gang_calls) : ns_(gang_calls) {}
  // What an unmeasured call is charged (a device without timestamps never
  // measures: its clients share by gang calls).
  static constexpr int64_t kUnmeasuredNs = 100'000;
  int64_t Estimate(size_t g) const {
    int64_t ns = ns_[g].load(std::memory_order_relaxed);
    return ns > 0 ? ns : kUnmeasuredNs;
  }
  void Add(size_t g, int64_t ns) {
    int64_t old = ns_[g].load(std::memory_order_relaxed);
    ns_[g].store(old == 0 ? std::max<int64_t>(ns, 1) : std::max<int64_t>(old + (ns - old) / 8, 1),
                 std::memory_order_relaxed);
  }

 private:
  std::vector<std::atomic<int64_t>> ns_;
};

// How a run ended: whether it is dispatched, its dispatch error and the
// futures of its submissions. Shared by the run and by the instance it used,
// which keeps it until the instance's next run; the instance must not keep
// the run itself, which holds its executable, which holds the instance.
// Thread-safe.
class RunCompletion {
 public:
  bool dispatched() const;
  std::vector<Future<>> futures() const;
  // Blocks until dispatched and every future has finished, or the run is
  // stopped (its deadline passed, or it was cancelled: Stop); the first error
  // in dispatch order, or the stop's.
  absl::Status Await(absl::Time deadline = absl::InfiniteFuture()) const;
  // Blocks until dispatched and every future has resolved, whatever the
  // deadline (before the run's buffers are used again).
  void AwaitWork() const;
  // `gang_call`: which gang call made them; -1 for the run's sends.
  void AddFutures(const std::vector<Future<>>& futures, int gang_call);
  void Finish(absl::Status status);

  // The run's deadline (set before it is queued); InfiniteFuture: none.
  void set_deadline(absl::Time deadline) { deadline_ = deadline; }
  absl::Time deadline() const { return deadline_; }
  // Fails the run with `status` (its deadline passed, or it was cancelled):
  // Await returns it within kStopPoll, and the scheduler dispatches none of
  // its gang calls from then on. Work already on the devices runs on (Vulkan
  // cannot take it back); what holds a device past a deadline is quarantined
  // there (SubmitOptions::hold_limit). The first status stays.
  void Stop(absl::Status status);
  absl::Status stopped() const;
  // How soon a thread in Await sees a Stop while it waits on the devices.
  static constexpr absl::Duration kStopPoll = absl::Milliseconds(50);
  // Whether dispatch is over and every future has resolved.
  bool done() const;
  // The first future not yet resolved, in dispatch order, and its gang call
  // (-1: a send); an invalid future when there is none.
  std::pair<Future<>, int> FirstPending() const;

 private:
  mutable absl::Mutex mu_;
  absl::Time deadline_ = absl::InfiniteFuture();
  bool dispatched_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);
  std::vector<Future<>> futures_ ABSL_GUARDED_BY(mu_);
  std::vector<int> gang_calls_ ABSL_GUARDED_BY(mu_);  // per future
};

// One set of a program's intermediate buffers, scratch and recorded command
// lists. Shared by the executable and the runs using it, so releasing the
// executable never pulls it from under a run.
struct ExecutableInstance {
  std::vector<ArrayRef> values;  // intermediates (null for parameters/outputs)
  std::vector<std::vector<std::shared_ptr<CommandList>>> lists;  // [gang call][device], null when per run
  // [step][device][i]: a call's scratch; a collective's work and recv; a
  // send's or receive's host-visible staging (a send has one only on the
  // first device holding each distinct shard).
  std::vector<std::vector<std::vector<std::shared_ptr<Buffer>>>> scratch;
  std::shared_ptr<RunCompletion> last_run;  // guarded by the executable's lock
  uint64_t last_used = 0;              // guarded by the executable's lock
  uint64_t bytes = 0;                  // device memory held
};

// The state of one run, shared by the client (who awaits it) and the
// scheduler (who dispatches its steps in order). Thread-safe.
class RunState {
 public:
  const std::shared_ptr<Executable>& executable() const { return executable_; }
  ClientId client() const { return client_; }
  // Matches this run with the runs of other islands' parts of one program
  // (ExecuteOptions::tag).
  uint64_t tag() const { return tag_; }
  size_t step_count() const;  // gang calls
  // How long the run may take, from when it was prepared; infinite: no limit.
  absl::Duration deadline() const { return deadline_; }
  absl::Time started() const { return started_; }
  const std::shared_ptr<RunCompletion>& completion() const { return completion_; }
  // Blocks until every step is dispatched and has finished; the first error.
  absl::Status Await(absl::Time deadline = absl::InfiniteFuture()) { return completion_->Await(deadline); }
  bool dispatched() const { return completion_->dispatched(); }
  // The futures of every submission, in dispatch order (after dispatch), and
  // of the run's sends to other islands.
  std::vector<Future<>> futures() const { return completion_->futures(); }

 private:
  friend class Executable;
  friend class GangScheduler;
  std::shared_ptr<Executable> executable_;
  ClientId client_ = 0;
  uint64_t tag_ = 0;
  absl::Duration deadline_ = absl::InfiniteDuration();
  absl::Time started_;
  std::shared_ptr<ExecutableInstance> instance_;
  std::vector<ArrayRef> values_;  // per program value
  size_t next_step_ = 0;          // guarded by the scheduler's lock
  // Its next gang call is a receive whose value has not come yet: the
  // scheduler places it once it has (Executable::Arrival says why). Guarded
  // by the scheduler's lock.
  bool waiting_ = false;
  // Per gang call headed by a receive: the value's arrival, asked for when
  // the run is prepared; read by the dispatching thread.
  std::vector<Future<>> arrivals_;
  // Per program step, its submissions' futures (one per device of its mesh),
  // set as it is dispatched; read by later collective phases. Touched only by
  // the dispatching thread.
  std::vector<std::vector<Future<>>> step_futures_;

  std::shared_ptr<RunCompletion> completion_ = std::make_shared<RunCompletion>();
};

// Thread-safe. Made by Client::Load.
class Executable : public std::enable_shared_from_this<Executable> {
 public:
  // `client_name` names the client in reports of what a device is running.
  Executable(std::shared_ptr<const Program> program, ClientId client, int instances,
             std::string client_name = "");
  ~Executable();

  const Program& program() const { return *program_; }
  // Gang calls: runs of consecutive program steps on the same mesh.
  size_t gang_calls() const { return groups_.size(); }
  const Mesh& GangCallMesh(size_t g) const { return *program_->steps()[groups_[g].first].mesh; }
  std::string GangCallName(size_t g) const;  // its nodes, joined by '+'
  // "gang call 'a+b' (kernels 'k1', 'k2') of program 'p'", for messages.
  std::string DescribeGangCall(size_t g) const;
  ClientId client() const { return client_; }

  // Prepares a run: checks the inputs (naming the parameter), takes an
  // instance (waiting for its previous run if all are busy), allocates the
  // outputs. Nothing is submitted yet. `tag` names the run to channels; 0
  // takes the next of this executable's own count (1, 2, ...).
  // `deadline`: how long the run may take from now (RunCompletion::Stop,
  // SubmitOptions::hold_limit); infinite: no limit.
  absl::StatusOr<std::shared_ptr<RunState>> Prepare(const std::vector<ArrayRef>& inputs,
                                                    std::vector<ArrayRef>* outputs, uint64_t tag = 0,
                                                    absl::Duration deadline = absl::InfiniteDuration());
  // For gang call `g` of `run` headed by a receive: the run's value, which
  // resolves when the value is in place. An invalid future for any other
  // gang call. The scheduler places such a call in the gang order only once
  // its value has arrived, so that no device ever waits in its queue for
  // another island: runs of several controllers reach islands in different
  // orders, and a device holding a receive of one run would hold up, behind
  // it, the sends that the other island needs before it sends that value.
  //
  // Prepare asks the channel for every value of the run at once: the bytes
  // then go straight into the run's buffers whenever they come, rather than
  // into a copy kept until the run reaches the front of its client's queue
  // (a whole value in host memory, written and then copied again). A run
  // that fails before its receive abandons it (FinishDispatch), and its
  // buffers are reused only once no writer holds them.
  Future<> Arrival(const RunState& run, size_t g) const;
  // Submits gang call `s` of `run` on every device of its mesh; returns its
  // futures. Called by the scheduler, one at a time, in the gang order.
  // `on_device_time`, if set, gets each device's measured time (ns) as its
  // submission retires. `commands`, if not null, gets each device's number
  // of commands (traces: how many device spans each submission records).
  absl::StatusOr<std::vector<Future<>>> DispatchStep(RunState& run, size_t s,
                                                     const std::function<void(int64_t)>& on_device_time = nullptr,
                                                     std::vector<int>* commands = nullptr);
  const std::shared_ptr<GangCallCosts>& costs() const { return costs_; }
  // Marks `run` fully dispatched, or failed with gang calls from
  // `first_undone` on never dispatched (their outputs then carry the error).
  // Once per run.
  void FinishDispatch(RunState& run, absl::Status status, size_t first_undone);
  // Device memory held by the instances.
  uint64_t bytes_held();
  // Frees the instances' buffers (the client went away).
  void Release();

 private:
  using Instance = ExecutableInstance;
  absl::StatusOr<std::shared_ptr<Instance>> MakeInstance();
  // Asks the channels for every value `run` receives (Arrival), into the
  // run's own buffers. Before the run is queued.
  void ExpectArrivals(RunState& run) const;
  // The buffers of call step `s` on device `d` for `values`.
  absl::StatusOr<std::vector<BufferArg>> StepBuffers(const std::vector<ArrayRef>& values, const Instance& inst,
                                                     size_t s, int d) const;
  absl::Status RecordStep(CommandList& list, const std::vector<ArrayRef>& values, const Instance& inst, size_t s,
                          int d) const;
  absl::Status RecordCollective(CommandList& list, const std::vector<ArrayRef>& values, const Instance& inst,
                                size_t s, int d) const;
  bool StepIsStatic(size_t s) const;
  // Whether step `s` of the gang call beginning at step `first` reads value
  // `v` made by an earlier step of that gang call.
  bool ProducedIn(size_t first, size_t s, int v) const;
  bool ByEngine(size_t s, int d) const;
  // How a run's output array `v` starts: a receive's value is written whole
  // (or the array fails), so it is not zeroed first; others are.
  Array::Contents OutputContents(int v) const;
  absl::Status RecordGangCall(CommandList& list, const std::vector<ArrayRef>& values, const Instance& inst,
                              size_t g, int d) const;

  std::shared_ptr<const Program> program_;
  ClientId client_;
  int max_instances_;
  std::vector<std::pair<size_t, size_t>> groups_;  // [first, last) step of each gang call
  // Per gang call, what its submissions are (SubmitOptions::what), made once.
  std::vector<std::string> submit_what_;
  std::vector<std::vector<int>> external_inputs_;  // per gang call: values produced outside it
  // [step][device]: a transfer whose bytes the device's copy engine moves
  // before its gang call (Accelerator::UsesCopyEngine, decided at load),
  // rather than a copy in its command list. Only transfers of values made
  // before their gang call: a value made inside it is copied in order there.
  std::vector<std::vector<bool>> by_engine_;
  std::shared_ptr<GangCallCosts> costs_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Instance>> instances_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t runs_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_EXECUTABLE_H_
