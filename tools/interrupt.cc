#include "tools/interrupt.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/watchdog.h"

namespace causeway::cli {
namespace {

ABSL_CONST_INIT absl::Mutex g_hook_mu(absl::kConstInit);
std::function<void()>* g_hook ABSL_GUARDED_BY(g_hook_mu) = nullptr;

// How long the report and the hook may take before the process leaves
// without them.
constexpr absl::Duration kLeaveWithin = absl::Milliseconds(1500);

[[noreturn]] void Leave(int signal) {
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(128 + signal);
}

}  // namespace

void SetInterruptHook(std::function<void()> hook) {
  absl::MutexLock lock(&g_hook_mu);
  delete g_hook;
  g_hook = hook ? new std::function<void()>(std::move(hook)) : nullptr;
}

void StopOnSignals(std::string command) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals, command = std::move(command)] {
    int signal = 0;
    while (sigwait(&signals, &signal) != 0) {
    }
    // Whatever the report below meets (a lock held by a thread stuck in a
    // driver), the process leaves in time.
    std::thread([signal] {
      absl::SleepFor(kLeaveWithin);
      Leave(signal);
    }).detach();
    std::string running;
    ForEachAccelerator([&running](Accelerator& a) {
      if (std::optional<WorkInFlight> work = a.OldestInFlight()) {
        absl::StrAppend(&running, "  ", a.name(), ": ", DescribeWorkInFlight(*work), "\n");
      }
    });
    std::fprintf(stderr, "causeway %s: stopped by %s; %s", command.c_str(), strsignal(signal),
                 running.empty() ? "no accelerator had work in flight\n"
                                 : absl::StrCat("work in flight, abandoned:\n", running).c_str());
    {
      absl::MutexLock lock(&g_hook_mu);
      if (g_hook != nullptr) (*g_hook)();
    }
    Leave(signal);
  }).detach();
}

}  // namespace causeway::cli
