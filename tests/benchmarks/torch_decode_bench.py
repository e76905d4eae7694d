#!/usr/bin/python3
"""PyTorch 1.13 incremental decoding on the shapes of attnserve_core_bench's decode benchmarks
(d_model 512, 8 heads, fp32, 2 threads), for the comparison in docs/PERFORMANCE.md:

  kv_cache   an explicit K/V cache (preallocated [B, h, P_max, d_k] tensors): per step the new
             token's Q|K|V by one linear, K/V written at position P, softmax(q·Kᵀ/√d_k)·V with
             matmuls over the cached prefix, then out_proj — the fastest plain-torch decoder.
  prefix     nn.MultiheadAttention fed the growing prefix (query = new token, key = value =
             prefix): what torch offers without a cache (K/V of the prefix re-projected).

Prints tokens/s per row (median of 5 runs). Usage: torch_decode_bench.py [--threads 2]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

D, H = 512, 8


def kv_cache_step(mha, x, k_cache, v_cache, past):
    b = x.shape[0]
    dk = D // H
    qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)  # [B, 1, 3d]
    q, k, v = qkv.split(D, dim=-1)
    q = q.view(b, 1, H, dk).transpose(1, 2)  # [B, h, 1, dk]
    k_cache[:, :, past] = k.view(b, H, dk)
    v_cache[:, :, past] = v.view(b, H, dk)
    scores = torch.matmul(q, k_cache[:, :, : past + 1].transpose(-1, -2)) * dk**-0.5
    ctx = torch.matmul(torch.softmax(scores, dim=-1), v_cache[:, :, : past + 1])
    return mha.out_proj(ctx.transpose(1, 2).reshape(b, 1, D))


def time_it(fn, iterations):
    runs = []
    for _ in range(5):
        fn()
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        runs.append((time.perf_counter() - start) / iterations)
    return statistics.median(runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(D, H, bias=False, batch_first=True).eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with torch.no_grad():
        for b, past, iters in ((64, 128, 20), (1, 2048, 200)):
            k_cache = torch.rand(b, H, past + 1, D // H)
            v_cache = torch.rand(b, H, past + 1, D // H)
            x = torch.rand(b, 1, D)
            t = time_it(lambda: kv_cache_step(mha, x, k_cache, v_cache, past), iters)
            print(f"kv_cache  B={b:3d} P={past:5d}  batched      {t * 1e6:10.1f} us/step "
                  f"{b / t:10.0f} tokens/s")
            if b > 1:
                one = [(x[i : i + 1], k_cache[i : i + 1], v_cache[i : i + 1]) for i in range(b)]
                t = time_it(lambda: [kv_cache_step(mha, *o, past) for o in one], iters // 4)
                print(f"kv_cache  B={b:3d} P={past:5d}  one-at-a-time{t * 1e6:10.1f} us/step "
                      f"{b / t:10.0f} tokens/s")
            prefix = torch.rand(b, past + 1, D)
            t = time_it(lambda: mha(x, prefix, prefix, need_weights=False), max(2, iters // 10))
            print(f"prefix    B={b:3d} P={past:5d}  batched      {t * 1e6:10.1f} us/step "
                  f"{b / t:10.0f} tokens/s")


if __name__ == "__main__":
    main()
