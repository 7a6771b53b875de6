// Shared test support: a runtime on lavapipe with the validation layer on,
// and a check that no test raised a validation error.
#ifndef CAUSEWAY_TESTS_TESTING_TEST_SUPPORT_H_
#define CAUSEWAY_TESTS_TESTING_TEST_SUPPORT_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace causeway::testing {

// The device tests run on: CAUSEWAY_TEST_DEVICE, else CAUSEWAY_DEVICE, else
// "cpu" (lavapipe). The GPU check runs the suite with CAUSEWAY_DEVICE=gpu.
std::string TestDevice();
// "--device=" + TestDevice(), for the island processes and CLI runs tests start.
std::string DeviceFlag();
// Whether tests turn the Vulkan validation layer on: yes unless
// CAUSEWAY_TEST_NO_VALIDATION is set (the sanitizer suites, whose code paths
// the plain suite has already run under validation).
bool TestValidation();
// "--validation" or "--validation=false" as TestValidation() says, for the
// island processes and CLI runs tests start.
std::string ValidationFlag();

// Where the causeway binary, the shipped data (data/) and the source tree
// (examples/, causeway/shaders/) are: where the build put them, unless
// CAUSEWAY_TEST_CLI, CAUSEWAY_TEST_DATA_DIR or CAUSEWAY_TEST_SOURCE_DIR say
// otherwise (a packed suite run on another machine, scripts/gpu-check.sh).
const char* CliPath();
const char* DataDir();
const char* SourceDir();

// Options for tests: validation as TestValidation(), TestDevice(), a private pipeline cache.
RuntimeOptions TestOptions(int accelerators = 1);

// Creates a runtime, or fails the test by throwing (gtest reports the
// status and goes on with the next test).
std::unique_ptr<Runtime> MakeRuntime(const RuntimeOptions& options);
inline std::unique_ptr<Runtime> MakeRuntime(int accelerators = 1) {
  return MakeRuntime(TestOptions(accelerators));
}

using ::causeway::reference::RandomFloats;

// A hostile kernel: it reads and writes through an address taken from its
// push constants (GL_EXT_buffer_reference), which reaches any memory of the
// process. Binding 0 is a storage buffer of uints; 8 bytes of push constants.
inline constexpr absl::string_view kPointerKernelGlsl = R"(#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 1) in;
layout(buffer_reference, std430) buffer Words { uint v[]; };
layout(push_constant) uniform Params { uint64_t address; };
layout(set = 0, binding = 0) buffer Out { uint out_v[]; };
void main() {
  Words w = Words(address);
  out_v[0] = w.v[0];
  w.v[1] = 7u;
}
)";

// A whole file's bytes ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// What a program run by RunProgram did.
struct ProgramResult {
  int exit_code = -1;  // 128 + the signal if one ended it
  std::string out, err;
};
// Runs `binary` with `args` (stdin from /dev/null, stdout and stderr
// captured through files) and waits for it to end.
ProgramResult RunProgram(const std::string& binary, const std::vector<std::string>& args);

// Entries of a directory: /proc/self/fd (open descriptors) or /proc/self/task
// (threads), for leak checks.
int CountEntries(const char* dir);
// Leak checks compare counts once they have settled, since a joined thread
// lingers in /proc/self/task for a moment and a closed peer's threads end on
// their own schedule (slower under sanitizers and load):
// CountEntries(dir) once it reads the same over `quiet` (for a baseline),
// giving up after `limit`.
// The value of `result`, or a std::runtime_error carrying its status, which
// gtest reports as a failure of the running test: for setup whose failure
// leaves nothing to test, in a test body or fixture (never on a thread of
// the test's own, where an exception ends the process).
template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) throw std::runtime_error(result.status().ToString());
  return *std::move(result);
}

// How late a thread may run past its deadline on a loaded machine under
// sanitizers (two suites at once on two cores at load 4 have descheduled a
// thread for over a second). A bound of deadline + kSchedulingSlack tells a
// deadline that was kept from one that was ignored, which would wait far
// longer or for ever; it is not a measure of precision.
inline constexpr absl::Duration kSchedulingSlack = absl::Seconds(5);

// A kernel that holds its accelerator until released: each workgroup runs
// up to `rounds` rounds (a push constant, at most kSpinMaxRounds: llvmpipe
// ends any loop after about 65535 iterations) of integer mixing that no
// compiler can fold, and stops early once word 0 of its output (binding 1)
// holds kSpinReleaseMagic, read atomically each round. How long a round
// takes depends on the machine (a fixed kernel took 1.5 s on one CPU and
// 0.4 s on another), so tests size it with SpinRoundsFor. A host write of the
// magic into the output (mapped on lavapipe) ends it within a round.
// Binding 0 is an unused input (one word).
inline constexpr uint32_t kSpinReleaseMagic = 0x600DF00Du;
inline constexpr uint32_t kSpinMaxRounds = 60000;
inline constexpr char kSpinGlsl[] = R"(#version 450
layout(local_size_x = 1) in;
layout(push_constant) uniform Params { uint rounds; };
layout(set = 0, binding = 0) readonly buffer In { uint unused; };
layout(set = 0, binding = 1) coherent buffer Out { uint words[]; };
void main() {
  uint x = gl_WorkGroupID.x + 1u;
  for (uint i = 0u; i < rounds && atomicOr(words[0], 0u) != 0x600DF00Du; ++i) {
    // Shifts, xors and multiplies: not an affine recurrence, so the loop
    // cannot be replaced by a closed form (an LCG was, and took no time).
    for (uint j = 0u; j < 64u; ++j) {
      x ^= x >> 13;
      x *= 0x5bd1e995u;
      x ^= x >> 15;
    }
  }
  words[1u + (gl_WorkGroupID.x & 63u)] = x;
}
)";
// The spin kernel's push constants for `rounds`.
std::vector<uint8_t> SpinPushConstants(uint32_t rounds);
// How many rounds make the spin kernel of `groups` workgroups take about
// `target` of CPU time on this machine's test device: measured on a runtime
// of its own (its fixed cost per workgroup and its cost per round, in the
// process's CPU time, which load from other processes does not inflate),
// clamped to 1..kSpinMaxRounds. Once per process and arguments. With one
// driver thread per queue (LP_NUM_THREADS=0) the kernel runs about `target`
// when the machine is idle and longer under load, never much shorter.
uint32_t SpinRoundsFor(uint32_t groups, absl::Duration target);

int SettledEntries(const char* dir, absl::Duration quiet = absl::Milliseconds(200),
                   absl::Duration limit = absl::Seconds(10));
// CountEntries(dir) once it equals `want`, or after `limit`: the count to
// compare with `want`.
int AwaitEntries(const char* dir, int want, absl::Duration limit = absl::Seconds(10));

// The calling thread's id, for AwaitThreadSleeping from another thread.
pid_t CurrentThreadId();
// Waits until thread `tid` of this process is asleep in the kernel (state S
// in /proc/self/task/<tid>/stat: blocked in a read, poll or futex), or until
// `limit`; true if it was seen asleep. A test reaches "the reader is blocked"
// this way rather than by sleeping and hoping.
bool AwaitThreadSleeping(pid_t tid, absl::Duration limit = absl::Seconds(10));

// Runs each body on a thread of its own and joins them. A body still running
// after `limit` is a deadlock: it is reported and the process ends at once,
// since a stuck thread can be neither joined nor abandoned safely.
void RunConcurrently(std::vector<std::function<void()>> bodies, absl::Duration limit, absl::string_view what);

}  // namespace causeway::testing

#define ASSERT_OK(expr)                                   \
  do {                                                    \
    const ::absl::Status assert_ok_status_ = (expr);      \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (0)
#define EXPECT_OK(expr)                                   \
  do {                                                    \
    const ::absl::Status expect_ok_status_ = (expr);      \
    EXPECT_TRUE(expect_ok_status_.ok()) << expect_ok_status_; \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                              \
  ASSERT_OK_AND_ASSIGN_IMPL_(CAUSEWAY_CONCAT_(assert_or_, __LINE__), lhs, rexpr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(var, lhs, rexpr)   \
  auto var = (rexpr);                                 \
  ASSERT_TRUE(var.ok()) << var.status();              \
  lhs = std::move(var).value()

namespace causeway::testing {
// The status of a Status or a StatusOr, for EXPECT_ERROR.
inline const ::absl::Status& StatusOf(const ::absl::Status& status) { return status; }
template <typename T>
const ::absl::Status& StatusOf(const ::absl::StatusOr<T>& status_or) {
  return status_or.status();
}
}  // namespace causeway::testing

// Expects `status` (a Status or a StatusOr) to have `code` and a message
// containing every one of the strings that follow.
#define EXPECT_ERROR(status, want_code, ...)                                                  \
  do {                                                                                        \
    const ::absl::Status expect_error_status_ = ::causeway::testing::StatusOf(status);       \
    EXPECT_EQ(expect_error_status_.code(), (want_code)) << expect_error_status_;              \
    for (const std::string& part : std::vector<std::string>{__VA_ARGS__}) {                   \
      EXPECT_THAT(std::string(expect_error_status_.message()), ::testing::HasSubstr(part));   \
    }                                                                                         \
  } while (0)

#endif  // CAUSEWAY_TESTS_TESTING_TEST_SUPPORT_H_
