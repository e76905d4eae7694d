#!/usr/bin/python3
"""Writes the incremental-decoding cases against which torch_decode_interop_test.cc checks
attnserve's KV cache.

torch 1.13 has no KV cache in nn.MultiheadAttention, so its incremental decoding is the module
fed the growing prefix: at step t the query is token t alone and the keys/values are tokens
0..t, which is exactly what a causal forward gives row t. Per case, in <out>/<case>/:
  model/          the MHA exported with tools/export_torch.py
  query.f32       [L, d] little-endian float32: the sequence
  expected.f32    [L, d] torch's output of step t in row t
<out>/cases.txt, written last, lists "name L d" per line.
"""

import argparse
import os
import shutil
import sys

sys.dont_write_bytecode = True  # Keep __pycache__ out of the source tree.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools"))

import torch  # noqa: E402

import export_torch  # noqa: E402

CASES = [
    dict(name="decode_d64_h4_bias", d=64, h=4, bias=True, length=40),
    dict(name="decode_d64_h1_no_bias", d=64, h=1, bias=False, length=35),
    dict(name="decode_d128_h8_bias", d=128, h=8, bias=True, length=50),
]


def make_case(spec, seed, folder):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(spec["d"], spec["h"], bias=spec["bias"], batch_first=True)
    with torch.no_grad():
        if spec["bias"]:
            torch.nn.init.uniform_(mha.in_proj_bias, -0.5, 0.5)
            torch.nn.init.uniform_(mha.out_proj.bias, -0.5, 0.5)
    mha.eval()
    x = torch.rand(1, spec["length"], spec["d"]) * 2 - 1
    rows = []
    with torch.no_grad():
        for t in range(spec["length"]):
            prefix = x[:, : t + 1, :]
            out, _ = mha(x[:, t : t + 1, :], prefix, prefix, need_weights=False)
            rows.append(out[0, 0])
    expected = torch.stack(rows)
    os.makedirs(folder)
    export_torch.export_mha(mha, os.path.join(folder, "model"))
    x[0].contiguous().numpy().astype("<f4").tofile(os.path.join(folder, "query.f32"))
    expected.contiguous().numpy().astype("<f4").tofile(os.path.join(folder, "expected.f32"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to (re)create")
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    for i, spec in enumerate(CASES):
        make_case(spec, 100 + i, os.path.join(args.out, spec["name"]))
    lines = "".join(f"{s['name']} {s['length']} {s['d']}\n" for s in CASES)
    with open(os.path.join(args.out, "cases.txt"), "w", encoding="utf-8") as f:
        f.write(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
