#include "tests/testing/test_support.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "runtime/instance.h"
#include "runtime/status.h"

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

}  // namespace

int CountEntries(const char* dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

RuntimeOptions TestOptions(int accelerators) {
  RuntimeOptions o;
  o.accelerators = accelerators;
  o.validation = !EnvFlag("CAUSEWAY_TEST_NO_VALIDATION");
  const char* dev = std::getenv("CAUSEWAY_TEST_DEVICE");
  o.device = dev != nullptr ? dev : "cpu";
  o.pipeline_cache_dir = "-";
  return o;
}

std::unique_ptr<Runtime> MakeRuntime(const RuntimeOptions& options) {
  auto rt = Runtime::Create(options);
  EXPECT_TRUE(rt.ok()) << rt.status();
  return rt.ok() ? std::move(rt).value() : nullptr;
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

}  // namespace causeway::testing

int main(int argc, char** argv) {
#ifdef __SANITIZE_ADDRESS__
  // The Vulkan loader unloads the driver when the last instance goes; memory
  // still referenced from the driver's globals then shows up as a leak from
  // "<unknown module>" (128 bytes from lavapipe on Mesa 22.3). Keeping the
  // driver loaded for the life of the process keeps LeakSanitizer precise
  // about our own code instead of suppressing whole reports.
  dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE);
#endif
#ifdef __SANITIZE_THREAD__
  // ThreadSanitizer starts a thread of its own with the process's first
  // thread; started here, it is there before any test counts threads.
  std::thread([] {}).join();
#endif
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new causeway::testing::ValidationListener());
  return RUN_ALL_TESTS();
}
