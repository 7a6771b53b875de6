// causeway launch: starts N island processes on this machine, for
// development, as a multi-process launcher (srun, mpirun, torchrun) would on
// a cluster.
//
// Island i is this same binary (/proc/self/exe) run as
//   causeway island --listen HOST:P+i --name island-i --coordinator HOST:P
//                   --num-processes N --process-id i [flags after --]
// so island 0 serves at the coordinator's address. Each island runs in a
// process group of its own, with stdin from /dev/null and a parent-death
// signal (SIGTERM), so that it neither takes the terminal's Ctrl-C twice
// (launch forwards it) nor outlives a launcher that was killed.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/base/subprocess.h"
#include "causeway/transport/socket.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace causeway::cli {
namespace {

using ::causeway::transport::Socket;
using ::causeway::transport::SocketAddress;

constexpr int kMaxIslands = 256;
// How long islands asked to stop have before they are killed.
constexpr absl::Duration kStopGrace = absl::Seconds(10);

constexpr char kUsage[] =
    "usage: causeway launch -n N [--base-port P] [--host HOST] [-- ISLAND_FLAGS...]\n"
    "\n"
    "Starts N island processes on this machine, for development. Island i runs\n"
    "  causeway island --listen HOST:P+i --name island-i --coordinator HOST:P\n"
    "                  --num-processes N --process-id i ISLAND_FLAGS...\n"
    "so island 0 is the coordinator. Prints 'island I ADDRESS' for each island and\n"
    "'coordinator ADDRESS' once all have started. SIGINT, SIGTERM and SIGHUP are\n"
    "passed on to the islands. If an island fails, the others are stopped (SIGTERM,\n"
    "then SIGKILL after 10 s) and launch exits 1; it exits 0 when every island ends\n"
    "cleanly, and 128+SIG after passing on signal SIG.\n"
    "\n"
    "--trace FILE traces every island: island i writes FILE with '.island-i' before\n"
    "its extension (run.json: run.island-0.json, ...) when it exits.\n"
    "\n";

// Island i's trace file: FILE with ".island-i" before its extension.
std::string IslandTracePath(const std::string& trace, int id) {
  size_t slash = trace.rfind('/');
  size_t dot = trace.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) dot = trace.size();
  return absl::StrCat(trace.substr(0, dot), ".island-", id, trace.substr(dot));
}

struct Child {
  int id = 0;
  std::string name;     // "island-3"
  std::string address;  // where it listens
  Subprocess process;
};

std::string Message(const absl::Status& status) { return std::string(status.message()); }

int UsageError(const std::string& message) {
  std::fprintf(stderr, "causeway launch: %s\n(see causeway launch --help)\n", message.c_str());
  return 2;
}

// "host:port", with brackets around an IPv6 address.
std::string JoinHostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "["))
    return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

// The lower end of the kernel's ephemeral port range, which outgoing
// connections take their ports from.
int EphemeralPortFloor() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (range >> lo >> hi && lo > 1024) return lo;
  return 32768;
}

// A base port P such that P..P+n-1 are free on `host` now. Chosen below the
// ephemeral range, so that the islands' own outgoing connections cannot take
// one of these ports before the island that should listen there does.
absl::StatusOr<int> PickBasePort(const std::string& host, int n) {
  int hi = EphemeralPortFloor() - n;
  int lo = std::min(20000, hi - 1000);
  if (lo < 1024) {
    lo = 1024;
    hi = 65535 - n + 1;
  }
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(lo, hi);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int base = pick(random);
    std::vector<Socket> held;
    bool free = true;
    for (int i = 0; i < n && free; ++i) {
      absl::StatusOr<SocketAddress> address = SocketAddress::Parse(JoinHostPort(host, base + i));
      if (!address.ok()) return address.status();
      absl::StatusOr<Socket> socket = Socket::Listen(*address, 1);
      free = socket.ok();
      if (free) held.push_back(*std::move(socket));
    }
    if (free) return base;  // `held` closes them
  }
  return absl::UnavailableError(absl::StrCat("found no ", n, " consecutive free ports on ", host, " in ", lo,
                                             "..", hi + n - 1, "; pass --base-port"));
}

// Starts `child` with `argv` (this program again); the signal mask `mask`
// is restored in it.
absl::Status Spawn(Child& child, const std::vector<std::string>& argv, const sigset_t& mask) {
  SpawnOptions options;
  options.program = "/proc/self/exe";
  options.argv = argv;
  // Its own group: a terminal's ^C reaches launch, which passes it on.
  options.new_process_group = true;
  options.death_signal = SIGTERM;
  options.signal_mask = mask;
  CAUSEWAY_ASSIGN_OR_RETURN(child.process, Subprocess::Spawn(options));
  return absl::OkStatus();
}

void SignalRunning(std::vector<Child>& children, int signal) {
  for (Child& child : children) child.process.Signal(signal);
}

// Waits for every running child, passing on `signals`; stops them all when
// one fails. Returns the exit code of launch.
int Supervise(std::vector<Child>& children, const sigset_t& signals, bool stopping) {
  int live = static_cast<int>(
      std::count_if(children.begin(), children.end(), [](const Child& c) { return c.process.running(); }));
  bool failed = stopping;  // a start failed: the others are being stopped
  int forwarded = 0;       // the first signal passed on
  bool killed = false;
  absl::Time kill_at = stopping ? absl::Now() + kStopGrace : absl::InfiniteFuture();

  while (live > 0) {
    const absl::Duration wait =
        std::clamp(kill_at - absl::Now(), absl::Milliseconds(1), absl::Milliseconds(500));
    const timespec timeout = absl::ToTimespec(wait);
    siginfo_t info;
    const int signal = sigtimedwait(&signals, &info, &timeout);
    if (signal == SIGINT || signal == SIGTERM || signal == SIGHUP) {
      if (forwarded == 0) {
        forwarded = signal;
        std::fprintf(stderr, "causeway launch: got %s; passing it to the islands\n", strsignal(signal));
        if (kill_at == absl::InfiniteFuture()) kill_at = absl::Now() + kStopGrace;
      }
      SignalRunning(children, signal);
    }
    // Reap whatever has ended (SIGCHLD, or anything missed).
    for (Child& child : children) {
      if (!child.process.running()) continue;
      absl::StatusOr<int> ended = child.process.Wait(absl::InfinitePast());
      if (!ended.ok()) continue;  // still running
      --live;
      const int status = *ended;
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (clean) continue;
      if (!failed && forwarded == 0) {
        failed = true;
        std::fprintf(stderr, "causeway launch: %s (%s) ended (%s); stopping the other islands\n",
                     child.name.c_str(), child.address.c_str(), DescribeWaitStatus(status).c_str());
        SignalRunning(children, SIGTERM);
        kill_at = absl::Now() + kStopGrace;
      }
    }
    if (live > 0 && !killed && absl::Now() >= kill_at) {
      std::fprintf(stderr,
                   "causeway launch: %d island(s) still running %s after being asked to stop; killing\n",
                   live, absl::FormatDuration(kStopGrace).c_str());
      SignalRunning(children, SIGKILL);
      killed = true;
    }
  }
  if (failed) return 1;
  if (forwarded != 0) return 128 + forwarded;
  return 0;
}

// Starts the islands and supervises them, with the launch signals blocked
// throughout (and taken with sigtimedwait); restores the mask after.
int Run(std::vector<Child>& children, const std::string& coordinator, int n,
        const std::vector<std::string>& extra, const std::string& trace) {
  sigset_t signals, old_mask;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&signals, s);
  sigprocmask(SIG_BLOCK, &signals, &old_mask);
  std::fflush(stdout);
  std::fflush(stderr);

  bool started = true;
  for (Child& child : children) {
    std::vector<std::string> argv = {"causeway",      "island",       "--listen",
                                     child.address,   "--name",       child.name,
                                     "--coordinator", coordinator,    "--num-processes",
                                     absl::StrCat(n), "--process-id", absl::StrCat(child.id)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (!trace.empty()) argv.push_back(absl::StrCat("--trace=", IslandTracePath(trace, child.id)));
    if (absl::Status status = Spawn(child, argv, old_mask); !status.ok()) {
      std::fprintf(stderr, "causeway launch: could not start %s: %s; stopping the other islands\n",
                   child.name.c_str(), Message(status).c_str());
      started = false;
      break;
    }
  }
  if (started) {
    for (const Child& child : children) std::printf("island %d %s\n", child.id, child.address.c_str());
    std::printf("coordinator %s\n", coordinator.c_str());
    std::fflush(stdout);
  } else {
    SignalRunning(children, SIGTERM);
  }
  int code = Supervise(children, signals, /*stopping=*/!started);
  if (!started) code = 1;

  // Take signals that came after the last wait, so that unblocking them
  // does not end launch now.
  const timespec zero = {0, 0};
  while (sigtimedwait(&signals, nullptr, &zero) > 0) {
  }
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  return code;
}

}  // namespace

int LaunchCommand(const std::vector<std::string>& args) {
  // Launch's own flags, then after "--" the islands'.
  std::vector<std::string> own;
  std::vector<std::string> extra;
  bool past_separator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (past_separator) {
      extra.push_back(a);
    } else if (a == "--") {
      past_separator = true;
    } else if (a == "-n") {
      own.push_back("--num-islands");
    } else if (absl::StartsWith(a, "-n") && !absl::StartsWith(a, "--")) {
      own.push_back(absl::StrCat("--num-islands=", a.substr(2)));
    } else {
      own.push_back(a);
    }
  }

  Flags flags({
      {"num-islands", "how many island processes to start; also -n N (required)", ""},
      {"base-port",
       "island i listens at HOST:P+i, island 0 (the coordinator) at HOST:P (default: a free range)", ""},
      {"host", "the address every island listens at", "127.0.0.1"},
  });
  if (auto done = StartCommand("launch", kUsage, flags, own, {0, "", "flags for the islands go after --"})) {
    return *done;
  }
  if (!flags.Has("num-islands")) return UsageError("-n N, how many islands to start, is required");
  absl::StatusOr<int64_t> n = flags.Int("num-islands");
  if (!n.ok()) return UsageError(Message(n.status()));
  if (*n < 1 || *n > kMaxIslands) {
    return UsageError(absl::StrCat("-n must be from 1 to ", kMaxIslands, ", got ", *n));
  }
  const int count = static_cast<int>(*n);

  const std::string host = flags.Get("host");
  if (absl::StatusOr<SocketAddress> check = SocketAddress::Parse(JoinHostPort(host, 0)); !check.ok()) {
    return UsageError(absl::StrCat("--host '", host, "': ", Message(check.status())));
  }
  int base = 0;
  if (flags.Has("base-port")) {
    absl::StatusOr<int64_t> port = flags.Int("base-port");
    if (!port.ok()) return UsageError(Message(port.status()));
    if (*port < 1 || *port + count - 1 > 65535) {
      return UsageError(absl::StrCat("--base-port must be from 1 to ", 65535 - count + 1, " for ", count,
                                     " islands, got ", *port));
    }
    base = static_cast<int>(*port);
  } else {
    absl::StatusOr<int> picked = PickBasePort(host, count);
    if (!picked.ok()) {
      std::fprintf(stderr, "causeway launch: %s\n", Message(picked.status()).c_str());
      return 1;
    }
    base = *picked;
  }

  // Addresses as numbers, so that every island and the output agree.
  std::vector<Child> children(count);
  std::string coordinator;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<SocketAddress> address = SocketAddress::Parse(JoinHostPort(host, base + i));
    if (!address.ok()) return UsageError(absl::StrCat("--host '", host, "': ", Message(address.status())));
    children[i].id = i;
    children[i].name = absl::StrCat("island-", i);
    children[i].address = address->ToString();
  }
  coordinator = children[0].address;
  return Run(children, coordinator, count, extra, flags.Get("trace"));
}

}  // namespace causeway::cli
