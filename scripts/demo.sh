#!/usr/bin/env bash
# The main job: installs what is needed, builds, and trains the benchmark language
# model on lavapipe for a short while (flags after it go to causeway train).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
exec ./build/tools/causeway train --device=cpu "$@"
