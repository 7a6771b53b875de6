// A command list: dispatches and copies recorded once and replayed.
//
// Commands are checked when appended (arguments against the kernel's
// reflection, sizes against the device's limits) and turned into a
// VkCommandBuffer at the first submit. Barriers are inserted where one command
// reads or writes what an earlier one wrote (or writes what it read). The list
// is immutable after its first submit and may then be submitted any number of
// times, even while earlier submissions are in flight (each concurrent replay
// gets its own recording, kept for reuse).
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(auto list, accel->CreateCommandList());
//   CAUSEWAY_RETURN_IF_ERROR(list->Dispatch(add, {a, b, c}, AddParams{n}, Groups1D(n, 256)));
//   for (int i = 0; i < 100; ++i) futures.push_back(accel->Submit(list));
#ifndef CAUSEWAY_RUNTIME_COMMAND_LIST_H_
#define CAUSEWAY_RUNTIME_COMMAND_LIST_H_

#include <vulkan/vulkan.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "causeway/runtime/device.h"
#include "causeway/runtime/memory.h"

namespace causeway {

class Accelerator;

// Opens a command list's replay interface (recordings and their timestamps)
// to the one class that submits lists. Only an Accelerator can make one.
class ReplayKey {
  friend class Accelerator;
  ReplayKey() = default;
};

// A kernel argument or copy operand: a buffer, or a byte range of one.
struct BufferArg {
  BufferArg(std::shared_ptr<Buffer> b) : buffer(std::move(b)) {}  // NOLINT: implicit on purpose
  BufferArg(std::shared_ptr<Buffer> b, uint64_t off, uint64_t len)
      : buffer(std::move(b)), offset(off), size(len) {}
  std::shared_ptr<Buffer> buffer;
  uint64_t offset = 0;
  uint64_t size = VK_WHOLE_SIZE;  // to the end of the buffer
  uint64_t resolved_size() const { return size == VK_WHOLE_SIZE ? buffer->size() - offset : size; }
};

// Workgroups for `count` items at `local_size` per group (at least 1), capped
// at `max_groups` (kernels in shaders/ loop over the rest).
std::array<uint32_t, 3> Groups1D(uint64_t count, uint32_t local_size, uint32_t max_groups = 65535);

// Not thread-safe while being appended to; Submit may be called from any
// thread once appending is done.
class CommandList {
 public:
  ~CommandList();
  CommandList(const CommandList&) = delete;
  CommandList& operator=(const CommandList&) = delete;

  // Appends a dispatch of `kernel` over `groups` workgroups. `args` bind to the
  // kernel's bindings in order; each must be large enough for the binding's
  // fixed part and within the device's binding limit. A binding the kernel
  // only reads may be a buffer of another accelerator with a device path to
  // this one (see Accelerator::PathFrom): the kernel then reads the peer's
  // memory in place, through this device's import of its block where they
  // are separate VkDevices. The caller orders the read after the peer's
  // writes (a wait on its future), as for a copy. Bindings that are written
  // must be on this list's accelerator. `push_constants` must have exactly
  // the kernel's push-constant size.
  absl::Status Dispatch(const std::shared_ptr<const Kernel>& kernel, std::vector<BufferArg> args,
                        absl::Span<const uint8_t> push_constants, std::array<uint32_t, 3> groups,
                        const SpecValues& spec = {});
  template <typename Params, typename = std::enable_if_t<std::is_trivially_copyable_v<Params> &&
                                                         !std::is_convertible_v<Params, absl::Span<const uint8_t>>>>
  absl::Status Dispatch(const std::shared_ptr<const Kernel>& kernel, std::vector<BufferArg> args,
                        const Params& params, std::array<uint32_t, 3> groups, const SpecValues& spec = {}) {
    return Dispatch(kernel, std::move(args),
                    absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(&params), sizeof(Params)),
                    groups, spec);
  }

  // Copies src to dst (equal sizes). dst must be on this list's accelerator;
  // src may be on another one that has a device path to it (see
  // Accelerator::PathFrom); a host-staged pair needs Accelerator::Copy.
  absl::Status Copy(const BufferArg& src, const BufferArg& dst);

  // Copies byte ranges of src into dst (one command, many regions): each
  // region's offsets are absolute in its buffer. Paths and checks as Copy.
  struct CopyRegion {
    uint64_t src_offset = 0, dst_offset = 0, size = 0;
  };
  absl::Status CopyRegions(const std::shared_ptr<Buffer>& src, const std::shared_ptr<Buffer>& dst,
                           std::vector<CopyRegion> regions);

  // Fills dst with a repeated 32-bit word (offset and size multiples of 4).
  absl::Status Fill(const BufferArg& dst, uint32_t word);

  Accelerator* accelerator() const { return accelerator_; }
  size_t size() const { return commands_.size(); }
  // Bytes this list copies, or binds for kernels to read, from other
  // accelerators' memory (ICI) per run.
  uint64_t peer_read_bytes() const { return peer_read_bytes_; }
  bool sealed() const;
  const std::string& label() const { return label_; }

  // The replay interface, for the accelerator that submits this list
  // (Accelerator::CreateCommandList makes lists; Accelerator::Submit replays
  // them).
  CommandList(ReplayKey, Accelerator* accelerator, std::string label);
  // What a recording measures with timestamps.
  enum class Timing : uint8_t {
    kNone,
    kList,      // the whole list: two timestamps (its device time)
    kCommands,  // every command (traced): two per command
  };
  // One recording of the list; reused once its submission retires.
  struct Recording {
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkQueryPool queries = VK_NULL_HANDLE;
    // The list copies its timestamps here at its end, so that reading them
    // needs no query call (lavapipe's vkGetQueryPoolResults waits for the
    // whole device to idle, which a later submission waiting on this
    // retirement would never let happen).
    std::shared_ptr<Buffer> query_results;
    VkDescriptorPool descriptors = VK_NULL_HANDLE;
    Timing timing = Timing::kNone;
  };
  // A free recording, made if needed; the list is sealed from then on.
  // Thread-safe.
  absl::StatusOr<Recording*> AcquireRecording(ReplayKey, Timing timing);
  // Gives back a recording whose submission retired (or never reached the
  // queue).
  void ReleaseRecording(ReplayKey, Recording* r);
  // Reads a finished recording's timestamps: trace events for each command
  // of a traced one, placed on the host clock by adding `clock_offset_ns`
  // (the first with the flow of its submission); returns its device time in
  // ns (the sum over commands when traced), or -1 when it has none.
  // `list_begin` (if not null) gets the list's first timestamp in ns on the
  // device's own clock.
  int64_t CollectTimestamps(ReplayKey, Recording* r, int accelerator_index, uint64_t timeline_value,
                            int64_t clock_offset_ns, int64_t* list_begin = nullptr);

 private:
  struct Command {
    enum Kind { kDispatch, kCopy, kFill } kind;
    const Pipeline* pipeline = nullptr;
    std::vector<BufferArg> args;  // dispatch bindings; copy: {src, dst}; fill: {dst}
    std::vector<uint8_t> push;
    std::array<uint32_t, 3> groups{};
    uint32_t word = 0;
    // Per arg, empty when none is: the peer block an arg on another
    // VkDevice is read through (its offset in that block is the buffer's
    // block_offset() more).
    std::vector<std::shared_ptr<ImportedBlock>> imported;
    std::vector<VkBufferCopy> regions;  // copy: absolute offsets in the two buffers
    std::string name;

    // Arg j as this device addresses it: its own buffer, or the import of a
    // peer's block, at the buffer's offset in it.
    const ImportedBlock* import(size_t j) const { return j < imported.size() ? imported[j].get() : nullptr; }
    VkBuffer handle(size_t j) const;
    uint64_t offset(size_t j) const;
  };

  absl::Status CheckAppendable() const;
  // How this list reads `buffer` of another accelerator: null where it is
  // bound as it is (same VkDevice), the import of its block where it is on
  // another VkDevice; an error naming `what` where there is no device path.
  absl::StatusOr<std::shared_ptr<ImportedBlock>> PeerRead(const Buffer& buffer, const std::string& what);

  // Recording, by stage: the timestamp queries and the buffer they are
  // copied to; descriptor sets (where the device cannot push them); each
  // command, after a barrier where it touches what earlier ones did; the
  // end (timestamps out, host visibility).
  absl::Status Record(Recording* r);
  absl::Status CreateQueries(Recording* r, uint32_t query_count);
  absl::StatusOr<std::vector<VkDescriptorSet>> AllocateDescriptorSets(Recording* r);
  // Acquires the peers' memory a command reads through imports from the
  // external queue family.
  void RecordAcquires(VkCommandBuffer cb, const Command& c) const;
  // The command itself; `bound` is the pipeline bound so far.
  void RecordCommand(VkCommandBuffer cb, const Command& c, VkDescriptorSet set, const Pipeline*& bound) const;
  // Copies the timestamps out and makes what the list wrote to host-visible
  // memory visible to the host.
  static void RecordEnd(const Recording& r, uint32_t query_count, bool writes_host_memory);

  Accelerator* accelerator_;
  std::string label_;
  std::vector<Command> commands_;
  uint64_t peer_read_bytes_ = 0;
  VkCommandPool pool_ = VK_NULL_HANDLE;

  mutable absl::Mutex mu_;
  bool sealed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Recording>> recordings_ ABSL_GUARDED_BY(mu_);
  std::vector<Recording*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace causeway

#endif  // CAUSEWAY_RUNTIME_COMMAND_LIST_H_
