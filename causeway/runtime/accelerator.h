// An accelerator: one Vulkan compute queue with its own memory budget, one
// timeline semaphore and a ring of in-flight submissions.
//
// Ring-buffer futures: every submission takes a slot keyed by the next value of
// the accelerator's timeline semaphore and signals that value when it ends. The
// ring has a fixed number of slots; a full ring blocks the submitter until the
// oldest slot retires (backpressure). Slots retire in order; retiring reads
// device timestamps, runs host steps (downloads), fails the slot if one of its
// inputs failed, wakes dependent accelerators on other VkDevices (the host
// relay), recycles the recording and resolves the future.
//
// Who retires: whoever needs the result, on its own thread, so that no thread
// hand-off sits on the critical path. A thread in Await waits on the timeline
// semaphore itself and retires; a submitter facing a full ring does the same
// for the oldest slot. Only one thread waits on the device for any value: a
// thread wanting a later value than one already awaited sleeps on the ring
// until that wait has retired, and takes over if its value is still ahead
// (a driver wakes every thread in a semaphore wait at each signal, so many
// device waiters would all wake for every submission). The completion thread waits on the device only for
// slots that must resolve without being awaited: those with an OnReady
// callback or a dependant on another VkDevice.
//
// Dependencies: Submit takes futures of earlier submissions. On the same queue
// nothing is needed (the queue is in order and every list begins with a
// barrier); on another queue of the same VkDevice the submission waits on that
// queue's timeline; across VkDevices, where semaphores cannot be shared, it
// waits on a host-signalled relay semaphore that the producer's retirement
// signals. Nothing on the submit path waits for a device.
//
// Thread-safe. Owned by a Runtime.
#ifndef CAUSEWAY_RUNTIME_ACCELERATOR_H_
#define CAUSEWAY_RUNTIME_ACCELERATOR_H_

#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/base/future.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/copy_engine.h"
#include "causeway/runtime/device.h"
#include "causeway/runtime/memory.h"

namespace causeway {

// How data moves from one accelerator to another.
enum class CopyPath {
  kSameQueue,       // both on one queue
  kSameDevice,      // queues of one VkDevice: vkCmdCopyBuffer, shared semaphores
  kExternalMemory,  // VkDevices of one physical device: imported memory, device copy
  kHostStaged,      // neither: through host memory
};
const char* CopyPathName(CopyPath path);

struct AcceleratorOptions {
  uint64_t memory_budget = 0;    // bytes of device buffers; 0 = the heap's share
  uint32_t ring_capacity = 64;   // in-flight submissions
  bool exportable_memory = false;
  // Copies into this accelerator of at least this many bytes a device go by
  // its copy engine where it has one (copy_engine.h); UINT64_MAX: never.
  uint64_t copy_engine_min_bytes = UINT64_MAX;
  // Whether the host maps device memory where the driver lets it
  // (PoolOptions::host_maps_device_memory).
  bool host_maps_device_memory = true;
};

// Per-submission options.
struct SubmitOptions {
  // Called with the submission's device time in ns (between timestamps at the
  // start and end of its list; the sum over its commands when traced) when
  // it retires successfully, on the retiring thread. Must not block on this
  // accelerator. Null: the list is not timed (no timestamps, no cost). Never
  // called where the queue has no timestamps (Accelerator::has_timestamps).
  std::function<void(int64_t)> on_device_time;
  // Called with the device timestamp (ns on the device's own clock) at the
  // start of the list when it retires successfully (clock calibration).
  // Null: not asked. Never called where the queue has no timestamps.
  std::function<void(int64_t)> on_device_start;
  // The longest this submission may hold the queue once it runs (it is the
  // oldest in flight and its inputs are done). Vulkan cannot take work back
  // from a queue, so past it nothing behind it could run: the accelerator is
  // quarantined (Quarantine), this submission's future fails with
  // DeadlineExceeded and every other one with Unavailable. Measured by the
  // completion thread, which looks every kHoldPoll while such a submission
  // is the oldest. Infinite: no limit.
  absl::Duration hold_limit = absl::InfiniteDuration();
  // What the submission is, for those messages and for reports of what an
  // accelerator is running (the watchdog, a command stopped by a signal):
  // "gang call 'spin' (kernel 'spin') of program 'p'". The list's label when
  // empty.
  std::string what;
};

// An accelerator's oldest unfinished submission (Accelerator::OldestInFlight).
struct WorkInFlight {
  uint64_t value = 0;           // its timeline value
  std::string what;             // SubmitOptions::what
  size_t in_flight = 0;         // unfinished submissions, this one included
  absl::Duration since_submit;  // how long ago it was submitted
  // Since the accelerator was last seen to finish a submission (retired, or
  // done on the device by its timeline), or was made.
  absl::Duration since_progress;
};

// Test hooks to make real failures happen on purpose.
struct FaultInjection {
  // The Nth submission from now (1 = the next) fails as if vkQueueSubmit had
  // returned `submit_error`; 0 = none.
  std::atomic<int> fail_submit_countdown{0};
  VkResult submit_error = VK_ERROR_OUT_OF_HOST_MEMORY;
  // The Nth device wait from now (1 = the next) reports
  // VK_ERROR_DEVICE_LOST; 0 = none. (The process-wide point kDeviceWait of
  // fault_injection.h does the same for whichever accelerator waits.)
  std::atomic<int> lose_device_countdown{0};
};

// How many accelerators this process has abandoned (Accelerator::
// kAbandonAfter). A process that has abandoned one should leave with _exit:
// the device may still be running work that static destructors would pull
// from under it.
int AbandonedAccelerators();

class Accelerator;
// Calls `fn` for every accelerator of this process that exists now, in the
// order they were made, holding the registry: `fn` must not make or destroy
// accelerators. For reports that have no runtime at hand (a command stopped
// by a signal).
void ForEachAccelerator(const std::function<void(Accelerator&)>& fn);

class Accelerator final : public TimelineDriver {
 public:
  static absl::StatusOr<std::unique_ptr<Accelerator>> Create(int index, std::shared_ptr<Device> device,
                                                             uint32_t queue_index,
                                                             const AcceleratorOptions& options);
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  int index() const { return index_; }
  std::string name() const;  // "accelerator 2 (llvmpipe ...)"
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& shared_device() const { return device_; }
  const PhysicalDeviceInfo& info() const { return device_->info(); }
  // What planners read of this device (no Vulkan types).
  const DeviceCapabilities& capabilities() const { return device_->capabilities(); }
  VkQueue queue() const { return queue_; }
  // Whether this queue writes timestamps (device times, traces).
  bool has_timestamps() const;
  // Places this accelerator's timestamps on the host's CLOCK_MONOTONIC:
  // through VK_EXT_calibrated_timestamps where the device has it, otherwise
  // by a timestamp written by a submission bracketed by host clock reads
  // (the tightest of a few). Done at creation; again on demand (drift).
  absl::Status CalibrateClock();
  // Host ns minus device ns; and how it was found: "calibrated", "measured"
  // or "none" (no timestamps).
  int64_t clock_offset_ns() const { return clock_offset_ns_.load(std::memory_order_relaxed); }
  std::string clock_source() const;
  // The offset by the measured method alone: host ns minus device ns, taken at
  // the middle of the tightest bracket (host reads before the submit and after
  // the wait) of a few tries. Its error is at most half that bracket, which
  // grows with the host's load.
  struct ClockMeasurement {
    int64_t offset_ns = 0;
    int64_t bracket_ns = 0;
  };
  absl::StatusOr<ClockMeasurement> MeasureClockOffset();
  uint32_t ring_capacity() const { return capacity_; }

  // --- memory ---
  // A device-local buffer counted against the budget, zero from byte
  // `overwritten` on: the pool's ranges pass between clients and sessions,
  // so a buffer never shows what a freed one held. Bytes [0, overwritten)
  // keep what the range held: the caller promises that its first writer
  // writes them all before anyone can read them, or fails whatever would
  // read them (a receive fills its value whole or fails its array). Memory
  // the host maps is zeroed here; other memory by a fill submitted now,
  // which the in-order queue runs before any later submission of this
  // accelerator.
  absl::StatusOr<std::shared_ptr<Buffer>> CreateBuffer(uint64_t size, uint64_t overwritten = 0);
  // A host-visible staging buffer (not counted against the budget).
  absl::StatusOr<std::shared_ptr<Buffer>> CreateStagingBuffer(uint64_t size, bool readback = false);
  uint64_t memory_budget() const { return device_pool_->budget(); }
  uint64_t memory_in_use() const { return device_pool_->bytes_in_use(); }
  uint64_t memory_reserved() const { return device_pool_->bytes_reserved(); }
  MemoryPool& device_pool() { return *device_pool_; }
  // Frees the blocks of every pool (device, upload and readback staging)
  // that no buffer uses, kept for reuse (MemoryPool::ReleaseUnused).
  void ReleaseUnusedMemory();
  // This accelerator's imports of peers' memory (cached per block).
  ImportCache* imports_for_peers() { return imports_.get(); }

  // Copies `size` bytes of host memory into `dst` at `offset`. The bytes are
  // copied before this returns; the future resolves when they are on the device.
  Future<> Upload(const std::shared_ptr<Buffer>& dst, const void* data, uint64_t size, uint64_t offset = 0,
                  absl::Span<const Future<>> waits = {});
  // Copies `size` bytes of `src` at `offset` to `out`, which must stay valid
  // until the future resolves.
  Future<> Download(const std::shared_ptr<Buffer>& src, void* out, uint64_t size, uint64_t offset = 0,
                    absl::Span<const Future<>> waits = {});
  absl::Status UploadSync(const std::shared_ptr<Buffer>& dst, const void* data, uint64_t size, uint64_t offset = 0);
  absl::Status DownloadSync(const std::shared_ptr<Buffer>& src, void* out, uint64_t size, uint64_t offset = 0);

  // --- work ---
  absl::StatusOr<std::shared_ptr<CommandList>> CreateCommandList(std::string label = "");
  // Submits `list` (of this accelerator) to run after `waits`. Never waits for
  // the device; blocks only while the ring is full. A failed input fails the
  // returned future (an input known to have failed when this is called keeps
  // the work from running at all; otherwise its outputs are undefined and
  // the future carries the input's error). `waits` may be device
  // futures of any accelerator or host futures (a promise resolved by any
  // thread: the queue holds at that point until it resolves).
  Future<> Submit(const std::shared_ptr<CommandList>& list, absl::Span<const Future<>> waits = {},
                  SubmitOptions options = {});
  // Copies src (on any accelerator) into dst (on this one) by the best path
  // there is (see PathFrom), after `waits`.
  Future<> Copy(const BufferArg& src, const BufferArg& dst, absl::Span<const Future<>> waits = {});
  CopyPath PathFrom(const Accelerator& src) const;
  // The path for copying out of `src` specifically: staging buffers are not
  // exportable, so they go through the host even where devices share memory.
  CopyPath PathFor(const Buffer& src) const;

  // --- copy engine ---
  // The engine that copies into this accelerator's memory off its queue
  // (copy_engine.h); null where device memory is not mapped host-coherent.
  CopyEngine* copy_engine() const { return copy_engine_.get(); }
  // Whether a copy of `bytes` into this accelerator should go by the engine:
  // there is one and the copy is at least copy_engine_min_bytes. Programs ask
  // when they are loaded.
  bool UsesCopyEngine(uint64_t bytes) const {
    return copy_engine_ != nullptr && bytes >= copy_engine_min_bytes_.load(std::memory_order_relaxed);
  }
  uint64_t copy_engine_min_bytes() const { return copy_engine_min_bytes_.load(std::memory_order_relaxed); }
  void set_copy_engine_min_bytes(uint64_t bytes) {
    copy_engine_min_bytes_.store(bytes, std::memory_order_relaxed);
  }
  // Stops the engine (CopyEngine::Stop); the runtime does it for every
  // accelerator, once all are idle, before any goes.
  void StopCopyEngine() {
    if (copy_engine_ != nullptr) copy_engine_->Stop();
  }

  // Blocks until everything submitted so far has retired (or failed).
  absl::Status Flush(absl::Time deadline = absl::InfiniteFuture());

  // --- observation ---
  uint64_t submitted_value() const;  // the last timeline value handed out
  uint64_t retired_value() const;    // the last timeline value retired
  size_t in_flight() const;
  // The oldest submission the device has not finished (one that is done but
  // not yet retired counts as finished); nullopt when there is none, or the
  // accelerator has failed (its work failed with it).
  std::optional<WorkInFlight> OldestInFlight() const ABSL_LOCKS_EXCLUDED(ring_mu_);
  // A test hook: blocks until Submit has found the ring full `n` times in all
  // (each time, the submitting thread then waits for the oldest slot).
  void AwaitRingFullForTesting(uint64_t n) const;
  // OK, or the sticky error that ended this accelerator: Unavailable naming
  // it, "... is lost: ..." (the device was lost) or "... is quarantined: ..."
  // (work held it past its limit).
  absl::Status health() const;
  bool quarantined() const { return !health().ok(); }
  // Takes this accelerator out of service for good: every submission in
  // flight fails now with Unavailable "NAME is quarantined: WHY" (the device
  // may still be running it; its lists are kept until the device is idle)
  // and so does every later one. Idempotent (the first reason stays).
  void Quarantine(absl::string_view why);
  // After a failure, the recordings the failed work may still be running on
  // the device are kept, with the buffers they bind, some of them other
  // accelerators'. Once the queue has drained (waiting at most
  // kAbandonAfter; past that the accelerator is abandoned at destruction),
  // this drops them. The Runtime calls it for every accelerator before it
  // destroys any, so no buffer outlives its own VkDevice. No-op when healthy.
  void ReleaseFailedWork() ABSL_LOCKS_EXCLUDED(ring_mu_);
  // How often the completion thread looks at a submission with a hold limit.
  static constexpr absl::Duration kHoldPoll = absl::Milliseconds(20);
  // At destruction, how long a quarantined accelerator's queue may take to
  // drain before it is abandoned: a line on stderr names it, and its memory
  // and VkDevice are kept, never freed, until the process exits (the device
  // may still be using them). Teardown never waits for ever.
  static constexpr absl::Duration kAbandonAfter = absl::Seconds(1);
  FaultInjection& faults() { return faults_; }

  // TimelineDriver (for the futures of this accelerator's submissions).
  void WaitFor(uint64_t value, absl::Time deadline) override;
  void WantCompletion(uint64_t value) override;

 private:
  struct Slot {
    uint64_t value = 0;
    bool submitted = false;
    std::shared_ptr<CommandList> list;
    CommandList::Recording* recording = nullptr;
    std::optional<Promise<>> promise;  // set once submitted; empty slots allocate nothing
    absl::Status status;              // an error known before retirement
    std::vector<Future<>> inputs;     // checked for failure at retirement
    std::vector<Accelerator*> relay_targets;
    std::vector<std::function<void()>> on_done;  // host steps, run at success
    std::function<void(int64_t)> on_device_time;
    std::function<void(int64_t)> on_device_start;
    absl::Duration hold_limit = absl::InfiniteDuration();
    std::string what;
    absl::Time submitted_at;
  };
  // Waits on host futures: gate values are handed out in submission order and
  // the gate semaphore is raised to the highest value below which every host
  // future has resolved (the queue runs in order, so a later gate value never
  // needs to pass before an earlier one). Shared with the futures' callbacks,
  // which may run after the accelerator is gone.
  struct HostGate {
    std::shared_ptr<Device> device;
    absl::Mutex mu;
    VkSemaphore semaphore = VK_NULL_HANDLE;
    uint64_t next ABSL_GUARDED_BY(mu) = 0;       // last gate value handed out
    uint64_t signalled ABSL_GUARDED_BY(mu) = 0;  // the semaphore's value
    std::vector<uint64_t> resolved ABSL_GUARDED_BY(mu);  // resolved values above `signalled` (a min-heap)
    void Resolve(uint64_t value);
    ~HostGate();
  };
  // SubmitOptions::what of a slot, or its list's label.
  static std::string WhatOf(const Slot& slot);
  // A gate value that is reached once `host_future` resolves.
  absl::StatusOr<uint64_t> AddHostGate(const Future<>& host_future);

  // A host-signalled semaphore on this device that mirrors a peer's timeline.
  struct Relay {
    VkSemaphore semaphore = VK_NULL_HANDLE;
  };

  Accelerator() = default;
  // Registers `target` to be woken when `value` retires here; false when it
  // already has (nothing to wait for).
  bool AddRelayTarget(uint64_t value, Accelerator* target) ABSL_LOCKS_EXCLUDED(ring_mu_);
  absl::StatusOr<VkSemaphore> RelayFrom(const Accelerator* source) ABSL_LOCKS_EXCLUDED(relay_mu_);
  void SignalRelay(const Accelerator* source, uint64_t value) ABSL_LOCKS_EXCLUDED(relay_mu_);
  void CompletionLoop();
  // Waits for `value` on the timeline until `deadline`, then retires what is done.
  void WaitAndRetire(uint64_t value, absl::Time deadline);
  // One device wait for `value` until `deadline`, then retires what is done.
  void WaitAndRetireOnce(uint64_t value, absl::Time deadline);
  // Retires every submitted slot the device has finished, in order.
  void Retire() ABSL_LOCKS_EXCLUDED(ring_mu_, retire_mu_);
  void FailDevice(absl::Status status);
  // Gives up on a quarantined queue that would not drain (kAbandonAfter).
  void Abandon();
  // Fails every slot in flight and every later submission with `health`;
  // the slot of value `culprit` (0: none) with `culprit_status` instead.
  void Fail(absl::Status health, uint64_t culprit, absl::Status culprit_status);
  // Quarantines this accelerator if its oldest submission has held it past
  // its hold limit; the time until it would (infinite: no limit applies).
  absl::Duration CheckHold() ABSL_LOCKS_EXCLUDED(ring_mu_);
  // Zeroes a new device buffer from byte `from` on (see CreateBuffer).
  absl::Status Zero(const std::shared_ptr<Buffer>& buffer, uint64_t from);
  // Marks a slot submitted (or resolves it, if FailDevice already failed it).
  void Publish(Slot* slot, uint64_t value, Promise<> promise, CommandList::Recording* recording,
               absl::Status status) ABSL_LOCKS_EXCLUDED(ring_mu_);
  // The error of an in-flight submission known before it retires (it never
  // reached the queue); OK otherwise.
  absl::Status KnownStatus(uint64_t value) const ABSL_LOCKS_EXCLUDED(ring_mu_);
  void ReleaseWaits();
  // Submits in stages: inputs that already failed fail the submission; a
  // slot of the ring and its timeline value (waiting while the ring is
  // full); what the queue must wait for; the queue submission, or, where
  // any stage failed, an empty one that keeps the timeline whole.
  Future<> SubmitInternal(std::shared_ptr<CommandList> list, absl::Span<const Future<>> waits,
                          std::vector<std::function<void()>> on_done, SubmitOptions options = {});
  // The first of `waits` known to have failed (or to be invalid), as this
  // submission's error; OK when none has.
  static absl::Status FailedInput(absl::Span<const Future<>> waits);
  // The next slot, filled with the submission; blocks while the ring is
  // full. The accelerator's error when it is out of service.
  absl::StatusOr<Slot*> ReserveSlot(std::shared_ptr<CommandList> list, absl::Span<const Future<>> waits,
                                    std::vector<std::function<void()>> on_done, SubmitOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) ABSL_LOCKS_EXCLUDED(ring_mu_);
  // What a submission's queue waits on.
  struct QueueWaits {
    absl::InlinedVector<VkSemaphore, 4> semaphores;
    absl::InlinedVector<uint64_t, 4> values;
    // Values of accelerators on other VkDevices waited for (waited_through_
    // once the submission is queued).
    absl::InlinedVector<std::pair<const Accelerator*, uint64_t>, 4> remote;
    std::string traced;  // the waits as trace JSON, when traced
  };
  // The semaphores `waits` need: none for this queue's own values or ones
  // ready; the timeline of an accelerator on this VkDevice; a relay from one
  // on another VkDevice (a single host gate for several); a host gate for a
  // host future.
  absl::Status GatherWaits(absl::Span<const Future<>> waits, bool traced, QueueWaits& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // vkQueueSubmit of `cb`, signalling `value` after `waits` (or the fault
  // injected in its place).
  absl::Status QueueSubmit(uint64_t value, const QueueWaits& waits, VkCommandBuffer cb);
  // Keeps the timeline whole for a submission that never reached the queue:
  // an empty one signals `value` after everything before it; when even that
  // fails, the accelerator fails.
  void SignalSkipped(uint64_t value);
  Future<> HostStagedCopy(const BufferArg& src, const BufferArg& dst, absl::Span<const Future<>> waits);

  int index_ = 0;
  std::shared_ptr<Device> device_;
  VkQueue queue_ = VK_NULL_HANDLE;
  absl::Mutex* queue_mu_ = nullptr;  // the device's, for queue_
  VkSemaphore timeline_ = VK_NULL_HANDLE;
  uint32_t capacity_ = 0;
  std::unique_ptr<MemoryPool> device_pool_;
  std::unique_ptr<MemoryPool> upload_pool_;
  std::unique_ptr<MemoryPool> readback_pool_;
  std::unique_ptr<ImportCache> imports_;
  std::unique_ptr<CopyEngine> copy_engine_;
  std::atomic<uint64_t> copy_engine_min_bytes_{UINT64_MAX};
  FaultInjection faults_;
  std::atomic<int64_t> clock_offset_ns_{0};
  std::atomic<int> clock_source_{0};  // 0 none, 1 calibrated, 2 measured
  // Trace counter names, made once.
  std::string ring_counter_;

  // Serializes submissions: timeline values must reach the queue in order.
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(ring_mu_);
  // Per accelerator on another VkDevice, the highest of its values that a
  // submission to this queue has waited for (through a relay or a host
  // gate). The queue runs in order, so a later submission needs no wait of
  // its own for that value or an earlier one: each would be a host hop.
  absl::flat_hash_map<const Accelerator*, uint64_t> waited_through_ ABSL_GUARDED_BY(submit_mu_);
  // Serializes retirement, so slots resolve in order.
  absl::Mutex retire_mu_ ABSL_ACQUIRED_BEFORE(ring_mu_);
  mutable absl::Mutex ring_mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(ring_mu_);
  uint64_t next_value_ ABSL_GUARDED_BY(ring_mu_) = 0;     // last value handed out
  uint64_t retired_value_ ABSL_GUARDED_BY(ring_mu_) = 0;  // last value retired
  // The highest value seen finished (retired, or reached by the timeline
  // when OldestInFlight looked), and when it was first seen.
  mutable uint64_t progress_value_ ABSL_GUARDED_BY(ring_mu_) = 0;
  mutable absl::Time progress_at_ ABSL_GUARDED_BY(ring_mu_);
  uint64_t submitted_through_ ABSL_GUARDED_BY(ring_mu_) = 0;
  // How many times Submit found the ring full (AwaitRingFullForTesting).
  uint64_t ring_full_waits_ ABSL_GUARDED_BY(ring_mu_) = 0;
  // Values that must retire without being awaited (callbacks, relays); the
  // completion thread serves the smallest.
  absl::btree_set<uint64_t> wanted_ ABSL_GUARDED_BY(ring_mu_);
  // Values threads in WaitFor are waiting on the device for.
  absl::btree_multiset<uint64_t> device_waits_ ABSL_GUARDED_BY(ring_mu_);
  absl::Status health_ ABSL_GUARDED_BY(ring_mu_);
  // The oldest submission as the completion thread last saw it, and since
  // when it has run (its inputs done); InfiniteFuture: not yet running.
  uint64_t hold_value_ ABSL_GUARDED_BY(ring_mu_) = 0;
  int limited_in_flight_ ABSL_GUARDED_BY(ring_mu_) = 0;  // slots with a hold limit
  absl::Time hold_since_ ABSL_GUARDED_BY(ring_mu_) = absl::InfiniteFuture();
  bool shutdown_ ABSL_GUARDED_BY(ring_mu_) = false;
  std::vector<std::shared_ptr<CommandList>> lost_lists_ ABSL_GUARDED_BY(ring_mu_);

  absl::Mutex relay_mu_;
  absl::flat_hash_map<const Accelerator*, Relay> relays_ ABSL_GUARDED_BY(relay_mu_);

  std::shared_ptr<HostGate> gate_;  // made at creation

  std::thread completion_thread_;
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_ACCELERATOR_H_
