// Client (causeway/client/client.h) over island servers: a controller
// (causeway/distributed/controller.h) of every island it was given, each island an
// index in their order. A program whose meshes lie on several islands is
// split between them, with channels for the values that cross.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(auto client, client::RemoteClient::Connect({"127.0.0.1:7400",
//   "127.0.0.1:7401"}));
#ifndef CAUSEWAY_CLIENT_REMOTE_CLIENT_H_
#define CAUSEWAY_CLIENT_REMOTE_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "causeway/client/client.h"
#include "causeway/distributed/controller.h"

namespace causeway::client {

class RemoteClient : public Client {
 public:
  // Connects to every island (host:port). Errors name the island that could
  // not be reached or refused.
  static absl::StatusOr<std::unique_ptr<RemoteClient>> Connect(const std::vector<std::string>& islands,
                                                               transport::ControllerOptions options = {});
  // Over a controller already connected.
  explicit RemoteClient(std::unique_ptr<transport::Controller> controller)
      : controller_(std::move(controller)) {}

  const char* kind() const override { return "remote"; }
  int island_count() const override { return controller_->island_count(); }
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

  // The controller beneath, for what only it does.
  transport::Controller& controller() { return *controller_; }

 private:
  std::unique_ptr<transport::Controller> controller_;
};

}  // namespace causeway::client

#endif  // CAUSEWAY_CLIENT_REMOTE_CLIENT_H_
