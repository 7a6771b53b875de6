// Device memory: large VkDeviceMemory blocks sub-allocated into buffers, with a
// per-accelerator budget, and the import of a peer device's blocks (the path
// that copies between VkDevices use).
#ifndef CAUSEWAY_RUNTIME_MEMORY_H_
#define CAUSEWAY_RUNTIME_MEMORY_H_

#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "causeway/runtime/device.h"
#include "causeway/runtime/suballocator.h"

namespace causeway {

class Accelerator;
class MemoryPool;

enum class MemoryKind {
  kDevice,    // device-local: kernels' working memory, counted against the budget
  kUpload,    // host-visible, coherent: staging for uploads
  kReadback,  // host-visible, cached where possible: staging for downloads
};
const char* MemoryKindName(MemoryKind kind);

// One VkDeviceMemory, sub-allocated. Owned by its pool; freed when empty
// (one empty block per pool is kept for reuse).
struct MemoryBlock {
  uint64_t id = 0;  // process-unique, the key of peers' import caches
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint64_t size = 0;
  uint32_t type_index = 0;
  bool exportable = false;
  bool host_coherent = false;  // mapped, and host access needs no flush or invalidate
  bool dedicated = false;  // made for one buffer over half a standard block
  bool spare = false;      // dedicated, empty, kept for the next buffer that fits
  void* mapped = nullptr;  // for host-visible kinds
  SubAllocator ranges;
  explicit MemoryBlock(uint64_t capacity) : ranges(capacity) {}
};

// A buffer on one accelerator. Not copyable; usually held as
// std::shared_ptr<Buffer> so that recorded work keeps it alive. Destroying a
// buffer returns its bytes to the pool and the budget at once. Thread-safe
// (immutable after creation).
class Buffer {
 public:
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint64_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  Accelerator* accelerator() const { return accelerator_; }
  VkBuffer handle() const { return buffer_; }
  // Host pointer to the bytes, for host-visible memory; null otherwise.
  void* mapped() const;
  // Whether the host may read and write the bytes through mapped() with no
  // flush or invalidate: staging memory, and device memory too on lavapipe
  // and unified-memory GPUs.
  bool host_coherent() const;
  const MemoryBlock* block() const { return block_; }
  uint64_t block_offset() const { return offset_; }
  uint64_t reserved_size() const { return reserved_; }

 private:
  friend class MemoryPool;
  Buffer() = default;
  Accelerator* accelerator_ = nullptr;
  MemoryPool* pool_ = nullptr;
  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  MemoryBlock* block_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t reserved_ = 0;
  uint64_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kDevice;
};

struct PoolOptions {
  MemoryKind kind = MemoryKind::kDevice;
  uint64_t budget = UINT64_MAX;         // bytes of live buffers allowed
  uint64_t block_size = 64ull << 20;    // requests over half of this get a block of their own
  // Emptied blocks of their own kept for reuse (a program's large outputs
  // come back every run): the next buffer that fits takes one with its pages
  // and peers' imports in place. Never more than this many, and never when
  // keeping one would take the memory held over the budget.
  int max_spare_blocks = 4;
  bool exportable = false;              // blocks exportable as opaque fds
  // Device memory only: whether the host maps it where the driver lets it.
  // Off, every buffer's mapped() is null even on host-visible memory, so
  // that the runtime takes the discrete GPU's staging paths
  // (RuntimeOptions::device_memory).
  bool host_maps_device_memory = true;
};

// The memory of one kind on one accelerator. Thread-safe.
class MemoryPool {
 public:
  static absl::StatusOr<std::unique_ptr<MemoryPool>> Create(Accelerator* accelerator,
                                                            std::shared_ptr<Device> device,
                                                            const PoolOptions& options);
  ~MemoryPool();

  // A buffer of `size` bytes (> 0). ResourceExhausted, with the figures, when
  // it would take the pool over its budget; the driver is never asked.
  absl::StatusOr<std::shared_ptr<Buffer>> CreateBuffer(uint64_t size);

  uint64_t budget() const { return options_.budget; }
  uint64_t bytes_in_use() const;      // live buffers, as reserved
  uint64_t bytes_reserved() const;    // VkDeviceMemory held (spare blocks too)
  uint64_t bytes_spare() const;       // held in spare blocks
  // Frees the spare blocks (and so peers' imports of them).
  void ReleaseSpare();
  // Frees every block no buffer uses: the spares and the empty standard
  // block kept for reuse. What is reserved is then what is in use.
  void ReleaseUnused();
  size_t block_count() const;
  MemoryKind kind() const { return options_.kind; }
  bool exportable() const { return options_.exportable; }

  // An opaque fd exporting `block` (the caller owns it); see ImportedBlock.
  absl::StatusOr<int> ExportFd(const MemoryBlock& block) const;

  // Called when a block is freed, so peers drop their imports of it.
  using BlockFreedListener = std::function<void(uint64_t block_id)>;
  void AddBlockFreedListener(BlockFreedListener listener);
  void ClearBlockFreedListeners();

 private:
  friend class Buffer;
  MemoryPool() = default;
  void Release(Buffer* buffer);
  absl::StatusOr<MemoryBlock*> NewBlock(uint64_t size, uint32_t type_bits) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeBlock(MemoryBlock* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The smallest spare block of at least `size` bytes (and at most a
  // quarter more), taken out of the spares; null if none.
  MemoryBlock* TakeSpare(uint64_t size, uint32_t type_bits) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees spares, oldest first, until at most `keep` remain and a new block
  // of `incoming` bytes would keep the memory held within the budget.
  void TrimSpare(size_t keep, uint64_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Accelerator* accelerator_ = nullptr;
  std::shared_ptr<Device> device_;
  PoolOptions options_;
  VkMemoryPropertyFlags wanted_ = 0;
  VkMemoryPropertyFlags preferred_ = 0;

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<MemoryBlock>> blocks_ ABSL_GUARDED_BY(mu_);
  // A trace counter of in_use_ (device pools, when tracing).
  void TraceInUseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<MemoryBlock*> spare_ ABSL_GUARDED_BY(mu_);  // oldest first; owned by blocks_
  uint64_t spare_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<BlockFreedListener> listeners_ ABSL_GUARDED_BY(mu_);
};

// A peer's block imported into this device, with a buffer over all of it that
// copies read from. Held by shared_ptr by in-flight work.
struct ImportedBlock {
  VkDevice device = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t size = 0;
  ~ImportedBlock();
};

// Imports of peer blocks into one device, cached by block id. Thread-safe.
class ImportCache {
 public:
  explicit ImportCache(std::shared_ptr<Device> device) : device_(std::move(device)) {}
  absl::StatusOr<std::shared_ptr<ImportedBlock>> Get(const MemoryPool& owner, const MemoryBlock& block);
  void Drop(uint64_t block_id);
  void Clear();
  size_t size() const;

 private:
  std::shared_ptr<Device> device_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<ImportedBlock>> imports_ ABSL_GUARDED_BY(mu_);
};

// "64 MiB", "512KiB", "1g", "1048576" -> bytes.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);
std::string FormatBytes(uint64_t bytes);

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_MEMORY_H_
