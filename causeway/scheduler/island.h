// An island: a set of accelerators with one resource manager and one gang
// scheduler, and the clients that run programs on it.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(auto island, Island::Create(runtime.get(), {}));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto client, island->Connect("trainer"));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto mesh, client->AllocateMesh({4}));
//   ... build a Program on `mesh` ...
//   CAUSEWAY_ASSIGN_OR_RETURN(auto exe, client->Load(program));
//   CAUSEWAY_ASSIGN_OR_RETURN(Execution run, client->Execute(exe, {x}));   // returns at once
//   CAUSEWAY_RETURN_IF_ERROR(run.Await());
//   CAUSEWAY_RETURN_IF_ERROR(run.outputs[0]->Download(host.data(), bytes));
#ifndef CAUSEWAY_SCHEDULER_ISLAND_H_
#define CAUSEWAY_SCHEDULER_ISLAND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/executable.h"
#include "causeway/scheduler/gang_scheduler.h"
#include "causeway/scheduler/mesh.h"
#include "causeway/scheduler/program.h"

namespace causeway {

struct IslandOptions {
  std::string name = "local";
  SchedulingPolicy policy = SchedulingPolicy::kFifo;
  DispatchMode dispatch = DispatchMode::kAsync;
  // Runs of one executable in flight at once (each holds its own
  // intermediate buffers); a client going faster waits.
  int runs_in_flight = 2;
  // Weighted policy, under contention: gang calls dispatched ahead of the
  // device per accelerator. Enough to keep every device fed; small enough that
  // competing clients queue in the scheduler, where the policy (not arrival
  // order) decides.
  int dispatch_ahead = 4;
  // The longest a run may take: a run that asks for no deadline, or a longer
  // one, gets this (ExecuteOptions::deadline). Infinite: no limit.
  absl::Duration run_deadline = absl::InfiniteDuration();
  // The shortest deadline a run may ask for (shorter ones are refused). Past
  // its deadline a run's work that still holds an accelerator quarantines it
  // for every tenant, so an island serving several keeps this well above
  // the time a sound kernel takes.
  absl::Duration min_deadline = absl::ZeroDuration();
};

class Client;

// Thread-safe. Outlives its clients' use of it (clients hold no island
// reference after it is destroyed: destroy clients first).
class Island {
 public:
  static absl::StatusOr<std::unique_ptr<Island>> Create(Runtime* runtime, IslandOptions options = {});
  ~Island();

  // A new client with a weight for the proportional-share policy.
  absl::StatusOr<std::shared_ptr<Client>> Connect(std::string name, double weight = 1.0);

  const std::string& name() const { return options_.name; }
  const IslandOptions& options() const { return options_; }
  ResourceManager& resources() { return resources_; }
  GangScheduler& scheduler() { return scheduler_; }
  Runtime& runtime() { return *runtime_; }

 private:
  Island(Runtime* runtime, IslandOptions options);
  Runtime* runtime_;
  IslandOptions options_;
  ResourceManager resources_;
  GangScheduler scheduler_;
  absl::Mutex mu_;
  ClientId next_client_ ABSL_GUARDED_BY(mu_) = 1;
};

// A run of a program: its outputs (allocated up front, written as the run
// proceeds) and its completion.
struct Execution {
  std::vector<ArrayRef> outputs;
  std::shared_ptr<RunState> state;
  absl::Status Await(absl::Time deadline = absl::InfiniteFuture()) const { return state->Await(deadline); }
};

struct ExecuteOptions {
  // Names the run to the program's channels: the parts of one program on
  // several islands exchange values run by run under one tag, which the
  // controller gives all of them. 0: the executable's own count of runs.
  uint64_t tag = 0;
  // How long the run may take from Execute: past it, the run fails with
  // DeadlineExceeded naming what it was doing (its gang call, kernel and
  // accelerator), none of its remaining gang calls is dispatched, and an
  // accelerator its work still holds is quarantined (its pending and later
  // work fails with Unavailable; meshes avoid it). Infinite: the island's
  // run_deadline.
  absl::Duration deadline = absl::InfiniteDuration();
};

// One tenant of an island. Everything it allocates carries its id (the
// ownership label); Close (or destruction) gives all of it back without
// disturbing other clients. Thread-safe.
class Client {
 public:
  ~Client();
  ClientId id() const { return id_; }
  const std::string& name() const { return name_; }
  double weight() const { return weight_; }

  absl::StatusOr<std::shared_ptr<Mesh>> AllocateMesh(std::vector<int> dims, const std::string& island = "");
  absl::StatusOr<ArrayRef> CreateArray(std::shared_ptr<Mesh> mesh, Shape shape, DType dtype,
                                       Sharding sharding = Sharding::Replicated(), std::string label = "");
  // Loads a program whose meshes all belong to this client.
  absl::StatusOr<std::shared_ptr<Executable>> Load(std::shared_ptr<const Program> program);
  // Prepares and queues a run; returns without waiting for the devices (it
  // waits only when the executable already has its maximum of runs in flight).
  absl::StatusOr<Execution> Execute(const std::shared_ptr<Executable>& executable, const std::vector<ArrayRef>& inputs,
                                    const ExecuteOptions& options = {});
  // Cancels one of this client's runs: its Await returns Cancelled at once,
  // naming what it was doing; none of its gang calls not yet dispatched goes
  // to a device (the outputs they would write carry the error); its work
  // already on the devices runs to its end, as Vulkan cannot take it back,
  // and holds its buffers until then. A run that has ended keeps its result.
  // InvalidArgument for another client's run (of this island or another).
  absl::Status Cancel(const Execution& run);

  // Device memory held by this client's live arrays and executables.
  uint64_t bytes_held() const;
  // Releases every mesh, array and executable of this client, drops its
  // queued runs and stops those in progress (as Cancel); idempotent.
  void Close();
  bool closed() const;

 private:
  friend class Island;
  Client(Island* island, ClientId id, std::string name, double weight);
  Island* island_;
  ClientId id_;
  std::string name_;
  double weight_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  void TrackLocked(const ArrayRef& array) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether this client loaded `executable`.
  bool Loaded(const Executable* executable) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::weak_ptr<Array>> arrays_ ABSL_GUARDED_BY(mu_);
  size_t tracked_after_prune_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<Executable>> executables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_ISLAND_H_
