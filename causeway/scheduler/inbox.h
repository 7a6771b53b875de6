// The receiving end of a channel (channel.h), whatever carries the bytes:
// it matches what arrives for a run (by tag) with where that run's receive
// step wants it, whichever comes first.
//
// Bytes that arrive before their run's receive is dispatched wait in host
// memory of the inbox's own; bytes that arrive after go straight into the
// receiving devices' staging when a range falls within one device's part
// (always so when both sides have the same layout, or the value is
// replicated on the receiving side), and are copied to every other device
// that holds them.
#ifndef CAUSEWAY_SCHEDULER_INBOX_H_
#define CAUSEWAY_SCHEDULER_INBOX_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/byte_ranges.h"
#include "causeway/base/future.h"
#include "causeway/runtime/host_budget.h"
#include "causeway/scheduler/channel.h"

namespace causeway {

// Thread-safe. Bytes come in as Begin/End pairs (a writer may take its time
// between them, e.g. reading a socket into the returned memory); several
// ranges may be in progress at once.
class Inbox {
 public:
  // `name` describes the channel in errors ("channel 3 from island 'b'").
  // `max_total` bounds every run's value (see set_max_total).
  explicit Inbox(std::string name, uint64_t max_total = UINT64_MAX)
      : name_(std::move(name)), max_total_(max_total) {}
  ~Inbox();

  // The receive step of run `tag`: resolves once `total` bytes have arrived
  // and are in every target. Fails if the run was already failed (Fail) or
  // the inbox closed, or if a receive for `tag` is already waiting.
  Future<> Expect(uint64_t tag, uint64_t total, std::vector<Channel::Target> targets);

  // The largest value a run may send: the receive's declared size when the
  // bytes come from a peer, so that a data header cannot make the inbox
  // allocate an early-arrival buffer of any size it names.
  void set_max_total(uint64_t max_total);

  // Where `length` bytes at `offset` of run `tag`'s `total`-byte value go.
  // The memory stays valid until the matching End. InvalidArgument when the
  // range is outside the value, `total` is more than max_total (refused
  // before anything is allocated) or disagrees with what this run expects;
  // the run's own error when it already failed, FailedPrecondition when it
  // has had its whole value (for the last kRememberedRuns runs). A range that overlaps one
  // already begun (bytes sent twice) fails the run with DataLoss: counted
  // twice, they would complete the value with bytes never sent; a value in
  // more than ByteRanges::kMaxPieces separate pieces fails it with
  // ResourceExhausted.
  // `data` null: nobody wants the bytes any more (the run abandoned its
  // receive); the writer drops them and calls no End.
  struct Slot {
    uint8_t* data = nullptr;
    uint64_t id = 0;  // for End
  };
  // Bytes that come before their run's Expect are kept in a copy of the
  // whole value, charged to `budget` when one is given (the budget of the
  // session the bytes came through) until the run has them placed or ends:
  // past it the run fails with the budget's ResourceExhausted. So is the
  // copy of a range that falls within no single target (it straddles two
  // devices' parts), from Begin to End.
  absl::StatusOr<Slot> Begin(uint64_t tag, uint64_t offset, uint64_t length, uint64_t total,
                             const std::shared_ptr<HostBudget>& budget = nullptr);
  // The bytes of `slot` are in place (ok) or will never be (an error: the
  // run fails with it).
  void End(const Slot& slot, absl::Status status = absl::OkStatus());

  // Copies `length` bytes in (Begin, memcpy, End).
  absl::Status Deliver(uint64_t tag, uint64_t offset, uint64_t total, const void* data, uint64_t length);

  // Run `tag` will not get its bytes: its receive fails with `status` (now,
  // or when it is dispatched).
  void Fail(uint64_t tag, const absl::Status& status);
  // Run `tag` no longer wants its bytes (Channel::Abandon): its receive
  // fails with `why` once no writer holds its memory, and its bytes that come
  // from now on are dropped (Begin gives a null slot). Nothing once the run
  // has had its value or failed.
  void Abandon(uint64_t tag, const absl::Status& why);
  // Every run, waiting or to come, fails with `status` (the sender is lost).
  void Close(const absl::Status& status);

  // Runs with bytes or receives outstanding (for tests and leak checks).
  size_t pending() const;
  const std::string& name() const { return name_; }

 private:
  struct Run;
  struct Range {
    uint64_t offset = 0, length = 0;
    uint8_t* data = nullptr;  // where the writer puts the bytes
    std::vector<uint8_t> own;  // when they go to no single target directly
    HostCharge own_charge;     // what `own` holds of a sender's budget
  };
  struct Run {
    uint64_t total = 0;
    ByteRanges ranges;  // begun so far
    bool expected = false;
    std::vector<Channel::Target> targets;
    std::vector<uint8_t> early;  // bytes that came before Expect
    HostCharge early_charge;     // what `early` holds of a sender's budget
    std::shared_ptr<Promise<>> done;
    Future<> future;
    absl::Status failed;
    bool abandoned = false;                     // failed by Abandon: later bytes are dropped quietly
    absl::flat_hash_map<uint64_t, Range> open;  // by slot id
  };
  // Begin after the checks that need no lock; a receive that the range
  // fails is added to `done`, to be resolved outside the lock.
  absl::StatusOr<Slot> BeginRange(uint64_t tag, uint64_t offset, uint64_t length, uint64_t total,
                                  const std::shared_ptr<HostBudget>& budget,
                                  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>>* done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the run's early copy and gives back its charge.
  static void DropEarly(Run& run);
  // Copies the run's early bytes into its targets.
  void Place(Run& run, uint64_t offset, const uint8_t* data, uint64_t length) const;
  // Resolves and forgets `tag` if it is complete or failed (returns the
  // promise to set outside the lock).
  void Settle(uint64_t tag, Run& run, std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>>* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Forgets a run that is over; `late` is what bytes for it get from now on.
  void Forget(uint64_t tag, absl::Status late) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // How many runs that are over are remembered, so that bytes coming after
  // (sent twice, or after the run failed here) are refused rather than kept
  // for a receive that will not come.
  static constexpr size_t kRememberedRuns = 1024;

  const std::string name_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Run>> runs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_slot_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t max_total_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  // By tag: what late bytes get (ok: they are dropped, the run abandoned them).
  absl::flat_hash_map<uint64_t, absl::Status> settled_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> settled_order_ ABSL_GUARDED_BY(mu_);                   // oldest first
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_INBOX_H_
