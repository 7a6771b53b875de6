#include "models/trainer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/accelerator.h"
#include "runtime/memory.h"
#include "runtime/status.h"

namespace causeway::models {

const PhysicalDeviceInfo* LocalBackend::device() const {
  for (const std::shared_ptr<Mesh>& mesh : meshes_) {
    if (mesh->size() > 0 && mesh->device(0) != nullptr) return &mesh->device(0)->info();
  }
  return nullptr;
}

absl::StatusOr<int> LocalBackend::AllocateMesh(int /*replica*/, int size) {
  ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, client_->AllocateMesh({size}));
  meshes_.push_back(std::move(mesh));
  return static_cast<int>(meshes_.size()) - 1;
}

absl::StatusOr<int> LocalBackend::Load(const ProgramDef& def,
                                       const absl::flat_hash_map<std::string, int>& meshes) {
  absl::flat_hash_map<std::string, std::shared_ptr<Mesh>> bound;
  for (const auto& [name, index] : meshes) bound[name] = meshes_.at(index);
  ASSIGN_OR_RETURN(std::shared_ptr<const Program> program, BuildProgram(def, bound));
  ASSIGN_OR_RETURN(std::shared_ptr<Executable> executable, client_->Load(program));
  programs_.push_back(std::move(executable));
  return static_cast<int>(programs_.size()) - 1;
}

absl::StatusOr<TrainBackend::Handle> LocalBackend::Create(int mesh, const Shape& shape, DType dtype,
                                                          const Sharding& sharding, const void* data,
                                                          uint64_t bytes) {
  ASSIGN_OR_RETURN(ArrayRef array, client_->CreateArray(meshes_.at(mesh), shape, dtype, sharding));
  RETURN_IF_ERROR(array->Upload(data, bytes));
  arrays_[next_] = std::move(array);
  return next_++;
}

absl::StatusOr<ArrayRef> LocalBackend::Get(Handle array) const {
  auto it = arrays_.find(array);
  if (it == arrays_.end()) return absl::NotFoundError(absl::StrCat("trainer: no array ", array));
  return it->second;
}

absl::StatusOr<std::vector<TrainBackend::Handle>> LocalBackend::Execute(int program,
                                                                        const std::vector<Handle>& inputs,
                                                                        absl::Duration deadline) {
  std::vector<ArrayRef> arrays;
  for (Handle h : inputs) {
    ASSIGN_OR_RETURN(ArrayRef a, Get(h));
    arrays.push_back(std::move(a));
  }
  ASSIGN_OR_RETURN(Execution run, client_->Execute(programs_.at(program), arrays, {.deadline = deadline}));
  std::vector<Handle> out;
  for (ArrayRef& a : run.outputs) {
    arrays_[next_] = std::move(a);
    out.push_back(next_++);
  }
  return out;
}

absl::StatusOr<std::vector<float>> LocalBackend::Read(Handle handle) {
  ASSIGN_OR_RETURN(ArrayRef array, Get(handle));
  std::vector<float> values(NumElements(array->shape()));
  RETURN_IF_ERROR(array->Download(values.data(), values.size() * sizeof(float)));
  return values;
}

absl::StatusOr<double> LocalBackend::Sum(Handle handle) {
  ASSIGN_OR_RETURN(ArrayRef array, Get(handle));
  // Where the host can read the accelerators' memory (lavapipe, unified
  // memory), read each shard as soon as its writes are done: a download
  // would be queued behind the step already queued after this one.
  std::vector<bool> read(array->shard_count(), false);
  double sum = 0;
  for (int d = 0; d < array->mesh()->size(); ++d) {
    const int j = array->ShardIndex(d);
    if (read[j]) continue;
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, array->shard(d));
    if (!buffer->host_coherent() || buffer->mapped() == nullptr) {
      ASSIGN_OR_RETURN(std::vector<float> values, Read(handle));
      sum = 0;
      for (float v : values) sum += v;
      return sum;
    }
    RETURN_IF_ERROR(array->ShardReady(d).AwaitStatus());
    const float* values = static_cast<const float*>(buffer->mapped());
    for (uint64_t i = 0; i < array->shard_bytes() / sizeof(float); ++i) sum += values[i];
    read[j] = true;
  }
  return sum;
}

absl::Status LocalBackend::Release(Handle array) {
  if (arrays_.erase(array) == 0) return absl::NotFoundError(absl::StrCat("trainer: no array ", array));
  return absl::OkStatus();
}

Trainer::Trainer(std::unique_ptr<TrainBackend> backend, const TextCorpus& corpus, TrainOptions options)
    : backend_(std::move(backend)),
      corpus_(corpus),
      options_(std::move(options)),
      sampler_(corpus.train(), options_.layout.batch, options_.config.seq_len, options_.seed) {}

Trainer::~Trainer() {
  for (auto* list : {&weights_, &m_, &v_}) {
    for (const std::vector<TrainBackend::Handle>& replica : *list) ReleaseAll(replica);
  }
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(Client* client, const TextCorpus& corpus,
                                                         TrainOptions options) {
  return Create(std::make_unique<LocalBackend>(client), corpus, std::move(options));
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(std::unique_ptr<TrainBackend> backend,
                                                         const TextCorpus& corpus, TrainOptions options) {
  if (options.config.vocab == 0) options.config.vocab = static_cast<uint32_t>(corpus.vocab().size());
  if (options.config.vocab < static_cast<uint32_t>(corpus.vocab().size())) {
    return absl::InvalidArgumentError(absl::StrCat("model: vocab ", options.config.vocab,
                                                   " is smaller than the ", corpus.vocab().size(),
                                                   " characters of ", corpus.name()));
  }
  RETURN_IF_ERROR(options.config.Validate());
  if (options.stages.empty()) return absl::InvalidArgumentError("trainer: no stages");
  if (options.layout.replicas == 0) return absl::InvalidArgumentError("trainer: 0 replicas");
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(backend), corpus, std::move(options)));
  RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

absl::Status Trainer::Init() {
  const uint32_t replicas = options_.layout.replicas;
  const int stages = static_cast<int>(options_.stages.size());
  for (uint32_t r = 0; r < replicas; ++r) {
    for (int size : options_.stages) {
      if (size < 1)
        return absl::InvalidArgumentError(absl::StrCat("trainer: a stage of ", size, " accelerators"));
      ASSIGN_OR_RETURN(int mesh, backend_->AllocateMesh(static_cast<int>(r), size));
      meshes_.push_back(mesh);
    }
  }
  AdamSettings settings;
  settings.adam = options_.adam;
  ASSIGN_OR_RETURN(step_program_, BuildTrainStepDef(options_.config, options_.layout, options_.stages,
                                                    settings, backend_->device()));
  absl::flat_hash_map<std::string, int> bound;
  for (size_t i = 0; i < meshes_.size(); ++i) bound[step_program_.meshes[i]] = meshes_[i];
  ASSIGN_OR_RETURN(train_, backend_->Load(step_program_.def, bound));
  ASSIGN_OR_RETURN(ProgramDef eval,
                   BuildEvalDef(options_.config, options_.layout.batch, options_.stages, backend_->device()));
  absl::flat_hash_map<std::string, int> eval_bound;
  for (int s = 0; s < stages; ++s) eval_bound[absl::StrCat("stage", s)] = meshes_[s];
  ASSIGN_OR_RETURN(eval_, backend_->Load(eval, eval_bound));

  const std::vector<ParameterInfo> params = Parameters(options_.config);
  const std::vector<std::vector<float>> initial = InitialParameters(options_.config, options_.seed);
  for (auto* list : {&weights_, &m_, &v_}) list->assign(replicas, {});
  for (uint32_t r = 0; r < replicas; ++r) {
    for (size_t i = 0; i < params.size(); ++i) {
      const int mesh = meshes_[r * stages + step_program_.stage_of[i]];
      const std::vector<float> zeros(initial[i].size(), 0.0f);
      for (auto [list, values] :
           {std::pair{&weights_, &initial[i]}, std::pair{&m_, &zeros}, std::pair{&v_, &zeros}}) {
        ASSIGN_OR_RETURN(TrainBackend::Handle array,
                         backend_->Create(mesh, params[i].shape, DType::kF32, Sharding::Replicated(),
                                          values->data(), values->size() * sizeof(float)));
        (*list)[r].push_back(array);
      }
    }
  }
  return absl::OkStatus();
}

void Trainer::ReleaseAll(const std::vector<TrainBackend::Handle>& arrays) {
  // A release that fails (a lost island) has nothing left to free.
  for (TrainBackend::Handle h : arrays) backend_->Release(h).IgnoreError();
}

absl::StatusOr<TrainBackend::Handle> Trainer::Tokens(const std::vector<int32_t>& tokens, int mesh,
                                                     uint32_t rows) {
  return backend_->Create(mesh, {rows, options_.config.seq_len}, DType::kI32, Sharding::Split(0),
                          tokens.data(), tokens.size() * sizeof(int32_t));
}

absl::StatusOr<std::vector<TrainBackend::Handle>> Trainer::Queue() {
  ASSIGN_OR_RETURN(TokenBatch batch, sampler_.Next());
  const uint32_t micro = options_.layout.micro_batches, replicas = options_.layout.replicas;
  const int stages = static_cast<int>(options_.stages.size());
  const uint32_t rows = batch.batch / replicas / micro;
  const uint64_t per = uint64_t{rows} * batch.seq_len;
  const float step = static_cast<float>(step_ + 1);
  using Kind = StepValue::Kind;
  std::vector<TrainBackend::Handle> inputs;
  std::vector<TrainBackend::Handle> fresh;  // made for this run only
  absl::Status made = [&]() -> absl::Status {
    for (const StepValue& value : step_program_.parameter_values) {
      const int mesh = meshes_[value.replica * stages + value.stage];
      TrainBackend::Handle h = 0;
      switch (value.kind) {
        case Kind::kIds:
        case Kind::kTargets: {
          // Replica r takes the batch's r-th share, micro-batch by micro-batch.
          const std::vector<int32_t>& from = value.kind == Kind::kIds ? batch.inputs : batch.targets;
          const uint64_t first = (uint64_t{static_cast<uint32_t>(value.replica)} * micro + value.micro) * per;
          const std::vector<int32_t> tokens(from.begin() + first, from.begin() + first + per);
          ASSIGN_OR_RETURN(h, Tokens(tokens, mesh, rows));
          fresh.push_back(h);
          break;
        }
        case Kind::kStep: {
          ASSIGN_OR_RETURN(
              h, backend_->Create(mesh, {1}, DType::kF32, Sharding::Replicated(), &step, sizeof(step)));
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
  absl::StatusOr<std::vector<TrainBackend::Handle>> run =
      made.ok() ? backend_->Execute(train_, inputs, options_.run_deadline)
                : absl::StatusOr<std::vector<TrainBackend::Handle>>(made);
  ReleaseAll(fresh);
  if (!run.ok()) return run.status();
  if (run->size() != step_program_.output_values.size()) {
    return absl::InternalError(
        absl::StrCat("train step: ", run->size(), " outputs, expected ", step_program_.output_values.size()));
  }
  std::vector<TrainBackend::Handle> losses, replaced;
  for (size_t o = 0; o < run->size(); ++o) {
    const StepValue& value = step_program_.output_values[o];
    const TrainBackend::Handle h = (*run)[o];
    std::vector<std::vector<TrainBackend::Handle>>* list = nullptr;
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
    replaced.push_back((*list)[value.replica][value.tensor]);
    (*list)[value.replica][value.tensor] = h;
  }
  ReleaseAll(replaced);
  ++step_;
  return losses;
}

absl::StatusOr<double> Trainer::MeanLoss(const std::vector<TrainBackend::Handle>& losses, uint64_t tokens) {
  double sum = 0;
  absl::Status status;
  for (TrainBackend::Handle loss : losses) {
    absl::StatusOr<double> s = backend_->Sum(loss);
    if (s.ok()) {
      sum += *s;
    } else if (status.ok()) {
      status = s.status();
    }
  }
  ReleaseAll(losses);
  RETURN_IF_ERROR(status);
  return sum / static_cast<double>(tokens);
}

absl::StatusOr<std::vector<double>> Trainer::Train(uint64_t steps,
                                                   const std::function<void(const StepReport&)>& progress) {
  std::vector<double> out;
  if (steps == 0) return out;
  const uint64_t tokens = uint64_t{options_.layout.batch} * options_.config.seq_len;
  absl::Time last = absl::Now();
  ASSIGN_OR_RETURN(std::vector<TrainBackend::Handle> pending, Queue());
  for (uint64_t i = 0; i < steps; ++i) {
    // Queue the next step before reading this one's loss.
    std::vector<TrainBackend::Handle> next;
    if (i + 1 < steps) {
      absl::StatusOr<std::vector<TrainBackend::Handle>> queued = Queue();
      if (!queued.ok()) {
        ReleaseAll(pending);
        return queued.status();
      }
      next = *std::move(queued);
    }
    absl::StatusOr<double> loss = MeanLoss(pending, tokens);
    if (!loss.ok()) {
      ReleaseAll(next);
      return loss.status();
    }
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
  ASSIGN_OR_RETURN(
      std::vector<TokenBatch> batches,
      EvaluationBatches(corpus_.held_out(), batch, options_.config.seq_len, options_.eval_batches));
  const int stages = static_cast<int>(options_.stages.size());
  std::vector<TrainBackend::Handle> losses;
  absl::Status status;
  for (const TokenBatch& b : batches) {
    std::vector<TrainBackend::Handle> inputs;
    absl::StatusOr<TrainBackend::Handle> ids = Tokens(b.inputs, meshes_.front(), batch);
    absl::StatusOr<TrainBackend::Handle> targets = Tokens(b.targets, meshes_[stages - 1], batch);
    for (auto* h : {&ids, &targets}) {
      if (h->ok()) inputs.push_back(**h);
    }
    if (!ids.ok() || !targets.ok()) {
      status = ids.ok() ? targets.status() : ids.status();
      ReleaseAll(inputs);
      break;
    }
    inputs.insert(inputs.end(), weights_[0].begin(), weights_[0].end());
    absl::StatusOr<std::vector<TrainBackend::Handle>> run =
        backend_->Execute(eval_, inputs, options_.run_deadline);
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
  for (TrainBackend::Handle w : weights_[replica]) {
    ASSIGN_OR_RETURN(std::vector<float> values, backend_->Read(w));
    out.push_back(std::move(values));
  }
  return out;
}

}  // namespace causeway::models
