#include "causeway/runtime/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "causeway/base/fault_injection.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/vk_status.h"

namespace causeway {
namespace {

std::atomic<uint64_t> next_block_id{1};

constexpr VkBufferUsageFlags kBufferUsage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT |
    VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kUpload:
      return "upload";
    case MemoryKind::kReadback:
      return "readback";
  }
  return "?";
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.4g %s", v, units[u]);
}

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  double number;
  if (i == 0 || !absl::SimpleAtod(s.substr(0, i), &number) || number < 0) {
    return absl::InvalidArgumentError(absl::StrCat("not a byte size: '", text, "' (try 512MiB, 2GiB)"));
  }
  std::string unit(absl::StripAsciiWhitespace(s.substr(i)));
  double scale = 1;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else return absl::InvalidArgumentError(absl::StrCat("unknown unit '", unit, "' in byte size '", text, "'"));
  double bytes = number * scale;
  if (!(bytes < 18446744073709551616.0)) {  // 2^64; also catches NaN
    return absl::InvalidArgumentError(absl::StrCat("byte size '", text, "' is too large"));
  }
  return static_cast<uint64_t>(bytes);
}

bool Buffer::host_coherent() const { return block_->host_coherent; }

void* Buffer::mapped() const {
  return block_->mapped == nullptr ? nullptr : static_cast<char*>(block_->mapped) + offset_;
}

Buffer::~Buffer() {
  DestroyCounted(vkDestroyBuffer, device_, buffer_);
  if (pool_ != nullptr) pool_->Release(this);
}

absl::StatusOr<std::unique_ptr<MemoryPool>> MemoryPool::Create(Accelerator* accelerator,
                                                               std::shared_ptr<Device> device,
                                                               const PoolOptions& options) {
  std::unique_ptr<MemoryPool> pool(new MemoryPool());
  pool->accelerator_ = accelerator;
  pool->device_ = std::move(device);
  pool->options_ = options;
  switch (options.kind) {
    case MemoryKind::kDevice:
      pool->wanted_ = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
      break;
    case MemoryKind::kUpload:
      pool->wanted_ = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
      break;
    case MemoryKind::kReadback:
      pool->wanted_ = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
      pool->preferred_ = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
      break;
  }
  if (options.exportable && !pool->device_->external_memory()) {
    return absl::FailedPreconditionError("exportable memory needs VK_KHR_external_memory_fd");
  }
  return pool;
}

MemoryPool::~MemoryPool() {
  absl::MutexLock lock(&mu_);
  spare_.clear();
  while (!blocks_.empty()) FreeBlock(blocks_.back().get());
}

void MemoryPool::AddBlockFreedListener(BlockFreedListener listener) {
  absl::MutexLock lock(&mu_);
  listeners_.push_back(std::move(listener));
}

void MemoryPool::ClearBlockFreedListeners() {
  absl::MutexLock lock(&mu_);
  listeners_.clear();
}

uint64_t MemoryPool::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}
uint64_t MemoryPool::bytes_reserved() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}
uint64_t MemoryPool::bytes_spare() const {
  absl::MutexLock lock(&mu_);
  return spare_bytes_;
}

void MemoryPool::ReleaseSpare() {
  absl::MutexLock lock(&mu_);
  TrimSpare(0, 0);
}

void MemoryPool::ReleaseUnused() {
  absl::MutexLock lock(&mu_);
  TrimSpare(0, 0);
  std::vector<MemoryBlock*> empty;
  for (auto& b : blocks_) {
    if (b->ranges.empty()) empty.push_back(b.get());
  }
  for (MemoryBlock* b : empty) FreeBlock(b);
}

MemoryBlock* MemoryPool::TakeSpare(uint64_t size, uint32_t type_bits) {
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    const MemoryBlock& b = **it;
    if ((type_bits & (1u << b.type_index)) == 0 || b.size < size || b.size - size > size / 4) continue;
    if (best == spare_.end() || b.size < (*best)->size) best = it;
  }
  if (best == spare_.end()) return nullptr;
  MemoryBlock* block = *best;
  spare_.erase(best);
  spare_bytes_ -= block->size;
  block->spare = false;
  return block;
}

void MemoryPool::TrimSpare(size_t keep, uint64_t incoming) {
  while (!spare_.empty() && (spare_.size() > keep || reserved_ + incoming > options_.budget)) {
    MemoryBlock* block = spare_.front();
    spare_.erase(spare_.begin());
    spare_bytes_ -= block->size;
    FreeBlock(block);
  }
}

size_t MemoryPool::block_count() const {
  absl::MutexLock lock(&mu_);
  return blocks_.size();
}

absl::StatusOr<MemoryBlock*> MemoryPool::NewBlock(uint64_t size, uint32_t type_bits) {
  const PhysicalDeviceInfo& info = device_->info();
  int type = -1;
  for (int pass = 0; pass < 2 && type < 0; ++pass) {
    VkMemoryPropertyFlags need = wanted_ | (pass == 0 ? preferred_ : 0);
    for (uint32_t i = 0; i < info.memory_types.size(); ++i) {
      if ((type_bits & (1u << i)) && (info.memory_types[i].flags & need) == need) {
        type = static_cast<int>(i);
        break;
      }
    }
  }
  if (type < 0) {
    return absl::FailedPreconditionError(absl::StrCat("device '", info.name, "' has no ",
                                                      MemoryKindName(options_.kind), " memory type"));
  }
  auto block = std::make_unique<MemoryBlock>(size);
  block->id = next_block_id.fetch_add(1);
  block->size = size;
  block->type_index = static_cast<uint32_t>(type);
  block->exportable = options_.exportable;

  VkMemoryAllocateInfo alloc{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  alloc.allocationSize = size;
  alloc.memoryTypeIndex = block->type_index;
  VkExportMemoryAllocateInfo export_info{VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO};
  export_info.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  if (block->exportable) alloc.pNext = &export_info;
  CAUSEWAY_RETURN_IF_ERROR(VkStatus(
      vkAllocateMemory(device_->handle(), &alloc, nullptr, &block->memory),
      absl::StrCat("allocating a ", FormatBytes(size), " ", MemoryKindName(options_.kind), " block")));
  CountVulkanObject(+1);
  const bool unmapped = options_.kind == MemoryKind::kDevice && !options_.host_maps_device_memory;
  if ((info.memory_types[type].flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && !unmapped) {
    absl::Status s = VkStatus(vkMapMemory(device_->handle(), block->memory, 0, VK_WHOLE_SIZE, 0, &block->mapped),
                              "vkMapMemory");
    if (!s.ok()) {
      DestroyCounted(vkFreeMemory, device_->handle(), block->memory);
      return s;
    }
    block->host_coherent = (info.memory_types[type].flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
  }
  reserved_ += size;
  blocks_.push_back(std::move(block));
  return blocks_.back().get();
}

void MemoryPool::FreeBlock(MemoryBlock* block) {
  for (auto& l : listeners_) l(block->id);
  if (block->mapped != nullptr) vkUnmapMemory(device_->handle(), block->memory);
  DestroyCounted(vkFreeMemory, device_->handle(), block->memory);
  reserved_ -= block->size;
  auto it = std::find_if(blocks_.begin(), blocks_.end(), [&](const auto& b) { return b.get() == block; });
  blocks_.erase(it);
}

absl::StatusOr<std::shared_ptr<Buffer>> MemoryPool::CreateBuffer(uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("buffer size must be > 0");
  const PhysicalDeviceInfo& info = device_->info();
  VkDevice dev = device_->handle();

  std::shared_ptr<Buffer> buffer(new Buffer());
  buffer->accelerator_ = accelerator_;
  buffer->device_ = dev;
  buffer->size_ = size;
  buffer->kind_ = options_.kind;

  VkBufferCreateInfo create{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  create.size = size;
  create.usage = kBufferUsage;
  create.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  if (options_.exportable) create.pNext = &external;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateBuffer(dev, &create, nullptr, &buffer->buffer_));
  CountVulkanObject(+1);

  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, buffer->buffer_, &req);
  uint64_t alignment = std::max<uint64_t>({req.alignment, info.limits.minStorageBufferOffsetAlignment,
                                           info.limits.nonCoherentAtomSize, 16});
  uint64_t reserved = AlignUp(req.size, alignment);
  if (ShouldInjectFault(FaultPoint::kAllocation)) {
    return InjectedFaultError(absl::StatusCode::kResourceExhausted, FaultPoint::kAllocation,
                              absl::StrCat("out of ", MemoryKindName(options_.kind), " memory for a buffer of ",
                                           FormatBytes(size)));
  }

  absl::MutexLock lock(&mu_);
  if (in_use_ + reserved > options_.budget) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s memory budget exhausted: a buffer of %s needs %s, %s of %s in use (%s free)",
        MemoryKindName(options_.kind), FormatBytes(size), FormatBytes(reserved), FormatBytes(in_use_),
        FormatBytes(options_.budget), FormatBytes(options_.budget - in_use_)));
  }
  MemoryBlock* block = nullptr;
  uint64_t offset = 0;
  // A request over half a block gets a block of its own, so freeing it
  // returns the memory (and peers' imports of it) at once.
  bool dedicated = reserved > options_.block_size / 2;
  for (auto& b : blocks_) {
    if (dedicated) break;
    if (b->dedicated) continue;
    if ((req.memoryTypeBits & (1u << b->type_index)) == 0) continue;
    auto r = b->ranges.Allocate(reserved, alignment);
    if (r.ok()) {
      block = b.get();
      offset = r->offset;
      break;
    }
  }
  if (block == nullptr && dedicated) block = TakeSpare(reserved, req.memoryTypeBits);
  if (block != nullptr && dedicated) {
    auto r = block->ranges.Allocate(reserved, alignment);
    if (!r.ok()) return r.status();  // cannot happen: an empty block of at least `reserved`
    offset = r->offset;
  }
  if (block == nullptr) {
    uint64_t block_size = dedicated ? reserved : options_.block_size;
    // Never reserve a shared block beyond what the budget could ever use.
    block_size = std::max(reserved, std::min(block_size, options_.budget));
    TrimSpare(spare_.size(), block_size);
    CAUSEWAY_ASSIGN_OR_RETURN(block, NewBlock(block_size, req.memoryTypeBits));
    block->dedicated = dedicated;
    auto r = block->ranges.Allocate(reserved, alignment);
    if (!r.ok()) return r.status();
    offset = r->offset;
  }
  absl::Status bind = VkStatus(vkBindBufferMemory(dev, buffer->buffer_, block->memory, offset), "vkBindBufferMemory");
  if (!bind.ok()) {
    (void)block->ranges.Free(offset);
    return bind;
  }
  buffer->pool_ = this;
  buffer->block_ = block;
  buffer->offset_ = offset;
  buffer->reserved_ = reserved;
  in_use_ += reserved;
  TraceInUseLocked();
  return buffer;
}

void MemoryPool::TraceInUseLocked() {
  if (options_.kind != MemoryKind::kDevice || accelerator_ == nullptr) return;
  Tracer& tracer = Tracer::Get();
  if (!tracer.enabled()) return;
  tracer.Counter(absl::StrCat("memory in use: accelerator ", accelerator_->index()), accelerator_->index(),
                 static_cast<double>(in_use_));
}

void MemoryPool::Release(Buffer* buffer) {
  absl::MutexLock lock(&mu_);
  MemoryBlock* block = buffer->block_;
  (void)block->ranges.Free(buffer->offset_);
  in_use_ -= buffer->reserved_;
  TraceInUseLocked();
  if (block->ranges.empty() && block->dedicated) {
    // Keep it for the next buffer of about its size, with its pages and
    // peers' imports, unless the spares are full.
    if (options_.max_spare_blocks <= 0) {
      FreeBlock(block);
      return;
    }
    block->spare = true;
    spare_.push_back(block);
    spare_bytes_ += block->size;
    TrimSpare(static_cast<size_t>(options_.max_spare_blocks), 0);
    return;
  }
  if (block->ranges.empty()) {
    // Keep one empty block of the standard size for reuse; free the rest.
    int empty = 0;
    for (auto& b : blocks_) empty += b->ranges.empty() && b->size == options_.block_size;
    if (block->size != options_.block_size || empty > 1) FreeBlock(block);
  }
}

absl::StatusOr<int> MemoryPool::ExportFd(const MemoryBlock& block) const {
  if (!block.exportable) return absl::FailedPreconditionError("memory block is not exportable");
  VkMemoryGetFdInfoKHR get{VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR};
  get.memory = block.memory;
  get.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  int fd = -1;
  CAUSEWAY_VK_RETURN_IF_ERROR(device_->get_memory_fd_fn()(device_->handle(), &get, &fd));
  return fd;
}

ImportedBlock::~ImportedBlock() {
  DestroyCounted(vkDestroyBuffer, device, buffer);
  DestroyCounted(vkFreeMemory, device, memory);
}

absl::StatusOr<std::shared_ptr<ImportedBlock>> ImportCache::Get(const MemoryPool& owner,
                                                                const MemoryBlock& block) {
  absl::MutexLock lock(&mu_);
  if (auto it = imports_.find(block.id); it != imports_.end()) return it->second;
  CAUSEWAY_ASSIGN_OR_RETURN(int fd, owner.ExportFd(block));
  auto imported = std::make_shared<ImportedBlock>();
  imported->device = device_->handle();
  imported->size = block.size;
  VkImportMemoryFdInfoKHR import_info{VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR};
  import_info.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  import_info.fd = fd;
  VkMemoryAllocateInfo alloc{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  alloc.pNext = &import_info;
  alloc.allocationSize = block.size;
  alloc.memoryTypeIndex = block.type_index;
  VkResult r = vkAllocateMemory(device_->handle(), &alloc, nullptr, &imported->memory);
  if (r != VK_SUCCESS) {
    close(fd);  // on success the driver owns it
    return VkStatus(r, "importing a peer's memory block");
  }
  CountVulkanObject(+1);
  VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  VkBufferCreateInfo create{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  create.pNext = &external;
  create.size = block.size;
  create.usage = kBufferUsage;
  create.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateBuffer(device_->handle(), &create, nullptr, &imported->buffer));
  CountVulkanObject(+1);
  CAUSEWAY_VK_RETURN_IF_ERROR(vkBindBufferMemory(device_->handle(), imported->buffer, imported->memory, 0));
  imports_[block.id] = imported;
  return imported;
}

void ImportCache::Drop(uint64_t block_id) {
  absl::MutexLock lock(&mu_);
  imports_.erase(block_id);
}

void ImportCache::Clear() {
  absl::MutexLock lock(&mu_);
  imports_.clear();
}

size_t ImportCache::size() const {
  absl::MutexLock lock(&mu_);
  return imports_.size();
}

}  // namespace causeway
