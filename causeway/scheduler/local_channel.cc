#include "causeway/scheduler/local_channel.h"

namespace causeway {

Future<> LocalChannel::Send(uint64_t tag, uint64_t offset, uint64_t total, std::shared_ptr<Buffer> staging,
                            Future<> ready) {
  auto promise = std::make_shared<Promise<>>();
  Future<> sent = promise->future();
  ready.OnReady([self = shared_from_this(), tag, offset, total, staging = std::move(staging),
                 promise](const absl::Status& status) {
    if (!status.ok()) {
      self->inbox_.Fail(tag, status);
      promise->Set(status);
      return;
    }
    absl::Status delivered = self->inbox_.Deliver(tag, offset, total, staging->mapped(), staging->size());
    if (!delivered.ok()) self->inbox_.Fail(tag, delivered);
    promise->Set(delivered);
  });
  return sent;
}

}  // namespace causeway
