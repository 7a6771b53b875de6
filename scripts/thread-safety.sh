#!/usr/bin/env bash
# Checks the thread-safety annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...)
# with clang's -Wthread-safety analysis, as errors, over every source of the
# library, the transport, the models and the tools. Needs a configured and built
# tree (BUILD_DIR, default build/) for the generated headers; compiles nothing
# else (-fsyntax-only), with the build's own flags.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if ! command -v clang++ >/dev/null; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "thread-safety: installing clang"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang >/dev/null
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
python3 - "$BUILD_DIR/compile_commands.json" "$(pwd)" <<'PY'
import json, shlex, subprocess, sys, os
from concurrent.futures import ThreadPoolExecutor
commands, root = sys.argv[1], sys.argv[2]
jobs = []
for entry in json.load(open(commands)):
    rel = os.path.relpath(entry["file"], root)
    if rel.split(os.sep)[0] not in ("runtime", "scheduler", "transport", "models", "tools", "shaders"):
        continue
    args = shlex.split(entry["command"])[1:]
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-MD", "-c"):
            continue
        out.append(a)
    jobs.append((rel, ["clang++", "-fsyntax-only", "-Wthread-safety", "-Wthread-safety-beta",
                       "-Werror=thread-safety", "-Werror=thread-safety-beta", "-Wno-unknown-warning-option"] + out,
                 entry["directory"]))
def run(job):
    rel, cmd, cwd = job
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return rel, p.returncode, p.stderr
failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for rel, code, err in pool.map(run, jobs):
        if code != 0:
            failed += 1
            sys.stdout.write(err)
print(f"thread-safety: {len(jobs)} sources checked, {failed} with errors")
sys.exit(1 if failed else 0)
PY
