#!/usr/bin/env bash
# Loopback throughput and latency of decoding sessions: `attnserve-cli bench --sessions` against a
# server on a free 127.0.0.1 port (embedded demo model: d_model 512, 8 heads), client and server
# on the same cores. For each KV cache dtype (KV_CACHE_DTYPES, --kv-cache-dtype: "auto", the
# compute type's, and/or "int8") and compute type (COMPUTE_DTYPES) it runs, each on a fresh server:
#   on-1x64   continuous batching, one stream sending one message of 64 one-row steps per round
#   on-64x1   continuous batching, 64 streams of one session each
#   off-1x64, off-64x1  the same with batching off (one row per iteration:
#             --decode-max-iteration-tokens 1 --decode-prefill-chunk-tokens 1)
#   gather-64x1  on-64x1 with --decode-gather-delay-us GATHER_US (3000)
#   prompt    continuous batching, one stream of 64 sessions, and a 2048-row prompt sent on another
#             stream at round LONG_AT (steps' latency before / during / after it)
# and, right after on-1x64, the core's offline decode of the same mix in the same minute
# (attnserve_core_bench's BM_DecodeBatched/B:64/P:128, median of 3; this host's speed drifts by
# 15-30 % from minute to minute), with the service's share of it (the target: >= 60 %), and the
# same step after a pause as long as a round's time outside the forward (BM_DecodePaused).
# Every step grows the sessions' cache, so the runs keep the mean cached context at 128 tokens, the
# core benchmark's P:128: CONTEXT prompt rows then STEPS rounds (64 + 128, from 64 to 192 tokens;
# 32 rounds of 112 + 32 are too short: their tokens/s moves by 30 % from run to run),
# and prints one table row per run (tokens/s, step p50/p99, the server's CPU seconds for the run
# and the client's for its rounds: with 64 clients the two together keep both cores busy; the
# server's CPU per step message alone is run_decode_service_cpu.sh's).
#
# Usage: tests/benchmarks/run_decode_service_bench.sh [BUILD_DIR]
#   Environment: SESSIONS (64), CONTEXT (64), STEPS (128), PROMPT_CONTEXT (64), PROMPT_STEPS
#   (128), LONG_AT (40), GATHER_US (3000), COMPUTE_DTYPES ("fp32 bf16"), KV_CACHE_DTYPES
#   ("auto"), RUNS (the run names above to do, e.g. "on-1x64"; default all), and
#   server_bench_lib.sh's SERVER_FLAGS, QUIET_WAIT_S, KEEP_LOGS.
set -euo pipefail
bench_name=run_decode_service_bench.sh
# shellcheck source=tests/benchmarks/server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"

sessions="${SESSIONS:-64}"
context="${CONTEXT:-64}"
steps="${STEPS:-128}"
prompt_context="${PROMPT_CONTEXT:-64}"
prompt_steps="${PROMPT_STEPS:-128}"
long_at="${LONG_AT:-40}"
gather_us="${GATHER_US:-3000}"
batching_off=(--decode-max-iteration-tokens 1 --decode-prefill-chunk-tokens 1)

# wanted RUN: whether RUNS (empty: every run) names RUN, e.g. "on-1x64".
wanted() { [[ -z "${RUNS:-}" || " ${RUNS} " == *" $1 "* ]]; }

# run NAME DTYPE "SERVER FLAGS" BENCH FLAGS...: one fresh server, one decode bench; prints a row.
run() {
  local name="$1" dtype="$2" server_flags="$3" cpu0 cpu1
  local -a sflags
  shift 3
  wanted "${name%-*}" || return 0
  read -r -a sflags <<<"${server_flags}"
  wait_quiet "${name}"
  start_server "${work}/${name}.server.log" --metrics-off --compute-dtype "${dtype}" \
    --kv-cache-dtype "${kv_dtype}" "${sflags[@]}"
  cpu0="$(server_cpu_s)"
  "${cli_bin}" --target "127.0.0.1:${port}" --timeout-s 120 -q bench --model demo \
    --sessions "${sessions}" --json "$@" >"${work}/${name}.json"
  cpu1="$(server_cpu_s)"
  stop_server
  python3 - "${work}/${name}.json" "${cpu0}" "${cpu1}" "${name}" "${dtype}/${kv_dtype}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cpu = float(sys.argv[3].split()[0]) - float(sys.argv[2].split()[0])
lat = r["step_latency_ms"]
per_stream = r["sessions"] // r["clients"]
row = (f"| {sys.argv[4]} | {sys.argv[5]} | {r['clients']} x {per_stream} "
       f"| {r['tokens_per_s']:,.0f} | {lat['p50']:.2f} | {lat['p99']:.2f} "
       f"| {cpu:.2f} | {r['client_cpu_s']:.2f} |")
extra = r.get("long_prompt")
if extra:
    b, d = extra["steps_before_ms"], extra["steps_during_ms"]
    row += (f" 2048-row prompt {extra['latency_ms']:.0f} ms; steps before it p50 {b['p50']:.2f}"
            f" p99 {b['p99']:.2f}, during it p50 {d['p50']:.2f} p99 {d['p99']:.2f}"
            f" max {d['max']:.2f} ({d['count']} messages)")
print(row)
PY
}

core_bin="${build_dir}/tests/benchmarks/attnserve_core_bench"
if [[ ! -x "${core_bin}" ]]; then
  echo "${bench_name}: ${core_bin} not found; build it first (cmake --build ${build_dir} -j2)" >&2
  exit 1
fi

# core_share NAME DTYPE: the core's batched step for DTYPE now, back to back and (fp32/bf16 KV
# caches) after a 1.3 ms pause (BM_DecodePaused: a one-client round's time outside the forward),
# against run NAME's tokens/s.
core_share() {
  local name="$1" dtype="$2" bf16=0 int8=0 filter
  [[ "${dtype}" == bf16 ]] && bf16=1
  [[ "${kv_dtype}" == int8 ]] && int8=1
  filter="^BM_DecodeBatched/B:64/P:128/bf16:${bf16}/int8:${int8}/"
  ((int8 == 0)) && filter+="|^BM_DecodePaused/B:64/P:128/bf16:${bf16}/pause_us:1300/"
  wait_quiet "core-${dtype}"
  "${core_bin}" --benchmark_filter="${filter}" --benchmark_enable_random_interleaving=true \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_format=json >"${work}/core-${dtype}.json" 2>/dev/null
  python3 - "${work}/core-${dtype}.json" "${work}/${name}.json" "${dtype}/${kv_dtype}" <<'PY'
import json, sys
core = json.load(open(sys.argv[1]))
service = json.load(open(sys.argv[2]))["tokens_per_s"]
for b in core["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    step_s = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3}[b["time_unit"]]
    tokens = b["items_per_second"]  # Decode tokens per second of the batched step.
    what = "after a 1.3 ms pause" if b["name"].startswith("BM_DecodePaused") else "back to back"
    print(f"| core | {sys.argv[3]} | offline 64 x 128 batched step {what} {step_s * 1e3:.2f} ms "
          f"| {tokens:,.0f} | | | | service 1 x 64: {service / tokens:.0%} of it |")
PY
}

echo "| run | compute/KV cache | streams x sessions | tokens/s | step p50 ms | step p99 ms | server CPU s (prefill included) | client CPU s (rounds only) |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
for kv_dtype in ${KV_CACHE_DTYPES:-auto}; do
for dtype in ${COMPUTE_DTYPES:-fp32 bf16}; do
  mix=(--context "${context}" --steps "${steps}")
  run "on-1x64-${dtype}" "${dtype}" "" "${mix[@]}"
  # The core bench's mix is fixed: 64 sessions at 128 cached tokens (the runs' mean context).
  if ((sessions == 64 && context + steps / 2 == 128)) && wanted on-1x64; then
    core_share "on-1x64-${dtype}" "${dtype}"
  fi
  run "off-1x64-${dtype}" "${dtype}" "${batching_off[*]}" "${mix[@]}"
  run "on-64x1-${dtype}" "${dtype}" "" "${mix[@]}" --clients "${sessions}"
  run "off-64x1-${dtype}" "${dtype}" "${batching_off[*]}" "${mix[@]}" --clients "${sessions}"
  run "gather-64x1-${dtype}" "${dtype}" "--decode-gather-delay-us ${gather_us}" "${mix[@]}" \
    --clients "${sessions}"
  run "prompt-${dtype}" "${dtype}" "" --context "${prompt_context}" --steps "${prompt_steps}" \
    --long-prompt-rows 2048 --long-prompt-at-round "${long_at}"
done
done
