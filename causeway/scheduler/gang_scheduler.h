// The gang scheduler of one island: every step of every run (a gang call:
// an SPMD function call or a transfer on all devices of a mesh) gets one place
// in one order, across all clients, and is submitted to every device of its
// mesh in that order. Since every accelerator sees the gang calls in the same
// order, waits between accelerators never form a cycle.
//
// Policies: FIFO (runs in arrival order, each run's steps together) or a
// weighted proportional share of device time between clients, decided at the
// granularity of gang calls (stride scheduling: the client with the least
// device time per unit of weight goes next). Under the weighted policy every
// submission is timed on the device (two timestamps); a gang call is charged
// at dispatch by the measured average of its earlier runs and corrected by
// its own measurement when it retires, so calls of any cost share fairly.
//
// A gang call headed by a receive (a value from another island) takes its
// place in the order only once the value has arrived (Executable::Arrival
// says why); meanwhile its run, and the client's later runs, which may read
// its outputs, wait out of the way, and other clients' runs go on.
//
// Dispatch: a dispatcher thread drains the queues. When the scheduler is idle
// the submitting thread dispatches its own run at once (no hand-off to the
// dispatcher thread on the critical path); the gang order is unchanged since
// one thread dispatches at a time. In synchronous mode each gang call is
// awaited before the next is dispatched. Thread-safe.
#ifndef CAUSEWAY_SCHEDULER_GANG_SCHEDULER_H_
#define CAUSEWAY_SCHEDULER_GANG_SCHEDULER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "causeway/scheduler/executable.h"

namespace causeway {

enum class SchedulingPolicy { kFifo, kWeighted };
enum class DispatchMode { kAsync, kSynchronous };

// One dispatched gang call, for checking orders.
struct GangCall {
  uint64_t sequence = 0;
  ClientId client = 0;
  std::string node;
  // Per device of the mesh: the accelerator index and the timeline value its
  // submission signals.
  std::vector<std::pair<int, uint64_t>> submissions;
};

class GangScheduler {
 public:
  // Under the weighted policy, while other clients have work queued or in
  // flight on an accelerator, at most `dispatch_ahead` gang calls are in
  // flight on it; further ones wait in the queues, where the policy orders
  // them. A lone client, or FIFO, is never held back.
  // `island` names the island in traces.
  GangScheduler(SchedulingPolicy policy, DispatchMode mode, int dispatch_ahead, std::string island = "");
  ~GangScheduler();

  void AddClient(ClientId client, double weight);
  // Drops the client's queued runs (failing them with `why`) and stops its
  // runs in progress (RunCompletion::Stop): none of their gang calls not yet
  // dispatched goes to a device.
  void RemoveClient(ClientId client, const absl::Status& why);
  // Stops `run` with Cancelled, "run T of program 'P' (client C) cancelled
  // by `by`: " and what it was doing: none of its gang calls not yet
  // dispatched goes to a device, its work on the devices runs on (Vulkan
  // cannot take it back), and Await returns at once. A run that has ended
  // is left as it is.
  void Cancel(const std::shared_ptr<RunState>& run, const std::string& by) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues a prepared run (the whole program as one message).
  void Enqueue(std::shared_ptr<RunState> run);

  // Recording of dispatched gang calls (off by default; for tests and tools).
  void RecordOrder(bool on);
  // The calls recorded since the last take, once the dispatches under way
  // are recorded too (a run seen to end has all its calls here).
  std::vector<GangCall> TakeOrder();
  // Gang calls dispatched so far per client still connected.
  absl::flat_hash_map<ClientId, uint64_t> DispatchedCalls() const;
  // Device time (ns) measured so far per client still connected (weighted
  // policy only: FIFO does not time its submissions).
  absl::flat_hash_map<ClientId, int64_t> DeviceTime() const;
  DispatchMode mode() const { return mode_; }

  // Called by the dispatching thread, holding no lock, each time synchronous
  // dispatch is about to await a gang call it has submitted: `client`'s
  // step `step`. A test may block in it to act while the dispatcher is
  // inside that call. Set before any run is queued.
  void SetSynchronousAwaitHookForTesting(std::function<void(ClientId client, size_t step)> hook) {
    await_hook_ = std::move(hook);
  }

 private:
  // Device time of one client, written by retirement callbacks.
  struct DeviceAccount {
    std::atomic<int64_t> measured_ns{0};
    std::atomic<int64_t> correction_ns{0};  // measured minus charged, of retired calls
  };
  struct ClientQueue {
    double weight = 1;
    double charged = 0;  // estimated device ns charged at dispatch / weight
    std::shared_ptr<DeviceAccount> account = std::make_shared<DeviceAccount>();
    std::deque<std::shared_ptr<RunState>> runs;
    uint64_t calls = 0;
    // Device time per unit of weight, as far as known.
    double pass() const { return charged + account->correction_ns.load(std::memory_order_relaxed) / weight; }
    // Starts level with `pass` if behind it.
    void LevelWith(double pass);
  };
  // The least pass of the clients with queued work other than `except`; -1 if none.
  double MinPassLocked(ClientId except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where a client that comes (back) with work starts, at the least: level
  // with the least-served active client, or, when none is active, with the
  // pass of the last client served. Without the latter, a client that ran
  // alone while the others were idle would carry the device time it took
  // then as a debt against whoever came back first.
  double LevelLocked(ClientId except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Picks the run whose next step goes next; null when nothing is queued
  // but runs waiting for a value (and the client's runs after them).
  std::shared_ptr<RunState> PickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `run` may go next: the first of its client's runs, not waiting.
  bool ReadyLocked(const RunState& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Dispatches step `s` of `run` (waiting for room on its accelerators);
  // its futures, one per device of the mesh.
  absl::StatusOr<std::vector<Future<>>> DispatchNext(RunState& run, size_t s, uint64_t sequence, bool contended,
                                                     std::function<void(int64_t)> on_device_time)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Dispatches gang calls in policy order until nothing is queued, or until
  // `until` (if not null) is fully dispatched.
  void Drain(const RunState* until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  // How a value's arrival reaches the scheduler: through this, which the
  // scheduler detaches when it is destroyed, since an arrival may come later.
  struct Waker {
    absl::Mutex mu;
    GangScheduler* scheduler ABSL_GUARDED_BY(mu) = nullptr;
  };
  // The value `run` waits for has arrived (or failed): it may go again.
  void Arrived(const std::shared_ptr<RunState>& run) ABSL_LOCKS_EXCLUDED(mu_);
  // Deadlines: runs with one are watched by a thread (started with the first
  // such run) that fails each run still unfinished at its deadline
  // (Stop, DeadlineExceeded), naming what it was doing.
  void WatchDeadline(const std::shared_ptr<RunState>& run) ABSL_LOCKS_EXCLUDED(watch_mu_);
  void WatchLoop();
  void Expire(const std::shared_ptr<RunState>& run) ABSL_LOCKS_EXCLUDED(mu_);
  // RunCompletion::Stop; a run waiting aside for a value from another
  // island then goes to dispatch, which fails the rest.
  void Stop(RunState& run, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // What `run` is doing, for messages: the first gang call not finished and
  // where, or the next one and why it is not yet dispatched.
  std::string DescribeProgress(const RunState& run) ABSL_LOCKS_EXCLUDED(mu_);

  const SchedulingPolicy policy_;
  const DispatchMode mode_;
  const int dispatch_ahead_;
  const std::string island_;
  const uint64_t instance_;  // tells apart schedulers of one name in a trace
  // Gang calls in flight per accelerator (weighted policy), with the client
  // that dispatched each; touched only by the thread that holds the
  // dispatching role (dispatching_).
  struct InFlight {
    ClientId client = 0;
    Future<> done;
  };
  absl::flat_hash_map<const Accelerator*, std::deque<InFlight>> in_flight_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<ClientId, ClientQueue> clients_ ABSL_GUARDED_BY(mu_);
  // Clients gone away: their late runs are refused, their entry dropped once
  // their last partly dispatched run is done.
  absl::flat_hash_set<ClientId> removed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<RunState>> fifo_ ABSL_GUARDED_BY(mu_);  // arrival order (FIFO policy)
  bool dispatching_ ABSL_GUARDED_BY(mu_) = false;
  // The greatest pass a client had when it was picked (weighted policy).
  double served_pass_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool record_ ABSL_GUARDED_BY(mu_) = false;
  // Gang calls between taking their step and recording it (Drain).
  int unrecorded_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<GangCall> order_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
  std::function<void(ClientId, size_t)> await_hook_;
  std::thread thread_;
  absl::Mutex watch_mu_;
  std::multimap<absl::Time, std::weak_ptr<RunState>> watched_ ABSL_GUARDED_BY(watch_mu_);
  bool watch_stop_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watch_thread_;  // guarded by watch_mu_ until joined
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_GANG_SCHEDULER_H_
