#!/usr/bin/python3
"""Closed-loop load from Python against a running attnserve: the attnserve package's Client
(attnserve.v1 Attend), the bare generated attnserve.v1 stub the package ships (--mode stub: the
Python client's floor), or the Open Inference Protocol's ModelInfer (stubs generated from
proto/inference at start), same inputs, bounded in time or in requests. Prints requests/s and
latency percentiles and mean (ms), or one JSON object with --json. For comparing the protocols,
and the Python client against attnserve-cli bench (tests/benchmarks/run_oip_bench.sh).
--mode decode: the package's decoding sessions, as attnserve-cli bench --sessions N --context C
--steps S --clients 1 runs them: N sessions on one stream, each prefilled with C rows, then S
rounds of one message stepping every session by one row; prints tokens/s of the rounds.
Calls attnserve.reuse_large_allocations() first, as an application should
(--glibc-malloc-defaults skips it).

  PYTHONPATH=<pip --target folder> python_client_bench.py --target 127.0.0.1:PORT \
      --mode {client,stub,infer} --seq-len 128 --concurrency 1 {--duration 10 | --requests 2000}
  PYTHONPATH=... python_client_bench.py --target ... --mode decode --sessions 64 --context 128 \
      --steps 200
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np


def infer_caller(args):
    import grpc
    from grpc_tools import protoc
    out = tempfile.mkdtemp()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={out}",
                 f"--grpc_python_out={out}", "inference/grpc_predict_v2.proto"])
    sys.path.insert(0, out)
    from inference import grpc_predict_v2_pb2 as pb, grpc_predict_v2_pb2_grpc as rpc
    channel = grpc.insecure_channel(args.target)
    stub = rpc.GRPCInferenceServiceStub(channel)

    def call(x):
        request = pb.ModelInferRequest(model_name=args.model)
        request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        request.raw_input_contents.append(x.tobytes())
        response = stub.ModelInfer(request, timeout=30)
        return np.frombuffer(response.raw_output_contents[0], dtype="<f4")
    return call


def stub_caller(args):
    # The Python floor: the generated grpcio stub the package ships, no conversions of its own
    # beyond what any caller needs (numpy bytes in, a numpy view of the answer out).
    import grpc
    from attnserve.v1 import attention_pb2, attention_pb2_grpc
    channel = grpc.insecure_channel(args.target, options=[
        ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
    stub = attention_pb2_grpc.AttentionServiceStub(channel)

    def call(x):
        request = attention_pb2.AttendRequest(model=args.model, raw_output=True)
        request.input.shape.extend(x.shape)
        request.input.raw = x.tobytes()
        response = stub.Attend(request, timeout=30)
        return np.frombuffer(response.output.raw, dtype="<f4").reshape(x.shape)
    return call


def client_caller(args):
    import attnserve
    client = attnserve.Client(args.target, model=args.model, timeout_s=30)
    return client.attend


def run_decode(args):
    import attnserve
    rng = np.random.default_rng(1)
    prompt = rng.standard_normal((args.context, args.d_model)).astype("<f4")
    rows = rng.standard_normal((args.sessions, args.d_model)).astype("<f4")
    with attnserve.Client(args.target) as client, client.decode_stream() as stream:
        sessions = [stream.open(args.model) for _ in range(args.sessions)]
        stream.step_all([(s, prompt) for s in sessions])
        for _ in range(min(args.warmup_requests, 5)):
            stream.step_all(list(zip(sessions, rows)))
        rounds, began, began_cpu = [], time.monotonic(), time.process_time()
        for _ in range(args.steps):
            start = time.perf_counter()
            stream.step_all(list(zip(sessions, rows)))
            rounds.append(time.perf_counter() - start)
        elapsed, cpu_s = time.monotonic() - began, time.process_time() - began_cpu
        stream.close_sessions(sessions)
    ms = np.array(rounds) * 1e3
    report = {"mode": "decode", "sessions": args.sessions, "context": args.context,
              "steps": args.steps, "tokens_per_s": args.sessions * args.steps / elapsed,
              "round_ms": {"p50": float(np.percentile(ms, 50)),
                           "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean())},
              "client_cpu_s": cpu_s}
    if args.json:
        print(json.dumps(report))
        return
    print(f"mode=decode sessions={args.sessions} context={args.context} steps={args.steps} "
          f"tokens_per_s={report['tokens_per_s']:.0f} round_p50={report['round_ms']['p50']:.3f} "
          f"round_p99={report['round_ms']['p99']:.3f} "
          f"client_cpu_us_per_round={1e6 * cpu_s / args.steps:.0f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--mode", choices=("client", "infer", "stub", "decode"), default="client")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds (ignored with --requests)")
    parser.add_argument("--requests", type=int, default=0,
                        help="stop after this many requests in all (0 = run --duration)")
    parser.add_argument("--warmup-requests", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sessions", type=int, default=64, help="decode mode")
    parser.add_argument("--context", type=int, default=128, help="decode mode: prompt rows")
    parser.add_argument("--steps", type=int, default=200, help="decode mode: rounds")
    parser.add_argument("--glibc-malloc-defaults", action="store_true",
                        help="skip attnserve.reuse_large_allocations() (as attnserve-cli, the "
                             "bench calls it at start)")
    args = parser.parse_args()
    if not args.glibc_malloc_defaults:
        import attnserve
        attnserve.reuse_large_allocations()
    if args.mode == "decode":
        run_decode(args)
        return
    callers = {"client": client_caller, "infer": infer_caller, "stub": stub_caller}
    call = callers[args.mode](args)
    x = np.random.default_rng(1).standard_normal((args.seq_len, args.d_model)).astype("<f4")
    for _ in range(args.warmup_requests):
        call(x)
    latencies, lock = [], threading.Lock()
    end = time.monotonic() + (args.duration if args.requests == 0 else 1e9)
    budget = [args.requests]

    def take():
        if args.requests == 0:
            return time.monotonic() < end
        with lock:
            budget[0] -= 1
            return budget[0] >= 0

    def worker():
        mine = []
        while take():
            start = time.perf_counter()
            call(x)
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    began, began_cpu = time.monotonic(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu_s = time.monotonic() - began, time.process_time() - began_cpu
    ms = np.array(latencies) * 1e3
    report = {"mode": args.mode, "seq_len": args.seq_len, "concurrency": args.concurrency,
              "requests": len(ms), "requests_per_s": len(ms) / elapsed,
              "latency_ms": {"p50": float(np.percentile(ms, 50)),
                             "p90": float(np.percentile(ms, 90)),
                             "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean())},
              "client_cpu_s": cpu_s}
    if args.json:
        print(json.dumps(report))
        return
    lat = report["latency_ms"]
    print(f"mode={args.mode} T={args.seq_len} c={args.concurrency} requests={len(ms)} "
          f"rps={report['requests_per_s']:.1f} p50={lat['p50']:.3f} p90={lat['p90']:.3f} "
          f"p99={lat['p99']:.3f} mean={lat['mean']:.3f} "
          f"client_cpu_us_per_request={1e6 * cpu_s / len(ms):.0f}")


if __name__ == "__main__":
    main()
