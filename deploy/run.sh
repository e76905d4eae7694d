#!/usr/bin/env bash
# Quick start, part 1: install, build, and run attnserve's main program.
# Until the gRPC server lands this is the demo: the seed article's example (T=4, d_model=8, h=2)
# through the oneDNN core, printing the output shape and each head's attention weights.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${ATTNSERVE_BUILD_DIR:-$root/build}

"$root/deploy/build.sh"
exec "$build_dir/tools/attnserve-demo" "$@"
