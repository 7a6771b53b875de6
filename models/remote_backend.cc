#include "models/remote_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/status.h"

namespace causeway::models {

absl::StatusOr<std::unique_ptr<RemoteBackend>> RemoteBackend::Create(transport::Controller* controller,
                                                                     absl::Duration timeout) {
  if (controller == nullptr || controller->island_count() == 0) {
    return absl::InvalidArgumentError("remote trainer: a controller with at least one island is needed");
  }
  std::unique_ptr<RemoteBackend> backend(new RemoteBackend(controller, timeout));
  for (int i = 0; i < controller->island_count(); ++i) {
    ASSIGN_OR_RETURN(transport::IslandDescription d, controller->Describe(i));
    if (i == 0) {
      backend->device_ = d.device;
    } else if (backend->device_ && (backend->device_->type != d.device.type ||
                                    backend->device_->subgroup_size != d.device.subgroup_size)) {
      backend->device_.reset();  // plan what runs on every island
    }
    backend->island_names_.push_back(d.name);
  }
  return backend;
}

absl::StatusOr<int> RemoteBackend::AllocateMesh(int replica, int size) {
  ASSIGN_OR_RETURN(transport::RemoteMesh mesh,
                   controller_->AllocateMesh(replica % controller_->island_count(), {size}));
  meshes_.push_back(std::move(mesh));
  return static_cast<int>(meshes_.size()) - 1;
}

absl::StatusOr<int> RemoteBackend::Load(const ProgramDef& def,
                                        const absl::flat_hash_map<std::string, int>& meshes) {
  absl::flat_hash_map<std::string, transport::RemoteMesh> bound;
  for (const auto& [name, index] : meshes) bound[name] = meshes_.at(index);
  ASSIGN_OR_RETURN(std::shared_ptr<transport::RemoteProgram> program, controller_->Load(def, bound));
  programs_.push_back(std::move(program));
  return static_cast<int>(programs_.size()) - 1;
}

absl::StatusOr<TrainBackend::Handle> RemoteBackend::Create(int mesh, const Shape& shape, DType dtype,
                                                           const Sharding& sharding, const void* data,
                                                           uint64_t bytes) {
  ASSIGN_OR_RETURN(transport::RemoteArray array,
                   controller_->CreateArray(meshes_.at(mesh), shape, dtype, sharding));
  if (absl::Status s = controller_->Upload(array, data, bytes); !s.ok()) {
    controller_->Release(array).IgnoreError();
    return s;
  }
  arrays_[next_] = {std::move(array), std::nullopt};
  return next_++;
}

absl::StatusOr<RemoteBackend::Stored> RemoteBackend::Get(Handle array) const {
  auto it = arrays_.find(array);
  if (it == arrays_.end()) return absl::NotFoundError(absl::StrCat("trainer: no array ", array));
  return it->second;
}

absl::StatusOr<std::vector<TrainBackend::Handle>> RemoteBackend::Execute(int program,
                                                                         const std::vector<Handle>& inputs,
                                                                         absl::Duration deadline) {
  std::vector<transport::RemoteArray> arrays;
  for (Handle h : inputs) {
    ASSIGN_OR_RETURN(Stored s, Get(h));
    arrays.push_back(std::move(s.array));
  }
  ASSIGN_OR_RETURN(transport::RemoteRun run,
                   controller_->Execute(programs_.at(program), arrays, {.deadline = deadline}));
  std::vector<Handle> out;
  for (transport::RemoteArray& a : run.outputs) {
    arrays_[next_] = {std::move(a), run.done};
    out.push_back(next_++);
  }
  return out;
}

absl::StatusOr<std::vector<float>> RemoteBackend::Read(Handle handle) {
  ASSIGN_OR_RETURN(Stored s, Get(handle));
  const absl::Time deadline = absl::Now() + timeout_;
  if (s.written) RETURN_IF_ERROR(s.written->AwaitStatus(deadline));
  std::vector<float> values(NumElements(s.array.shape));
  RETURN_IF_ERROR(controller_->Download(s.array, values.data(), values.size() * sizeof(float), deadline));
  return values;
}

absl::StatusOr<double> RemoteBackend::Sum(Handle handle) {
  ASSIGN_OR_RETURN(std::vector<float> values, Read(handle));
  double sum = 0;
  for (float v : values) sum += v;
  return sum;
}

absl::Status RemoteBackend::Release(Handle handle) {
  auto it = arrays_.find(handle);
  if (it == arrays_.end()) return absl::NotFoundError(absl::StrCat("trainer: no array ", handle));
  transport::RemoteArray array = it->second.array;
  arrays_.erase(it);
  return controller_->Release(array);
}

}  // namespace causeway::models
