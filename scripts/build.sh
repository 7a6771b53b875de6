#!/usr/bin/env bash
# Configures and builds Causeway in ./build (BUILD_DIR to change), Release with
# debug info. Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# ccache (installed by install-deps.sh) makes a rebuild of an unchanged file a
# cache hit: across the plain, sanitizer and fuzz builds' repeated runs and
# across checkouts, since paths are hashed relative to the source tree.
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
fi
cmake -S . -B "$BUILD_DIR" -G Ninja "${LAUNCHER[@]}" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
