#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite on lavapipe
# with the Vulkan validation layer on (a validation error fails the test).
#
#   bash scripts/test.sh           the suite
#   bash scripts/test.sh --asan    the suite built with AddressSanitizer and
#                                  UndefinedBehaviorSanitizer (in build-asan/);
#                                  the tests that move memory run with every
#                                  accelerator on one VkDevice (as --one-device)
#   bash scripts/test.sh --tsan    the suite built with ThreadSanitizer (in
#                                  build-tsan/); a race fails the test
#   bash scripts/test.sh --one-device
#                                  the tests that move memory (label
#                                  moves-memory) with every accelerator on
#                                  one VkDevice, in the plain build
# Further arguments select tests as ctest's do (-R, -E, -L, -LE: they go to
# scripts/run-tests.py, which asks ctest for the selection).
#
# Every suite runs several cases to a process (scripts/run-tests.py): a
# process costs a fraction of a second before its first case begins (a Vulkan
# instance, the validation layer; about a second under a sanitizer), which
# one process per case spent over and over. A crash fails its case and the
# rest go on in a new process; a failure is never retried. Each build keeps
# its cases' times (test-costs.json) so that the longest work starts first,
# and the sanitizer suites, built fresh, order theirs by the plain build's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# Sanitizer builds: -O1 as the sanitizers advise, and line tables only
# (reports still name file:line), which builds much faster than full -g.
# The runner, two processes at a time (the suite's timing margins are set
# for two busy cores). Its cases' times are kept in the build; a case this
# build has not timed yet takes the plain build's time, or else the time in
# tests/test-costs.json (the plain suite's on a 2-core machine, for a fresh
# checkout; only the order of the work depends on it).
run_tests() {
  local dir=$1
  shift
  python3 scripts/run-tests.py "$dir" -j 2 --costs "$dir/test-costs.json" --costs-from tests/test-costs.json \
    --costs-from build/test-costs.json "$@"
}
SANITIZER_FLAGS=(-DCAUSEWAY_BUILD_BENCHMARKS=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
if [ "${1:-}" = "--asan" ]; then
  shift
  export BUILD_DIR=${BUILD_DIR:-build-asan}
  bash scripts/build.sh -DCAUSEWAY_ASAN=ON "${SANITIZER_FLAGS[@]}"
  # UBSan reports and goes on by default, so a report would pass its test:
  # halting makes undefined behaviour fail the test that reached it.
  export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
  # The downstream-install test links an uninstrumented program against the
  # instrumented library; it runs in the plain suite. The tests that move
  # memory run here with their queues on one VkDevice (waiting on each
  # other's timelines directly): the plain and TSan suites run them with a
  # VkDevice each, so each way runs once under a sanitizer, and CI needs no
  # separate pass for it.
  # The validation layer is off in the first pass: the plain suite has run
  # every test's Vulkan calls under it, and it costs a sanitized process about
  # half a second to start. The one-device pass, which only runs here, keeps
  # it.
  CAUSEWAY_TEST_NO_VALIDATION=1 run_tests "$BUILD_DIR" -E '^install\.' -LE moves-memory "$@"
  CAUSEWAY_SHARING=one-device run_tests "$BUILD_DIR" -L moves-memory "$@"
elif [ "${1:-}" = "--tsan" ]; then
  shift
  export BUILD_DIR=${BUILD_DIR:-build-tsan}
  bash scripts/build.sh -DCAUSEWAY_TSAN=ON "${SANITIZER_FLAGS[@]}"
  # What is suppressed, and why, is written in the file.
  export TSAN_OPTIONS="suppressions=$PWD/scripts/tsan.supp halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
  # The weighted-share tests measure each client's share of device time
  # (within 30% of its weight's share); TSan slows the dispatching threads
  # several times over and not evenly, so those shares say nothing about the
  # scheduler there. They run in the plain and ASan suites.
  #
  # Bulk tests run here neither: their cost is data volume (copies up to
  # 64 MiB, kernels past one grid pass, collectives and attention over many
  # sizes against CPU references, transformer training and layouts), which
  # TSan slows tenfold, while the threads they pass through (queues, relays,
  # copy engine, islands, collectives in flight) are raced by the smaller
  # tests that do run here. They run in the plain and ASan suites.
  BULK='^CopyTest\.[A-Za-z]+MovesExactBytes$|^KernelsTest\.(CombineBeyondTheBindingLimit|FillAndCopyBeyondOneGridPass)$'
  BULK+='|^CollectiveTest\.[A-Za-z]+MatchesCpu$|^CollectiveMesh2DTest\.[A-Za-z]+OverEachAxis$'
  # (Parameterized cases' names have a prefix, a /suffix and their parameter.)
  BULK+='|^([A-Za-z]+/)?Attention(Plan)?[A-Za-z]*Test\.[A-Za-z]*(Reference|References)(/.*)?$'
  BULK+='|^TransformerTest\.([A-Za-z]+Follows?OneAccelerator|LossFallsOnTheCorpus|GradientMatchesFiniteDifferences'
  BULK+='|[A-Za-z]+MatchesCpuReference)$'
  BULK+='|^CrossIslandTest\.PipelineMatchesReferenceForEveryLayout$'
  BULK+='|^TwoIslandsTest\.DataParallelAcrossIslandsFollowsOneAccelerator$'
  # The validation layer is off, as in the ASan suite's first pass.
  CAUSEWAY_TEST_NO_VALIDATION=1 run_tests "$BUILD_DIR" -E "^install\\.|WeightedShares|$BULK" "$@"
elif [ "${1:-}" = "--one-device" ]; then
  shift
  bash scripts/build.sh
  # Queues of one VkDevice wait on each other's timelines directly, not
  # through host relays (sharing in causeway/runtime/runtime.h).
  CAUSEWAY_SHARING=one-device run_tests "${BUILD_DIR:-build}" -L moves-memory "$@"
else
  bash scripts/build.sh
  run_tests "${BUILD_DIR:-build}" "$@"
fi
