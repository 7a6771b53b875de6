// Child processes: arguments, environment and output reach the child; a
// program that cannot run is an error naming it; death signals, deadlines,
// stopping and the destructor end what they should.
#include "causeway/base/subprocess.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Everything the child writes to its stdout pipe, until it closes it.
std::string ReadAll(Subprocess& child) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(child.stdout_fd(), buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out.append(buf, n);
  }
  return out;
}

absl::StatusOr<Subprocess> Shell(const std::string& script, SpawnOptions options = {}) {
  options.argv = {"sh", "-c", script, "zero", "one two"};
  options.pipe_stdout = true;
  return Subprocess::Spawn(options);
}

// Tests that the arguments (one with a space), the settings given on top of
// this environment (replacing one of the same name) and this environment's
// others reach the child, and that its exit code comes back.
TEST(SubprocessTest, ArgumentsEnvironmentAndExitCode) {
  setenv("CAUSEWAY_SPAWN_KEPT", "kept", 1);
  setenv("CAUSEWAY_SPAWN_SET", "outer", 1);
  SpawnOptions o;
  o.env = {"CAUSEWAY_SPAWN_SET=inner", "CAUSEWAY_SPAWN_NEW=new"};
  ASSERT_OK_AND_ASSIGN(
      Subprocess child,
      Shell("printf '%s|%s|%s|%s|%s|' \"$0\" \"$1\" \"$CAUSEWAY_SPAWN_KEPT\" \"$CAUSEWAY_SPAWN_SET\" "
            "\"$CAUSEWAY_SPAWN_NEW\"; env | grep -c '^CAUSEWAY_SPAWN_SET='; exit 7",
            o));
  // The setting replaced the variable of the same name: it is there once.
  EXPECT_EQ(ReadAll(child), "zero|one two|kept|inner|new|1\n");
  ASSERT_OK_AND_ASSIGN(int status, child.Wait());
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
  EXPECT_EQ(DescribeWaitStatus(status), "exit code 7");
  EXPECT_FALSE(child.running());
  EXPECT_EQ(child.Wait().status().code(), absl::StatusCode::kFailedPrecondition);
  unsetenv("CAUSEWAY_SPAWN_KEPT");
  unsetenv("CAUSEWAY_SPAWN_SET");
}

// Tests that stdout and stderr go to the files named (truncated first) and
// stdin reads as empty.
TEST(SubprocessTest, OutputToFiles) {
  const std::string out = ::testing::TempDir() + "/subprocess_test.out";
  const std::string err = ::testing::TempDir() + "/subprocess_test.err";
  std::ofstream(out) << "old contents that must go";
  SpawnOptions o;
  o.argv = {"sh", "-c", "echo to-out; echo to-err >&2; cat"};
  o.stdout_path = out;
  o.stderr_path = err;
  ASSERT_OK_AND_ASSIGN(Subprocess child, Subprocess::Spawn(o));
  ASSERT_OK_AND_ASSIGN(int status, child.Wait(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(DescribeWaitStatus(status), "exit code 0");
  EXPECT_EQ(::causeway::testing::ReadFile(out), "to-out\n");
  EXPECT_EQ(::causeway::testing::ReadFile(err), "to-err\n");
}

// Tests that a program that is not there, one that is not executable, one
// that exec refuses after the fork (a directory), and output that cannot be
// written are errors naming what failed.
TEST(SubprocessTest, WhatCannotRunIsAnErrorNamingIt) {
  SpawnOptions o;
  o.argv = {"causeway-no-such-program"};
  EXPECT_ERROR(Subprocess::Spawn(o).status(), absl::StatusCode::kNotFound,
               "cannot run causeway-no-such-program: not found in PATH");
  const std::string plain = ::testing::TempDir() + "/subprocess_test_not_executable";
  std::ofstream(plain) << "#!/bin/sh\n";
  chmod(plain.c_str(), 0644);
  o.argv = {plain};
  EXPECT_ERROR(Subprocess::Spawn(o).status(), absl::StatusCode::kNotFound, "cannot run " + plain);
  o.argv = {"/tmp"};  // executable as a directory is, but not a program
  EXPECT_ERROR(Subprocess::Spawn(o).status(), absl::StatusCode::kInternal, "starting /tmp: ");
  o.argv = {"true"};
  o.stdout_path = "/nonexistent-dir/out";
  EXPECT_ERROR(Subprocess::Spawn(o).status(), absl::StatusCode::kNotFound,
               "cannot write /nonexistent-dir/out");
  o = {};
  EXPECT_EQ(Subprocess::Spawn(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// Tests that `program` runs while argv[0] is only the child's name.
TEST(SubprocessTest, ProgramApartFromItsName) {
  SpawnOptions o;
  o.program = "/bin/sh";
  o.argv = {"not-a-program", "-c", "printf %s \"$0\""};
  o.pipe_stdout = true;
  ASSERT_OK_AND_ASSIGN(Subprocess child, Subprocess::Spawn(o));
  EXPECT_EQ(ReadAll(child), "not-a-program");
  ASSERT_OK_AND_ASSIGN(int status, child.Wait());
  EXPECT_EQ(DescribeWaitStatus(status), "exit code 0");
}

// Tests that the child starts with no signal blocked even where the thread
// that starts it blocks some, unless asked to keep a mask.
TEST(SubprocessTest, SignalMaskIsClearedUnlessGiven) {
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, &old);
  // grep itself reads its mask (a shell would clear its own at start).
  SpawnOptions o;
  o.argv = {"grep", "SigBlk", "/proc/self/status"};
  o.pipe_stdout = true;
  ASSERT_OK_AND_ASSIGN(Subprocess cleared, Subprocess::Spawn(o));
  EXPECT_EQ(ReadAll(cleared), "SigBlk:\t0000000000000000\n");
  o.signal_mask = usr1;
  ASSERT_OK_AND_ASSIGN(Subprocess kept, Subprocess::Spawn(o));
  EXPECT_EQ(ReadAll(kept), "SigBlk:\t0000000000000200\n");  // bit 10 - 1: SIGUSR1
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

// Tests that Wait by a deadline leaves a running child running, and Stop
// ends it with SIGTERM; and that new_process_group makes it a group leader.
TEST(SubprocessTest, WaitByADeadlineThenStop) {
  SpawnOptions o;
  o.argv = {"sleep", "60"};
  o.new_process_group = true;
  ASSERT_OK_AND_ASSIGN(Subprocess child, Subprocess::Spawn(o));
  EXPECT_EQ(getpgid(child.pid()), child.pid());  // a group of its own
  const absl::Time start = absl::Now();
  EXPECT_EQ(child.Wait(start + absl::Milliseconds(50)).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(child.Wait(absl::InfinitePast()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(child.running());
  const int status = child.Stop(absl::Seconds(30));
  EXPECT_EQ(DescribeWaitStatus(status),
            absl::StrCat("killed by signal ", SIGTERM, " (", strsignal(SIGTERM), ")"));
  EXPECT_FALSE(child.running());
}

// Tests that a child with a death signal dies with the thread that started
// it, and that destroying a Subprocess kills and reaps its child.
TEST(SubprocessTest, DeathSignalAndDestructorEndTheChild) {
  pid_t orphan = -1;
  std::thread starter([&orphan] {
    SpawnOptions o;
    o.argv = {"sleep", "60"};
    o.death_signal = SIGKILL;
    absl::StatusOr<Subprocess> child = Subprocess::Spawn(o);
    if (!child.ok()) return;
    // Given up, so that its destructor does not kill it: the death signal
    // must, as this thread ends.
    orphan = child->Release();
    EXPECT_FALSE(child->running());
  });
  starter.join();
  ASSERT_GT(orphan, 0);
  int status = 0;
  ASSERT_EQ(waitpid(orphan, &status, 0), orphan);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << DescribeWaitStatus(status);

  pid_t pid = -1;
  {
    SpawnOptions o;
    o.argv = {"sleep", "60"};
    ASSERT_OK_AND_ASSIGN(Subprocess child, Subprocess::Spawn(o));
    pid = child.pid();
    Subprocess moved = std::move(child);  // the moved-from one owns nothing
    EXPECT_FALSE(child.running());        // NOLINT(bugprone-use-after-move): on purpose
    EXPECT_EQ(moved.pid(), pid);
  }
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);  // killed and reaped
}

}  // namespace
}  // namespace causeway
