#!/usr/bin/env bash
# Quick start, part 1: install, build, and run the attnserve gRPC server.
# With no model repository folder (./models) it serves the embedded `demo` model (d_model 512,
# 8 heads) on 0.0.0.0:50051, with health and reflection. Extra arguments go to attnserve
# (see `attnserve --help`); stop it with Ctrl-C or SIGTERM, which drains before exiting.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${ATTNSERVE_BUILD_DIR:-$root/build}

"$root/deploy/build.sh"
cd "$root"
exec "$build_dir/server/attnserve" "$@"
