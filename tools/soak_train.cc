#include "tools/soak_train.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "causeway/distributed/island_process.h"
#include "causeway/models/elastic_trainer.h"
#include "causeway/models/text_data.h"
#include "tools/build_paths.h"
#include "tools/flags.h"
#include "tools/process_usage.h"

namespace causeway::cli {
namespace {

using ::causeway::transport::IslandProcess;

// A step whose loss is this far above the first step's has diverged (an
// untrained model's loss is ln(vocabulary), about 4.3, and only falls).
constexpr double kDivergence = 1.0;

// What the training thread heard, step by step.
class StepLog {
 public:
  void Heard(const models::StepReport& r) {
    absl::MutexLock lock(&mu_);
    if (r.step != last_ + 1) {
      if (gaps_++ == 0) first_gap_ = absl::StrCat("step ", r.step, " after step ", last_);
    }
    last_ = r.step;
    if (losses_.empty()) first_ = r.loss;
    if (!std::isfinite(r.loss) || r.loss > first_ + kDivergence) {
      if (diverged_++ == 0)
        first_diverged_ = absl::StrFormat("step %d: loss %g (step 1: %g)", r.step, r.loss, first_);
    }
    losses_.push_back(r.loss);
  }
  uint64_t steps() const {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  double last_loss() const {
    absl::MutexLock lock(&mu_);
    return losses_.empty() ? 0 : losses_.back();
  }
  // Appends what went wrong to `failures`; the loss over the run in words.
  std::string Check(std::vector<std::string>& failures) const {
    absl::MutexLock lock(&mu_);
    if (gaps_ > 0)
      failures.push_back(absl::StrCat(gaps_, " steps lost or repeated (first: ", first_gap_, ")"));
    if (diverged_ > 0)
      failures.push_back(absl::StrCat(diverged_, " steps diverged (first: ", first_diverged_, ")"));
    constexpr size_t kWindow = 5;
    if (losses_.size() < 2 * kWindow) {
      failures.push_back(absl::StrCat("only ", losses_.size(), " steps: too few to tell whether it learned"));
      return absl::StrCat(losses_.size(), " steps");
    }
    const double first = std::accumulate(losses_.begin(), losses_.begin() + kWindow, 0.0) / kWindow;
    const double last = std::accumulate(losses_.end() - kWindow, losses_.end(), 0.0) / kWindow;
    if (!(last < first))
      failures.push_back(absl::StrFormat("the loss did not fall (%.4f -> %.4f)", first, last));
    return absl::StrFormat("%.4f -> %.4f (means of the first and last %d steps)", first, last, kWindow);
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t last_ ABSL_GUARDED_BY(mu_) = 0;
  double first_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> losses_ ABSL_GUARDED_BY(mu_);
  int64_t gaps_ ABSL_GUARDED_BY(mu_) = 0, diverged_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_gap_ ABSL_GUARDED_BY(mu_), first_diverged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int TrainSoak(const TrainSoakSettings& s) {
  auto fail = [](const absl::Status& status, int code) { return Fail("soak", status, code); };
  auto corpus = models::TextCorpus::Load(ShippedCorpus());
  if (!corpus.ok()) return fail(corpus.status(), 1);

  // Two islands, started from this thread (an island dies with the thread
  // that started it); again at the same address after a kill, so that the
  // trainer finds it there.
  std::vector<std::unique_ptr<IslandProcess>> islands(2);
  std::vector<std::string> addresses(2);
  auto start_island = [&](int i) -> absl::Status {
    std::vector<std::string> args = s.island_args;
    if (!addresses[i].empty()) args.push_back("--listen=" + addresses[i]);
    absl::Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto p = IslandProcess::Start("/proc/self/exe", absl::StrCat("island-", i), args, {},
                                    std::max(s.timeout, absl::Seconds(60)));
      if (p.ok()) {
        islands[i] = *std::move(p);
        addresses[i] = islands[i]->address();
        return absl::OkStatus();
      }
      last = p.status();
      absl::SleepFor(absl::Milliseconds(200));
    }
    return last;
  };
  for (int i = 0; i < 2; ++i) {
    if (absl::Status st = start_island(i); !st.ok()) return fail(st, 1);
  }

  models::TrainOptions options;
  options.config.d_model = 32;
  options.config.heads = 4;
  options.config.d_ff = 64;
  options.config.layers = 2;
  options.config.seq_len = 32;
  options.layout.batch = 8;
  options.adam.lr = 3e-3f;
  options.seed = s.seed;
  const absl::Time start = absl::Now();
  auto at = [&start] { return absl::ToDoubleSeconds(absl::Now() - start); };
  std::atomic<int> members{2};
  std::unique_ptr<models::ElasticTrainer> elastic;
  models::ElasticOptions e;
  e.islands = addresses;
  e.controller.connection.peer_timeout = absl::Seconds(5);
  e.controller.call_timeout = s.timeout;
  e.admit_every = s.admit_every;
  e.timeout = s.timeout;
  e.report = [&](const std::string& line) {
    std::printf("[%5.0fs] islands: %s\n", at(), line.c_str());
    std::fflush(stdout);
    members = static_cast<int>(elastic->members().size());
  };
  auto made = models::ElasticTrainer::Create(*corpus, options, e);
  if (!made.ok()) return fail(made.status(), 1);
  elastic = *std::move(made);
  std::printf(
      "causeway soak --train: %s, the language model (%u layers, d_model %u) on 2 islands, batch %u; "
      "kills every %s..%s, none in the last %s\n",
      absl::FormatDuration(s.duration).c_str(), options.config.layers, options.config.d_model,
      options.layout.batch, absl::FormatDuration(s.kill_min).c_str(),
      absl::FormatDuration(s.kill_max).c_str(), absl::FormatDuration(s.settle).c_str());
  std::fflush(stdout);

  // Training, on a thread of its own, until told to stop.
  StepLog log;
  std::atomic<bool> stop{false};
  absl::Status trained;  // written by the thread, read after it is joined
  std::thread trainer([&] {
    while (!stop) {
      absl::StatusOr<std::vector<double>> ran =
          elastic->Train(s.admit_every, [&log](const models::StepReport& r) { log.Heard(r); });
      if (!ran.ok()) {
        trained = ran.status();
        return;
      }
    }
  });

  // The chaos loop: kill an island at random while both train, start it
  // again at once at its address; an island that ends on its own fails the
  // soak (and is started again).
  std::mt19937_64 rng(s.seed);
  auto uniform = [&rng](absl::Duration lo, absl::Duration hi) {
    return absl::Seconds(
        std::uniform_real_distribution<double>(absl::ToDoubleSeconds(lo), absl::ToDoubleSeconds(hi))(rng));
  };
  const absl::Time end = start + s.duration, last_kill = end - s.settle;
  absl::Time next_kill = start + uniform(s.kill_min, s.kill_max), next_report = start + s.report_every;
  int64_t kills = 0, restarts = 0, deaths = 0;
  std::string first_death;
  absl::Status restart_failed;
  std::vector<UsageSample> samples;
  auto sample = [&] {
    UsageSample u{at(), ReadUsage("/proc/self")};
    samples.push_back(u);
    std::printf("[%5.0fs] steps %llu  loss %.4f  islands %d  kills %lld  rss %s MiB  fds %s  threads %s\n",
                u.seconds, static_cast<unsigned long long>(log.steps()), log.last_loss(), members.load(),
                static_cast<long long>(kills), Mib(u.self.rss_kib).c_str(), Count(u.self.fds).c_str(),
                Count(u.self.threads).c_str());
    std::fflush(stdout);
  };
  while (restart_failed.ok() && absl::Now() < end) {
    for (int i = 0; i < 2 && restart_failed.ok(); ++i) {
      std::string how;
      if (!islands[i]->Ended(&how)) continue;
      std::printf("[%5.0fs] island-%d %s on its own; starting it again\n", at(), i, how.c_str());
      if (deaths++ == 0) first_death = absl::StrCat("island-", i, " ", how);
      restart_failed = start_island(i);
      if (restart_failed.ok()) ++restarts;
    }
    const absl::Time now = absl::Now();
    if (now >= next_kill && next_kill < last_kill && members == 2) {
      const int victim = std::uniform_int_distribution<int>(0, 1)(rng);
      islands[victim]->Signal(SIGKILL);
      islands[victim]->Stop();  // reaps it
      ++kills;
      members = 1;  // until the trainer admits it back
      std::printf("[%5.0fs] killed island-%d; starting it again at %s\n", at(), victim,
                  addresses[victim].c_str());
      std::fflush(stdout);
      restart_failed = start_island(victim);
      if (restart_failed.ok()) ++restarts;
      next_kill = absl::Now() + uniform(s.kill_min, s.kill_max);
    }
    if (absl::Now() >= next_report) {
      sample();
      next_report += s.report_every;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  sample();
  stop = true;
  trainer.join();
  const int changes = elastic->changes();
  const std::vector<std::string> lost = elastic->lost();
  elastic.reset();

  std::vector<std::string> failures;
  if (!trained.ok()) failures.push_back(absl::StrCat("training failed: ", trained.message()));
  if (!restart_failed.ok()) {
    failures.push_back(absl::StrCat("an island did not start again: ", restart_failed.message()));
  }
  if (deaths > 0)
    failures.push_back(absl::StrCat(deaths, " unexpected island exits (first: ", first_death, ")"));
  if (!lost.empty()) {
    failures.push_back(absl::StrCat("not admitted back by the end: ", absl::StrJoin(lost, ", ")));
  }
  const std::string loss = log.Check(failures);
  const std::string flat = CheckFlat(samples, s.duration, s.report_every, 0, failures);
  std::printf("\nreport\n");
  std::printf("  run time                  %.1f s\n", at());
  std::printf("  steps                     %llu\n", static_cast<unsigned long long>(log.steps()));
  std::printf("  loss                      %s\n", loss.c_str());
  std::printf("  kills                     %lld\n", static_cast<long long>(kills));
  std::printf("  restarts                  %lld\n", static_cast<long long>(restarts));
  std::printf("  changes of islands        %d\n", changes);
  std::printf("  flat                      %s\n\n", flat.c_str());
  return SoakVerdict(
      absl::StrFormat("%d steps, %d kills, %d changes of islands", log.steps(), kills, changes), failures);
}

}  // namespace causeway::cli
