#!/usr/bin/env bash
# Installs a Causeway build tree into a fresh prefix, then configures, builds
# and runs tests/install/downstream against that prefix alone. Fails on the
# first step that fails, saying which. Registered with ctest as
# install.downstream_find_package (tests/install/CMakeLists.txt).
#
# usage: downstream_test.sh CMAKE BUILD_DIR CONFIG DOWNSTREAM_SRC WORK_DIR [CXX [PREFIX_PATH [EXAMPLES_SRC
#                            [PYTHON PYTHON_DIR]]]]
#   CONFIG may be empty; PREFIX_PATH (colon-separated) is where the build tree
#   found its own dependencies, if not in the system paths. EXAMPLES_SRC
#   (examples/cpp) is built and run against the same prefix, each program
#   checking its own result. PYTHON, where the Python package is built,
#   imports the installed package from PYTHON_DIR (under the prefix) and
#   runs a program with it.
# Set CAUSEWAY_KEEP_INSTALL_TEST=1 to keep the temporary directory.
set -euo pipefail

if [[ $# -lt 5 ]]; then
  echo "usage: $0 CMAKE BUILD_DIR CONFIG DOWNSTREAM_SRC WORK_DIR [CXX [PREFIX_PATH [EXAMPLES_SRC]]]" >&2
  exit 2
fi
cmake=$1 build_dir=$2 config=$3 downstream_src=$4 work_dir=$5 cxx=${6:-} parent_prefix_path=${7:-} examples_src=${8:-}
python=${9:-} python_dir=${10:-}

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
for f in include/causeway/causeway.h include/causeway/base/status.h include/causeway/runtime/runtime.h \
         include/causeway/kernels/ops.h include/causeway/shaders/builtin_shaders.h \
         include/causeway/distributed/controller.h include/causeway/distributed/island.pb.h \
         include/causeway/transport/control.pb.h include/causeway/scheduler/program_def.pb.h \
         include/causeway/client/client.h include/causeway/models/trainer.h; do
  [[ -f "$prefix/$f" ]] || { echo "missing $prefix/$f" >&2; exit 1; }
done
for name in CausewayConfig.cmake CausewayConfigVersion.cmake CausewayTargets.cmake libcauseway_base.a \
            libcauseway_runtime.a libcauseway_kernels.a libcauseway_shaders.a libcauseway_scheduler.a \
            libcauseway_transport.a libcauseway_distributed.a libcauseway_client.a libcauseway_models.a; do
  [[ -n "$(find "$prefix" -name "$name" -print -quit)" ]] || { echo "no $name under $prefix" >&2; exit 1; }
done

# configure_and_build NAME SRC: configures and builds the project SRC against
# the prefix alone, in $tmp/NAME.
configure_and_build() {
  local name=$1 src=$2
  step="configure the $name project"
  echo "== $step"
  local generator_args=()
  if command -v ninja >/dev/null 2>&1; then generator_args=(-G Ninja); fi
  local configure_args=(-S "$src" -B "$tmp/$name" "${generator_args[@]}"
                        "-DCMAKE_PREFIX_PATH=$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  if [[ -n "$config" ]]; then configure_args+=("-DCMAKE_BUILD_TYPE=$config"); fi
  if [[ -n "$cxx" ]]; then configure_args+=("-DCMAKE_CXX_COMPILER=$cxx"); fi
  # The dependencies (absl, glslang, ...) are searched for where the build tree
  # found them; the cache variable (the prefix) is searched before this.
  CMAKE_PREFIX_PATH="$parent_prefix_path${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}" \
    "$cmake" "${configure_args[@]}"

  step="check that the $name project found Causeway in the temporary prefix"
  local causeway_dir
  causeway_dir=$(sed -n 's/^Causeway_DIR:[A-Z]*=//p' "$tmp/$name/CMakeCache.txt")
  echo "Causeway_DIR=$causeway_dir"
  case "$causeway_dir" in
    "$prefix"/*) ;;
    *) echo "found Causeway at '$causeway_dir', not under $prefix" >&2; exit 1 ;;
  esac

  step="build the $name project"
  echo "== $step"
  "$cmake" --build "$tmp/$name" "${config_args[@]}"
}

# run_programs NAME PROGRAM...: runs each built program of project NAME.
run_programs() {
  local name=$1 program exe
  shift
  for program in "$@"; do
    step="run $program of the $name project"
    echo "== $step"
    exe=$(find "$tmp/$name" -type f -name "$program" -perm -u+x -print -quit)
    [[ -n "$exe" ]] || { echo "no $program executable under $tmp/$name" >&2; exit 1; }
    (cd "$tmp" && "$exe")
  done
}

export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
export CAUSEWAY_CACHE_DIR=$tmp/cache  # keep the pipeline cache out of $HOME
configure_and_build downstream "$downstream_src"
run_programs downstream downstream downstream_transport
step="check that causeway::transport alone brings no Vulkan"
echo "== $step"
if ldd "$(find "$tmp/downstream" -type f -name downstream_transport -print -quit)" | grep -q libvulkan; then
  echo "downstream_transport links libvulkan: causeway::transport should need only causeway::base" >&2
  exit 1
fi
if [[ -n "$examples_src" ]]; then
  configure_and_build examples "$examples_src"
  run_programs examples local_custom_kernel remote_two_islands traced_run
fi
if [[ -n "$python" ]]; then
  step="import the installed Python package and run a program with it"
  echo "== $step"
  (cd "$tmp" && PYTHONPATH="$prefix/$python_dir" "$python" - <<'PY'
import numpy as np
import causeway
assert causeway.__file__.startswith(__import__("os").environ["PYTHONPATH"]), causeway.__file__
client = causeway.local(accelerators=2)
mesh = client.mesh([2])
b = causeway.ProgramBuilder("double")
b.mesh("m", [2]).parameter("x", "m", (8,), "f32", causeway.split(0))
b.call("double", causeway.scale((4,), 2.0), "m", ["x"], ["y"]).output("y")
(y,), done = client.load(b.build(), {"m": mesh})([client.put(np.arange(8, dtype=np.float32), mesh, causeway.split(0))])
done.result(timeout=60)
np.testing.assert_array_equal(y.numpy(), 2 * np.arange(8, dtype=np.float32))
print("python package: ok from", causeway.__file__)
PY
  )
fi
step="done"
echo "== passed"
