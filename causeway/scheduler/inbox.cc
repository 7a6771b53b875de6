#include "causeway/scheduler/inbox.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/byte_ranges.h"
#include "causeway/base/checked_size.h"
#include "causeway/base/status.h"

namespace causeway {

Inbox::~Inbox() { Close(absl::CancelledError(absl::StrCat(name_, " closed"))); }

void Inbox::Place(Run& run, uint64_t offset, const uint8_t* data, uint64_t length) const {
  for (const Channel::Target& t : run.targets) {
    const uint64_t begin = std::max(offset, t.offset);
    const uint64_t end = std::min(offset + length, t.offset + t.staging->size());
    if (begin >= end) continue;
    uint8_t* dst = static_cast<uint8_t*>(t.staging->mapped()) + (begin - t.offset);
    const uint8_t* src = data + (begin - offset);
    if (dst != src) std::memcpy(dst, src, end - begin);
  }
}

void Inbox::Settle(uint64_t tag, Run& run,
                   std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>>* done) {
  if (!run.open.empty()) return;  // a writer still holds memory of this run
  if (!run.failed.ok()) {
    if (run.expected) {
      done->emplace_back(run.done, run.failed);
      Forget(tag, run.abandoned ? absl::OkStatus() : run.failed);
    }
    // Not yet expected: kept, so that Expect fails at once.
    return;
  }
  if (run.expected && run.ranges.bytes() == run.total) {
    done->emplace_back(run.done, absl::OkStatus());
    Forget(tag, absl::FailedPreconditionError(absl::StrCat(name_, ": run ", tag, " has had its value")));
  }
}

void Inbox::Forget(uint64_t tag, absl::Status late) {
  runs_.erase(tag);
  if (settled_.size() >= kRememberedRuns) {
    settled_.erase(settled_order_.front());
    settled_order_.pop_front();
  }
  if (settled_.insert_or_assign(tag, std::move(late)).second) settled_order_.push_back(tag);
}

Future<> Inbox::Expect(uint64_t tag, uint64_t total, std::vector<Channel::Target> targets) {
  for (const Channel::Target& t : targets) {
    if (t.staging == nullptr || t.staging->mapped() == nullptr || t.offset + t.staging->size() > total ||
        t.offset + t.staging->size() < t.offset) {
      return Future<>::Ready(absl::InternalError(
          absl::StrCat(name_, ": a receive target of run ", tag, " is not host-visible memory within the value")));
    }
  }
  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>> done;
  Future<> future;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = runs_[tag];
    if (slot == nullptr) {
      if (!closed_.ok()) {
        runs_.erase(tag);
        return Future<>::Ready(closed_);
      }
      slot = std::make_unique<Run>();
      slot->total = total;
    }
    Run& run = *slot;
    if (run.expected) {
      return Future<>::Ready(absl::InternalError(absl::StrCat(name_, ": run ", tag, " is received twice")));
    }
    if (run.failed.ok() && run.total != total) {
      run.failed = absl::DataLossError(absl::StrCat(name_, ": run ", tag, " sent a value of ", run.total,
                                                    " bytes where ", total, " were expected"));
    }
    run.expected = true;
    run.targets = std::move(targets);
    run.done = std::make_shared<Promise<>>();
    future = run.done->future();
    if (run.failed.ok() && !run.early.empty()) {
      // Writers still filling parts of it place those parts at their End;
      // the rest is placed now, around them (their bytes, being written
      // without the lock, are not to be read here).
      std::vector<std::pair<uint64_t, uint64_t>> open;
      for (const auto& [id, range] : run.open) open.emplace_back(range.offset, range.offset + range.length);
      std::sort(open.begin(), open.end());
      uint64_t at = 0;
      for (const auto& [begin, end] : open) {
        if (begin > at) Place(run, at, run.early.data() + at, begin - at);
        at = std::max(at, end);
      }
      if (at < run.total) Place(run, at, run.early.data() + at, run.total - at);
      if (run.open.empty()) DropEarly(run);
    }
    Settle(tag, run, &done);
  }
  for (auto& [promise, status] : done) promise->Set(status);
  return future;
}

void Inbox::set_max_total(uint64_t max_total) {
  absl::MutexLock lock(&mu_);
  max_total_ = max_total;
}

absl::StatusOr<Inbox::Slot> Inbox::Begin(uint64_t tag, uint64_t offset, uint64_t length, uint64_t total,
                                         const std::shared_ptr<HostBudget>& budget) {
  if (length == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": run ", tag, " sent 0 bytes at offset ", offset));
  }
  CAUSEWAY_RETURN_IF_ERROR(CheckRange(offset, length, total, absl::StrCat(name_, ": run ", tag)));
  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>> done;
  absl::StatusOr<Slot> slot = BeginRange(tag, offset, length, total, budget, &done);
  for (auto& [promise, status] : done) promise->Set(status);
  return slot;
}

absl::StatusOr<Inbox::Slot> Inbox::BeginRange(
    uint64_t tag, uint64_t offset, uint64_t length, uint64_t total, const std::shared_ptr<HostBudget>& budget,
    std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>>* done) {
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  if (total > max_total_) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": run ", tag, " sent a value of ", total,
                                                   " bytes; its receive takes at most ", max_total_));
  }
  if (auto late = settled_.find(tag); late != settled_.end()) {
    if (late->second.ok()) return Slot{};  // abandoned: dropped
    return late->second;
  }
  auto& slot = runs_[tag];
  if (slot == nullptr) {
    slot = std::make_unique<Run>();
    slot->total = total;
  }
  Run& run = *slot;
  if (run.abandoned) return Slot{};
  if (!run.failed.ok()) return run.failed;
  if (run.total != total) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": run ", tag, " sent a value of ", total,
                                                   " bytes where ", run.total, " were expected"));
  }
  // The run fails with `status`, now if nothing is being written into it.
  auto fail = [&](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    run.failed = status;
    if (run.open.empty()) DropEarly(run);
    Settle(tag, run, done);  // may forget the run
    return status;
  };
  // Within the value (checked above) and overlapping nothing begun, the
  // bytes counted reach the total exactly when every byte has come.
  if (absl::Status taken = run.ranges.Add(offset, length, absl::StrCat(name_, ": run ", tag)); !taken.ok()) {
    return fail(std::move(taken));
  }
  Range range;
  range.offset = offset;
  range.length = length;
  if (!run.expected) {
    // Early: into the inbox's own copy of the whole value.
    if (run.early.empty()) {
      if (budget != nullptr) {
        absl::StatusOr<HostCharge> charge = HostBudget::Charge(
            budget, run.total, absl::StrCat(name_, ": run ", tag, "'s value, come before its receive,"));
        if (!charge.ok()) return fail(charge.status());
        run.early_charge = *std::move(charge);
      }
      run.early.resize(run.total);
    }
    range.data = run.early.data() + offset;
  } else {
    for (const Channel::Target& t : run.targets) {
      if (offset >= t.offset && offset + length <= t.offset + t.staging->size()) {
        range.data = static_cast<uint8_t*>(t.staging->mapped()) + (offset - t.offset);
        break;
      }
    }
    if (range.data == nullptr) {
      if (budget != nullptr) {
        absl::StatusOr<HostCharge> charge =
            HostBudget::Charge(budget, length,
                               absl::StrCat(name_, ": run ", tag, "'s ", length, " bytes at ", offset,
                                            ", across receive targets,"));
        if (!charge.ok()) return fail(charge.status());
        range.own_charge = *std::move(charge);
      }
      range.own.resize(length);
      range.data = range.own.data();
    }
  }
  // The bytes were counted above, so a second writer of the same bytes is
  // refused before it writes; a failed End fails the run anyway.
  const uint64_t id = next_slot_++;
  uint8_t* data = range.data;
  run.open.emplace(id, std::move(range));
  return Slot{data, id};
}

void Inbox::DropEarly(Run& run) {
  std::vector<uint8_t>().swap(run.early);
  run.early_charge.Reset();
}

void Inbox::End(const Slot& slot, absl::Status status) {
  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>> done;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [tag, run] : runs_) {
      auto it = run->open.find(slot.id);
      if (it == run->open.end()) continue;
      Range range = std::move(it->second);
      run->open.erase(it);
      if (!status.ok() && run->failed.ok()) run->failed = status;
      if (run->failed.ok() && run->expected) Place(*run, range.offset, range.data, range.length);
      // Placed, or never to be: nothing reads the early copy any more.
      if ((run->expected || !run->failed.ok()) && run->open.empty()) DropEarly(*run);
      Settle(tag, *run, &done);
      break;
    }
  }
  for (auto& [promise, s] : done) promise->Set(s);
}

absl::Status Inbox::Deliver(uint64_t tag, uint64_t offset, uint64_t total, const void* data, uint64_t length) {
  absl::StatusOr<Slot> slot = Begin(tag, offset, length, total);
  if (!slot.ok()) return slot.status();
  if (slot->data == nullptr) return absl::OkStatus();  // abandoned by the receiver
  std::memcpy(slot->data, data, length);
  End(*slot);
  return absl::OkStatus();
}

void Inbox::Fail(uint64_t tag, const absl::Status& status) {
  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>> done;
  {
    absl::MutexLock lock(&mu_);
    if (settled_.contains(tag)) return;  // over already
    auto& slot = runs_[tag];
    if (slot == nullptr) slot = std::make_unique<Run>();
    if (slot->failed.ok()) slot->failed = status;
    if (slot->open.empty()) DropEarly(*slot);
    Settle(tag, *slot, &done);
  }
  for (auto& [promise, s] : done) promise->Set(s);
}

void Inbox::Abandon(uint64_t tag, const absl::Status& why) {
  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>> done;
  {
    absl::MutexLock lock(&mu_);
    if (settled_.contains(tag)) return;  // over already
    auto it = runs_.find(tag);
    if (it == runs_.end()) {
      Forget(tag, absl::OkStatus());
      return;
    }
    Run& run = *it->second;
    if (!run.failed.ok()) return;
    run.failed =
        why.ok() ? absl::CancelledError(absl::StrCat(name_, ": run ", tag, " abandoned its value")) : why;
    run.abandoned = true;
    if (run.open.empty()) DropEarly(run);
    Settle(tag, run, &done);
  }
  for (auto& [promise, s] : done) promise->Set(s);
}

void Inbox::Close(const absl::Status& status) {
  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>> done;
  {
    absl::MutexLock lock(&mu_);
    if (closed_.ok()) closed_ = status.ok() ? absl::CancelledError(absl::StrCat(name_, " closed")) : status;
    std::vector<uint64_t> tags;
    for (auto& [tag, run] : runs_) tags.push_back(tag);
    for (uint64_t tag : tags) {
      Run& run = *runs_[tag];
      if (run.failed.ok()) run.failed = closed_;
      if (run.open.empty()) DropEarly(run);
      if (run.expected) {
        Settle(tag, run, &done);
      } else if (run.open.empty()) {
        runs_.erase(tag);  // a later Expect sees closed_
      }
    }
  }
  for (auto& [promise, s] : done) promise->Set(s);
}

size_t Inbox::pending() const {
  absl::MutexLock lock(&mu_);
  return runs_.size();
}

}  // namespace causeway
