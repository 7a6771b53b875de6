#include "causeway/runtime/host_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/runtime/memory.h"

namespace causeway {

HostCharge::HostCharge(HostCharge&& other) noexcept
    : budget_(std::move(other.budget_)), bytes_(std::exchange(other.bytes_, 0)) {}

HostCharge& HostCharge::operator=(HostCharge&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = std::move(other.budget_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void HostCharge::Reset() {
  if (budget_ != nullptr) budget_->Release(bytes_);
  budget_.reset();
  bytes_ = 0;
}

absl::StatusOr<HostCharge> HostBudget::Charge(const std::shared_ptr<HostBudget>& self, uint64_t bytes,
                                              absl::string_view what) {
  CAUSEWAY_RETURN_IF_ERROR(self->Take(bytes, what));
  HostCharge charge;
  charge.budget_ = self;
  charge.bytes_ = bytes;
  return charge;
}

absl::Status HostBudget::Take(uint64_t bytes, absl::string_view what) {
  {
    absl::MutexLock lock(&mu_);
    if (bytes > limit_ - in_use_) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", FormatBytes(bytes), " of host memory, past the budget of ", owner_,
                       ": ", FormatBytes(in_use_), " of ", FormatBytes(limit_), " in use"));
    }
    in_use_ += bytes;
  }
  if (parent_ != nullptr) {
    if (absl::Status taken = parent_->Take(bytes, what); !taken.ok()) {
      absl::MutexLock lock(&mu_);
      in_use_ -= bytes;
      return taken;
    }
  }
  return absl::OkStatus();
}

uint64_t HostBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

void HostBudget::Release(uint64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    in_use_ -= bytes;
  }
  if (parent_ != nullptr) parent_->Release(bytes);
}

}  // namespace causeway
