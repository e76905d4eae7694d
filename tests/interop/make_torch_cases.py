#!/usr/bin/python3
"""Writes the torch interop cases that torch_interop_test.cc checks attnserve against.

For every case: a random torch.nn.MultiheadAttention exported with tools/export_torch.py to
<out>/<case>/model/, random padded inputs, and torch's outputs on them (eval mode, batch_first,
float32) in <out>/<case>/case.safetensors. <out>/cases.txt, written last, lists the cases, so
the C++ test can tell a complete run from an empty or partial one.

case.safetensors holds torch's view of the call (padded to the longest sequence):
  query             F32  [B, T, d]
  query_lengths     I64  [B]            valid query rows per sequence
  memory            F32  [B, S, d]      cross-attention only (key = value = memory)
  memory_lengths    I64  [B]            cross-attention only
  key_padding_mask  BOOL [B, S]         when some sequence is shorter than S; True = padding
  attn_mask         BOOL [T, S]         causal or explicit masks; True = blocked
  expected_output   F32  [B, T, d]      rows past query_lengths are not meaningful
  reference_output  F32  [B, T, d]      torch in float64 (rounded to F32)
  expected_weights  F32  [B, h, T, S]   need_weights=True, average_attn_weights=False
and string metadata: mask (none|causal|explicit), cross, need_weights, the model's shape,
naming and file dtype, torch's own fp32 error (against float64) for the record, and torch's
bf16 module's error (torch_bf16_error, max abs against float64 over valid rows).
"""

import argparse
import copy
import os
import shutil
import sys

sys.dont_write_bytecode = True  # Keep __pycache__ out of the source tree.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools"))

import torch  # noqa: E402

import export_torch  # noqa: E402

MANIFEST_FILE_NAME = "cases.txt"
CASE_FILE_NAME = "case.safetensors"
MODEL_FOLDER_NAME = "model"

# Every case: model shape and file format, query lengths, memory lengths (None = self-attention),
# mask, and whether per-head weights are compared. Lengths differing within a batch mean a padded
# torch batch with key_padding_mask against attnserve's ragged batch.
CASES = [
    dict(name="self_bias", d=64, h=4, bias=True, lengths=[7, 7]),
    dict(name="self_no_bias", d=64, h=4, bias=False, lengths=[5, 5, 5]),
    dict(name="self_no_bias_h1", d=64, h=1, bias=False, lengths=[4, 6]),
    dict(name="self_d256_h8", d=256, h=8, bias=True, lengths=[6]),
    dict(name="causal", d=64, h=8, bias=True, lengths=[9, 9], mask="causal"),
    dict(name="cross_s_gt_t", d=64, h=4, bias=True, lengths=[5, 5], memory=[11, 11]),
    dict(name="cross_s_lt_t", d=256, h=8, bias=False, lengths=[9, 9], memory=[4, 4]),
    dict(name="cross_causal_s_gt_t", d=64, h=4, bias=True, lengths=[6], memory=[10],
         mask="causal"),
    dict(name="cross_causal_s_lt_t", d=64, h=4, bias=True, lengths=[8], memory=[3],
         mask="causal"),
    dict(name="padding_self", d=64, h=4, bias=True, lengths=[7, 3, 5, 1]),
    dict(name="padding_self_causal", d=256, h=8, bias=True, lengths=[6, 2, 4], mask="causal"),
    dict(name="padding_cross", d=64, h=8, bias=True, lengths=[5, 2, 4], memory=[3, 8, 6]),
    dict(name="explicit_mask_padding", d=64, h=4, bias=True, lengths=[6, 4, 5], mask="explicit"),
    dict(name="weights_self", d=64, h=4, bias=True, lengths=[6, 6], need_weights=True),
    dict(name="weights_padding_self_causal", d=64, h=8, bias=False, lengths=[5, 2, 7],
         mask="causal", need_weights=True),
    dict(name="weights_padding_cross", d=256, h=4, bias=True, lengths=[3, 6, 2],
         memory=[7, 2, 5], need_weights=True),
    dict(name="split_naming", d=64, h=4, bias=True, lengths=[5, 3, 6], naming="split"),
    dict(name="split_naming_no_bias", d=256, h=1, bias=False, lengths=[4, 4], naming="split",
         mask="causal"),
    dict(name="f16_weights", d=256, h=8, bias=True, lengths=[5, 3], dtype="f16",
         need_weights=True),
    dict(name="bf16_weights", d=64, h=4, bias=True, lengths=[4, 6], memory=[6, 3],
         dtype="bf16"),
]


def make_mha(spec, seed):
    """A random MHA in eval mode. torch initialises biases to zero, so they are randomised here
    to make the bias cases test something; 16-bit cases round every parameter to the file dtype
    first, so torch computes with exactly the weights attnserve loads."""
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(spec["d"], spec["h"], bias=spec["bias"], batch_first=True)
    with torch.no_grad():
        if spec["bias"]:
            torch.nn.init.uniform_(mha.in_proj_bias, -0.5, 0.5)
            torch.nn.init.uniform_(mha.out_proj.bias, -0.5, 0.5)
        file_dtype = export_torch.FILE_DTYPES[spec.get("dtype", "f32")][0]
        for p in mha.parameters():
            p.copy_(p.to(file_dtype).float())
    return mha.eval()


def padding_mask(lengths):
    """[B, max(lengths)] bool, True past each sequence's length (torch's key_padding_mask)."""
    positions = torch.arange(max(lengths))
    return positions[None, :] >= torch.tensor(lengths)[:, None]


def attention_mask(kind, t, s):
    """torch's boolean attn_mask [t, s] (True = blocked) for `kind`, or None."""
    if kind == "none":
        return None
    if kind == "causal":
        # Top-left aligned as attnserve's mask.causal: query i sees keys j <= i.
        return torch.ones(t, s, dtype=torch.bool).triu(diagonal=1)
    blocked = torch.rand(t, s) < 0.4
    blocked[:, 0] = False  # No valid query row may have every key blocked (torch gives NaN).
    return blocked


def run_torch(mha, query, memory, key_padding_mask, attn_mask, need_weights):
    if memory is query and mha.in_proj_bias is None:
        # torch 1.13's self-attention fast path (_native_multi_head_attention) raises TypeError
        # for bias=False; an equal but distinct key/value tensor takes the regular path.
        memory = query.clone()
    with torch.no_grad():
        return mha(query, memory, memory, key_padding_mask=key_padding_mask,
                   need_weights=need_weights, attn_mask=attn_mask, average_attn_weights=False)


def make_case(spec, seed, folder):
    """Writes one case folder; returns its metadata."""
    mha = make_mha(spec, seed)
    d, lengths = spec["d"], spec["lengths"]
    memory_lengths = spec.get("memory")
    mask_kind = spec.get("mask", "none")
    need_weights = spec.get("need_weights", False)
    key_lengths = memory_lengths or lengths
    t, s = max(lengths), max(key_lengths)

    query = torch.randn(len(lengths), t, d)
    memory = torch.randn(len(lengths), s, d) if memory_lengths else query
    key_padding_mask = padding_mask(key_lengths) if min(key_lengths) < s else None
    attn_mask = attention_mask(mask_kind, t, s)
    output, weights = run_torch(mha, query, memory, key_padding_mask, attn_mask, need_weights)
    # torch itself in float64, to record how much of the tolerance fp32 arithmetic takes.
    output64, _ = run_torch(copy.deepcopy(mha).double(), query.double(), memory.double(),
                            key_padding_mask, attn_mask, False)
    valid = ~padding_mask(lengths)
    torch_fp32_error = (output.double() - output64)[valid].abs().max().item()
    # torch's own CPU bf16 module on the same inputs: the error attnserve's bf16 compute must not
    # exceed (torch_interop_test.cc, Bf16ErrorNoLargerThanTorchBf16).
    output_bf16, _ = run_torch(copy.deepcopy(mha).to(torch.bfloat16), query.bfloat16(),
                               memory.bfloat16(), key_padding_mask, attn_mask, False)
    torch_bf16_error = (output_bf16.double() - output64)[valid].abs().max().item()

    export_torch.export_mha(mha, os.path.join(folder, MODEL_FOLDER_NAME),
                            naming=spec.get("naming", "torch"), dtype=spec.get("dtype", "f32"))
    tensors = {"query": query, "query_lengths": torch.tensor(lengths, dtype=torch.int64)}
    if memory_lengths:
        tensors["memory"] = memory
        tensors["memory_lengths"] = torch.tensor(memory_lengths, dtype=torch.int64)
    if key_padding_mask is not None:
        tensors["key_padding_mask"] = key_padding_mask
    if attn_mask is not None:
        tensors["attn_mask"] = attn_mask
    tensors["expected_output"] = output
    tensors["reference_output"] = output64.float()
    if need_weights:
        tensors["expected_weights"] = weights
    metadata = {
        "case": spec["name"],
        "seed": str(seed),
        "d_model": str(d),
        "num_heads": str(spec["h"]),
        "bias": str(spec["bias"]).lower(),
        "naming": spec.get("naming", "torch"),
        "dtype": spec.get("dtype", "f32"),
        "mask": mask_kind,
        "cross": str(bool(memory_lengths)).lower(),
        "need_weights": str(need_weights).lower(),
        "torch_version": torch.__version__,
        "torch_fp32_error": f"{torch_fp32_error:.3g}",
        "torch_bf16_error": repr(torch_bf16_error),
    }
    export_torch.write_safetensors(os.path.join(folder, CASE_FILE_NAME), tensors, metadata)
    return metadata


def clear_output(out):
    """Removes the manifest and case folders of an earlier run, so stale cases cannot pass."""
    os.makedirs(out, exist_ok=True)
    manifest = os.path.join(out, MANIFEST_FILE_NAME)
    if os.path.exists(manifest):
        os.remove(manifest)
    for entry in os.scandir(out):
        if entry.is_dir() and (os.path.exists(os.path.join(entry.path, CASE_FILE_NAME)) or
                               os.path.isdir(os.path.join(entry.path, MODEL_FOLDER_NAME))):
            shutil.rmtree(entry.path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write the cases into")
    parser.add_argument("--seed", type=int, default=20240601,
                        help="base seed; case i uses seed + i (default %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="print one line per case")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # Small problems; ctest runs other tests on the other core.
    clear_output(args.out)
    for index, spec in enumerate(CASES):
        metadata = make_case(spec, args.seed + index, os.path.join(args.out, spec["name"]))
        if args.verbose:
            print(f"{spec['name']}: torch fp32 vs fp64 {metadata['torch_fp32_error']}")
    export_torch.write_file_atomically(
        os.path.join(args.out, MANIFEST_FILE_NAME),
        "".join(spec["name"] + "\n" for spec in CASES).encode("utf-8"))
    print(f"make_torch_cases.py: wrote {len(CASES)} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
