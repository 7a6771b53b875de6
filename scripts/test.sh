#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite on lavapipe
# with the Vulkan validation layer on (a validation error fails the test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
