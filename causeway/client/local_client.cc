#include "causeway/client/local_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/client/device_info.h"
#include "causeway/scheduler/executable.h"
#include "causeway/scheduler/program_def.h"

namespace causeway::client {
namespace {

// A program loaded on the island, as the tenant's executable.
class LocalProgram : public LoadedProgram {
 public:
  LocalProgram(std::string name, std::shared_ptr<Executable> executable)
      : LoadedProgram(std::move(name)), executable_(std::move(executable)) {}
  const std::shared_ptr<Executable>& executable() const { return executable_; }

 private:
  const std::shared_ptr<Executable> executable_;
};

absl::Status NoIsland(int island) {
  return absl::InvalidArgumentError(
      absl::StrCat("island ", island, " does not exist: a local client has one island, 0"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalClient>> LocalClient::Create(const RuntimeOptions& runtime,
                                                                 IslandOptions island,
                                                                 const std::string& name) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Create(runtime));
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Island> isl, Island::Create(rt.get(), std::move(island)));
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<LocalClient> client, Connect(isl.get(), name));
  client->own_island_ = std::move(isl);
  client->own_runtime_ = std::move(rt);
  return client;
}

absl::StatusOr<std::unique_ptr<LocalClient>> LocalClient::Connect(Island* island, const std::string& name,
                                                                  double weight) {
  if (island == nullptr) return absl::InvalidArgumentError("LocalClient::Connect: no island");
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<causeway::Client> tenant, island->Connect(name, weight));
  return std::unique_ptr<LocalClient>(new LocalClient(island, std::move(tenant)));
}

LocalClient::LocalClient(Island* island, std::shared_ptr<causeway::Client> tenant)
    : island_(island), tenant_(std::move(tenant)) {
  waiter_ = std::thread([this] { WaitLoop(); });
}

LocalClient::~LocalClient() {
  // Closing stops the runs in progress, so the waiter's awaits end.
  tenant_->Close();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  waiter_.join();
  {
    absl::MutexLock lock(&mu_);
    runs_.clear();
    arrays_.clear();
    meshes_.clear();
  }
  tenant_.reset();
  own_island_.reset();  // before the runtime it runs on
  own_runtime_.reset();
}

void LocalClient::WaitLoop() {
  for (;;) {
    Waiting next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](LocalClient* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->waiting_.empty();
          },
          this));
      if (waiting_.empty()) return;  // stopping, nothing left
      next = std::move(waiting_.front());
      waiting_.pop_front();
    }
    const absl::Status status = next.execution.Await();
    {
      absl::MutexLock lock(&mu_);
      runs_.erase({next.program, next.tag});
    }
    next.done.Set(status);
  }
}

absl::StatusOr<std::vector<Device>> LocalClient::Devices() {
  std::vector<Device> out;
  Runtime& rt = island_->runtime();
  for (size_t i = 0; i < rt.size(); ++i) {
    Accelerator* a = rt.accelerator(i);
    out.push_back(DeviceFrom(a->capabilities(), a->health(), 0, static_cast<int>(i), island_->name()));
  }
  return out;
}

absl::StatusOr<Mesh> LocalClient::AllocateMesh(int island, std::vector<int> dims) {
  if (island != 0) return NoIsland(island);
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<causeway::Mesh> mesh, tenant_->AllocateMesh(dims));
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  meshes_[id] = mesh;
  return Mesh{0, id, mesh->dims()};
}

absl::StatusOr<std::shared_ptr<causeway::Mesh>> LocalClient::FindMesh(const Mesh& mesh) const {
  if (mesh.island != 0) return NoIsland(mesh.island);
  absl::MutexLock lock(&mu_);
  auto it = meshes_.find(mesh.id);
  if (it == meshes_.end()) return absl::NotFoundError(absl::StrCat("no mesh ", mesh.id, " in this client"));
  return it->second;
}

absl::StatusOr<ArrayRef> LocalClient::Find(const Array& array) const {
  if (array.island != 0) return NoIsland(array.island);
  absl::MutexLock lock(&mu_);
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return absl::NotFoundError(absl::StrCat("no array ", array.id, " in this client"));
  return it->second;
}

Array LocalClient::Hold(const ArrayRef& array) {
  const uint64_t id = next_id_++;
  arrays_[id] = array;
  return Array{0, id, array->shape(), array->dtype()};
}

absl::StatusOr<Array> LocalClient::CreateArray(const Mesh& mesh, Shape shape, DType dtype,
                                               Sharding sharding) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<causeway::Mesh> m, FindMesh(mesh));
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef array,
                            tenant_->CreateArray(std::move(m), std::move(shape), dtype, sharding));
  absl::MutexLock lock(&mu_);
  return Hold(array);
}

absl::Status LocalClient::Upload(const Array& array, const void* host, uint64_t size) {
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef a, Find(array));
  return a->Upload(host, size);
}

absl::Status LocalClient::Download(const Array& array, void* host, uint64_t size, absl::Time deadline) {
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef a, Find(array));
  CAUSEWAY_RETURN_IF_ERROR(a->Await(deadline));
  return a->Download(host, size);
}

absl::Status LocalClient::Release(const Array& array) {
  if (array.island != 0) return NoIsland(array.island);
  ArrayRef released;
  {
    absl::MutexLock lock(&mu_);
    auto it = arrays_.find(array.id);
    if (it == arrays_.end())
      return absl::NotFoundError(absl::StrCat("no array ", array.id, " in this client"));
    released = std::move(it->second);
    arrays_.erase(it);
  }
  // Runs that read it hold their own references: its memory goes after them.
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<LoadedProgram>> LocalClient::Load(
    const ProgramDef& def, const absl::flat_hash_map<std::string, Mesh>& meshes) {
  absl::flat_hash_map<std::string, std::shared_ptr<causeway::Mesh>> bound;
  for (const auto& [name, mesh] : meshes) {
    CAUSEWAY_ASSIGN_OR_RETURN(bound[name], FindMesh(mesh));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Program> program, BuildProgram(def, bound));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Executable> executable, tenant_->Load(program));
  return std::make_shared<LocalProgram>(program->name(), std::move(executable));
}

absl::StatusOr<Run> LocalClient::Execute(const std::shared_ptr<LoadedProgram>& program,
                                         const std::vector<Array>& inputs, const ExecuteOptions& options) {
  auto* local = dynamic_cast<LocalProgram*>(program.get());
  if (local == nullptr)
    return absl::InvalidArgumentError("Execute: the program was not loaded by a local client");
  std::vector<ArrayRef> refs;
  refs.reserve(inputs.size());
  for (const Array& a : inputs) {
    CAUSEWAY_ASSIGN_OR_RETURN(refs.emplace_back(), Find(a));
  }
  causeway::ExecuteOptions run_options;
  run_options.deadline = options.deadline;
  CAUSEWAY_ASSIGN_OR_RETURN(Execution execution, tenant_->Execute(local->executable(), refs, run_options));
  Run run;
  run.program = program;
  run.tag = execution.state->tag();
  Promise<> done;
  run.done = done.future();
  absl::MutexLock lock(&mu_);
  for (const ArrayRef& out : execution.outputs) run.outputs.push_back(Hold(out));
  runs_[{program.get(), run.tag}] = execution;
  waiting_.push_back(Waiting{program.get(), run.tag, std::move(execution), std::move(done)});
  return run;
}

absl::Status LocalClient::Cancel(const Run& run) {
  if (dynamic_cast<LocalProgram*>(run.program.get()) == nullptr) {
    return absl::InvalidArgumentError("Cancel: the run's program was not loaded by a local client");
  }
  Execution execution;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(std::make_pair(run.program.get(), run.tag));
    if (it == runs_.end()) return absl::OkStatus();  // over already: it keeps its result
    execution = it->second;
  }
  return tenant_->Cancel(execution);
}

}  // namespace causeway::client
