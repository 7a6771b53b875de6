// Host memory that someone outside the process makes this process hold (a
// peer's early values, a controller's partial uploads), counted against a
// limit per owner (an island's session), so that one peer cannot take the
// host's memory from the others. Thread-safe.
//
// Example:
//   auto budget = std::make_shared<HostBudget>("session of 'ctrl'", 1 << 30);
//   CAUSEWAY_ASSIGN_OR_RETURN(HostCharge charge, budget->Charge(budget, bytes, "the upload to array 3"));
//   buffer.resize(bytes);  // given back when `charge` goes
#ifndef CAUSEWAY_RUNTIME_HOST_BUDGET_H_
#define CAUSEWAY_RUNTIME_HOST_BUDGET_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace causeway {

class HostBudget;

// Bytes taken from a HostBudget, given back when this is destroyed or reset.
// Move-only.
class HostCharge {
 public:
  HostCharge() = default;
  HostCharge(HostCharge&& other) noexcept;
  HostCharge& operator=(HostCharge&& other) noexcept;
  HostCharge(const HostCharge&) = delete;
  HostCharge& operator=(const HostCharge&) = delete;
  ~HostCharge() { Reset(); }

  void Reset();
  uint64_t bytes() const { return bytes_; }

 private:
  friend class HostBudget;
  std::shared_ptr<HostBudget> budget_;
  uint64_t bytes_ = 0;
};

class HostBudget {
 public:
  // `owner` names whose budget it is in errors ("the session of 'ctrl'").
  // What is charged here is charged to `parent` too, when one is given (an
  // island's total over its sessions), and held to its limit as well.
  HostBudget(std::string owner, uint64_t limit, std::shared_ptr<HostBudget> parent = nullptr)
      : owner_(std::move(owner)), limit_(limit), parent_(std::move(parent)) {}

  // Takes `bytes` for `what` from `self` (this budget, shared so that the
  // charge may outlive its taker) and its parents. ResourceExhausted naming
  // the owner, what asked, and the figures when it would take a budget past
  // its limit; nothing is taken then.
  static absl::StatusOr<HostCharge> Charge(const std::shared_ptr<HostBudget>& self, uint64_t bytes,
                                           absl::string_view what);

  uint64_t in_use() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t limit() const { return limit_; }
  const std::string& owner() const { return owner_; }

 private:
  friend class HostCharge;
  // Takes `bytes` here, then from the parents; all or nothing.
  absl::Status Take(uint64_t bytes, absl::string_view what) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives `bytes` back here and to the parents.
  void Release(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string owner_;
  const uint64_t limit_;
  const std::shared_ptr<HostBudget> parent_;
  mutable absl::Mutex mu_;
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_HOST_BUDGET_H_
