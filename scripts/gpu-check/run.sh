#!/usr/bin/env bash
# Runs the GPU check from a folder packed by scripts/gpu-check.sh, on a machine
# with a Vulkan GPU driver: the devices Causeway sees, the test suite against
# the GPU (CAUSEWAY_DEVICE=gpu, less tests.exclude), the dispatch, scheduler,
# ICI and matmul benchmarks in quick mode, and 50 steps of the demo. Writes
# REPORT_DIR/report.md (default: report/ beside this script) with the logs
# beside it; exits non-zero when a step failed.
#
#   run.sh [REPORT_DIR]
#   CAUSEWAY_DEVICE=1 run.sh            # another device than the first GPU
#   GPU_CHECK_JOBS=4 run.sh             # test binaries run at once (default: cores / 2)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPORT=${1:-$HERE/report}
mkdir -p "$REPORT"
REPORT=$(cd "$REPORT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/causeway-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if command -v xz >/dev/null; then
  xz -dc "$HERE/payload.tar.xz" | tar -C "$WORK" -xf -
else
  LD_LIBRARY_PATH="$HERE/xz" "$HERE/xz/xz" -dc "$HERE/payload.tar.xz" | tar -C "$WORK" -xf -
fi

export CAUSEWAY_DEVICE=${CAUSEWAY_DEVICE:-gpu}
export LD_LIBRARY_PATH="$WORK/lib:/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VK_LAYER_PATH="$WORK/layers"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$WORK}
export CAUSEWAY_TEST_CLI="$WORK/bin/causeway" CAUSEWAY_TEST_DATA_DIR="$WORK/src/data"
export CAUSEWAY_TEST_SOURCE_DIR="$WORK/src" CAUSEWAY_BENCH_DIR="$WORK/bin"
export CAUSEWAY_CORPUS="$WORK/src/data/kjv-genesis-exodus.txt"
# The loader finds drivers in its usual folders; NVIDIA's container images
# keep the manifest under /usr/local/nvidia, which it does not search.
if [[ -z ${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-} ]]; then
  for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    compgen -G "$d/*.json" >/dev/null && break
    d=
  done
  if [[ -z $d ]]; then
    manifests=$(ls /usr/local/nvidia/share/vulkan/icd.d/*.json /usr/local/nvidia/etc/vulkan/icd.d/*.json 2>/dev/null | paste -sd:)
    [[ -n $manifests ]] && export VK_DRIVER_FILES=$manifests VK_ICD_FILENAMES=$manifests
  fi
fi
# libglvnd finds NVIDIA's EGL vendor library by a manifest, kept beside it there.
if [[ -z ${__EGL_VENDOR_LIBRARY_FILENAMES:-} ]] && ! compgen -G "/usr/share/glvnd/egl_vendor.d/*.json" >/dev/null; then
  vendors=$(ls /usr/local/nvidia/share/glvnd/egl_vendor.d/*.json 2>/dev/null | paste -sd:)
  [[ -n $vendors ]] && export __EGL_VENDOR_LIBRARY_FILENAMES=$vendors
fi
CLI="$WORK/bin/causeway"
STATUS=0
{
  echo "# Causeway GPU check"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), CAUSEWAY_DEVICE=$CAUSEWAY_DEVICE, $(nproc) cores, $(uname -sr)"
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/GPU: /'
} >"$REPORT/report.md"
section() { printf '\n## %s\n\n' "$1" >>"$REPORT/report.md"; }
block() { { echo '```'; cat; echo '```'; } >>"$REPORT/report.md"; }
elapsed() { echo "$(($(date +%s) - $1)) s"; }

section "causeway devices"
if ! "$CLI" devices >"$WORK/devices.txt" 2>&1; then
  STATUS=1
  # Say why the loader found no device.
  VK_LOADER_DEBUG=error,warn,driver "$CLI" devices >>"$WORK/devices.txt" 2>&1
fi
block <"$WORK/devices.txt"

# The suite: each test binary whole, less the tests that need lavapipe itself.
section "Tests (CAUSEWAY_DEVICE=$CAUSEWAY_DEVICE)"
filter=$(grep -v '^\s*#' "$HERE/tests.exclude" | awk 'NF {print $1}' | paste -sd:)
jobs=${GPU_CHECK_JOBS:-$(($(nproc) / 2 > 1 ? $(nproc) / 2 : 1))}
start=$(date +%s)
mkdir -p "$WORK/logs"
ls "$WORK/tests" | xargs -P "$jobs" -I{} sh -c \
  'mkdir -p "$5/$3.d" && cd "$5/$3.d" && timeout -k 10 240 "$2/tests/$3" --gtest_brief=1 --gtest_filter="-$4" >"$5/$3.log" 2>&1; echo $? >"$5/$3.rc"' \
  _ "$WORK" "$WORK" {} "$filter" "$WORK/logs"
passed=0
failed_binaries=()
for rc in "$WORK"/logs/*.rc; do
  name=$(basename "$rc" .rc)
  if [[ $(cat "$rc") == 0 ]]; then passed=$((passed + 1)); else failed_binaries+=("$name (exit $(cat "$rc"))"); fi
done
tests_run=$(cat "$WORK"/logs/*.log | grep -o '^\[==========\] [0-9]* tests\? from' | awk '{s += $2} END {print s + 0}')
{
  echo "$tests_run tests in $(ls "$WORK/tests" | wc -l) binaries, $passed binaries passed, $(elapsed "$start")."
  echo "Left out (tests.exclude): $(echo "$filter" | tr ':' ' ')"
  if ((${#failed_binaries[@]})); then
    STATUS=1
    echo
    echo "Failed: ${failed_binaries[*]}"
    echo
    echo '```'
    grep -h '^\[  FAILED  \]' "$WORK"/logs/*.log | sort -u
    echo '```'
  fi
} >>"$REPORT/report.md"
for log in "$WORK"/logs/*.log; do
  printf '===== %s (exit %s)\n' "$(basename "$log" .log)" "$(cat "${log%.log}.rc")"
  cat "$log"
done >"$REPORT/tests.log"

section "Benchmarks (quick: sizes and samples for a check, not for figures)"
start=$(date +%s)
timeout -k 10 150 "$CLI" bench --quick --only dispatch,scheduler,ici,matmul --out "$WORK/bench" >"$REPORT/bench.log" 2>&1 ||
  STATUS=1
block <"$REPORT/bench.log"
[[ -f $WORK/bench/BENCHMARKS.md ]] && cp "$WORK/bench/BENCHMARKS.md" "$REPORT/"
[[ -f $WORK/bench/results.json ]] && cp "$WORK/bench/results.json" "$REPORT/"
echo "$(elapsed "$start")" >>"$REPORT/report.md"

section "Demo: causeway train --steps 50"
start=$(date +%s)
(cd "$WORK" && timeout -k 10 90 "$CLI" train --steps 50 --corpus "$WORK/src/data/kjv-genesis-exodus.txt" \
  --trace "$WORK/train.trace.json") >"$REPORT/train.log" 2>&1 || STATUS=1
tail -n 12 "$REPORT/train.log" | block
echo "$(elapsed "$start")" >>"$REPORT/report.md"

echo >>"$REPORT/report.md"
((STATUS == 0)) && echo "All steps passed." >>"$REPORT/report.md" || echo "Some steps FAILED." >>"$REPORT/report.md"
cat "$REPORT/report.md"
exit $STATUS
