// Trains the Transformer LM (transformer.h) on a text corpus (text_data.h):
// the model's tensors and Adam moments stay on the accelerators as arrays,
// each step's outputs are the next step's inputs, and step t + 1 is queued
// before step t's loss is read, so the host never stands between two steps.
//
// The arrays live and the steps run on the islands of a client
// (causeway/client/client.h): an island of this process (LocalClient), or island
// servers (RemoteClient), with replicas of the layout on other islands.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(auto client, client::LocalClient::Create(runtime_options));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(client.get(), corpus, options));
//   CAUSEWAY_ASSIGN_OR_RETURN(std::vector<double> losses, trainer->Train(100, [](const StepReport& r) { ...
//   })); CAUSEWAY_ASSIGN_OR_RETURN(double held_out, trainer->Evaluate());
#ifndef CAUSEWAY_MODELS_TRAINER_H_
#define CAUSEWAY_MODELS_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "causeway/client/client.h"
#include "causeway/models/checkpoint.h"
#include "causeway/models/text_data.h"
#include "causeway/models/transformer.h"
#include "causeway/scheduler/program_def.h"

namespace causeway::models {

struct TrainOptions {
  TransformerConfig config;  // vocab 0: the corpus's
  // replicas > 1: each replica on its own meshes (through a controller: on
  // island r % islands).
  TrainLayout layout;
  // Accelerators of each stage's mesh, in one replica: {1} one accelerator,
  // {N} data parallel, {1, 1, ...} a pipeline of len stages.
  std::vector<int> stages = {1};
  ops::AdamConfig adam;
  uint64_t seed = 1;  // initial weights and batches
  uint32_t eval_batches = 8;
  // How long each run (a step, an evaluation batch) may take: past it the
  // run fails with DeadlineExceeded naming its gang call, kernel and
  // accelerator, and training stops with that error (ExecuteOptions::
  // deadline). Infinite: none.
  absl::Duration run_deadline = absl::InfiniteDuration();
  // Checkpoints (checkpoint.h) into `checkpoint_dir` every
  // `checkpoint_every` steps (0: none). A checkpoint does not stall
  // training: its arrays are downloaded and written by a thread of its own
  // while the next steps run (at most one at a time). A failed write fails
  // Train at the next step it reaches, the directory's previous checkpoint
  // intact; when Train returns, its checkpoints are on disk.
  std::string checkpoint_dir;
  uint64_t checkpoint_every = 0;
  // Keeps the arrays of the last step whose loss has been read until a
  // later one's has (up to two more copies of the weights and moments on
  // each replica), so that LastCompleteState can rebuild training from any
  // surviving replica after a failed step (ElasticTrainer).
  bool keep_last_complete = false;
};

struct StepReport {
  uint64_t step = 0;   // from 1
  double loss = 0;     // mean per-token cross-entropy of the step's batch
  double seconds = 0;  // since the previous step's loss was known
  double tokens = 0;   // tokens in the step's batch
};

class Trainer {
 public:
  // Allocates the meshes on `client`'s islands (replica r's on island
  // r % islands), builds and loads the step and evaluation programs and
  // uploads the initial weights. Kernels are planned for the islands' device
  // when every island has the same kind (else for any device). Every wait
  // for a loss or a read ends by `timeout` (a lost island ends it sooner,
  // naming the island). `client` must outlive the trainer, which uses it
  // from one thread at a time.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(client::Client* client, const TextCorpus& corpus,
                                                         TrainOptions options,
                                                         absl::Duration timeout = absl::Minutes(5));
  ~Trainer();

  // Runs `steps` steps; `progress` (if set) hears of each as its loss is
  // known. Returns the steps' losses.
  absl::StatusOr<std::vector<double>> Train(uint64_t steps,
                                            const std::function<void(const StepReport&)>& progress = {});

  // Mean per-token loss over the held-out text's first eval_batches
  // batches (of layout.batch sequences), on replica 0.
  absl::StatusOr<double> Evaluate();

  // The model's tensors as they are now, in Parameters() order, from
  // `replica` (every replica holds the same values).
  absl::StatusOr<std::vector<std::vector<float>>> Weights(int replica = 0) const;

  // Continues from `state` (checkpoint.h): its weights, Adam moments,
  // step and data position replace the trainer's on every replica, in this
  // trainer's layout, whatever layout wrote it. The same layout then trains
  // bit for bit as the run that wrote it would have. InvalidArgument naming
  // the difference if it is of another model (config) or corpus
  // (vocabulary). The trainer's own options (Adam, batch) stay.
  absl::Status Restore(const CheckpointState& state);

  // The state after the steps queued so far (waits for them), from
  // replica 0.
  absl::StatusOr<CheckpointState> Snapshot();

  // The state after the last step whose loss Train has read (its steps
  // queued since, failed or not, left out), from the first replica that can
  // still give it. FailedPrecondition without keep_last_complete while a
  // later step is queued.
  absl::StatusOr<CheckpointState> LastCompleteState();

  // Writes Snapshot() into options().checkpoint_dir now, after any
  // checkpoint in flight.
  absl::Status SaveCheckpoint();

  const TrainOptions& options() const { return options_; }
  uint64_t steps_done() const { return step_; }
  // The step of the newest checkpoint this trainer has written (0: none).
  uint64_t checkpointed_step() const { return checkpointed_step_; }

 private:
  // The client's arrays by handle, with the run that writes each (trainer.cc).
  class Arrays;
  // A checkpoint being downloaded and written (trainer.cc).
  struct InFlight;
  using Handle = uint64_t;

  Trainer(std::unique_ptr<Arrays> arrays, const TextCorpus& corpus, TrainOptions options);
  absl::Status Init();
  // Uploads weights, m and v (Parameters() order) to every replica,
  // replacing (releasing) what it held.
  absl::Status Upload(const std::vector<std::vector<float>>& weights,
                      const std::vector<std::vector<float>>& m, const std::vector<std::vector<float>>& v);
  // Queue(), then a checkpoint if the step is one to keep.
  absl::StatusOr<std::vector<Handle>> QueueStep();
  // Starts a checkpoint of the current arrays on a thread of its own.
  absl::Status BeginCheckpoint();
  // The checkpoint in flight's result once it is done (`wait`: waits for
  // it); OK when none is in flight or it is not done.
  absl::Status CollectCheckpoint(bool wait);
  // The state's metadata as of now (tensors empty).
  CheckpointState Metadata() const;
  // Queues step step_ + 1 with the next batch; returns its loss outputs.
  absl::StatusOr<std::vector<Handle>> Queue();
  absl::StatusOr<double> MeanLoss(const std::vector<Handle>& losses, uint64_t tokens);
  absl::StatusOr<Handle> Tokens(const std::vector<int32_t>& tokens, int mesh, uint32_t rows);
  void ReleaseAll(const std::vector<Handle>& arrays);

  std::unique_ptr<Arrays> arrays_;
  const TextCorpus& corpus_;
  TrainOptions options_;
  BatchSampler sampler_;
  // Replica by replica, stage by stage.
  std::vector<int> meshes_;
  TrainStep step_program_;
  int train_ = -1, eval_ = -1;
  // [replica][tensor]: the model's tensors, then Adam's m and v, in
  // Parameters() order.
  std::vector<std::vector<Handle>> weights_, m_, v_;
  uint64_t step_ = 0;
  // keep_last_complete: the arrays after each step not yet superseded by a
  // step whose loss has been read, oldest first; `complete_` is the last
  // step whose loss has been read.
  struct Kept {
    uint64_t step = 0;
    uint64_t data_state = 0;
    std::vector<std::vector<Handle>> weights, m, v;
  };
  std::vector<Kept> kept_;
  uint64_t complete_ = 0;
  void StepComplete(uint64_t step);
  void ReleaseKept(const Kept& kept);
  std::unique_ptr<InFlight> checkpoint_;
  uint64_t checkpointed_step_ = 0;
};

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_TRAINER_H_
