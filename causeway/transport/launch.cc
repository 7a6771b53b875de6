#include "causeway/transport/launch.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/transport/connection.h"

namespace causeway::transport {
namespace {

constexpr int kMaxHosts = 65536;

// A value and where it came from, as messages show it: "SLURM_PROCID=x" or
// "--process-id=x".
struct Sourced {
  std::string value;
  std::string origin;  // the variable or flag
  // How a value made from other variables is shown instead; see Show.
  std::string derived_from;
  std::string Show() const {
    if (!derived_from.empty())
      return absl::StrCat("'", absl::CHexEscape(value), "' (from ", derived_from, ")");
    return absl::StrCat(origin, "=", absl::CHexEscape(value));
  }
};

// The values a launcher's variables give; any may be missing.
struct Launcher {
  std::string name;  // "slurm", "openmpi", "torchrun"
  std::optional<Sourced> process_id;
  std::optional<Sourced> num_processes;
};

class Environment {
 public:
  explicit Environment(const GetenvFunction& getenv) : getenv_(getenv) {}
  // The variable's value; nullopt when unset or empty.
  std::optional<Sourced> Get(const char* name) const {
    std::optional<std::string> value = getenv_(name);
    if (!value.has_value() || value->empty()) return std::nullopt;
    return Sourced{*std::move(value), name};
  }
  bool Has(const char* name) const { return Get(name).has_value(); }
  // The first of `names` that is set.
  std::optional<Sourced> First(std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      if (std::optional<Sourced> value = Get(name)) return value;
    }
    return std::nullopt;
  }

 private:
  const GetenvFunction& getenv_;
};

// A non-negative decimal number of at most 9 digits, all of `s.value`.
absl::StatusOr<int> ParseNumber(const Sourced& s, absl::string_view what) {
  const std::string& v = s.value;
  if (v.empty() || v.size() > 9 || !std::all_of(v.begin(), v.end(), absl::ascii_isdigit)) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.Show(), ": ", what, " must be a non-negative decimal number"));
  }
  int n = 0;
  if (!absl::SimpleAtoi(v, &n)) {
    return absl::InvalidArgumentError(absl::StrCat(s.Show(), ": ", what, " is not a number"));
  }
  return n;
}

absl::StatusOr<uint16_t> ParsePort(const Sourced& s) {
  absl::StatusOr<int> port = ParseNumber(s, "a port");
  if (!port.ok() || *port < 1 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.Show(), ": the coordinator's port must be a number from 1 to 65535"));
  }
  return static_cast<uint16_t>(*port);
}

// "host:port", with brackets around an IPv6 address.
std::string JoinHostPort(absl::string_view host, uint16_t port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "["))
    return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

// The coordinator's port for a launcher that gives only a host.
absl::StatusOr<uint16_t> DefaultPort(const Environment& env, std::string* origin) {
  if (std::optional<Sourced> port = env.Get("CAUSEWAY_COORDINATOR_PORT")) {
    *origin = port->Show();
    return ParsePort(*port);
  }
  *origin = absl::StrCat("default port ", kDefaultCoordinatorPort);
  return kDefaultCoordinatorPort;
}

// The coordinator a launcher gives: nullopt if it gives none.
absl::StatusOr<std::optional<Sourced>> LauncherCoordinator(const Launcher& launcher, const Environment& env) {
  std::string port_origin;
  if (launcher.name == "slurm") {
    std::optional<Sourced> nodes = env.First({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"});
    if (!nodes.has_value()) {
      return absl::InvalidArgumentError(
          "Slurm launch without a node list: SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset; set "
          "CAUSEWAY_COORDINATOR=HOST:PORT or pass --coordinator");
    }
    absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(nodes->value);
    if (!hosts.ok())
      return absl::InvalidArgumentError(absl::StrCat(nodes->origin, ": ", hosts.status().message()));
    CAUSEWAY_ASSIGN_OR_RETURN(uint16_t port, DefaultPort(env, &port_origin));
    return Sourced{JoinHostPort(hosts->front(), port), "the Slurm node list",
                   absl::StrCat("the first host of ", nodes->Show(), " and ", port_origin)};
  }
  if (launcher.name == "torchrun") {
    std::optional<Sourced> host = env.Get("MASTER_ADDR");
    if (!host.has_value()) return std::nullopt;
    uint16_t port = 0;
    if (std::optional<Sourced> master_port = env.Get("MASTER_PORT")) {
      CAUSEWAY_ASSIGN_OR_RETURN(port, ParsePort(*master_port));
      port_origin = master_port->Show();
    } else {
      CAUSEWAY_ASSIGN_OR_RETURN(port, DefaultPort(env, &port_origin));
    }
    return Sourced{JoinHostPort(host->value, port), "MASTER_ADDR",
                   absl::StrCat(host->Show(), " and ", port_origin)};
  }
  return std::nullopt;  // Open MPI gives no address
}

// The launcher of this process, if any: see DetectLaunch for the order.
std::optional<Launcher> FindLauncher(const Environment& env) {
  const bool under_mpirun = env.Has("OMPI_COMM_WORLD_RANK");
  const bool under_torchrun = env.Has("TORCHELASTIC_RUN_ID");
  if (env.Has("SLURM_PROCID") && !under_mpirun && !under_torchrun) {
    return Launcher{"slurm", env.Get("SLURM_PROCID"), env.First({"SLURM_NTASKS", "SLURM_NPROCS"})};
  }
  if (under_mpirun) {
    return Launcher{"openmpi", env.Get("OMPI_COMM_WORLD_RANK"), env.Get("OMPI_COMM_WORLD_SIZE")};
  }
  if (env.Has("RANK") || env.Has("WORLD_SIZE")) {
    return Launcher{"torchrun", env.Get("RANK"), env.Get("WORLD_SIZE")};
  }
  return std::nullopt;
}

// Why a launch that lacks `what` is incomplete, and how to complete it.
absl::Status Incomplete(absl::string_view what, absl::string_view flag, absl::string_view variable,
                        const std::vector<std::string>& have, const std::optional<Launcher>& launcher) {
  std::string hint;
  if (launcher.has_value()) {
    if (launcher->name == "slurm") hint = " (Slurm gives it in SLURM_NTASKS or SLURM_NPROCS, both unset)";
    if (launcher->name == "openmpi") hint = " (Open MPI gives it in OMPI_COMM_WORLD_SIZE, unset)";
    if (launcher->name == "torchrun") {
      hint = what == "process id" ? " (a torchrun-style launch gives it in RANK, unset)"
                                  : " (a torchrun-style launch gives it in WORLD_SIZE, unset)";
    }
  } else {
    hint = " (no launcher found: not under srun, mpirun or torchrun)";
  }
  return absl::InvalidArgumentError(absl::StrCat("incomplete launch: ", absl::StrJoin(have, ", "), " but no ",
                                                 what, hint, "; pass --", flag, " or set ", variable));
}

}  // namespace

std::string DescribeLaunch(const LaunchConfig& config) {
  std::string coordinator = config.coordinator.ToString();
  if (!config.coordinator_name.empty() && config.coordinator_name != coordinator) {
    coordinator = absl::StrCat(config.coordinator_name, " (", coordinator, ")");
  }
  return absl::StrCat("process ", config.process_id, " of ", config.num_processes, " (", config.source,
                      "), coordinator ", coordinator);
}

absl::StatusOr<std::optional<LaunchConfig>> DetectLaunch(const LaunchFlags& flags,
                                                         const GetenvFunction& getenv) {
  const Environment env(getenv);
  std::optional<Sourced> coordinator, num_processes, process_id;
  std::string source;
  auto take = [](std::optional<Sourced>& field, std::optional<Sourced> value) {
    if (!field.has_value() && value.has_value()) field = std::move(value);
  };
  auto flag = [](const std::optional<std::string>& value, const char* name) -> std::optional<Sourced> {
    if (!value.has_value()) return std::nullopt;
    return Sourced{*value, absl::StrCat("--", name)};
  };

  // 1. Flags; 2. CAUSEWAY_*; 3. the launcher.
  take(coordinator, flag(flags.coordinator, "coordinator"));
  take(num_processes, flag(flags.num_processes, "num-processes"));
  take(process_id, flag(flags.process_id, "process-id"));
  if (process_id.has_value()) source = "flags";
  take(coordinator, env.Get("CAUSEWAY_COORDINATOR"));
  take(num_processes, env.Get("CAUSEWAY_NUM_PROCESSES"));
  take(process_id, env.Get("CAUSEWAY_PROCESS_ID"));
  if (source.empty() && process_id.has_value()) source = "CAUSEWAY_*";

  const std::optional<Launcher> launcher = FindLauncher(env);
  if (!coordinator.has_value() && !num_processes.has_value() && !process_id.has_value() &&
      !launcher.has_value()) {
    return std::nullopt;  // a single island on its own
  }
  // What was given, for messages about what was not.
  std::vector<std::string> have;
  for (const auto* field : {&coordinator, &num_processes, &process_id}) {
    if (field->has_value()) have.push_back((*field)->Show());
  }
  if (launcher.has_value()) {
    take(process_id, launcher->process_id);
    if (source.empty() && process_id.has_value()) source = launcher->name;
    take(num_processes, launcher->num_processes);
    if (!coordinator.has_value()) {
      CAUSEWAY_ASSIGN_OR_RETURN(coordinator, LauncherCoordinator(*launcher, env));
    }
    if (have.empty()) {
      have.push_back(launcher->name == "slurm"     ? "a Slurm launch"
                     : launcher->name == "openmpi" ? "an Open MPI launch"
                                                   : "a torchrun-style launch");
      std::vector<std::string> values;
      for (const auto* value : {&launcher->process_id, &launcher->num_processes}) {
        if (value->has_value()) values.push_back((*value)->Show());
      }
      if (!values.empty()) have.back() += absl::StrCat(" (", absl::StrJoin(values, ", "), ")");
    }
  }

  if (!process_id.has_value()) {
    return Incomplete("process id", "process-id", "CAUSEWAY_PROCESS_ID", have, launcher);
  }
  if (!num_processes.has_value()) {
    return Incomplete("number of processes", "num-processes", "CAUSEWAY_NUM_PROCESSES", have, launcher);
  }
  if (!coordinator.has_value()) {
    std::string why = launcher.has_value() && launcher->name == "openmpi"
                          ? "Open MPI gives no address that process 0 listens at"
                      : launcher.has_value() && launcher->name == "torchrun" ? "MASTER_ADDR is unset"
                                                                             : "";
    return absl::InvalidArgumentError(absl::StrCat("incomplete launch: ", absl::StrJoin(have, ", "),
                                                   " but no coordinator address", why.empty() ? "" : " (",
                                                   why, why.empty() ? "" : ")",
                                                   "; set CAUSEWAY_COORDINATOR=HOST:PORT (where process 0 "
                                                   "listens) or pass --coordinator"));
  }

  LaunchConfig config;
  config.source = source;
  CAUSEWAY_ASSIGN_OR_RETURN(config.num_processes, ParseNumber(*num_processes, "the number of processes"));
  if (config.num_processes < 1 || config.num_processes > kMaxLaunchProcesses) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_processes->Show(), ": the number of processes must be 1 to ", kMaxLaunchProcesses));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(config.process_id, ParseNumber(*process_id, "the process id"));
  if (config.process_id >= config.num_processes) {
    return absl::InvalidArgumentError(
        absl::StrCat(process_id->Show(), ": the process id must be below the number of ", "processes, ",
                     config.num_processes, " (", num_processes->Show(), ")"));
  }
  absl::StatusOr<SocketAddress> address = SocketAddress::Parse(coordinator->value);
  if (!address.ok()) {
    return absl::Status(address.status().code(),
                        absl::StrCat("coordinator ", coordinator->Show(), ": ", address.status().message()));
  }
  if (address->port() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator ", coordinator->Show(), ": the coordinator needs a fixed port, not 0"));
  }
  config.coordinator = *address;
  config.coordinator_name = coordinator->value;
  return config;
}

absl::StatusOr<std::optional<LaunchConfig>> DetectLaunch(const LaunchFlags& flags) {
  return DetectLaunch(flags, [](const char* name) { return EnvValue(name); });
}

// --- Slurm host lists -------------------------------------------------------

namespace {

bool IsHostChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_'; }

// The numbers of one bracket's contents ("01-03,7"), each as text.
absl::StatusOr<std::vector<std::string>> ExpandBracket(
    absl::string_view body, const std::function<absl::Status(absl::string_view)>& bad) {
  std::vector<std::string> out;
  if (body.empty()) return bad("empty brackets");
  for (absl::string_view item : absl::StrSplit(body, ',')) {
    absl::string_view lo_text = item, hi_text = item;
    if (size_t dash = item.find('-'); dash != absl::string_view::npos) {
      lo_text = item.substr(0, dash);
      hi_text = item.substr(dash + 1);
    }
    auto is_number = [](absl::string_view s) {
      return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
    };
    if (!is_number(lo_text) || !is_number(hi_text)) {
      return bad(absl::StrCat("'", item, "' in brackets is not a number or a lo-hi range of numbers"));
    }
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(lo_text, &lo) || !absl::SimpleAtoi(hi_text, &hi)) {
      return bad(absl::StrCat("'", item, "' is not a range"));
    }
    if (hi < lo) return bad(absl::StrCat("range '", item, "' ends below its start"));
    if (static_cast<int64_t>(hi) - lo + 1 + static_cast<int64_t>(out.size()) > kMaxHosts) {
      return bad(absl::StrCat("more than ", kMaxHosts, " hosts"));
    }
    const int width = static_cast<int>(lo_text.size());
    for (int v = lo; v <= hi; ++v) out.push_back(absl::StrFormat("%0*d", width, v));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view expression) {
  auto bad = [expression](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("host list '", absl::CHexEscape(expression), "': ", why,
                     "; expected names and bracketed ranges, as in node[01-03,7],gpu-a[1-2]"));
  };
  if (expression.empty()) return bad("empty");

  // Split into groups at commas outside brackets, checking the brackets.
  std::vector<absl::string_view> groups;
  size_t start = 0;
  bool in_bracket = false;
  for (size_t i = 0; i < expression.size(); ++i) {
    const char c = expression[i];
    if (c == '[') {
      if (in_bracket) return bad(absl::StrCat("'[' inside brackets at offset ", i));
      in_bracket = true;
    } else if (c == ']') {
      if (!in_bracket) return bad(absl::StrCat("']' without '[' at offset ", i));
      in_bracket = false;
    } else if (c == ',' && !in_bracket) {
      groups.push_back(expression.substr(start, i - start));
      start = i + 1;
    } else if (!IsHostChar(c) && !(in_bracket && c == ',')) {
      return bad(absl::StrCat("character '", absl::CHexEscape(absl::string_view(&c, 1)), "' at offset ", i,
                              " is not in a host name"));
    }
  }
  if (in_bracket) return bad("'[' without ']'");
  groups.push_back(expression.substr(start));

  std::vector<std::string> hosts;
  for (absl::string_view group : groups) {
    if (group.empty()) return bad("an empty host name (two commas, or one at an end)");
    // The group's pieces: literal text, or the alternatives of a bracket.
    std::vector<std::vector<std::string>> pieces;
    int64_t count = 1;
    size_t i = 0;
    while (i < group.size()) {
      if (group[i] == '[') {
        const size_t close = group.find(']', i);
        CAUSEWAY_ASSIGN_OR_RETURN(std::vector<std::string> numbers,
                                  ExpandBracket(group.substr(i + 1, close - i - 1), bad));
        count *= static_cast<int64_t>(numbers.size());
        if (count + static_cast<int64_t>(hosts.size()) > kMaxHosts) {
          return bad(absl::StrCat("more than ", kMaxHosts, " hosts"));
        }
        pieces.push_back(std::move(numbers));
        i = close + 1;
      } else {
        const size_t next = std::min(group.find('[', i), group.size());
        pieces.push_back({std::string(group.substr(i, next - i))});
        i = next;
      }
    }
    // The product, the leftmost bracket varying slowest.
    std::vector<std::string> names = {""};
    for (const std::vector<std::string>& piece : pieces) {
      std::vector<std::string> longer;
      longer.reserve(names.size() * piece.size());
      for (const std::string& name : names) {
        for (const std::string& p : piece) longer.push_back(name + p);
      }
      names = std::move(longer);
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

// --- The registry -----------------------------------------------------------

namespace {

// OK if `address` looks like "host:port" with a port of 1..65535 and a host
// other processes can reach (not a wildcard). Nothing is resolved.
absl::Status CheckIslandAddress(absl::string_view address) {
  auto bad = [address](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("address '", absl::CHexEscape(address), "' ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return bad("is not host:port");
  absl::string_view host = address.substr(0, colon);
  absl::string_view port = address.substr(colon + 1);
  int port_number = 0;
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &port_number) || port_number < 1 || port_number > 65535) {
    return bad("has no port from 1 to 65535");
  }
  if (absl::StrContains(host, ':') && !(absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))) {
    return bad("has an IPv6 host without brackets");
  }
  for (char c : host) {
    if (!IsHostChar(c) && c != ':' && c != '[' && c != ']') return bad("has a character no host has");
  }
  if (host == "0.0.0.0" || host == "[::]") {
    return bad("is a wildcard; register an address other processes can connect to");
  }
  return absl::OkStatus();
}

std::string Describe(const RegisterIsland& island) {
  return absl::StrCat("process ", island.process_id(), " ('", absl::CHexEscape(island.name()), "' at ",
                      absl::CHexEscape(island.address()), ")");
}

}  // namespace

IslandRegistry::IslandRegistry(std::optional<int> num_processes) {
  if (num_processes.has_value()) num_processes_ = *num_processes;
}

absl::StatusOr<Response> IslandRegistry::Handle(const Request& request) {
  Response response;
  switch (request.kind_case()) {
    case Request::kRegisterIsland:
      CAUSEWAY_RETURN_IF_ERROR(Register(request.register_island()));
      response.mutable_ok();
      return response;
    case Request::kListIslands:
      *response.mutable_island_list() = List();
      return response;
    default: {
      const auto* field = Request::descriptor()->FindFieldByNumber(request.kind_case());
      return absl::UnimplementedError(
          absl::StrCat("the island registry answers register_island and list_islands, not ",
                       field == nullptr ? "an empty request" : field->name()));
    }
  }
}

absl::Status IslandRegistry::Register(const RegisterIsland& island) {
  const std::string who = Describe(island);
  const int n = island.num_processes();
  if (n < 1 || n > kMaxLaunchProcesses) {
    return absl::InvalidArgumentError(absl::StrCat("register_island from ", who, ": num_processes ", n,
                                                   " is not from 1 to ", kMaxLaunchProcesses));
  }
  if (island.process_id() < 0 || island.process_id() >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("register_island from ", who, ": process_id is not from 0 to ", n - 1));
  }
  if (island.name().empty())
    return absl::InvalidArgumentError(absl::StrCat("register_island from ", who, ": no name"));
  if (absl::Status name = CheckPeerName(island.name()); !name.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("register_island from ", who, ": ", name.message()));
  }
  if (absl::Status address = CheckIslandAddress(island.address()); !address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("register_island from ", who, ": ", address.message()));
  }

  absl::MutexLock lock(&mu_);
  if (num_processes_ != 0 && n != num_processes_) {
    return absl::FailedPreconditionError(absl::StrCat("register_island from ", who, ": num_processes ", n,
                                                      " disagrees with the launch's ", num_processes_));
  }
  auto same = islands_.find(island.process_id());
  if (same != islands_.end() && same->second.address() != island.address()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "register_island from ", who, ": process id ", island.process_id(), " is already registered by ",
        Describe(same->second), "; two processes claim one id (check the launch's rank variables)"));
  }
  // Controllers find islands by name and connect by address: each names
  // one island.
  for (const auto& [id, other] : islands_) {
    if (id == island.process_id()) continue;
    if (other.address() == island.address() || other.name() == island.name()) {
      const bool address = other.address() == island.address();
      return absl::AlreadyExistsError(
          absl::StrCat("register_island from ", who, ": ", address ? "address " : "name '",
                       address ? island.address() : island.name(), address ? "" : "'",
                       " is already registered by ", Describe(other)));
    }
  }
  num_processes_ = n;
  islands_[island.process_id()] = island;  // new, or the same island again, perhaps renamed
  return absl::OkStatus();
}

IslandList IslandRegistry::List() const {
  absl::MutexLock lock(&mu_);
  IslandList list;
  list.set_num_processes(num_processes_);
  for (const auto& [id, island] : islands_) *list.add_islands() = island;
  return list;
}

// --- Clients of the coordinator -------------------------------------------

namespace {

// Failures that a later attempt may not meet: the coordinator not listening
// yet, not answering in time, or going away.
bool IsRetryable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

// Pauses between attempts: 20 ms, doubling to 1 s, each with up to 25% of
// random jitter so that many processes do not knock in step.
class Backoff {
 public:
  explicit Backoff(absl::Time deadline) : deadline_(deadline), random_(std::random_device{}()) {}
  // Sleeps before the next attempt; false if the deadline has passed.
  bool Wait() {
    const absl::Time now = absl::Now();
    if (now >= deadline_) return false;
    std::uniform_real_distribution<double> jitter(0.75, 1.0);
    absl::SleepFor(std::min(pause_ * jitter(random_), deadline_ - now));
    pause_ = std::min(pause_ * 2, absl::Seconds(1));
    return absl::Now() < deadline_;
  }

 private:
  const absl::Time deadline_;
  absl::Duration pause_ = absl::Milliseconds(20);
  std::mt19937 random_;
};

absl::StatusOr<std::unique_ptr<Connection>> ConnectBy(const SocketAddress& address,
                                                      const ClientHandshakeOptions& handshake,
                                                      absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(absl::StrCat("no time left to connect to ", address.ToString()));
  }
  ClientHandshakeOptions options = handshake;
  options.timeout = std::min(handshake.timeout, left);
  return Connection::Connect(address, options, ConnectionOptions{});
}

// Keeps the more telling of two failures: a failure met only because our
// own deadline had come says less than the one before it.
void Remember(absl::Status& last, absl::Status now, absl::Time deadline) {
  if (!last.ok() && now.code() == absl::StatusCode::kDeadlineExceeded && absl::Now() >= deadline) return;
  last = std::move(now);
}

std::string Elapsed(absl::Time start) {
  return absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)));
}

// "1, 3-5, 9": the ids of `ids` (sorted), with runs joined, at most 20 items.
std::string DescribeIds(const std::vector<int>& ids) {
  std::vector<std::string> items;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (items.size() == 20) {
      items.push_back(absl::StrCat("... (", ids.size(), " in all)"));
      break;
    }
    items.push_back(j == i ? absl::StrCat(ids[i]) : absl::StrCat(ids[i], "-", ids[j]));
    i = j + 1;
  }
  return absl::StrJoin(items, ", ");
}

}  // namespace

absl::Status RegisterWithCoordinator(const LaunchConfig& config, const RegisterIsland& me,
                                     const ClientHandshakeOptions& handshake, absl::Time deadline) {
  Request request;
  RegisterIsland* island = request.mutable_register_island();
  *island = me;
  island->set_process_id(config.process_id);
  island->set_num_processes(config.num_processes);
  const std::string coordinator =
      config.coordinator_name.empty() || config.coordinator_name == config.coordinator.ToString()
          ? config.coordinator.ToString()
          : absl::StrCat(config.coordinator_name, " (", config.coordinator.ToString(), ")");
  const std::string what = absl::StrCat("registering process ", config.process_id, " of ",
                                        config.num_processes, " with the coordinator ", coordinator);

  const absl::Time start = absl::Now();
  Backoff backoff(deadline);
  absl::Status last;
  int attempts = 0;
  do {
    ++attempts;
    absl::Status status;
    absl::StatusOr<std::unique_ptr<Connection>> connection =
        ConnectBy(config.coordinator, handshake, deadline);
    if (connection.ok()) {
      absl::StatusOr<Response> response = (*connection)->Call(request, deadline);
      (*connection)->Close("registered");
      if (response.ok() && response->has_ok()) return absl::OkStatus();
      status = response.ok()
                   ? absl::DataLossError(absl::StrCat("the coordinator answered register_island with ",
                                                      "something other than ok"))
                   : response.status();
    } else {
      status = connection.status();
    }
    if (!IsRetryable(status)) return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
    Remember(last, std::move(status), deadline);
  } while (backoff.Wait());
  return absl::DeadlineExceededError(absl::StrCat(what, ": not done within ", Elapsed(start), " (", attempts,
                                                  " attempts); last failure: ", last.message()));
}

absl::StatusOr<std::vector<RegisterIsland>> WaitForIslands(const SocketAddress& coordinator,
                                                           const ClientHandshakeOptions& handshake,
                                                           absl::Time deadline) {
  const std::string where = coordinator.ToString();
  Request request;
  request.mutable_list_islands();

  const absl::Time start = absl::Now();
  Backoff backoff(deadline);  // between failed attempts
  absl::Duration poll = absl::Milliseconds(10);
  std::unique_ptr<Connection> connection;
  std::optional<IslandList> latest;
  absl::Status last;
  int attempts = 0;
  while (true) {
    absl::Status status;
    if (connection == nullptr || !connection->status().ok()) {
      ++attempts;
      absl::StatusOr<std::unique_ptr<Connection>> connected = ConnectBy(coordinator, handshake, deadline);
      if (connected.ok()) {
        connection = *std::move(connected);
      } else {
        connection.reset();
        status = connected.status();
      }
    }
    if (connection != nullptr) {
      absl::StatusOr<Response> response = connection->Call(request, deadline);
      if (response.ok() && response->has_island_list()) {
        IslandList& list = *response->mutable_island_list();
        std::set<int> ids;
        for (const RegisterIsland& island : list.islands()) ids.insert(island.process_id());
        const int n = list.num_processes();
        int registered = 0;
        for (int id : ids) registered += (id >= 0 && id < n) ? 1 : 0;
        if (n > 0 && registered == n && list.islands_size() == n) {
          connection->Close("all islands registered");
          std::vector<RegisterIsland> islands(list.islands().begin(), list.islands().end());
          std::sort(islands.begin(), islands.end(), [](const RegisterIsland& a, const RegisterIsland& b) {
            return a.process_id() < b.process_id();
          });
          return islands;
        }
        latest = std::move(list);
        if (absl::Now() >= deadline) break;
        absl::SleepFor(std::min(poll, deadline - absl::Now()));
        poll = std::min(poll * 2, absl::Milliseconds(250));
        continue;
      }
      status = response.ok() ? absl::DataLossError(
                                   "the coordinator answered list_islands with something other "
                                   "than an island list")
                             : response.status();
      connection.reset();
    }
    if (!IsRetryable(status)) {
      return absl::Status(status.code(), absl::StrCat("waiting for islands at the coordinator ", where, ": ",
                                                      status.message()));
    }
    Remember(last, std::move(status), deadline);
    if (!backoff.Wait()) break;
  }
  if (connection != nullptr) connection->Close("deadline passed");

  if (!latest.has_value()) {
    return absl::DeadlineExceededError(absl::StrCat("could not reach the coordinator ", where, " within ",
                                                    Elapsed(start), " (", attempts,
                                                    " attempts); last failure: ", last.message()));
  }
  const int n = latest->num_processes();
  if (n == 0) {
    return absl::DeadlineExceededError(absl::StrCat("no island process registered with the coordinator ",
                                                    where, " within ", Elapsed(start)));
  }
  std::set<int> registered;
  for (const RegisterIsland& island : latest->islands()) registered.insert(island.process_id());
  std::vector<int> missing;
  for (int id = 0; id < n; ++id) {
    if (registered.count(id) == 0) missing.push_back(id);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      n - static_cast<int>(missing.size()), " of ", n, " island processes registered with the coordinator ",
      where, " within ", Elapsed(start), "; missing process ids: ", DescribeIds(missing)));
}

}  // namespace causeway::transport
