#!/usr/bin/env bash
# Installs every Debian 12 (bookworm) package that attnserve's build, tests, benchmarks and tools need.
# Idempotent and non-interactive: packages already present are left as they are.
# Usage: deploy/install-deps.sh        (as root, or as a user with sudo)
set -euo pipefail

packages=(
  # Toolchain and build.
  build-essential cmake ninja-build pkg-config git clang-format
  # Core: oneDNN 2.6 (v2 API), abseil for Status/StatusOr.
  # ocl-icd-opencl-dev: Debian's dnnl CMake config requires OpenCL even for CPU-only use.
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers libabsl-dev
  # Model files and tools: config.json parsing, command lines.
  nlohmann-json3-dev libcli11-dev
  # The gRPC server: gRPC 1.51 (with reflection), protobuf 3.21 and its compiler, spdlog 1.10.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libspdlog-dev
  # Metrics: prometheus-cpp 1.0 (core and pull exposer); Prometheus itself and promtool for the
  # real-scrape test and the dashboard's query check.
  prometheus-cpp-dev prometheus
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # PyTorch interop (tools/export_torch.py and its test), run with /usr/bin/python3. Debian's torch
  # links the reference BLAS; the OpenBLAS alternative makes it ~20x faster.
  python3 python3-numpy python3-torch libopenblas0-pthread
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  sudo_cmd=(sudo)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
