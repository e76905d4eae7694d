#!/usr/bin/env bash
# Installs the Debian 12 (bookworm) packages attnserve needs, by profile:
#   dev (default)  everything: building, every test, benchmarks and tools (deploy/build.sh, test.sh)
#   build          only what compiling the server and attnserve-cli needs (the Dockerfile's build
#                  stage: no test frameworks, no PyTorch)
#   container      Docker (Debian's docker.io), podman and what deploy/container-test.sh needs to
#                  build the image and run it with both engines, and deploy/k8s-play-test.sh to
#                  play the pod spec
# Idempotent and non-interactive: packages already present are left as they are.
# Usage: deploy/install-deps.sh [dev|build|container]...   (as root, or as a user with sudo, when
# anything is missing; with everything installed any user may run it)
set -euo pipefail

build_packages=(
  # Toolchain and build.
  build-essential cmake ninja-build pkg-config
  # Core: oneDNN 2.6 (v2 API), abseil for Status/StatusOr.
  # ocl-icd-opencl-dev: Debian's dnnl CMake config requires OpenCL even for CPU-only use.
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers libabsl-dev
  # Model files and tools: config.json parsing, command lines; libcrypto (OpenSSL 3) for the
  # SHA-256 of config.json's "weights_sha256" (the image's run stage gets libssl3 from
  # deploy/runtime-packages.sh, which follows what the binaries load).
  nlohmann-json3-dev libcli11-dev libssl-dev
  # The openssl CLI: deploy/make-test-certs.sh makes the TLS tests' certificates at test time.
  openssl
  # The gRPC server: gRPC 1.51 (with reflection), protobuf 3.21 and its compiler, spdlog 1.10.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libspdlog-dev
  # Metrics: prometheus-cpp 1.0 (core and pull exposer).
  prometheus-cpp-dev
  # The Open Inference Protocol's REST binding: cpp-httplib 0.11 (built with OpenSSL; the
  # civetweb that prometheus-cpp brings crashes on its first HTTPS handshake under OpenSSL 3).
  libcpp-httplib-dev
)
dev_packages=(
  "${build_packages[@]}"
  git clang-format
  # curl: the REST binding's test calls it as users do (tests/oip/oip_rest_test.py).
  curl
  # Prometheus itself and promtool, for the real-scrape test and the dashboard's query check.
  prometheus
  # Tests and benchmarks; python3-yaml for the deployment files' check (tests/deploy).
  libgtest-dev libgmock-dev libbenchmark-dev python3-yaml
  # nginx: the L7 gRPC load balancer ReplicasTest runs in front of three replicas, with the
  # shipped deploy/nginx/attnserve-grpc.conf (grpc_pass and HTTP/2 are in Debian's build).
  nginx
  # PyTorch interop (tools/export_torch.py and its test), run with /usr/bin/python3. Debian's torch
  # links the reference BLAS; the OpenBLAS alternative makes it ~20x faster.
  python3 python3-numpy python3-torch libopenblas0-pthread
  # The Python client (client/python, pip-installed from the repository without an index) and the
  # Open Inference Protocol test: gRPC, protobuf, grpc_tools.protoc to generate stubs, pip.
  python3-grpcio python3-grpc-tools python3-protobuf python3-pip python3-setuptools
  # Fuzzing (deploy/test-fuzz.sh): clang, and libFuzzer with the sanitizer runtimes
  # (libclang-rt-14-dev, which clang only recommends); libomp-14-dev because clang compiles
  # OpenMP against LLVM's omp.h and libomp (GCC's libgomp ships no header clang finds).
  clang libclang-rt-14-dev libomp-14-dev
)
container_packages=(
  # podman runs the image as a second engine; runc, because crun fails on hosts with hybrid
  # cgroups; debootstrap makes the Debian base image locally (no registry is reachable); iproute2
  # links the test's containers with a veth pair.
  podman runc debootstrap iproute2 python3
  # catatonit: podman builds a pod's infra (pause) image from it locally, for `podman kube play`
  # of the Kubernetes pod spec (deploy/k8s-play-test.sh); python3-yaml renders that spec.
  catatonit python3-yaml
)
# Docker builds and runs the image: Debian's docker.io (dockerd, containerd, the client), unless a
# Docker engine is installed already (Docker's own docker-ce packages conflict with docker.io).
command -v dockerd >/dev/null || container_packages+=(docker.io)

packages=()
for profile in "${@:-dev}"; do
  case $profile in
    dev) packages+=("${dev_packages[@]}") ;;
    build) packages+=("${build_packages[@]}") ;;
    container) packages+=("${container_packages[@]}") ;;
    *) echo "install-deps: unknown profile '$profile' (expected dev, build or container)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages (${*:-dev}) already installed"
  exit 0
fi

# Root (or sudo) only when something must be installed: a user whose machine already has every
# package builds without either.
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || {
    echo "install-deps: missing ${missing[*]}; run as root or install sudo to install them" >&2
    exit 1
  }
  sudo_cmd=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
