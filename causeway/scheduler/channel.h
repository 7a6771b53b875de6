// Channels: a value that crosses islands, as one island sees it. The sending
// island's program has a Send step, the receiving island's a Receive step,
// and a Channel (implemented by the DCN transport, or in memory for tests)
// carries the bytes between them, one transfer per run.
//
// A value travels as its logical bytes in row-major order, as byte ranges:
// every distinct shard of a replicated or split(0) layout is one contiguous
// range, so a device's shard is sent from, and received into, one host-visible
// staging buffer with no packing. (Other layouts are resharded on their own
// island first; the program lowering sees to that.)
//
// Runs are matched across islands by their tag (Client::Execute's
// ExecuteOptions::tag), which the controller gives both islands' runs.
#ifndef CAUSEWAY_SCHEDULER_CHANNEL_H_
#define CAUSEWAY_SCHEDULER_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "causeway/base/future.h"
#include "causeway/runtime/memory.h"

namespace causeway {

// Implementations must be thread-safe: several runs, and the sends of
// several devices, use one channel at once.
class Channel {
 public:
  virtual ~Channel() = default;

  // Sender: once `ready` (the copy into `staging`) resolves, sends bytes
  // [offset, offset + staging->size()) of run `tag`'s `total`-byte value,
  // read from `staging` (host-visible). The returned future resolves once
  // the bytes have left `staging` (it may then be reused) and fails if they
  // cannot be sent (the peer is lost; `ready` failed: then the receiver is
  // told so). Must not block.
  virtual Future<> Send(uint64_t tag, uint64_t offset, uint64_t total, std::shared_ptr<Buffer> staging,
                        Future<> ready) = 0;

  // A byte range of the value that one device receives.
  struct Target {
    uint64_t offset = 0;
    std::shared_ptr<Buffer> staging;  // host-visible; receives staging->size() bytes
  };
  // Receiver: run `tag`'s `total`-byte value goes into `targets` (ranges may
  // overlap: a replicated value goes whole to every device). The future
  // resolves once every target is filled, and fails when the value cannot
  // come (the sender failed or was lost, or a deadline passed). Must not
  // block.
  virtual Future<> Receive(uint64_t tag, uint64_t total, std::vector<Target> targets) = 0;

  // Receiver: run `tag` will not use the value it asked for (it failed
  // first). Its receive fails with `why` once no writer holds its targets
  // any more, and bytes of the run that come later are dropped without an
  // error to the sender. Nothing if the value has already come. A sending
  // channel has nothing to abandon.
  virtual void Abandon(uint64_t tag, const absl::Status& why) = 0;

  // For messages: "channel 3 from island 'b'".
  virtual std::string Describe() const = 0;
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_CHANNEL_H_
