// Client (causeway/client/client.h) over an island in this process: a tenant of it,
// with the weight and isolation every tenant has (causeway/scheduler/island.h).
//
// Example:
//   RuntimeOptions options;
//   options.accelerators = 2;
//   CAUSEWAY_ASSIGN_OR_RETURN(auto client, client::LocalClient::Create(options));
#ifndef CAUSEWAY_CLIENT_LOCAL_CLIENT_H_
#define CAUSEWAY_CLIENT_LOCAL_CLIENT_H_

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "causeway/client/client.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/island.h"

namespace causeway::client {

class LocalClient : public Client {
 public:
  // A runtime of its own (`runtime`), an island over it (`island`), and a
  // tenant `name` of that island.
  static absl::StatusOr<std::unique_ptr<LocalClient>> Create(const RuntimeOptions& runtime,
                                                             IslandOptions island = {},
                                                             const std::string& name = "client");
  // A tenant `name` of `island`, which must outlive the client.
  static absl::StatusOr<std::unique_ptr<LocalClient>> Connect(Island* island,
                                                              const std::string& name = "client",
                                                              double weight = 1.0);
  // Closes the tenant (its runs stop, everything it made is given back).
  ~LocalClient() override;

  const char* kind() const override { return "local"; }
  int island_count() const override { return 1; }
  absl::StatusOr<std::vector<Device>> Devices() override;
  absl::StatusOr<Mesh> AllocateMesh(int island, std::vector<int> dims) override;
  absl::StatusOr<Array> CreateArray(const Mesh& mesh, Shape shape, DType dtype,
                                    Sharding sharding = Sharding::Replicated()) override;
  absl::Status Upload(const Array& array, const void* host, uint64_t size) override;
  absl::Status Download(const Array& array, void* host, uint64_t size,
                        absl::Time deadline = absl::InfiniteFuture()) override;
  absl::Status Release(const Array& array) override;
  absl::StatusOr<std::shared_ptr<LoadedProgram>> Load(
      const ProgramDef& def, const absl::flat_hash_map<std::string, Mesh>& meshes) override;
  absl::StatusOr<Run> Execute(const std::shared_ptr<LoadedProgram>& program, const std::vector<Array>& inputs,
                              const ExecuteOptions& options = {}) override;
  absl::Status Cancel(const Run& run) override;

  // The island's tenant beneath, for what only the scheduler's API does.
  causeway::Client& tenant() { return *tenant_; }
  // The island it is a tenant of (for another tenant to Connect to).
  Island* island() { return island_; }

 private:
  LocalClient(Island* island, std::shared_ptr<causeway::Client> tenant);
  absl::StatusOr<ArrayRef> Find(const Array& array) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<causeway::Mesh>> FindMesh(const Mesh& mesh) const ABSL_LOCKS_EXCLUDED(mu_);
  Array Hold(const ArrayRef& array) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resolves each run's future once it has ended, in the order they were
  // started (so a run's future may resolve after it ended, never before).
  void WaitLoop();

  std::unique_ptr<Runtime> own_runtime_;
  std::unique_ptr<Island> own_island_;
  Island* island_;
  std::shared_ptr<causeway::Client> tenant_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<causeway::Mesh>> meshes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, ArrayRef> arrays_ ABSL_GUARDED_BY(mu_);
  // Runs not yet ended, by (program, tag), for Cancel.
  absl::flat_hash_map<std::pair<const LoadedProgram*, uint64_t>, Execution> runs_ ABSL_GUARDED_BY(mu_);

  struct Waiting {
    const LoadedProgram* program;
    uint64_t tag;
    Execution execution;
    Promise<> done;
  };
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread waiter_;
};

}  // namespace causeway::client

#endif  // CAUSEWAY_CLIENT_LOCAL_CLIENT_H_
