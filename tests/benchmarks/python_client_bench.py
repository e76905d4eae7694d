#!/usr/bin/python3
"""Closed-loop load from Python against a running attnserve: the attnserve package's Client
(attnserve.v1 Attend) or the Open Inference Protocol's ModelInfer (stubs generated from
proto/inference at start), same inputs, bounded in time. Prints requests/s and latency
percentiles (ms). For comparing the protocols, and the Python client against attnserve-cli bench.

  PYTHONPATH=<pip --target folder> python_client_bench.py --target 127.0.0.1:PORT \
      --mode {client,infer} --seq-len 128 --concurrency 1 --duration 10
"""
import argparse
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


def client_caller(args):
    import attnserve
    client = attnserve.Client(args.target, model=args.model, timeout_s=30)
    return client.attend


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--mode", choices=("client", "infer"), default="client")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    call = infer_caller(args) if args.mode == "infer" else client_caller(args)
    x = np.random.default_rng(1).standard_normal((args.seq_len, args.d_model)).astype("<f4")
    for _ in range(20):  # warm-up
        call(x)
    latencies, lock = [], threading.Lock()
    end = time.monotonic() + args.duration

    def worker():
        mine = []
        while time.monotonic() < end:
            start = time.perf_counter()
            call(x)
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    ms = np.array(latencies) * 1e3
    print(f"mode={args.mode} T={args.seq_len} c={args.concurrency} requests={len(ms)} "
          f"rps={len(ms) / elapsed:.1f} p50={np.percentile(ms, 50):.3f} "
          f"p90={np.percentile(ms, 90):.3f} p99={np.percentile(ms, 99):.3f}")


if __name__ == "__main__":
    main()
