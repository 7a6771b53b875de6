#include "causeway/runtime/command_list.h"

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/vk_status.h"

namespace causeway {
namespace {

// The memory dependency between any two commands of a list, and between the
// list and whatever ran before it on the queue.
void GlobalBarrier(VkCommandBuffer cb) {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                          VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(cb, stages, stages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
}

// The range lies inside its buffer (written so that no sum can wrap).
bool InBuffer(const BufferArg& a) {
  uint64_t size = a.buffer->size();
  return a.offset <= size && (a.size == VK_WHOLE_SIZE || a.size <= size - a.offset);
}

}  // namespace

std::array<uint32_t, 3> Groups1D(uint64_t count, uint32_t local_size, uint32_t max_groups) {
  uint64_t groups = (count + local_size - 1) / local_size;
  groups = std::clamp<uint64_t>(groups, 1, max_groups);
  return {static_cast<uint32_t>(groups), 1, 1};
}

CommandList::CommandList(ReplayKey, Accelerator* accelerator, std::string label)
    : accelerator_(accelerator), label_(std::move(label)) {}

CommandList::~CommandList() {
  VkDevice dev = accelerator_->device().handle();
  absl::MutexLock lock(&mu_);
  for (auto& r : recordings_) {
    if (r->queries != VK_NULL_HANDLE) DestroyCounted(vkDestroyQueryPool, dev, r->queries);
    if (r->descriptors != VK_NULL_HANDLE) DestroyCounted(vkDestroyDescriptorPool, dev, r->descriptors);
  }
  if (pool_ != VK_NULL_HANDLE) DestroyCounted(vkDestroyCommandPool, dev, pool_);
}

bool CommandList::sealed() const {
  absl::MutexLock lock(&mu_);
  return sealed_;
}

absl::Status CommandList::CheckAppendable() const {
  if (sealed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("command list '", label_, "' was already submitted and can no longer change"));
  }
  return absl::OkStatus();
}

absl::Status CommandList::Dispatch(const std::shared_ptr<const Kernel>& kernel, std::vector<BufferArg> args,
                                   absl::Span<const uint8_t> push_constants, std::array<uint32_t, 3> groups,
                                   const SpecValues& spec) {
  CAUSEWAY_RETURN_IF_ERROR(CheckAppendable());
  if (kernel == nullptr) return absl::InvalidArgumentError("Dispatch: null kernel");
  const KernelReflection& r = kernel->reflection();
  const std::string& name = kernel->name();
  if (args.size() != r.bindings.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' expects ", r.bindings.size(),
                                                   " buffer arguments, got ", args.size()));
  }
  const VkPhysicalDeviceLimits& limits = accelerator_->info().limits;
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelBinding& b = r.bindings[i];
    const BufferArg& a = args[i];
    if (a.buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' binding ", b.binding, ": null buffer"));
    }
    if (a.buffer->accelerator() != accelerator_ && !b.read_only) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kernel '", name, "' binding ", b.binding, " is written, and its buffer lives on accelerator ",
          a.buffer->accelerator()->index(), ", the command list on accelerator ", accelerator_->index(),
          " (a kernel writes only its own accelerator's memory)"));
    }
    if (!InBuffer(a)) {
      return absl::OutOfRangeError(absl::StrCat("kernel '", name, "' binding ", b.binding, ": range [", a.offset,
                                                ", +", a.size, ") is outside the buffer of ",
                                                a.buffer->size(), " bytes"));
    }
    uint64_t size = a.resolved_size();
    if (size < b.min_size || size == 0) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' binding ", b.binding, " expects a ",
                                                     b.kind == BindingKind::kUniformBuffer ? "uniform" : "storage",
                                                     " buffer of at least ", std::max<uint64_t>(b.min_size, 1),
                                                     " bytes, got ", size));
    }
    uint64_t max_range = b.kind == BindingKind::kUniformBuffer ? limits.maxUniformBufferRange
                                                               : limits.maxStorageBufferRange;
    if (size > max_range) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' binding ", b.binding, ": ", size,
                                                     " bytes exceeds the device's binding limit of ", max_range,
                                                     " bytes (split the buffer)"));
    }
    uint64_t align = b.kind == BindingKind::kUniformBuffer ? limits.minUniformBufferOffsetAlignment
                                                           : limits.minStorageBufferOffsetAlignment;
    if (a.offset % align != 0) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' binding ", b.binding, ": offset ",
                                                     a.offset, " is not a multiple of ", align));
    }
  }
  // Peers' buffers: bound through this device's imports of their blocks.
  std::vector<std::shared_ptr<ImportedBlock>> imported;
  uint64_t peer_bytes = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const BufferArg& a = args[i];
    if (a.buffer->accelerator() == accelerator_) continue;
    const KernelBinding& b = r.bindings[i];
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<ImportedBlock> import,
                              PeerRead(*a.buffer, absl::StrCat("kernel '", name, "' binding ", b.binding)));
    peer_bytes += a.resolved_size();
    if (import == nullptr) continue;
    if (b.kind == BindingKind::kUniformBuffer) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' binding ", b.binding,
                                                     ": a uniform buffer must live on the list's accelerator (",
                                                     accelerator_->index(), "), not on accelerator ",
                                                     a.buffer->accelerator()->index()));
    }
    // Blocks place buffers at aligned offsets, so the shift keeps the
    // alignment checked above; a peer with other limits would not.
    const uint64_t align = limits.minStorageBufferOffsetAlignment;
    if ((a.offset + a.buffer->block_offset()) % align != 0) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' binding ", b.binding, ": offset ",
                                                     a.offset + a.buffer->block_offset(),
                                                     " in accelerator ", a.buffer->accelerator()->index(),
                                                     "'s memory block is not a multiple of ", align));
    }
    imported.resize(args.size());
    imported[i] = std::move(import);
  }
  if (push_constants.size() != r.push_constant_size) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "' expects ", r.push_constant_size,
                                                   " bytes of push constants, got ", push_constants.size()));
  }
  for (int d = 0; d < 3; ++d) {
    if (groups[d] == 0 || groups[d] > limits.maxComputeWorkGroupCount[d]) {
      return absl::InvalidArgumentError(absl::StrCat("kernel '", name, "': ", groups[d],
                                                     " workgroups in dimension ", d, " (allowed 1..",
                                                     limits.maxComputeWorkGroupCount[d], ")"));
    }
  }
  CAUSEWAY_ASSIGN_OR_RETURN(const Pipeline* pipeline, accelerator_->device().GetPipeline(kernel, spec));
  Command c{Command::kDispatch};
  c.pipeline = pipeline;
  c.args = std::move(args);
  c.push.assign(push_constants.begin(), push_constants.end());
  c.groups = groups;
  c.name = name;
  c.imported = std::move(imported);
  peer_read_bytes_ += peer_bytes;
  commands_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ImportedBlock>> CommandList::PeerRead(const Buffer& buffer, const std::string& what) {
  Accelerator* from = buffer.accelerator();
  const CopyPath path = accelerator_->PathFor(buffer);
  switch (path) {
    case CopyPath::kSameQueue:
    case CopyPath::kSameDevice:
      return nullptr;
    case CopyPath::kExternalMemory:
      return accelerator_->imports_for_peers()->Get(from->device_pool(), *buffer.block());
    case CopyPath::kHostStaged:
      break;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, " is a buffer of ", buffer.size(), " bytes on accelerator ", from->index(), " that accelerator ",
      accelerator_->index(), " cannot read directly (path ", CopyPathName(path),
      "); move it with Accelerator::Copy, which stages through the host"));
}

absl::Status CommandList::Copy(const BufferArg& src, const BufferArg& dst) {
  if (src.buffer == nullptr || dst.buffer == nullptr) return absl::InvalidArgumentError("Copy: null buffer");
  for (const BufferArg* a : {&src, &dst}) {
    if (!InBuffer(*a)) {
      return absl::OutOfRangeError(absl::StrCat("Copy: range [", a->offset, ", +", a->size,
                                                ") is outside a buffer of ", a->buffer->size(), " bytes"));
    }
  }
  uint64_t size = src.resolved_size();
  if (size != dst.resolved_size() || size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("Copy: source has ", size, " bytes, destination ",
                                                   dst.resolved_size(), " (they must match and be > 0)"));
  }
  return CopyRegions(src.buffer, dst.buffer, {{src.offset, dst.offset, size}});
}

absl::Status CommandList::CopyRegions(const std::shared_ptr<Buffer>& src, const std::shared_ptr<Buffer>& dst,
                                      std::vector<CopyRegion> regions) {
  CAUSEWAY_RETURN_IF_ERROR(CheckAppendable());
  if (src == nullptr || dst == nullptr) return absl::InvalidArgumentError("Copy: null buffer");
  if (dst->accelerator() != accelerator_) {
    return absl::InvalidArgumentError(absl::StrCat("Copy: the destination lives on accelerator ",
                                                   dst->accelerator()->index(),
                                                   "; a command list copies into its own accelerator (",
                                                   accelerator_->index(), ")"));
  }
  if (regions.empty()) return absl::InvalidArgumentError("Copy: no regions");
  Command c{Command::kCopy};
  uint64_t src_lo = UINT64_MAX, src_hi = 0, dst_lo = UINT64_MAX, dst_hi = 0;
  for (const CopyRegion& r : regions) {
    if (r.size == 0 || r.src_offset > src->size() || r.size > src->size() - r.src_offset ||
        r.dst_offset > dst->size() || r.size > dst->size() - r.dst_offset) {
      return absl::OutOfRangeError(absl::StrCat("Copy: region of ", r.size, " bytes from ", r.src_offset, " to ",
                                                r.dst_offset, " is empty or outside buffers of ", src->size(),
                                                " and ", dst->size(), " bytes"));
    }
    src_lo = std::min(src_lo, r.src_offset);
    src_hi = std::max(src_hi, r.src_offset + r.size);
    dst_lo = std::min(dst_lo, r.dst_offset);
    dst_hi = std::max(dst_hi, r.dst_offset + r.size);
    c.regions.push_back({r.src_offset, r.dst_offset, r.size});
  }
  // The ranges touched, for hazards and the acquire of imported memory.
  c.args = {BufferArg(src, src_lo, src_hi - src_lo), BufferArg(dst, dst_lo, dst_hi - dst_lo)};
  c.name = "copy";
  Accelerator* from = src->accelerator();
  if (from != accelerator_) {
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<ImportedBlock> import, PeerRead(*src, "Copy: the source"));
    if (import != nullptr) {
      c.imported = {std::move(import), nullptr};
      c.name = "copy-import";
    }
    for (const CopyRegion& r : regions) peer_read_bytes_ += r.size;
  }
  commands_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::Status CommandList::Fill(const BufferArg& dst, uint32_t word) {
  CAUSEWAY_RETURN_IF_ERROR(CheckAppendable());
  if (dst.buffer == nullptr) return absl::InvalidArgumentError("Fill: null buffer");
  if (dst.buffer->accelerator() != accelerator_) {
    return absl::InvalidArgumentError("Fill: the buffer lives on another accelerator");
  }
  if (!InBuffer(dst)) {
    return absl::OutOfRangeError(absl::StrCat("Fill: range [", dst.offset, ", +", dst.size,
                                              ") is outside a buffer of ", dst.buffer->size(), " bytes"));
  }
  uint64_t size = dst.resolved_size();
  if (dst.offset % 4 != 0 || size % 4 != 0 || size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("Fill: offset ", dst.offset, " and size ", size,
                                                   " must be non-zero multiples of 4"));
  }
  Command c{Command::kFill};
  c.args = {BufferArg(dst.buffer, dst.offset, size)};
  c.word = word;
  c.name = "fill";
  commands_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::StatusOr<CommandList::Recording*> CommandList::AcquireRecording(ReplayKey, Timing timing) {
  absl::MutexLock lock(&mu_);
  sealed_ = true;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if ((*it)->timing == timing) {
      Recording* r = *it;
      free_.erase(it);
      return r;
    }
  }
  VkDevice dev = accelerator_->device().handle();
  if (pool_ == VK_NULL_HANDLE) {
    VkCommandPoolCreateInfo info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    info.queueFamilyIndex = accelerator_->device().queue_family();
    CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateCommandPool(dev, &info, nullptr, &pool_));
    CountVulkanObject(+1);
  }
  auto r = std::make_unique<Recording>();
  r->timing = timing;
  auto cleanup = absl::MakeCleanup([&] {
    if (r == nullptr) return;
    if (r->cb != VK_NULL_HANDLE) vkFreeCommandBuffers(dev, pool_, 1, &r->cb);
    if (r->queries != VK_NULL_HANDLE) DestroyCounted(vkDestroyQueryPool, dev, r->queries);
    if (r->descriptors != VK_NULL_HANDLE) DestroyCounted(vkDestroyDescriptorPool, dev, r->descriptors);
  });
  VkCommandBufferAllocateInfo alloc{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  alloc.commandPool = pool_;
  alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  alloc.commandBufferCount = 1;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkAllocateCommandBuffers(dev, &alloc, &r->cb));
  CAUSEWAY_RETURN_IF_ERROR(Record(r.get()));
  Recording* out = r.get();
  recordings_.push_back(std::move(r));
  return out;
}

void CommandList::ReleaseRecording(ReplayKey, Recording* r) {
  absl::MutexLock lock(&mu_);
  free_.push_back(r);
}

VkBuffer CommandList::Command::handle(size_t j) const {
  return import(j) != nullptr ? import(j)->buffer : args[j].buffer->handle();
}

uint64_t CommandList::Command::offset(size_t j) const {
  return args[j].offset + (import(j) != nullptr ? args[j].buffer->block_offset() : 0);
}

absl::Status CommandList::Record(Recording* r) {
  const bool per_command = r->timing == Timing::kCommands;
  const uint32_t query_count =
      commands_.empty() || r->timing == Timing::kNone ? 0 : per_command ? 2 * commands_.size() : 2;
  if (query_count > 0) CAUSEWAY_RETURN_IF_ERROR(CreateQueries(r, query_count));
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<VkDescriptorSet> sets, AllocateDescriptorSets(r));

  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  CAUSEWAY_VK_RETURN_IF_ERROR(vkBeginCommandBuffer(r->cb, &begin));
  if (r->queries != VK_NULL_HANDLE) vkCmdResetQueryPool(r->cb, r->queries, 0, query_count);
  GlobalBarrier(r->cb);
  if (r->queries != VK_NULL_HANDLE && !per_command) {
    vkCmdWriteTimestamp(r->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, r->queries, 0);
  }

  // Hazard tracking by buffer: a barrier goes before a command that touches
  // what an earlier command (since the last barrier) wrote, or writes what it read.
  absl::flat_hash_set<VkBuffer> written, read;
  bool writes_host_memory = false;
  const Pipeline* bound = nullptr;
  for (size_t i = 0; i < commands_.size(); ++i) {
    const Command& c = commands_[i];
    std::vector<VkBuffer> reads, writes;
    for (size_t j = 0; j < c.args.size(); ++j) {
      const bool reads_arg = c.kind == Command::kDispatch
                                 ? !c.pipeline->kernel->reflection().bindings[j].write_only
                                 : c.kind == Command::kCopy && j == 0;
      const bool writes_arg = c.kind == Command::kDispatch
                                  ? !c.pipeline->kernel->reflection().bindings[j].read_only
                                  : j + 1 == c.args.size();
      const VkBuffer b = c.handle(j);
      if (reads_arg) reads.push_back(b);
      if (writes_arg) {
        writes.push_back(b);
        writes_host_memory |= c.args[j].buffer->kind() != MemoryKind::kDevice;
      }
    }
    bool hazard = false;
    for (VkBuffer b : reads) hazard |= written.contains(b);
    for (VkBuffer b : writes) hazard |= written.contains(b) || read.contains(b);
    if (hazard) {
      GlobalBarrier(r->cb);
      written.clear();
      read.clear();
    }
    written.insert(writes.begin(), writes.end());
    read.insert(reads.begin(), reads.end());

    if (per_command) vkCmdWriteTimestamp(r->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, r->queries, 2 * i);
    RecordAcquires(r->cb, c);
    RecordCommand(r->cb, c, sets[i], bound);
    if (per_command) vkCmdWriteTimestamp(r->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, r->queries, 2 * i + 1);
  }
  if (r->queries != VK_NULL_HANDLE && !per_command) {
    vkCmdWriteTimestamp(r->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, r->queries, 1);
  }
  RecordEnd(*r, query_count, writes_host_memory);
  CAUSEWAY_VK_RETURN_IF_ERROR(vkEndCommandBuffer(r->cb));
  return absl::OkStatus();
}

absl::Status CommandList::CreateQueries(Recording* r, uint32_t query_count) {
  VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = query_count;
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateQueryPool(accelerator_->device().handle(), &qi, nullptr, &r->queries));
  CountVulkanObject(+1);
  CAUSEWAY_ASSIGN_OR_RETURN(r->query_results,
                            accelerator_->CreateStagingBuffer(uint64_t{query_count} * 8, true));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<VkDescriptorSet>> CommandList::AllocateDescriptorSets(Recording* r) {
  std::vector<VkDescriptorSet> sets(commands_.size(), VK_NULL_HANDLE);
  if (accelerator_->device().push_descriptors()) return sets;
  uint32_t dispatches = 0, storage = 0, uniform = 0;
  for (const Command& c : commands_) {
    if (c.kind != Command::kDispatch) continue;
    ++dispatches;
    for (const auto& b : c.pipeline->kernel->reflection().bindings) {
      (b.kind == BindingKind::kUniformBuffer ? uniform : storage)++;
    }
  }
  if (dispatches == 0) return sets;
  VkDevice dev = accelerator_->device().handle();
  std::vector<VkDescriptorPoolSize> sizes;
  if (storage) sizes.push_back({VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, storage});
  if (uniform) sizes.push_back({VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, uniform});
  VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pi.maxSets = dispatches;
  pi.poolSizeCount = static_cast<uint32_t>(sizes.size());
  pi.pPoolSizes = sizes.data();
  CAUSEWAY_VK_RETURN_IF_ERROR(vkCreateDescriptorPool(dev, &pi, nullptr, &r->descriptors));
  CountVulkanObject(+1);
  for (size_t i = 0; i < commands_.size(); ++i) {
    if (commands_[i].kind != Command::kDispatch) continue;
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = r->descriptors;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &commands_[i].pipeline->set_layout;
    CAUSEWAY_VK_RETURN_IF_ERROR(vkAllocateDescriptorSets(dev, &ai, &sets[i]));
  }
  return sets;
}

void CommandList::RecordAcquires(VkCommandBuffer cb, const Command& c) const {
  if (c.imported.empty()) return;
  const bool copy = c.kind == Command::kCopy;
  std::vector<VkBufferMemoryBarrier> acquires;
  for (size_t j = 0; j < c.args.size(); ++j) {
    if (c.import(j) == nullptr) continue;
    VkBufferMemoryBarrier& acquire = acquires.emplace_back();
    acquire = {VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER};
    acquire.srcAccessMask = 0;
    acquire.dstAccessMask = copy ? VK_ACCESS_TRANSFER_READ_BIT : VK_ACCESS_SHADER_READ_BIT;
    acquire.srcQueueFamilyIndex = VK_QUEUE_FAMILY_EXTERNAL;
    acquire.dstQueueFamilyIndex = accelerator_->device().queue_family();
    acquire.buffer = c.handle(j);
    acquire.offset = c.offset(j);
    acquire.size = c.args[j].resolved_size();
  }
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                       copy ? VK_PIPELINE_STAGE_TRANSFER_BIT : VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 0,
                       nullptr, static_cast<uint32_t>(acquires.size()), acquires.data(), 0, nullptr);
}

void CommandList::RecordCommand(VkCommandBuffer cb, const Command& c, VkDescriptorSet set,
                                const Pipeline*& bound) const {
  switch (c.kind) {
    case Command::kDispatch: {
      const Pipeline* p = c.pipeline;
      if (p != bound) {
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipeline);
        bound = p;
      }
      const auto& bindings = p->kernel->reflection().bindings;
      std::vector<VkDescriptorBufferInfo> infos(c.args.size());
      std::vector<VkWriteDescriptorSet> writes(c.args.size());
      for (size_t j = 0; j < c.args.size(); ++j) {
        infos[j] = {c.handle(j), c.offset(j), c.args[j].resolved_size()};
        VkWriteDescriptorSet& w = writes[j];
        w = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
        w.dstSet = set;
        w.dstBinding = bindings[j].binding;
        w.descriptorCount = 1;
        w.descriptorType = bindings[j].kind == BindingKind::kUniformBuffer
                               ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
                               : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w.pBufferInfo = &infos[j];
      }
      if (!writes.empty()) {
        if (p->push_descriptors) {
          accelerator_->device().push_descriptor_fn()(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0,
                                                      static_cast<uint32_t>(writes.size()), writes.data());
        } else {
          vkUpdateDescriptorSets(accelerator_->device().handle(), static_cast<uint32_t>(writes.size()),
                                 writes.data(), 0, nullptr);
          vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, nullptr);
        }
      }
      if (!c.push.empty()) {
        vkCmdPushConstants(cb, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                           static_cast<uint32_t>(c.push.size()), c.push.data());
      }
      vkCmdDispatch(cb, c.groups[0], c.groups[1], c.groups[2]);
      return;
    }
    case Command::kCopy: {
      // Regions are absolute in the buffers; an import holds the whole block.
      const uint64_t shift = c.offset(0) - c.args[0].offset;
      std::vector<VkBufferCopy> regions = c.regions;
      for (VkBufferCopy& region : regions) region.srcOffset += shift;
      vkCmdCopyBuffer(cb, c.handle(0), c.handle(1), static_cast<uint32_t>(regions.size()), regions.data());
      return;
    }
    case Command::kFill:
      vkCmdFillBuffer(cb, c.args[0].buffer->handle(), c.args[0].offset, c.args[0].size, c.word);
      return;
  }
}

void CommandList::RecordEnd(const Recording& r, uint32_t query_count, bool writes_host_memory) {
  if (r.queries != VK_NULL_HANDLE) {
    VkMemoryBarrier before{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    before.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    before.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    vkCmdPipelineBarrier(r.cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                         &before, 0, nullptr, 0, nullptr);
    vkCmdCopyQueryPoolResults(r.cb, r.queries, 0, query_count, r.query_results->handle(), 0, sizeof(uint64_t),
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    writes_host_memory = true;
  }
  if (writes_host_memory) {
    // Make what was written to host-visible memory (downloads) visible to
    // host reads once the submission's semaphore is signalled.
    VkMemoryBarrier to_host{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    to_host.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    to_host.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(r.cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &to_host, 0, nullptr, 0, nullptr);
  }
}

int64_t CommandList::CollectTimestamps(ReplayKey, Recording* r, int accelerator_index,
                                       uint64_t timeline_value, int64_t clock_offset_ns,
                                       int64_t* list_begin) {
  if (r->queries == VK_NULL_HANDLE) return -1;
  const bool per_command = r->timing == Timing::kCommands;
  absl::InlinedVector<uint64_t, 8> ticks(per_command ? 2 * commands_.size() : 2);
  std::memcpy(ticks.data(), r->query_results->mapped(), ticks.size() * sizeof(uint64_t));
  double period = accelerator_->info().limits.timestampPeriod;  // ns per tick, a float
  auto ns = [period](uint64_t t) { return static_cast<int64_t>(static_cast<double>(t) * period); };
  if (list_begin != nullptr && !ticks.empty()) *list_begin = ns(ticks[0]);
  if (!per_command) return std::max<int64_t>(0, ns(ticks[1]) - ns(ticks[0]));
  Tracer& tracer = Tracer::Get();
  int64_t total = 0;
  for (size_t i = 0; i < commands_.size(); ++i) {
    TraceEvent e;
    e.kind = TraceEvent::kDevice;
    e.name = commands_[i].name;
    e.track = accelerator_index;
    e.begin_ns = ns(ticks[2 * i]) + clock_offset_ns;
    e.end_ns = ns(ticks[2 * i + 1]) + clock_offset_ns;
    e.timeline_value = timeline_value;
    e.list = label_;
    if (i == 0) e.flow = TraceFlowId(accelerator_index, timeline_value);
    e.args = absl::StrCat("\"command\":", i);
    total += std::max<int64_t>(0, e.end_ns - e.begin_ns);
    tracer.Add(std::move(e));
  }
  return total;
}

}  // namespace causeway
