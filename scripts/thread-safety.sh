#!/usr/bin/env bash
# Checks the thread-safety annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...)
# with clang's -Wthread-safety analysis, as errors, over every source of the
# libraries (causeway/) and the tools. Needs a configured and built
# tree (BUILD_DIR, default build/) for the generated headers; compiles nothing
# else (-fsyntax-only), with the build's own flags.
#
# A source that passed is not analysed again while nothing it reads changes:
# the key is the clang command and the content of every file the build's
# compile of that source read (ninja's dependency log), kept in
# ${XDG_CACHE_HOME:-~/.cache}/causeway/thread-safety. THREAD_SAFETY_CACHE=off
# analyses every source.
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
CACHE_DIR=""
if [ "${THREAD_SAFETY_CACHE:-on}" != "off" ]; then
  CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/causeway/thread-safety
  mkdir -p "$CACHE_DIR"
  # Entries not used for a month go (a hit refreshes its entry's time).
  find "$CACHE_DIR" -type f -mtime +30 -delete
fi
DEPS=$(mktemp)
trap 'rm -f "$DEPS"' EXIT
ninja -C "$BUILD_DIR" -t deps >"$DEPS" 2>/dev/null || : >"$DEPS"
python3 - "$BUILD_DIR/compile_commands.json" "$(pwd)" "$DEPS" "$CACHE_DIR" <<'PY'
import hashlib, json, shlex, subprocess, sys, os
from concurrent.futures import ThreadPoolExecutor
commands, root, deps_file, cache_dir = sys.argv[1:5]
# Object (relative to the build directory) -> the files its compile read.
deps, current = {}, None
for line in open(deps_file):
    if not line.strip():
        continue
    if not line.startswith(" "):
        current = line.split(":")[0] if "(VALID)" in line else None
        if current is not None:
            deps[current] = []
    elif current is not None:
        deps[current].append(line.strip())
digests = {}
def digest(path):
    if path not in digests:
        try:
            with open(path, "rb") as f:
                digests[path] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            digests[path] = None
    return digests[path]
def cache_key(cmd, cwd, obj):
    # None when the build's dependency log does not cover the source.
    if not cache_dir or obj not in deps:
        return None
    # Paths under the checkout count relative to it: another clone of the
    # same tree hits the same entries.
    h = hashlib.sha256("\0".join(cmd).replace(root, "<root>").encode())
    for d in deps[obj]:
        content = digest(os.path.join(cwd, d))
        if content is None:
            return None
        h.update(f"\0{d.replace(root, '<root>')}\0{content}".encode())
    return h.hexdigest()
jobs = []
for entry in json.load(open(commands)):
    rel = os.path.relpath(entry["file"], root)
    if rel.split(os.sep)[0] not in ("causeway", "tools"):
        continue
    args = shlex.split(entry["command"])[1:]
    out = []
    obj = None
    skip = None
    for a in args:
        if skip is not None:
            if skip == "-o":
                obj = a
            skip = None
            continue
        if a in ("-o", "-MF", "-MT"):
            skip = a
            continue
        if a in ("-MD", "-c"):
            continue
        out.append(a)
    cmd = ["clang++", "-fsyntax-only", "-Wthread-safety", "-Wthread-safety-beta",
           "-Werror=thread-safety", "-Werror=thread-safety-beta", "-Wno-unknown-warning-option"] + out
    jobs.append((rel, cmd, entry["directory"], cache_key(cmd, entry["directory"], obj)))
def run(job):
    rel, cmd, cwd, key = job
    if key is not None and os.path.exists(os.path.join(cache_dir, key)):
        os.utime(os.path.join(cache_dir, key))
        return rel, 0, "", True
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode == 0 and key is not None:
        open(os.path.join(cache_dir, key), "w").close()
    return rel, p.returncode, p.stderr, False
failed = cached = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for rel, code, err, hit in pool.map(run, jobs):
        cached += hit
        if code != 0:
            failed += 1
            sys.stdout.write(err)
print(f"thread-safety: {len(jobs)} sources checked ({cached} unchanged since they passed), {failed} with errors")
sys.exit(1 if failed else 0)
PY
