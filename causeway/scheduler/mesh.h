// Meshes (virtual slices of accelerators) and the resource manager that maps
// them onto an island's physical accelerators.
#ifndef CAUSEWAY_SCHEDULER_MESH_H_
#define CAUSEWAY_SCHEDULER_MESH_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "causeway/runtime/accelerator.h"

namespace causeway {

using ClientId = uint64_t;

// A 1-D or 2-D grid of accelerators held by one client. Immutable; shared by
// the arrays and programs that use it. `released()` turns true when its client
// gives it back (or goes away); using it after that is an error.
class Mesh {
 public:
  Mesh(uint64_t id, std::string island, std::vector<int> dims, std::vector<Accelerator*> devices, ClientId owner)
      : id_(id), island_(std::move(island)), dims_(std::move(dims)), devices_(std::move(devices)), owner_(owner) {}

  uint64_t id() const { return id_; }
  const std::string& island() const { return island_; }
  const std::vector<int>& dims() const { return dims_; }  // 1 or 2 entries
  int size() const { return static_cast<int>(devices_.size()); }
  // Devices in row-major order of the mesh.
  const std::vector<Accelerator*>& devices() const { return devices_; }
  Accelerator* device(int i) const { return devices_[i]; }
  // The position of flat index `i` along mesh axis `axis`.
  int Coordinate(int i, int axis) const;
  // Whether every device reads every other's memory in place (one VkDevice,
  // or imported memory; no pair staged through the host): what direct-read
  // collectives need.
  bool DevicesShareMemory() const;
  ClientId owner() const { return owner_; }
  bool released() const { return released_.load(std::memory_order_acquire); }
  std::string DebugString() const;  // "mesh 3 [2x2] on accelerators 0,1,2,3"

 private:
  friend class ResourceManager;
  uint64_t id_;
  std::string island_;
  std::vector<int> dims_;
  std::vector<Accelerator*> devices_;
  ClientId owner_;
  std::atomic<bool> released_{false};
};

// Hands out meshes over the accelerators of one island, least-loaded
// accelerators first, and takes them back. Thread-safe.
class ResourceManager {
 public:
  ResourceManager(std::string island, std::vector<Accelerator*> accelerators);

  const std::string& island() const { return island_; }
  // A mesh of `dims` (1 or 2 positive sizes) for `client`, on distinct
  // accelerators. `island` must be empty or this island's name.
  absl::StatusOr<std::shared_ptr<Mesh>> Allocate(ClientId client, std::vector<int> dims,
                                                 const std::string& island = "");
  // Gives a mesh back; its arrays and programs stop working.
  absl::Status Release(const std::shared_ptr<Mesh>& mesh);
  // Gives back every mesh of `client`; returns how many.
  int ReleaseClient(ClientId client);
  // How many live meshes use each accelerator.
  std::vector<int> Load() const;
  std::vector<std::shared_ptr<Mesh>> MeshesOf(ClientId client) const;

 private:
  void ReleaseLocked(Mesh& mesh) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string island_;
  std::vector<Accelerator*> accelerators_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<int> load_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Mesh>> meshes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_MESH_H_
