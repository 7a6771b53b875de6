#include "causeway/models/elastic_trainer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/base/status.h"

namespace causeway::models {

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(const TextCorpus& corpus,
                                                                       TrainOptions options,
                                                                       ElasticOptions elastic) {
  if (elastic.islands.empty()) return absl::InvalidArgumentError("elastic training: no islands");
  options.keep_last_complete = true;
  std::vector<std::string> islands = elastic.islands;
  std::unique_ptr<ElasticTrainer> t(new ElasticTrainer(corpus, std::move(options), std::move(elastic)));
  CAUSEWAY_RETURN_IF_ERROR(t->Build(std::move(islands), nullptr));
  return t;
}

ElasticTrainer::~ElasticTrainer() {
  trainer_.reset();  // before the client it uses
  client_.reset();
}

absl::Status ElasticTrainer::Build(std::vector<std::string> members, const CheckpointState* state) {
  trainer_.reset();
  client_.reset();
  CAUSEWAY_ASSIGN_OR_RETURN(client_, client::RemoteClient::Connect(members, elastic_.controller));
  TrainOptions options = options_;
  options.layout.replicas = static_cast<uint32_t>(members.size());
  CAUSEWAY_ASSIGN_OR_RETURN(trainer_, Trainer::Create(client_.get(), corpus_, options, elastic_.timeout));
  if (state != nullptr) CAUSEWAY_RETURN_IF_ERROR(trainer_->Restore(*state));
  members_ = std::move(members);
  return absl::OkStatus();
}

std::string ElasticTrainer::Describe() const {
  const uint32_t batch = options_.layout.batch;
  const size_t n = members_.size();
  return absl::StrCat(n, n == 1 ? " island" : " islands", " (", absl::StrJoin(members_, ", "), "), batch ",
                      batch, " (", batch / n, " per island)");
}

void ElasticTrainer::Report(const std::string& line) {
  ++changes_;
  if (elastic_.report) elastic_.report(line);
}

absl::Status ElasticTrainer::Recover(const absl::Status& failure) {
  if (client_ == nullptr || trainer_ == nullptr) return failure;
  std::vector<std::string> survivors, lost;
  std::string why;
  for (int i = 0; i < client_->island_count(); ++i) {
    absl::Status s = client_->controller().island_status(i);
    if (s.ok()) {
      survivors.push_back(members_[i]);
    } else {
      lost.push_back(members_[i]);
      absl::StrAppend(&why, why.empty() ? "" : "; ", "'", client_->controller().island_name(i), "' at ",
                      members_[i], ": ", s.message());
    }
  }
  if (lost.empty()) return failure;  // not a lost island: the caller's to see
  if (survivors.empty()) {
    return absl::UnavailableError(
        absl::StrCat("elastic training: every island is lost (", why, "); first: ", failure.message()));
  }
  absl::StatusOr<CheckpointState> state = trainer_->LastCompleteState();
  if (!state.ok()) {
    return absl::Status(state.status().code(),
                        absl::StrCat("elastic training: after losing ", why, ", no survivor gave back step ",
                                     trainer_->steps_done(), ": ", state.status().message()));
  }
  for (const std::string& address : lost) {
    if (std::find(lost_.begin(), lost_.end(), address) == lost_.end()) lost_.push_back(address);
  }
  if (absl::Status s = Build(std::move(survivors), &*state); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("elastic training: rebuilding without ", why, ": ", s.message()));
  }
  Report(absl::StrCat("step ", state->step, ": lost ", why, "; on ", Describe(), " from step ",
                      state->step + 1));
  return absl::OkStatus();
}

absl::Status ElasticTrainer::Admit() {
  if (lost_.empty()) return absl::OkStatus();
  std::vector<std::string> candidates = lost_;
  for (const std::string& spare : elastic_.spares) {
    if (std::find(candidates.begin(), candidates.end(), spare) == candidates.end())
      candidates.push_back(spare);
  }
  for (const std::string& address : candidates) {
    if (std::find(members_.begin(), members_.end(), address) != members_.end()) continue;
    // One that answers a controller's handshake is back.
    if (!client::RemoteClient::Connect({address}, elastic_.controller).ok()) continue;
    CAUSEWAY_ASSIGN_OR_RETURN(CheckpointState state, trainer_->Snapshot());
    std::vector<std::string> members = members_;
    members.push_back(address);
    const std::vector<std::string> before = members_;
    if (absl::Status s = Build(members, &state); !s.ok()) {
      // Not admitted after all (gone again, or the batch does not split):
      // on as before.
      CAUSEWAY_RETURN_IF_ERROR(Build(before, &state));
      Report(absl::StrCat("step ", state.step, ": ", address, " not admitted: ", s.message(), "; on ",
                          Describe()));
      continue;
    }
    // It stands for itself if it was lost, else for the oldest loss.
    auto it = std::find(lost_.begin(), lost_.end(), address);
    lost_.erase(it != lost_.end() ? it : lost_.begin());
    Report(absl::StrCat("step ", state.step, ": admitted ", address, "; on ", Describe()));
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ElasticTrainer::Train(
    uint64_t steps, const std::function<void(const StepReport&)>& progress) {
  std::vector<double> out;
  const uint64_t target = trainer_->steps_done() + steps;
  const uint64_t every = std::max<uint64_t>(elastic_.admit_every, 1);
  auto heard = [&](const StepReport& r) {
    out.push_back(r.loss);
    if (progress) progress(r);
  };
  while (trainer_->steps_done() < target) {
    const uint64_t done = trainer_->steps_done();
    const uint64_t block = std::min(every - done % every, target - done);
    absl::StatusOr<std::vector<double>> ran = trainer_->Train(block, heard);
    if (!ran.ok()) {
      CAUSEWAY_RETURN_IF_ERROR(Recover(ran.status()));
      continue;
    }
    if (trainer_->steps_done() % every == 0) CAUSEWAY_RETURN_IF_ERROR(Admit());
  }
  return out;
}

}  // namespace causeway::models
