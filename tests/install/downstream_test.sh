#!/usr/bin/env bash
# Installs a Causeway build tree into a fresh prefix, then configures, builds
# and runs tests/install/downstream against that prefix alone. Fails on the
# first step that fails, saying which. Registered with ctest as
# install.downstream_find_package (tests/install/CMakeLists.txt).
#
# usage: downstream_test.sh CMAKE BUILD_DIR CONFIG DOWNSTREAM_SRC WORK_DIR [CXX [PREFIX_PATH]]
#   CONFIG may be empty; PREFIX_PATH (colon-separated) is where the build tree
#   found its own dependencies, if not in the system paths.
# Set CAUSEWAY_KEEP_INSTALL_TEST=1 to keep the temporary directory.
set -euo pipefail

if [[ $# -lt 5 ]]; then
  echo "usage: $0 CMAKE BUILD_DIR CONFIG DOWNSTREAM_SRC WORK_DIR [CXX [PREFIX_PATH]]" >&2
  exit 2
fi
cmake=$1 build_dir=$2 config=$3 downstream_src=$4 work_dir=$5 cxx=${6:-} parent_prefix_path=${7:-}

step="setup"
trap 'rc=$?; if [[ $rc -ne 0 ]]; then echo "FAILED (exit $rc) at step: $step" >&2; fi' EXIT

mkdir -p "$work_dir"
tmp=$(mktemp -d "$work_dir/downstream_test.XXXXXX")
if [[ "${CAUSEWAY_KEEP_INSTALL_TEST:-0}" == 1 ]]; then
  echo "keeping $tmp"
else
  trap 'rc=$?; rm -rf "$tmp"; if [[ $rc -ne 0 ]]; then echo "FAILED (exit $rc) at step: $step" >&2; fi' EXIT
fi
prefix=$tmp/prefix

config_args=()
if [[ -n "$config" ]]; then config_args=(--config "$config"); fi

step="install $build_dir into $prefix"
echo "== $step"
"$cmake" --install "$build_dir" --prefix "$prefix" "${config_args[@]}"

step="check the installed package files"
echo "== $step"
for f in include/causeway/runtime/runtime.h include/causeway/runtime/ops.h \
         include/causeway/shaders/builtin_shaders.h include/causeway/transport/controller.h \
         include/causeway/transport/island.pb.h include/causeway/scheduler/program_def.pb.h; do
  [[ -f "$prefix/$f" ]] || { echo "missing $prefix/$f" >&2; exit 1; }
done
for name in CausewayConfig.cmake CausewayConfigVersion.cmake CausewayTargets.cmake libcauseway.a \
            libcauseway_shaders.a libcauseway_scheduler.a libcauseway_transport.a libcauseway_island.a; do
  [[ -n "$(find "$prefix" -name "$name" -print -quit)" ]] || { echo "no $name under $prefix" >&2; exit 1; }
done

step="configure the downstream project"
echo "== $step"
generator_args=()
if command -v ninja >/dev/null 2>&1; then generator_args=(-G Ninja); fi
configure_args=(-S "$downstream_src" -B "$tmp/build" "${generator_args[@]}"
                "-DCMAKE_PREFIX_PATH=$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if [[ -n "$config" ]]; then configure_args+=("-DCMAKE_BUILD_TYPE=$config"); fi
if [[ -n "$cxx" ]]; then configure_args+=("-DCMAKE_CXX_COMPILER=$cxx"); fi
# The dependencies (absl, glslang, ...) are searched for where the build tree
# found them; the cache variable (the prefix) is searched before this.
CMAKE_PREFIX_PATH="$parent_prefix_path${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}" \
  "$cmake" "${configure_args[@]}"

step="check that Causeway came from the temporary prefix"
causeway_dir=$(sed -n 's/^Causeway_DIR:[A-Z]*=//p' "$tmp/build/CMakeCache.txt")
echo "Causeway_DIR=$causeway_dir"
case "$causeway_dir" in
  "$prefix"/*) ;;
  *) echo "found Causeway at '$causeway_dir', not under $prefix" >&2; exit 1 ;;
esac

step="build the downstream project"
echo "== $step"
"$cmake" --build "$tmp/build" "${config_args[@]}"

export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
export CAUSEWAY_CACHE_DIR=$tmp/cache  # keep the pipeline cache out of $HOME
for program in downstream downstream_transport; do
  step="run the downstream program $program"
  echo "== $step"
  exe=$(find "$tmp/build" -type f -name "$program" -perm -u+x -print -quit)
  [[ -n "$exe" ]] || { echo "no $program executable under $tmp/build" >&2; exit 1; }
  "$exe"
done
step="done"
echo "== passed"
