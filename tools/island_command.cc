// causeway island: hosts one island (this machine's accelerators, a gang
// scheduler, executors) behind a socket until SIGINT or SIGTERM. Process 0 of
// a launch (flags, CAUSEWAY_*, Slurm, Open MPI or torchrun variables) also
// serves the launch's registry; the others register with it.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/env.h"
#include "causeway/base/fault_injection.h"
#include "causeway/base/status.h"
#include "causeway/distributed/island_server.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/memory.h"
#include "causeway/runtime/runtime.h"
#include "causeway/transport/auth.h"
#include "causeway/transport/launch.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace causeway::cli {
namespace {

using ::causeway::transport::IslandRegistry;
using ::causeway::transport::IslandServer;
using ::causeway::transport::IslandServerOptions;

constexpr char kUsage[] =
    "usage: causeway island [--listen HOST:PORT] [--name NAME] [--secret-file FILE]\n"
    "                       [--coordinator HOST:PORT --num-processes N --process-id I] [flags]\n"
    "\n"
    "Hosts one island behind a socket until SIGINT or SIGTERM: controllers connect to\n"
    "it, and it exchanges values with other islands directly. Listens on loopback\n"
    "unless told otherwise; any other address needs a shared secret (--secret-file, a\n"
    "file only its owner can read, or CAUSEWAY_SECRET), which every peer must prove.\n"
    "Prints 'island NAME ADDRESS' on stdout once it serves.\n\n";

// How long an island that was told to stop lets its devices finish their
// work; then what still runs is taken out of service (quarantined), and its
// accelerator abandoned a second later, so that stopping never waits for a
// wedged device.
constexpr absl::Duration kStopGrace = absl::Seconds(2);

// Destroys the server (its sessions fail their runs and wait for their jobs)
// and then the runtime, never for longer than about `grace` plus
// Accelerator::kAbandonAfter: an accelerator whose work has not ended by
// then is quarantined, which fails everything waiting on it, with a line on
// stderr naming it and what it was running.
void TearDownWithin(absl::Duration grace, const std::string& name, std::unique_ptr<IslandServer> server,
                    std::unique_ptr<Runtime> runtime) {
  const absl::Time until = absl::Now() + grace;
  auto quarantine_stuck = [&] {
    for (size_t i = 0; i < runtime->size(); ++i) {
      Accelerator* acc = runtime->accelerator(i);
      if (acc->in_flight() == 0 || acc->quarantined()) continue;
      std::fprintf(stderr,
                   "island '%s': %s still has %zu submissions in flight %s after it was told to stop; "
                   "quarantined, so that the island can stop\n",
                   name.c_str(), acc->name().c_str(), acc->in_flight(), absl::FormatDuration(grace).c_str());
      acc->Quarantine(absl::StrCat("island '", name, "' is stopping, and its work had not ended ",
                                   absl::FormatDuration(grace), " after it was told to"));
    }
  };
  absl::Notification server_gone;
  std::thread guard([&] {
    if (!server_gone.WaitForNotificationWithDeadline(until)) quarantine_stuck();
  });
  server.reset();
  server_gone.Notify();
  guard.join();
  // Work no session waits for any more (fetches and runs whose controllers
  // left) may still be on the devices.
  for (size_t i = 0; i < runtime->size(); ++i) (void)runtime->accelerator(i)->Flush(until);
  quarantine_stuck();
  runtime.reset();
}

}  // namespace

int IslandCommand(const std::vector<std::string>& args) {
  auto specs = RuntimeFlagSpecs();
  specs.push_back({"listen", "address to serve on (port 0: any free port)", "127.0.0.1:0"});
  specs.push_back({"name",
                   "this island's name (distinct among the islands of a program; default: in a launch "
                   "island-ID, else the address it serves on, HOST:PORT)",
                   ""});
  specs.push_back({"secret-file", "file holding the shared secret (or CAUSEWAY_SECRET)", ""});
  specs.push_back({"coordinator", "launch: the coordinator's HOST:PORT (process 0 serves it)", ""});
  specs.push_back({"num-processes", "launch: how many island processes", ""});
  specs.push_back({"process-id", "launch: this process's id, 0..N-1", ""});
  specs.push_back({"peer-timeout-ms", "a peer silent this long is lost", "5000"});
  specs.push_back({"run-deadline",
                   "the longest a run may take here (e.g. 10m): a run asking for no deadline, or a longer "
                   "one, gets this; past it the run fails and an accelerator its work still holds is "
                   "quarantined",
                   ""});
  specs.push_back({"min-deadline",
                   "the shortest deadline a run may ask for (shorter ones are refused), so that no tenant "
                   "quarantines a shared accelerator with a deadline shorter than a sound kernel takes",
                   ""});
  specs.push_back({"max-handshakes",
                   "connections allowed in their handshake (not yet authenticated) at once; one past it is "
                   "closed as soon as it is accepted",
                   "64"});
  specs.push_back({"max-handshakes-per-address", "the same, from one source address", "16"});
  specs.push_back({"session-host-budget",
                   "host memory each session may make the island hold (uploads coming in, values sent "
                   "before their receives), e.g. 256MiB",
                   "1GiB"});
  Flags flags(specs);
  auto fail = [](const absl::Status& s, int code) { return Fail("island", s, code); };
  if (auto done = StartCommand("island", kUsage, flags, args)) return *done;
  auto runtime_options = RuntimeOptionsFromFlags(flags);
  if (!runtime_options.ok()) return fail(runtime_options.status(), 2);
  auto timeout_ms = flags.Int("peer-timeout-ms");
  if (!timeout_ms.ok() || *timeout_ms < 100 || *timeout_ms > 3'600'000) {
    return fail(absl::InvalidArgumentError("--peer-timeout-ms must be 100..3600000"), 2);
  }

  // Fault injection for tests of a real island process (causeway/base/fault_injection.h).
  if (std::optional<std::string> fault = EnvValue("CAUSEWAY_FAULT"); fault.has_value()) {
    if (absl::Status s = ArmFaultFromString(*fault); !s.ok()) return fail(s, 2);
  }

  IslandServerOptions options;
  for (auto [flag, field] : {std::pair{"run-deadline", &options.island.run_deadline},
                             std::pair{"min-deadline", &options.island.min_deadline}}) {
    if (!flags.Has(flag)) continue;
    auto d = flags.Duration(flag);
    if (!d.ok()) return fail(d.status(), 2);
    *field = *d;
  }
  if (options.island.min_deadline > options.island.run_deadline) {
    return fail(
        absl::InvalidArgumentError(absl::StrCat(
            "--min-deadline (", absl::FormatDuration(options.island.min_deadline),
            ") is longer than --run-deadline (", absl::FormatDuration(options.island.run_deadline), ")")),
        2);
  }
  for (auto [flag, field] :
       {std::pair{"max-handshakes", &options.max_unauthenticated},
        std::pair{"max-handshakes-per-address", &options.max_unauthenticated_per_address}}) {
    auto n = flags.Int(flag);
    if (!n.ok() || *n < 1 || *n > 100'000) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--", flag, " must be 1..100000")), 2);
    }
    *field = static_cast<int>(*n);
  }
  auto host_budget = ParseByteSize(flags.Get("session-host-budget"));
  if (!host_budget.ok()) {
    return fail(
        absl::InvalidArgumentError(absl::StrCat("--session-host-budget: ", host_budget.status().message())),
        2);
  }
  options.session_host_budget = *host_budget;
  options.listen = flags.Get("listen");
  options.connection.peer_timeout = absl::Milliseconds(*timeout_ms);
  options.connection.heartbeat_interval = std::min(absl::Seconds(1), options.connection.peer_timeout / 5);
  auto secret = SecretFromFlags(flags);
  if (!secret.ok()) return fail(secret.status(), 2);
  options.secret = *std::move(secret);

  transport::LaunchFlags launch_flags;
  if (flags.Has("coordinator")) launch_flags.coordinator = flags.Get("coordinator");
  if (flags.Has("num-processes")) launch_flags.num_processes = flags.Get("num-processes");
  if (flags.Has("process-id")) launch_flags.process_id = flags.Get("process-id");
  auto launch = transport::DetectLaunch(launch_flags);
  if (!launch.ok()) return fail(launch.status(), 2);
  std::optional<IslandRegistry> registry;
  if (launch->has_value() && (*launch)->process_id == 0) {
    registry.emplace((*launch)->num_processes);
    options.registry = &*registry;
  }
  // Unnamed, the server names itself by its address: islands started
  // without names still have distinct ones.
  options.name = flags.Get("name");
  if (options.name.empty() && launch->has_value()) {
    options.name = absl::StrCat("island-", (*launch)->process_id);
  }

  // Stop on SIGINT/SIGTERM: block them here (threads inherit the mask) and
  // wait for them on a thread of their own.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Written when the island stops (SIGTERM, SIGINT).
  auto trace = flags.StartTrace();
  if (!trace.ok()) return fail(trace.status(), 2);
  auto runtime = Runtime::Create(*runtime_options);
  if (!runtime.ok()) return fail(runtime.status(), 1);
  auto server = IslandServer::Create(runtime->get(), options);
  if (!server.ok()) return fail(server.status(), 1);
  const std::string address = (*server)->advertised_address();

  if (launch->has_value()) {
    transport::RegisterIsland me;
    me.set_process_id((*launch)->process_id);
    me.set_num_processes((*launch)->num_processes);
    me.set_name((*server)->name());
    me.set_address(address);
    if (registry.has_value()) {
      transport::Request request;
      *request.mutable_register_island() = me;
      if (auto r = registry->Handle(request); !r.ok()) return fail(r.status(), 1);
    } else {
      transport::ClientHandshakeOptions handshake;
      handshake.name = (*server)->name();
      handshake.secret = options.secret;
      absl::Status registered =
          transport::RegisterWithCoordinator(**launch, me, handshake, absl::Now() + absl::Minutes(2));
      if (!registered.ok()) return fail(registered, 1);
    }
  }
  std::printf("island %s %s\n", (*server)->name().c_str(), address.c_str());
  std::fflush(stdout);

  std::thread stopper([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    (*server)->Shutdown();
  });
  (*server)->Wait();
  // The stopper may still wait for a signal if Shutdown came another way.
  kill(getpid(), SIGTERM);
  stopper.join();
  TearDownWithin(kStopGrace, options.name, std::move(*server), std::move(*runtime));
  return 0;
}

}  // namespace causeway::cli
