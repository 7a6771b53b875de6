// causeway soak --train: elastic training (models/elastic_trainer.h) over
// two island processes while they are killed (SIGKILL) and started again at
// their addresses; fails on a lost step, a diverging loss, or growth of this
// process's descriptors or memory.
#ifndef CAUSEWAY_TOOLS_SOAK_TRAIN_H_
#define CAUSEWAY_TOOLS_SOAK_TRAIN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace causeway::cli {

struct TrainSoakSettings {
  absl::Duration duration, kill_min, kill_max, settle, report_every, timeout;
  uint64_t seed = 1;
  // The islands' flags (--accelerators per island, runtime flags).
  std::vector<std::string> island_args;
  // Steps between the boundaries at which a restarted island is admitted.
  uint64_t admit_every = 5;
};

// Runs the soak and prints its report; the command's exit code.
int TrainSoak(const TrainSoakSettings& settings);

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_SOAK_TRAIN_H_
