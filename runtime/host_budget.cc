#include "runtime/host_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/memory.h"

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
  {
    absl::MutexLock lock(&self->mu_);
    if (bytes > self->limit_ - self->in_use_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needs ", FormatBytes(bytes), " of host memory, past the budget of ", self->owner_, ": ",
          FormatBytes(self->in_use_), " of ", FormatBytes(self->limit_), " in use"));
    }
    self->in_use_ += bytes;
  }
  HostCharge charge;
  charge.budget_ = self;
  charge.bytes_ = bytes;
  return charge;
}

uint64_t HostBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

void HostBudget::Release(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  in_use_ -= bytes;
}

}  // namespace causeway
