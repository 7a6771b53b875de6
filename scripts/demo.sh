#!/usr/bin/env bash
# The main job: installs what is needed, builds, and runs the demo on lavapipe.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
exec ./build/tools/causeway demo --device=cpu "$@"
