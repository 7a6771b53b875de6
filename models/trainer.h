// Trains the Transformer LM (transformer.h) on a text corpus (text_data.h)
// through a client of an island: the model's tensors and Adam moments stay
// on the accelerators as arrays, each step's outputs are the next step's
// inputs, and step t + 1 is queued before step t's loss is read, so the host
// never stands between two steps.
//
// Example:
//   ASSIGN_OR_RETURN(auto trainer, Trainer::Create(client.get(), corpus, options));
//   ASSIGN_OR_RETURN(std::vector<double> losses, trainer->Train(100, [](const StepReport& r) { ... }));
//   ASSIGN_OR_RETURN(double held_out, trainer->Evaluate());
#ifndef CAUSEWAY_MODELS_TRAINER_H_
#define CAUSEWAY_MODELS_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/text_data.h"
#include "models/transformer.h"
#include "scheduler/island.h"

namespace causeway::models {

struct TrainOptions {
  TransformerConfig config;  // vocab 0: the corpus's
  TrainLayout layout;
  // Accelerators of each stage's mesh: {1} one accelerator, {N} data
  // parallel, {1, 1, ...} a pipeline of len stages.
  std::vector<int> stages = {1};
  ops::AdamConfig adam;
  uint64_t seed = 1;       // initial weights and batches
  uint32_t eval_batches = 8;
};

struct StepReport {
  uint64_t step = 0;      // from 1
  double loss = 0;        // mean per-token cross-entropy of the step's batch
  double seconds = 0;     // since the previous step's loss was known
  double tokens = 0;      // tokens in the step's batch
};

class Trainer {
 public:
  // Allocates the meshes, builds and loads the step and evaluation programs
  // and uploads the initial weights.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(Client* client, const TextCorpus& corpus,
                                                         TrainOptions options);

  // Runs `steps` steps; `progress` (if set) hears of each as its loss is
  // known. Returns the steps' losses.
  absl::StatusOr<std::vector<double>> Train(uint64_t steps, const std::function<void(const StepReport&)>& progress = {});

  // Mean per-token loss over the held-out text's first eval_batches
  // batches (of layout.batch sequences).
  absl::StatusOr<double> Evaluate();

  // The model's tensors as they are now, in Parameters() order.
  absl::StatusOr<std::vector<std::vector<float>>> Weights() const;

  const TrainOptions& options() const { return options_; }
  const std::vector<std::shared_ptr<Mesh>>& meshes() const { return meshes_; }
  uint64_t steps_done() const { return step_; }

 private:
  Trainer(Client* client, const TextCorpus& corpus, TrainOptions options);
  absl::Status Init();
  // Queues step step_ + 1 with the next batch; its loss outputs go to `losses`.
  absl::StatusOr<std::vector<ArrayRef>> Queue();
  absl::StatusOr<double> MeanLoss(const std::vector<ArrayRef>& losses, uint64_t tokens) const;
  absl::StatusOr<ArrayRef> Tokens(const std::vector<int32_t>& tokens, const std::shared_ptr<Mesh>& mesh,
                                  uint32_t rows) const;

  Client* client_;
  const TextCorpus& corpus_;
  TrainOptions options_;
  BatchSampler sampler_;
  std::vector<std::shared_ptr<Mesh>> meshes_;
  TrainStep step_program_;
  std::shared_ptr<Executable> train_, eval_;
  std::vector<int> stage_of_;
  // The model's tensors, then Adam's m and v, in Parameters() order.
  std::vector<ArrayRef> weights_, m_, v_;
  uint64_t step_ = 0;
};

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_TRAINER_H_
