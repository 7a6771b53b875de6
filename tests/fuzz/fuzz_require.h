// What every fuzz target does when an input breaks a parser's contract:
// say which contract, then abort, so that libFuzzer keeps the input.
#ifndef CAUSEWAY_TESTS_FUZZ_FUZZ_REQUIRE_H_
#define CAUSEWAY_TESTS_FUZZ_FUZZ_REQUIRE_H_

#include <cstdio>
#include <cstdlib>

namespace causeway::fuzz {

// Aborts with "TARGET: WHAT" unless `condition`.
inline void Require(bool condition, const char* target, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "%s: %s\n", target, what);
    std::abort();
  }
}

}  // namespace causeway::fuzz

#endif  // CAUSEWAY_TESTS_FUZZ_FUZZ_REQUIRE_H_
