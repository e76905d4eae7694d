#!/usr/bin/env bash
# Installs the Debian packages attnserve needs, then configures and builds it (Release, Ninja,
# two jobs: the reference machine has 2 cores). Extra arguments go to the CMake configure step.
# Usage: deploy/build.sh [-DOPTION=VALUE ...]     (build directory: $ATTNSERVE_BUILD_DIR or build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${ATTNSERVE_BUILD_DIR:-$root/build}

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build_dir" -G Ninja "$@"
cmake --build "$build_dir" -j "${ATTNSERVE_BUILD_JOBS:-2}"
