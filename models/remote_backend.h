// A trainer's backend on island servers (transport/island_server.h) through a
// single controller: replica r of the layout runs on island r % islands, so
// two replicas on two islands are data parallelism across islands, their
// gradients exchanged over DCN inside the step program.
//
// Example:
//   ASSIGN_OR_RETURN(auto controller, transport::Controller::Connect({"10.0.0.1:7477", "10.0.0.2:7477"}));
//   ASSIGN_OR_RETURN(auto backend, RemoteBackend::Create(controller.get()));
//   options.layout.replicas = 2;
//   ASSIGN_OR_RETURN(auto trainer, Trainer::Create(std::move(backend), corpus, options));
#ifndef CAUSEWAY_MODELS_REMOTE_BACKEND_H_
#define CAUSEWAY_MODELS_REMOTE_BACKEND_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "models/trainer.h"
#include "transport/controller.h"

namespace causeway::models {

// Not thread-safe (the trainer's thread). The controller must outlive it.
class RemoteBackend : public TrainBackend {
 public:
  // Asks every island what it holds. Kernels are planned for the islands'
  // device when they all have the same kind (else for any device). Every
  // wait for a step, a read or a release ends by `timeout` (a lost island
  // ends it sooner, with the controller's status naming the island).
  static absl::StatusOr<std::unique_ptr<RemoteBackend>> Create(transport::Controller* controller,
                                                               absl::Duration timeout = absl::Minutes(5));
  ~RemoteBackend() override = default;

  const PhysicalDeviceInfo* device() const override { return device_ ? &*device_ : nullptr; }
  absl::StatusOr<int> AllocateMesh(int replica, int size) override;
  absl::StatusOr<int> Load(const ProgramDef& def,
                           const absl::flat_hash_map<std::string, int>& meshes) override;
  absl::StatusOr<Handle> Create(int mesh, const Shape& shape, DType dtype, const Sharding& sharding,
                                const void* data, uint64_t bytes) override;
  absl::StatusOr<std::vector<Handle>> Execute(int program, const std::vector<Handle>& inputs,
                                              absl::Duration deadline) override;
  absl::StatusOr<std::vector<float>> Read(Handle array) override;
  absl::StatusOr<double> Sum(Handle array) override;
  absl::Status Release(Handle array) override;

  // Where each replica's meshes are: island names, in replica order.
  const std::vector<std::string>& islands() const { return island_names_; }

 private:
  struct Stored {
    transport::RemoteArray array;
    // The run that writes it (none for an uploaded array): its failure is
    // the array's.
    std::optional<Future<>> written;
  };
  RemoteBackend(transport::Controller* controller, absl::Duration timeout)
      : controller_(controller), timeout_(timeout) {}
  absl::StatusOr<Stored> Get(Handle array) const;

  transport::Controller* controller_;
  absl::Duration timeout_;
  std::optional<PhysicalDeviceInfo> device_;
  std::vector<std::string> island_names_;
  std::vector<transport::RemoteMesh> meshes_;
  std::vector<std::shared_ptr<transport::RemoteProgram>> programs_;
  absl::flat_hash_map<Handle, Stored> arrays_;
  Handle next_ = 1;
};

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_REMOTE_BACKEND_H_
