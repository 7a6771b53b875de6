// Futures: the value (or error) of work that completes later.
//
// A `Future<T>` is the read side and a `Promise<T>` the write side of one
// shared state. `Future<void>` carries an `absl::Status`; `Future<T>` carries an
// `absl::StatusOr<T>`. A future is resolved exactly once.
//
// Futures of device work are ring-buffer slots (see causeway/runtime/accelerator.h).
// Their TimelineDriver lets `Await` block on the device's timeline semaphore
// itself and retire the slot on the awaiting thread, instead of waiting for a
// completion thread to wake it (no thread hop on the critical path), and
// `OnReady` asks the driver to retire the slot without being awaited.
//
// Example:
//   auto [promise, future] = MakePromise<int>();
//   std::thread t([p = std::move(promise)]() mutable { p.Set(42); });
//   absl::StatusOr<int> v = future.Await();   // 42
//   t.join();
#ifndef CAUSEWAY_BASE_FUTURE_H_
#define CAUSEWAY_BASE_FUTURE_H_

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace causeway {

template <typename T>
class Future;
template <typename T>
class Promise;

// Implemented by what resolves device futures: an accelerator's ring.
class TimelineDriver {
 public:
  // Blocks until the work signalling `value` may be done or `deadline`
  // passes; may resolve futures on this thread.
  virtual void WaitFor(uint64_t value, absl::Time deadline) = 0;
  // A callback waits on the future of `value`: resolve it when the work is
  // done even if nobody awaits it.
  virtual void WantCompletion(uint64_t value) = 0;

 protected:
  ~TimelineDriver() = default;
};

namespace internal {

template <typename T>
struct ResultOf {
  using type = absl::StatusOr<T>;
};
template <>
struct ResultOf<void> {
  using type = absl::Status;
};

// The state shared by a promise and its futures. Thread-safe.
template <typename T>
class FutureState {
 public:
  using Result = typename ResultOf<T>::type;
  using Callback = absl::AnyInvocable<void(const Result&) &&>;

  // Resolves the state; returns false (and changes nothing) if it already was.
  // Callbacks run here, on the resolving thread, after the lock is released.
  bool Set(Result result) {
    std::vector<Callback> callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (ready_) return false;
      result_ = std::move(result);
      ready_ = true;
      callbacks.swap(callbacks_);
    }
    for (Callback& cb : callbacks) std::move(cb)(result_);
    return true;
  }

  bool IsReady() const {
    absl::MutexLock lock(&mu_);
    return ready_;
  }

  // Waits until resolved or `deadline`; returns null on timeout.
  const Result* Wait(absl::Time deadline) {
    {
      absl::MutexLock lock(&mu_);
      if (ready_) return &result_;
    }
    if (driver != nullptr) driver->WaitFor(timeline_value, deadline);
    absl::MutexLock lock(&mu_);
    ++waiters_;
    const bool ready = mu_.AwaitWithDeadline(absl::Condition(&ready_), deadline);
    --waiters_;
    return ready ? &result_ : nullptr;
  }

  // A test hook: blocks until at least `n` threads are blocked in Wait on the
  // unresolved state (they hold no lock then, so a Set from now on is what
  // wakes them), or returns at once if the state is resolved.
  void AwaitWaitersForTesting(int n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_ || waiters_ >= n; };
    mu_.Await(absl::Condition(&enough));
  }

  void OnReady(Callback callback) {
    bool queued = false, notify = false;
    {
      absl::MutexLock lock(&mu_);
      if (!ready_) {
        notify = callbacks_.empty() && driver != nullptr;
        callbacks_.push_back(std::move(callback));
        queued = true;
      }
    }
    if (!queued) {
      std::move(callback)(result_);
    } else if (notify) {
      driver->WantCompletion(timeline_value);  // outside the lock: it may resolve this state
    }
  }

  // For device work: what signals it and the timeline value. Set once before
  // the state is shared, read without the lock afterwards. The driver must
  // outlive every wait on the future (an accelerator resolves all its futures
  // before it is destroyed).
  TimelineDriver* driver = nullptr;
  uint64_t timeline_value = 0;

  // Only valid once ready (the result never changes after that).
  const Result& result() const { return result_; }

 private:
  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  // Written once under mu_ before ready_ is set, read-only afterwards.
  Result result_ = absl::UnknownError("future not resolved");
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mu_);
  // Threads blocked in Wait, for AwaitWaitersForTesting.
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace internal

// The read side. Cheap to copy; all copies see the same result. Thread-safe.
template <typename T = void>
class Future {
 public:
  using Result = typename internal::ResultOf<T>::type;

  // An invalid future; `valid()` is false.
  Future() = default;

  // An already-resolved future.
  static Future Ready(Result result) {
    auto state = std::make_shared<internal::FutureState<T>>();
    state->Set(std::move(result));
    return Future(std::move(state));
  }

  bool valid() const { return state_ != nullptr; }
  bool IsReady() const { return state_->IsReady(); }

  // For device work: what signals completion (an accelerator) and the
  // timeline value; null for host futures.
  TimelineDriver* timeline_driver() const { return state_->driver; }
  uint64_t timeline_value() const { return state_->timeline_value; }

  // Blocks until resolved and returns the result; DeadlineExceeded (the future
  // stays unresolved) if `deadline` passes first.
  Result Await(absl::Time deadline = absl::InfiniteFuture()) const {
    const Result* r = state_->Wait(deadline);
    if (r == nullptr) {
      return Result(absl::DeadlineExceededError("future not ready by its deadline"));
    }
    return *r;
  }
  Result AwaitFor(absl::Duration timeout) const { return Await(absl::Now() + timeout); }

  // The status of the result: OK, the error, or DeadlineExceeded on timeout.
  absl::Status AwaitStatus(absl::Time deadline = absl::InfiniteFuture()) const {
    const Result* r = state_->Wait(deadline);
    if (r == nullptr) return absl::DeadlineExceededError("future not ready by its deadline");
    if constexpr (std::is_void_v<T>) {
      return *r;
    } else {
      return r->status();
    }
  }

  // A test hook: blocks until `n` threads wait in Await on this unresolved
  // future (or it resolves), so that a test can resolve it knowing they do.
  void AwaitWaitersForTesting(int n) const { state_->AwaitWaitersForTesting(n); }

  // Runs `callback(result)` once the future resolves: at once on this thread if
  // it already has, otherwise on the thread that resolves it (for device work,
  // the accelerator's completion thread or a thread in Await that retired the
  // slot). Callbacks must not block.
  template <typename F>
  void OnReady(F&& callback) const {
    state_->OnReady(typename internal::FutureState<T>::Callback(
        [cb = std::forward<F>(callback)](const Result& r) mutable { cb(r); }));
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<internal::FutureState<T>> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::FutureState<T>> state_;
};

// The write side. Move-only. A promise destroyed unresolved resolves its
// future with Cancelled, so no waiter hangs on a lost producer.
template <typename T = void>
class Promise {
 public:
  using Result = typename internal::ResultOf<T>::type;

  Promise() : state_(std::make_shared<internal::FutureState<T>>()) {}
  Promise(Promise&&) noexcept = default;
  Promise& operator=(Promise&& other) noexcept {
    if (this != &other) {
      Abandon();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { Abandon(); }

  Future<T> future() const { return Future<T>(state_); }

  // Resolves the future; false if it was already resolved.
  bool Set(Result result) const { return state_->Set(std::move(result)); }
  bool IsReady() const { return state_->IsReady(); }

  // Marks the future as device work signalled by `driver` at `value`. Call
  // before handing out futures.
  void SetTimeline(TimelineDriver* driver, uint64_t value) const {
    state_->driver = driver;
    state_->timeline_value = value;
  }

 private:
  void Abandon() {
    if (state_ != nullptr) state_->Set(Result(absl::CancelledError("promise dropped unresolved")));
  }
  std::shared_ptr<internal::FutureState<T>> state_;
};

template <typename T = void>
std::pair<Promise<T>, Future<T>> MakePromise() {
  Promise<T> p;
  Future<T> f = p.future();
  return {std::move(p), std::move(f)};
}

}  // namespace causeway

#endif  // CAUSEWAY_BASE_FUTURE_H_
