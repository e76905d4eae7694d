#!/usr/bin/env bash
# Soak test (documented, not run by CI): attnserve under a steady mixed load for N minutes, with
# the process's resident memory, open file descriptors and threads printed every 30 s. Passes
# (exit 0) when no request failed and RSS grew less than 5 % after minute 5: the median of the last
# five minutes' samples against the median of minutes 5 to 10.
#
# Usage: deploy/soak.sh [MINUTES (default 30)] [BUILD_DIR (default build)]
# Load (both open loop, Poisson arrivals, the embedded demo model, 127.0.0.1 only):
#   - unary Attend, UNARY_RATE requests/s (default 150), 8..256 rows each, half of them causal;
#   - two AttendStream sessions, STREAM_RATE messages/s each (default 50), 16 rows.
# Needs attnserve and attnserve-cli built (deploy/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
minutes=${1:-30}
build_dir=${2:-$root/build}
server_bin=$build_dir/server/attnserve
cli_bin=$build_dir/client/cli/attnserve-cli
for binary in "$server_bin" "$cli_bin"; do
  [[ -x $binary ]] || { echo "soak: $binary not found; run deploy/build.sh first" >&2; exit 2; }
done
duration_s=$((minutes * 60))
work=$(mktemp -d -t attnserve-soak.XXXXXX)
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null || true
  echo "soak: logs in $work" >&2
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$server_bin" --grpc-address "127.0.0.1:$port" --http-address "" --metrics-address 127.0.0.1:0 \
  --model-repository "$work/no-models" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  "$cli_bin" --target "127.0.0.1:$port" -q health >/dev/null 2>&1 && break
  sleep 0.2
done

bench() {
  "$cli_bin" --target "127.0.0.1:$port" -q --max-attempts 1 bench --model demo \
    --duration "$duration_s" --json "$@"
}
bench --rate "${UNARY_RATE:-150}" --seq-len 8:256 --seed 1 >"$work/unary.json" &
bench --rate "${UNARY_RATE:-150}" --seq-len 8:256 --seed 2 --mask causal >"$work/causal.json" &
bench --stream --streams 2 --rate "${STREAM_RATE:-50}" --seq-len 16 --seed 3 >"$work/stream.json" &

sample() {  # elapsed_s rss_kib fds threads
  local rss threads fds
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$server_pid/status")
  threads=$(awk '/^Threads/ {print $2}' "/proc/$server_pid/status")
  fds=$(find "/proc/$server_pid/fd" -mindepth 1 -maxdepth 1 | wc -l)
  echo "$1 $rss $fds $threads"
}
echo "elapsed_s rss_kib fds threads" | tee "$work/samples.txt"
start=$SECONDS
# Every sample is taken under load: the last one at least a few seconds before the clients stop
# (a sample after they stop shows the server idle, freed buffers and all, and would flatter it).
while ((SECONDS - start + 35 < duration_s)); do
  sleep 30
  sample $((SECONDS - start)) | tee -a "$work/samples.txt"
done
wait $(jobs -p | grep -v "^$server_pid$") 2>/dev/null || true

python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
rows = [l.split() for l in open(f"{work}/samples.txt").read().splitlines()[1:]]
samples = [(int(t), int(rss)) for t, rss, _, _ in rows]
errors, ok = {}, 0
for name in ("unary", "causal", "stream"):
    r = json.load(open(f"{work}/{name}.json"))
    ok += r["ok"]
    for code, count in r["errors"].items():
        errors[code] = errors.get(code, 0) + count
    print(f"{name}: {r['ok']} OK, {r['requests_per_s']:.0f} req/s, p50 {r['latency_ms']['p50']:.2f} ms, "
          f"p99 {r['latency_ms']['p99']:.2f} ms, errors {r['errors'] or 0}")
# Growth: the median of the last five minutes' samples against the median of minutes 5 to 10.
# Single samples move with the batch in flight when they are taken (Poisson arrivals form an
# occasional batch of thousands of rows, whose buffers are resident for its duration), so a
# first-against-last comparison would measure that noise; the medians of ten samples each do not.
after5 = [(t, rss) for t, rss in samples if t >= 300] or samples
end = after5[-1][0]
early = [rss for t, rss in after5 if t < after5[0][0] + 300]
late = [rss for t, rss in after5 if t > end - 300]
growth = (statistics.median(late) - statistics.median(early)) / statistics.median(early)
print(f"RSS under load: {samples[0][1] / 1024:.0f} MiB at {samples[0][0]} s; median "
      f"{statistics.median(early) / 1024:.0f} MiB over minutes 5-10, "
      f"{statistics.median(late) / 1024:.0f} MiB over the last 5 (samples {min(late) / 1024:.0f}-"
      f"{max(late) / 1024:.0f} MiB), peak {max(r for _, r in after5) / 1024:.0f} MiB: "
      f"{100 * growth:+.1f} % after minute 5 (target < 5 %)")
print(f"requests OK {ok}, errors {errors or 0}")
sys.exit(0 if not errors and growth < 0.05 else 1)
PY
