// Data-parallel training across island servers that goes on when islands
// are lost and takes them back when they return.
//
// One replica of the layout runs on each island (Trainer with replicas =
// islands). When a step fails because an island is lost, training goes on
// from the last complete step (the last whose loss was read) with the
// surviving islands: the state comes from a surviving replica's arrays (the
// trainer keeps them, keep_last_complete; no disk), and the step that
// failed runs again with the same batch. The global batch is kept and
// re-split over the survivors (each takes batch / islands sequences), so
// every step is the same mean gradient over the same sequences as before,
// the loss trajectory does not change (within the layouts' tolerance) and
// the learning rate stays right; gradient accumulation would keep each
// island's share instead, for an island whose memory holds only that, but
// costs passes that re-splitting does not. At step boundaries (every
// `admit_every` steps) lost islands are sought, a restarted one at its old
// address first, then the spares: one that answers is admitted with the
// current weights and the batch re-split again. Each change of islands is
// reported on one line: the step, the islands, the batch.
//
// A change rebuilds the trainer (its programs re-split and reloaded) over a
// new controller of the members; state crosses through this process's
// memory. Thread-compatible: use from one thread.
//
// Example:
//   ElasticOptions e;
//   e.islands = {"10.0.0.1:7400", "10.0.0.2:7400"};
//   e.report = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
//   CAUSEWAY_ASSIGN_OR_RETURN(auto trainer, ElasticTrainer::Create(corpus, options, e));
//   CAUSEWAY_ASSIGN_OR_RETURN(std::vector<double> losses, trainer->Train(1000));
#ifndef CAUSEWAY_MODELS_ELASTIC_TRAINER_H_
#define CAUSEWAY_MODELS_ELASTIC_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "causeway/client/remote_client.h"
#include "causeway/models/trainer.h"

namespace causeway::models {

struct ElasticOptions {
  // The islands (HOST:PORT), one replica of the layout each.
  std::vector<std::string> islands;
  // Islands to admit in place of lost ones, sought after each lost island's
  // own address.
  std::vector<std::string> spares;
  transport::ControllerOptions controller;
  // Steps between the boundaries at which lost islands are sought (each
  // boundary drains the queue of steps once).
  uint64_t admit_every = 10;
  // Trainer::Create's timeout for every wait.
  absl::Duration timeout = absl::Minutes(5);
  // Hears one line for each change of islands.
  std::function<void(const std::string&)> report;
};

class ElasticTrainer {
 public:
  // Connects to every island of `elastic` and builds the trainer
  // (`options.layout.replicas` becomes the island count). `corpus` must
  // outlive the trainer.
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Create(const TextCorpus& corpus,
                                                                TrainOptions options, ElasticOptions elastic);
  ~ElasticTrainer();

  // Runs until `steps` more steps are complete, on the islands that are
  // alive, seeking lost ones at every boundary (a step count that
  // admit_every divides) it reaches; `progress` hears of each step once, in
  // order. Fails when no
  // island is left, or on an error that is not a lost island.
  absl::StatusOr<std::vector<double>> Train(uint64_t steps,
                                            const std::function<void(const StepReport&)>& progress = {});

  Trainer& trainer() { return *trainer_; }
  // The islands training now (addresses), and those lost and not back.
  const std::vector<std::string>& members() const { return members_; }
  const std::vector<std::string>& lost() const { return lost_; }
  // Changes of islands so far (losses and admissions).
  int changes() const { return changes_; }

 private:
  ElasticTrainer(const TextCorpus& corpus, TrainOptions options, ElasticOptions elastic)
      : corpus_(corpus), options_(std::move(options)), elastic_(std::move(elastic)) {}
  // A new controller of `members` and a trainer over it, from `state` if
  // given.
  absl::Status Build(std::vector<std::string> members, const CheckpointState* state);
  // After `failure`: on without the lost islands, from the last complete
  // step; `failure` itself if no island was lost.
  absl::Status Recover(const absl::Status& failure);
  // Admits the first lost island or spare that answers, if any.
  absl::Status Admit();
  std::string Describe() const;
  void Report(const std::string& line);

  const TextCorpus& corpus_;
  TrainOptions options_;
  ElasticOptions elastic_;
  std::unique_ptr<client::RemoteClient> client_;
  std::unique_ptr<Trainer> trainer_;
  std::vector<std::string> members_, lost_;
  int changes_ = 0;
};

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_ELASTIC_TRAINER_H_
