// ThreadSanitizer builds only (CAUSEWAY_TSAN): tells TSan what Abseil's
// synchronization primitives order.
//
// Debian's libabsl_synchronization is built without TSan, so its Mutex,
// CondVar and Notification synchronize through code TSan never sees, and
// every field an absl::Mutex guards would be reported as a race. These
// definitions take the place of the library's exported entry points (an
// executable's definition wins over a shared library's), annotate the
// happens-before edge each one makes (__tsan_release before a lock is given
// up, __tsan_acquire after one is taken), and call the library's own code,
// found with dlsym(RTLD_NEXT).
//
// Readers are ordered with each other as well as with writers: TSan may then
// miss a race between two readers, but it reports none that is not real.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#define CAUSEWAY_STR2(x) #x
#define CAUSEWAY_STR(x) CAUSEWAY_STR2(x)

namespace {

// The mangled names below spell Debian 12's inline namespace.
constexpr const char* kExpectedNamespace = "debian3";

template <typename Fn>
Fn Real(const char* mangled) {
  static_assert(sizeof(Fn) == sizeof(void*));
  if (std::strcmp(CAUSEWAY_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME), kExpectedNamespace) != 0) {
    std::fprintf(stderr, "tsan_absl_sync: built for absl::%s, this Abseil is absl::%s\n", kExpectedNamespace,
                 CAUSEWAY_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME));
    std::abort();
  }
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in Abseil: %s\n", mangled, dlerror());
    std::abort();
  }
  Fn fn;
  std::memcpy(&fn, &f, sizeof(fn));
  return fn;
}

#define REAL(type, mangled)                           \
  static const auto real = Real<type>(mangled); \
  (void)0

void Acquired(const void* mu) { __tsan_acquire(const_cast<void*>(mu)); }
void Releasing(const void* mu) { __tsan_release(const_cast<void*>(mu)); }

// A condition is evaluated under the lock, but inside the library: by the
// waiting thread after it has announced giving the lock up (Releasing, in
// Await below), and by whichever thread unlocks, on the waiter's behalf.
// Each evaluation is annotated as holding the lock, or what a condition
// reads would race with what the lock's next holder writes.
struct HeldCondition {
  const void* mu;
  const absl::Condition* condition;
  static bool Eval(HeldCondition* held) {
    Acquired(held->mu);
    const bool met = held->condition->Eval();
    Releasing(held->mu);
    return met;
  }
};

// Abseil's own lock-order checker keeps its graph under a SpinLock that TSan
// cannot see, so its bookkeeping would be reported as racing. TSan checks
// lock order itself; Abseil's checker is turned off before main.
const bool kAbseilDeadlockCheckOff = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using MutexFn = void (*)(Mutex*);
using MutexTryFn = bool (*)(Mutex*);
using CondFn = void (*)(Mutex*, const Condition&);
using CondTimeoutFn = bool (*)(Mutex*, const Condition&, Duration);
using CondDeadlineFn = bool (*)(Mutex*, const Condition&, Time);

void Mutex::Lock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquired(this);
}
void Mutex::Unlock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex6UnlockEv");
  Releasing(this);
  real(this);
}
bool Mutex::TryLock() {
  REAL(MutexTryFn, "_ZN4absl7debian35Mutex7TryLockEv");
  bool locked = real(this);
  if (locked) Acquired(this);
  return locked;
}
void Mutex::ReaderLock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquired(this);
}
void Mutex::ReaderUnlock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Releasing(this);
  real(this);
}
bool Mutex::ReaderTryLock() {
  REAL(MutexTryFn, "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  bool locked = real(this);
  if (locked) Acquired(this);
  return locked;
}

// Await gives the lock up while it waits and takes it back before it returns.
void Mutex::Await(const Condition& cond) {
  REAL(CondFn, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  Releasing(this);
  real(this, held);
  Acquired(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  REAL(CondTimeoutFn, "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  Releasing(this);
  bool met = real(this, held, timeout);
  Acquired(this);
  return met;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  REAL(CondDeadlineFn, "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  Releasing(this);
  bool met = real(this, held, deadline);
  Acquired(this);
  return met;
}

// LockWhen and its kin return holding the lock, whatever the condition.
void Mutex::LockWhen(const Condition& cond) {
  REAL(CondFn, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  real(this, held);
  Acquired(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(CondTimeoutFn, "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  bool met = real(this, held, timeout);
  Acquired(this);
  return met;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(CondDeadlineFn, "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  bool met = real(this, held, deadline);
  Acquired(this);
  return met;
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  REAL(CondFn, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  real(this, held);
  Acquired(this);
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(CondTimeoutFn, "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  bool met = real(this, held, timeout);
  Acquired(this);
  return met;
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(CondDeadlineFn, "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  HeldCondition h{this, &cond};
  const Condition held(&HeldCondition::Eval, &h);
  bool met = real(this, held, deadline);
  Acquired(this);
  return met;
}

using WaitFn = void (*)(CondVar*, Mutex*);
using WaitTimeoutFn = bool (*)(CondVar*, Mutex*, Duration);
using WaitDeadlineFn = bool (*)(CondVar*, Mutex*, Time);

void CondVar::Wait(Mutex* mu) {
  REAL(WaitFn, "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Releasing(mu);
  real(this, mu);
  Acquired(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  REAL(WaitTimeoutFn, "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Releasing(mu);
  bool timed_out = real(this, mu, timeout);
  Acquired(mu);
  return timed_out;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  REAL(WaitDeadlineFn, "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Releasing(mu);
  bool timed_out = real(this, mu, deadline);
  Acquired(mu);
  return timed_out;
}

using NotifyFn = void (*)(Notification*);
using WaitForFn = void (*)(const Notification*);
using WaitForTimeoutFn = bool (*)(const Notification*, Duration);
using WaitForDeadlineFn = bool (*)(const Notification*, Time);

void Notification::Notify() {
  REAL(NotifyFn, "_ZN4absl7debian312Notification6NotifyEv");
  Releasing(this);
  real(this);
}
void Notification::WaitForNotification() const {
  REAL(WaitForFn, "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquired(this);
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  REAL(WaitForTimeoutFn, "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  bool notified = real(this, timeout);
  if (notified) Acquired(this);
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  REAL(WaitForDeadlineFn, "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  bool notified = real(this, deadline);
  if (notified) Acquired(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
