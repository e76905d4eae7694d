#!/usr/bin/env bash
# Quick start, part 1: install, build, and run the attnserve gRPC server.
# With no model repository folder (./models) it serves the embedded `demo` model (d_model 512,
# 8 heads) on 0.0.0.0:50051, with health and reflection. Extra arguments go to attnserve
# (see `attnserve --help`); stop it with Ctrl-C or SIGTERM, which drains before exiting.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${ATTNSERVE_BUILD_DIR:-$root/build}

# Only what it runs: the build packages (no test frameworks, no PyTorch) and the server with
# attnserve-cli to call it; deploy/test.sh adds the rest to the same build folder.
ATTNSERVE_INSTALL_PROFILE=build ATTNSERVE_BUILD_TARGETS="attnserve attnserve-cli" \
  "$root/deploy/build.sh" -DATTNSERVE_BUILD_TESTS=OFF -DATTNSERVE_BUILD_BENCHMARKS=OFF \
  -DATTNSERVE_BUILD_TOOLS=OFF
cd "$root"
exec "$build_dir/server/attnserve" "$@"
