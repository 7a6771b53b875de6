// Trains the Transformer LM (transformer.h) on a text corpus (text_data.h):
// the model's tensors and Adam moments stay on the accelerators as arrays,
// each step's outputs are the next step's inputs, and step t + 1 is queued
// before step t's loss is read, so the host never stands between two steps.
//
// Where the arrays live and the steps run is a TrainBackend: one island's
// client (LocalBackend, below), or island servers through a controller
// (models/remote_backend.h), with replicas of the layout on other islands.
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
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "models/text_data.h"
#include "models/transformer.h"
#include "scheduler/island.h"
#include "scheduler/program_def.h"

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
};

struct StepReport {
  uint64_t step = 0;   // from 1
  double loss = 0;     // mean per-token cross-entropy of the step's batch
  double seconds = 0;  // since the previous step's loss was known
  double tokens = 0;   // tokens in the step's batch
};

// Where a trainer's arrays live and its programs run. Arrays, meshes and
// programs are named by handles the backend gives out. Used from one thread
// (the trainer's).
class TrainBackend {
 public:
  using Handle = uint64_t;
  virtual ~TrainBackend() = default;

  // The device kernels are planned for (null: paths that run on any).
  virtual const PhysicalDeviceInfo* device() const = 0;
  // A mesh of `size` accelerators for replica `replica`.
  virtual absl::StatusOr<int> AllocateMesh(int replica, int size) = 0;
  // Loads `def`, binding each of its mesh names to a mesh of AllocateMesh.
  virtual absl::StatusOr<int> Load(const ProgramDef& def,
                                   const absl::flat_hash_map<std::string, int>& meshes) = 0;
  // A new array holding `bytes` (row-major, the whole array).
  virtual absl::StatusOr<Handle> Create(int mesh, const Shape& shape, DType dtype, const Sharding& sharding,
                                        const void* data, uint64_t bytes) = 0;
  // Queues a run, which fails past `deadline` from now (infinite: never);
  // returns its outputs at once (in the def's order).
  virtual absl::StatusOr<std::vector<Handle>> Execute(int program, const std::vector<Handle>& inputs,
                                                      absl::Duration deadline) = 0;
  // The f32 array's values, once written.
  virtual absl::StatusOr<std::vector<float>> Read(Handle array) = 0;
  // The sum of the f32 array's values, once written; may read them sooner
  // than Read (behind runs queued later).
  virtual absl::StatusOr<double> Sum(Handle array) = 0;
  // Drops the array (runs queued before still read it).
  virtual absl::Status Release(Handle array) = 0;
};

// A backend on one island's client: every replica's meshes on that island.
class LocalBackend : public TrainBackend {
 public:
  explicit LocalBackend(Client* client) : client_(client) {}

  const PhysicalDeviceInfo* device() const override;
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

 private:
  absl::StatusOr<ArrayRef> Get(Handle array) const;

  Client* client_;
  std::vector<std::shared_ptr<Mesh>> meshes_;
  std::vector<std::shared_ptr<Executable>> programs_;
  absl::flat_hash_map<Handle, ArrayRef> arrays_;
  Handle next_ = 1;
};

class Trainer {
 public:
  // Allocates the meshes, builds and loads the step and evaluation programs
  // and uploads the initial weights.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(std::unique_ptr<TrainBackend> backend,
                                                         const TextCorpus& corpus, TrainOptions options);
  // On one island's client.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(Client* client, const TextCorpus& corpus,
                                                         TrainOptions options);
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

  const TrainOptions& options() const { return options_; }
  uint64_t steps_done() const { return step_; }

 private:
  Trainer(std::unique_ptr<TrainBackend> backend, const TextCorpus& corpus, TrainOptions options);
  absl::Status Init();
  // Queues step step_ + 1 with the next batch; returns its loss outputs.
  absl::StatusOr<std::vector<TrainBackend::Handle>> Queue();
  absl::StatusOr<double> MeanLoss(const std::vector<TrainBackend::Handle>& losses, uint64_t tokens);
  absl::StatusOr<TrainBackend::Handle> Tokens(const std::vector<int32_t>& tokens, int mesh, uint32_t rows);
  void ReleaseAll(const std::vector<TrainBackend::Handle>& arrays);

  std::unique_ptr<TrainBackend> backend_;
  const TextCorpus& corpus_;
  TrainOptions options_;
  BatchSampler sampler_;
  // Replica by replica, stage by stage.
  std::vector<int> meshes_;
  TrainStep step_program_;
  int train_ = -1, eval_ = -1;
  // [replica][tensor]: the model's tensors, then Adam's m and v, in
  // Parameters() order.
  std::vector<std::vector<TrainBackend::Handle>> weights_, m_, v_;
  uint64_t step_ = 0;
};

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_TRAINER_H_
