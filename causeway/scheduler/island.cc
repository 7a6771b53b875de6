#include "causeway/scheduler/island.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"

namespace causeway {

Island::Island(Runtime* runtime, IslandOptions options)
    : runtime_(runtime),
      options_(std::move(options)),
      resources_(options_.name, runtime->accelerators()),
      scheduler_(options_.policy, options_.dispatch, options_.dispatch_ahead, options_.name) {}

Island::~Island() = default;

absl::StatusOr<std::unique_ptr<Island>> Island::Create(Runtime* runtime, IslandOptions options) {
  if (runtime == nullptr || runtime->size() == 0) return absl::InvalidArgumentError("an island needs accelerators");
  if (options.runs_in_flight < 1) return absl::InvalidArgumentError("runs_in_flight must be >= 1");
  if (options.dispatch_ahead < 1) return absl::InvalidArgumentError("dispatch_ahead must be >= 1");
  return std::unique_ptr<Island>(new Island(runtime, std::move(options)));
}

absl::StatusOr<std::shared_ptr<Client>> Island::Connect(std::string name, double weight) {
  if (!(weight > 0)) return absl::InvalidArgumentError(absl::StrCat("client '", name, "': weight must be > 0"));
  ClientId id;
  {
    absl::MutexLock lock(&mu_);
    id = next_client_++;
  }
  scheduler_.AddClient(id, weight);
  return std::shared_ptr<Client>(new Client(this, id, std::move(name), weight));
}

Client::Client(Island* island, ClientId id, std::string name, double weight)
    : island_(island), id_(id), name_(std::move(name)), weight_(weight) {}

Client::~Client() { Close(); }

bool Client::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::StatusOr<std::shared_ptr<Mesh>> Client::AllocateMesh(std::vector<int> dims, const std::string& island) {
  if (closed()) return absl::FailedPreconditionError(absl::StrCat("client '", name_, "' is closed"));
  return island_->resources().Allocate(id_, std::move(dims), island);
}

absl::StatusOr<ArrayRef> Client::CreateArray(std::shared_ptr<Mesh> mesh, Shape shape, DType dtype,
                                             Sharding sharding, std::string label) {
  if (closed()) return absl::FailedPreconditionError(absl::StrCat("client '", name_, "' is closed"));
  if (mesh != nullptr && mesh->owner() != id_) {
    return absl::PermissionDeniedError(absl::StrCat("client '", name_, "' does not hold ", mesh->DebugString()));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(
      ArrayRef a, Array::Create(std::move(mesh), std::move(shape), dtype, sharding, id_, std::move(label)));
  absl::MutexLock lock(&mu_);
  TrackLocked(a);
  return a;
}

absl::StatusOr<std::shared_ptr<Executable>> Client::Load(std::shared_ptr<const Program> program) {
  HostSpan span("lower");
  if (span.active() && program != nullptr) span.set_args(absl::StrCat("\"program\":", JsonQuote(program->name())));
  if (closed()) return absl::FailedPreconditionError(absl::StrCat("client '", name_, "' is closed"));
  if (program == nullptr) return absl::InvalidArgumentError("Load: no program");
  for (const ProgramStep& s : program->steps()) {
    if (s.mesh->owner() != id_) {
      return absl::PermissionDeniedError(absl::StrCat("program '", program->name(), "' node '", s.node, "' runs on ",
                                                      s.mesh->DebugString(), ", which client '", name_,
                                                      "' does not hold"));
    }
    if (s.mesh->released()) {
      return absl::FailedPreconditionError(absl::StrCat("program '", program->name(), "' node '", s.node,
                                                        "': unknown mesh: ", s.mesh->DebugString(), " was released"));
    }
  }
  for (int v : program->parameters()) {
    const ProgramValue& p = program->values()[v];
    if (p.mesh->owner() != id_) {
      return absl::PermissionDeniedError(absl::StrCat("program '", program->name(), "' parameter '", p.name,
                                                      "' lives on ", p.mesh->DebugString(), ", which client '",
                                                      name_, "' does not hold"));
    }
    if (p.mesh->released()) {
      return absl::FailedPreconditionError(absl::StrCat("program '", program->name(), "' parameter '", p.name,
                                                        "': unknown mesh: ", p.mesh->DebugString(),
                                                        " was released"));
    }
  }
  auto exe = std::make_shared<Executable>(std::move(program), id_, island_->options().runs_in_flight, name_);
  absl::MutexLock lock(&mu_);
  executables_.push_back(exe);
  return exe;
}

absl::StatusOr<Execution> Client::Execute(const std::shared_ptr<Executable>& executable,
                                          const std::vector<ArrayRef>& inputs, const ExecuteOptions& options) {
  if (closed()) return absl::FailedPreconditionError(absl::StrCat("client '", name_, "' is closed"));
  if (!Loaded(executable.get())) {
    return absl::PermissionDeniedError(absl::StrCat("client '", name_, "' did not load that executable"));
  }
  const IslandOptions& island = island_->options();
  if (options.deadline < island.min_deadline) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "program '%s': a deadline of %s is below island '%s''s least of %s", executable->program().name(),
        absl::FormatDuration(options.deadline), island.name, absl::FormatDuration(island.min_deadline)));
  }
  Execution run;
  absl::StatusOr<std::shared_ptr<RunState>> state =
      executable->Prepare(inputs, &run.outputs, options.tag, std::min(options.deadline, island.run_deadline));
  if (!state.ok() && closed()) {
    // Closing released what the run was being prepared with: say why.
    return absl::FailedPreconditionError(absl::StrCat("client '", name_,
                                                      "' is closed (it closed while this run ",
                                                      "was being prepared: ", state.status().message(), ")"));
  }
  if (!state.ok()) return state.status();
  run.state = *std::move(state);
  {
    absl::MutexLock lock(&mu_);
    for (auto& o : run.outputs) TrackLocked(o);
  }
  island_->scheduler().Enqueue(run.state);
  return run;
}

bool Client::Loaded(const Executable* executable) const {
  // By identity, not by client id: another island's clients count from 1 too.
  if (executable == nullptr || executable->client() != id_) return false;
  absl::MutexLock lock(&mu_);
  for (const auto& w : executables_) {
    if (w.lock().get() == executable) return true;
  }
  return false;
}

absl::Status Client::Cancel(const Execution& run) {
  // Closing stopped every run of this client already.
  if (closed()) return absl::OkStatus();
  if (run.state == nullptr || !Loaded(run.state->executable().get())) {
    return absl::InvalidArgumentError(
        absl::StrCat("client '", name_, "' cannot cancel a run it did not start"));
  }
  island_->scheduler().Cancel(run.state, absl::StrCat("client '", name_, "'"));
  return absl::OkStatus();
}

void Client::TrackLocked(const ArrayRef& array) {
  // Forget arrays already gone, now and then, so the list stays as long as
  // the live arrays (amortized O(1) per array).
  if (arrays_.size() >= 2 * tracked_after_prune_ + 16) {
    arrays_.erase(std::remove_if(arrays_.begin(), arrays_.end(), [](const auto& w) { return w.expired(); }),
                  arrays_.end());
    tracked_after_prune_ = arrays_.size();
  }
  arrays_.push_back(array);
}

uint64_t Client::bytes_held() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& w : arrays_) {
    if (auto a = w.lock(); a != nullptr && !a->released()) total += a->bytes();
  }
  for (const auto& w : executables_) {
    if (auto e = w.lock()) total += e->bytes_held();
  }
  return total;
}

void Client::Close() {
  std::vector<std::weak_ptr<Array>> arrays;
  std::vector<std::weak_ptr<Executable>> executables;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    arrays.swap(arrays_);
    executables.swap(executables_);
  }
  island_->scheduler().RemoveClient(id_, absl::CancelledError(absl::StrCat("client '", name_, "' closed")));
  for (auto& w : executables) {
    if (auto e = w.lock()) e->Release();
  }
  for (auto& w : arrays) {
    if (auto a = w.lock()) a->Release();
  }
  island_->resources().ReleaseClient(id_);
}

}  // namespace causeway
