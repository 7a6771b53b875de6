#include "causeway/scheduler/array.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "causeway/base/checked_size.h"
#include "causeway/base/status.h"

namespace causeway {
namespace {

// The array as [outer, axis, inner] around `axis`, in elements.
struct Split3 {
  int64_t outer = 1, axis = 1, inner = 1;
};
Split3 SplitAround(const Shape& shape, int axis) {
  Split3 s;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (i < axis) s.outer *= shape[i];
    else if (i == axis) s.axis = shape[i];
    else s.inner *= shape[i];
  }
  return s;
}

}  // namespace

std::string Sharding::ToString() const {
  if (replicated()) return "replicated";
  return absl::StrCat("split(axis ", array_axis, " over mesh axis ", mesh_axis, ")");
}

absl::StatusOr<Shape> ShardShape(const Shape& shape, const Sharding& sharding, const Mesh& mesh) {
  for (int64_t d : shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape),
                                                     " has a dimension < 1 (shapes are static)"));
    }
  }
  if (sharding.replicated()) return shape;
  if (sharding.array_axis >= static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(absl::StrCat(sharding.ToString(), ": shape ", ShapeString(shape), " has no axis ",
                                                   sharding.array_axis));
  }
  if (sharding.mesh_axis < 0 || sharding.mesh_axis >= static_cast<int>(mesh.dims().size())) {
    return absl::InvalidArgumentError(absl::StrCat(sharding.ToString(), ": ", mesh.DebugString(), " has no axis ",
                                                   sharding.mesh_axis));
  }
  int parts = mesh.dims()[sharding.mesh_axis];
  Shape out = shape;
  if (out[sharding.array_axis] % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("axis ", sharding.array_axis, " of ", ShapeString(shape),
                                                   " does not split evenly into ", parts, " shards"));
  }
  out[sharding.array_axis] /= parts;
  return out;
}

Shape GlobalShape(const Shape& shard_shape, const Sharding& sharding, const Mesh& mesh) {
  Shape out = shard_shape;
  if (!sharding.replicated() && sharding.array_axis < static_cast<int>(out.size()) && sharding.mesh_axis >= 0 &&
      sharding.mesh_axis < static_cast<int>(mesh.dims().size())) {
    out[sharding.array_axis] *= mesh.dims()[sharding.mesh_axis];
  }
  return out;
}

absl::StatusOr<std::shared_ptr<Array>> Array::Create(std::shared_ptr<Mesh> mesh, Shape shape, DType dtype,
                                                     Sharding sharding, ClientId owner, std::string label,
                                                     Contents contents) {
  if (mesh == nullptr) return absl::InvalidArgumentError("array without a mesh");
  if (mesh->released()) {
    return absl::FailedPreconditionError(absl::StrCat("array '", label, "': ", mesh->DebugString(),
                                                      " was released"));
  }
  // The whole array's bytes must fit in 64 bits (and its element count in
  // an int64_t), or the shard size wraps and later copies run past it.
  if (absl::StatusOr<uint64_t> bytes = CheckedByteSize(shape, DTypeSize(dtype)); !bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("array '", label, "': ", bytes.status().message()));
  }
  std::shared_ptr<Array> a(new Array());
  CAUSEWAY_ASSIGN_OR_RETURN(a->shard_shape_, ShardShape(shape, sharding, *mesh));
  a->mesh_ = std::move(mesh);
  a->shape_ = std::move(shape);
  a->dtype_ = dtype;
  a->sharding_ = sharding;
  a->owner_ = owner;
  a->label_ = std::move(label);
  a->shard_bytes_ = static_cast<uint64_t>(NumElements(a->shard_shape_)) * DTypeSize(dtype);
  if (dtype == DType::kF16 && !a->mesh_->device(0)->info().storage_buffer_16bit) {
    return absl::FailedPreconditionError(absl::StrCat("array '", a->label_, "': f16 needs 16-bit storage, which ",
                                                      a->mesh_->device(0)->info().name, " lacks"));
  }
  absl::MutexLock lock(&a->mu_);
  for (Accelerator* d : a->mesh_->devices()) {
    // Whole words, so that a shard can be filled (zeroed) as one range.
    CAUSEWAY_ASSIGN_OR_RETURN(auto buffer,
                              d->CreateBuffer(std::max<uint64_t>((a->shard_bytes_ + 3) / 4 * 4, 4),
                                              contents == Contents::kWrittenWhole ? a->shard_bytes_ : 0));
    a->shards_.push_back(std::move(buffer));
  }
  a->writes_.resize(a->shards_.size());
  a->readers_.resize(a->shards_.size());
  return a;
}

int Array::ShardIndex(int device) const {
  return sharding_.replicated() ? 0 : mesh_->Coordinate(device, sharding_.mesh_axis);
}

int Array::shard_count() const { return sharding_.replicated() ? 1 : mesh_->dims()[sharding_.mesh_axis]; }

absl::StatusOr<std::shared_ptr<Buffer>> Array::shard(int device) const {
  absl::MutexLock lock(&mu_);
  if (released_ || mesh_->released()) {
    return absl::FailedPreconditionError(absl::StrCat("array '", label_, "' was released"));
  }
  if (device < 0 || device >= static_cast<int>(shards_.size())) {
    return absl::OutOfRangeError(absl::StrCat("array '", label_, "' has no shard ", device, " (", shards_.size(),
                                              " devices)"));
  }
  return shards_[device];
}

bool Array::released() const {
  absl::MutexLock lock(&mu_);
  return released_;
}

void Array::Release() {
  std::vector<std::shared_ptr<Buffer>> dropped;
  absl::MutexLock lock(&mu_);
  released_ = true;
  dropped.swap(shards_);
}

void Array::BeginWrite() {
  absl::MutexLock lock(&mu_);
  ++pending_writes_;
}

void Array::EndWrite(std::vector<Future<>> futures) {
  absl::MutexLock lock(&mu_);
  if (!futures.empty()) writes_ = std::move(futures);
  --pending_writes_;
}

void Array::AddReader(int device, Future<> reader) {
  absl::MutexLock lock(&mu_);
  // Reads already done need no waiting for: keep the list as long as the
  // reads in flight.
  auto& readers = readers_[device];
  readers.erase(std::remove_if(readers.begin(), readers.end(), [](const Future<>& f) { return f.IsReady(); }),
                readers.end());
  readers.push_back(std::move(reader));
}

std::vector<Future<>> Array::TakeReaders(int device) {
  absl::MutexLock lock(&mu_);
  std::vector<Future<>> out;
  out.swap(readers_[device]);
  return out;
}

Future<> Array::ShardReady(int device) const {
  absl::MutexLock lock(&mu_);
  auto dispatched = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_writes_ == 0; };
  mu_.Await(absl::Condition(&dispatched));
  return writes_[device].valid() ? writes_[device] : Future<>::Ready(absl::OkStatus());
}

absl::Status Array::Await(absl::Time deadline) const {
  for (int i = 0; i < mesh_->size(); ++i) {
    CAUSEWAY_RETURN_IF_ERROR(ShardReady(i).AwaitStatus(deadline));
  }
  return absl::OkStatus();
}

absl::Status Array::Upload(const void* host, uint64_t size) {
  uint64_t total = static_cast<uint64_t>(NumElements(shape_)) * DTypeSize(dtype_);
  if (size != total) {
    return absl::InvalidArgumentError(absl::StrCat("array '", label_, "' ", ShapeString(shape_), " ",
                                                   DTypeName(dtype_), " holds ", total, " bytes, got ", size));
  }
  const char* bytes = static_cast<const char*>(host);
  size_t elem = DTypeSize(dtype_);
  Split3 s = sharding_.replicated() ? Split3{1, 1, NumElements(shape_)}
                                    : SplitAround(shape_, sharding_.array_axis);
  int64_t part = sharding_.replicated() ? 1 : s.axis / shard_count();
  std::vector<Future<>> futures;
  for (int d = 0; d < mesh_->size(); ++d) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto buffer, shard(d));
    int j = ShardIndex(d);
    // Pack the shard: for each outer index, `part` rows of `inner` elements.
    std::vector<char> packed;
    const char* src = bytes;
    if (!sharding_.replicated()) {
      packed.resize(shard_bytes_);
      for (int64_t o = 0; o < s.outer; ++o) {
        std::memcpy(packed.data() + o * part * s.inner * elem,
                    bytes + ((o * s.axis) + j * part) * s.inner * elem, part * s.inner * elem);
      }
      src = packed.data();
    }
    std::vector<Future<>> after = TakeReaders(d);
    after.push_back(ShardReady(d));
    futures.push_back(mesh_->device(d)->Upload(buffer, src, shard_bytes_, 0, after));
  }
  for (auto& f : futures) {
    if (f.IsReady()) CAUSEWAY_RETURN_IF_ERROR(f.AwaitStatus());
  }
  absl::MutexLock lock(&mu_);
  writes_ = std::move(futures);
  return absl::OkStatus();
}

absl::Status Array::Download(void* host, uint64_t size) const {
  uint64_t total = static_cast<uint64_t>(NumElements(shape_)) * DTypeSize(dtype_);
  if (size != total) {
    return absl::InvalidArgumentError(absl::StrCat("array '", label_, "' holds ", total, " bytes, got ", size));
  }
  char* out = static_cast<char*>(host);
  size_t elem = DTypeSize(dtype_);
  Split3 s = sharding_.replicated() ? Split3{1, 1, NumElements(shape_)}
                                    : SplitAround(shape_, sharding_.array_axis);
  int64_t part = sharding_.replicated() ? 1 : s.axis / shard_count();
  std::vector<bool> done(shard_count(), false);
  std::vector<char> packed(shard_bytes_);
  for (int d = 0; d < mesh_->size(); ++d) {
    int j = ShardIndex(d);
    if (done[j]) continue;
    done[j] = true;
    CAUSEWAY_ASSIGN_OR_RETURN(auto buffer, shard(d));
    char* dst = sharding_.replicated() ? out : packed.data();
    if (buffer->host_coherent() && buffer->mapped() != nullptr) {
      // The host reads the accelerator's memory (lavapipe, unified memory):
      // once the shard is written, read it there, rather than through a copy
      // queued behind whatever was submitted since (a trainer reads step t's
      // loss while step t + 1 runs).
      CAUSEWAY_RETURN_IF_ERROR(ShardReady(d).AwaitStatus());
      std::memcpy(dst, buffer->mapped(), shard_bytes_);
    } else {
      CAUSEWAY_RETURN_IF_ERROR(
          mesh_->device(d)->Download(buffer, dst, shard_bytes_, 0, {ShardReady(d)}).Await());
    }
    if (sharding_.replicated()) continue;
    for (int64_t o = 0; o < s.outer; ++o) {
      std::memcpy(out + ((o * s.axis) + j * part) * s.inner * elem, packed.data() + o * part * s.inner * elem,
                  part * s.inner * elem);
    }
  }
  return absl::OkStatus();
}

}  // namespace causeway
