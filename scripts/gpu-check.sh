#!/usr/bin/env bash
# The GPU check: builds Causeway here and packs what a GPU machine needs to try
# it into one folder (at most 64 MiB) that runs on any x86-64 Linux machine
# with a Vulkan driver, without this build tree or any package installed:
#
#   scripts/gpu-check.sh [DIR]          # here: build, then pack DIR (default build/gpu-check)
#   DIR/run.sh [REPORT_DIR]             # there: devices, tests, benchmarks, demo -> REPORT_DIR/report.md
#
# The folder holds run.sh, the list of tests left out on a GPU (tests.exclude,
# each with why) and payload.tar.xz: the causeway binary, the benchmark and
# test binaries (stripped), the shared libraries they load as ldd finds them
# here (without the C library, which the target's own serves), the Vulkan
# loader and validation layer, and the data, examples and shaders the tests
# read. On an NVIDIA machine run.sh finds the driver's Vulkan manifest in the
# usual places; VK_DRIVER_FILES (or VK_ICD_FILENAMES) overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/gpu-check}
BUILD_DIR=${BUILD_DIR:-build}
export BUILD_DIR
bash scripts/build.sh -DCAUSEWAY_BUILD_BENCHMARKS=ON

rm -rf "$DIR"
mkdir -p "$DIR"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/tests" "$STAGE/lib" "$STAGE/layers" "$STAGE/src"

# The binaries: causeway and the benchmark suites side by side (causeway bench
# looks beside itself), the test binaries apart.
cp "$BUILD_DIR/tools/causeway" "$STAGE/bin/"
find "$BUILD_DIR/benchmarks" -maxdepth 1 -type f -name 'causeway_*_bench' -perm -u+x -exec cp {} "$STAGE/bin/" \;
find "$BUILD_DIR/tests" -type f -name '*_test' -perm -u+x -exec cp {} "$STAGE/tests/" \;
strip --strip-all "$STAGE"/bin/* "$STAGE"/tests/*

# The Vulkan validation layer (tests run with validation on), its manifest
# pointing at the copy beside it.
LAYER_JSON=/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json
if [[ -f $LAYER_JSON ]]; then
  layer_so=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layer"]["library_path"])' "$LAYER_JSON")
  [[ $layer_so == /* ]] || layer_so=$(ldconfig -p | awk -v n="$layer_so" '$1 == n {print $NF; exit}')
  cp "$layer_so" "$STAGE/layers/"
  python3 - "$LAYER_JSON" "$STAGE/layers/VkLayer_khronos_validation.json" "$(basename "$layer_so")" <<'EOF'
import json, sys
manifest = json.load(open(sys.argv[1]))
manifest["layer"]["library_path"] = "./" + sys.argv[3]
json.dump(manifest, open(sys.argv[2], "w"), indent=1)
EOF
fi

# Every shared library the binaries and the layer load, as resolved here,
# except the C library's own (libc, libm, libpthread, libdl, librt, the
# dynamic loader), which must match the target's kernel interface. Vulkan's
# loader is opened by name, and NVIDIA's Vulkan driver (libGLX_nvidia) creates
# no instance without libglvnd's libraries, which a CUDA-only machine lacks.
libs=$(ldd "$STAGE"/bin/* "$STAGE"/tests/* "$STAGE"/layers/*.so 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
for extra in libvulkan.so.1 libGLdispatch.so.0 libGLX.so.0 libEGL.so.1 libGL.so.1 libOpenGL.so.0 libGLESv2.so.2; do
  path=$(ldconfig -p | awk -v n="$extra" '$1 == n && /x86-64/ {print $NF; exit}')
  [[ -n $path ]] && libs+=$'\n'"$path"
done
for lib in $(echo "$libs" | sort -u); do
  case $(basename "$lib") in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*.so.* | libresolv.so.* | libutil.so.*) ;;
    *) cp -L "$lib" "$STAGE/lib/" ;;
  esac
done

# What the tests read from the source tree (the threat model's test names
# are checked against the test sources).
cp -r data examples shaders "$STAGE/src/"
mkdir -p "$STAGE/src/docs" && cp docs/security.md "$STAGE/src/docs/"
find tests -name '*.cc' -print0 | tar --null -T - -cf - | tar -C "$STAGE/src" -xf -

tar -C "$STAGE" -cf - . | xz -T0 -9 > "$DIR/payload.tar.xz"
cp scripts/gpu-check/run.sh scripts/gpu-check/tests.exclude "$DIR/"
# xz itself, for a target without it (a minimal Debian has none).
mkdir -p "$DIR/xz"
cp "$(command -v xz)" "$DIR/xz/"
cp -L "$(ldd "$(command -v xz)" | awk '$1 ~ /^liblzma/ {print $3}')" "$DIR/xz/"
chmod +x "$DIR/run.sh"
size=$(du -sb "$DIR" | cut -f1)
echo "packed $DIR: $((size / 1048576)) MiB"
if ((size > 64 * 1048576)); then
  echo "gpu-check: $DIR is over 64 MiB" >&2
  exit 1
fi
