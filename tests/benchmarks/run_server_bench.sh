#!/usr/bin/env bash
# Server benchmark: starts attnserve (demo model) once per scenario, drives it with
# `attnserve-cli bench`, compares with the core alone (attnserve_offline_bench) and prints a
# markdown table against the server's performance targets:
#   (a) T=16, concurrency 64: throughput with default batching vs --max-batch-sequences 1 (>= 4x)
#   (b) T=128, concurrency 1: p50 latency vs the core alone, B=1 T=128 (<= +0.3 ms); and with a
#       1 ms queue delay, for what waiting costs
#   (c) saturated throughput (T=128 and T=16, concurrency 64) vs the core's offline throughput at
#       the batch size the server formed (sequences per batch, rounded) (>= 85 %)
#
# Usage: tests/benchmarks/run_server_bench.sh [build_dir]     (default: $BUILD_DIR or <repo>/build)
# Environment: DURATION_S (seconds per load run, default 8), OFFLINE_S (per offline run, default 3),
#   QUIET_WAIT_S (longest wait for the machine to go idle before each run, default 20),
#   SERVER_FLAGS (extra flags for every server), LOAD_FLAGS (extra bench flags for every load run),
#   KEEP_LOGS=1 (keep the temporary folder with the server logs and JSON results).
# Needs python3 (free port, JSON). Takes ~2.5 minutes on 2 cores. Every run shares the machine's
# cores: the "other" column shows the cores that processes other than server and driver (or the
# hypervisor, as steal) kept busy during a run; figures with other > 0.1 are disturbed.
set -euo pipefail

bench_name=run_server_bench
# shellcheck source=server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"

# Sequences per batch the server formed in a scenario, rounded (at least 1).
batch_of() {
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(max(1, round(r["server"]["batch_mean_sequences"])))' "${work}/$1.json"
}

start_s=${SECONDS}
# (a) batching on vs off, T=16, concurrency 64 (and on, over one AttendStream).
scenario a_batched "" --seq-len 16 --concurrency 64
scenario a_unbatched "--max-batch-sequences 1" --seq-len 16 --concurrency 64
scenario a_stream "" --seq-len 16 --concurrency 64 --stream
# (b) latency at concurrency 1, T=128: the default (no queue delay), and what a 1 ms delay costs.
scenario b_default "" --seq-len 128 --concurrency 1
scenario b_delay "--max-queue-delay-us 1000" --seq-len 128 --concurrency 1
offline b_offline --sequences 1 --seq-len 128
# (c) saturation at T=128, concurrency 64; one compute thread instead of two for comparison.
scenario c_t128 "" --seq-len 128 --concurrency 64
scenario c_t128_ct1 "--compute-threads 1" --seq-len 128 --concurrency 64
offline c_t128_offline --sequences "$(batch_of c_t128)" --seq-len 128
offline c_t128_ct1_offline --sequences "$(batch_of c_t128_ct1)" --seq-len 128 --compute-threads 1
offline a_offline --sequences "$(batch_of a_batched)" --seq-len 16
offline a_stream_offline --sequences "$(batch_of a_stream)" --seq-len 16
# What batching can gain in the core itself at T=16: one sequence vs the server's batch, one
# thread each (under load the server runs one-thread teams side by side).
offline a_offline_b1_ct1 --sequences 1 --seq-len 16 --compute-threads 1
offline a_offline_ct1 --sequences "$(batch_of a_batched)" --seq-len 16 --compute-threads 1
elapsed_s=$((SECONDS - start_s))

python3 - "${work}" "${elapsed_s}" "$(nproc)" <<'EOF'
import json, sys
work, elapsed, cores = sys.argv[1:4]
names = ["a_batched", "a_unbatched", "a_stream", "b_default", "b_delay", "c_t128", "c_t128_ct1"]
offline = ["b_offline", "c_t128_offline", "c_t128_ct1_offline", "a_offline", "a_stream_offline",
           "a_offline_b1_ct1", "a_offline_ct1"]
R = {n: json.load(open(f"{work}/{n}.json")) for n in names + offline}

print(f"\n## attnserve server benchmark ({cores} cores, demo model d=512 h=8 fp32, unary raw "
      f"unless noted, {elapsed} s)\n")
print("| run | server flags | load | req/s | tokens/s | p50 / p99 / max ms | seq/batch "
      "| queue / compute µs | in Forward | CPU µs/req: batch+OpenMP, gRPC, driver | other cores "
      "| errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    r = R[n]
    t, lat = r["server"], r["latency_ms"]
    load = f"T={r['seq_len']} c={r['concurrency']}" + (" stream" if r["stream"] else "")
    errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
    per_req = 1e6 / max(1, r["ok"])
    print(f"| {n} | {r['server_flags'] or 'defaults'} | {load} | {r['requests_per_s']:.0f} | "
          f"{r['tokens_per_s']:.0f} | {lat['p50']:.2f} / {lat['p99']:.2f} / {lat['max']:.1f} | "
          f"{t['batch_mean_sequences']:.1f} | {t['mean_queue_us']:.0f} / "
          f"{t['mean_compute_us']:.0f} | {100 * t['compute_busy']:.0f} % | "
          f"{r['server_batch_cpu_s'] * per_req:.0f}, {r['server_grpc_cpu_s'] * per_req:.0f}, "
          f"{r['client_cpu_s'] * per_req:.0f} | "
          f"{r['other_cores']:.2f} | {errors} |")
print("\n| offline (core alone) | ms per pass p50 / mean | sequences/s | tokens/s |")
print("|---|---|---|---|")
for n in offline:
    r = R[n]
    threads = r["compute_threads"] or "default (2)"
    print(f"| {n}: B={r['sequences']} T={r['seq_len']}, compute threads {threads} | "
          f"{r['p50_ms']:.3f} / {r['mean_ms']:.3f} | {r['sequences_per_s']:.0f} | "
          f"{r['tokens_per_s']:.0f} |")

def ratio(n, o): return R[n]["tokens_per_s"] / R[o]["tokens_per_s"]
def mark(ok): return "—" if ok is None else "yes" if ok else "**no**"
rows = []
a = R["a_batched"]["requests_per_s"] / max(1e-9, R["a_unbatched"]["requests_per_s"])
rows.append(("(a) T=16 c=64: batched / --max-batch-sequences 1 ≥ 4×", f"{a:.2f}×", a >= 4))
a_s = R["a_stream"]["requests_per_s"] / max(1e-9, R["a_unbatched"]["requests_per_s"])
rows.append(("(a) same, batched over AttendStream", f"{a_s:.2f}×", a_s >= 4))
gain = R["a_offline_ct1"]["sequences_per_s"] / R["a_offline_b1_ct1"]["sequences_per_s"]
rows.append((f"(a) context: the core's own gain, T=16 B={R['a_offline_ct1']['sequences']} vs B=1, "
             "1 thread (no target)", f"{gain:.2f}×", None))
for n, what in [("b_default", "defaults (no queue delay)"),
                ("b_delay", "--max-queue-delay-us 1000")]:
    d = R[n]["latency_ms"]["p50"] - R["b_offline"]["p50_ms"]
    rows.append((f"(b) T=128 c=1: p50 − core alone ≤ +0.3 ms, {what}", f"{d:+.3f} ms", d <= 0.3))
for n, o, what in [("c_t128", "c_t128_offline", "T=128 c=64"),
                   ("c_t128_ct1", "c_t128_ct1_offline", "T=128 c=64, 1 compute thread both"),
                   ("a_batched", "a_offline", "T=16 c=64"),
                   ("a_stream", "a_stream_offline", "T=16 c=64 AttendStream")]:
    x = ratio(n, o)
    rows.append((f"(c) {what} ≥ 85 % of offline at B={R[o]['sequences']}", f"{100 * x:.0f} %",
                 x >= 0.85))
print("\n| target | measured | met |")
print("|---|---|---|")
for what, value, ok in rows:
    print(f"| {what} | {value} | {mark(ok)} |")
disturbed = [n for n in names if R[n]["other_cores"] > 0.1]
if disturbed:
    print(f"\nWARNING: other processes used > 0.1 core during: {', '.join(disturbed)}")
EOF
