#include "scheduler/gang_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/accelerator.h"
#include "runtime/trace.h"

namespace causeway {

GangScheduler::GangScheduler(SchedulingPolicy policy, DispatchMode mode) : policy_(policy), mode_(mode) {
  thread_ = std::thread([this] { Loop(); });
}

GangScheduler::~GangScheduler() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, q] : clients_) {
    for (auto& run : q.runs) {
      run->executable()->FinishDispatch(*run, absl::CancelledError("the island's scheduler shut down"));
    }
  }
}

void GangScheduler::AddClient(ClientId client, double weight) {
  absl::MutexLock lock(&mu_);
  ClientQueue& q = clients_[client];
  q.weight = weight > 0 ? weight : 1;
  // A newcomer starts level with the least-served client, not at zero, so it
  // cannot claim the past it was not there for.
  double min_pass = -1;
  for (auto& [id, other] : clients_) {
    if (id != client && !other.runs.empty() && (min_pass < 0 || other.pass < min_pass)) min_pass = other.pass;
  }
  q.pass = std::max(0.0, min_pass);
}

void GangScheduler::RemoveClient(ClientId client, const absl::Status& why) {
  std::deque<std::shared_ptr<RunState>> dropped;
  {
    absl::MutexLock lock(&mu_);
    auto it = clients_.find(client);
    if (it == clients_.end()) return;
    // A run already partly dispatched stays: its steps must finish in order.
    for (auto& run : it->second.runs) {
      if (run->next_step_ == 0) dropped.push_back(run);
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
  for (auto& run : dropped) run->executable()->FinishDispatch(*run, why);
}

void GangScheduler::Enqueue(std::shared_ptr<RunState> run) {
  absl::MutexLock lock(&mu_);
  ClientQueue& q = clients_[run->client()];
  if (q.runs.empty()) {
    // A client coming back from idle starts level with the active ones: it
    // cannot bank share while it had nothing to run.
    double min_pass = -1;
    for (auto& [id, other] : clients_) {
      if (!other.runs.empty() && (min_pass < 0 || other.pass < min_pass)) min_pass = other.pass;
    }
    if (min_pass > q.pass) q.pass = min_pass;
  }
  q.runs.push_back(run);
  fifo_.push_back(run);
  if (dispatching_) return;  // the dispatcher will take it
  // Idle: dispatch this run here, on the caller's thread; anything queued
  // meanwhile is left to the dispatcher thread.
  Drain(run.get());
}

std::shared_ptr<RunState> GangScheduler::PickLocked() {
  if (policy_ == SchedulingPolicy::kFifo) return fifo_.empty() ? nullptr : fifo_.front();
  ClientQueue* best = nullptr;
  for (auto& [id, q] : clients_) {
    if (q.runs.empty()) continue;
    if (best == nullptr || q.pass < best->pass) best = &q;
  }
  return best == nullptr ? nullptr : best->runs.front();
}

void GangScheduler::Drain(const RunState* until) {
  dispatching_ = true;
  while (!stop_) {
    std::shared_ptr<RunState> run = PickLocked();
    if (run == nullptr) break;
    ClientQueue& q = clients_[run->client()];
    q.pass += 1.0 / q.weight;
    q.calls++;
    uint64_t sequence = ++sequence_;
    size_t step = run->next_step_;
    mu_.Unlock();
    bool done = DispatchNext(*run, step);
    mu_.Lock();
    run->next_step_ = step + 1;
    if (record_ && step < run->step_count()) {
      GangCall call;
      call.sequence = sequence;
      call.client = run->client();
      call.node = run->executable()->program().steps()[step].node;
      std::vector<Future<>> futures = run->futures();
      const ProgramStep& ps = run->executable()->program().steps()[step];
      size_t first = futures.size() >= static_cast<size_t>(ps.mesh->size()) ? futures.size() - ps.mesh->size() : 0;
      for (int d = 0; d < ps.mesh->size() && first + d < futures.size(); ++d) {
        call.submissions.emplace_back(ps.mesh->device(d)->index(), futures[first + d].timeline_value());
      }
      order_.push_back(std::move(call));
    }
    if (done) {
      auto& runs = clients_[run->client()].runs;
      runs.erase(std::find(runs.begin(), runs.end(), run));
      fifo_.erase(std::find(fifo_.begin(), fifo_.end(), run));
      if (run.get() == until) break;
    }
  }
  dispatching_ = false;
}

bool GangScheduler::DispatchNext(RunState& run, size_t s) {
  HostSpan span("dispatch");
  Executable& exe = *run.executable();
  auto futures = exe.DispatchStep(run, s);
  if (!futures.ok()) {
    exe.FinishDispatch(run, absl::Status(futures.status().code(),
                                         absl::StrCat("node '", exe.program().steps()[s].node,
                                                      "': ", futures.status().message())));
    return true;
  }
  {
    absl::MutexLock lock(&run.mu_);
    run.futures_.insert(run.futures_.end(), futures->begin(), futures->end());
  }
  if (mode_ == DispatchMode::kSequential) {
    for (auto& f : *futures) (void)f.AwaitStatus();
  }
  if (s + 1 < run.step_count()) return false;
  exe.FinishDispatch(run, absl::OkStatus());
  return true;
}

void GangScheduler::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (!dispatching_ && !fifo_.empty());
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
  std::vector<GangCall> out;
  out.swap(order_);
  return out;
}

absl::flat_hash_map<ClientId, uint64_t> GangScheduler::DispatchedCalls() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<ClientId, uint64_t> out;
  for (auto& [id, q] : clients_) out[id] = q.calls;
  return out;
}

}  // namespace causeway
