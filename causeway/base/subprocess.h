// Child processes, started one way for everything that starts them: island
// processes (IslandProcess, causeway launch), the benchmark suites of causeway
// bench, and the tests that run the CLI.
//
// The child is made with fork and execve, and between the two it makes only
// async-signal-safe calls: the program's path (looked up in PATH in the
// parent), its argument vector and its whole environment are built before
// the fork, since a multithreaded parent's child may not allocate. Spawn
// returns once the child has exec'd its program, or with why it could not.
//
// Example:
//   SpawnOptions o;
//   o.argv = {"/usr/bin/causeway", "island", "--listen=127.0.0.1:0"};
//   o.pipe_stdout = true;
//   o.death_signal = SIGKILL;
//   CAUSEWAY_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(o));
//   ... read child.stdout_fd() ...
//   CAUSEWAY_ASSIGN_OR_RETURN(int status, child.Wait(absl::Now() + absl::Seconds(5)));
#ifndef CAUSEWAY_BASE_SUBPROCESS_H_
#define CAUSEWAY_BASE_SUBPROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace causeway {

struct SpawnOptions {
  // argv[0] is the program: a path (with a slash), or a name looked up in
  // PATH; unless `program` names it, and argv[0] is only what the child
  // sees as its name.
  std::vector<std::string> argv;
  std::string program;
  // NAME=value settings the child gets on top of (replacing in) this
  // process's environment.
  std::vector<std::string> env;
  // Where the child's stdout and stderr go: "" inherits this process's; a
  // path is a file made (or truncated) there. stdin is /dev/null.
  std::string stdout_path;
  std::string stderr_path;
  // Or stdout into a pipe this process reads: Subprocess::stdout_fd.
  bool pipe_stdout = false;
  // The child leads a process group of its own, so that a signal to this
  // process's group (a terminal's ^C) does not reach it.
  bool new_process_group = false;
  // A signal the child gets when the thread that started it ends, which
  // includes this process ending in any way, a crash included
  // (PR_SET_PDEATHSIG); 0 for none. A child whose parent is already gone
  // when it starts exits at once.
  int death_signal = 0;
  // The child starts with no signal blocked (this process may block its
  // stop signals for a thread that waits for them), unless this says which
  // to keep blocked.
  sigset_t signal_mask = EmptySignalSet();

  static sigset_t EmptySignalSet() {
    sigset_t none;
    sigemptyset(&none);
    return none;
  }
};

// Move-only. Destroying a Subprocess that is still running kills it
// (SIGKILL) and reaps it.
class Subprocess {
 public:
  // Starts the child. Errors: NotFound naming a program that is not there
  // (or not executable), a file the output cannot go to, or the system's
  // refusal (fork, pipe), each naming what failed.
  static absl::StatusOr<Subprocess> Spawn(const SpawnOptions& options);

  Subprocess() = default;
  ~Subprocess();
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // -1 once reaped.
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // The read end of the child's stdout (pipe_stdout), owned here: -1
  // otherwise or once closed.
  int stdout_fd() const { return stdout_fd_; }
  void CloseStdout();
  // Gives the child up: from now on nothing here kills, waits for or reaps
  // it (its death signal, if any, still applies). Its pid, -1 if none.
  pid_t Release();
  // Sends `signal` (nothing once reaped).
  void Signal(int signal);
  // Reaps the child if it has ended by `deadline`: its wait status.
  // DeadlineExceeded while it still runs (it is left running).
  absl::StatusOr<int> Wait(absl::Time deadline = absl::InfiniteFuture());
  // SIGTERM (after SIGCONT, in case it is stopped), then waits; past
  // `grace`, SIGKILL. Its wait status.
  int Stop(absl::Duration grace = absl::InfiniteDuration());

 private:
  void Reset();
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
};

// "exit code N", "killed by signal N (NAME)[, core dumped]": a wait status
// in words.
std::string DescribeWaitStatus(int status);

}  // namespace causeway

#endif  // CAUSEWAY_BASE_SUBPROCESS_H_
