#include "causeway/transport/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/transport/connection.h"
#include "causeway/transport/control.pb.h"
#include "causeway/transport/handshake.h"
#include "causeway/transport/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"

namespace causeway::transport {
namespace {

using ::causeway::testing::RunConcurrently;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::In;

using Vars = std::map<std::string, std::string>;

// An environment holding exactly `vars`.
GetenvFunction Env(Vars vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<std::optional<LaunchConfig>> Detect(Vars vars, LaunchFlags flags = {}) {
  return DetectLaunch(flags, Env(std::move(vars)));
}

// The launch detected from `vars` and `flags`, which must be one.
LaunchConfig MustDetect(Vars vars, LaunchFlags flags = {}) {
  absl::StatusOr<std::optional<LaunchConfig>> config = Detect(std::move(vars), std::move(flags));
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return {};
  EXPECT_TRUE(config->has_value()) << "no launch detected";
  return config->value_or(LaunchConfig{});
}

// The error of detecting from `vars` and `flags`, which must fail.
absl::Status DetectError(Vars vars, LaunchFlags flags = {}) {
  absl::StatusOr<std::optional<LaunchConfig>> config = Detect(std::move(vars), std::move(flags));
  EXPECT_FALSE(config.ok()) << "detected "
                            << (config.ok() && config->has_value() ? DescribeLaunch(**config) : "none");
  return config.status();
}

Vars SlurmVars() {
  return {{"SLURM_PROCID", "2"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_STEP_NODELIST", "localhost,node[02-04]"},
          {"SLURM_JOB_NODELIST", "other[1-9]"}};
}

// --- Detection --------------------------------------------------------------

// Tests that no flags, no CAUSEWAY_* variables and no launcher mean no launch,
// even with variables that do not start one (a salloc shell, a port).
TEST(DetectLaunchTest, NothingMeansNoLaunch) {
  ASSERT_OK_AND_ASSIGN(std::optional<LaunchConfig> none, Detect({}));
  EXPECT_FALSE(none.has_value());
  ASSERT_OK_AND_ASSIGN(std::optional<LaunchConfig> also_none, Detect({{"SLURM_JOB_NODELIST", "node[1-4]"},
                                                                      {"SLURM_NTASKS", "4"},
                                                                      {"CAUSEWAY_COORDINATOR_PORT", "9000"},
                                                                      {"CAUSEWAY_PROCESS_ID", ""}}));
  EXPECT_FALSE(also_none.has_value());
}

// Tests Slurm: id, count, and the coordinator at the first host of the step's
// node list on the default port.
TEST(DetectLaunchTest, Slurm) {
  LaunchConfig config = MustDetect(SlurmVars());
  EXPECT_EQ(config.source, "slurm");
  EXPECT_EQ(config.process_id, 2);
  EXPECT_EQ(config.num_processes, 4);
  EXPECT_EQ(config.coordinator_name, "localhost:7477");
  EXPECT_EQ(config.coordinator.ToString(), "127.0.0.1:7477");
  EXPECT_EQ(DescribeLaunch(config), "process 2 of 4 (slurm), coordinator localhost:7477 (127.0.0.1:7477)");
}

// Tests the Slurm fallbacks: SLURM_NPROCS for the count, SLURM_JOB_NODELIST
// for the hosts, and CAUSEWAY_COORDINATOR_PORT for the port.
TEST(DetectLaunchTest, SlurmFallbacks) {
  LaunchConfig config = MustDetect({{"SLURM_PROCID", "0"},
                                    {"SLURM_NPROCS", "3"},
                                    {"SLURM_JOB_NODELIST", "127.0.0.1,node[1-2]"},
                                    {"CAUSEWAY_COORDINATOR_PORT", "9123"}});
  EXPECT_EQ(config.source, "slurm");
  EXPECT_EQ(config.process_id, 0);
  EXPECT_EQ(config.num_processes, 3);
  EXPECT_EQ(config.coordinator.ToString(), "127.0.0.1:9123");
}

// Tests that the Slurm coordinator is the first host of the expanded list,
// zero padding kept: the (unresolvable) name in the error shows which host
// was taken.
TEST(DetectLaunchTest, SlurmCoordinatorIsTheFirstExpandedHost) {
  absl::Status status =
      DetectError({{"SLURM_PROCID", "1"},
                   {"SLURM_NTASKS", "6"},
                   {"SLURM_STEP_NODELIST", "nosuch-causeway[007-009,12].invalid,gpu[1-2]"}});
  EXPECT_THAT(std::string(status.message()), HasSubstr("nosuch-causeway007.invalid:7477"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("SLURM_STEP_NODELIST"));
  EXPECT_NE(status.code(), absl::StatusCode::kOk);
}

// Tests that a malformed Slurm node list is an error naming the variable.
TEST(DetectLaunchTest, SlurmBadNodeList) {
  Vars vars = SlurmVars();
  vars["SLURM_STEP_NODELIST"] = "node[01-03";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "SLURM_STEP_NODELIST", "node[01-03",
               "'[' without ']'");
  vars.erase("SLURM_STEP_NODELIST");
  vars.erase("SLURM_JOB_NODELIST");
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "SLURM_STEP_NODELIST",
               "SLURM_JOB_NODELIST", "CAUSEWAY_COORDINATOR");
}

// Tests that Slurm values out of range are errors naming the variables.
TEST(DetectLaunchTest, SlurmRankNotBelowSize) {
  Vars vars = SlurmVars();
  vars["SLURM_PROCID"] = "4";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "SLURM_PROCID=4", "SLURM_NTASKS=4");
  vars = SlurmVars();
  vars["CAUSEWAY_COORDINATOR_PORT"] = "70000";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "CAUSEWAY_COORDINATOR_PORT=70000");
  vars["CAUSEWAY_COORDINATOR_PORT"] = "0";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "CAUSEWAY_COORDINATOR_PORT=0");
  vars = SlurmVars();
  vars.erase("SLURM_NTASKS");
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "SLURM_NTASKS", "--num-processes",
               "CAUSEWAY_NUM_PROCESSES");
}

// Tests that CAUSEWAY_* variables override Slurm's, each on its own, and that
// a Slurm value overridden is not read (a bad node list does not matter).
TEST(DetectLaunchTest, CausewayVariablesOverrideSlurm) {
  Vars vars = SlurmVars();
  vars["CAUSEWAY_PROCESS_ID"] = "3";
  vars["CAUSEWAY_NUM_PROCESSES"] = "5";
  vars["CAUSEWAY_COORDINATOR"] = "127.0.0.1:6000";
  LaunchConfig config = MustDetect(vars);
  EXPECT_EQ(config.source, "CAUSEWAY_*");
  EXPECT_EQ(config.process_id, 3);
  EXPECT_EQ(config.num_processes, 5);
  EXPECT_EQ(config.coordinator.ToString(), "127.0.0.1:6000");

  Vars partial = SlurmVars();
  partial["SLURM_STEP_NODELIST"] = "bad[";
  partial["CAUSEWAY_COORDINATOR"] = "localhost:6001";
  LaunchConfig mixed = MustDetect(partial);
  EXPECT_EQ(mixed.source, "slurm");
  EXPECT_EQ(mixed.process_id, 2);
  EXPECT_EQ(mixed.num_processes, 4);
  EXPECT_EQ(mixed.coordinator.ToString(), "127.0.0.1:6001");
}

// Tests Open MPI with the coordinator from CAUSEWAY_COORDINATOR, and from the
// flag.
TEST(DetectLaunchTest, OpenMpiWithCoordinator) {
  Vars vars = {{"OMPI_COMM_WORLD_RANK", "5"},
               {"OMPI_COMM_WORLD_SIZE", "8"},
               {"CAUSEWAY_COORDINATOR", "127.0.0.1:6000"}};
  LaunchConfig config = MustDetect(vars);
  EXPECT_EQ(config.source, "openmpi");
  EXPECT_EQ(config.process_id, 5);
  EXPECT_EQ(config.num_processes, 8);
  EXPECT_EQ(config.coordinator.ToString(), "127.0.0.1:6000");

  vars.erase("CAUSEWAY_COORDINATOR");
  LaunchFlags flags;
  flags.coordinator = "127.0.0.1:6002";
  LaunchConfig by_flag = MustDetect(vars, flags);
  EXPECT_EQ(by_flag.source, "openmpi");
  EXPECT_EQ(by_flag.coordinator.ToString(), "127.0.0.1:6002");
}

// Tests that Open MPI without a coordinator address is an error that says
// where to give one.
TEST(DetectLaunchTest, OpenMpiWithoutCoordinator) {
  EXPECT_ERROR(DetectError({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
               absl::StatusCode::kInvalidArgument, "Open MPI", "no coordinator", "CAUSEWAY_COORDINATOR",
               "--coordinator");
}

// Tests that mpirun inside a Slurm job takes Open MPI's rank, not the
// SLURM_PROCID every rank inherits from mpirun.
TEST(DetectLaunchTest, MpirunInsideSlurmUsesOpenMpi) {
  Vars vars = SlurmVars();
  vars["OMPI_COMM_WORLD_RANK"] = "6";
  vars["OMPI_COMM_WORLD_SIZE"] = "8";
  vars["CAUSEWAY_COORDINATOR"] = "127.0.0.1:6000";
  LaunchConfig config = MustDetect(vars);
  EXPECT_EQ(config.source, "openmpi");
  EXPECT_EQ(config.process_id, 6);
  EXPECT_EQ(config.num_processes, 8);
}

// Tests torchrun-style variables, with and without MASTER_PORT, and torchrun
// started by srun.
TEST(DetectLaunchTest, Torchrun) {
  Vars vars = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}};
  LaunchConfig config = MustDetect(vars);
  EXPECT_EQ(config.source, "torchrun");
  EXPECT_EQ(config.process_id, 1);
  EXPECT_EQ(config.num_processes, 2);
  EXPECT_EQ(config.coordinator.ToString(), "127.0.0.1:29500");

  vars.erase("MASTER_PORT");
  EXPECT_EQ(MustDetect(vars).coordinator.ToString(), "127.0.0.1:7477");

  Vars nested = SlurmVars();
  nested.insert(vars.begin(), vars.end());
  nested["TORCHELASTIC_RUN_ID"] = "none";
  LaunchConfig under_srun = MustDetect(nested);
  EXPECT_EQ(under_srun.source, "torchrun");
  EXPECT_EQ(under_srun.process_id, 1);
  EXPECT_EQ(under_srun.num_processes, 2);
}

// Tests that malformed torchrun-style values are errors naming the variable.
TEST(DetectLaunchTest, TorchrunMalformed) {
  Vars good = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}};
  Vars vars = good;
  vars["MASTER_PORT"] = "99999";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "MASTER_PORT=99999");
  vars["MASTER_PORT"] = "29x";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "MASTER_PORT=29x");
  vars = good;
  vars["RANK"] = "one";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "RANK=one", "decimal");
  vars = good;
  vars["RANK"] = "2";
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "RANK=2", "WORLD_SIZE=2");
  vars = good;
  vars.erase("MASTER_ADDR");
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "MASTER_ADDR", "CAUSEWAY_COORDINATOR");
  vars = good;
  vars.erase("RANK");
  EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, "RANK", "--process-id");
}

// Tests that flags override every environment value, and that partial flags
// are completed from the environment.
TEST(DetectLaunchTest, FlagsOverrideEnvironment) {
  Vars vars = SlurmVars();
  vars["CAUSEWAY_PROCESS_ID"] = "3";
  vars["CAUSEWAY_NUM_PROCESSES"] = "5";
  vars["CAUSEWAY_COORDINATOR"] = "127.0.0.1:6000";
  LaunchFlags flags;
  flags.process_id = "1";
  flags.num_processes = "7";
  flags.coordinator = "127.0.0.1:7000";
  LaunchConfig config = MustDetect(vars, flags);
  EXPECT_EQ(config.source, "flags");
  EXPECT_EQ(config.process_id, 1);
  EXPECT_EQ(config.num_processes, 7);
  EXPECT_EQ(config.coordinator.ToString(), "127.0.0.1:7000");

  LaunchFlags only_id;
  only_id.process_id = "0";
  LaunchConfig partial = MustDetect(SlurmVars(), only_id);
  EXPECT_EQ(partial.source, "flags");
  EXPECT_EQ(partial.process_id, 0);
  EXPECT_EQ(partial.num_processes, 4);
  EXPECT_EQ(partial.coordinator.ToString(), "127.0.0.1:7477");

  // Flags alone, complete.
  LaunchConfig alone = MustDetect({}, flags);
  EXPECT_EQ(alone.num_processes, 7);
}

// Tests that flags that do not make a launch with the environment say what
// is missing.
TEST(DetectLaunchTest, IncompleteFlags) {
  LaunchFlags flags;
  flags.process_id = "1";
  flags.coordinator = "127.0.0.1:7000";
  EXPECT_ERROR(DetectError({}, flags), absl::StatusCode::kInvalidArgument, "--process-id=1",
               "--num-processes", "CAUSEWAY_NUM_PROCESSES", "no launcher");
  LaunchFlags no_coordinator;
  no_coordinator.process_id = "1";
  no_coordinator.num_processes = "2";
  EXPECT_ERROR(DetectError({}, no_coordinator), absl::StatusCode::kInvalidArgument, "no coordinator",
               "--coordinator");
}

// Tests that malformed numbers and addresses are errors naming the variable
// or flag and the value.
TEST(DetectLaunchTest, MalformedValues) {
  Vars base = {{"CAUSEWAY_PROCESS_ID", "0"},
               {"CAUSEWAY_NUM_PROCESSES", "2"},
               {"CAUSEWAY_COORDINATOR", "127.0.0.1:6000"}};
  ASSERT_EQ(MustDetect(base).num_processes, 2);
  struct Case {
    const char* variable;
    const char* value;
    const char* expected;  // in the message
  };
  for (const Case& c : std::vector<Case>{
           {"CAUSEWAY_PROCESS_ID", "x1", "CAUSEWAY_PROCESS_ID=x1"},
           {"CAUSEWAY_PROCESS_ID", "-1", "CAUSEWAY_PROCESS_ID=-1"},
           {"CAUSEWAY_PROCESS_ID", " 1", "CAUSEWAY_PROCESS_ID= 1"},
           {"CAUSEWAY_PROCESS_ID", "1.0", "CAUSEWAY_PROCESS_ID=1.0"},
           {"CAUSEWAY_PROCESS_ID", "2", "CAUSEWAY_NUM_PROCESSES=2"},
           {"CAUSEWAY_PROCESS_ID", "99999999999", "CAUSEWAY_PROCESS_ID=99999999999"},
           {"CAUSEWAY_NUM_PROCESSES", "0", "CAUSEWAY_NUM_PROCESSES=0"},
           {"CAUSEWAY_NUM_PROCESSES", "65537", "CAUSEWAY_NUM_PROCESSES=65537"},
           {"CAUSEWAY_COORDINATOR", "127.0.0.1", "CAUSEWAY_COORDINATOR=127.0.0.1"},
           {"CAUSEWAY_COORDINATOR", "127.0.0.1:0", "fixed port"},
           {"CAUSEWAY_COORDINATOR", "127.0.0.1:65536", "CAUSEWAY_COORDINATOR=127.0.0.1:65536"},
       }) {
    SCOPED_TRACE(absl::StrCat(c.variable, "=", c.value));
    Vars vars = base;
    vars[c.variable] = c.value;
    EXPECT_ERROR(DetectError(vars), absl::StatusCode::kInvalidArgument, c.expected);
  }
  LaunchFlags flags;
  flags.num_processes = "four";
  EXPECT_ERROR(DetectError(base, flags), absl::StatusCode::kInvalidArgument, "--num-processes=four");
}

// --- Host lists ---------------------------------------------------------------

// Tests host list expansion: padding, several ranges, several groups,
// brackets in product, text after a bracket.
TEST(ExpandHostlistTest, Expands) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> hosts, ExpandHostlist("node[01-03,7],gpu-a[1-2]"));
  EXPECT_THAT(hosts, ElementsAre("node01", "node02", "node03", "node7", "gpu-a1", "gpu-a2"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("n[8-11]"));
  EXPECT_THAT(hosts, ElementsAre("n8", "n9", "n10", "n11"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("n[098-101]"));
  EXPECT_THAT(hosts, ElementsAre("n098", "n099", "n100", "n101"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("solo"));
  EXPECT_THAT(hosts, ElementsAre("solo"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("a,b.example.com,c_1"));
  EXPECT_THAT(hosts, ElementsAre("a", "b.example.com", "c_1"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("r[1-2]n[09-10]"));
  EXPECT_THAT(hosts, ElementsAre("r1n09", "r1n10", "r2n09", "r2n10"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("n[1-2].ib,x[5]"));
  EXPECT_THAT(hosts, ElementsAre("n1.ib", "n2.ib", "x5"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("[1-2]x"));
  EXPECT_THAT(hosts, ElementsAre("1x", "2x"));
  ASSERT_OK_AND_ASSIGN(hosts, ExpandHostlist("n[0-65535]"));
  EXPECT_EQ(hosts.size(), 65536u);
  EXPECT_EQ(hosts.back(), "n65535");
}

// Tests that malformed host lists are errors saying what is wrong.
TEST(ExpandHostlistTest, RejectsMalformed) {
  struct Case {
    const char* expression;
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty"},
           {"n[1-2", "'[' without ']'"},
           {"n]1", "']' without '['"},
           {"n[[1]]", "inside brackets"},
           {"n[3-1]", "ends below its start"},
           {"n[a-b]", "not a number"},
           {"n[1-]", "not a number"},
           {"n[]", "empty brackets"},
           {"n[1,,2]", "not a number"},
           {"a,,b", "empty host name"},
           {"a,", "empty host name"},
           {"n[1-4:2]", "is not in a host name"},
           {"bad host", "is not in a host name"},
           {"n[1-40000],m[1-40000]", "more than 65536 hosts"},
           {"r[1-300]n[1-300]", "more than 65536 hosts"},
       }) {
    SCOPED_TRACE(c.expression);
    absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(c.expression);
    EXPECT_ERROR(hosts.status(), absl::StatusCode::kInvalidArgument, c.expected);
  }
}

// --- The registry -------------------------------------------------------------

RegisterIsland Island(int id, int n, std::string address, std::string name = "") {
  RegisterIsland island;
  island.set_process_id(id);
  island.set_num_processes(n);
  island.set_name(name.empty() ? absl::StrCat("island-", id) : name);
  island.set_address(std::move(address));
  return island;
}

Request RegisterRequest(const RegisterIsland& island) {
  Request request;
  *request.mutable_register_island() = island;
  return request;
}

Request ListRequest() {
  Request request;
  request.mutable_list_islands();
  return request;
}

absl::Status Register(IslandRegistry& registry, const RegisterIsland& island) {
  absl::StatusOr<Response> response = registry.Handle(RegisterRequest(island));
  if (response.ok() && !response->has_ok()) return absl::InternalError("not an ok response");
  return response.status();
}

// Tests registration and listing: islands by process id, num_processes from
// the first registration, a repeated registration accepted.
TEST(IslandRegistryTest, RegistersAndLists) {
  IslandRegistry registry;
  ASSERT_OK_AND_ASSIGN(Response empty, registry.Handle(ListRequest()));
  ASSERT_TRUE(empty.has_island_list());
  EXPECT_EQ(empty.island_list().num_processes(), 0);
  EXPECT_EQ(empty.island_list().islands_size(), 0);

  EXPECT_OK(Register(registry, Island(2, 3, "10.0.0.3:5000")));
  EXPECT_OK(Register(registry, Island(0, 3, "10.0.0.1:5000")));
  EXPECT_OK(Register(registry, Island(0, 3, "10.0.0.1:5000", "renamed")));  // again, same address
  ASSERT_OK_AND_ASSIGN(Response listed, registry.Handle(ListRequest()));
  const IslandList& list = listed.island_list();
  EXPECT_EQ(list.num_processes(), 3);
  ASSERT_EQ(list.islands_size(), 2);
  EXPECT_EQ(list.islands(0).process_id(), 0);
  EXPECT_EQ(list.islands(0).name(), "renamed");
  EXPECT_EQ(list.islands(0).address(), "10.0.0.1:5000");
  EXPECT_EQ(list.islands(1).process_id(), 2);
  EXPECT_EQ(list.islands(1).address(), "10.0.0.3:5000");
}

// Tests that a num_processes that disagrees with the launch's is refused,
// whether the launch's came from construction or the first registration.
TEST(IslandRegistryTest, RefusesInconsistentNumProcesses) {
  IslandRegistry registry;
  ASSERT_OK(Register(registry, Island(0, 4, "10.0.0.1:5000")));
  EXPECT_ERROR(Register(registry, Island(1, 3, "10.0.0.2:5000")), absl::StatusCode::kFailedPrecondition,
               "num_processes 3", "launch's 4");
  IslandRegistry known(4);
  EXPECT_ERROR(Register(known, Island(0, 3, "10.0.0.1:5000")), absl::StatusCode::kFailedPrecondition,
               "num_processes 3", "launch's 4");
  ASSERT_OK_AND_ASSIGN(Response listed, known.Handle(ListRequest()));
  EXPECT_EQ(listed.island_list().num_processes(), 4);
  EXPECT_EQ(listed.island_list().islands_size(), 0);
}

// Tests that an id taken at another address, or an address or a name taken
// by another id, is refused and leaves the first registration in place.
TEST(IslandRegistryTest, RefusesDuplicates) {
  IslandRegistry registry;
  ASSERT_OK(Register(registry, Island(1, 2, "10.0.0.2:5000")));
  EXPECT_ERROR(Register(registry, Island(1, 2, "10.0.0.9:5000", "impostor")),
               absl::StatusCode::kAlreadyExists, "process id 1", "island-1", "10.0.0.2:5000", "impostor");
  EXPECT_ERROR(Register(registry, Island(0, 2, "10.0.0.2:5000")), absl::StatusCode::kAlreadyExists,
               "10.0.0.2:5000", "process 1");
  // One name for two processes: a controller could not tell them apart.
  EXPECT_ERROR(Register(registry, Island(0, 2, "10.0.0.3:5000", "island-1")),
               absl::StatusCode::kAlreadyExists, "name 'island-1' is already registered by", "10.0.0.2:5000");
  // Nor by renaming a registered island to it.
  ASSERT_OK(Register(registry, Island(0, 2, "10.0.0.3:5000", "island-0")));
  EXPECT_ERROR(Register(registry, Island(0, 2, "10.0.0.3:5000", "island-1")),
               absl::StatusCode::kAlreadyExists, "name 'island-1'");
  IslandList list = registry.List();
  ASSERT_EQ(list.islands_size(), 2);
  EXPECT_EQ(list.islands(0).address(), "10.0.0.3:5000");
  EXPECT_EQ(list.islands(0).name(), "island-0");
  EXPECT_EQ(list.islands(1).address(), "10.0.0.2:5000");
}

// Tests that malformed registrations and other requests are refused.
TEST(IslandRegistryTest, RefusesMalformed) {
  IslandRegistry registry;
  EXPECT_ERROR(Register(registry, Island(3, 3, "10.0.0.1:5000")), absl::StatusCode::kInvalidArgument,
               "process_id is not from 0 to 2");
  EXPECT_ERROR(Register(registry, Island(-1, 3, "10.0.0.1:5000")), absl::StatusCode::kInvalidArgument,
               "process_id");
  EXPECT_ERROR(Register(registry, Island(0, 0, "10.0.0.1:5000")), absl::StatusCode::kInvalidArgument,
               "num_processes 0");
  EXPECT_ERROR(Register(registry, Island(0, 70000, "10.0.0.1:5000")), absl::StatusCode::kInvalidArgument,
               "num_processes 70000");
  EXPECT_ERROR(Register(registry, Island(0, 2, "10.0.0.1")), absl::StatusCode::kInvalidArgument, "host:port");
  EXPECT_ERROR(Register(registry, Island(0, 2, "10.0.0.1:0")), absl::StatusCode::kInvalidArgument, "port");
  EXPECT_ERROR(Register(registry, Island(0, 2, "0.0.0.0:5000")), absl::StatusCode::kInvalidArgument,
               "wildcard");
  EXPECT_ERROR(Register(registry, Island(0, 2, "::1:5000")), absl::StatusCode::kInvalidArgument, "brackets");
  EXPECT_ERROR(Register(registry, Island(0, 2, "10.0.0.1:5000", "bad\nname")),
               absl::StatusCode::kInvalidArgument, "printable");
  EXPECT_OK(Register(registry, Island(0, 2, "[::1]:5000")));
  EXPECT_OK(Register(registry, Island(1, 2, "host-b.example:5000")));
  Request ping;
  ping.mutable_ping()->set_payload("x");
  EXPECT_ERROR(registry.Handle(ping).status(), absl::StatusCode::kUnimplemented, "ping");
  EXPECT_ERROR(registry.Handle(Request()).status(), absl::StatusCode::kUnimplemented, "empty request");
  EXPECT_EQ(registry.List().islands_size(), 2);
}

// Tests that registrations from many threads at once are all kept.
TEST(IslandRegistryTest, ConcurrentRegistrations) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 32;
  constexpr int kProcesses = kThreads * kPerThread;
  IslandRegistry registry(kProcesses);
  std::vector<std::function<void()>> bodies;
  for (int t = 0; t < kThreads; ++t) {
    bodies.push_back([&registry, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int id = i * kThreads + t;
        EXPECT_OK(Register(registry,
                           Island(id, kProcesses, absl::StrCat("10.0.", id / 256, ".", id % 256, ":5000"))));
        registry.List();
      }
    });
  }
  RunConcurrently(std::move(bodies), absl::Seconds(30), "registrations");
  IslandList list = registry.List();
  ASSERT_EQ(list.islands_size(), kProcesses);
  for (int id = 0; id < kProcesses; ++id) EXPECT_EQ(list.islands(id).process_id(), id);
}

// --- Rendezvous over loopback -------------------------------------------------

// Patient with silence: no test here is about a silent peer, and a loaded
// process must not pass for one.
ConnectionOptions TestOptions() {
  ConnectionOptions options;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.peer_timeout = absl::Seconds(30);
  return options;
}

ClientHandshakeOptions ClientNamed(std::string name) {
  ClientHandshakeOptions options;
  options.name = std::move(name);
  return options;
}

// A coordinator: a listener whose connections are answered by a registry,
// served on a thread of its own until destroyed.
class Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Start(const SocketAddress& address,
                                                            IslandRegistry* registry) {
    CAUSEWAY_ASSIGN_OR_RETURN(Socket listener, Socket::Listen(address, 64));
    return std::unique_ptr<Coordinator>(new Coordinator(std::move(listener), registry));
  }
  ~Coordinator() {
    stop_ = true;
    thread_.join();
  }
  SocketAddress address() const {
    absl::StatusOr<SocketAddress> address =
        SocketAddress::Parse(absl::StrCat("127.0.0.1:", listener_.port()));
    return address.ok() ? *address : SocketAddress();
  }
  int accepted() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(connections_.size());
  }

 private:
  Coordinator(Socket listener, IslandRegistry* registry)
      : listener_(std::move(listener)), registry_(registry), thread_([this] { Serve(); }) {}

  void Serve() {
    ServerHandshakeOptions handshake;
    handshake.name = "coordinator";
    while (!stop_) {
      absl::StatusOr<Socket> socket = listener_.Accept(In(absl::Milliseconds(50)));
      if (!socket.ok()) continue;
      absl::StatusOr<std::unique_ptr<Connection>> connection =
          Connection::Accept(*std::move(socket), handshake, TestOptions(),
                             [this](const Request& request) { return registry_->Handle(request); });
      if (!connection.ok()) continue;
      absl::MutexLock lock(&mu_);
      connections_.push_back(*std::move(connection));
    }
  }

  Socket listener_;
  IslandRegistry* const registry_;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is built
};

// A loopback port held for a test: bound (SO_REUSEADDR) but not listening,
// so connections to it are refused and no other process can be given it,
// while a listener of the test (which sets SO_REUSEADDR too) can still bind
// it. Closed when the test ends.
class ReservedPort {
 public:
  ReservedPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0) << "socket: " << std::strerror(errno);
    if (fd_ < 0) return;
    int one = 1;
    EXPECT_EQ(setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0) << std::strerror(errno);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(sin);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&sin), &size) != 0) {
      ADD_FAILURE() << "binding a loopback port: " << std::strerror(errno);
      return;
    }
    absl::StatusOr<SocketAddress> address =
        SocketAddress::Parse(absl::StrCat("127.0.0.1:", ntohs(sin.sin_port)));
    EXPECT_TRUE(address.ok()) << address.status();
    if (address.ok()) address_ = *address;
  }
  ~ReservedPort() {
    if (fd_ >= 0) close(fd_);
  }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  const SocketAddress& address() const { return address_; }

  // Listens on the port, takes the first connection within `limit` and
  // closes it unanswered: its client's attempt has failed for certain.
  // Returns false if none came.
  bool RefuseOneConnection(absl::Duration limit) {
    if (fd_ < 0 || listen(fd_, 8) != 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(limit))) != 1) return false;
    const int accepted = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (accepted < 0) return false;
    close(accepted);
    return true;
  }
  // Gives the port up (connections waiting in the backlog are reset), so
  // that a listener of the test can bind it.
  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  SocketAddress address_;
};

LaunchConfig ConfigFor(const SocketAddress& coordinator, int id, int n) {
  LaunchConfig config;
  config.coordinator = coordinator;
  config.coordinator_name = coordinator.ToString();
  config.num_processes = n;
  config.process_id = id;
  config.source = "flags";
  return config;
}

RegisterIsland Me(int id) {
  RegisterIsland me;
  me.set_name(absl::StrCat("island-", id));
  me.set_address(absl::StrCat("127.0.0.1:", 6000 + id));
  return me;
}

// Tests a whole rendezvous over loopback connections: four processes
// register, one of them (and the controller) before the coordinator
// listens, and the controller gets every island by process id.
TEST(RendezvousTest, FourIslandsRegisterAndAreListed) {
  constexpr int kProcesses = 4;
  ReservedPort port;
  const SocketAddress address = port.address();
  ASSERT_NE(address.port(), 0);
  IslandRegistry registry(kProcesses);
  const absl::Time deadline = In(absl::Seconds(20));

  // The early registrant and the controller, before the coordinator listens.
  // The registrant's first connection is taken and closed, so it succeeds
  // only by retrying; the controller's attempts meanwhile are reset or
  // refused.
  std::atomic<bool> early_done{false};
  absl::Status early_status = absl::UnknownError("not run");
  std::thread early([&] {
    early_status =
        RegisterWithCoordinator(ConfigFor(address, 3, kProcesses), Me(3), ClientNamed("island-3"), deadline);
    early_done = true;
  });
  const bool refused = port.RefuseOneConnection(absl::Seconds(20));
  absl::StatusOr<std::vector<RegisterIsland>> islands = absl::UnknownError("not run");
  std::thread controller([&] { islands = WaitForIslands(address, ClientNamed("controller"), deadline); });
  EXPECT_TRUE(refused) << "the early registrant never connected";
  EXPECT_FALSE(early_done) << "RegisterWithCoordinator returned after a failed attempt: " << early_status;
  port.Release();

  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Start(address, &registry);
  std::vector<std::function<void()>> bodies;
  for (int id = 0; id < 3; ++id) {
    bodies.push_back([&, id] {
      EXPECT_OK(RegisterWithCoordinator(ConfigFor(address, id, kProcesses), Me(id),
                                        ClientNamed(absl::StrCat("island-", id)), deadline));
    });
  }
  RunConcurrently(std::move(bodies), absl::Seconds(30), "registrants");
  early.join();
  controller.join();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_OK(early_status);

  ASSERT_TRUE(islands.ok()) << islands.status();
  ASSERT_EQ(islands->size(), static_cast<size_t>(kProcesses));
  for (int id = 0; id < kProcesses; ++id) {
    EXPECT_EQ((*islands)[id].process_id(), id);
    EXPECT_EQ((*islands)[id].num_processes(), kProcesses);
    EXPECT_EQ((*islands)[id].name(), absl::StrCat("island-", id));
    EXPECT_EQ((*islands)[id].address(), absl::StrCat("127.0.0.1:", 6000 + id));
  }
  // The coordinator counts a connection once it has served it, which may
  // follow the reply its client already read.
  const absl::Time counted_by = absl::Now() + absl::Seconds(10);
  while ((*coordinator)->accepted() < kProcesses + 1 && absl::Now() < counted_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE((*coordinator)->accepted(), kProcesses + 1);
}

// Tests that WaitForIslands gives up at its deadline naming how many of how
// many registered and which ids are missing.
TEST(RendezvousTest, WaitForIslandsTimesOutNamingMissingIds) {
  IslandRegistry registry(5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Coordinator> coordinator,
                       Coordinator::Start(SocketAddress::Parse("127.0.0.1:0").value(), &registry));
  for (int id : {0, 1, 3}) {
    ASSERT_OK(RegisterWithCoordinator(ConfigFor(coordinator->address(), id, 5), Me(id),
                                      ClientNamed(absl::StrCat("island-", id)), In(absl::Seconds(10))));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<RegisterIsland>> islands =
      WaitForIslands(coordinator->address(), ClientNamed("controller"), In(absl::Milliseconds(400)));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_ERROR(islands.status(), absl::StatusCode::kDeadlineExceeded, "3 of 5", "missing process ids: 2, 4",
               coordinator->address().ToString());
  EXPECT_GE(waited, absl::Milliseconds(350));
  EXPECT_LT(waited, absl::Seconds(3));
}

// Tests that registering with a coordinator that never listens gives up at
// the deadline, naming the coordinator and the last failure.
TEST(RendezvousTest, RegisterGivesUpAtDeadline) {
  const ReservedPort port;
  const SocketAddress& address = port.address();
  ASSERT_NE(address.port(), 0);
  const absl::Time start = absl::Now();
  absl::Status status = RegisterWithCoordinator(ConfigFor(address, 1, 2), Me(1), ClientNamed("island-1"),
                                                In(absl::Milliseconds(300)));
  EXPECT_ERROR(status, absl::StatusCode::kDeadlineExceeded, address.ToString(), "process 1 of 2", "attempts",
               "last failure", "refused");
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  absl::StatusOr<std::vector<RegisterIsland>> islands =
      WaitForIslands(address, ClientNamed("controller"), In(absl::Milliseconds(300)));
  EXPECT_ERROR(islands.status(), absl::StatusCode::kDeadlineExceeded, "could not reach the coordinator",
               address.ToString(), "refused");
}

// Tests that a refusal from the registry is returned at once, not retried
// until the deadline.
TEST(RendezvousTest, RegistryRefusalIsNotRetried) {
  IslandRegistry registry(2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Coordinator> coordinator,
                       Coordinator::Start(SocketAddress::Parse("127.0.0.1:0").value(), &registry));
  ASSERT_OK(RegisterWithCoordinator(ConfigFor(coordinator->address(), 1, 2), Me(1), ClientNamed("island-1"),
                                    In(absl::Seconds(10))));
  RegisterIsland impostor = Me(1);
  impostor.set_address("127.0.0.1:6999");
  const absl::Time start = absl::Now();
  absl::Status status = RegisterWithCoordinator(ConfigFor(coordinator->address(), 1, 2), impostor,
                                                ClientNamed("impostor"), In(absl::Seconds(10)));
  EXPECT_ERROR(status, absl::StatusCode::kAlreadyExists, coordinator->address().ToString(), "process id 1",
               "127.0.0.1:6001");
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace causeway::transport
