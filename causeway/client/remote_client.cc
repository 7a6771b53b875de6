#include "causeway/client/remote_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/client/device_info.h"
#include "causeway/scheduler/program_def.h"

namespace causeway::client {
namespace {

// A program loaded over the controller's islands.
class RemoteLoadedProgram : public LoadedProgram {
 public:
  RemoteLoadedProgram(std::string name, std::shared_ptr<transport::RemoteProgram> program)
      : LoadedProgram(std::move(name)), program_(std::move(program)) {}
  const std::shared_ptr<transport::RemoteProgram>& program() const { return program_; }

 private:
  const std::shared_ptr<transport::RemoteProgram> program_;
};

transport::RemoteMesh ToRemote(const Mesh& m) { return {m.island, m.id, m.dims}; }
transport::RemoteArray ToRemote(const Array& a) { return {a.island, a.id, a.shape, a.dtype}; }
Array FromRemote(const transport::RemoteArray& a) { return {a.island, a.id, a.shape, a.dtype}; }

absl::StatusOr<const RemoteLoadedProgram*> Remote(const LoadedProgram* program, const char* what) {
  auto* remote = dynamic_cast<const RemoteLoadedProgram*>(program);
  if (remote == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the program was not loaded by a remote client"));
  }
  return remote;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteClient>> RemoteClient::Connect(const std::vector<std::string>& islands,
                                                                    transport::ControllerOptions options) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<transport::Controller> controller,
                            transport::Controller::Connect(islands, std::move(options)));
  return std::make_unique<RemoteClient>(std::move(controller));
}

absl::StatusOr<std::vector<Device>> RemoteClient::Devices() {
  std::vector<Device> out;
  for (int i = 0; i < controller_->island_count(); ++i) {
    CAUSEWAY_ASSIGN_OR_RETURN(transport::IslandDescription d, controller_->Describe(i));
    for (int a = 0; a < d.accelerators; ++a) {
      const absl::Status health = a < static_cast<int>(d.health.size()) ? d.health[a] : absl::OkStatus();
      out.push_back(DeviceFrom(d.device, health, i, a, d.name));
    }
  }
  return out;
}

absl::StatusOr<Mesh> RemoteClient::AllocateMesh(int island, std::vector<int> dims) {
  CAUSEWAY_ASSIGN_OR_RETURN(transport::RemoteMesh m, controller_->AllocateMesh(island, std::move(dims)));
  return Mesh{m.island, m.id, m.dims};
}

absl::StatusOr<Array> RemoteClient::CreateArray(const Mesh& mesh, Shape shape, DType dtype,
                                                Sharding sharding) {
  CAUSEWAY_ASSIGN_OR_RETURN(transport::RemoteArray a,
                            controller_->CreateArray(ToRemote(mesh), std::move(shape), dtype, sharding));
  return FromRemote(a);
}

absl::Status RemoteClient::Upload(const Array& array, const void* host, uint64_t size) {
  return controller_->Upload(ToRemote(array), host, size);
}

absl::Status RemoteClient::Download(const Array& array, void* host, uint64_t size, absl::Time deadline) {
  return controller_->Download(ToRemote(array), host, size, deadline);
}

absl::Status RemoteClient::Release(const Array& array) { return controller_->Release(ToRemote(array)); }

absl::StatusOr<std::shared_ptr<LoadedProgram>> RemoteClient::Load(
    const ProgramDef& def, const absl::flat_hash_map<std::string, Mesh>& meshes) {
  absl::flat_hash_map<std::string, transport::RemoteMesh> bound;
  for (const auto& [name, mesh] : meshes) bound[name] = ToRemote(mesh);
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<transport::RemoteProgram> program, controller_->Load(def, bound));
  return std::make_shared<RemoteLoadedProgram>(def.name(), std::move(program));
}

absl::StatusOr<Run> RemoteClient::Execute(const std::shared_ptr<LoadedProgram>& program,
                                          const std::vector<Array>& inputs, const ExecuteOptions& options) {
  CAUSEWAY_ASSIGN_OR_RETURN(const RemoteLoadedProgram* remote, Remote(program.get(), "Execute"));
  std::vector<transport::RemoteArray> in;
  in.reserve(inputs.size());
  for (const Array& a : inputs) in.push_back(ToRemote(a));
  transport::RemoteExecuteOptions run_options;
  run_options.deadline = options.deadline;
  CAUSEWAY_ASSIGN_OR_RETURN(transport::RemoteRun r, controller_->Execute(remote->program(), in, run_options));
  Run run;
  for (const transport::RemoteArray& out : r.outputs) run.outputs.push_back(FromRemote(out));
  run.done = r.done;
  run.program = program;
  run.tag = r.tag;
  return run;
}

absl::Status RemoteClient::Cancel(const Run& run) {
  CAUSEWAY_ASSIGN_OR_RETURN(const RemoteLoadedProgram* remote, Remote(run.program.get(), "Cancel"));
  transport::RemoteRun r;
  r.program = remote->program();
  r.tag = run.tag;
  return controller_->Cancel(r);
}

}  // namespace causeway::client
