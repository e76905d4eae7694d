#!/usr/bin/python3
"""Exports a torch.nn.MultiheadAttention into an attnserve model folder.

A model folder is <repository>/<name>/ holding config.json and weights.safetensors
(core/model/model.h); the folder's last component is the model name. The safetensors file is
written here with json + struct because Debian ships no `safetensors` package.

Runs with Debian's /usr/bin/python3 and python3-torch (1.13); nothing from PyPI.

  /usr/bin/python3 tools/export_torch.py --out models/my_mha --d-model 512 --heads 8 --seed 1
  /usr/bin/python3 tools/export_torch.py --out models/my_mha --heads 8 --state-dict mha.pt
"""

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile

import torch

CONFIG_FILE_NAME = "config.json"
WEIGHTS_FILE_NAME = "weights.safetensors"
NAMINGS = ("torch", "split")
# attnserve's AttentionConfig accepts d_model up to this (core/forward/attention_config.cc).
MAX_D_MODEL = 65536

# File dtype option -> (torch dtype, safetensors dtype name).
FILE_DTYPES = {
    "f32": (torch.float32, "F32"),
    "f16": (torch.float16, "F16"),
    "bf16": (torch.bfloat16, "BF16"),
}

# Safetensors names of the torch dtypes write_safetensors accepts. 16-bit floats are written
# through an int16 view because numpy has no bfloat16.
_SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class ExportError(ValueError):
    """A module, state dict or option that cannot become an attnserve model."""


def _tensor_bytes(tensor):
    """Little-endian, row-major bytes of `tensor` (on any host)."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype in (torch.float16, torch.bfloat16):
        array = tensor.view(torch.int16).numpy()
    else:
        array = tensor.numpy()
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def safetensors_image(tensors, metadata=None):
    """The bytes of a safetensors file holding `tensors` (name -> tensor) in the given order.

    Header: 8-byte little-endian length N, then N bytes of JSON padded with spaces so that the
    data section starts at a multiple of 8 (as the reference implementation does).
    """
    header = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ExportError("safetensors metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    chunks = []
    offset = 0
    for name, tensor in tensors.items():
        if not name or name == "__metadata__":
            raise ExportError(f"invalid tensor name {name!r}")
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise ExportError(f"tensor {name}: unsupported dtype {tensor.dtype}")
        data = _tensor_bytes(tensor)
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-(8 + len(header_bytes)) % 8)
    return struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(chunks)


def _file_mode():
    """0666 minus the umask: what open() would give. mkstemp's 0600 would hide the model from a
    server running as another user."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_file_atomically(path, data):
    """Writes `data` (bytes) to `path` through a temporary file in the same folder and
    os.replace, so readers (a server watching the repository) never see a partial file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp_path = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp_path, path)
    except BaseException:
        try:
            os.unlink(temp_path)
        except FileNotFoundError:
            pass
        raise


def write_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (dict name -> torch.Tensor) and `metadata` (dict str -> str) to `path`
    atomically, in the dict's order."""
    write_file_atomically(path, safetensors_image(tensors, metadata))


def read_safetensors_header(path):
    """(header dict without __metadata__, metadata dict, data offset) of a safetensors file.
    Only what the tests and a quick sanity check need; attnserve's C++ reader does the real
    validation."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length).decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    return header, metadata, 8 + length


def validate_mha(mha):
    """Raises ExportError when `mha` is not something attnserve's multi-head layer computes."""
    if not isinstance(mha, torch.nn.MultiheadAttention):
        raise ExportError(f"expected torch.nn.MultiheadAttention, got {type(mha).__name__}")
    if not mha._qkv_same_embed_dim:
        raise ExportError(
            f"kdim/vdim ({mha.kdim}/{mha.vdim}) differ from embed_dim ({mha.embed_dim}): "
            "attnserve projects queries, keys and values from the same width d_model")
    if mha.bias_k is not None or mha.bias_v is not None:
        raise ExportError("add_bias_kv=True is not supported: attnserve has no learned extra "
                          "key/value row (bias_k/bias_v)")
    if mha.add_zero_attn:
        raise ExportError("add_zero_attn=True is not supported: attnserve does not append a zero "
                          "key/value row")
    has_in_bias = mha.in_proj_bias is not None
    has_out_bias = mha.out_proj.bias is not None
    if has_in_bias != has_out_bias:
        raise ExportError(
            f"in_proj_bias is {'present' if has_in_bias else 'absent'} but out_proj.bias is "
            f"{'present' if has_out_bias else 'absent'}: attnserve's bias flag covers every "
            "projection")


def mha_tensors(mha, naming="torch"):
    """The fp32 tensors of `mha` (validated) under `naming`, in a stable order."""
    if naming not in NAMINGS:
        raise ExportError(f"naming must be one of {', '.join(NAMINGS)}, got {naming!r}")
    d = mha.embed_dim
    with torch.no_grad():
        in_w = mha.in_proj_weight.detach().float()
        in_b = None if mha.in_proj_bias is None else mha.in_proj_bias.detach().float()
        out_w = mha.out_proj.weight.detach().float()
        out_b = None if mha.out_proj.bias is None else mha.out_proj.bias.detach().float()
    tensors = {}
    if naming == "torch":
        tensors["in_proj_weight"] = in_w
        if in_b is not None:
            tensors["in_proj_bias"] = in_b
    else:
        for i, prefix in enumerate(("q_proj", "k_proj", "v_proj")):
            tensors[prefix + ".weight"] = in_w[i * d:(i + 1) * d]
            if in_b is not None:
                tensors[prefix + ".bias"] = in_b[i * d:(i + 1) * d]
    tensors["out_proj.weight"] = out_w
    if out_b is not None:
        tensors["out_proj.bias"] = out_b
    return tensors


def _convert(tensors, dtype):
    """`tensors` in the file dtype; refuses values that are not finite there."""
    if dtype not in FILE_DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(FILE_DTYPES)}, got {dtype!r}")
    torch_dtype, _ = FILE_DTYPES[dtype]
    converted = {}
    for name, tensor in tensors.items():
        bad = (~torch.isfinite(tensor)).nonzero()
        if len(bad):
            index = tuple(bad[0].tolist())
            raise ExportError(f"tensor {name} element {list(index)} is {tensor[index].item()}; "
                              "weights must be finite")
        value = tensor.to(torch_dtype).contiguous()
        if not torch.isfinite(value.float()).all():
            raise ExportError(f"tensor {name} overflows {dtype} (largest |value| "
                              f"{tensor.abs().max().item():g})")
        converted[name] = value
    return converted


def export_mha(mha, folder, naming="torch", dtype="f32"):
    """Writes `mha` as the model folder `folder` (created if needed): config.json and
    weights.safetensors, each replaced atomically. config.json records the SHA-256 of the weights
    file ("weights_sha256"), which attnserve verifies at load. Returns the config dict.

    batch_first and dropout do not change the weights, so any value is accepted. F16/BF16 files
    round every weight to nearest even; attnserve computes in fp32 from the rounded values.
    """
    validate_mha(mha)
    model_name = os.path.basename(os.path.normpath(folder))
    if not model_name or model_name.startswith(".") or model_name == os.sep:
        raise ExportError(f"model folder {folder!r}: the folder name is the model name and must "
                          "not be empty or start with '.' (the server ignores such folders)")
    tensors = _convert(mha_tensors(mha, naming), dtype)
    config = {
        "d_model": mha.embed_dim,
        "num_heads": mha.num_heads,
        "variant": "multi_head",
        "bias": mha.in_proj_bias is not None,
        "dtype": "fp32",
    }
    metadata = {
        "format": "pt",
        "producer": "attnserve tools/export_torch.py",
        "torch_version": torch.__version__,
        "naming": naming,
    }
    image = safetensors_image(tensors, metadata)
    # The server verifies the weights against this digest when it loads them, so corruption of
    # the file (or a file replaced without its config.json) is a load error, not a new version.
    config["weights_sha256"] = hashlib.sha256(image).hexdigest()
    os.makedirs(folder, exist_ok=True)
    # Weights first: a server that sees the new config.json then also finds matching weights.
    write_file_atomically(os.path.join(folder, WEIGHTS_FILE_NAME), image)
    write_file_atomically(os.path.join(folder, CONFIG_FILE_NAME),
                          (json.dumps(config, indent=2) + "\n").encode("utf-8"))
    return config


def mha_from_state_dict(state_dict, num_heads, prefix=""):
    """A MultiheadAttention holding `state_dict` (keys under `prefix`, e.g.
    "layers.0.self_attn."). d_model and bias come from the tensors; the head count is not stored
    in a state dict, so it must be given."""
    keys = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if "in_proj_weight" not in keys:
        if "q_proj_weight" in keys:
            raise ExportError("the state dict has q_proj_weight/k_proj_weight/v_proj_weight "
                              "(kdim/vdim != embed_dim), which attnserve does not support")
        raise ExportError(f"no {prefix}in_proj_weight in the state dict (keys: "
                          f"{', '.join(sorted(state_dict)[:8])}...)")
    in_proj_weight = keys["in_proj_weight"]
    if not isinstance(in_proj_weight, torch.Tensor) or in_proj_weight.dim() != 2:
        found = (f"a {in_proj_weight.dim()}-D tensor of shape {list(in_proj_weight.shape)}"
                 if isinstance(in_proj_weight, torch.Tensor) else type(in_proj_weight).__name__)
        raise ExportError(f"{prefix}in_proj_weight must be a 2-D tensor [3 * d_model, d_model], "
                          f"got {found}")
    d_model = in_proj_weight.shape[1]
    if num_heads is None or num_heads < 1 or d_model % num_heads:
        raise ExportError(f"--heads must be given and divide d_model {d_model}, got {num_heads}")
    mha = torch.nn.MultiheadAttention(d_model, num_heads, bias="in_proj_bias" in keys,
                                      add_bias_kv="bias_k" in keys, batch_first=True)
    try:
        mha.load_state_dict(keys, strict=True)
    except RuntimeError as e:
        raise ExportError(f"the state dict does not fit MultiheadAttention({d_model}, "
                          f"{num_heads}): {e}") from e
    return mha


def _load_state_dict(path):
    """torch.load with weights_only=True: a state dict file must not run code when loaded."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise  # main() reports it as it is ("No such file or directory: ...").
    except Exception as e:  # A corrupt file raises EOFError, KeyError, zipfile errors...
        raise ExportError(f"cannot load {path} as a state dict (weights_only=True): "
                          f"{type(e).__name__}: {e}") from e


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Export a torch.nn.MultiheadAttention as an attnserve model folder "
        "(config.json + weights.safetensors). The folder name is the model name.")
    parser.add_argument("--out", required=True,
                        help="model folder to write, e.g. models/my_mha (created if missing)")
    parser.add_argument("--d-model", type=int, default=512,
                        help="embed_dim for a randomly initialised layer (default 512)")
    parser.add_argument("--heads", type=int, default=None,
                        help="number of heads (default 8; required with --state-dict)")
    parser.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True,
                        help="random layer with or without biases (default --bias; torch "
                        "initialises biases to zero)")
    parser.add_argument("--seed", type=int, default=0,
                        help="torch.manual_seed for the random initialisation (default 0)")
    parser.add_argument("--state-dict", metavar="FILE",
                        help="load the weights from a torch.save()d state dict instead of "
                        "initialising randomly (loaded with weights_only=True)")
    parser.add_argument("--prefix", default="",
                        help="key prefix of the attention layer inside --state-dict, e.g. "
                        "'layers.0.self_attn.'")
    parser.add_argument("--naming", choices=NAMINGS, default="torch",
                        help="tensor names in the file: torch (in_proj_weight...) or split "
                        "(q_proj.weight...) (default torch)")
    parser.add_argument("--dtype", choices=sorted(FILE_DTYPES), default="f32",
                        help="file dtype of the weights (default f32)")
    return parser.parse_args(argv)


def main(argv=None):
    args = _parse_args(argv)
    try:
        if args.state_dict:
            state_dict = _load_state_dict(args.state_dict)
            if not isinstance(state_dict, dict):
                raise ExportError(f"{args.state_dict} does not hold a state dict")
            mha = mha_from_state_dict(state_dict, args.heads, args.prefix)
        else:
            heads = 8 if args.heads is None else args.heads
            if not 1 <= args.d_model <= MAX_D_MODEL:
                raise ExportError(f"--d-model must be in 1..{MAX_D_MODEL}, got {args.d_model}")
            if heads < 1 or args.d_model % heads:
                raise ExportError(f"--heads ({heads}) must divide --d-model ({args.d_model})")
            torch.manual_seed(args.seed)
            mha = torch.nn.MultiheadAttention(args.d_model, heads, bias=args.bias,
                                              batch_first=True)
        config = export_mha(mha, args.out, naming=args.naming, dtype=args.dtype)
    except (ExportError, OSError) as e:
        print(f"export_torch.py: error: {e}", file=sys.stderr)
        return 1
    name = os.path.basename(os.path.normpath(args.out))
    print(f"wrote model '{name}' to {args.out}: d_model {config['d_model']}, "
          f"{config['num_heads']} heads, bias {str(config['bias']).lower()}, "
          f"{args.naming} naming, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
