#include "causeway/base/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "causeway/base/env.h"

extern char** environ;

namespace causeway {
namespace {

// The program `name` names: itself when it has a slash, else the first
// executable of that name on PATH.
absl::StatusOr<std::string> FindProgram(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("Spawn: no program named");
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot run ", name, ": ", strerror(errno)));
    }
    return name;
  }
  const std::string path = EnvValue("PATH").value_or("/usr/bin:/bin");
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("cannot run ", name, ": not found in PATH"));
}

// This process's environment with `settings` (NAME=value) set over it.
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& settings) {
  std::vector<std::string> env;
  absl::flat_hash_map<std::string, size_t> at;
  auto set = [&](const std::string& entry) {
    const std::string name = entry.substr(0, entry.find('='));
    auto [it, inserted] = at.try_emplace(name, env.size());
    if (inserted) {
      env.push_back(entry);
    } else {
      env[it->second] = entry;
    }
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) set(*e);
  for (const std::string& s : settings) set(s);
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void CloseIfOpen(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// In the child, between fork and exec: reports errno on `report` and ends.
[[noreturn]] void ChildFailed(int report) {
  const int e = errno;
  ssize_t ignored = write(report, &e, sizeof(e));
  (void)ignored;
  _exit(127);
}

}  // namespace

absl::StatusOr<Subprocess> Subprocess::Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Spawn: no program named");
  absl::StatusOr<std::string> program =
      FindProgram(options.program.empty() ? options.argv[0] : options.program);
  if (!program.ok()) return program.status();
  std::vector<std::string> argv_strings = options.argv;
  std::vector<std::string> env_strings = ChildEnvironment(options.env);
  std::vector<char*> argv = Pointers(argv_strings);
  std::vector<char*> envp = Pointers(env_strings);

  // Everything the child opens, opened here (close-on-exec; the child dups
  // them onto 0, 1 and 2).
  int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out = -1, err = -1, out_pipe[2] = {-1, -1}, report[2] = {-1, -1};
  auto cleanup = [&] {
    for (int* fd : {&in, &out, &err, &out_pipe[0], &out_pipe[1], &report[0], &report[1]}) CloseIfOpen(*fd);
  };
  auto open_output = [&](const std::string& path, int& fd) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
    return absl::OkStatus();
  };
  absl::Status opened = in < 0 ? absl::InternalError(absl::StrCat("open /dev/null: ", strerror(errno)))
                               : open_output(options.stdout_path, out);
  if (opened.ok()) opened = open_output(options.stderr_path, err);
  if (opened.ok() && options.pipe_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) {
    opened = absl::ResourceExhaustedError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (opened.ok() && pipe2(report, O_CLOEXEC) != 0) {
    opened = absl::ResourceExhaustedError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (!opened.ok()) {
    cleanup();
    return opened;
  }
  const int child_out = options.pipe_stdout ? out_pipe[1] : out;
  const char* path = program->c_str();

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    cleanup();
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(e)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    if (options.new_process_group && setpgid(0, 0) != 0) ChildFailed(report[1]);
    if (options.death_signal != 0) {
      if (prctl(PR_SET_PDEATHSIG, options.death_signal) != 0) ChildFailed(report[1]);
      if (getppid() != parent) _exit(126);  // the parent is gone already
    }
    if (dup2(in, STDIN_FILENO) < 0) ChildFailed(report[1]);
    if (child_out >= 0 && dup2(child_out, STDOUT_FILENO) < 0) ChildFailed(report[1]);
    if (err >= 0 && dup2(err, STDERR_FILENO) < 0) ChildFailed(report[1]);
    sigprocmask(SIG_SETMASK, &options.signal_mask, nullptr);
    execve(path, argv.data(), envp.data());
    ChildFailed(report[1]);
  }
  CloseIfOpen(report[1]);
  Subprocess child;
  child.pid_ = pid;
  child.stdout_fd_ = out_pipe[0];
  out_pipe[0] = -1;
  int child_errno = 0;
  ssize_t got;
  do {
    got = read(report[0], &child_errno, sizeof(child_errno));
  } while (got < 0 && errno == EINTR);
  cleanup();
  if (got == static_cast<ssize_t>(sizeof(child_errno))) {
    (void)child.Wait();
    return absl::InternalError(absl::StrCat("starting ", *program, ": ", strerror(child_errno)));
  }
  return child;  // end of file: exec closed the report pipe
}

Subprocess::~Subprocess() { Reset(); }

Subprocess::Subprocess(Subprocess&& other) noexcept : pid_(other.pid_), stdout_fd_(other.stdout_fd_) {
  other.pid_ = -1;
  other.stdout_fd_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Reset();
    pid_ = other.pid_;
    stdout_fd_ = other.stdout_fd_;
    other.pid_ = -1;
    other.stdout_fd_ = -1;
  }
  return *this;
}

void Subprocess::Reset() {
  CloseStdout();
  if (pid_ <= 0) return;  // reaped (kill(-1, ...) would signal every process)
  kill(pid_, SIGKILL);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

void Subprocess::CloseStdout() { CloseIfOpen(stdout_fd_); }

pid_t Subprocess::Release() {
  CloseStdout();
  const pid_t pid = pid_;
  pid_ = -1;
  return pid;
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  if (pid_ <= 0) return absl::FailedPreconditionError("Wait: the process was reaped already");
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid_, &status, deadline == absl::InfiniteFuture() ? 0 : WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    if (r < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
    if (r == 0) {
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("process ", pid_, " is still running"));
      }
      absl::SleepFor(std::min(absl::Milliseconds(10), deadline - now));
    }
  }
}

int Subprocess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGCONT);
  kill(pid_, SIGTERM);
  absl::StatusOr<int> status =
      Wait(grace == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + grace);
  if (status.ok()) return *status;
  kill(pid_, SIGKILL);
  status = Wait();
  return status.ok() ? *status : -1;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")",
                        WCOREDUMP(status) ? ", core dumped" : "");
  }
  return "ended abnormally";
}

}  // namespace causeway
