"""Unit tests of tools/export_torch.py: the safetensors writer, export_mha and the CLI.

Run through CTest: /usr/bin/python3 -m unittest export_torch_test (from this folder).
"""

import contextlib
import hashlib
import io
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path.insert(0, TOOLS)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import export_torch  # noqa: E402

_TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                 "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """(name -> tensor, metadata) of a file, checking the layout rules attnserve's reader
    enforces: aligned header, tensors back to back covering the data section exactly."""
    with open(path, "rb") as f:
        image = f.read()
    (length,) = struct.unpack("<Q", image[:8])
    assert (8 + length) % 8 == 0, "data section not 8-byte aligned"
    header = json.loads(image[8:8 + length].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = image[8 + length:]
    tensors = {}
    end = 0
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, stop = entry["data_offsets"]
        assert begin == end, f"{name}: gap or overlap at {begin}, expected {end}"
        end = stop
        dtype = _TORCH_DTYPES[entry["dtype"]]
        buffer = bytearray(data[begin:stop])
        tensor = torch.frombuffer(buffer, dtype=dtype) if buffer else torch.empty(0, dtype=dtype)
        tensors[name] = tensor.reshape(entry["shape"])
    assert end == len(data), f"data section is {len(data)} bytes, tensors cover {end}"
    return tensors, metadata


def random_mha(d=16, h=4, bias=True, seed=1):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(d, h, bias=bias, batch_first=True)
    if bias:
        with torch.no_grad():
            torch.nn.init.uniform_(mha.in_proj_bias, -0.5, 0.5)
            torch.nn.init.uniform_(mha.out_proj.bias, -0.5, 0.5)
    return mha.eval()


def numpy_mha(tensors, heads, x, lengths):
    """Float64 multi-head self-attention of a padded batch from torch-named file tensors,
    written independently of torch; rows past each length are zero."""
    w = tensors["in_proj_weight"].double().numpy()
    b = tensors["in_proj_bias"].double().numpy()
    wo = tensors["out_proj.weight"].double().numpy()
    bo = tensors["out_proj.bias"].double().numpy()
    d = w.shape[1]
    dk = d // heads
    out = np.zeros(x.shape)
    for i, n in enumerate(lengths):
        rows = x[i, :n].double().numpy()
        q, k, v = np.split(rows @ w.T + b, 3, axis=1)
        concat = np.zeros((n, d))
        for hh in range(heads):
            cols = slice(hh * dk, (hh + 1) * dk)
            scores = q[:, cols] @ k[:, cols].T / math.sqrt(dk)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            concat[:, cols] = (p / p.sum(axis=1, keepdims=True)) @ v[:, cols]
        out[i, :n] = concat @ wo.T + bo
    return out


class SafetensorsWriterTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "t.safetensors")

    def tearDown(self):
        self.dir.cleanup()

    def test_round_trip_every_dtype(self):
        tensors = {
            "f32": torch.randn(3, 5),
            "f16": torch.randn(7).half(),
            "bf16": torch.randn(2, 3).bfloat16(),
            "i64": torch.tensor([0, -1, 2**40]),
            "u8": torch.tensor([[1, 0, 255]], dtype=torch.uint8),
            "mask": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5),
        }
        export_torch.write_safetensors(self.path, tensors, {"k": "v"})
        read, metadata = read_safetensors(self.path)
        self.assertEqual(metadata, {"k": "v"})
        self.assertEqual(list(read), list(tensors))  # Written in the given order.
        for name, tensor in tensors.items():
            self.assertEqual(read[name].dtype, tensor.dtype, name)
            self.assertEqual(read[name].shape, tensor.shape, name)
            self.assertTrue(torch.equal(read[name], tensor), name)

    def test_layout_is_little_endian_and_padded(self):
        export_torch.write_safetensors(self.path, {"x": torch.tensor([1.0, -2.0])})
        with open(self.path, "rb") as f:
            image = f.read()
        (length,) = struct.unpack("<Q", image[:8])
        self.assertEqual((8 + length) % 8, 0)
        self.assertTrue(image[8:8 + length].decode().endswith((" ", "}")))
        self.assertEqual(image[8 + length:], struct.pack("<2f", 1.0, -2.0))
        header, metadata, offset = export_torch.read_safetensors_header(self.path)
        self.assertEqual(header["x"], {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})
        self.assertEqual(metadata, {})
        self.assertEqual(offset, 8 + length)

    def test_bf16_and_f16_bits(self):
        export_torch.write_safetensors(self.path, {
            "h": torch.tensor([1.0, -2.0], dtype=torch.float16),
            "b": torch.tensor([1.0, -2.0], dtype=torch.bfloat16)})
        with open(self.path, "rb") as f:
            data = f.read()[-8:]
        self.assertEqual(data, struct.pack("<4H", 0x3C00, 0xC000, 0x3F80, 0xC000))

    def test_replaces_atomically_and_leaves_no_temporary(self):
        export_torch.write_safetensors(self.path, {"x": torch.zeros(4)})
        export_torch.write_safetensors(self.path, {"y": torch.ones(2)})
        read, _ = read_safetensors(self.path)
        self.assertEqual(list(read), ["y"])
        self.assertEqual(os.listdir(self.dir.name), ["t.safetensors"])
        self.assertEqual(os.stat(self.path).st_mode & 0o044, 0o044 & export_torch._file_mode())

    def test_refuses_bad_input(self):
        with self.assertRaisesRegex(export_torch.ExportError, "unsupported dtype"):
            export_torch.safetensors_image({"c": torch.zeros(2, dtype=torch.complex64)})
        with self.assertRaisesRegex(export_torch.ExportError, "invalid tensor name"):
            export_torch.safetensors_image({"": torch.zeros(2)})
        with self.assertRaisesRegex(export_torch.ExportError, "metadata"):
            export_torch.safetensors_image({"x": torch.zeros(2)}, {"k": 1})


class ExportMhaTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.folder = os.path.join(self.dir.name, "repo", "my_mha")

    def tearDown(self):
        self.dir.cleanup()

    def read_folder(self):
        with open(os.path.join(self.folder, "config.json")) as f:
            config = json.load(f)
        tensors, metadata = read_safetensors(os.path.join(self.folder, "weights.safetensors"))
        return config, tensors, metadata

    def test_torch_naming(self):
        mha = random_mha(d=16, h=4)
        returned = export_torch.export_mha(mha, self.folder)
        config, tensors, metadata = self.read_folder()
        # The digest is of the file as written (what `sha256sum weights.safetensors` prints), so
        # attnserve can verify it at load.
        with open(os.path.join(self.folder, "weights.safetensors"), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        self.assertEqual(config, {"d_model": 16, "num_heads": 4, "variant": "multi_head",
                                  "bias": True, "dtype": "fp32", "weights_sha256": digest})
        self.assertEqual(returned, config)
        self.assertEqual(metadata["naming"], "torch")
        state = mha.state_dict()
        self.assertEqual(sorted(tensors), sorted(state))
        for name, tensor in state.items():
            self.assertEqual(tensors[name].dtype, torch.float32)
            self.assertTrue(torch.equal(tensors[name], tensor), name)

    def test_split_naming(self):
        mha = random_mha(d=8, h=2)
        export_torch.export_mha(mha, self.folder, naming="split")
        _, tensors, _ = self.read_folder()
        self.assertEqual(list(tensors), [
            "q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
            "v_proj.bias", "out_proj.weight", "out_proj.bias"])
        for i, p in enumerate(("q_proj", "k_proj", "v_proj")):
            self.assertTrue(torch.equal(tensors[p + ".weight"], mha.in_proj_weight[i * 8:][:8]))
            self.assertTrue(torch.equal(tensors[p + ".bias"], mha.in_proj_bias[i * 8:][:8]))

    def test_no_bias(self):
        export_torch.export_mha(random_mha(d=8, h=1, bias=False), self.folder, naming="split")
        config, tensors, _ = self.read_folder()
        self.assertFalse(config["bias"])
        self.assertEqual(sorted(tensors), ["k_proj.weight", "out_proj.weight", "q_proj.weight",
                                           "v_proj.weight"])

    def test_16_bit_files_round_to_nearest_even(self):
        mha = random_mha(d=8, h=2)
        for dtype, torch_dtype in (("f16", torch.float16), ("bf16", torch.bfloat16)):
            export_torch.export_mha(mha, self.folder, dtype=dtype)
            _, tensors, _ = self.read_folder()
            self.assertEqual(tensors["in_proj_weight"].dtype, torch_dtype)
            self.assertTrue(torch.equal(tensors["in_proj_weight"],
                                        mha.in_proj_weight.detach().to(torch_dtype)))

    def test_exported_file_computes_what_torch_computes(self):
        # An independent float64 NumPy attention from the file's tensors, against torch on a
        # padded batch: checks the names, orientation and head split the file promises.
        mha = random_mha(d=16, h=4)
        export_torch.export_mha(mha, self.folder)
        _, tensors, _ = self.read_folder()
        lengths = [5, 2, 4]
        x = torch.randn(3, 5, 16)
        pad = torch.arange(5)[None, :] >= torch.tensor(lengths)[:, None]
        with torch.no_grad():
            expected, _ = mha(x, x, x, key_padding_mask=pad, need_weights=False)
        actual = numpy_mha(tensors, 4, x, lengths)
        for i, n in enumerate(lengths):
            np.testing.assert_allclose(actual[i, :n], expected[i, :n].double().numpy(),
                                       atol=1e-5)

    def test_refusals(self):
        cases = [
            (torch.nn.MultiheadAttention(8, 2, kdim=4), "kdim/vdim"),
            (torch.nn.MultiheadAttention(8, 2, vdim=4), "kdim/vdim"),
            (torch.nn.MultiheadAttention(8, 2, add_bias_kv=True), "add_bias_kv"),
            (torch.nn.MultiheadAttention(8, 2, add_zero_attn=True), "add_zero_attn"),
            (torch.nn.Linear(8, 8), "expected torch.nn.MultiheadAttention"),
        ]
        mismatched = torch.nn.MultiheadAttention(8, 2)
        mismatched.out_proj.bias = None
        cases.append((mismatched, "out_proj.bias is absent"))
        for module, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(export_torch.ExportError, message):
                    export_torch.export_mha(module, self.folder)
        self.assertFalse(os.path.exists(self.folder))

    def test_refuses_values_attnserve_would_reject(self):
        mha = random_mha(d=8, h=2)
        with torch.no_grad():
            mha.out_proj.weight[0, 0] = 1e6
        with self.assertRaisesRegex(export_torch.ExportError, "out_proj.weight overflows f16"):
            export_torch.export_mha(mha, self.folder, dtype="f16")
        with torch.no_grad():
            mha.out_proj.weight[0, 0] = 0.5
            mha.out_proj.weight[3, 1] = float("nan")
        with self.assertRaisesRegex(export_torch.ExportError,
                                    r"out_proj.weight element \[3, 1\] is nan; weights must be"):
            export_torch.export_mha(mha, self.folder)
        with self.assertRaisesRegex(export_torch.ExportError, "must not be empty or start with '.'"):
            export_torch.export_mha(random_mha(), os.path.join(self.dir.name, ".hidden"))
        with self.assertRaisesRegex(export_torch.ExportError, "naming must be one of"):
            export_torch.export_mha(random_mha(), self.folder, naming="seed")
        with self.assertRaisesRegex(export_torch.ExportError, "dtype must be one of"):
            export_torch.export_mha(random_mha(), self.folder, dtype="f64")


class CommandLineTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def run_main(self, *args):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = export_torch.main(list(args))
        return code, stdout.getvalue(), stderr.getvalue()

    def test_help_runs_as_a_script(self):
        result = subprocess.run(
            [sys.executable, os.path.join(TOOLS, "export_torch.py"), "--help"],
            capture_output=True, text=True, check=True,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        self.assertIn("--state-dict", result.stdout)

    def test_random_export_is_seeded(self):
        images = []
        for name in ("a", "b"):
            out = os.path.join(self.dir.name, name)
            code, stdout, _ = self.run_main("--out", out, "--d-model", "16", "--heads", "2",
                                            "--no-bias", "--seed", "7")
            self.assertEqual(code, 0)
            self.assertIn(f"wrote model '{name}'", stdout)
            with open(os.path.join(out, "weights.safetensors"), "rb") as f:
                images.append(f.read())
        self.assertEqual(images[0], images[1])
        config, _, _ = export_torch.read_safetensors_header(
            os.path.join(self.dir.name, "a", "weights.safetensors"))
        self.assertEqual(sorted(config), ["in_proj_weight", "out_proj.weight"])

    def test_state_dict_with_prefix(self):
        layer = torch.nn.TransformerEncoderLayer(16, 4, batch_first=True)
        path = os.path.join(self.dir.name, "layer.pt")
        torch.save(layer.state_dict(), path)
        out = os.path.join(self.dir.name, "enc")
        code, _, stderr = self.run_main("--out", out, "--heads", "4", "--state-dict", path,
                                        "--prefix", "self_attn.", "--naming", "split")
        self.assertEqual(code, 0, stderr)
        tensors, _ = read_safetensors(os.path.join(out, "weights.safetensors"))
        self.assertTrue(torch.equal(tensors["v_proj.weight"],
                                    layer.self_attn.in_proj_weight[32:]))

    def test_state_dict_errors(self):
        path = os.path.join(self.dir.name, "mha.pt")
        torch.save(torch.nn.MultiheadAttention(16, 4).state_dict(), path)
        out = os.path.join(self.dir.name, "m")
        code, _, stderr = self.run_main("--out", out, "--state-dict", path)
        self.assertEqual(code, 1)
        self.assertIn("--heads must be given", stderr)
        code, _, stderr = self.run_main("--out", out, "--state-dict", path, "--heads", "4",
                                        "--prefix", "encoder.")
        self.assertEqual(code, 1)
        self.assertIn("no encoder.in_proj_weight", stderr)
        torch.save(torch.nn.MultiheadAttention(16, 4, add_bias_kv=True).state_dict(), path)
        code, _, stderr = self.run_main("--out", out, "--state-dict", path, "--heads", "4")
        self.assertEqual(code, 1)
        self.assertIn("add_bias_kv", stderr)
        code, _, stderr = self.run_main("--out", out, "--d-model", "10", "--heads", "4")
        self.assertEqual(code, 1)
        self.assertIn("must divide", stderr)
        code, _, stderr = self.run_main("--out", out, "--d-model", "70000", "--heads", "4")
        self.assertEqual(code, 1)
        self.assertIn("--d-model must be in 1..65536, got 70000", stderr)
        self.assertFalse(os.path.exists(out))

    def test_broken_state_dict_files_are_errors_not_tracebacks(self):
        out = os.path.join(self.dir.name, "m")
        empty = os.path.join(self.dir.name, "empty.pt")
        open(empty, "wb").close()
        text = os.path.join(self.dir.name, "text.pt")
        with open(text, "w") as f:
            f.write("hello world")
        one_d = os.path.join(self.dir.name, "one_d.pt")
        torch.save({"in_proj_weight": torch.zeros(12)}, one_d)
        not_tensor = os.path.join(self.dir.name, "not_tensor.pt")
        torch.save({"in_proj_weight": [1, 2, 3]}, not_tensor)  # weights_only allows int lists.
        cases = [
            (empty, "cannot load .*empty.pt as a state dict"),  # EOFError inside torch.load.
            (text, "cannot load .*text.pt as a state dict"),  # KeyError inside torch.load.
            (one_d, r"in_proj_weight must be a 2-D tensor .*got a 1-D tensor of shape \[12\]"),
            (not_tensor, "in_proj_weight must be a 2-D tensor .*got list"),
        ]
        for path, message in cases:
            with self.subTest(path=os.path.basename(path)):
                code, _, stderr = self.run_main("--out", out, "--state-dict", path, "--heads", "2")
                self.assertEqual(code, 1)
                self.assertRegex(stderr, "export_torch.py: error: " + message)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
