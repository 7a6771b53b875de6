// The single controller: connects to island servers (island_server.h),
// allocates meshes and arrays on them, loads programs that span islands
// (split per island, with channels for the values that cross: the islands
// exchange those directly) and runs them asynchronously.
//
// Every call that crosses to an island has a deadline (call_timeout). An
// island lost (closed, killed, or silent for connection.peer_timeout) fails
// the runs and downloads that depend on it with a status naming it, and the
// other islands of those programs are told to stop waiting for its values.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(auto controller, Controller::Connect({"127.0.0.1:7400", "127.0.0.1:7401"}));
//   CAUSEWAY_ASSIGN_OR_RETURN(RemoteMesh a, controller->AllocateMesh(0, {2}));
//   CAUSEWAY_ASSIGN_OR_RETURN(RemoteMesh b, controller->AllocateMesh(1, {2}));
//   ProgramDef def = ...;   // meshes "a" and "b"
//   CAUSEWAY_ASSIGN_OR_RETURN(auto program, controller->Load(def, {{"a", a}, {"b", b}}));
//   CAUSEWAY_ASSIGN_OR_RETURN(RemoteArray x, controller->CreateArray(a, {n}, DType::kF32));
//   CAUSEWAY_RETURN_IF_ERROR(controller->Upload(x, host.data(), bytes));
//   CAUSEWAY_ASSIGN_OR_RETURN(RemoteRun run, controller->Execute(program, {x}));   // returns at once
//   CAUSEWAY_RETURN_IF_ERROR(run.done.Await());
//   CAUSEWAY_RETURN_IF_ERROR(controller->Download(run.outputs[0], out.data(), bytes));
#ifndef CAUSEWAY_DISTRIBUTED_CONTROLLER_H_
#define CAUSEWAY_DISTRIBUTED_CONTROLLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/future.h"
#include "causeway/runtime/device_capabilities.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/dtype.h"
#include "causeway/transport/auth.h"
#include "causeway/transport/connection.h"

namespace causeway {
class ProgramDef;
}

namespace causeway::transport {

struct ControllerOptions {
  // Told to the islands in the handshake.
  std::string name = "controller";
  // Required when an island listens beyond loopback (it holds the same one).
  std::optional<Secret> secret;
  ConnectionOptions connection;
  // The deadline of every request to an island.
  absl::Duration call_timeout = absl::Seconds(30);
};

// A mesh on one island (by index in the controller's list).
struct RemoteMesh {
  int island = 0;
  uint64_t id = 0;
  std::vector<int> dims;
};

// An array on one island.
struct RemoteArray {
  int island = 0;
  uint64_t id = 0;
  Shape shape;
  DType dtype = DType::kF32;
  uint64_t bytes() const { return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype); }
};

// What an island holds, as far as a controller plans programs by it.
struct IslandDescription {
  std::string name;
  int accelerators = 0;
  // Of its accelerators: the name, kind, subgroup size and compute limits
  // (what ops:: plans take).
  DeviceCapabilities device;
  // Each accelerator's health when described: OK in service, else
  // Unavailable saying why it is out for good (quarantined or lost). The
  // island's mesh allocation avoids those out of service.
  std::vector<absl::Status> health;
};

// A program loaded over one or more islands. Opaque.
class RemoteProgram;

struct RemoteExecuteOptions {
  // How long the run may take on each island, from its start there (its
  // receives from other islands included): past it the run fails with
  // DeadlineExceeded naming what it was doing there, and an accelerator
  // its work still holds is quarantined (ExecuteOptions::deadline). An
  // island's own limit (`causeway island --run-deadline`) caps it, and one
  // shorter than the island's --min-deadline is refused. Infinite: the
  // islands' limits only.
  absl::Duration deadline = absl::InfiniteDuration();
};

// A run: its outputs (usable at once: later requests wait for them) and its
// completion (every island's part).
struct RemoteRun {
  std::vector<RemoteArray> outputs;
  Future<> done;
  // Which run this is (Controller::Cancel).
  std::shared_ptr<RemoteProgram> program;
  uint64_t tag = 0;
};

// Thread-safe.
class Controller {
 public:
  // Connects to every island (host:port) and learns its name. Errors name the
  // island that could not be reached or refused.
  static absl::StatusOr<std::unique_ptr<Controller>> Connect(const std::vector<std::string>& islands,
                                                             ControllerOptions options = {});
  // Asks a launch's coordinator (process 0, launch.h) for its islands,
  // waiting until all have registered or `deadline`, and connects to them in
  // order of process id.
  static absl::StatusOr<std::unique_ptr<Controller>> ConnectToLaunch(const std::string& coordinator,
                                                                     ControllerOptions options = {},
                                                                     absl::Time deadline = absl::Now() +
                                                                                           absl::Minutes(2));
  // Closes every connection (the islands release what this controller made)
  // and fails what is still pending.
  ~Controller();

  int island_count() const { return static_cast<int>(islands_.size()); }
  // As the island named itself.
  const std::string& island_name(int i) const;
  // OK while the island's connection is healthy; why not otherwise.
  absl::Status island_status(int i) const;

  // Asks the island what it holds.
  absl::StatusOr<IslandDescription> Describe(int island);
  absl::StatusOr<RemoteMesh> AllocateMesh(int island, std::vector<int> dims);
  absl::StatusOr<RemoteArray> CreateArray(const RemoteMesh& mesh, Shape shape, DType dtype,
                                          Sharding sharding = Sharding::Replicated());
  // Sends the array's bytes (row-major, the whole array); the island
  // shards them. Runs asked for afterwards see them.
  absl::Status Upload(const RemoteArray& array, const void* host, uint64_t size);
  // The array's bytes once written, by `deadline`.
  absl::Status Download(const RemoteArray& array, void* host, uint64_t size,
                        absl::Time deadline = absl::InfiniteFuture());
  // Gives the array back. A one-way note, in order with this controller's
  // other requests to the island (a later request no longer finds the
  // array; runs asked for earlier still read it): NotFound here for an array
  // this controller does not hold (released, or never made).
  absl::Status Release(const RemoteArray& array);

  // Splits `def` by the islands of its meshes (`meshes` binds each MeshDef
  // name to a mesh of this controller) and loads each part on its island,
  // with channels between islands for the values that cross.
  absl::StatusOr<std::shared_ptr<RemoteProgram>> Load(const ProgramDef& def,
                                                      const absl::flat_hash_map<std::string, RemoteMesh>& meshes);
  // Starts a run on every island of the program; returns without waiting
  // for devices. Inputs in the def's parameter order.
  absl::StatusOr<RemoteRun> Execute(const std::shared_ptr<RemoteProgram>& program,
                                    const std::vector<RemoteArray>& inputs,
                                    const RemoteExecuteOptions& options = {});
  // Cancels a run on every island of its program, without waiting: a part
  // not yet started there never starts; one in progress dispatches nothing
  // more (its work already on the devices runs to its end) and fails with
  // Cancelled naming what it was doing (Client::Cancel); the other parts stop
  // waiting for its values. `run.done` then fails with Cancelled, unless the
  // run had ended. An error only when no island could be told.
  absl::Status Cancel(const RemoteRun& run);

 private:
  struct Island;
  struct PendingRun;
  struct PendingFetch;
  explicit Controller(ControllerOptions options);
  absl::StatusOr<std::string> Call(int island, const std::string& request);
  void HandleNote(int island, const std::string& note);
  void WatchLoop();
  // Fails what depends on island `i`, once.
  void IslandLost(int i, const absl::Status& why);
  // The one form of a lost island's error, wherever the loss is seen:
  // Unavailable "island I ('NAME' at ADDRESS) lost: WHY".
  absl::Status LostError(int i, const absl::Status& why) const;
  // LostError for island `i` if its connection has failed, else OK.
  absl::Status LostIfDown(int i) const;
  // One part of run `tag` failed: the parts still going stop waiting for
  // values from the others, which may never come (the link between two
  // islands may be what failed, so the islands cannot be left to tell each
  // other). Once per run; the notes to send (island, IslandRequest bytes),
  // outside the lock.
  std::vector<std::pair<int, std::string>> FailReceivesLocked(PendingRun& run, uint64_t tag,
                                                                const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendNotes(const std::vector<std::pair<int, std::string>>& notes);

  ControllerOptions options_;
  std::vector<std::unique_ptr<Island>> islands_;
  std::thread watcher_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_fetch_ ABSL_GUARDED_BY(mu_) = 1;
  // Channel ids name a program's channels on every island it spans, beside
  // other controllers' programs: each controller counts up from a random
  // point in [2^32, 2^63), so two never meet in practice (and an island
  // refuses a program whose channel id is taken).
  uint64_t next_channel_ ABSL_GUARDED_BY(mu_) = 16;
  uint64_t next_array_ ABSL_GUARDED_BY(mu_) = uint64_t{1} << 62;  // kControllerIds
  std::vector<bool> lost_ ABSL_GUARDED_BY(mu_);
  // The ids of the arrays this controller holds on each island (made by
  // CreateArray or as a run's outputs, not released), so that Release,
  // which waits for no answer, can still refuse an id it does not hold.
  std::vector<absl::flat_hash_set<uint64_t>> arrays_ ABSL_GUARDED_BY(mu_);
  // Keyed by (island, program id, tag).
  absl::flat_hash_map<std::tuple<int, uint64_t, uint64_t>, std::shared_ptr<PendingRun>> runs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingFetch>> fetches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<RemoteProgram>> programs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace causeway::transport

#endif  // CAUSEWAY_DISTRIBUTED_CONTROLLER_H_
