// A channel between two islands of one process (channel.h): a send's bytes
// are copied from its staging into the receiving side's inbox as soon as they
// are ready. For programs split over islands that share a process, and to
// test cross-island programs without sockets.
#ifndef CAUSEWAY_SCHEDULER_LOCAL_CHANNEL_H_
#define CAUSEWAY_SCHEDULER_LOCAL_CHANNEL_H_

#include <memory>
#include <string>

#include "causeway/scheduler/channel.h"
#include "causeway/scheduler/inbox.h"

namespace causeway {

// Thread-safe. Both programs hold it (as their Channel); callbacks that copy
// run on the thread that resolves a send's `ready` future.
class LocalChannel : public Channel, public std::enable_shared_from_this<LocalChannel> {
 public:
  static std::shared_ptr<LocalChannel> Create(std::string name) {
    return std::shared_ptr<LocalChannel>(new LocalChannel(std::move(name)));
  }

  Future<> Send(uint64_t tag, uint64_t offset, uint64_t total, std::shared_ptr<Buffer> staging,
                Future<> ready) override;
  Future<> Receive(uint64_t tag, uint64_t total, std::vector<Target> targets) override {
    return inbox_.Expect(tag, total, std::move(targets));
  }
  void Abandon(uint64_t tag, const absl::Status& why) override { inbox_.Abandon(tag, why); }
  std::string Describe() const override { return inbox_.name(); }

  // Fails every run still to be received (as a lost sender would).
  void Close(const absl::Status& status) { inbox_.Close(status); }
  Inbox& inbox() { return inbox_; }

 private:
  explicit LocalChannel(std::string name) : inbox_(std::move(name)) {}
  Inbox inbox_;
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_LOCAL_CHANNEL_H_
