#include "models/trainer.h"

#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/memory.h"
#include "runtime/status.h"

namespace causeway::models {

Trainer::Trainer(Client* client, const TextCorpus& corpus, TrainOptions options)
    : client_(client),
      corpus_(corpus),
      options_(std::move(options)),
      sampler_(corpus.train(), options_.layout.batch, options_.config.seq_len, options_.seed) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(Client* client, const TextCorpus& corpus,
                                                         TrainOptions options) {
  if (options.config.vocab == 0) options.config.vocab = static_cast<uint32_t>(corpus.vocab().size());
  if (options.config.vocab < static_cast<uint32_t>(corpus.vocab().size())) {
    return absl::InvalidArgumentError(absl::StrCat("model: vocab ", options.config.vocab, " is smaller than the ",
                                                   corpus.vocab().size(), " characters of ", corpus.name()));
  }
  RETURN_IF_ERROR(options.config.Validate());
  if (options.stages.empty()) return absl::InvalidArgumentError("trainer: no stages");
  std::unique_ptr<Trainer> trainer(new Trainer(client, corpus, std::move(options)));
  RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

absl::Status Trainer::Init() {
  for (int size : options_.stages) {
    if (size < 1) return absl::InvalidArgumentError(absl::StrCat("trainer: a stage of ", size, " accelerators"));
    ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, client_->AllocateMesh({size}));
    meshes_.push_back(std::move(mesh));
  }
  AdamSettings settings;
  settings.adam = options_.adam;
  ASSIGN_OR_RETURN(step_program_, BuildTrainStep(options_.config, options_.layout, meshes_, settings));
  ASSIGN_OR_RETURN(train_, client_->Load(step_program_.program));
  ASSIGN_OR_RETURN(auto eval, BuildEvalProgram(options_.config, options_.layout.batch, meshes_));
  ASSIGN_OR_RETURN(eval_, client_->Load(eval));

  const std::vector<ParameterInfo> params = Parameters(options_.config);
  const std::vector<std::vector<float>> initial = InitialParameters(options_.config, options_.seed);
  for (size_t i = 0; i < params.size(); ++i) {
    const std::shared_ptr<Mesh>& mesh = meshes_[step_program_.stage_of[i]];
    const std::vector<float> zeros(initial[i].size(), 0.0f);
    for (auto [list, values, prefix] : {std::tuple{&weights_, &initial[i], ""}, std::tuple{&m_, &zeros, "m."},
                                        std::tuple{&v_, &zeros, "v."}}) {
      ASSIGN_OR_RETURN(ArrayRef array, client_->CreateArray(mesh, params[i].shape, DType::kF32,
                                                            Sharding::Replicated(), absl::StrCat(prefix, params[i].name)));
      RETURN_IF_ERROR(array->Upload(values->data(), values->size() * sizeof(float)));
      list->push_back(std::move(array));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ArrayRef> Trainer::Tokens(const std::vector<int32_t>& tokens, const std::shared_ptr<Mesh>& mesh,
                                         uint32_t rows) const {
  ASSIGN_OR_RETURN(ArrayRef array, client_->CreateArray(mesh, {rows, options_.config.seq_len}, DType::kI32,
                                                        Sharding::Split(0), "tokens"));
  RETURN_IF_ERROR(array->Upload(tokens.data(), tokens.size() * sizeof(int32_t)));
  return array;
}

absl::StatusOr<std::vector<ArrayRef>> Trainer::Queue() {
  ASSIGN_OR_RETURN(TokenBatch batch, sampler_.Next());
  const uint32_t micro = options_.layout.micro_batches;
  const uint32_t rows = batch.batch / micro;
  const uint64_t per = uint64_t{rows} * batch.seq_len;
  std::vector<ArrayRef> inputs;
  for (uint32_t m = 0; m < micro; ++m) {
    const std::vector<int32_t> ids(batch.inputs.begin() + m * per, batch.inputs.begin() + (m + 1) * per);
    const std::vector<int32_t> targets(batch.targets.begin() + m * per, batch.targets.begin() + (m + 1) * per);
    ASSIGN_OR_RETURN(ArrayRef ids_array, Tokens(ids, meshes_.front(), rows));
    ASSIGN_OR_RETURN(ArrayRef targets_array, Tokens(targets, meshes_.back(), rows));
    inputs.push_back(std::move(ids_array));
    inputs.push_back(std::move(targets_array));
  }
  const float step = static_cast<float>(step_ + 1);
  for (const std::shared_ptr<Mesh>& mesh : meshes_) {
    ASSIGN_OR_RETURN(ArrayRef array, client_->CreateArray(mesh, {1}, DType::kF32, Sharding::Replicated(), "step"));
    RETURN_IF_ERROR(array->Upload(&step, sizeof(step)));
    inputs.push_back(std::move(array));
  }
  for (const std::vector<ArrayRef>* list : {&weights_, &m_, &v_}) inputs.insert(inputs.end(), list->begin(), list->end());
  ASSIGN_OR_RETURN(Execution run, client_->Execute(train_, inputs));
  // Outputs: the losses, then the new tensors, m and v.
  const size_t count = weights_.size();
  if (run.outputs.size() != micro + 3 * count) {
    return absl::InternalError(absl::StrCat("train step: ", run.outputs.size(), " outputs, expected ",
                                            micro + 3 * count));
  }
  std::vector<ArrayRef> losses(run.outputs.begin(), run.outputs.begin() + micro);
  for (size_t i = 0; i < count; ++i) {
    weights_[i] = run.outputs[micro + i];
    m_[i] = run.outputs[micro + count + i];
    v_[i] = run.outputs[micro + 2 * count + i];
  }
  ++step_;
  return losses;
}

absl::StatusOr<double> Trainer::MeanLoss(const std::vector<ArrayRef>& losses, uint64_t tokens) const {
  double sum = 0;
  for (const ArrayRef& loss : losses) {
    // Where the host can read the accelerators' memory (lavapipe, unified
    // memory), read each shard as soon as its writes are done: a download
    // would be queued behind the step already queued after this one.
    std::vector<bool> read(loss->shard_count(), false);
    bool direct = true;
    double shard_sum = 0;
    for (int d = 0; d < loss->mesh()->size() && direct; ++d) {
      const int j = loss->ShardIndex(d);
      if (read[j]) continue;
      ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, loss->shard(d));
      if (!buffer->host_coherent() || buffer->mapped() == nullptr) {
        direct = false;
        break;
      }
      RETURN_IF_ERROR(loss->ShardReady(d).AwaitStatus());
      const float* values = static_cast<const float*>(buffer->mapped());
      for (uint64_t i = 0; i < loss->shard_bytes() / sizeof(float); ++i) shard_sum += values[i];
      read[j] = true;
    }
    if (direct) {
      sum += shard_sum;
      continue;
    }
    std::vector<float> values(NumElements(loss->shape()));
    RETURN_IF_ERROR(loss->Download(values.data(), values.size() * sizeof(float)));
    for (float v : values) sum += v;
  }
  return sum / static_cast<double>(tokens);
}

absl::StatusOr<std::vector<double>> Trainer::Train(uint64_t steps,
                                                   const std::function<void(const StepReport&)>& progress) {
  std::vector<double> out;
  if (steps == 0) return out;
  const uint64_t tokens = uint64_t{options_.layout.batch} * options_.config.seq_len;
  absl::Time last = absl::Now();
  ASSIGN_OR_RETURN(std::vector<ArrayRef> pending, Queue());
  for (uint64_t i = 0; i < steps; ++i) {
    // Queue the next step before reading this one's loss.
    std::vector<ArrayRef> next;
    if (i + 1 < steps) {
      ASSIGN_OR_RETURN(next, Queue());
    }
    ASSIGN_OR_RETURN(double loss, MeanLoss(pending, tokens));
    const absl::Time now = absl::Now();
    out.push_back(loss);
    if (progress) {
      progress(StepReport{step_ - (i + 1 < steps ? 1 : 0), loss, absl::ToDoubleSeconds(now - last),
                          static_cast<double>(tokens)});
    }
    last = now;
    pending = std::move(next);
  }
  return out;
}

absl::StatusOr<double> Trainer::Evaluate() {
  const uint32_t batch = options_.layout.batch;
  ASSIGN_OR_RETURN(std::vector<TokenBatch> batches,
                   EvaluationBatches(corpus_.held_out(), batch, options_.config.seq_len, options_.eval_batches));
  std::vector<ArrayRef> losses;
  for (const TokenBatch& b : batches) {
    std::vector<ArrayRef> inputs;
    ASSIGN_OR_RETURN(ArrayRef ids, Tokens(b.inputs, meshes_.front(), batch));
    ASSIGN_OR_RETURN(ArrayRef targets, Tokens(b.targets, meshes_.back(), batch));
    inputs.push_back(std::move(ids));
    inputs.push_back(std::move(targets));
    inputs.insert(inputs.end(), weights_.begin(), weights_.end());
    ASSIGN_OR_RETURN(Execution run, client_->Execute(eval_, inputs));
    losses.push_back(run.outputs.at(0));
  }
  return MeanLoss(losses, uint64_t{batch} * options_.config.seq_len * batches.size());
}

absl::StatusOr<std::vector<std::vector<float>>> Trainer::Weights() const {
  std::vector<std::vector<float>> out;
  for (const ArrayRef& w : weights_) {
    std::vector<float> values(NumElements(w->shape()));
    RETURN_IF_ERROR(w->Download(values.data(), values.size() * sizeof(float)));
    out.push_back(std::move(values));
  }
  return out;
}

}  // namespace causeway::models
