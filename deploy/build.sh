#!/usr/bin/env bash
# Installs the Debian packages attnserve needs, then configures and builds it (Release, Ninja,
# two jobs: the reference machine has 2 cores). Extra arguments go to the CMake configure step.
# ATTNSERVE_BUILD_TARGETS (space-separated) builds only those targets and what they need, and
# ATTNSERVE_INSTALL_PROFILE picks install-deps.sh's profile (default dev: everything), as
# deploy/run.sh does for the server and the CLI.
# Usage: deploy/build.sh [-DOPTION=VALUE ...]     (build directory: $ATTNSERVE_BUILD_DIR or build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${ATTNSERVE_BUILD_DIR:-$root/build}

"$root/deploy/install-deps.sh" "${ATTNSERVE_INSTALL_PROFILE:-dev}"
cmake -S "$root" -B "$build_dir" -G Ninja "$@"
targets=()
for target in ${ATTNSERVE_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j "${ATTNSERVE_BUILD_JOBS:-2}" "${targets[@]}"
