#include "causeway/runtime/copy_engine.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "causeway/base/trace.h"

namespace causeway {
namespace {

// How long one wait for a copy's input lasts before the engine looks at its
// stop flag again.
constexpr absl::Duration kStopPoll = absl::Milliseconds(100);

absl::Status CheckRegion(const char* what, uint64_t offset, uint64_t size, uint64_t buffer_size) {
  if (offset > buffer_size || size > buffer_size - offset) {
    return absl::OutOfRangeError(absl::StrCat("copy engine: ", what, " range [", offset, ", +", size,
                                              ") is outside a buffer of ", buffer_size, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

CopyEngine::CopyEngine(std::string name, uint64_t chunk_bytes)
    : name_(std::move(name)), chunk_bytes_(std::max<uint64_t>(chunk_bytes, 4096)) {}

CopyEngine::~CopyEngine() { Stop(); }

bool CopyEngine::CanCopy(const Buffer& src, const Buffer& dst) {
  return src.mapped() != nullptr && src.host_coherent() && dst.mapped() != nullptr && dst.host_coherent();
}

Future<> CopyEngine::Copy(std::shared_ptr<Buffer> src, std::shared_ptr<Buffer> dst,
                          std::vector<CommandList::CopyRegion> regions, std::vector<Future<>> waits) {
  if (src == nullptr || dst == nullptr) return Future<>::Ready(absl::InvalidArgumentError("copy engine: null buffer"));
  if (!CanCopy(*src, *dst)) {
    return Future<>::Ready(absl::FailedPreconditionError(absl::StrCat(
        name_, " copies only between mapped, host-coherent buffers; this copy needs the device's own path")));
  }
  for (const CommandList::CopyRegion& r : regions) {
    absl::Status s = CheckRegion("source", r.src_offset, r.size, src->size());
    if (s.ok()) s = CheckRegion("destination", r.dst_offset, r.size, dst->size());
    if (!s.ok()) return Future<>::Ready(s);
  }
  Job job{std::move(src), std::move(dst), std::move(regions), std::move(waits), Promise<>()};
  Future<> done = job.done.future();
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return Future<>::Ready(absl::CancelledError(absl::StrCat(name_, " has stopped")));
  }
  queue_.push_back(std::move(job));
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  return done;
}

void CopyEngine::Stop() {
  std::deque<Job> dropped;
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(queue_);
    thread = std::move(thread_);
  }
  for (Job& job : dropped) job.done.Set(absl::CancelledError(absl::StrCat(name_, " stopped before this copy ran")));
  if (thread.joinable()) thread.join();
}

uint64_t CopyEngine::copies() const {
  absl::MutexLock lock(&mu_);
  return copies_;
}

uint64_t CopyEngine::bytes_copied() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

void CopyEngine::Loop() {
  Tracer::NameThread(name_);
  for (;;) {
    std::optional<Job> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CopyEngine* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, and Stop failed the rest
      job.emplace(std::move(queue_.front()));
      queue_.pop_front();
    }
    Run(*job);
  }
}

absl::Status CopyEngine::AwaitInputs(const Job& job) {
  for (const Future<>& w : job.waits) {
    for (;;) {
      absl::Status s = w.AwaitStatus(absl::Now() + kStopPoll);
      if (!absl::IsDeadlineExceeded(s) || w.IsReady()) {
        if (s.ok()) break;
        return absl::Status(s.code(), absl::StrCat(name_, ": an input of this copy failed: ", s.message()));
      }
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::CancelledError(absl::StrCat(name_, " stopped while this copy waited"));
    }
  }
  return absl::OkStatus();
}

void CopyEngine::Run(Job& job) {
  absl::Status s = AwaitInputs(job);
  if (!s.ok()) {
    job.done.Set(s);
    return;
  }
  const char* from = static_cast<const char*>(job.src->mapped());
  char* to = static_cast<char*>(job.dst->mapped());
  uint64_t moved = 0;
  for (const CommandList::CopyRegion& r : job.regions) {
    for (uint64_t done = 0; done < r.size; done += chunk_bytes_) {
      const uint64_t n = std::min(chunk_bytes_, r.size - done);
      HostSpan span("copy-engine");
      if (span.active()) span.set_args(absl::StrCat("\"bytes\":", n));
      std::memcpy(to + r.dst_offset + done, from + r.src_offset + done, n);
      moved += n;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ++copies_;
    bytes_ += moved;
  }
  job.done.Set(absl::OkStatus());
}

}  // namespace causeway
