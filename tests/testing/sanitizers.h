// Whether a test binary is built with a sanitizer (CAUSEWAY_ASAN or
// CAUSEWAY_TSAN), for the tests that repeat one host path many times over to
// check numerics: training steps, sweeps of shapes, layouts or seeds. They
// run fewer repeats under a sanitizer, every configuration still once: the
// sanitizers check the host code, which the first repeats already run, and
// each repeat costs 3 to 10 times what it costs in the plain suite, which
// runs them all.
#ifndef CAUSEWAY_TESTS_TESTING_SANITIZERS_H_
#define CAUSEWAY_TESTS_TESTING_SANITIZERS_H_

namespace causeway::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// `plain` repeats in the plain suite, `sanitized` under a sanitizer.
constexpr int Repeats(int plain, int sanitized) { return kSanitized ? sanitized : plain; }

// Whether case `index` (counted across a sweep's nested loops) runs: every
// case in the plain suite, every `stride`-th under a sanitizer. A stride
// coprime with the number of cases under each value of a loop takes every
// value in turn, so no value goes unvisited.
constexpr bool InSweep(int index, int stride) { return !kSanitized || index % stride == 0; }

}  // namespace causeway::testing

#endif  // CAUSEWAY_TESTS_TESTING_SANITIZERS_H_
