// Launch and rendezvous of a multi-process deployment, as jax.distributed
// does it: each island process learns from its launcher (Slurm, Open MPI, a
// torchrun-style launcher, or flags) which process it is, how many there are
// and where the coordinator listens; process 0 is the coordinator, with which
// the others register, and from which a controller learns every island's
// address.
//
//   process i:   DetectLaunch -> serve its island at its address
//                -> RegisterWithCoordinator(config, {name, address})
//   process 0:   also answers RegisterIsland / ListIslands with an
//                IslandRegistry
//   controller:  WaitForIslands(config.coordinator) -> every island's address
//
// Example (an island process):
//   CAUSEWAY_ASSIGN_OR_RETURN(std::optional<LaunchConfig> launch, DetectLaunch(launch_flags));
//   if (launch.has_value()) {
//     RegisterIsland me;
//     me.set_name("island-3");
//     me.set_address(listen_address.ToString());
//     CAUSEWAY_RETURN_IF_ERROR(RegisterWithCoordinator(*launch, me, client_options,
//                                             absl::Now() + absl::Minutes(5)));
//   }
#ifndef CAUSEWAY_TRANSPORT_LAUNCH_H_
#define CAUSEWAY_TRANSPORT_LAUNCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "causeway/transport/control.pb.h"
#include "causeway/transport/handshake.h"
#include "causeway/transport/socket.h"

namespace causeway::transport {

// The coordinator's port when the launcher gives a host but no port (Slurm,
// or torchrun-style without MASTER_PORT) and CAUSEWAY_COORDINATOR_PORT is
// unset.
inline constexpr uint16_t kDefaultCoordinatorPort = 7477;
// The most processes a launch may have.
inline constexpr int kMaxLaunchProcesses = 65536;

// One process's place in a launch.
struct LaunchConfig {
  // Where process 0 serves the registry (numeric; resolved by DetectLaunch).
  SocketAddress coordinator;
  // The coordinator as it was given, e.g. "node01:7477", for messages.
  std::string coordinator_name;
  int num_processes = 0;
  // 0 <= process_id < num_processes; process 0 is the coordinator.
  int process_id = 0;
  // Where the process id came from: "flags", "CAUSEWAY_*", "slurm",
  // "openmpi" or "torchrun". (The coordinator and the count may come from a
  // higher-precedence source; see DetectLaunch.)
  std::string source;
};

// "process 2 of 4 (slurm), coordinator node01:7477 (10.0.0.1:7477)".
std::string DescribeLaunch(const LaunchConfig& config);

// The launch flags of `causeway island`, as typed: unset when not given.
struct LaunchFlags {
  std::optional<std::string> coordinator;    // --coordinator HOST:PORT
  std::optional<std::string> num_processes;  // --num-processes N
  std::optional<std::string> process_id;     // --process-id I
};

// Reads an environment variable: nullopt when unset.
using GetenvFunction = std::function<std::optional<std::string>(const char*)>;

// Finds out whether this process is one of a launch, and which.
//
// Each of the three values (coordinator, number of processes, process id) is
// taken from the first of these that gives it:
//   1. the flags;
//   2. CAUSEWAY_COORDINATOR (host:port), CAUSEWAY_NUM_PROCESSES,
//      CAUSEWAY_PROCESS_ID;
//   3. the launcher, the first of these present:
//      slurm     SLURM_PROCID; SLURM_NTASKS (else SLURM_NPROCS); coordinator
//                host: the first host of SLURM_STEP_NODELIST (else
//                SLURM_JOB_NODELIST), which is where task 0 runs under the
//                default distribution; port: CAUSEWAY_COORDINATOR_PORT, else
//                7477. Skipped when OMPI_COMM_WORLD_RANK or
//                TORCHELASTIC_RUN_ID is set: mpirun or torchrun started this
//                process inside a Slurm job, and the SLURM_* variables then
//                describe their task, not this process.
//      openmpi   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE; no coordinator
//                (Open MPI gives no address that process 0 listens at).
//      torchrun  RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (else
//                CAUSEWAY_COORDINATOR_PORT, else 7477): torchrun, a
//                Kubernetes indexed job, or anything that sets these.
// A variable set to "" counts as unset. With none of the flags, none of the
// CAUSEWAY_* variables and no launcher, there is no launch: nullopt (this
// process is a single island on its own).
//
// Errors (InvalidArgument, each naming the flag or variable and its value):
//   a number that is not all decimal digits, a count outside 1..65536, a
//   process id not below the count, a coordinator that is not host:port or
//   has port 0, a malformed Slurm host list; and a launch that is
//   incomplete: e.g. under Open MPI without CAUSEWAY_COORDINATOR or
//   --coordinator, or --process-id given with nothing to tell the count.
//   NotFound / Unavailable: the coordinator's host does not resolve.
absl::StatusOr<std::optional<LaunchConfig>> DetectLaunch(const LaunchFlags& flags,
                                                         const GetenvFunction& getenv);
// The same, reading this process's environment.
absl::StatusOr<std::optional<LaunchConfig>> DetectLaunch(const LaunchFlags& flags);

// Expands a Slurm host list, in order: "node[01-03,7],gpu-a[1-2]" ->
// node01 node02 node03 node7 gpu-a1 gpu-a2. Groups are separated by commas
// outside brackets; each bracket holds numbers and lo-hi ranges, padded with
// zeros to the width of `lo` as written; several brackets in one group
// expand as a product ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2), and text may
// follow a bracket ("n[1-2].ib" -> n1.ib n2.ib).
// InvalidArgument, quoting the expression and saying what is wrong, for an
// empty expression or group, unbalanced or nested brackets, a range whose
// hi is below its lo, anything but digits in a range, a character no host
// name has, or more than 65536 hosts.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view expression);

// The coordinator's record of the island processes of one launch: it answers
// RegisterIsland and ListIslands (control.proto).
//
// Registration rules:
//   - num_processes must be 1..65536 and agree with the launch's: the one
//     given at construction, else the one of the first registration.
//   - process_id must be below it; the address must be "host:port" (not
//     resolved here) and the name valid (CheckPeerName).
//   - A process id may register again with the same address (a retry after
//     a lost answer, or an island restarted in place); its name is updated.
//     A different address for a registered id is refused (AlreadyExists):
//     two live processes claiming one id is the usual sign of a misconfigured
//     launch (e.g. every rank reading the same SLURM_PROCID), and silently
//     taking either would split the deployment. To move an island to a new
//     address, restart the launch (the coordinator with it).
//
// Thread-safe; Handle never blocks on anything but a short internal lock, so
// it can run on a connection's reader thread (connection.h).
class IslandRegistry {
 public:
  // `num_processes`: the launch's count when the coordinator knows it (its
  // own LaunchConfig); otherwise the first registration sets it.
  explicit IslandRegistry(std::optional<int> num_processes = std::nullopt);

  IslandRegistry(const IslandRegistry&) = delete;
  IslandRegistry& operator=(const IslandRegistry&) = delete;

  // Answers register_island with `ok` and list_islands with `island_list`
  // (islands by process id). Errors: InvalidArgument for a registration
  // that breaks the rules above (FailedPrecondition for a num_processes that
  // disagrees with the launch's, AlreadyExists for a taken id); Unimplemented
  // for any other request kind.
  absl::StatusOr<Response> Handle(const Request& request);

  // What list_islands answers.
  IslandList List() const;

 private:
  absl::Status Register(const RegisterIsland& island);

  mutable absl::Mutex mu_;
  int num_processes_ ABSL_GUARDED_BY(mu_) = 0;  // 0 = not known yet
  std::map<int, RegisterIsland> islands_ ABSL_GUARDED_BY(mu_);
};

// Registers this process with the coordinator of `config`: connects (the
// coordinator may not listen yet, so refused and timed-out attempts are
// retried with growing pauses until `deadline`), sends `me` as a
// register_island, and closes. `me` gives the name and address; its
// process_id and num_processes are taken from `config`. Process 0 may
// register this way too (with itself), or call its registry's Handle.
//
// Errors:
//   DeadlineExceeded  not registered by `deadline`: names the coordinator,
//                     the number of attempts and the last failure.
//   the coordinator's error  the registry refused (AlreadyExists,
//                     FailedPrecondition, InvalidArgument, Unimplemented when
//                     no registry answers there) or the handshake failed for
//                     a reason retrying cannot fix (a secret mismatch):
//                     returned at once, prefixed with the coordinator.
absl::Status RegisterWithCoordinator(const LaunchConfig& config, const RegisterIsland& me,
                                     const ClientHandshakeOptions& handshake, absl::Time deadline);

// Waits until every process of the launch has registered with the
// coordinator at `coordinator`, polling list_islands (and connecting, again
// if need be, with retries as above); returns the islands by process id.
//
// Errors:
//   DeadlineExceeded  not all registered by `deadline`: "3 of 4 island
//                     processes registered ...; missing process ids: 2", or
//                     that the coordinator could not be reached, with the
//                     last failure.
//   the coordinator's error  as for RegisterWithCoordinator.
absl::StatusOr<std::vector<RegisterIsland>> WaitForIslands(const SocketAddress& coordinator,
                                                           const ClientHandshakeOptions& handshake,
                                                           absl::Time deadline);

}  // namespace causeway::transport

#endif  // CAUSEWAY_TRANSPORT_LAUNCH_H_
