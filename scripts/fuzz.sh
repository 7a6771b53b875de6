#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: wire_fuzzer, spirv_fuzzer,
# program_fuzzer, session_fuzzer) with clang in build-fuzz/ and runs each for
# FUZZ_SECONDS (default 60) from its seed corpus, with AddressSanitizer and UBSan. Prints
# the inputs each one ran. A crash fails the script; the input that caused it
# is kept in build-fuzz/crashes/TARGET/ (add it to the target's corpus as a
# regression input once fixed). Needs the Debian packages of scripts/test.sh
# and clang (installed here if missing).
#
#   bash scripts/fuzz.sh                 every target, 60 s each
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh spirv_fuzzer
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# clang, and compiler-rt for libFuzzer's and the sanitizers' runtimes.
if ! command -v clang++ >/dev/null || ! dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null |
    grep -q "install ok installed"; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev \
    >/dev/null
fi
BUILD_DIR=${BUILD_DIR:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(wire_fuzzer spirv_fuzzer program_fuzzer session_fuzzer)
# ccache (installed by install-deps.sh), as in scripts/build.sh: the
# libraries the targets link are rebuilt with clang on every fresh clone.
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1} CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
fi
cmake -S . -B "$BUILD_DIR" -G Ninja "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCAUSEWAY_FUZZ=ON -DCAUSEWAY_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${TARGETS[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
failed=0
for t in "${TARGETS[@]}"; do
  work="$BUILD_DIR/fuzz-corpus/$t"
  crashes="$BUILD_DIR/crashes/$t"
  mkdir -p "$work" "$crashes"
  log="$BUILD_DIR/fuzz-$t.log"
  # New inputs go to the scratch corpus; the seeds in the tree stay as they are.
  if "$BUILD_DIR/tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $t ran $runs inputs in ${SECONDS_EACH} s, no crash"
  else
    failed=1
    echo "fuzz: $t FAILED; its log: $log; the input: $crashes/"
    tail -40 "$log"
  fi
done
exit $failed
