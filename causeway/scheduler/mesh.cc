#include "causeway/scheduler/mesh.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace causeway {

int Mesh::Coordinate(int i, int axis) const {
  if (dims_.size() == 1) return i;
  return axis == 0 ? i / dims_[1] : i % dims_[1];
}

bool Mesh::DevicesShareMemory() const {
  for (const Accelerator* reader : devices_) {
    // A virtual mesh types a program for an island that is not here; that
    // island chooses at load, over its own devices, so nothing is refused
    // here for want of shared memory.
    if (reader == nullptr) return true;
    for (const Accelerator* owner : devices_) {
      if (reader->PathFrom(*owner) == CopyPath::kHostStaged) return false;
    }
  }
  return true;
}

std::string Mesh::DebugString() const {
  const std::string head = absl::StrCat("mesh ", id_, " [", absl::StrJoin(dims_, "x"), "]");
  std::vector<int> ids;
  for (Accelerator* a : devices_) {
    // A virtual mesh (null devices) stands for a mesh of an island that is
    // not here, e.g. to type a program on a controller with no accelerators.
    if (a == nullptr) return absl::StrCat(head, " on no accelerators (virtual)");
    ids.push_back(a->index());
  }
  return absl::StrCat(head, " on accelerators ", absl::StrJoin(ids, ","));
}


ResourceManager::ResourceManager(std::string island, std::vector<Accelerator*> accelerators)
    : island_(std::move(island)), accelerators_(std::move(accelerators)) {
  absl::MutexLock lock(&mu_);
  load_.assign(accelerators_.size(), 0);
}

absl::StatusOr<std::shared_ptr<Mesh>> ResourceManager::Allocate(ClientId client, std::vector<int> dims,
                                                                const std::string& island) {
  if (!island.empty() && island != island_) {
    return absl::NotFoundError(absl::StrCat("no island '", island, "' here (this is '", island_, "')"));
  }
  if (dims.empty() || dims.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("a mesh has 1 or 2 dimensions, got ", dims.size()));
  }
  int64_t size = 1;
  for (int d : dims) {
    if (d < 1) return absl::InvalidArgumentError(absl::StrCat("mesh dimension ", d, " must be >= 1"));
    size *= d;
  }
  absl::MutexLock lock(&mu_);
  // Quarantined accelerators (Accelerator::Quarantine) are out of service.
  std::vector<int> order;
  std::string out;
  for (int i = 0; i < static_cast<int>(accelerators_.size()); ++i) {
    if (accelerators_[i]->quarantined()) {
      absl::StrAppend(&out, out.empty() ? "" : "; ", accelerators_[i]->health().message());
    } else {
      order.push_back(i);
    }
  }
  if (size > static_cast<int64_t>(order.size())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a mesh of ", size, " accelerators does not fit island '", island_, "' of ", accelerators_.size(),
        out.empty()
            ? ""
            : absl::StrCat(" (", accelerators_.size() - order.size(), " out of service: ", out, ")")));
  }
  // Least-loaded first, then by index, so meshes spread over the island.
  const std::vector<int> load = load_;  // a copy: the analysis does not follow the lock into the lambda
  std::stable_sort(order.begin(), order.end(), [&load](int a, int b) { return load[a] < load[b]; });
  std::vector<Accelerator*> devices;
  std::vector<int> chosen(order.begin(), order.begin() + size);
  std::sort(chosen.begin(), chosen.end());
  for (int i : chosen) {
    devices.push_back(accelerators_[i]);
    load_[i]++;
  }
  auto mesh = std::make_shared<Mesh>(next_id_++, island_, std::move(dims), std::move(devices), client);
  meshes_[mesh->id()] = mesh;
  return mesh;
}

void ResourceManager::ReleaseLocked(Mesh& mesh) {
  mesh.released_.store(true, std::memory_order_release);
  for (Accelerator* a : mesh.devices()) {
    for (size_t i = 0; i < accelerators_.size(); ++i) {
      if (accelerators_[i] == a) load_[i]--;
    }
  }
  meshes_.erase(mesh.id());
}

absl::Status ResourceManager::Release(const std::shared_ptr<Mesh>& mesh) {
  absl::MutexLock lock(&mu_);
  if (mesh == nullptr || !meshes_.contains(mesh->id())) {
    return absl::NotFoundError("releasing a mesh that is not held");
  }
  ReleaseLocked(*mesh);
  return absl::OkStatus();
}

int ResourceManager::ReleaseClient(ClientId client) {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Mesh>> mine;
  for (auto& [id, m] : meshes_) {
    if (m->owner() == client) mine.push_back(m);
  }
  for (auto& m : mine) ReleaseLocked(*m);
  return static_cast<int>(mine.size());
}

std::vector<int> ResourceManager::Load() const {
  absl::MutexLock lock(&mu_);
  return load_;
}

std::vector<std::shared_ptr<Mesh>> ResourceManager::MeshesOf(ClientId client) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Mesh>> out;
  for (auto& [id, m] : meshes_) {
    if (m->owner() == client) out.push_back(m);
  }
  return out;
}

}  // namespace causeway
