#include "tests/testing/test_support.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/base/subprocess.h"
#include "causeway/runtime/instance.h"
#include "causeway/runtime/kernel.h"

namespace causeway::testing {
namespace {

// Fails the running test if it raised a Vulkan validation error.
class ValidationListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { before_ = ValidationErrorCount(); }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    uint64_t after = ValidationErrorCount();
    if (after != before_) {
      ADD_FAILURE() << (after - before_) << " Vulkan validation error(s) in " << info.name()
                    << "; the last: " << LastValidationError();
    }
  }
  uint64_t before_ = 0;
};

// Fails a test that runs past its limit, before ctest's own timeout (300 s)
// would kill the process without a word: prints the test and every thread of
// the process with its name, state and the kernel function it waits in, then
// ends the process. The limit is CAUSEWAY_TEST_WATCHDOG_S (default 240 s).
// One thread for the whole binary, started before any test counts threads.
//
// Tests fork children that go on without exec (connection_test's servers,
// island_test's doomed parent), which is safe only if no other thread holds
// a lock the child needs, the allocator's above all. So the constructor
// returns only once the thread has started (its start-up allocates), and a
// fork waits until the thread is parked in its wait holding nothing.
class WatchdogListener : public ::testing::EmptyTestEventListener {
 public:
  WatchdogListener() : limit_(Limit()), thread_([this] { Watch(); }) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&watching_));
    }
    instance_.store(this);
    pthread_atfork(&BeforeFork, &AfterFork, &AfterFork);
  }
  ~WatchdogListener() override {
    instance_.store(nullptr);
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  void OnTestStart(const ::testing::TestInfo& info) override {
    absl::MutexLock lock(&mu_);
    test_ = absl::StrCat(info.test_suite_name(), ".", info.name());
    deadline_ = absl::Now() + limit_;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    absl::MutexLock lock(&mu_);
    deadline_ = absl::InfiniteFuture();
  }

 private:
  static absl::Duration Limit() {
    const char* env = std::getenv("CAUSEWAY_TEST_WATCHDOG_S");
    int seconds = 0;
    if (env != nullptr && absl::SimpleAtoi(env, &seconds) && seconds > 0) return absl::Seconds(seconds);
    return absl::Seconds(240);
  }

  // Every thread of this process: "tid name state wchan".
  static std::string Threads() {
    std::string out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      const std::string dir = e.path().string();
      std::string name = ReadFile(dir + "/comm"), stat = ReadFile(dir + "/stat"),
                  wchan = ReadFile(dir + "/wchan");
      if (!name.empty() && name.back() == '\n') name.pop_back();
      // stat: "tid (comm) S ...": the state follows the last ')'.
      const size_t paren = stat.rfind(')');
      const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
      absl::StrAppend(&out, "  thread ", e.path().filename().string(), " '", name, "' state ",
                      std::string(1, state), " waiting in ", wchan.empty() ? "?" : wchan, "\n");
    }
    return out;
  }

  // Held across fork(): the thread only runs with mu_ held, so it is waiting.
  static void BeforeFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (WatchdogListener* w = instance_.load(); w != nullptr) w->mu_.Lock();
  }
  static void AfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (WatchdogListener* w = instance_.load(); w != nullptr) w->mu_.Unlock();
  }

  void Watch() {
    absl::MutexLock lock(&mu_);
    watching_ = true;
    while (!stop_) {
      const absl::Time deadline = deadline_;
      mu_.AwaitWithDeadline(absl::Condition(&stop_), std::min(deadline, absl::Now() + absl::Seconds(1)));
      if (stop_ || absl::Now() < deadline_) continue;
      std::fprintf(stderr, "watchdog: %s still running after %s; a hang. Threads:\n%s", test_.c_str(),
                   absl::FormatDuration(limit_).c_str(), Threads().c_str());
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    }
  }

  const absl::Duration limit_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool watching_ ABSL_GUARDED_BY(mu_) = false;
  std::string test_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread thread_;  // last: starts once the rest is built
  static inline std::atomic<WatchdogListener*> instance_{nullptr};
};

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ProgramResult RunProgram(const std::string& binary, const std::vector<std::string>& args) {
  static std::atomic<int> count{0};
  const std::string base = absl::StrCat(::testing::TempDir(), "/run_", getpid(), "_", count++);
  SpawnOptions options;
  options.argv = {binary};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.stdout_path = base + ".out";
  options.stderr_path = base + ".err";
  ProgramResult r;
  absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
  if (!child.ok()) {
    r.err = std::string(child.status().message());
    return r;
  }
  absl::StatusOr<int> status = child->Wait();
  if (status.ok()) r.exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
  r.out = ReadFile(options.stdout_path);
  r.err = ReadFile(options.stderr_path);
  std::remove(options.stdout_path.c_str());
  std::remove(options.stderr_path.c_str());
  return r;
}

int CountEntries(const char* dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

int SettledEntries(const char* dir, absl::Duration quiet, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  int last = CountEntries(dir);
  absl::Time since = absl::Now();
  while (absl::Now() < deadline && absl::Now() - since < quiet) {
    absl::SleepFor(absl::Milliseconds(10));
    const int now = CountEntries(dir);
    if (now != last) last = now, since = absl::Now();
  }
  return last;
}

int AwaitEntries(const char* dir, int want, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  int now = CountEntries(dir);
  while (now != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    now = CountEntries(dir);
  }
  return now;
}

pid_t CurrentThreadId() { return gettid(); }

bool AwaitThreadSleeping(pid_t tid, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  const std::string path = absl::StrCat("/proc/self/task/", tid, "/stat");
  do {
    // "tid (comm) S ...": the state follows the last ')', since comm may hold one.
    const std::string stat = ReadFile(path);
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'S') return true;
    absl::SleepFor(absl::Milliseconds(1));
  } while (absl::Now() < deadline);
  return false;
}

std::string TestDevice() {
  for (const char* name : {"CAUSEWAY_TEST_DEVICE", "CAUSEWAY_DEVICE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && v[0] != '\0') return v;
  }
  return "cpu";
}

std::string DeviceFlag() { return absl::StrCat("--device=", TestDevice()); }

bool TestValidation() { return !EnvFlag("CAUSEWAY_TEST_NO_VALIDATION"); }

std::string ValidationFlag() { return TestValidation() ? "--validation" : "--validation=false"; }

namespace {
const char* EnvOr(const char* name, const char* built) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : built;
}
}  // namespace

const char* CliPath() { return EnvOr("CAUSEWAY_TEST_CLI", CAUSEWAY_BUILT_CLI); }
const char* DataDir() { return EnvOr("CAUSEWAY_TEST_DATA_DIR", CAUSEWAY_BUILT_DATA_DIR); }
const char* SourceDir() { return EnvOr("CAUSEWAY_TEST_SOURCE_DIR", CAUSEWAY_BUILT_SOURCE_DIR); }

RuntimeOptions TestOptions(int accelerators) {
  RuntimeOptions o;
  o.accelerators = accelerators;
  o.validation = TestValidation();
  o.device = TestDevice();
  o.pipeline_cache_dir = "-";
  return o;
}

std::unique_ptr<Runtime> MakeRuntime(const RuntimeOptions& options) {
  auto rt = Runtime::Create(options);
  // gtest fails the test that throws, with this message, and runs the next:
  // no test goes on to use a runtime that is not there.
  if (!rt.ok())
    throw std::runtime_error(absl::StrCat("no runtime on '", options.device, "': ", rt.status().ToString()));
  return std::move(rt).value();
}

void RunConcurrently(std::vector<std::function<void()>> bodies, absl::Duration limit, absl::string_view what) {
  absl::Mutex mu;
  size_t done = 0;
  std::vector<std::thread> threads;
  threads.reserve(bodies.size());
  for (auto& body : bodies) {
    threads.emplace_back([&mu, &done, &body] {
      body();
      absl::MutexLock lock(&mu);
      ++done;
    });
  }
  bool finished;
  {
    absl::MutexLock lock(&mu);
    auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == bodies.size(); };
    finished = mu.AwaitWithTimeout(absl::Condition(&all_done), limit);
  }
  if (!finished) {
    ADD_FAILURE() << what << ": threads still running after " << limit << "; a deadlock";
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  for (auto& t : threads) t.join();
}

std::vector<uint8_t> SpinPushConstants(uint32_t rounds) {
  std::vector<uint8_t> bytes(sizeof(rounds));
  std::memcpy(bytes.data(), &rounds, sizeof(rounds));
  return bytes;
}

namespace {

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

uint32_t SpinRoundsFor(uint32_t groups, absl::Duration target) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static auto* known = new std::map<std::pair<uint32_t, int64_t>, uint32_t>;
  absl::MutexLock lock(&mu);
  const auto key = std::make_pair(groups, absl::ToInt64Milliseconds(target));
  if (auto it = known->find(key); it != known->end()) return it->second;
  auto rt = MakeRuntime(1);
  if (rt == nullptr) return kSpinMaxRounds;
  Accelerator* acc = rt->accelerator(0);
  auto kernel = Kernel::FromGlsl("spin", kSpinGlsl);
  auto in = acc->CreateBuffer(4);
  auto out = acc->CreateBuffer(65 * 4);
  if (!kernel.ok() || !in.ok() || !out.ok()) return kSpinMaxRounds;
  constexpr uint32_t kProbeGroups = 256, kProbeRounds = 400;
  // The least of three runs of the probe with `rounds`, in seconds of this
  // process's CPU time: the driver's threads run the kernel, and CPU time
  // does not grow when other processes take the cores. Wall time did: a probe
  // measured while the suite loaded the machine chose a quarter of the
  // rounds, and the kernel then ran 1 s instead of 4 once the load passed.
  auto seconds = [&](uint32_t rounds) -> double {
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      auto list = acc->CreateCommandList("spin calibration");
      if (!list.ok() || !(*list)->Fill(*out, 0).ok() ||
          !(*list)->Dispatch(*kernel, {*in, *out}, SpinPushConstants(rounds), {kProbeGroups, 1, 1}).ok()) {
        return 0;
      }
      const double start = ProcessCpuSeconds();
      if (!acc->Submit(*list).Await().ok()) return 0;
      best = std::min(best, ProcessCpuSeconds() - start);
    }
    return best;
  };
  const double fixed = seconds(0) / kProbeGroups;  // per workgroup
  const double per_round = std::max(1e-9, seconds(kProbeRounds) / kProbeGroups - fixed) / kProbeRounds;
  const double rounds = (absl::ToDoubleSeconds(target) / groups - fixed) / per_round;
  const uint32_t chosen = static_cast<uint32_t>(std::clamp(std::ceil(rounds), 1.0, double{kSpinMaxRounds}));
  (*known)[key] = chosen;
  return chosen;
}

}  // namespace causeway::testing

int main(int argc, char** argv) {
#ifdef __SANITIZE_ADDRESS__
  // The Vulkan loader unloads the driver when the last instance goes; memory
  // still referenced from the driver's globals then shows up as a leak from
  // "<unknown module>" (128 bytes from lavapipe on Mesa 22.3). Keeping the
  // driver loaded for the life of the process keeps LeakSanitizer precise
  // about our own code instead of suppressing whole reports. Not when only
  // listing the cases (the build's test discovery, once per binary), which
  // starts no Vulkan: loading the driver and LLVM under ASan is most of
  // such a process's time.
  const bool listing = std::any_of(argv + 1, argv + argc, [](const char* arg) {
    return std::string_view(arg) == "--gtest_list_tests";
  });
  if (!listing) dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE);
#endif
#ifdef __SANITIZE_THREAD__
  // ThreadSanitizer starts a thread of its own with the process's first
  // thread; started here, it is there before any test counts threads.
  std::thread([] {}).join();
#endif
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new causeway::testing::ValidationListener());
  // Started before any test runs, so tests that count threads see it in
  // their baselines. Not under ThreadSanitizer: a child forked by a test
  // (connection_test's servers) may not start threads once its parent has
  // more than one, and that pass relies on ctest's timeout instead.
#ifndef __SANITIZE_THREAD__
  ::testing::UnitTest::GetInstance()->listeners().Append(new causeway::testing::WatchdogListener());
#endif
  return RUN_ALL_TESTS();
}
