#include "causeway/models/trainer.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "causeway/base/status.h"

namespace causeway::models {

// What the trainer holds on the client: meshes, programs and arrays by
// index or handle, and for each array the run that writes it (its failure
// is the array's).
class Trainer::Arrays {
 public:
  Arrays(client::Client* client, absl::Duration timeout) : client_(client), timeout_(timeout) {}

  // Plans for the first island's device, unless devices differ in what
  // plans read (kind, subgroup size, limits).
  absl::Status Init() {
    if (client_ == nullptr || client_->island_count() == 0) {
      return absl::InvalidArgumentError("trainer: a client with at least one island is needed");
    }
    CAUSEWAY_ASSIGN_OR_RETURN(std::vector<client::Device> devices, client_->Devices());
    for (const client::Device& d : devices) {
      DeviceCapabilities c = d.capabilities;
      if (!device_) {
        device_ = std::move(c);
        continue;
      }
      c.name = device_->name;  // the same device under another driver name plans alike
      if (c != *device_) {
        device_.reset();  // plan what runs on every island
        break;
      }
    }
    return absl::OkStatus();
  }
  const DeviceCapabilities* device() const { return device_ ? &*device_ : nullptr; }

  absl::StatusOr<int> AllocateMesh(int replica, int size) {
    CAUSEWAY_ASSIGN_OR_RETURN(client::Mesh mesh,
                              client_->AllocateMesh(replica % client_->island_count(), {size}));
    meshes_.push_back(std::move(mesh));
    return static_cast<int>(meshes_.size()) - 1;
  }

  absl::StatusOr<int> Load(const ProgramDef& def, const absl::flat_hash_map<std::string, int>& meshes) {
    absl::flat_hash_map<std::string, client::Mesh> bound;
    for (const auto& [name, index] : meshes) bound[name] = meshes_.at(index);
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<client::LoadedProgram> program, client_->Load(def, bound));
    programs_.push_back(std::move(program));
    return static_cast<int>(programs_.size()) - 1;
  }

  // A new array holding `bytes` (row-major, the whole array).
  absl::StatusOr<Handle> Create(int mesh, const Shape& shape, DType dtype, const Sharding& sharding,
                                const void* data, uint64_t bytes) {
    CAUSEWAY_ASSIGN_OR_RETURN(client::Array array,
                              client_->CreateArray(meshes_.at(mesh), shape, dtype, sharding));
    if (absl::Status s = client_->Upload(array, data, bytes); !s.ok()) {
      client_->Release(array).IgnoreError();
      return s;
    }
    arrays_[next_] = {std::move(array), std::nullopt};
    return next_++;
  }

  // Queues a run, which fails past `deadline` from now (infinite: never);
  // returns its outputs at once (in the def's order).
  absl::StatusOr<std::vector<Handle>> Execute(int program, const std::vector<Handle>& inputs,
                                              absl::Duration deadline) {
    std::vector<client::Array> arrays;
    for (Handle h : inputs) {
      CAUSEWAY_ASSIGN_OR_RETURN(Stored s, Get(h));
      arrays.push_back(std::move(s.array));
    }
    client::ExecuteOptions options;
    options.deadline = deadline;
    CAUSEWAY_ASSIGN_OR_RETURN(client::Run run, client_->Execute(programs_.at(program), arrays, options));
    std::vector<Handle> out;
    for (client::Array& a : run.outputs) {
      arrays_[next_] = {std::move(a), run.done};
      out.push_back(next_++);
    }
    return out;
  }

  // The f32 array's values, once written.
  absl::StatusOr<std::vector<float>> Read(Handle handle) const {
    CAUSEWAY_ASSIGN_OR_RETURN(Stored s, Get(handle));
    const absl::Time deadline = absl::Now() + timeout_;
    if (s.written) CAUSEWAY_RETURN_IF_ERROR(s.written->AwaitStatus(deadline));
    std::vector<float> values(NumElements(s.array.shape));
    CAUSEWAY_RETURN_IF_ERROR(
        client_->Download(s.array, values.data(), values.size() * sizeof(float), deadline));
    return values;
  }

  absl::StatusOr<double> Sum(Handle handle) const {
    CAUSEWAY_ASSIGN_OR_RETURN(std::vector<float> values, Read(handle));
    double sum = 0;
    for (float v : values) sum += v;
    return sum;
  }

  // The array and the run that writes it, kept until Unpin (Release waits
  // for it), for another thread to download through client().
  absl::StatusOr<std::pair<client::Array, std::optional<Future<>>>> Pin(Handle handle) {
    CAUSEWAY_ASSIGN_OR_RETURN(Stored s, Get(handle));
    ++pins_[handle];
    return std::pair{std::move(s.array), std::move(s.written)};
  }
  void Unpin(Handle handle) {
    auto it = pins_.find(handle);
    if (it == pins_.end() || --it->second > 0) return;
    pins_.erase(it);
    if (released_.erase(handle) > 0) Release(handle).IgnoreError();
  }
  client::Client* client() const { return client_; }
  absl::Duration timeout() const { return timeout_; }

  // Drops the array (runs queued before still read it); a pinned one once
  // it is unpinned.
  absl::Status Release(Handle handle) {
    auto it = arrays_.find(handle);
    if (it == arrays_.end() || released_.contains(handle)) {
      return absl::NotFoundError(absl::StrCat("trainer: no array ", handle));
    }
    if (pins_.contains(handle)) {
      released_.insert(handle);
      return absl::OkStatus();
    }
    const client::Array array = it->second.array;
    arrays_.erase(it);
    return client_->Release(array);
  }

 private:
  struct Stored {
    client::Array array;
    std::optional<Future<>> written;  // none for an uploaded array
  };
  absl::StatusOr<Stored> Get(Handle handle) const {
    auto it = arrays_.find(handle);
    if (it == arrays_.end()) return absl::NotFoundError(absl::StrCat("trainer: no array ", handle));
    return it->second;
  }

  client::Client* client_;
  const absl::Duration timeout_;
  // Arrays a checkpoint still reads, by count, and those of them released
  // meanwhile.
  absl::flat_hash_map<Handle, int> pins_;
  absl::flat_hash_set<Handle> released_;
  std::optional<DeviceCapabilities> device_;
  std::vector<client::Mesh> meshes_;
  std::vector<std::shared_ptr<client::LoadedProgram>> programs_;
  absl::flat_hash_map<Handle, Stored> arrays_;
  Handle next_ = 1;
};

Trainer::Trainer(std::unique_ptr<Arrays> arrays, const TextCorpus& corpus, TrainOptions options)
    : arrays_(std::move(arrays)),
      corpus_(corpus),
      options_(std::move(options)),
      sampler_(corpus.train(), options_.layout.batch, options_.config.seq_len, options_.seed) {}

// A checkpoint's arrays (pinned until it is done), downloaded and written
// by `thread`, which sets `status` and then `done`.
struct Trainer::InFlight {
  uint64_t step = 0;
  std::vector<Handle> pinned;
  std::thread thread;
  absl::Status status;
  std::atomic<bool> done{false};
};

namespace {

using PinnedArray = std::pair<client::Array, std::optional<Future<>>>;

// Fills `state`'s weights, m and v from `arrays` (weights, then m, then v,
// each in Parameters() order), each once its run is done.
absl::Status DownloadTensors(client::Client* client, absl::Duration timeout,
                             const std::vector<PinnedArray>& arrays, CheckpointState& state) {
  const absl::Time deadline = absl::Now() + timeout;
  const size_t per = arrays.size() / 3;
  for (size_t i = 0; i < arrays.size(); ++i) {
    const auto& [array, written] = arrays[i];
    if (written) CAUSEWAY_RETURN_IF_ERROR(written->AwaitStatus(deadline));
    std::vector<float> values(NumElements(array.shape));
    CAUSEWAY_RETURN_IF_ERROR(client->Download(array, values.data(), values.size() * sizeof(float), deadline));
    (i < per ? state.weights : i < 2 * per ? state.m : state.v).push_back(std::move(values));
  }
  return absl::OkStatus();
}

}  // namespace

Trainer::~Trainer() {
  CollectCheckpoint(/*wait=*/true).IgnoreError();
  for (const Kept& kept : kept_) ReleaseKept(kept);
  for (auto* list : {&weights_, &m_, &v_}) {
    for (const std::vector<Handle>& replica : *list) ReleaseAll(replica);
  }
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(client::Client* client, const TextCorpus& corpus,
                                                         TrainOptions options, absl::Duration timeout) {
  if (options.config.vocab == 0) options.config.vocab = static_cast<uint32_t>(corpus.vocab().size());
  if (options.config.vocab < static_cast<uint32_t>(corpus.vocab().size())) {
    return absl::InvalidArgumentError(absl::StrCat("model: vocab ", options.config.vocab,
                                                   " is smaller than the ", corpus.vocab().size(),
                                                   " characters of ", corpus.name()));
  }
  CAUSEWAY_RETURN_IF_ERROR(options.config.Validate());
  if (options.stages.empty()) return absl::InvalidArgumentError("trainer: no stages");
  if (options.layout.replicas == 0) return absl::InvalidArgumentError("trainer: 0 replicas");
  auto arrays = std::make_unique<Arrays>(client, timeout);
  CAUSEWAY_RETURN_IF_ERROR(arrays->Init());
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(arrays), corpus, std::move(options)));
  CAUSEWAY_RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

absl::Status Trainer::Init() {
  const uint32_t replicas = options_.layout.replicas;
  const int stages = static_cast<int>(options_.stages.size());
  for (uint32_t r = 0; r < replicas; ++r) {
    for (int size : options_.stages) {
      if (size < 1)
        return absl::InvalidArgumentError(absl::StrCat("trainer: a stage of ", size, " accelerators"));
      CAUSEWAY_ASSIGN_OR_RETURN(int mesh, arrays_->AllocateMesh(static_cast<int>(r), size));
      meshes_.push_back(mesh);
    }
  }
  AdamSettings settings;
  settings.adam = options_.adam;
  CAUSEWAY_ASSIGN_OR_RETURN(step_program_, BuildTrainStepDef(options_.config, options_.layout,
                                                             options_.stages, settings, arrays_->device()));
  absl::flat_hash_map<std::string, int> bound;
  for (size_t i = 0; i < meshes_.size(); ++i) bound[step_program_.meshes[i]] = meshes_[i];
  CAUSEWAY_ASSIGN_OR_RETURN(train_, arrays_->Load(step_program_.def, bound));
  CAUSEWAY_ASSIGN_OR_RETURN(ProgramDef eval, BuildEvalDef(options_.config, options_.layout.batch,
                                                          options_.stages, arrays_->device()));
  absl::flat_hash_map<std::string, int> eval_bound;
  for (int s = 0; s < stages; ++s) eval_bound[absl::StrCat("stage", s)] = meshes_[s];
  CAUSEWAY_ASSIGN_OR_RETURN(eval_, arrays_->Load(eval, eval_bound));

  const std::vector<std::vector<float>> initial = InitialParameters(options_.config, options_.seed);
  std::vector<std::vector<float>> zeros;
  for (const std::vector<float>& t : initial) zeros.emplace_back(t.size(), 0.0f);
  return Upload(initial, zeros, zeros);
}

absl::Status Trainer::Upload(const std::vector<std::vector<float>>& weights,
                             const std::vector<std::vector<float>>& m,
                             const std::vector<std::vector<float>>& v) {
  const uint32_t replicas = options_.layout.replicas;
  const int stages = static_cast<int>(options_.stages.size());
  const std::vector<ParameterInfo> params = Parameters(options_.config);
  for (auto* list : {&weights_, &m_, &v_}) {
    for (const std::vector<Handle>& replica : *list) ReleaseAll(replica);
    list->assign(replicas, {});
  }
  for (uint32_t r = 0; r < replicas; ++r) {
    for (size_t i = 0; i < params.size(); ++i) {
      const int mesh = meshes_[r * stages + step_program_.stage_of[i]];
      for (auto [list, values] :
           {std::pair{&weights_, &weights[i]}, std::pair{&m_, &m[i]}, std::pair{&v_, &v[i]}}) {
        CAUSEWAY_ASSIGN_OR_RETURN(Handle array,
                                  arrays_->Create(mesh, params[i].shape, DType::kF32, Sharding::Replicated(),
                                                  values->data(), values->size() * sizeof(float)));
        (*list)[r].push_back(array);
      }
    }
  }
  return absl::OkStatus();
}

CheckpointState Trainer::Metadata() const {
  CheckpointState s;
  s.config = options_.config;
  s.vocabulary = corpus_.vocab().chars();
  s.adam = options_.adam;
  s.seed = options_.seed;
  s.step = step_;
  s.data_state = sampler_.state();
  s.batch = options_.layout.batch;
  const TrainLayout& l = options_.layout;
  s.layout = absl::StrCat(l.replicas, l.replicas == 1 ? " replica" : " replicas", " of stages {",
                          absl::StrJoin(options_.stages, ", "), "}, ", l.micro_batches,
                          l.micro_batches == 1 ? " micro-batch" : " micro-batches");
  return s;
}

absl::Status Trainer::Restore(const CheckpointState& state) {
  const TransformerConfig &want = options_.config, &got = state.config;
  if (got.vocab != want.vocab || got.d_model != want.d_model || got.heads != want.heads ||
      got.d_ff != want.d_ff || got.layers != want.layers || got.seq_len != want.seq_len ||
      got.ln_eps != want.ln_eps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint of step ", state.step, " is of another model: vocab ", got.vocab, ", d_model ",
        got.d_model, ", heads ", got.heads, ", d_ff ", got.d_ff, ", layers ", got.layers, ", seq_len ",
        got.seq_len, "; this trainer's: vocab ", want.vocab, ", d_model ", want.d_model, ", heads ",
        want.heads, ", d_ff ", want.d_ff, ", layers ", want.layers, ", seq_len ", want.seq_len));
  }
  if (state.vocabulary != corpus_.vocab().chars()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint of step ", state.step,
                                                   " was trained on another corpus: ", "its vocabulary of ",
                                                   state.vocabulary.size(), " characters differs from the ",
                                                   corpus_.vocab().size(), " of ", corpus_.name()));
  }
  CAUSEWAY_RETURN_IF_ERROR(state.CheckTensors());
  CAUSEWAY_RETURN_IF_ERROR(CollectCheckpoint(/*wait=*/true));
  for (const Kept& kept : kept_) ReleaseKept(kept);
  kept_.clear();
  CAUSEWAY_RETURN_IF_ERROR(Upload(state.weights, state.m, state.v));
  step_ = complete_ = state.step;
  sampler_.set_state(state.data_state);
  return absl::OkStatus();
}

void Trainer::ReleaseKept(const Kept& kept) {
  for (auto* list : {&kept.weights, &kept.m, &kept.v}) {
    for (const std::vector<Handle>& replica : *list) ReleaseAll(replica);
  }
}

void Trainer::StepComplete(uint64_t step) {
  complete_ = step;
  // States before the complete step's are no longer needed.
  auto it = kept_.begin();
  for (; it != kept_.end() && it->step < step; ++it) ReleaseKept(*it);
  kept_.erase(kept_.begin(), it);
}

absl::StatusOr<CheckpointState> Trainer::LastCompleteState() {
  CheckpointState s = Metadata();
  s.step = complete_;
  const std::vector<std::vector<Handle>>*weights = &weights_, *m = &m_, *v = &v_;
  if (complete_ != step_) {
    auto it = std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) { return k.step == complete_; });
    if (it == kept_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("trainer: the arrays after step ", complete_,
                                                        " are gone (keep_last_complete is off)"));
    }
    s.data_state = it->data_state;
    weights = &it->weights, m = &it->m, v = &it->v;
  }
  absl::Status last;
  for (size_t r = 0; r < weights->size(); ++r) {
    std::vector<PinnedArray> arrays;
    absl::Status got;
    for (const auto* list : {weights, m, v}) {
      for (Handle h : (*list)[r]) {
        absl::StatusOr<PinnedArray> a = arrays_->Pin(h);
        if (!a.ok()) {
          got = a.status();
          break;
        }
        arrays_->Unpin(h);
        arrays.push_back(*std::move(a));
      }
    }
    CheckpointState from = s;
    if (got.ok()) got = DownloadTensors(arrays_->client(), arrays_->timeout(), arrays, from);
    if (got.ok()) return from;
    last = absl::Status(got.code(), absl::StrCat("replica ", r, ": ", got.message()));
  }
  return absl::Status(last.code(), absl::StrCat("no replica holds step ", complete_,
                                                " any more; the last: ", last.message()));
}

absl::StatusOr<CheckpointState> Trainer::Snapshot() {
  CheckpointState s = Metadata();
  std::vector<PinnedArray> arrays;
  for (auto* list : {&weights_, &m_, &v_}) {
    for (Handle h : (*list)[0]) {
      CAUSEWAY_ASSIGN_OR_RETURN(PinnedArray a, arrays_->Pin(h));
      arrays_->Unpin(h);  // read here, before anything can release it
      arrays.push_back(std::move(a));
    }
  }
  CAUSEWAY_RETURN_IF_ERROR(DownloadTensors(arrays_->client(), arrays_->timeout(), arrays, s));
  return s;
}

absl::Status Trainer::SaveCheckpoint() {
  if (options_.checkpoint_dir.empty())
    return absl::FailedPreconditionError("trainer: no checkpoint directory");
  CAUSEWAY_RETURN_IF_ERROR(CollectCheckpoint(/*wait=*/true));
  CAUSEWAY_ASSIGN_OR_RETURN(CheckpointState s, Snapshot());
  CAUSEWAY_RETURN_IF_ERROR(WriteCheckpoint(options_.checkpoint_dir, s));
  checkpointed_step_ = s.step;
  return absl::OkStatus();
}

absl::Status Trainer::BeginCheckpoint() {
  CAUSEWAY_RETURN_IF_ERROR(CollectCheckpoint(/*wait=*/true));
  auto flight = std::make_unique<InFlight>();
  flight->step = step_;
  std::vector<PinnedArray> arrays;
  for (auto* list : {&weights_, &m_, &v_}) {
    for (Handle h : (*list)[0]) {
      absl::StatusOr<PinnedArray> a = arrays_->Pin(h);
      if (!a.ok()) {
        for (Handle p : flight->pinned) arrays_->Unpin(p);
        return a.status();
      }
      flight->pinned.push_back(h);
      arrays.push_back(*std::move(a));
    }
  }
  InFlight* f = flight.get();
  flight->thread =
      std::thread([f, client = arrays_->client(), timeout = arrays_->timeout(), dir = options_.checkpoint_dir,
                   state = Metadata(), arrays = std::move(arrays)]() mutable {
        absl::Status s = DownloadTensors(client, timeout, arrays, state);
        if (s.ok()) s = WriteCheckpoint(dir, state);
        f->status = std::move(s);
        f->done.store(true, std::memory_order_release);
      });
  checkpoint_ = std::move(flight);
  return absl::OkStatus();
}

absl::Status Trainer::CollectCheckpoint(bool wait) {
  if (checkpoint_ == nullptr) return absl::OkStatus();
  if (!wait && !checkpoint_->done.load(std::memory_order_acquire)) return absl::OkStatus();
  checkpoint_->thread.join();
  for (Handle h : checkpoint_->pinned) arrays_->Unpin(h);
  const uint64_t step = checkpoint_->step;
  const absl::Status status = std::move(checkpoint_->status);
  checkpoint_.reset();
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("checkpoint of step ", step, " not written: ", status.message(),
                                     checkpointed_step_ > 0 ? absl::StrCat(" (the checkpoint of step ",
                                                                           checkpointed_step_, " is intact)")
                                                            : ""));
  }
  checkpointed_step_ = step;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Trainer::Handle>> Trainer::QueueStep() {
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<Handle> losses, Queue());
  if (options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0 &&
      !options_.checkpoint_dir.empty()) {
    if (absl::Status s = BeginCheckpoint(); !s.ok()) {
      ReleaseAll(losses);
      return s;
    }
  }
  return losses;
}

void Trainer::ReleaseAll(const std::vector<Handle>& arrays) {
  // A release that fails (a lost island) has nothing left to free.
  for (Handle h : arrays) arrays_->Release(h).IgnoreError();
}

absl::StatusOr<Trainer::Handle> Trainer::Tokens(const std::vector<int32_t>& tokens, int mesh, uint32_t rows) {
  return arrays_->Create(mesh, {rows, options_.config.seq_len}, DType::kI32, Sharding::Split(0),
                         tokens.data(), tokens.size() * sizeof(int32_t));
}

absl::StatusOr<std::vector<Trainer::Handle>> Trainer::Queue() {
  const uint64_t data_state = sampler_.state();
  CAUSEWAY_ASSIGN_OR_RETURN(TokenBatch batch, sampler_.Next());
  const uint32_t micro = options_.layout.micro_batches, replicas = options_.layout.replicas;
  const int stages = static_cast<int>(options_.stages.size());
  const uint32_t rows = batch.batch / replicas / micro;
  const uint64_t per = uint64_t{rows} * batch.seq_len;
  const float step = static_cast<float>(step_ + 1);
  using Kind = StepValue::Kind;
  std::vector<Handle> inputs;
  std::vector<Handle> fresh;  // made for this run only
  absl::Status made = [&]() -> absl::Status {
    for (const StepValue& value : step_program_.parameter_values) {
      const int mesh = meshes_[value.replica * stages + value.stage];
      Handle h = 0;
      switch (value.kind) {
        case Kind::kIds:
        case Kind::kTargets: {
          // Replica r takes the batch's r-th share, micro-batch by micro-batch.
          const std::vector<int32_t>& from = value.kind == Kind::kIds ? batch.inputs : batch.targets;
          const uint64_t first = (uint64_t{static_cast<uint32_t>(value.replica)} * micro + value.micro) * per;
          const std::vector<int32_t> tokens(from.begin() + first, from.begin() + first + per);
          CAUSEWAY_ASSIGN_OR_RETURN(h, Tokens(tokens, mesh, rows));
          fresh.push_back(h);
          break;
        }
        case Kind::kStep: {
          CAUSEWAY_ASSIGN_OR_RETURN(
              h, arrays_->Create(mesh, {1}, DType::kF32, Sharding::Replicated(), &step, sizeof(step)));
          fresh.push_back(h);
          break;
        }
        case Kind::kTensor:
          h = weights_[value.replica][value.tensor];
          break;
        case Kind::kM:
          h = m_[value.replica][value.tensor];
          break;
        case Kind::kV:
          h = v_[value.replica][value.tensor];
          break;
        default:
          return absl::InternalError("train step: an output among the parameters");
      }
      inputs.push_back(h);
    }
    return absl::OkStatus();
  }();
  absl::StatusOr<std::vector<Handle>> run = made.ok()
                                                ? arrays_->Execute(train_, inputs, options_.run_deadline)
                                                : absl::StatusOr<std::vector<Handle>>(made);
  ReleaseAll(fresh);
  if (!run.ok()) return run.status();
  if (run->size() != step_program_.output_values.size()) {
    return absl::InternalError(
        absl::StrCat("train step: ", run->size(), " outputs, expected ", step_program_.output_values.size()));
  }
  std::vector<Handle> losses, replaced;
  if (options_.keep_last_complete) {
    // The arrays after step_, kept until a later step is complete.
    kept_.push_back(Kept{step_, data_state, weights_, m_, v_});
  }
  for (size_t o = 0; o < run->size(); ++o) {
    const StepValue& value = step_program_.output_values[o];
    const Handle h = (*run)[o];
    std::vector<std::vector<Handle>>* list = nullptr;
    switch (value.kind) {
      case Kind::kLoss:
        losses.push_back(h);
        continue;
      case Kind::kTensor:
        list = &weights_;
        break;
      case Kind::kM:
        list = &m_;
        break;
      case Kind::kV:
        list = &v_;
        break;
      default:
        replaced.push_back(h);  // nothing a trainer keeps
        continue;
    }
    if (!options_.keep_last_complete) replaced.push_back((*list)[value.replica][value.tensor]);
    (*list)[value.replica][value.tensor] = h;
  }
  ReleaseAll(replaced);
  ++step_;
  return losses;
}

absl::StatusOr<double> Trainer::MeanLoss(const std::vector<Handle>& losses, uint64_t tokens) {
  double sum = 0;
  absl::Status status;
  for (Handle loss : losses) {
    absl::StatusOr<double> s = arrays_->Sum(loss);
    if (s.ok()) {
      sum += *s;
    } else if (status.ok()) {
      status = s.status();
    }
  }
  ReleaseAll(losses);
  CAUSEWAY_RETURN_IF_ERROR(status);
  return sum / static_cast<double>(tokens);
}

absl::StatusOr<std::vector<double>> Trainer::Train(uint64_t steps,
                                                   const std::function<void(const StepReport&)>& progress) {
  std::vector<double> out;
  if (steps == 0) return out;
  const uint64_t tokens = uint64_t{options_.layout.batch} * options_.config.seq_len;
  absl::Time last = absl::Now();
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<Handle> pending, QueueStep());
  for (uint64_t i = 0; i < steps; ++i) {
    // Queue the next step before reading this one's loss.
    std::vector<Handle> next;
    if (i + 1 < steps) {
      absl::StatusOr<std::vector<Handle>> queued = QueueStep();
      if (!queued.ok()) {
        ReleaseAll(pending);
        return queued.status();
      }
      next = *std::move(queued);
    }
    absl::StatusOr<double> loss = MeanLoss(pending, tokens);
    absl::Status written = loss.ok() ? CollectCheckpoint(/*wait=*/i + 1 == steps) : absl::OkStatus();
    if (!loss.ok() || !written.ok()) {
      ReleaseAll(next);
      return loss.ok() ? written : loss.status();
    }
    StepComplete(step_ - (i + 1 < steps ? 1 : 0));
    const absl::Time now = absl::Now();
    out.push_back(*loss);
    if (progress) {
      progress(StepReport{step_ - (i + 1 < steps ? 1 : 0), *loss, absl::ToDoubleSeconds(now - last),
                          static_cast<double>(tokens)});
    }
    last = now;
    pending = std::move(next);
  }
  return out;
}

absl::StatusOr<double> Trainer::Evaluate() {
  const uint32_t batch = options_.layout.batch;
  CAUSEWAY_ASSIGN_OR_RETURN(
      std::vector<TokenBatch> batches,
      EvaluationBatches(corpus_.held_out(), batch, options_.config.seq_len, options_.eval_batches));
  const int stages = static_cast<int>(options_.stages.size());
  std::vector<Handle> losses;
  absl::Status status;
  for (const TokenBatch& b : batches) {
    std::vector<Handle> inputs;
    absl::StatusOr<Handle> ids = Tokens(b.inputs, meshes_.front(), batch);
    absl::StatusOr<Handle> targets = Tokens(b.targets, meshes_[stages - 1], batch);
    for (auto* h : {&ids, &targets}) {
      if (h->ok()) inputs.push_back(**h);
    }
    if (!ids.ok() || !targets.ok()) {
      status = ids.ok() ? targets.status() : ids.status();
      ReleaseAll(inputs);
      break;
    }
    inputs.insert(inputs.end(), weights_[0].begin(), weights_[0].end());
    absl::StatusOr<std::vector<Handle>> run = arrays_->Execute(eval_, inputs, options_.run_deadline);
    ReleaseAll({*ids, *targets});
    if (!run.ok()) {
      status = run.status();
      break;
    }
    losses.push_back(run->at(0));
  }
  if (!status.ok()) {
    ReleaseAll(losses);
    return status;
  }
  return MeanLoss(losses, uint64_t{batch} * options_.config.seq_len * batches.size());
}

absl::StatusOr<std::vector<std::vector<float>>> Trainer::Weights(int replica) const {
  if (replica < 0 || static_cast<size_t>(replica) >= weights_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: no replica ", replica, " of ", weights_.size()));
  }
  std::vector<std::vector<float>> out;
  for (Handle w : weights_[replica]) {
    CAUSEWAY_ASSIGN_OR_RETURN(std::vector<float> values, arrays_->Read(w));
    out.push_back(std::move(values));
  }
  return out;
}

}  // namespace causeway::models
