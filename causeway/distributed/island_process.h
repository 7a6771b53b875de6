// An island server in a child process (`causeway island`), for tests,
// benchmarks and tools that run several islands on one machine.
#ifndef CAUSEWAY_DISTRIBUTED_ISLAND_PROCESS_H_
#define CAUSEWAY_DISTRIBUTED_ISLAND_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "causeway/base/subprocess.h"

namespace causeway::transport {

// Not copyable; the destructor kills the process (SIGKILL) and reaps it. The
// process is also killed when the thread that started it ends (or the whole
// parent dies, a crash included: PR_SET_PDEATHSIG), so start islands from a
// thread that lives as long as they should.
class IslandProcess {
 public:
  // Runs `binary island --listen=127.0.0.1:0 --name=NAME ARGS...` (no
  // --name when `name` is empty: the island names itself) with `env`
  // ("NAME=value") added to this environment, and waits until it prints
  // "island NAME ADDRESS" (by `timeout`). Errors: the process could not
  // start, ended, or said something else (quoted).
  static absl::StatusOr<std::unique_ptr<IslandProcess>> Start(const std::string& binary,
                                                              const std::string& name,
                                                              const std::vector<std::string>& args,
                                                              const std::vector<std::string>& env = {},
                                                              absl::Duration timeout = absl::Seconds(60));
  IslandProcess(const IslandProcess&) = delete;
  IslandProcess& operator=(const IslandProcess&) = delete;

  // Where it serves (host:port).
  const std::string& address() const { return address_; }
  // Its name, as it printed it.
  const std::string& name() const { return name_; }
  pid_t pid() const { return process_.pid(); }
  // Sends `signal` (nothing once reaped).
  void Signal(int signal);
  // Whether the process has ended (reaping it if it has just): its wait
  // status then, in words, in `how` (if given).
  bool Ended(std::string* how = nullptr);
  // SIGTERM, then waits; its wait status. Still running after `limit`, it
  // is killed (SIGKILL), and the status says so.
  int Stop(absl::Duration limit = absl::InfiniteDuration());

 private:
  IslandProcess() = default;
  Subprocess process_;
  std::string address_;
  std::string name_;
  std::string ended_;  // DescribeWaitStatus once reaped by Ended
};

}  // namespace causeway::transport

#endif  // CAUSEWAY_DISTRIBUTED_ISLAND_PROCESS_H_
