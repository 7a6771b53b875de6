// causeway soak: clients run programs over two island processes for a set
// time while the islands are killed (SIGKILL) and started again at random;
// checks that the clients recover, that every result is right, that every
// future resolves, and that this process's memory and descriptors stay flat.
// The clients speak the client API (causeway/client/client.h), so the same
// soak runs on an island in this process (--local) or on running islands
// (--connect), without kills. Not a measure of speed: the figures it prints
// are counts.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/client/local_client.h"
#include "causeway/client/remote_client.h"
#include "causeway/distributed/island_process.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/scheduler/program_def.pb.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/process_usage.h"
#include "tools/soak_train.h"

namespace causeway::cli {
namespace {

using ::causeway::transport::ControllerOptions;
using ::causeway::transport::IslandProcess;

constexpr char kUsage[] =
    "usage: causeway soak [--duration=10m] [--clients=4] [--kill-min=5s] [--kill-max=20s]\n"
    "                     [--local | --connect A,B [--secret-file FILE]] [flags]\n"
    "\n"
    "Starts two island processes and --clients clients (threads, each its own\n"
    "controller) that run a program spanning both islands, values crossing between\n"
    "them both ways, and check every result against the CPU. Meanwhile it kills one\n"
    "island (SIGKILL) at random times and starts it again; clients whose runs fail\n"
    "reconnect to the islands as they are now and go on. No island is killed in the\n"
    "last --settle of the run, so that the end shows whether the clients recovered.\n"
    "With --local the clients are tenants of one island in this process (the\n"
    "program's two meshes on it); with --connect they run on two running islands\n"
    "(causeway island). Neither kills anything: they soak the client, the island\n"
    "and the transport alone.\n"
    "\n"
    "Prints a progress line every --report-every, then a report: programs run, errors\n"
    "by code, kills and restarts, futures left unresolved, and this process's (and\n"
    "the islands') memory and descriptors over time. Exits 1 if a result was wrong, a\n"
    "future did not resolve by its deadline, an island ended on its own or could not\n"
    "be started again, or this process's descriptors or memory grew after the warm-up\n"
    "(the first quarter).\n"
    "\n"
    "The runtime flags (--device, --validation, ...) go to the islands (with --local,\n"
    "to this process's; not with --connect); --accelerators is per island (default 2:\n"
    "the program's meshes are two accelerators each).\n"
    "With --train, the two islands train the language model instead, elastically\n"
    "(one replica each, the batch re-split over the islands alive); a killed island\n"
    "starts again at its address and is admitted back within --admit-every steps.\n"
    "Exits 1 if a step is lost or repeated, the loss diverges or does not fall,\n"
    "training fails, or descriptors or memory grow.\n"
    "Durations are written 30s, 10m, 1h30m.\n\n";

// Descriptors: each client holds one socket per island while connected and
// none while it reconnects, so a sample taken while every client was between
// controllers sees two per client fewer than one taken while all are
// connected; beyond that, any growth is a leak (process_usage.h).
constexpr int kFdAllowancePerClient = 2;

// The program every client runs, over mesh "a" (island 0) and mesh "b"
// (island 1) of two accelerators each, on n x n floats:
//   t = (x + y) / 2     on a, split by rows
//   v = 2 (t w)         on b, t replicated there: it crosses a -> b
//   o = v / 4           on a, replicated: v crosses b -> a
// Outputs v (on b) and o (on a): results come back from both islands.
ProgramDef SoakProgram(int n) {
  ProgramDef def;
  def.set_name("soak");
  for (const char* name : {"a", "b"}) {
    MeshDef* m = def.add_meshes();
    m->set_name(name);
    m->add_dims(2);
  }
  *def.add_functions() = ElementwiseDef("add-half", "add", {n / 2, n});
  *def.add_functions() = ScaleDef("half", {n / 2, n}, 0.5f);
  *def.add_functions() = MatmulDef("mm", n, n, n);
  *def.add_functions() = ElementwiseDef("add-full", "add", {n, n});
  *def.add_functions() = ScaleDef("quarter", {n, n}, 0.25f);
  auto parameter = [&](const char* value, const char* mesh, const Sharding& sharding) {
    ParameterDef* p = def.add_parameters();
    p->set_value(value);
    p->set_mesh(mesh);
    p->add_shape(n);
    p->add_shape(n);
    if (!sharding.replicated()) *p->mutable_sharding() = ToDef(sharding);
  };
  parameter("x", "a", Sharding::Split(0));
  parameter("y", "a", Sharding::Split(0));
  parameter("w", "b", Sharding::Replicated());
  auto call = [&](const char* node, const char* function, const char* mesh, std::vector<std::string> inputs,
                  const char* output) {
    NodeDef* d = def.add_nodes();
    d->set_name(node);
    CallDef* c = d->mutable_call();
    c->set_function(function);
    c->set_mesh(mesh);
    for (const std::string& in : inputs) c->add_inputs(in);
    c->add_outputs(output);
  };
  call("sum", "add-half", "a", {"x", "y"}, "s");
  call("halve", "half", "a", {"s"}, "t");
  call("matmul", "mm", "b", {"t", "w"}, "u");
  call("double", "add-full", "b", {"u", "u"}, "v");
  call("quarter", "quarter", "a", {"v"}, "o");
  def.add_outputs("v");
  def.add_outputs("o");
  return def;
}

// The CPU's v and o for the inputs.
struct Expected {
  std::vector<float> v, o;
};
Expected Reference(const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& w,
                   int n) {
  std::vector<float> t(x.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = (x[i] + y[i]) * 0.5f;
  Expected e;
  e.v = reference::Matmul(t, w, n, n, n);
  for (float& f : e.v) f = f + f;
  e.o = e.v;
  for (float& f : e.o) f *= 0.25f;
  return e;
}

// The islands' addresses as the chaos loop kills and restarts them: "" while
// one is down. Thread-safe.
class IslandDirectory {
 public:
  explicit IslandDirectory(int count) : addresses_(count) {}

  void Set(int island, std::string address) {
    absl::MutexLock lock(&mu_);
    addresses_[island] = std::move(address);
  }
  // Wakes every AwaitAll, for good.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  // Every island's address once all are up. Cancelled once stopped,
  // DeadlineExceeded at `deadline` (naming the islands still down).
  absl::StatusOr<std::vector<std::string>> AwaitAll(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stopped_) return true;
      for (const std::string& a : addresses_) {
        if (a.empty()) return false;
      }
      return true;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      std::vector<int> down;
      for (size_t i = 0; i < addresses_.size(); ++i) {
        if (addresses_[i].empty()) down.push_back(static_cast<int>(i));
      }
      return absl::DeadlineExceededError(
          absl::StrCat("island ", absl::StrJoin(down, ", "), " still down at the reconnect deadline"));
    }
    if (stopped_) return absl::CancelledError("the soak is over");
    return addresses_;
  }

 private:
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
};

// What the clients saw, added up. Thread-safe.
class Tally {
 public:
  struct Counts {
    int64_t ok = 0, wrong = 0, errors = 0, unresolved = 0, futures = 0, sessions = 0;
    // Programs checked right whose run was started after the last kill.
    int64_t ok_since_last_kill = 0;
    std::map<absl::StatusCode, int64_t> errors_by_code;
    // The first message of each code, and of each wrong result and
    // unresolved future: what to look at first.
    std::map<absl::StatusCode, std::string> first_error;
    std::string first_wrong, first_unresolved;
  };

  // A future issued (a run's completion or a download).
  void Issued() {
    absl::MutexLock lock(&mu_);
    ++counts_.futures;
  }
  // A run checked right, started when `kills` islands had been killed.
  void Ok(int64_t kills) {
    absl::MutexLock lock(&mu_);
    ++counts_.ok;
    if (kills == kills_) ++counts_.ok_since_last_kill;
  }
  void Wrong(std::string what) {
    absl::MutexLock lock(&mu_);
    if (counts_.wrong++ == 0) counts_.first_wrong = std::move(what);
  }
  void Error(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    ++counts_.errors;
    if (counts_.errors_by_code[status.code()]++ == 0) counts_.first_error[status.code()] = status.ToString();
  }
  // A wait that reached its deadline with the future still pending.
  void Unresolved(std::string what) {
    absl::MutexLock lock(&mu_);
    if (counts_.unresolved++ == 0) counts_.first_unresolved = std::move(what);
  }
  void Connected() {
    absl::MutexLock lock(&mu_);
    ++counts_.sessions;
  }
  // An island was killed: runs started before now are not "since the last kill".
  void Killed() {
    absl::MutexLock lock(&mu_);
    ++kills_;
    counts_.ok_since_last_kill = 0;
  }
  int64_t kills() const {
    absl::MutexLock lock(&mu_);
    return kills_;
  }
  Counts counts() const {
    absl::MutexLock lock(&mu_);
    return counts_;
  }

 private:
  mutable absl::Mutex mu_;
  int64_t kills_ ABSL_GUARDED_BY(mu_) = 0;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

struct ClientConfig {
  int index = 0;
  int n = 64;
  int in_flight = 2;
  uint32_t seed = 1;
  // The deadline of each wait: a run's completion, a download, the islands
  // coming back.
  absl::Duration timeout = absl::Seconds(30);
  // Each run's deadline on the islands (client::ExecuteOptions::deadline).
  absl::Duration run_deadline = absl::InfiniteDuration();
};

// A new client for soak client `index` (its own controller of the islands,
// or its own tenant of the island in this process), and the islands of its
// meshes a and b.
struct ClientSource {
  std::function<absl::StatusOr<std::unique_ptr<client::Client>>(int index)> connect;
  int island_a = 0, island_b = 1;
};

// One client: its own controller over both islands, runs in flight, each
// checked against the CPU. A failure ends the session: what is in flight is
// awaited (each with its deadline), then the client connects again to the
// islands as the directory has them. Runs on a thread of its own.
class SoakClient {
 public:
  SoakClient(ClientConfig config, const ClientSource* source, Tally* tally, const std::atomic<bool>* stop)
      : config_(config), source_(source), tally_(tally), stop_(stop), def_(SoakProgram(config.n)) {}

  void Run() {
    while (true) {
      if (session_ == nullptr) {
        if (stop_->load()) return;
        if (absl::Status s = Connect(); !s.ok()) {
          if (!absl::IsCancelled(s)) tally_->Error(s);
          session_.reset();
          // An island may be starting again: not too eagerly.
          absl::SleepFor(absl::Milliseconds(100));
        }
        continue;
      }
      while (!broken_ && !stop_->load() && static_cast<int>(in_flight_.size()) < config_.in_flight) {
        if (absl::Status s = Issue(); !s.ok()) {
          tally_->Error(s);
          broken_ = true;
        }
      }
      if (in_flight_.empty()) {
        // Broken, or the soak is over: nothing is left waiting on this
        // client, so closing it fails nothing.
        session_.reset();
        broken_ = false;
        continue;
      }
      Finish(in_flight_.front());
      in_flight_.erase(in_flight_.begin());
    }
  }

 private:
  struct Session {
    std::unique_ptr<client::Client> client;
    client::Mesh a, b;
    std::shared_ptr<client::LoadedProgram> program;
  };
  struct InFlight {
    client::Run run;
    std::vector<client::Array> inputs;
    Expected expected;
    int64_t kills = 0;  // islands killed before the run started
    absl::Time deadline;
    uint64_t number = 0;
  };

  absl::Status Connect() {
    auto session = std::make_unique<Session>();
    CAUSEWAY_ASSIGN_OR_RETURN(session->client, source_->connect(config_.index));
    CAUSEWAY_ASSIGN_OR_RETURN(session->a, session->client->AllocateMesh(source_->island_a, {2}));
    CAUSEWAY_ASSIGN_OR_RETURN(session->b, session->client->AllocateMesh(source_->island_b, {2}));
    CAUSEWAY_ASSIGN_OR_RETURN(session->program,
                              session->client->Load(def_, {{"a", session->a}, {"b", session->b}}));
    session_ = std::move(session);
    tally_->Connected();
    return absl::OkStatus();
  }

  absl::Status Issue() {
    client::Client& c = *session_->client;
    const int n = config_.n;
    const uint64_t number = next_run_++;
    const uint32_t seed =
        static_cast<uint32_t>(reference::SplitMix64(config_.seed, config_.index * 1000003ull + number));
    std::vector<float> x = reference::RandomFloats(n * n, seed), y = reference::RandomFloats(n * n, seed + 1),
                       w = reference::RandomFloats(n * n, seed + 2);
    InFlight f;
    f.number = number;
    f.kills = tally_->kills();
    for (auto [mesh, sharding, host] :
         {std::tuple{&session_->a, Sharding::Split(0), &x}, std::tuple{&session_->a, Sharding::Split(0), &y},
          std::tuple{&session_->b, Sharding::Replicated(), &w}}) {
      CAUSEWAY_ASSIGN_OR_RETURN(client::Array array, c.CreateArray(*mesh, {n, n}, DType::kF32, sharding));
      f.inputs.push_back(array);
      CAUSEWAY_RETURN_IF_ERROR(c.Upload(array, host->data(), host->size() * sizeof(float)));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(f.run,
                              c.Execute(session_->program, f.inputs, {.deadline = config_.run_deadline}));
    tally_->Issued();
    f.deadline = absl::Now() + config_.timeout;
    f.expected = Reference(x, y, w, n);
    in_flight_.push_back(std::move(f));
    return absl::OkStatus();
  }

  // Awaits the run, fetches and checks its outputs, and gives back its
  // arrays (unless the session is broken: the islands release them all
  // when the controller goes).
  void Finish(InFlight& f) {
    const absl::Status done = f.run.done.AwaitStatus(f.deadline);
    if (!f.run.done.IsReady()) {
      tally_->Unresolved(absl::StrCat("client ", config_.index, " run ", f.number, ": not resolved ",
                                      absl::FormatDuration(config_.timeout), " after it started"));
      broken_ = true;
      return;
    }
    if (!done.ok()) {
      tally_->Error(done);
      broken_ = true;
      return;
    }
    client::Client& c = *session_->client;
    const int n = config_.n;
    bool right = true;
    for (int output = 0; output < 2 && right; ++output) {
      std::vector<float> got(n * n);
      tally_->Issued();
      absl::Status fetched = c.Download(f.run.outputs[output], got.data(), got.size() * sizeof(float),
                                        absl::Now() + config_.timeout);
      if (absl::IsDeadlineExceeded(fetched)) {
        tally_->Unresolved(absl::StrCat("client ", config_.index, " run ", f.number, " output ", output,
                                        ": download not done by its deadline: ", fetched.message()));
        broken_ = true;
        return;
      }
      if (!fetched.ok()) {
        tally_->Error(fetched);
        broken_ = true;
        return;
      }
      const std::vector<float>& want = output == 0 ? f.expected.v : f.expected.o;
      const double error = reference::MaxRelativeError(got, want);
      // Float sums of n products in another order than the CPU's double ones.
      if (!(error <= 1e-3)) {
        tally_->Wrong(absl::StrFormat("client %d run %d output %s: relative error %g against the CPU",
                                      config_.index, f.number, output == 0 ? "v" : "o", error));
        right = false;
      }
    }
    if (right) tally_->Ok(f.kills);
    if (broken_) return;
    std::vector<client::Array> arrays = f.inputs;
    arrays.insert(arrays.end(), f.run.outputs.begin(), f.run.outputs.end());
    for (const client::Array& a : arrays) {
      if (absl::Status s = c.Release(a); !s.ok()) {
        tally_->Error(s);
        broken_ = true;
        return;
      }
    }
  }

  const ClientConfig config_;
  const ClientSource* source_;
  Tally* tally_;
  const std::atomic<bool>* stop_;
  const ProgramDef def_;
  std::unique_ptr<Session> session_;
  // A failure ended the session: issue nothing more, finish what is in flight.
  bool broken_ = false;
  std::vector<InFlight> in_flight_;
  uint64_t next_run_ = 0;
};

// A process's resident memory, descriptors and threads from /proc (-1 where
// unreadable: an island between a kill and its restart).
// How the process `pid`, a child, ended ("exited with status 66", "was
// killed by signal 11"), or "" while it runs. Leaves it unreaped, for its
// IslandProcess to reap.
std::string Ended(pid_t pid) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid) {
    return "";
  }
  if (info.si_code == CLD_EXITED) return absl::StrCat("exited with status ", info.si_status);
  return absl::StrCat("was killed by signal ", info.si_status, " (", strsignal(info.si_status), ")");
}

struct Sample {
  double seconds = 0;
  Usage self;
  std::vector<Usage> islands;
  int64_t ok = 0, errors = 0;
};

}  // namespace

int SoakCommand(const std::vector<std::string>& args) {
  auto specs = RuntimeFlagSpecs();
  specs.push_back({"duration", "how long to run", "10m"});
  specs.push_back({"clients", "client threads, each with its own controller", "4"});
  specs.push_back({"in-flight", "runs each client keeps in flight", "2"});
  specs.push_back({"size", "the program's arrays are SIZE x SIZE floats (even)", "64"});
  specs.push_back({"kill-min", "least time between an island's restart and the next kill", "5s"});
  specs.push_back({"kill-max", "most time between an island's restart and the next kill", "20s"});
  specs.push_back({"settle",
                   "no kills in this last part of the run (default: the larger of --kill-max and "
                   "a tenth of --duration)",
                   ""});
  specs.push_back({"report-every", "a progress line and a memory sample this often", "10s"});
  specs.push_back({"timeout", "deadline of every wait: a run, a download, the islands coming back", "30s"});
  specs.push_back({"deadline",
                   "each run's deadline on the islands (e.g. 5s): a run past it fails, naming its kernel, "
                   "and counts as an error",
                   ""});
  specs.push_back({"seed", "the kills' times and victims, and the clients' inputs", "1"});
  specs.push_back({"local", "the clients are tenants of one island in this process; no kills", "", true});
  specs.push_back(
      {"connect", "the clients run on these two running islands (HOST:PORT,HOST:PORT); no kills", ""});
  specs.push_back({"secret-file", "shared secret for --connect beyond loopback (or CAUSEWAY_SECRET)", ""});
  specs.push_back({"train",
                   "train the language model elastically on the two islands instead of running programs", "",
                   true});
  specs.push_back(
      {"admit-every", "--train: steps between the boundaries at which a restarted island is admitted", "5"});
  Flags flags(specs);
  auto fail = [](const absl::Status& s, int code) { return Fail("soak", s, code); };
  if (auto done = StartCommand("soak", kUsage, flags, args)) return *done;
  const bool local = flags.Bool("local");
  std::vector<std::string> connect;
  if (flags.Has("connect")) connect = absl::StrSplit(flags.Get("connect"), ',', absl::SkipWhitespace());
  if (local && flags.Has("connect")) {
    return fail(absl::InvalidArgumentError("--local and --connect are two ways to run: give one"), 2);
  }
  if (flags.Has("connect") && connect.size() != 2) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--connect takes two islands (HOST:PORT,HOST:PORT), got ", connect.size())),
                2);
  }
  const bool spawn = !local && connect.empty();
  for (const char* name : {"kill-min", "kill-max", "settle"}) {
    if (!spawn && flags.Has(name)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "--", name, " is for islands started here; --local and --connect kill nothing")),
                  2);
    }
  }
  if (!connect.empty()) {
    for (const FlagSpec& spec : RuntimeFlagSpecs()) {
      if (flags.Has(spec.name)) {
        return fail(
            absl::InvalidArgumentError(absl::StrCat(
                "--", spec.name, " is for islands of this soak; the islands of --connect run already")),
            2);
      }
    }
  }
  if (flags.Has("secret-file") && connect.empty()) {
    return fail(absl::InvalidArgumentError("--secret-file is for --connect"), 2);
  }
  auto runtime_options = RuntimeOptionsFromFlags(flags);
  if (!runtime_options.ok()) return fail(runtime_options.status(), 2);
  const int accelerators = flags.Has("accelerators") ? runtime_options->accelerators : 2;
  if (accelerators < 2) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--accelerators (per island) must be at least 2, got ", accelerators)),
                2);
  }
  struct IntFlag {
    const char* name;
    int64_t min, max;
    int64_t value = 0;
  };
  IntFlag clients{"clients", 1, 64}, in_flight{"in-flight", 1, 64}, size{"size", 2, 1024},
      seed{"seed", 0, UINT32_MAX};
  for (IntFlag* f : {&clients, &in_flight, &size, &seed}) {
    auto v = flags.Int(f->name);
    if (!v.ok()) return fail(v.status(), 2);
    if (*v < f->min || *v > f->max) {
      return fail(absl::InvalidArgumentError(
                      absl::StrCat("--", f->name, " must be in ", f->min, "..", f->max, ", got ", *v)),
                  2);
    }
    f->value = *v;
  }
  if (size.value % 2 != 0) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--size must be even (split over two accelerators), got ", size.value)),
                2);
  }
  absl::Duration duration, kill_min, kill_max, report_every, timeout;
  for (auto [name, d] :
       {std::pair{"duration", &duration}, std::pair{"kill-min", &kill_min}, std::pair{"kill-max", &kill_max},
        std::pair{"report-every", &report_every}, std::pair{"timeout", &timeout}}) {
    auto parsed = flags.Duration(name);
    if (!parsed.ok()) return fail(parsed.status(), 2);
    *d = *parsed;
  }
  absl::Duration run_deadline = absl::InfiniteDuration();
  if (flags.Has("deadline")) {
    auto parsed = flags.Duration("deadline");
    if (!parsed.ok()) return fail(parsed.status(), 2);
    run_deadline = *parsed;
  }
  if (kill_min > kill_max) {
    return fail(absl::InvalidArgumentError(absl::StrCat("--kill-min (", absl::FormatDuration(kill_min),
                                                        ") must not exceed --kill-max (",
                                                        absl::FormatDuration(kill_max), ")")),
                2);
  }
  absl::Duration settle = std::max(kill_max, duration / 10);
  if (flags.Has("settle")) {
    absl::Duration d;
    if (!absl::ParseDuration(flags.Get("settle"), &d) || d < absl::ZeroDuration() || d >= duration) {
      return fail(absl::InvalidArgumentError(
                      absl::StrCat("--settle wants a duration from 0 to less than --duration (",
                                   absl::FormatDuration(duration), "), got '", flags.Get("settle"), "'")),
                  2);
    }
    settle = d;
  }

  // The islands' flags: the runtime flags given, --accelerators per island.
  std::vector<std::string> island_args = {absl::StrCat("--accelerators=", accelerators)};
  for (const FlagSpec& spec : RuntimeFlagSpecs()) {
    if (spec.name == "accelerators" || !flags.Has(spec.name)) continue;
    island_args.push_back(spec.boolean ? absl::StrCat(flags.Bool(spec.name) ? "--" : "--no-", spec.name)
                                       : absl::StrCat("--", spec.name, "=", flags.Get(spec.name)));
  }
  if (flags.Bool("train")) {
    for (const char* name : {"local", "connect", "clients", "in-flight", "size", "deadline"}) {
      if (flags.Has(name)) {
        return fail(absl::InvalidArgumentError(absl::StrCat("--", name, " is not for --train")), 2);
      }
    }
    TrainSoakSettings settings{duration, kill_min, kill_max, settle, report_every, timeout};
    settings.seed = static_cast<uint64_t>(seed.value);
    settings.island_args = island_args;
    auto admit_every = flags.Int("admit-every");
    if (!admit_every.ok()) return fail(admit_every.status(), 2);
    if (*admit_every < 1 || *admit_every > 1000000) {
      return fail(absl::InvalidArgumentError("--admit-every must be in 1..1000000"), 2);
    }
    settings.admit_every = static_cast<uint64_t>(*admit_every);
    return TrainSoak(settings);
  }
  if (flags.Has("admit-every")) return fail(absl::InvalidArgumentError("--admit-every is for --train"), 2);
  auto trace = flags.StartTrace();
  if (!trace.ok()) return fail(trace.status(), 2);

  // Islands start from this thread, which lives until the end: an island
  // dies with the thread that started it (IslandProcess).
  const int owned_islands = spawn ? 2 : 0;  // island processes this soak owns
  std::vector<std::unique_ptr<IslandProcess>> islands(owned_islands);
  IslandDirectory directory(2);
  auto start_island = [&](int i) -> absl::Status {
    absl::Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto p = IslandProcess::Start("/proc/self/exe", absl::StrCat("island-", i), island_args, {},
                                    std::max(timeout, absl::Seconds(60)));
      if (p.ok()) {
        islands[i] = *std::move(p);
        directory.Set(i, islands[i]->address());
        return absl::OkStatus();
      }
      last = p.status();
    }
    return last;
  };
  for (int i = 0; i < owned_islands; ++i) {
    if (absl::Status s = start_island(i); !s.ok()) return fail(s, 1);
  }
  for (size_t i = 0; i < connect.size(); ++i) directory.Set(static_cast<int>(i), connect[i]);

  // Where the clients connect: the islands of the directory, or one island
  // in this process.
  ClientSource source;
  std::unique_ptr<Runtime> local_runtime;
  std::unique_ptr<Island> local_island;
  if (local) {
    RuntimeOptions options = *runtime_options;
    options.accelerators = accelerators;
    auto rt = Runtime::Create(options);
    if (!rt.ok()) return fail(rt.status(), 1);
    local_runtime = *std::move(rt);
    IslandOptions island_options;
    island_options.name = "local";
    auto island = Island::Create(local_runtime.get(), island_options);
    if (!island.ok()) return fail(island.status(), 1);
    local_island = *std::move(island);
    source.island_b = 0;
    source.connect = [island =
                          local_island.get()](int index) -> absl::StatusOr<std::unique_ptr<client::Client>> {
      CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<client::LocalClient> c,
                                client::LocalClient::Connect(island, absl::StrCat("soak-client-", index)));
      return std::unique_ptr<client::Client>(std::move(c));
    };
  } else {
    ControllerOptions options;
    if (!connect.empty()) {
      auto secret = SecretFromFlags(flags);
      if (!secret.ok()) return fail(secret.status(), 2);
      options.secret = *std::move(secret);
    }
    options.call_timeout = timeout;
    source.connect = [&directory, options,
                      timeout](int index) -> absl::StatusOr<std::unique_ptr<client::Client>> {
      CAUSEWAY_ASSIGN_OR_RETURN(std::vector<std::string> addresses,
                                directory.AwaitAll(absl::Now() + timeout));
      ControllerOptions mine = options;
      mine.name = absl::StrCat("soak-client-", index);
      CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<client::RemoteClient> c,
                                client::RemoteClient::Connect(addresses, mine));
      return std::unique_ptr<client::Client>(std::move(c));
    };
  }
  const std::string where = local ? absl::StrCat("one island of ", accelerators, " accelerators here")
                            : !connect.empty() ? absl::StrCat("islands ", absl::StrJoin(connect, " and "))
                                               : absl::StrCat("2 islands of ", accelerators, " accelerators");
  std::printf("causeway soak: %s, %s, %d clients with %d runs in flight, %dx%d floats; %s\n",
              absl::FormatDuration(duration).c_str(), where.c_str(), static_cast<int>(clients.value),
              static_cast<int>(in_flight.value), static_cast<int>(size.value), static_cast<int>(size.value),
              spawn ? absl::StrCat("kills every ", absl::FormatDuration(kill_min), "..",
                                   absl::FormatDuration(kill_max), ", none in the last ",
                                   absl::FormatDuration(settle))
                          .c_str()
                    : "no kills");
  std::fflush(stdout);

  Tally tally;
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<SoakClient>> soak_clients;
  std::vector<std::thread> threads;
  for (int i = 0; i < clients.value; ++i) {
    ClientConfig config;
    config.index = i;
    config.n = static_cast<int>(size.value);
    config.in_flight = static_cast<int>(in_flight.value);
    config.seed = static_cast<uint32_t>(seed.value);
    config.timeout = timeout;
    config.run_deadline = run_deadline;
    soak_clients.push_back(std::make_unique<SoakClient>(config, &source, &tally, &stop));
  }
  const absl::Time start = absl::Now();
  const absl::Time end = start + duration;
  for (auto& c : soak_clients) {
    threads.emplace_back([c = c.get(), i = threads.size()] {
      Tracer::NameThread(absl::StrCat("soak client ", i));
      c->Run();
    });
  }

  std::mt19937_64 rng(seed.value);
  auto uniform = [&rng](absl::Duration lo, absl::Duration hi) {
    std::uniform_real_distribution<double> d(absl::ToDoubleSeconds(lo), absl::ToDoubleSeconds(hi));
    return absl::Seconds(d(rng));
  };
  std::vector<Sample> samples;
  auto sample = [&] {
    Sample s;
    s.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    s.self = ReadUsage("/proc/self");
    for (const auto& island : islands) {
      s.islands.push_back(island == nullptr ? Usage{} : ReadUsage(absl::StrCat("/proc/", island->pid())));
    }
    Tally::Counts counts = tally.counts();
    s.ok = counts.ok;
    s.errors = counts.errors;
    samples.push_back(s);
    std::string line = absl::StrFormat(
        "[%5.0fs] programs %d  errors %d  kills %d  rss %s MiB  fds %s  threads %s", s.seconds, s.ok,
        s.errors, tally.kills(), Mib(s.self.rss_kib), Count(s.self.fds), Count(s.self.threads));
    for (int i = 0; i < owned_islands; ++i) {
      absl::StrAppendFormat(&line, "  island-%d %s MiB %s fds", i, Mib(s.islands[i].rss_kib),
                            Count(s.islands[i].fds));
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };

  // The chaos loop: kill one island at random, start it again at once (a new
  // process, on a port of its own), wait a while, again; report as it goes.
  // An island that ends on its own (a crash, a sanitizer's report) is a
  // failure of the soak: it is reported and started again.
  int64_t kills = 0, restarts = 0, deaths = 0;
  std::string first_death;
  absl::Status restart_failed;
  absl::Time next_kill = start + uniform(kill_min, kill_max);
  const absl::Time last_kill = end - settle;
  absl::Time next_report = start + report_every;
  while (restart_failed.ok()) {
    const absl::Time now = absl::Now();
    if (now >= end) break;
    for (int i = 0; i < owned_islands; ++i) {
      std::string ended = Ended(islands[i]->pid());
      if (ended.empty()) continue;
      std::printf("[%5.0fs] island-%d %s; starting it again\n", absl::ToDoubleSeconds(now - start), i,
                  ended.c_str());
      std::fflush(stdout);
      if (deaths++ == 0) first_death = absl::StrCat("island-", i, " ", ended);
      directory.Set(i, "");
      islands[i].reset();  // reaps it
      if (absl::Status s = start_island(i); !s.ok()) {
        restart_failed = s;
        break;
      }
      ++restarts;
    }
    if (!restart_failed.ok()) break;
    // Short naps, so that an island that ended is seen soon.
    absl::Time wake = std::min({end, next_report, now + absl::Milliseconds(200)});
    if (spawn && next_kill < last_kill) wake = std::min(wake, next_kill);
    if (wake > now) {
      absl::SleepFor(wake - now);
      continue;
    }
    if (spawn && now >= next_kill && next_kill < last_kill) {
      const int victim = std::uniform_int_distribution<int>(0, owned_islands - 1)(rng);
      directory.Set(victim, "");
      islands[victim]->Signal(SIGKILL);
      islands[victim].reset();  // reaps it
      tally.Killed();
      ++kills;
      if (absl::Status s = start_island(victim); !s.ok()) {
        restart_failed = s;
        break;
      }
      ++restarts;
      next_kill = absl::Now() + uniform(kill_min, kill_max);
    }
    if (absl::Now() >= next_report) {
      sample();
      next_report += report_every;
    }
  }
  sample();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  // The clients finish what they have in flight, each wait with its own
  // deadline, and close their controllers.
  stop = true;
  directory.Stop();
  for (std::thread& t : threads) t.join();
  const Tally::Counts counts = tally.counts();
  if (*trace != nullptr) {
    if (absl::Status s = (*trace)->Finish(); !s.ok())
      std::fprintf(stderr, "causeway soak: %s\n", std::string(s.message()).c_str());
  }

  std::printf("\nreport\n");
  std::printf("  run time                  %.1f s\n", seconds);
  std::printf("  programs ok               %" PRId64 "\n", counts.ok);
  std::printf("  programs after last kill  %" PRId64 "\n", counts.ok_since_last_kill);
  std::printf("  wrong results             %" PRId64 "\n", counts.wrong);
  std::vector<std::string> by_code;
  for (const auto& [code, n] : counts.errors_by_code)
    by_code.push_back(absl::StrCat(absl::StatusCodeToString(code), " ", n));
  std::printf("  errors                    %" PRId64 "%s\n", counts.errors,
              by_code.empty() ? "" : absl::StrCat(" (", absl::StrJoin(by_code, ", "), ")").c_str());
  std::printf("  kills                     %" PRId64 "\n", kills);
  std::printf("  restarts                  %" PRId64 "\n", restarts);
  std::printf("  unexpected exits          %" PRId64 "%s\n", deaths,
              deaths == 0 ? "" : absl::StrCat(" (first: ", first_death, ")").c_str());
  std::printf("  reconnects                %" PRId64 "\n",
              std::max<int64_t>(0, counts.sessions - clients.value));
  std::printf("  futures issued            %" PRId64 "\n", counts.futures);
  std::printf("  unresolved futures        %" PRId64 "\n", counts.unresolved);
  for (const auto& [code, message] : counts.first_error)
    std::printf("  first %s: %s\n", absl::StatusCodeToString(code).c_str(), message.c_str());
  if (!counts.first_wrong.empty()) std::printf("  first wrong result: %s\n", counts.first_wrong.c_str());
  if (!counts.first_unresolved.empty())
    std::printf("  first unresolved: %s\n", counts.first_unresolved.c_str());

  std::printf("\n  %7s %8s %5s %8s %9s %7s", "time s", "RSS MiB", "fds", "threads", "programs", "errors");
  for (int i = 0; i < owned_islands; ++i)
    std::printf(" %22s", absl::StrCat("island-", i, " MiB/fds/threads").c_str());
  std::printf("\n");
  for (const Sample& s : samples) {
    std::printf("  %7.0f %8s %5s %8s %9" PRId64 " %7" PRId64, s.seconds, Mib(s.self.rss_kib).c_str(),
                Count(s.self.fds).c_str(), Count(s.self.threads).c_str(), s.ok, s.errors);
    for (const Usage& u : s.islands) {
      std::printf(" %22s", absl::StrCat(Mib(u.rss_kib), "/", Count(u.fds), "/", Count(u.threads)).c_str());
    }
    std::printf("\n");
  }

  std::vector<std::string> failures;
  if (!restart_failed.ok())
    failures.push_back(absl::StrCat("an island did not start again: ", restart_failed.message()));
  if (deaths > 0)
    failures.push_back(absl::StrCat(deaths, " unexpected island exits (first: ", first_death, ")"));
  if (counts.wrong > 0) failures.push_back(absl::StrCat(counts.wrong, " wrong results"));
  if (counts.unresolved > 0) failures.push_back(absl::StrCat(counts.unresolved, " unresolved futures"));
  std::vector<UsageSample> usage;
  for (const Sample& s : samples) usage.push_back({s.seconds, s.self});
  const std::string flat = CheckFlat(usage, duration, report_every,
                                     kFdAllowancePerClient * static_cast<int>(clients.value), failures);
  std::printf("\n  flat                      %s\n\n", flat.c_str());
  return SoakVerdict(absl::StrFormat("%.0f s, %d programs ok (%d after the last kill), %d errors, %d kills, "
                                     "%d restarts, %d wrong, %d unresolved",
                                     seconds, counts.ok, counts.ok_since_last_kill, counts.errors, kills,
                                     restarts, counts.wrong, counts.unresolved),
                     failures);
}

}  // namespace causeway::cli
