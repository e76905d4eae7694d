#!/usr/bin/env bash
# Whether resident memory falls after a burst: attnserve (demo model, one compute thread) gets 64
# requests of 1024..4096 rows at concurrency 16, then sits idle; its VmRSS is printed before, right
# after and 12 s after the burst, once with the memory trimmer off (--malloc-trim-interval-s 0)
# and once at its default (10 s). Not run by CI.
#
# Usage: tests/benchmarks/run_burst_memory.sh [build_dir]   (default: <repo>/build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${1:-$root/build}
work=$(mktemp -d -t attnserve-burst.XXXXXX)
trap 'rm -rf "$work"' EXIT

rss() { awk '/^VmRSS/ {print $2 " KiB"}' "/proc/$1/status"; }

for trim_s in 0 10; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$build_dir/server/attnserve" --grpc-address "127.0.0.1:$port" --http-address "" --metrics-address "" \
    --model-repository "$work/none" --compute-threads 1 --malloc-trim-interval-s "$trim_s" \
    >"$work/server-$trim_s.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    "$build_dir/client/cli/attnserve-cli" --target "127.0.0.1:$port" -q health >/dev/null 2>&1 &&
      break
    sleep 0.2
  done
  idle=$(rss "$pid")
  "$build_dir/client/cli/attnserve-cli" --target "127.0.0.1:$port" -q bench --model demo -c 16 \
    -n 64 --seq-len 1024:4096 --seed 5 >/dev/null
  after=$(rss "$pid")
  sleep 12
  echo "--malloc-trim-interval-s $trim_s: idle $idle, after the burst $after, 12 s later $(rss "$pid")"
  kill -TERM "$pid"
  wait "$pid" || true
done
