#include "causeway/runtime/accelerator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "causeway/base/fault_injection.h"
#include "causeway/base/seconds.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/runtime/vk_status.h"

namespace causeway {
namespace {

// Bytes read from other accelerators (ICI), as a running total in traces.
void TraceIciBytes(uint64_t bytes) {
  static std::atomic<uint64_t> total{0};
  Tracer::Get().Counter("ICI bytes", -1, static_cast<double>(total.fetch_add(bytes) + bytes));
}

}  // namespace
namespace {

// What an abandoned accelerator leaves behind (Accelerator::Abandon).
struct AbandonedAccelerator {
  std::shared_ptr<Device> device;
  std::vector<std::unique_ptr<MemoryPool>> pools;
  std::unique_ptr<ImportCache> imports;
  std::shared_ptr<void> gate;
  std::vector<std::shared_ptr<CommandList>> lists;
};

ABSL_CONST_INIT absl::Mutex g_abandoned_mu(absl::kConstInit);
std::vector<AbandonedAccelerator*>* g_abandoned ABSL_GUARDED_BY(g_abandoned_mu) = nullptr;

// Every accelerator of the process, for ForEachAccelerator.
ABSL_CONST_INIT absl::Mutex g_registry_mu(absl::kConstInit);
std::vector<Accelerator*>* g_registry ABSL_GUARDED_BY(g_registry_mu) = nullptr;

// How long the completion thread sleeps in one device wait before it looks
// at the shutdown flag again.
constexpr uint64_t kCompletionPollNs = 200'000'000;
// How often a thread waiting on the device with no hold limit in flight
// looks whether the accelerator was quarantined meanwhile (WaitAndRetire).
constexpr absl::Duration kQuarantinePoll = absl::Milliseconds(100);

uint64_t NsUntil(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return UINT64_MAX;
  absl::Duration d = deadline - absl::Now();
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<uint64_t>(absl::ToInt64Nanoseconds(d));
}

// Raises a host-signalled timeline semaphore to `value` unless it is there
// already. Callers serialize the raises of one semaphore: between the read
// and the signal, another raise would make this one go down.
void RaiseTimeline(VkDevice device, VkSemaphore semaphore, uint64_t value) {
  uint64_t current = 0;
  vkGetSemaphoreCounterValue(device, semaphore, &current);
  if (current >= value) return;
  VkSemaphoreSignalInfo info{VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO};
  info.semaphore = semaphore;
  info.value = value;
  vkSignalSemaphore(device, &info);
}

}  // namespace

const char* CopyPathName(CopyPath path) {
  switch (path) {
    case CopyPath::kSameQueue:
      return "same-queue";
    case CopyPath::kSameDevice:
      return "same-device";
    case CopyPath::kExternalMemory:
      return "external-memory";
    case CopyPath::kHostStaged:
      return "host-staged";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Accelerator>> Accelerator::Create(int index, std::shared_ptr<Device> device,
                                                                 uint32_t queue_index,
                                                                 const AcceleratorOptions& options) {
  if (options.ring_capacity == 0) return absl::InvalidArgumentError("ring capacity must be > 0");
  if (queue_index >= device->queue_count()) {
    return absl::InvalidArgumentError(absl::StrCat("queue ", queue_index, " of ", device->queue_count()));
  }
  std::unique_ptr<Accelerator> self(new Accelerator());
  self->index_ = index;
  self->device_ = device;
  self->queue_ = device->queue(queue_index);
  self->queue_mu_ = &device->queue_mutex(queue_index);
  self->capacity_ = options.ring_capacity;
  {
    absl::MutexLock lock(&self->ring_mu_);
    self->slots_.resize(options.ring_capacity);
    self->progress_at_ = absl::Now();
  }

  VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  type.initialValue = 0;
  VkSemaphoreCreateInfo sem{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  sem.pNext = &type;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateSemaphore(device->handle(), &sem, nullptr, &self->timeline_));
  CountVulkanObject(+1);
  self->gate_ = std::make_shared<HostGate>();
  self->gate_->device = device;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateSemaphore(device->handle(), &sem, nullptr, &self->gate_->semaphore));
  CountVulkanObject(+1);
  RegisterHostSignalledSemaphore(self->gate_->semaphore);

  PoolOptions pool;
  pool.kind = MemoryKind::kDevice;
  pool.budget = options.memory_budget;
  pool.exportable = options.exportable_memory;
  pool.host_maps_device_memory = options.host_maps_device_memory;
  CAUSEWAY_ASSIGN_OR_RETURN(self->device_pool_, MemoryPool::Create(self.get(), device, pool));
  pool.budget = UINT64_MAX;
  pool.exportable = false;
  pool.kind = MemoryKind::kUpload;
  CAUSEWAY_ASSIGN_OR_RETURN(self->upload_pool_, MemoryPool::Create(self.get(), device, pool));
  pool.kind = MemoryKind::kReadback;
  CAUSEWAY_ASSIGN_OR_RETURN(self->readback_pool_, MemoryPool::Create(self.get(), device, pool));
  self->imports_ = std::make_unique<ImportCache>(device);
  // A copy engine where device memory is mapped and host-coherent (the
  // first device-local type, the one the device pool takes first), and the
  // host maps it (not with RuntimeOptions::device_memory "discrete").
  for (const auto& type : device->info().memory_types) {
    if (!options.host_maps_device_memory) break;
    if ((type.flags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) == 0) continue;
    constexpr VkMemoryPropertyFlags kHostCoherent =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if ((type.flags & kHostCoherent) == kHostCoherent) {
      self->copy_engine_ = std::make_unique<CopyEngine>(absl::StrCat("copy engine ", index));
    }
    break;
  }
  self->copy_engine_min_bytes_.store(options.copy_engine_min_bytes, std::memory_order_relaxed);

  self->ring_counter_ = absl::StrCat("ring occupancy: accelerator ", index);
  self->completion_thread_ = std::thread([a = self.get()] { a->CompletionLoop(); });
  // A clock that cannot be placed leaves device times on their own clock in
  // traces; nothing else depends on it.
  (void)self->CalibrateClock();
  {
    absl::MutexLock lock(&g_registry_mu);
    if (g_registry == nullptr) g_registry = new std::vector<Accelerator*>;
    g_registry->push_back(self.get());
  }
  return self;
}

void ForEachAccelerator(const std::function<void(Accelerator&)>& fn) {
  absl::MutexLock lock(&g_registry_mu);
  if (g_registry == nullptr) return;
  for (Accelerator* a : *g_registry) fn(*a);
}

Accelerator::~Accelerator() {
  {
    absl::MutexLock lock(&g_registry_mu);
    if (g_registry != nullptr) std::erase(*g_registry, this);
  }
  (void)Flush(absl::Now() + absl::Seconds(30));
  StopCopyEngine();
  ReleaseWaits();
  {
    absl::MutexLock lock(&ring_mu_);
    shutdown_ = true;
  }
  if (completion_thread_.joinable()) completion_thread_.join();
  if (quarantined()) {
    // What held the queue may run on past any deadline: wait a bounded
    // time for the queue to drain, then abandon it rather than hang.
    uint64_t last;
    {
      absl::MutexLock lock(&ring_mu_);
      last = next_value_;
    }
    VkSemaphoreWaitInfo wait{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wait.semaphoreCount = 1;
    wait.pSemaphores = &timeline_;
    wait.pValues = &last;
    if (vkWaitSemaphores(device_->handle(), &wait, absl::ToInt64Nanoseconds(kAbandonAfter)) == VK_TIMEOUT) {
      Abandon();
      return;
    }
  }
  {
    absl::MutexLock queue_lock(queue_mu_);
    vkQueueWaitIdle(queue_);
  }
  {
    absl::MutexLock lock(&ring_mu_);
    lost_lists_.clear();
  }
  // Fail whatever is left (only after a lost device or a stuck wait).
  Retire();
  {
    absl::MutexLock lock(&ring_mu_);
    for (uint64_t v = retired_value_ + 1; v <= next_value_; ++v) {
      Slot& s = slots_[v % capacity_];
      if (s.promise) s.promise->Set(absl::CancelledError(absl::StrCat(name(), " was destroyed with work in flight")));
      s = Slot();
    }
  }
  {
    absl::MutexLock lock(&relay_mu_);
    for (auto& [src, relay] : relays_) {
      UnregisterHostSignalledSemaphore(relay.semaphore);
      vkDestroySemaphore(device_->handle(), relay.semaphore, nullptr);
      CountVulkanObject(-1);
    }
  }
  gate_.reset();
  // Imports and pools go before the semaphore; peers' caches drop our blocks
  // through the listeners registered by the Runtime.
  imports_.reset();
  device_pool_.reset();
  upload_pool_.reset();
  readback_pool_.reset();
  if (timeline_ != VK_NULL_HANDLE) {
    vkDestroySemaphore(device_->handle(), timeline_, nullptr);
    CountVulkanObject(-1);
  }
}

void Accelerator::ReleaseFailedWork() {
  uint64_t last;
  {
    absl::MutexLock lock(&ring_mu_);
    if (health_.ok() || lost_lists_.empty()) return;
    last = next_value_;
  }
  VkSemaphoreWaitInfo wait{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wait.semaphoreCount = 1;
  wait.pSemaphores = &timeline_;
  wait.pValues = &last;
  const VkResult drained =
      vkWaitSemaphores(device_->handle(), &wait, absl::ToInt64Nanoseconds(kAbandonAfter));
  if (drained == VK_TIMEOUT) return;  // still running: kept, and abandoned at destruction
  {
    absl::MutexLock queue_lock(queue_mu_);
    vkQueueWaitIdle(queue_);
  }
  std::vector<std::shared_ptr<CommandList>> lists;
  {
    absl::MutexLock lock(&ring_mu_);
    lists.swap(lost_lists_);
  }
}

void Accelerator::Abandon() {
  absl::Status health;
  size_t lists;
  {
    absl::MutexLock lock(&ring_mu_);
    health = health_;
    lists = lost_lists_.size();
  }
  std::fprintf(
      stderr,
      "causeway: abandoning %s at teardown: its queue was still running %zu submission%s %.1f s after "
      "shutdown began (%s); its memory and VkDevice are kept until the process exits\n",
      name().c_str(), lists, lists == 1 ? "" : "s", absl::ToDoubleSeconds(kAbandonAfter),
      std::string(health.message()).c_str());
  // The device may still read and write all of it: nothing is freed, and
  // the VkDevice (with its instance) is never destroyed. Reachable from a
  // global, so leak checkers do not count it.
  auto* kept = new AbandonedAccelerator;
  kept->device = device_;
  kept->pools.push_back(std::move(device_pool_));
  kept->pools.push_back(std::move(upload_pool_));
  kept->pools.push_back(std::move(readback_pool_));
  kept->imports = std::move(imports_);
  kept->gate = std::move(gate_);
  {
    absl::MutexLock lock(&ring_mu_);
    kept->lists = std::move(lost_lists_);
  }
  absl::MutexLock lock(&g_abandoned_mu);
  if (g_abandoned == nullptr) g_abandoned = new std::vector<AbandonedAccelerator*>;
  g_abandoned->push_back(kept);
}

int AbandonedAccelerators() {
  absl::MutexLock lock(&g_abandoned_mu);
  return g_abandoned == nullptr ? 0 : static_cast<int>(g_abandoned->size());
}

std::string Accelerator::name() const { return absl::StrCat("accelerator ", index_, " (", info().name, ")"); }

absl::StatusOr<std::shared_ptr<Buffer>> Accelerator::CreateBuffer(uint64_t size, uint64_t overwritten) {
  auto b = device_pool_->CreateBuffer(size);
  if (!b.ok() && absl::IsResourceExhausted(b.status())) {
    return absl::ResourceExhaustedError(absl::StrCat(name(), ": ", b.status().message()));
  }
  if (!b.ok()) return b;
  CAUSEWAY_RETURN_IF_ERROR(Zero(*b, overwritten));
  return b;
}

absl::Status Accelerator::Zero(const std::shared_ptr<Buffer>& buffer, uint64_t from) {
  if (from >= buffer->size()) return absl::OkStatus();
  HostSpan span("zero new buffer");
  if (void* bytes = buffer->mapped(); bytes != nullptr) {
    std::memset(static_cast<char*>(bytes) + from, 0, buffer->size() - from);
    if (buffer->host_coherent()) return absl::OkStatus();
    // The reserved range is aligned to nonCoherentAtomSize.
    VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE};
    range.memory = buffer->block()->memory;
    range.offset = buffer->block_offset();
    range.size = buffer->reserved_size();
    return VkStatus(vkFlushMappedMemoryRanges(device_->handle(), 1, &range), "vkFlushMappedMemoryRanges");
  }
  // Not mapped: vkCmdFillBuffer takes whole aligned words (from the word
  // `from` falls in: its first bytes are written later anyway); a tail of
  // 1-3 bytes is copied from zeroed staging memory.
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<CommandList> list, CreateCommandList("zero new buffer"));
  const uint64_t start = from / 4 * 4;
  const uint64_t end = start + (buffer->size() - start) / 4 * 4, tail = buffer->size() - end;
  if (end > start) CAUSEWAY_RETURN_IF_ERROR(list->Fill(BufferArg(buffer, start, end - start), 0));
  if (tail > 0) {
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> zeros, CreateStagingBuffer(tail));
    std::memset(zeros->mapped(), 0, tail);
    CAUSEWAY_RETURN_IF_ERROR(list->Copy(BufferArg(zeros, 0, tail), BufferArg(buffer, end, tail)));
  }
  // Later submissions of this queue run after it (every list begins with a
  // barrier). A submission refused before it reached the queue (the ring's
  // stages failed) never zeroes the buffer, so the buffer is refused too; a
  // failure on the queue later takes the accelerator out of service.
  Future<> zeroed = SubmitInternal(std::move(list), {}, {});
  const absl::Status s = zeroed.IsReady() ? zeroed.AwaitStatus() : KnownStatus(zeroed.timeline_value());
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("zeroing a new buffer of ", buffer->size(), " bytes on ",
                                               name(), ": ", s.message()));
  }
  return absl::OkStatus();
}

void Accelerator::ReleaseUnusedMemory() {
  for (MemoryPool* pool : {device_pool_.get(), upload_pool_.get(), readback_pool_.get()}) {
    if (pool != nullptr) pool->ReleaseUnused();
  }
}

absl::StatusOr<std::shared_ptr<Buffer>> Accelerator::CreateStagingBuffer(uint64_t size, bool readback) {
  return (readback ? readback_pool_ : upload_pool_)->CreateBuffer(size);
}

absl::StatusOr<std::shared_ptr<CommandList>> Accelerator::CreateCommandList(std::string label) {
  return std::make_shared<CommandList>(ReplayKey(), this, std::move(label));
}

CopyPath Accelerator::PathFrom(const Accelerator& src) const {
  if (&src == this) return CopyPath::kSameQueue;
  if (src.device_ == device_) return CopyPath::kSameDevice;
  if (src.info().uuid == info().uuid && src.device_pool_->exportable() && device_->external_memory()) {
    return CopyPath::kExternalMemory;
  }
  return CopyPath::kHostStaged;
}

CopyPath Accelerator::PathFor(const Buffer& src) const {
  CopyPath path = PathFrom(*src.accelerator());
  if (path == CopyPath::kExternalMemory && !src.block()->exportable) return CopyPath::kHostStaged;
  return path;
}

bool Accelerator::has_timestamps() const {
  for (const auto& family : info().queue_families) {
    if (family.index == device_->queue_family()) return family.timestamp_valid_bits > 0;
  }
  return false;
}

absl::Status Accelerator::CalibrateClock() {
  Tracer& tracer = Tracer::Get();
  if (device_->calibrated_timestamps()) {
    absl::StatusOr<int64_t> offset = device_->CalibrateClock();
    if (offset.ok()) {
      clock_offset_ns_ = *offset;
      clock_source_ = 1;
      tracer.NameAccelerator(index_, name(), clock_source());
      return absl::OkStatus();
    }
  }
  if (!has_timestamps()) {
    tracer.NameAccelerator(index_, name(), clock_source());
    return absl::UnimplementedError(absl::StrCat(name(), " writes no timestamps"));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(ClockMeasurement measured, MeasureClockOffset());
  clock_offset_ns_ = measured.offset_ns;
  clock_source_ = 2;
  tracer.NameAccelerator(index_, name(), clock_source());
  return absl::OkStatus();
}

absl::StatusOr<Accelerator::ClockMeasurement> Accelerator::MeasureClockOffset() {
  if (!has_timestamps()) return absl::UnimplementedError(absl::StrCat(name(), " writes no timestamps"));
  // The device's clock at the start of a one-command list lies between the
  // host's readings before the submit and after the wait.
  CAUSEWAY_ASSIGN_OR_RETURN(auto buffer, CreateBuffer(256));
  CAUSEWAY_ASSIGN_OR_RETURN(auto list, CreateCommandList("clock"));
  CAUSEWAY_RETURN_IF_ERROR(list->Fill(BufferArg(buffer, 0, 256), 0));
  ClockMeasurement best{0, INT64_MAX};
  // A loaded host stretches some brackets; more tries find a tight one.
  for (int i = 0; i < 5; ++i) {
    int64_t device_start = -1;
    SubmitOptions options;
    options.on_device_start = [&device_start](int64_t ns) { device_start = ns; };
    int64_t before = Tracer::NowNs();
    CAUSEWAY_RETURN_IF_ERROR(Submit(list, {}, std::move(options)).Await());
    int64_t after = Tracer::NowNs();
    if (device_start >= 0 && after - before < best.bracket_ns) {
      best.bracket_ns = after - before;
      best.offset_ns = before + (after - before) / 2 - device_start;
    }
  }
  if (best.bracket_ns == INT64_MAX)
    return absl::InternalError(absl::StrCat(name(), ": no timestamp came back"));
  return best;
}

std::string Accelerator::clock_source() const {
  switch (clock_source_.load()) {
    case 1: return "calibrated";
    case 2: return "measured";
    default: return "none";
  }
}

uint64_t Accelerator::submitted_value() const {
  absl::MutexLock lock(&ring_mu_);
  return next_value_;
}
uint64_t Accelerator::retired_value() const {
  absl::MutexLock lock(&ring_mu_);
  return retired_value_;
}
size_t Accelerator::in_flight() const {
  absl::MutexLock lock(&ring_mu_);
  return next_value_ - retired_value_;
}

std::optional<WorkInFlight> Accelerator::OldestInFlight() const {
  // Work done on the device is finished even if nobody has retired it yet
  // (retirement waits for someone to want the result).
  uint64_t reached = 0;
  vkGetSemaphoreCounterValue(device_->handle(), timeline_, &reached);
  absl::MutexLock lock(&ring_mu_);
  const absl::Time now = absl::Now();
  const uint64_t done = std::max(retired_value_, std::min(reached, submitted_through_));
  if (done > progress_value_) {
    progress_value_ = done;
    progress_at_ = now;
  }
  const uint64_t head = done + 1;
  if (!health_.ok() || head > next_value_) return std::nullopt;
  const Slot& slot = slots_[head % capacity_];
  WorkInFlight work;
  work.value = head;
  // A slot still being filled by its submitter has no list yet.
  work.what = slot.list == nullptr ? "a submission being made" : WhatOf(slot);
  work.in_flight = next_value_ - done;
  work.since_submit = slot.list == nullptr ? absl::ZeroDuration() : now - slot.submitted_at;
  work.since_progress = now - progress_at_;
  return work;
}

std::string Accelerator::WhatOf(const Slot& slot) {
  if (!slot.what.empty()) return slot.what;
  return absl::StrCat("'", slot.list == nullptr ? "?" : slot.list->label(), "'");
}
void Accelerator::AwaitRingFullForTesting(uint64_t n) const {
  absl::MutexLock lock(&ring_mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ring_mu_) { return ring_full_waits_ >= n; };
  ring_mu_.Await(absl::Condition(&enough));
}
absl::Status Accelerator::health() const {
  absl::MutexLock lock(&ring_mu_);
  return health_;
}

Future<> Accelerator::Submit(const std::shared_ptr<CommandList>& list, absl::Span<const Future<>> waits,
                             SubmitOptions options) {
  if (list == nullptr || list->accelerator() != this) {
    return Future<>::Ready(absl::InvalidArgumentError(
        absl::StrCat("Submit: the command list belongs to ",
                     list == nullptr ? "nobody" : list->accelerator()->name(), ", not ", name())));
  }
  return SubmitInternal(list, waits, {}, std::move(options));
}

Future<> Accelerator::SubmitInternal(std::shared_ptr<CommandList> list, absl::Span<const Future<>> waits,
                                     std::vector<std::function<void()>> on_done, SubmitOptions options) {
  HostSpan span("submit");
  if (!has_timestamps()) {
    options.on_device_time = nullptr;
    options.on_device_start = nullptr;
  }
  const bool timed = options.on_device_time || options.on_device_start;
  if (absl::Status failed = FailedInput(waits); !failed.ok()) return Future<>::Ready(failed);

  absl::MutexLock submit_lock(&submit_mu_);
  absl::StatusOr<Slot*> reserved = ReserveSlot(list, waits, std::move(on_done), options);
  if (!reserved.ok()) return Future<>::Ready(reserved.status());
  Slot* slot = *reserved;
  const uint64_t value = slot->value;
  Promise<> promise;
  promise.SetTimeline(this, value);
  Future<> future = promise.future();

  QueueWaits queue_waits;
  absl::Status status = GatherWaits(waits, span.active(), queue_waits);
  absl::StatusOr<CommandList::Recording*> recording = nullptr;
  if (status.ok()) {
    using Timing = CommandList::Timing;
    recording = list->AcquireRecording(ReplayKey(), Tracer::Get().enabled() ? Timing::kCommands
                                                    : timed                 ? Timing::kList
                                                                            : Timing::kNone);
    if (!recording.ok()) status = recording.status();
  }
  if (status.ok()) {
    status = QueueSubmit(value, queue_waits, (*recording)->cb);
    if (!status.ok()) list->ReleaseRecording(ReplayKey(), *recording);
  }
  if (!status.ok()) {
    SignalSkipped(value);
    Publish(slot, value, std::move(promise), nullptr, status);
    return future;
  }
  Publish(slot, value, std::move(promise), *recording, absl::OkStatus());
  for (const auto& [owner, v] : queue_waits.remote) {
    uint64_t& through = waited_through_[owner];
    through = std::max(through, v);
  }
  if (span.active()) {
    if (list->peer_read_bytes() > 0) TraceIciBytes(list->peer_read_bytes());
    span.set_flow(TraceFlowId(index_, value));
    span.set_args(absl::StrCat("\"accelerator\":", index_, ",\"submission\":", value, ",\"waits\":[",
                               queue_waits.traced, "]"));
    Tracer::Get().Counter(ring_counter_, index_, static_cast<double>(value - retired_value()));
  }
  return future;
}

absl::Status Accelerator::FailedInput(absl::Span<const Future<>> waits) {
  for (const Future<>& w : waits) {
    if (!w.valid()) return absl::InvalidArgumentError("Submit: invalid wait future");
    // A submission that failed is known before its slot retires; look first,
    // then at the future (which resolves when the slot retires).
    if (auto* owner = dynamic_cast<const Accelerator*>(w.timeline_driver()); owner != nullptr) {
      absl::Status known = owner->KnownStatus(w.timeline_value());
      if (!known.ok()) {
        return absl::Status(known.code(),
                            absl::StrCat("an input of this submission failed: ", known.message()));
      }
    }
    if (w.IsReady()) {
      absl::Status s = w.AwaitStatus();
      if (!s.ok())
        return absl::Status(s.code(), absl::StrCat("an input of this submission failed: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Accelerator::Slot*> Accelerator::ReserveSlot(std::shared_ptr<CommandList> list,
                                                            absl::Span<const Future<>> waits,
                                                            std::vector<std::function<void()>> on_done,
                                                            SubmitOptions& options) {
  while (true) {
    uint64_t oldest;
    {
      absl::MutexLock lock(&ring_mu_);
      if (!health_.ok()) return health_;
      if (next_value_ - retired_value_ < capacity_) {
        const uint64_t value = ++next_value_;
        // Nobody else touches this slot until it is marked submitted, except
        // AddRelayTarget, which takes ring_mu_.
        Slot* slot = &slots_[value % capacity_];
        *slot = Slot();
        slot->value = value;
        slot->list = std::move(list);
        slot->on_done = std::move(on_done);
        slot->on_device_time = std::move(options.on_device_time);
        slot->on_device_start = std::move(options.on_device_start);
        slot->hold_limit = options.hold_limit;
        if (options.hold_limit != absl::InfiniteDuration()) ++limited_in_flight_;
        slot->what = std::move(options.what);
        slot->submitted_at = absl::Now();
        slot->inputs.assign(waits.begin(), waits.end());
        return slot;
      }
      oldest = retired_value_ + 1;
      ++ring_full_waits_;
    }
    // Backpressure: the ring is full; retire the oldest slot on this thread
    // (or sleep while another thread waits for it).
    HostSpan wait_span("ring-full");
    WaitFor(oldest, absl::InfiniteFuture());
  }
}

absl::Status Accelerator::GatherWaits(absl::Span<const Future<>> waits, bool traced, QueueWaits& out) {
  // Remote values an earlier submission to this queue already waited for.
  auto waited = [this](const Accelerator* owner, uint64_t v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    auto it = waited_through_.find(owner);
    return it != waited_through_.end() && it->second >= v;
  };
  auto trace_wait = [&](const Accelerator* owner, uint64_t v) {
    if (!traced) return;
    if (!out.traced.empty()) out.traced += ",";
    if (owner == nullptr) {
      out.traced += "{\"host\":true}";
    } else {
      absl::StrAppend(&out.traced, "{\"accelerator\":", owner->index_, ",\"submission\":", v, "}");
    }
  };
  auto add = [&out](VkSemaphore semaphore, uint64_t value) {
    out.semaphores.push_back(semaphore);
    out.values.push_back(value);
  };
  // Several inputs from other VkDevices: one host gate that opens when the
  // last of them is done, so the queue wakes once rather than once per input.
  absl::InlinedVector<const Future<>*, 4> remote;
  for (const Future<>& w : waits) {
    auto* owner = dynamic_cast<Accelerator*>(w.timeline_driver());
    if (owner != nullptr && owner->device_ != device_ && !w.IsReady() && !waited(owner, w.timeline_value())) {
      remote.push_back(&w);
    }
  }
  const bool join_remote = remote.size() > 1;
  if (join_remote) {
    struct Join {
      std::atomic<int> left;
      Promise<> done;
    };
    auto join = std::make_shared<Join>();
    join->left = static_cast<int>(remote.size());
    for (const Future<>* w : remote) {
      const auto* owner = dynamic_cast<const Accelerator*>(w->timeline_driver());
      trace_wait(owner, w->timeline_value());
      out.remote.emplace_back(owner, w->timeline_value());
      // Failures are the slot's to see when it retires (it checks its inputs).
      w->OnReady([join](const absl::Status&) {
        if (join->left.fetch_sub(1) == 1) join->done.Set(absl::OkStatus());
      });
    }
    CAUSEWAY_ASSIGN_OR_RETURN(uint64_t gate, AddHostGate(join->done.future()));
    add(gate_->semaphore, gate);
  }
  for (const Future<>& w : waits) {
    auto* owner = dynamic_cast<Accelerator*>(w.timeline_driver());
    if (owner == nullptr) {
      if (w.IsReady()) continue;
      trace_wait(nullptr, 0);
      CAUSEWAY_ASSIGN_OR_RETURN(uint64_t gate, AddHostGate(w));
      add(gate_->semaphore, gate);
      continue;
    }
    if (owner == this) continue;  // same queue: in order
    if (owner->device_ == device_) {
      trace_wait(owner, w.timeline_value());
      add(owner->timeline_, w.timeline_value());
      continue;
    }
    if (join_remote || waited(owner, w.timeline_value())) continue;  // behind the gate above, or before
    CAUSEWAY_ASSIGN_OR_RETURN(VkSemaphore relay, RelayFrom(owner));
    if (owner->AddRelayTarget(w.timeline_value(), this)) {
      trace_wait(owner, w.timeline_value());
      add(relay, w.timeline_value());
      out.remote.emplace_back(owner, w.timeline_value());
    }
  }
  return absl::OkStatus();
}

absl::Status Accelerator::QueueSubmit(uint64_t value, const QueueWaits& waits, VkCommandBuffer cb) {
  std::vector<VkPipelineStageFlags> stages(waits.semaphores.size(), VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
  VkTimelineSemaphoreSubmitInfo timeline{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  timeline.waitSemaphoreValueCount = static_cast<uint32_t>(waits.values.size());
  timeline.pWaitSemaphoreValues = waits.values.data();
  timeline.signalSemaphoreValueCount = 1;
  timeline.pSignalSemaphoreValues = &value;
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.pNext = &timeline;
  submit.waitSemaphoreCount = static_cast<uint32_t>(waits.semaphores.size());
  submit.pWaitSemaphores = waits.semaphores.data();
  submit.pWaitDstStageMask = stages.data();
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &cb;
  submit.signalSemaphoreCount = 1;
  submit.pSignalSemaphores = &timeline_;
  VkResult result;
  int countdown = faults_.fail_submit_countdown.load();
  if (countdown > 0 && faults_.fail_submit_countdown.fetch_sub(1) == 1) {
    result = faults_.submit_error;
  } else if (ShouldInjectFault(FaultPoint::kSubmission)) {
    return InjectedFaultError(VkStatus(VK_ERROR_OUT_OF_HOST_MEMORY, "").code(), FaultPoint::kSubmission,
                              absl::StrCat("vkQueueSubmit on ", name(), ": VK_ERROR_OUT_OF_HOST_MEMORY"));
  } else {
    absl::MutexLock queue_lock(queue_mu_);
    result = vkQueueSubmit(queue_, 1, &submit, VK_NULL_HANDLE);
  }
  if (result != VK_SUCCESS) return VkStatus(result, absl::StrCat("vkQueueSubmit on ", name()));
  return absl::OkStatus();
}

void Accelerator::SignalSkipped(uint64_t value) {
  VkTimelineSemaphoreSubmitInfo timeline{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  timeline.signalSemaphoreValueCount = 1;
  timeline.pSignalSemaphoreValues = &value;
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.pNext = &timeline;
  submit.signalSemaphoreCount = 1;
  submit.pSignalSemaphores = &timeline_;
  VkResult result;
  {
    absl::MutexLock queue_lock(queue_mu_);
    result = vkQueueSubmit(queue_, 1, &submit, VK_NULL_HANDLE);
  }
  if (result != VK_SUCCESS) {
    // This value will never be signalled: fail everything in flight.
    FailDevice(VkStatus(result, absl::StrCat("signalling a failed submission on ", name())));
  }
}

void Accelerator::Publish(Slot* slot, uint64_t value, Promise<> promise, CommandList::Recording* recording,
                          absl::Status status) {
  absl::Status lost;
  {
    absl::MutexLock lock(&ring_mu_);
    if (value > retired_value_) {
      slot->status = std::move(status);
      slot->recording = recording;
      slot->promise.emplace(std::move(promise));
      slot->submitted = true;
      submitted_through_ = value;
      return;
    }
    // FailDevice ran while this was being submitted and failed the slot.
    lost = health_;
  }
  promise.Set(lost);
}

absl::StatusOr<uint64_t> Accelerator::AddHostGate(const Future<>& host_future) {
  uint64_t value;
  {
    absl::MutexLock lock(&gate_->mu);
    value = ++gate_->next;
  }
  host_future.OnReady([gate = gate_, value](const absl::Status&) { gate->Resolve(value); });
  return value;
}

void Accelerator::HostGate::Resolve(uint64_t value) {
  absl::MutexLock lock(&mu);
  resolved.push_back(value);
  std::push_heap(resolved.begin(), resolved.end(), std::greater<>());
  uint64_t raise = signalled;
  while (!resolved.empty() && resolved.front() == raise + 1) {
    std::pop_heap(resolved.begin(), resolved.end(), std::greater<>());
    resolved.pop_back();
    ++raise;
  }
  if (raise == signalled) return;
  signalled = raise;
  RaiseTimeline(device->handle(), semaphore, raise);
}

Accelerator::HostGate::~HostGate() {
  if (semaphore == VK_NULL_HANDLE) return;
  UnregisterHostSignalledSemaphore(semaphore);
  vkDestroySemaphore(device->handle(), semaphore, nullptr);
  CountVulkanObject(-1);
}

absl::Status Accelerator::KnownStatus(uint64_t value) const {
  absl::MutexLock lock(&ring_mu_);
  if (value <= retired_value_ || value > next_value_) return absl::OkStatus();
  return slots_[value % capacity_].status;
}

bool Accelerator::AddRelayTarget(uint64_t value, Accelerator* target) {
  absl::MutexLock lock(&ring_mu_);
  if (value <= retired_value_) return false;
  Slot& s = slots_[value % capacity_];
  if (std::find(s.relay_targets.begin(), s.relay_targets.end(), target) == s.relay_targets.end()) {
    s.relay_targets.push_back(target);
  }
  wanted_.insert(value);  // the completion thread signals the relay when it is done
  return true;
}

absl::StatusOr<VkSemaphore> Accelerator::RelayFrom(const Accelerator* source) {
  absl::MutexLock lock(&relay_mu_);
  Relay& relay = relays_[source];
  if (relay.semaphore == VK_NULL_HANDLE) {
    VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo sem{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    sem.pNext = &type;
    VkResult r = vkCreateSemaphore(device_->handle(), &sem, nullptr, &relay.semaphore);
    if (r != VK_SUCCESS) {
      relays_.erase(source);
      return VkStatus(r, "creating a relay semaphore");
    }
    CountVulkanObject(+1);
    RegisterHostSignalledSemaphore(relay.semaphore);
  }
  return relay.semaphore;
}

void Accelerator::SignalRelay(const Accelerator* source, uint64_t value) {
  // The relay mirrors the source's timeline, so the source's raises only
  // rise; but this accelerator's ReleaseWaits raises it too, from another
  // thread. Both raise under relay_mu_, so a raise never signals a value
  // below one already signalled (a timeline may never go down).
  absl::MutexLock lock(&relay_mu_);
  auto relay = relays_.find(source);
  if (relay == relays_.end()) return;  // made at registration
  RaiseTimeline(device_->handle(), relay->second.semaphore, value);
}

void Accelerator::WaitFor(uint64_t value, absl::Time deadline) {
  {
    absl::MutexLock lock(&ring_mu_);
    while (true) {
      if (value <= retired_value_ || !health_.ok()) return;
      // Another thread waits on the device for this value or an earlier one:
      // sleep until it has retired what it waited for, then look again.
      if (device_waits_.empty() || *device_waits_.begin() > value) break;
      auto moved = [this, value, waited = *device_waits_.begin()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ring_mu_) {
        return value <= retired_value_ || !health_.ok() || device_waits_.empty() ||
               *device_waits_.begin() != waited;
      };
      if (!ring_mu_.AwaitWithDeadline(absl::Condition(&moved), deadline)) return;
    }
    device_waits_.insert(value);
  }
  WaitAndRetire(value, deadline);
  absl::MutexLock lock(&ring_mu_);
  device_waits_.erase(device_waits_.find(value));
}

void Accelerator::WantCompletion(uint64_t value) {
  absl::MutexLock lock(&ring_mu_);
  if (value > retired_value_) wanted_.insert(value);
}

void Accelerator::CompletionLoop() {
  Tracer::NameThread(absl::StrCat("completion ", index_));
  while (true) {
    uint64_t target;
    bool held;
    {
      absl::MutexLock lock(&ring_mu_);
      // Submissions with a hold limit in flight: every kHoldPoll, retire
      // what is done and look at the oldest left.
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ring_mu_) {
        return shutdown_ || (health_.ok() && (!wanted_.empty() || limited_in_flight_ > 0));
      };
      ring_mu_.Await(absl::Condition(&work));
      if (shutdown_) return;
      held = limited_in_flight_ > 0;
      target = wanted_.empty() ? retired_value_ + 1 : *wanted_.begin();
    }
    absl::Duration wait = absl::Nanoseconds(kCompletionPollNs);
    if (held) {
      Retire();
      wait = std::min({wait, kHoldPoll, CheckHold()});
    }
    WaitAndRetire(target, absl::Now() + wait);
  }
}

absl::Duration Accelerator::CheckHold() {
  uint64_t culprit;
  std::string what;
  absl::Duration held, limit;
  {
    absl::MutexLock lock(&ring_mu_);
    const uint64_t head = retired_value_ + 1;
    if (!health_.ok() || head > submitted_through_) return absl::InfiniteDuration();
    const Slot& slot = slots_[head % capacity_];
    if (slot.hold_limit == absl::InfiniteDuration()) return absl::InfiniteDuration();
    const absl::Time now = absl::Now();
    if (hold_value_ != head) {
      hold_value_ = head;
      hold_since_ = absl::InfiniteFuture();
    }
    if (hold_since_ == absl::InfiniteFuture()) {
      // Still waiting for an input (another accelerator, another island):
      // not yet holding this queue.
      for (const Future<>& in : slot.inputs) {
        if (!in.IsReady()) return kHoldPoll;
      }
      hold_since_ = now;
    }
    held = now - hold_since_;
    if (held <= slot.hold_limit) return slot.hold_limit - held;
    culprit = head;
    what = WhatOf(slot);
    limit = slot.hold_limit;
  }
  const std::string times = absl::StrCat(FormatSeconds(held), ", past its limit of ", FormatSeconds(limit));
  Fail(absl::UnavailableError(absl::StrCat(name(), " is quarantined: ", what, " held it for ", times)),
       culprit,
       absl::DeadlineExceededError(
           absl::StrCat(what, " ran on ", name(), " for ", times, "; the accelerator is quarantined")));
  return absl::InfiniteDuration();
}

void Accelerator::WaitAndRetire(uint64_t value, absl::Time deadline) {
  // The accelerator may be quarantined while this waits (work past its hold
  // limit, a stopping process, a lost device seen by another thread), and a
  // device wait would not see it: the work it waits for may never end. So
  // it waits in slices, looking between: short ones while work with a hold
  // limit is in flight (the completion thread measures it meanwhile),
  // longer ones otherwise. A wait shorter than a slice is one device wait.
  while (true) {
    absl::Duration poll;
    {
      absl::MutexLock lock(&ring_mu_);
      if (value <= retired_value_ || !health_.ok()) return;
      poll = limited_in_flight_ > 0 ? kHoldPoll : kQuarantinePoll;
    }
    const absl::Time slice = std::min(deadline, absl::Now() + poll);
    WaitAndRetireOnce(value, slice);
    if (slice >= deadline) return;
  }
}

void Accelerator::WaitAndRetireOnce(uint64_t value, absl::Time deadline) {
  VkSemaphoreWaitInfo wait{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wait.semaphoreCount = 1;
  wait.pSemaphores = &timeline_;
  wait.pValues = &value;
  const int countdown = faults_.lose_device_countdown.load();
  if (countdown > 0 && faults_.lose_device_countdown.fetch_sub(1) == 1) {
    FailDevice(VkStatus(VK_ERROR_DEVICE_LOST, absl::StrCat("waiting on ", name())));
    return;
  }
  if (ShouldInjectFault(FaultPoint::kDeviceWait)) {
    FailDevice(InjectedFaultError(absl::StatusCode::kUnavailable, FaultPoint::kDeviceWait,
                                  absl::StrCat("vkWaitSemaphores on ", name(), ": VK_ERROR_DEVICE_LOST")));
    return;
  }
  VkResult r = vkWaitSemaphores(device_->handle(), &wait, NsUntil(deadline));
  if (r == VK_SUCCESS) {
    Retire();
  } else if (r != VK_TIMEOUT) {
    FailDevice(VkStatus(r, absl::StrCat("waiting on ", name())));
  }
}

void Accelerator::Retire() {
  // Callbacks run under this lock, in order; they must not block on this
  // accelerator (see Future::OnReady).
  retire_mu_.Lock();
  std::optional<HostSpan> span;  // made once something retires
  uint64_t reached = 0;
  vkGetSemaphoreCounterValue(device_->handle(), timeline_, &reached);
  while (true) {
    Slot slot;
    Future<> unresolved;  // an input of the next slot that has not resolved
    {
      absl::MutexLock lock(&ring_mu_);
      uint64_t v = retired_value_ + 1;
      if (v > submitted_through_ || v > reached) break;
      Slot& s = slots_[v % capacity_];
      if (s.status.ok()) {
        for (const Future<>& in : s.inputs) {
          if (!in.IsReady()) {
            unresolved = in;
            break;
          }
        }
      }
      if (!unresolved.valid()) {
        // Relay targets stay in the ring until the slot is marked retired, so
        // a registration never falls between the two.
        slot.value = s.value;
        slot.list = std::move(s.list);
        slot.recording = s.recording;
        slot.promise = std::move(s.promise);
        slot.status = std::move(s.status);
        slot.inputs = std::move(s.inputs);
        slot.on_done = std::move(s.on_done);
        slot.on_device_time = std::move(s.on_device_time);
        slot.on_device_start = std::move(s.on_device_start);
      }
    }
    if (unresolved.valid()) {
      // The input's work is done (this queue waited for it), but its own
      // accelerator has not retired it yet. Retiring it from here could need
      // this accelerator's later values in turn (a device that shares this
      // VkDevice waits on this timeline directly), so this thread never
      // drives another accelerator's retirement while it holds retire_mu_:
      // it asks the owner to retire the input and waits, holding nothing.
      retire_mu_.Unlock();
      auto resolved = std::make_shared<absl::Notification>();
      unresolved.OnReady([resolved](const absl::Status&) { resolved->Notify(); });
      resolved->WaitForNotification();
      retire_mu_.Lock();
      continue;
    }
    if (!span) span.emplace("complete");
    absl::Status status = slot.status;
    for (const Future<>& in : slot.inputs) {
      if (!status.ok()) break;
      // Resolved: the loop above waited for any that was not.
      absl::Status s = in.AwaitStatus();
      if (!s.ok()) {
        status = absl::Status(s.code(), absl::StrCat("an input of this submission failed: ", s.message()));
      }
    }
    int64_t device_ns = -1;
    if (slot.recording != nullptr) {
      int64_t list_begin = -1;
      device_ns = slot.list->CollectTimestamps(ReplayKey(), slot.recording, index_, slot.value,
                                               clock_offset_ns(), &list_begin);
      if (status.ok() && slot.on_device_start && list_begin >= 0) slot.on_device_start(list_begin);
      slot.list->ReleaseRecording(ReplayKey(), slot.recording);
    }
    if (status.ok()) {
      for (auto& step : slot.on_done) step();
      if (slot.on_device_time && device_ns >= 0) slot.on_device_time(device_ns);
    }
    slot.on_done.clear();
    slot.on_device_time = nullptr;
    slot.on_device_start = nullptr;
    slot.list.reset();  // may free buffers and staging memory
    {
      absl::MutexLock lock(&ring_mu_);
      Slot& s = slots_[slot.value % capacity_];
      slot.relay_targets = std::move(s.relay_targets);
      if (s.hold_limit != absl::InfiniteDuration()) --limited_in_flight_;
      s = Slot();
      retired_value_ = slot.value;  // frees the slot for the next submitter
      if (retired_value_ > progress_value_) {
        progress_value_ = retired_value_;
        progress_at_ = absl::Now();
      }
      wanted_.erase(wanted_.begin(), wanted_.upper_bound(retired_value_));
    }
    slot.promise->Set(status);
    if (!slot.relay_targets.empty()) {
      HostSpan relay("relay");
      for (Accelerator* target : slot.relay_targets) target->SignalRelay(this, slot.value);
    }
    if (span->active()) {
      span->set_args(absl::StrCat("\"accelerator\":", index_, ",\"through\":", slot.value));
      Tracer::Get().Counter(ring_counter_, index_, static_cast<double>(submitted_value() - slot.value));
    }
  }
  retire_mu_.Unlock();
}

void Accelerator::FailDevice(absl::Status status) {
  Fail(absl::UnavailableError(absl::StrCat(name(), " is lost: ", status.message())), 0, absl::OkStatus());
}

void Accelerator::Quarantine(absl::string_view why) {
  Fail(absl::UnavailableError(absl::StrCat(name(), " is quarantined: ", why)), 0, absl::OkStatus());
}

void Accelerator::Fail(absl::Status health, uint64_t culprit, absl::Status culprit_status) {
  absl::MutexLock retire_lock(&retire_mu_);
  std::vector<Slot> failed;
  {
    absl::MutexLock lock(&ring_mu_);
    if (!health_.ok()) return;  // failed already: the first reason stays
    health_ = std::move(health);
    // Slots still being submitted are failed too; their submitter sees that
    // (value <= retired_value_) when it publishes and resolves them.
    for (uint64_t v = retired_value_ + 1; v <= next_value_; ++v) {
      failed.push_back(std::move(slots_[v % capacity_]));
      slots_[v % capacity_] = Slot();
    }
    retired_value_ = submitted_through_ = next_value_;
    wanted_.clear();
    limited_in_flight_ = 0;
  }
  absl::Status s;
  {
    absl::MutexLock lock(&ring_mu_);
    s = health_;
  }
  for (Slot& slot : failed) {
    // The device may still hold these recordings (a fault injected on a live
    // device); keep them until it is idle at destruction.
    if (slot.list != nullptr) {
      absl::MutexLock lock(&ring_mu_);
      lost_lists_.push_back(std::move(slot.list));
    }
    if (slot.promise) slot.promise->Set(slot.value == culprit ? culprit_status : s);
    // Wake dependants on other devices; they see this failure when they retire.
    for (Accelerator* target : slot.relay_targets) target->SignalRelay(this, slot.value);
  }
  // Queues of the same VkDevice wait on this timeline directly, not on a
  // relay: let this queue drain (work still waiting on the host runs now,
  // its futures already failed), so that its values are signalled and they
  // see the failure when they retire instead of waiting for ever.
  ReleaseWaits();
}

void Accelerator::ReleaseWaits() {
  // Whatever still waits on the host (an unresolved host future, a peer that
  // is gone) is let through, so the queue drains and nothing hangs. Values
  // signalled later are ignored (they are lower).
  constexpr uint64_t kReleased = uint64_t{1} << 62;
  auto release = [this](VkSemaphore sem) { RaiseTimeline(device_->handle(), sem, kReleased); };
  if (gate_ != nullptr) {
    absl::MutexLock lock(&gate_->mu);
    release(gate_->semaphore);
    gate_->signalled = kReleased;
  }
  absl::MutexLock lock(&relay_mu_);
  for (auto& [source, relay] : relays_) release(relay.semaphore);
}

absl::Status Accelerator::Flush(absl::Time deadline) {
  uint64_t last;
  {
    absl::MutexLock lock(&ring_mu_);
    last = next_value_;
    if (last <= retired_value_) return health_;
  }
  WaitAndRetire(last, deadline);
  absl::MutexLock lock(&ring_mu_);
  auto done = [this, last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ring_mu_) { return retired_value_ >= last; };
  if (!ring_mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(name(), ": work still in flight at the deadline"));
  }
  return health_;
}

Future<> Accelerator::Upload(const std::shared_ptr<Buffer>& dst, const void* data, uint64_t size, uint64_t offset,
                             absl::Span<const Future<>> waits) {
  HostSpan span("upload");
  if (dst == nullptr || dst->accelerator() != this) {
    return Future<>::Ready(absl::InvalidArgumentError(absl::StrCat("Upload: the buffer is not on ", name())));
  }
  if (size == 0 || offset + size > dst->size() || offset + size < offset) {
    return Future<>::Ready(absl::OutOfRangeError(
        absl::StrCat("Upload: ", size, " bytes at offset ", offset, " do not fit a buffer of ", dst->size())));
  }
  auto staging = CreateStagingBuffer(size);
  if (!staging.ok()) return Future<>::Ready(staging.status());
  std::memcpy((*staging)->mapped(), data, size);
  auto list = CreateCommandList("upload");
  if (!list.ok()) return Future<>::Ready(list.status());
  absl::Status s = (*list)->Copy(BufferArg(*staging, 0, size), BufferArg(dst, offset, size));
  if (!s.ok()) return Future<>::Ready(s);
  return SubmitInternal(*list, waits, {});
}

Future<> Accelerator::Download(const std::shared_ptr<Buffer>& src, void* out, uint64_t size, uint64_t offset,
                               absl::Span<const Future<>> waits) {
  HostSpan span("download");
  if (src == nullptr || src->accelerator() != this) {
    return Future<>::Ready(absl::InvalidArgumentError(absl::StrCat("Download: the buffer is not on ", name())));
  }
  if (size == 0 || offset + size > src->size() || offset + size < offset) {
    return Future<>::Ready(absl::OutOfRangeError(
        absl::StrCat("Download: ", size, " bytes at offset ", offset, " do not fit a buffer of ", src->size())));
  }
  auto staging = CreateStagingBuffer(size, /*readback=*/true);
  if (!staging.ok()) return Future<>::Ready(staging.status());
  auto list = CreateCommandList("download");
  if (!list.ok()) return Future<>::Ready(list.status());
  absl::Status s = (*list)->Copy(BufferArg(src, offset, size), BufferArg(*staging, 0, size));
  if (!s.ok()) return Future<>::Ready(s);
  std::shared_ptr<Buffer> keep = *staging;
  return SubmitInternal(*list, waits, {[keep, out, size] { std::memcpy(out, keep->mapped(), size); }});
}

absl::Status Accelerator::UploadSync(const std::shared_ptr<Buffer>& dst, const void* data, uint64_t size,
                                     uint64_t offset) {
  return Upload(dst, data, size, offset).Await();
}

absl::Status Accelerator::DownloadSync(const std::shared_ptr<Buffer>& src, void* out, uint64_t size,
                                       uint64_t offset) {
  return Download(src, out, size, offset).Await();
}

Future<> Accelerator::Copy(const BufferArg& src, const BufferArg& dst, absl::Span<const Future<>> waits) {
  HostSpan span("copy");
  if (src.buffer == nullptr || dst.buffer == nullptr) {
    return Future<>::Ready(absl::InvalidArgumentError("Copy: null buffer"));
  }
  if (dst.buffer->accelerator() != this) {
    return Future<>::Ready(absl::InvalidArgumentError(
        absl::StrCat("Copy: the destination is on ", dst.buffer->accelerator()->name(), ", not ", name())));
  }
  if (PathFor(*src.buffer) == CopyPath::kHostStaged) return HostStagedCopy(src, dst, waits);
  auto list = CreateCommandList("copy");
  if (!list.ok()) return Future<>::Ready(list.status());
  absl::Status s = (*list)->Copy(src, dst);
  if (!s.ok()) return Future<>::Ready(s);
  return SubmitInternal(*list, waits, {});
}

Future<> Accelerator::HostStagedCopy(const BufferArg& src, const BufferArg& dst, absl::Span<const Future<>> waits) {
  Accelerator* from = src.buffer->accelerator();
  for (const BufferArg* a : {&src, &dst}) {
    uint64_t size = a->buffer->size();
    if (a->offset > size || (a->size != VK_WHOLE_SIZE && a->size > size - a->offset)) {
      return Future<>::Ready(absl::OutOfRangeError(absl::StrCat("Copy: range [", a->offset, ", +", a->size,
                                                                ") is outside a buffer of ", size, " bytes")));
    }
  }
  uint64_t size = src.resolved_size();
  if (size != dst.resolved_size() || size == 0) {
    return Future<>::Ready(absl::InvalidArgumentError(absl::StrCat(
        "Copy: source has ", size, " bytes, destination ", dst.resolved_size(), " (they must match and be > 0)")));
  }
  // Download on the source into this side's upload staging (the host copy
  // runs when that download retires), then copy on this accelerator after it:
  // both are submitted now, so work queued here later waits in order.
  auto staging = CreateStagingBuffer(size);
  if (!staging.ok()) return Future<>::Ready(staging.status());
  std::shared_ptr<Buffer> stage = *staging;
  Future<> downloaded = from->Download(src.buffer, stage->mapped(), size, src.offset, waits);
  if (Tracer::Get().enabled()) TraceIciBytes(size);
  auto list = CreateCommandList("copy-staged");
  if (!list.ok()) return Future<>::Ready(list.status());
  absl::Status s = (*list)->Copy(BufferArg(stage, 0, size), dst);
  if (!s.ok()) return Future<>::Ready(s);
  Future<> inputs[] = {downloaded};
  return SubmitInternal(*list, inputs, {});
}

}  // namespace causeway
