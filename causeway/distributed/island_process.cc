#include "causeway/distributed/island_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace causeway::transport {

absl::StatusOr<std::unique_ptr<IslandProcess>> IslandProcess::Start(const std::string& binary,
                                                                    const std::string& name,
                                                                    const std::vector<std::string>& args,
                                                                    const std::vector<std::string>& env,
                                                                    absl::Duration timeout) {
  std::vector<std::string> argv_strings = {binary, "island", "--listen=127.0.0.1:0"};
  if (!name.empty()) argv_strings.push_back("--name=" + name);
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = env;
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return absl::ResourceExhaustedError("fork failed");
  }
  if (pid == 0) {
    // An island must not outlive a parent that crashed or was killed (its
    // destructor never ran): it dies with the thread that started it.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
    // No signal blocked: the parent may block its stop signals for a thread
    // that waits for them (causeway's commands do).
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    for (auto& e : env_strings) putenv(e.data());
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  std::unique_ptr<IslandProcess> p(new IslandProcess());
  p->pid_ = pid;
  std::string line;
  const absl::Time deadline = absl::Now() + timeout;
  while (line.find('\n') == std::string::npos && absl::Now() < deadline) {
    pollfd pfd{out[0], POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char buf[256];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, n);
  }
  close(out[0]);
  std::vector<std::string> words = absl::StrSplit(line.substr(0, line.find('\n')), ' ');
  if (words.size() != 3 || words[0] != "island") {
    return absl::UnavailableError(
        absl::StrCat(name.empty() ? "an unnamed island" : absl::StrCat("island '", name, "'"), " (", binary,
                     ") did not start: it printed '", line, "'"));
  }
  p->name_ = words[1];
  p->address_ = words[2];
  return p;
}

IslandProcess::~IslandProcess() {
  if (pid_ <= 0) return;  // reaped (kill(-1, ...) would signal every process)
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

void IslandProcess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

int IslandProcess::Stop(absl::Duration limit) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGCONT);
  kill(pid_, SIGTERM);
  int status = 0;
  bool reaped = false;
  const absl::Time until = absl::Now() + limit;
  while (limit != absl::InfiniteDuration() && !reaped) {
    reaped = waitpid(pid_, &status, WNOHANG) == pid_;
    if (reaped) break;
    if (absl::Now() >= until) {
      kill(pid_, SIGKILL);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (!reaped) waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

}  // namespace causeway::transport
