#include "tests/testing/test_support.h"

#include <cstdlib>

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

}  // namespace causeway::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new causeway::testing::ValidationListener());
  return RUN_ALL_TESTS();
}
