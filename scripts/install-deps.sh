#!/usr/bin/env bash
# Installs exactly the Debian 12 packages that Causeway's build, tests and demo
# need. Safe to run again: apt-get skips what is already there. Run as root.
set -euo pipefail

PACKAGES=(
  # toolchain
  g++ cmake ninja-build pkg-config ccache
  # LLVM's linker: links the tree's executables in half the time of GNU ld
  lld
  # Vulkan: loader and headers, the lavapipe CPU driver, vulkaninfo, validation
  libvulkan-dev mesa-vulkan-drivers vulkan-tools vulkan-validationlayers
  # shaders: build-time compiler, run-time GLSL compiler library, SPIR-V tools
  glslang-tools glslang-dev spirv-tools
  # libraries
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  # libcrypto of OpenSSL: HMAC-SHA256 and nonces of the transport's handshake
  libssl-dev
  # protobuf: the control messages of the transport's connections (library, protoc)
  libprotobuf-dev protobuf-compiler
  # JSON for reading trace files; gnuplot draws the benchmark report's plots
  nlohmann-json3-dev gnuplot-nox
  # OpenBLAS: the host sgemm baseline of the matmul benchmark
  libopenblas-dev
  # the sanitizer suites' runner (scripts/run-tests.py)
  python3
  # the Python package: pybind11 and Python's headers to build it, numpy for
  # its arrays, pytest for its tests
  pybind11-dev python3-dev python3-numpy python3-pytest
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
