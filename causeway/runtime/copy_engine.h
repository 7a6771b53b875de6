// A copy engine: moves bytes into one accelerator's memory off its queue, so
// that a large copy overlaps the compute queued on both of its ends.
//
// A device copy between accelerators runs on the destination's queue (on a
// CPU driver, as one memcpy on the queue's thread): while it runs, nothing
// else does there. Where device memory is mapped and host-coherent (CPU
// drivers, unified-memory GPUs), the engine copies instead on a thread of its
// own: the source's queue is never involved, and the destination's queue
// runs whatever it has while the bytes move. A submission that needs the
// bytes waits on the copy's future (a host gate), like any host future.
//
// Copies run one after another in the order they were asked for, each once
// its waits have resolved, in chunks of at most `chunk_bytes` (a trace span
// each, with its bytes, on the engine's thread: "copy-engine"). In-order
// service cannot deadlock when copies are asked for in one global dispatch
// order (the gang scheduler's): a copy waits only on work dispatched before
// it, and such work never waits on a later copy.
//
// Example:
//   CopyEngine* engine = b->copy_engine();     // null where memory is not host-coherent
//   Future<> copied = engine->Copy(x_on_a, y_on_b, {{0, 0, bytes}}, {x_ready});
//   b->Submit(list_reading_y, {copied});
//
// Thread-safe.
#ifndef CAUSEWAY_RUNTIME_COPY_ENGINE_H_
#define CAUSEWAY_RUNTIME_COPY_ENGINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/future.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/memory.h"

namespace causeway {

class CopyEngine {
 public:
  static constexpr uint64_t kDefaultChunkBytes = 8ull << 20;

  // `name` names the engine in errors and its thread in traces.
  explicit CopyEngine(std::string name, uint64_t chunk_bytes = kDefaultChunkBytes);
  ~CopyEngine();  // Stop()
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Whether the engine can read `src` and write `dst`: both mapped and
  // host-coherent.
  static bool CanCopy(const Buffer& src, const Buffer& dst);

  // Copies `regions` (absolute byte offsets in each buffer) of `src` into
  // `dst` once every future of `waits` has resolved. The future fails
  // without copying when a wait failed (with that wait's error), when a
  // region is outside its buffer or the buffers cannot be copied by the
  // engine (at once), or when the engine stops first. The caller keeps
  // readers of `dst` and writers of `src` behind the future.
  Future<> Copy(std::shared_ptr<Buffer> src, std::shared_ptr<Buffer> dst,
                std::vector<CommandList::CopyRegion> regions, std::vector<Future<>> waits);

  // Fails every copy not yet started (Cancelled), lets the one in progress
  // finish (or fail, if it is still waiting), and ends the thread. Copies
  // asked for later fail at once.
  void Stop();

  const std::string& name() const { return name_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // Copies finished and bytes moved so far.
  uint64_t copies() const;
  uint64_t bytes_copied() const;

 private:
  struct Job {
    std::shared_ptr<Buffer> src, dst;
    std::vector<CommandList::CopyRegion> regions;
    std::vector<Future<>> waits;
    Promise<> done;
  };
  void Loop();
  // Waits for `job`'s inputs; their first error, or Cancelled when stopped.
  absl::Status AwaitInputs(const Job& job);
  void Run(Job& job);

  const std::string name_;
  const uint64_t chunk_bytes_;
  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t copies_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // started by the first copy
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_COPY_ENGINE_H_
