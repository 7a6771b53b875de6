// One client API for Causeway, whether the islands are in this process or
// behind island servers: devices and their capabilities, meshes, arrays
// (create, upload, download, release), programs loaded from a ProgramDef,
// runs that return at once with their output arrays and a future, cancel.
// Two implementations: LocalClient (causeway/client/local_client.h), a tenant of an
// island in this process, and RemoteClient (causeway/client/remote_client.h), a
// controller of island servers. Code written against Client runs on either.
//
// Handles are plain values naming what the client holds (by id); they stay
// valid until released (arrays) or until the client is destroyed, which
// gives back everything it made. Every call is thread-safe.
//
// Example:
//   std::unique_ptr<client::Client> c = ...;  // LocalClient::Create or RemoteClient::Connect
//   CAUSEWAY_ASSIGN_OR_RETURN(client::Mesh mesh, c->AllocateMesh(0, {2}));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto program, c->Load(def, {{"m", mesh}}));
//   CAUSEWAY_ASSIGN_OR_RETURN(client::Array x, c->CreateArray(mesh, {n}, DType::kF32));
//   CAUSEWAY_RETURN_IF_ERROR(c->Upload(x, host.data(), n * 4));
//   CAUSEWAY_ASSIGN_OR_RETURN(client::Run run, c->Execute(program, {x}));  // returns at once
//   CAUSEWAY_RETURN_IF_ERROR(c->Download(run.outputs[0], out.data(), n * 4));
#ifndef CAUSEWAY_CLIENT_CLIENT_H_
#define CAUSEWAY_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "causeway/base/future.h"
#include "causeway/runtime/device_capabilities.h"
#include "causeway/scheduler/dtype.h"
#include "causeway/scheduler/sharding.h"

namespace causeway {
class ProgramDef;
}

namespace causeway::client {

// One accelerator, as planners and users see it: no Vulkan types.
struct Device {
  int island = 0;  // index among the client's islands
  int index = 0;   // within its island
  std::string island_name;
  // Its name, kind, subgroup size and compute limits: what kernel plans
  // (causeway/kernels/ops.h) are made for.
  DeviceCapabilities capabilities;
  // OK while in service; else Unavailable saying why it is out for good
  // (quarantined, lost). Meshes avoid those out of service.
  absl::Status health;
};

// A mesh of accelerators on one island.
struct Mesh {
  int island = 0;
  uint64_t id = 0;
  std::vector<int> dims;
};

// An array on one mesh.
struct Array {
  int island = 0;
  uint64_t id = 0;
  Shape shape;
  DType dtype = DType::kF32;
  // The whole array's size in bytes (shapes are checked when made).
  uint64_t bytes() const { return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype); }
};

// A program loaded on the islands of its meshes. Opaque; shared by the runs
// that use it.
class LoadedProgram {
 public:
  virtual ~LoadedProgram() = default;
  const std::string& name() const { return name_; }

 protected:
  explicit LoadedProgram(std::string name) : name_(std::move(name)) {}

 private:
  const std::string name_;
};

struct ExecuteOptions {
  // How long the run may take: past it the run fails with DeadlineExceeded
  // naming what it was doing, and an accelerator its work still holds is
  // quarantined. Infinite: the islands' own limits only.
  absl::Duration deadline = absl::InfiniteDuration();
};

// A run: its outputs, usable at once (later calls wait for them), and its
// completion.
struct Run {
  std::vector<Array> outputs;
  Future<> done;
  std::shared_ptr<LoadedProgram> program;
  uint64_t tag = 0;  // which run of `program` (Cancel)
};

class Client {
 public:
  virtual ~Client() = default;

  // "local" or "remote".
  virtual const char* kind() const = 0;
  virtual int island_count() const = 0;
  // Every accelerator of every island, with its health now.
  virtual absl::StatusOr<std::vector<Device>> Devices() = 0;

  virtual absl::StatusOr<Mesh> AllocateMesh(int island, std::vector<int> dims) = 0;
  virtual absl::StatusOr<Array> CreateArray(const Mesh& mesh, Shape shape, DType dtype,
                                            Sharding sharding = Sharding::Replicated()) = 0;
  // Sends the whole array's bytes (row-major); each device gets its shard.
  // Runs asked for afterwards see them.
  virtual absl::Status Upload(const Array& array, const void* host, uint64_t size) = 0;
  // The whole array's bytes once written, by `deadline`.
  virtual absl::Status Download(const Array& array, void* host, uint64_t size,
                                absl::Time deadline = absl::InfiniteFuture()) = 0;
  // Gives the array back (after the runs that use it). NotFound for an array
  // this client does not hold.
  virtual absl::Status Release(const Array& array) = 0;

  // Loads `def`, binding each of its MeshDef names to a mesh of this client
  // (a program over meshes of several islands is split between them).
  virtual absl::StatusOr<std::shared_ptr<LoadedProgram>> Load(
      const ProgramDef& def, const absl::flat_hash_map<std::string, Mesh>& meshes) = 0;
  // Starts a run, inputs in the def's parameter order; returns without
  // waiting for devices.
  virtual absl::StatusOr<Run> Execute(const std::shared_ptr<LoadedProgram>& program,
                                      const std::vector<Array>& inputs,
                                      const ExecuteOptions& options = {}) = 0;
  // Cancels a run: what is not yet dispatched never is, `run.done` fails
  // with Cancelled (unless it had ended). Work already on a device runs to
  // its end.
  virtual absl::Status Cancel(const Run& run) = 0;
};

}  // namespace causeway::client

#endif  // CAUSEWAY_CLIENT_CLIENT_H_
