// Sharded arrays: one logical array whose shards live on the accelerators of
// a mesh, replicated or split along one array axis over one mesh axis.
#ifndef CAUSEWAY_SCHEDULER_ARRAY_H_
#define CAUSEWAY_SCHEDULER_ARRAY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/future.h"
#include "causeway/runtime/memory.h"
#include "causeway/scheduler/dtype.h"
#include "causeway/scheduler/mesh.h"
#include "causeway/scheduler/sharding.h"

namespace causeway {

// The shape each device holds; InvalidArgument when the split axis does not
// divide evenly or the axes do not exist.
absl::StatusOr<Shape> ShardShape(const Shape& shape, const Sharding& sharding, const Mesh& mesh);
// The global shape of an array whose shards have `shard_shape`.
Shape GlobalShape(const Shape& shard_shape, const Sharding& sharding, const Mesh& mesh);

// A logical array. Reference-counted as a whole (ArrayRef); its shards are
// freed when the last reference goes or when it is released (its client went
// away). Thread-safe.
class Array {
 public:
  // What a new array's shards hold before their first write.
  enum class Contents {
    // Zeros: a tenant may read an array it never wrote.
    kZeros,
    // Whatever their memory held (only their padding past the last element
    // is zeroed): the array's first write covers every byte or fails the
    // array, so nothing can read what was there (a receive's value). Saves
    // a pass over the memory before a large value arrives.
    kWrittenWhole,
  };
  static absl::StatusOr<std::shared_ptr<Array>> Create(std::shared_ptr<Mesh> mesh, Shape shape, DType dtype,
                                                       Sharding sharding, ClientId owner,
                                                       std::string label = "",
                                                       Contents contents = Contents::kZeros);

  const Shape& shape() const { return shape_; }
  const Shape& shard_shape() const { return shard_shape_; }
  DType dtype() const { return dtype_; }
  const Sharding& sharding() const { return sharding_; }
  const std::shared_ptr<Mesh>& mesh() const { return mesh_; }
  ClientId owner() const { return owner_; }
  const std::string& label() const { return label_; }
  uint64_t shard_bytes() const { return shard_bytes_; }
  uint64_t bytes() const { return shard_bytes_ * mesh_->size(); }  // on all devices
  // Which piece of the array device `i` of the mesh holds (0 when replicated).
  int ShardIndex(int device) const;
  int shard_count() const;  // distinct pieces

  // The buffer on device `i`; FailedPrecondition once released.
  absl::StatusOr<std::shared_ptr<Buffer>> shard(int device) const;
  bool released() const;
  // Frees the shards now (in-flight work keeps what it uses until it ends).
  void Release();

  // The last write to device `i`'s shard. A write scheduled but not yet
  // dispatched is waited for (it is dispatched in order, ahead of any reader).
  Future<> ShardReady(int device) const;
  // Marks the shards as about to be written by work not yet dispatched, and
  // later records the futures of that work.
  void BeginWrite();
  void EndWrite(std::vector<Future<>> futures);
  // Work on another device that reads device `i`'s shard (a transfer); the
  // next write to that shard waits for it.
  void AddReader(int device, Future<> reader);
  // The readers since the last write of device `i`'s shard (and forgets them:
  // the caller is about to write after them).
  std::vector<Future<>> TakeReaders(int device);
  // Blocks until every shard's last write is done; its status.
  absl::Status Await(absl::Time deadline = absl::InfiniteFuture()) const;

  // Uploads the whole array from host memory (row-major): each device gets its
  // shard. The bytes are copied before this returns.
  absl::Status Upload(const void* host, uint64_t size);
  // Gathers the whole array into host memory (row-major), waiting for writes.
  absl::Status Download(void* host, uint64_t size) const;

 private:
  Array() = default;
  std::shared_ptr<Mesh> mesh_;
  Shape shape_, shard_shape_;
  DType dtype_ = DType::kF32;
  Sharding sharding_;
  ClientId owner_ = 0;
  std::string label_;
  uint64_t shard_bytes_ = 0;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Buffer>> shards_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int pending_writes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Future<>> writes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<Future<>>> readers_ ABSL_GUARDED_BY(mu_);
};

using ArrayRef = std::shared_ptr<Array>;

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_ARRAY_H_
