#include "causeway/scheduler/gang_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "causeway/base/seconds.h"
#include "causeway/base/trace.h"
#include "causeway/runtime/accelerator.h"

namespace causeway {
namespace {

uint64_t NextInstance() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace

GangScheduler::GangScheduler(SchedulingPolicy policy, DispatchMode mode, int dispatch_ahead, std::string island)
    : policy_(policy),
      mode_(mode),
      dispatch_ahead_(std::max(1, dispatch_ahead)),
      island_(std::move(island)),
      instance_(NextInstance()) {
  {
    absl::MutexLock lock(&waker_->mu);
    waker_->scheduler = this;
  }
  thread_ = std::thread([this] {
    Tracer::NameThread(absl::StrCat("dispatcher ", island_));
    Loop();
  });
}

GangScheduler::~GangScheduler() {
  std::thread watch;
  {
    absl::MutexLock lock(&watch_mu_);
    watch_stop_ = true;
    watch.swap(watch_thread_);
  }
  if (watch.joinable()) watch.join();
  {
    // After this no arrival reaches the scheduler (one under way has
    // returned: it holds the waker's lock while it runs).
    absl::MutexLock lock(&waker_->mu);
    waker_->scheduler = nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, q] : clients_) {
    for (auto& run : q.runs) {
      run->executable()->FinishDispatch(*run, absl::CancelledError("the island's scheduler shut down"),
                                        run->next_step_);
    }
  }
}

void GangScheduler::ClientQueue::LevelWith(double level) {
  double now = pass();
  if (level > now) charged += level - now;
}

double GangScheduler::MinPassLocked(ClientId except) const {
  double min_pass = -1;
  for (auto& [id, other] : clients_) {
    if (id == except || other.runs.empty()) continue;
    double p = other.pass();
    if (min_pass < 0 || p < min_pass) min_pass = p;
  }
  return min_pass;
}

double GangScheduler::LevelLocked(ClientId except) const {
  const double active = MinPassLocked(except);
  return active >= 0 ? active : served_pass_;
}

void GangScheduler::AddClient(ClientId client, double weight) {
  absl::MutexLock lock(&mu_);
  ClientQueue& q = clients_[client];
  q.weight = weight > 0 ? weight : 1;
  // A newcomer starts level with the least-served client, not at zero, so it
  // cannot claim the past it was not there for.
  q.LevelWith(LevelLocked(client));
}

void GangScheduler::RemoveClient(ClientId client, const absl::Status& why) {
  std::deque<std::shared_ptr<RunState>> dropped;
  {
    absl::MutexLock lock(&mu_);
    removed_.insert(client);
    auto it = clients_.find(client);
    if (it == clients_.end()) return;
    // A run already partly dispatched stays until dispatch takes it, in
    // order, but stopped: none of its remaining gang calls goes to a device.
    // (One whose gang calls are all on the devices runs to its end.)
    for (auto& run : it->second.runs) {
      if (run->next_step_ == 0) {
        dropped.push_back(run);
      } else if (run->next_step_ < run->step_count()) {
        run->completion()->Stop(absl::Status(
            why.code(), absl::StrFormat("run %d of program '%s' (client %d): %s", run->tag(),
                                        run->executable()->program().name(), client, why.message())));
        run->waiting_ = false;
      }
    }
    auto keep = [&](const std::shared_ptr<RunState>& r) {
      return std::find(dropped.begin(), dropped.end(), r) == dropped.end();
    };
    std::deque<std::shared_ptr<RunState>> rest;
    for (auto& r : it->second.runs) {
      if (keep(r)) rest.push_back(r);
    }
    it->second.runs = rest;
    std::deque<std::shared_ptr<RunState>> fifo;
    for (auto& r : fifo_) {
      if (keep(r)) fifo.push_back(r);
    }
    fifo_ = fifo;
    if (it->second.runs.empty()) clients_.erase(it);
  }
  for (auto& run : dropped) run->executable()->FinishDispatch(*run, why, 0);
}

void GangScheduler::Enqueue(std::shared_ptr<RunState> run) {
  if (run->deadline() != absl::InfiniteDuration()) WatchDeadline(run);
  {
    absl::MutexLock lock(&mu_);
    if (!removed_.contains(run->client())) {
      ClientQueue& q = clients_[run->client()];
      if (q.runs.empty()) {
        // A client coming back from idle starts level with the active ones:
        // it cannot bank share while it had nothing to run.
        q.LevelWith(LevelLocked(run->client()));
      }
      q.runs.push_back(run);
      fifo_.push_back(run);
      // Idle: dispatch this run here, on the caller's thread; anything queued
      // meanwhile is left to the dispatcher thread.
      if (!dispatching_) Drain(run.get());
      return;
    }
  }
  run->executable()->FinishDispatch(*run, absl::CancelledError("the client closed before its run was queued"), 0);
}

bool GangScheduler::ReadyLocked(const RunState& run) const {
  if (run.waiting_) return false;
  auto c = clients_.find(run.client());
  return c != clients_.end() && !c->second.runs.empty() && c->second.runs.front().get() == &run;
}

std::shared_ptr<RunState> GangScheduler::PickLocked() {
  if (policy_ == SchedulingPolicy::kFifo) {
    for (const auto& run : fifo_) {
      if (ReadyLocked(*run)) return run;
    }
    return nullptr;
  }
  ClientQueue* best = nullptr;
  double best_pass = 0;
  for (auto& [id, q] : clients_) {
    if (q.runs.empty() || q.runs.front()->waiting_) continue;
    double p = q.pass();
    if (best == nullptr || p < best_pass) best = &q, best_pass = p;
  }
  return best == nullptr ? nullptr : best->runs.front();
}

void GangScheduler::Drain(const RunState* until) {
  HostSpan span("schedule");
  dispatching_ = true;
  while (!stop_) {
    std::shared_ptr<RunState> run = PickLocked();
    if (run == nullptr) break;
    if (policy_ == SchedulingPolicy::kWeighted) {
      served_pass_ = std::max(served_pass_, clients_[run->client()].pass());
    }
    // A receive goes in the order once its value is here; until then the
    // run waits aside. (Asked for under the lock, so that RemoveClient
    // cannot finish the run meanwhile; a channel resolves nothing of the
    // scheduler's from inside Receive.)
    Future<> arrival = run->executable()->Arrival(*run, run->next_step_);
    if (arrival.valid() && !arrival.IsReady() && run->completion()->stopped().ok()) {
      run->waiting_ = true;
      mu_.Unlock();
      // May run at once, here, if the value has come since.
      arrival.OnReady([waker = waker_, run](const absl::Status&) {
        absl::MutexLock lock(&waker->mu);
        if (waker->scheduler != nullptr) waker->scheduler->Arrived(run);
      });
      mu_.Lock();
      continue;
    }
    ClientQueue& q = clients_[run->client()];
    q.calls++;
    uint64_t sequence = ++sequence_;
    // Claim the step before unlocking: RemoveClient leaves a run alone once
    // any of its steps is taken.
    size_t step = run->next_step_++;
    std::function<void(int64_t)> on_device_time;
    if (policy_ == SchedulingPolicy::kWeighted) {
      // Charge the call's expected device time now; its measurement, when it
      // retires, corrects the charge.
      const std::shared_ptr<GangCallCosts>& costs = run->executable()->costs();
      const int64_t estimate = costs->Estimate(step);
      q.charged += static_cast<double>(estimate) * run->executable()->GangCallMesh(step).size() / q.weight;
      on_device_time = [account = q.account, costs, step, estimate](int64_t ns) {
        account->measured_ns.fetch_add(ns, std::memory_order_relaxed);
        account->correction_ns.fetch_add(ns - estimate, std::memory_order_relaxed);
        costs->Add(step, ns);
      };
    }
    // Holding back only matters when the policy has a choice to make: other
    // clients with queued work under the weighted policy.
    bool contended = false;
    if (policy_ == SchedulingPolicy::kWeighted) {
      for (auto& [id, other] : clients_) contended |= id != run->client() && !other.runs.empty();
    }
    ++unrecorded_;
    mu_.Unlock();
    absl::StatusOr<std::vector<Future<>>> futures = DispatchNext(*run, step, sequence, contended, std::move(on_device_time));
    bool done = !futures.ok() || step + 1 >= run->step_count();
    mu_.Lock();
    --unrecorded_;
    if (record_ && futures.ok()) {
      const Mesh& mesh = run->executable()->GangCallMesh(step);
      GangCall call;
      call.sequence = sequence;
      call.client = run->client();
      call.node = run->executable()->GangCallName(step);
      for (int d = 0; d < mesh.size(); ++d) {
        // A device with nothing to run for the call had no submission (DispatchStep).
        if ((*futures)[d].timeline_driver() == nullptr) continue;
        call.submissions.emplace_back(mesh.device(d)->index(), (*futures)[d].timeline_value());
      }
      order_.push_back(std::move(call));
    }
    if (done) {
      if (auto c = clients_.find(run->client()); c != clients_.end()) {
        auto& runs = c->second.runs;
        if (auto it = std::find(runs.begin(), runs.end(), run); it != runs.end()) runs.erase(it);
        if (runs.empty() && removed_.contains(run->client())) clients_.erase(c);
      }
      if (auto it = std::find(fifo_.begin(), fifo_.end(), run); it != fifo_.end()) fifo_.erase(it);
      if (run.get() == until) break;
    }
  }
  dispatching_ = false;
}

absl::StatusOr<std::vector<Future<>>> GangScheduler::DispatchNext(RunState& run, size_t s, uint64_t sequence,
                                                                  bool contended,
                                                                  std::function<void(int64_t)> on_device_time) {
  HostSpan span("dispatch");
  Executable& exe = *run.executable();
  if (absl::Status stopped = run.completion()->stopped(); !stopped.ok()) {
    // Past its deadline, or cancelled: none of its remaining gang calls goes
    // to a device.
    exe.FinishDispatch(run, stopped, s);
    return stopped;
  }
  if (span.active()) span.set_args(absl::StrCat("\"node\":", JsonQuote(exe.GangCallName(s))));
  const Mesh& mesh = exe.GangCallMesh(s);
  // Under contention keep at most dispatch_ahead_ gang calls in flight per
  // accelerator: the backlog stays in the queues, where the policy orders it.
  // Another client's calls still in flight here are contention too, not only
  // its queued runs: clients that each find the others' work in the device's
  // ring and none queued (as after they all paused, or when each keeps its
  // whole window of runs in flight) would otherwise all go straight to the
  // ring, and the device would serve them in turn whatever their weights.
  for (Accelerator* acc : mesh.devices()) {
    std::deque<InFlight>& ahead = in_flight_[acc];
    while (!ahead.empty() && ahead.front().done.IsReady()) ahead.pop_front();
    bool held = contended;
    for (const InFlight& call : ahead) held |= call.client != run.client() && !call.done.IsReady();
    while (held && static_cast<int>(ahead.size()) >= dispatch_ahead_) {
      (void)ahead.front().done.AwaitStatus();
      ahead.pop_front();
    }
  }
  std::vector<int> commands;
  auto futures = exe.DispatchStep(run, s, on_device_time, span.active() ? &commands : nullptr);
  if (span.active() && futures.ok()) {
    // The call's place in the one order and its submissions, so that a trace
    // shows (and can prove) the order every device ran the calls in.
    std::string subs;
    for (int d = 0; d < mesh.size() && d < static_cast<int>(commands.size()); ++d) {
      if ((*futures)[d].timeline_driver() == nullptr) continue;  // nothing submitted
      absl::StrAppend(&subs, subs.empty() ? "" : ",", "{\"accelerator\":", mesh.device(d)->index(),
                      ",\"submission\":", (*futures)[d].timeline_value(), ",\"commands\":", commands[d], "}");
    }
    Tracer::Get().Instant("gang call", absl::StrCat("\"island\":", JsonQuote(island_), ",\"instance\":", instance_,
                                                    ",\"sequence\":", sequence,
                                                    ",\"client\":", run.client(), ",\"node\":",
                                                    JsonQuote(exe.GangCallName(s)), ",\"submissions\":[", subs, "]"));
  }
  if (!futures.ok()) {
    absl::Status error(futures.status().code(),
                       absl::StrCat("node '", exe.GangCallName(s), "': ", futures.status().message()));
    exe.FinishDispatch(run, error, s);
    return error;
  }
  run.completion_->AddFutures(*futures, static_cast<int>(s));
  if (policy_ == SchedulingPolicy::kWeighted) {
    for (int d = 0; d < mesh.size(); ++d) {
      std::deque<InFlight>& ahead = in_flight_[mesh.device(d)];
      ahead.push_back({run.client(), (*futures)[d]});
      // Unthrottled stretches must not grow this without bound.
      while (static_cast<int>(ahead.size()) > 4 * dispatch_ahead_) ahead.pop_front();
    }
  }
  if (mode_ == DispatchMode::kSynchronous) {
    if (await_hook_) await_hook_(run.client(), s);
    for (auto& f : *futures) (void)f.AwaitStatus();
  }
  if (s + 1 >= run.step_count()) exe.FinishDispatch(run, absl::OkStatus(), s + 1);
  return futures;
}

void GangScheduler::Arrived(const std::shared_ptr<RunState>& run) {
  // The dispatcher thread sees the run ready again when this unlocks.
  absl::MutexLock lock(&mu_);
  run->waiting_ = false;
}

void GangScheduler::WatchDeadline(const std::shared_ptr<RunState>& run) {
  absl::MutexLock lock(&watch_mu_);
  if (watch_stop_) return;
  watched_.emplace(run->completion()->deadline(), run);
  if (!watch_thread_.joinable()) {
    watch_thread_ = std::thread([this] {
      Tracer::NameThread(absl::StrCat("deadlines ", island_));
      WatchLoop();
    });
  }
}

void GangScheduler::WatchLoop() {
  while (true) {
    std::shared_ptr<RunState> due;
    {
      absl::MutexLock lock(&watch_mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu_) {
        return watch_stop_ || (!watched_.empty() && watched_.begin()->first <= absl::Now());
      };
      while (!woken()) {
        const absl::Time next = watched_.empty() ? absl::InfiniteFuture() : watched_.begin()->first;
        // A later run with an earlier deadline wakes this through the condition.
        auto earlier = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu_) {
          return watch_stop_ || (!watched_.empty() && watched_.begin()->first < next);
        };
        watch_mu_.AwaitWithDeadline(absl::Condition(&earlier), next);
      }
      if (watch_stop_) return;
      due = watched_.begin()->second.lock();
      watched_.erase(watched_.begin());
    }
    if (due != nullptr && !due->completion()->done()) Expire(due);
  }
}

std::string GangScheduler::DescribeProgress(const RunState& run) {
  const Executable& exe = *run.executable();
  auto [pending, g] = run.completion()->FirstPending();
  const std::string ran = FormatSeconds(absl::Now() - run.started());
  if (pending.valid() && g >= 0) {
    const auto* acc = dynamic_cast<const Accelerator*>(pending.timeline_driver());
    return absl::StrFormat("%s on %s had not finished after %s", exe.DescribeGangCall(g),
                           acc != nullptr ? acc->name() : "the host", ran);
  }
  if (pending.valid()) return absl::StrCat("its sends to another island had not finished after ", ran);
  absl::MutexLock lock(&mu_);
  const size_t next = std::min(run.next_step_, exe.gang_calls() - 1);
  return absl::StrFormat(
      "%s was not yet dispatched after %s (%s)", exe.DescribeGangCall(next), ran,
      run.waiting_ ? "its value from another island had not come" : "queued behind other work");
}

void GangScheduler::Expire(const std::shared_ptr<RunState>& run) {
  const Executable& exe = *run->executable();
  Stop(*run,
       absl::DeadlineExceededError(absl::StrFormat(
           "run %d of program '%s' (client %d) passed its deadline of %s: %s", run->tag(),
           exe.program().name(), run->client(), FormatSeconds(run->deadline()), DescribeProgress(*run))));
}

void GangScheduler::Cancel(const std::shared_ptr<RunState>& run, const std::string& by) {
  if (run->completion()->done()) return;
  const Executable& exe = *run->executable();
  Stop(*run, absl::CancelledError(absl::StrFormat("run %d of program '%s' (client %d) cancelled by %s: %s",
                                                  run->tag(), exe.program().name(), run->client(), by,
                                                  DescribeProgress(*run))));
}

void GangScheduler::Stop(RunState& run, absl::Status status) {
  run.completion()->Stop(std::move(status));
  // A run waiting aside for a value goes to dispatch, which fails the rest.
  absl::MutexLock lock(&mu_);
  run.waiting_ = false;
}

void GangScheduler::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (!dispatching_ && PickLocked() != nullptr);
    };
    mu_.Await(absl::Condition(&work));
    if (stop_) return;
    Drain(nullptr);
  }
}

void GangScheduler::RecordOrder(bool on) {
  absl::MutexLock lock(&mu_);
  record_ = on;
}

std::vector<GangCall> GangScheduler::TakeOrder() {
  absl::MutexLock lock(&mu_);
  // A call is recorded once its submissions are made, and its run may end
  // before that (a short kernel): wait for the dispatches under way, so that
  // every call of a run seen to end is here.
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return unrecorded_ == 0; };
  mu_.Await(absl::Condition(&idle));
  std::vector<GangCall> out;
  out.swap(order_);
  return out;
}

absl::flat_hash_map<ClientId, int64_t> GangScheduler::DeviceTime() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<ClientId, int64_t> out;
  for (auto& [id, q] : clients_) {
    if (!removed_.contains(id)) out[id] = q.account->measured_ns.load(std::memory_order_relaxed);
  }
  return out;
}

absl::flat_hash_map<ClientId, uint64_t> GangScheduler::DispatchedCalls() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<ClientId, uint64_t> out;
  for (auto& [id, q] : clients_) {
    if (!removed_.contains(id)) out[id] = q.calls;
  }
  return out;
}

}  // namespace causeway
