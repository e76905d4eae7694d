#!/usr/bin/python3
"""The Python package (client/python, pip-installed into a temporary folder) against a live
attnserve: numpy and torch parity with PyTorch's own MultiheadAttention of the same weights,
variable lengths, errors, asyncio, retries.

  client_test.py --attnserve build/server/attnserve --root .
"""
import argparse
import asyncio
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
import numpy as np
import torch

ARGS = None
D_MODEL, HEADS = 32, 4


_SITE = tempfile.TemporaryDirectory()  # The installed package, for every test class of a run.


def install_package():
    """pip-installs client/python into a temporary folder (once per run: every test class
    shares it) and imports it."""
    site = os.path.join(_SITE.name, "site")
    if "attnserve" not in sys.modules:
        # As a user installs it: pip from the repository, no index, Debian's packages.
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                        "--no-deps", "--no-index", "--target", site,
                        os.path.join(ARGS.root, "client", "python")], check=True,
                       env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
        sys.path.insert(0, site)
        sys.path.insert(0, os.path.join(ARGS.root, "tools"))
        sys.path.insert(0, os.path.join(ARGS.root, "tests", "oip"))
    return importlib.import_module("attnserve")


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.attnserve = install_package()
        cls.remote = importlib.import_module("attnserve.torch")
        export_torch = importlib.import_module("export_torch")
        torch.manual_seed(7)
        cls.mha = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).eval()
        repository = os.path.join(cls.tmp.name, "models")
        export_torch.export_mha(cls.mha, os.path.join(repository, "mha"))
        # The same weights with an int8 KV cache for decoding sessions.
        shutil.copytree(os.path.join(repository, "mha"), os.path.join(repository, "mha8"))
        with open(os.path.join(repository, "mha8", "config.json")) as f:
            config = json.load(f)
        config["kv_cache_dtype"] = "int8"
        with open(os.path.join(repository, "mha8", "config.json"), "w") as f:
            json.dump(config, f)
        live_server = importlib.import_module("live_server")
        cls.server = live_server.LiveServer(ARGS.attnserve, "--model-repository", repository,
                                            "--default-model", "mha")
        cls.server.__enter__()
        cls.client = cls.attnserve.Client(cls.server.target, timeout_s=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.__exit__(None, None, None)
        cls.tmp.cleanup()

    def local(self, x, memory=None, **kwargs):
        x = torch.from_numpy(x)
        memory = x if memory is None else torch.from_numpy(memory)
        with torch.no_grad():
            output, weights = self.mha(x, memory, memory, **kwargs)
        return output.numpy(), (None if weights is None else weights.numpy())

    def test_models_and_health(self):
        self.assertEqual([m.name for m in self.client.models()], ["mha", "mha8"])
        info = self.client.model_info("mha")
        self.assertEqual((info.d_model, info.num_heads), (D_MODEL, HEADS))
        self.assertEqual((info.dtype, info.kv_cache_dtype), ("fp32", "fp32"))
        self.assertTrue(self.client.health())
        self.assertTrue(self.client.health("mha"))

    def test_numpy_parity_with_torch(self):
        rng = np.random.default_rng(1)
        x = rng.standard_normal((2, 6, D_MODEL)).astype(np.float32)
        memory = rng.standard_normal((2, 9, D_MODEL)).astype(np.float32)
        output, weights = self.client.attend(x, memory=memory, return_weights=True)
        expected, expected_weights = self.local(x, memory, average_attn_weights=False)
        np.testing.assert_allclose(output, expected, atol=1e-4)
        np.testing.assert_allclose(weights, expected_weights, atol=1e-4)
        causal = self.client.attend(x, causal=True)
        mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
        np.testing.assert_allclose(causal, self.local(x, attn_mask=mask)[0], atol=1e-4)

    def test_wire_dtypes(self):
        rng = np.random.default_rng(5)
        x = rng.standard_normal((2, 6, D_MODEL)).astype(np.float32)
        output, weights = self.client.attend(x, return_weights=True)
        for name, unit_roundoff in (("bf16", 2.0 ** -8), ("f16", 2.0 ** -11)):
            with self.subTest(name):
                half, half_weights = self.client.attend(x, return_weights=True, wire_dtype=name)
                self.assertEqual(half.dtype, np.float32)
                # Input and answer rounded: within 4u of the largest output (as the C++ tests).
                bound = 4 * unit_roundoff * np.abs(output).max()
                self.assertLessEqual(np.abs(half - output).max(), bound)
                self.assertLessEqual(np.abs(half_weights - weights).max(), 4 * unit_roundoff)
        # The encodings themselves, on exact known values: ties to even, NaN, overflow.
        client_module = importlib.import_module("attnserve.client")
        pb = client_module.pb
        values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, np.nan, 70000.0, 2 ** -25], np.float32)
        bf16 = np.frombuffer(client_module._encode(values, pb.DATA_TYPE_BF16), "<u2")
        self.assertEqual(list(bf16[[0, 1, 3]]), [0x3F80, 0x3F82, 0x4789])
        self.assertEqual(bf16[2] & 0x7FC0, 0x7FC0)  # a quiet NaN
        f16 = np.frombuffer(client_module._encode(values, pb.DATA_TYPE_FP16), "<u2")
        self.assertEqual(list(f16[[0, 3, 4]]), [0x3C04, 0x7C00, 0x0000])  # 1 + 2^-8 is exact
        tensor = pb.Tensor(shape=[5], raw=bf16.tobytes(), dtype=pb.DATA_TYPE_BF16)
        decoded = client_module._decode(tensor)
        self.assertEqual(decoded.dtype, np.float32)
        self.assertEqual(list(decoded[[0, 1, 3]]), [1.0, 1 + 2 ** -6, 70144.0])
        with self.assertRaises(ValueError):
            self.client.attend(x, wire_dtype="f64")

    def test_variable_lengths(self):
        rng = np.random.default_rng(2)
        sequences = [rng.standard_normal((n, D_MODEL)).astype(np.float32) for n in (3, 7, 1)]
        outputs = self.client.attend(sequences)
        self.assertEqual([o.shape for o in outputs], [(3, D_MODEL), (7, D_MODEL), (1, D_MODEL)])
        for sequence, output in zip(sequences, outputs):
            np.testing.assert_allclose(output, self.local(sequence[None])[0][0], atol=1e-4)

    def test_variable_lengths_with_padded_memory_keep_every_key_column(self):
        # A list of queries and one padded [B, S, d] memory: each sequence's weights are
        # [heads, T_i, S] (or [heads, T_i, memory_lengths[i]]), never cut to T_i key columns.
        rng = np.random.default_rng(6)
        sequences = [rng.standard_normal((n, D_MODEL)).astype(np.float32) for n in (3, 5)]
        memory = rng.standard_normal((2, 9, D_MODEL)).astype(np.float32)
        for memory_lengths in (None, [9, 4]):
            with self.subTest(memory_lengths=memory_lengths):
                outputs, weights = self.client.attend(sequences, memory=memory,
                                                      memory_lengths=memory_lengths,
                                                      return_weights=True)
                keys = memory_lengths or [9, 9]
                self.assertEqual([w.shape for w in weights],
                                 [(HEADS, 3, keys[0]), (HEADS, 5, keys[1])])
                for i, sequence in enumerate(sequences):
                    expected, expected_weights = self.local(sequence[None],
                                                            memory[i:i + 1, :keys[i]],
                                                            average_attn_weights=False)
                    np.testing.assert_allclose(outputs[i], expected[0], atol=1e-4)
                    np.testing.assert_allclose(weights[i], expected_weights[0], atol=1e-4)

    def test_errors_carry_code_and_message(self):
        with self.assertRaises(self.attnserve.AttnserveError) as caught:
            self.client.attend(np.zeros((2, 5), np.float32))
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("d_model", caught.exception.message)
        with self.assertRaises(self.attnserve.AttnserveError) as caught:
            self.client.attend(np.zeros((2, D_MODEL), np.float32), model="nope")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_retries_unavailable_then_succeeds(self):
        class Unavailable(grpc.RpcError):
            def code(self):
                return grpc.StatusCode.UNAVAILABLE

            def details(self):
                return "down"

        attempts = []

        def flaky(request, timeout=None):
            attempts.append(timeout)
            if len(attempts) < 3:
                raise Unavailable()
            return "answer"

        client = self.attnserve.Client(self.server.target, retries=3, backoff_s=0.001)
        self.assertEqual(client._call(flaky, None, None), "answer")
        self.assertEqual(len(attempts), 3)
        attempts.clear()
        client = self.attnserve.Client(self.server.target, retries=1, backoff_s=0.001)
        with self.assertRaises(self.attnserve.AttnserveError) as caught:
            client._call(flaky, None, None)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(len(attempts), 2)
        client.close()

    def test_deadline(self):
        # A server whose batches wait for a second request: the call cannot finish in time, on any
        # machine. (A 1 us deadline is not enough: gRPC rounds deadlines up to its millisecond
        # timer, and a loaded machine's timer thread can be late for a fast answer.)
        live_server = importlib.import_module("live_server")
        repository = os.path.join(self.tmp.name, "models")
        with live_server.LiveServer(ARGS.attnserve, "--model-repository", repository,
                                    "--default-model", "mha", "--max-queue-delay-us", "60000000",
                                    "--max-batch-sequences", "2") as slow:
            with self.attnserve.Client(slow.target, retries=0) as client:
                with self.assertRaises(self.attnserve.AttnserveError) as caught:
                    client.attend(np.zeros((4, D_MODEL), np.float32), timeout_s=0.2)
        self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_async_client(self):
        x = np.random.default_rng(3).standard_normal((4, D_MODEL)).astype(np.float32)

        async def run():
            async with self.attnserve.AsyncClient(self.server.target) as client:
                results = await asyncio.gather(*(client.attend(x) for _ in range(4)))
                self.assertTrue(await client.health())
                return results

        for output in asyncio.run(run()):
            np.testing.assert_allclose(output, self.local(x[None])[0][0], atol=1e-4)

    def causal(self, x):
        """torch's causal self-attention of the [T, d] rows x."""
        mask = torch.triu(torch.ones(len(x), len(x), dtype=torch.bool), diagonal=1)
        return self.local(x[None], attn_mask=mask)[0][0]

    def test_decode_session_prefill_then_steps_match_causal_torch(self):
        x = np.random.default_rng(11).standard_normal((9, D_MODEL)).astype(np.float32)
        with self.client.decode(model="mha") as session:
            self.assertEqual((session.model, session.version), ("mha", 1))
            prefilled = session.prefill(x[:5])
            stepped = [session.step(row) for row in x[5:]]
        self.assertTrue(session.closed)
        self.assertEqual(prefilled.shape, (5, D_MODEL))
        self.assertEqual(stepped[0].shape, (D_MODEL,))
        np.testing.assert_allclose(np.concatenate([prefilled, np.stack(stepped)]),
                                   self.causal(x), atol=1e-4)

    def test_int8_kv_cache_over_512_steps_stays_near_the_fp32_cache(self):
        # The model exported from PyTorch, decoded over an fp32 cache ("mha") and an int8 one
        # ("mha8"): each step's output within 1e-2 (relative) of the fp32 cache's, which matches
        # torch's causal forward over the whole sequence.
        self.assertEqual(self.client.model_info("mha8").kv_cache_dtype, "int8")
        x = np.random.default_rng(21).standard_normal((528, D_MODEL)).astype(np.float32)
        outputs = {}
        for name in ("mha", "mha8"):
            with self.client.decode(model=name) as session:
                rows = [session.prefill(x[:16])]
                rows += [session.step(row)[None] for row in x[16:]]
            outputs[name] = np.concatenate(rows)
        np.testing.assert_allclose(outputs["mha"], self.causal(x), atol=1e-4)
        fp32, int8 = outputs["mha"][16:], outputs["mha8"][16:]
        relative = np.linalg.norm(int8 - fp32, axis=1) / np.linalg.norm(fp32, axis=1)
        print(f"int8 KV cache, model exported from PyTorch (d_model {D_MODEL}, {HEADS} heads), "
              f"512 steps: relative error max {relative.max():.2e}, mean {relative.mean():.2e}, "
              f"last {relative[-1]:.2e}")
        self.assertLessEqual(relative.max(), 1e-2)
        self.assertGreater(np.abs(int8 - fp32).max(), 1e-6)  # The int8 rows were read.

    def test_decode_stream_steps_many_sessions_in_one_message(self):
        rng = np.random.default_rng(12)
        x = rng.standard_normal((6, 4, D_MODEL)).astype(np.float32)  # 6 sessions, 4 rows each
        with self.client.decode_stream() as stream:
            sessions = [stream.open("mha") for _ in range(len(x))]
            self.assertEqual(len({s.tag for s in sessions}), len(x))
            outputs = [stream.step_all([(s, x[i, t]) for i, s in enumerate(sessions)])
                       for t in range(x.shape[1])]
            stream.close_sessions(sessions[:2])
            self.assertTrue(sessions[0].closed and not sessions[2].closed)
        for i in range(len(x)):
            np.testing.assert_allclose(np.stack([o[i] for o in outputs]), self.causal(x[i]),
                                       atol=1e-4)

    def test_decode_with_encoder_memory_matches_cross_attention(self):
        rng = np.random.default_rng(13)
        memory = rng.standard_normal((7, D_MODEL)).astype(np.float32)
        x = rng.standard_normal((3, D_MODEL)).astype(np.float32)
        with self.client.decode(model="mha", memory=memory) as session:
            got = np.stack([session.step(row) for row in x])
        np.testing.assert_allclose(got, self.local(x[None], memory[None])[0][0], atol=1e-4)

    def test_decode_errors_name_the_problem_and_keep_the_session(self):
        error = self.attnserve.AttnserveError
        with self.assertRaises(error) as caught:
            self.client.decode(model="no-such-model")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("no-such-model", caught.exception.message)
        x = np.random.default_rng(14).standard_normal((3, D_MODEL)).astype(np.float32)
        with self.client.decode_stream() as stream:
            good, other = stream.open("mha"), stream.open("mha")
            with self.assertRaises(error) as caught:
                stream.step_all([(good, x[0]), (other, np.zeros(D_MODEL + 1, np.float32))])
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(str(D_MODEL), caught.exception.message)
            first, failed = caught.exception.results
            self.assertIsInstance(failed, error)
            # The good item was applied, the failed one appended nothing.
            np.testing.assert_allclose(np.stack([first, good.step(x[1])]), self.causal(x[:2]),
                                       atol=1e-4)
            np.testing.assert_allclose(other.step(x[0]), self.causal(x[:1])[0], atol=1e-4)
            good.close()
            with self.assertRaises(ValueError):
                good.step(x[2])
        with self.assertRaises(ValueError):
            stream.open("mha")

    def test_a_failed_stream_fails_its_calls_and_closes_quietly(self):
        row = np.zeros(D_MODEL, np.float32)
        with self.client.decode(model="mha", timeout_s=0.2) as session:
            give_up = time.monotonic() + 20  # steps succeed until the stream's deadline passes
            with self.assertRaises(self.attnserve.AttnserveError) as caught:
                while time.monotonic() < give_up:
                    session.step(row)
            self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
            with self.assertRaises(self.attnserve.AttnserveError):
                session.step(row)
        self.assertTrue(session.closed)  # leaving the block raised nothing

    def test_async_decode_sessions_step_concurrently(self):
        x = np.random.default_rng(15).standard_normal((4, 5, D_MODEL)).astype(np.float32)

        async def decode(stream, rows):
            async with await stream.open("mha") as session:
                first = await session.prefill(rows[:2])
                rest = [await session.step(row) for row in rows[2:]]
                return np.concatenate([first, np.stack(rest)])

        async def run():
            async with self.attnserve.AsyncClient(self.server.target) as client:
                async with client.decode_stream() as stream:
                    shared = await asyncio.gather(*(decode(stream, rows) for rows in x))
                async with await client.decode(model="mha") as own:
                    alone = await own.prefill(x[0])
                return shared, alone

        shared, alone = asyncio.run(run())
        for rows, got in zip(x, shared):
            np.testing.assert_allclose(got, self.causal(rows), atol=1e-4)
        np.testing.assert_allclose(alone, self.causal(x[0]), atol=1e-4)

    def test_remote_causal_decoder_matches_torch_over_the_whole_sequence(self):
        torch.manual_seed(6)
        x = torch.randn(3, 8, D_MODEL)  # batch_first
        mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), diagonal=1)
        with torch.no_grad():
            expected, _ = self.mha(x, x, x, attn_mask=mask)
        with self.remote.RemoteCausalDecoder(D_MODEL, model="mha", client=self.client,
                                             batch_first=True) as decoder:
            with torch.no_grad():
                pieces = [decoder(x[:, :3]), decoder(x[:, 3:4]), decoder(x[:, 4:])]
            torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=1e-4, rtol=0)
            decoder.reset()  # a new sequence, here unbatched and in float64
            with torch.no_grad():
                again = decoder(x[0, :4].double())
            self.assertEqual(again.dtype, torch.float64)
            torch.testing.assert_close(again.float(), expected[0, :4], atol=1e-4, rtol=0)
            with self.assertRaises(ValueError):
                decoder(x[:, :1])  # three sequences while the decoder holds one

    def test_remote_module_parity(self):
        remote = self.remote.RemoteMultiheadAttention(D_MODEL, HEADS, client=self.client,
                                                      model="mha")
        local = torch.nn.MultiheadAttention(D_MODEL, HEADS).eval()  # batch_first=False
        local.load_state_dict(self.mha.state_dict())
        torch.manual_seed(4)
        x = torch.randn(5, 3, D_MODEL)  # [L, N, E]
        memory = torch.randn(8, 3, D_MODEL)
        padding = torch.zeros(3, 5, dtype=torch.bool)
        padding[1, 3:] = True
        causal = torch.triu(torch.full((5, 5), float("-inf")), diagonal=1)
        cases = [dict(query=x, key=x, value=x),
                 dict(query=x, key=memory, value=memory, average_attn_weights=False),
                 dict(query=x, key=x, value=x, key_padding_mask=padding, attn_mask=causal),
                 dict(query=x, key=x, value=x, need_weights=False),
                 dict(query=x[:, 0], key=x[:, 0], value=x[:, 0])]
        for case in cases:
            with torch.no_grad():
                expected, expected_weights = local(**case)
                got, weights = remote(**case)
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
            if expected_weights is None:
                self.assertIsNone(weights)
            else:
                torch.testing.assert_close(weights, expected_weights, atol=1e-4, rtol=0)

    def test_remote_module_answers_in_the_query_dtype_and_device(self):
        # As nn.MultiheadAttention: output and weights in the query's dtype, on its device.
        remote = self.remote.RemoteMultiheadAttention(D_MODEL, HEADS, client=self.client,
                                                      model="mha", batch_first=True)
        torch.manual_seed(5)
        x32 = torch.randn(2, 5, D_MODEL)
        memory32 = torch.randn(2, 7, D_MODEL)
        for dtype in (torch.float64, torch.float16, torch.bfloat16):
            x, memory = x32.to(dtype), memory32.to(dtype)
            # The reference: PyTorch's module in float32 on the same (rounded) values.
            with torch.no_grad():
                expected, expected_weights = self.mha(x.float(), memory.float(), memory.float())
            # The answer rounded to dtype once: within a few units of its rounding.
            atol = 1e-4 if dtype == torch.float64 else 4 * torch.finfo(dtype).eps
            for need_weights in (True, False):
                with self.subTest(dtype=dtype, need_weights=need_weights), torch.no_grad():
                    output, weights = remote(x, memory, memory, need_weights=need_weights)
                    self.assertEqual((output.dtype, output.device), (dtype, x.device))
                    torch.testing.assert_close(output.float(), expected,
                                               atol=atol * expected.abs().max().item(), rtol=0)
                    if not need_weights:
                        self.assertIsNone(weights)
                        continue
                    self.assertEqual((weights.dtype, weights.device), (dtype, x.device))
                    torch.testing.assert_close(weights.float(), expected_weights, atol=atol,
                                               rtol=0)


class ResourceExhaustedRetryTest(unittest.TestCase):
    """Which RESOURCE_EXHAUSTED answers of a live attnserve the client retries: a full queue
    (a retry can succeed), never a request over a size limit (every retry would fail alike)."""

    RETRIES = 2

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.attnserve = install_package()
        torch.manual_seed(8)
        mha = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).eval()
        cls.repository = os.path.join(cls.tmp.name, "models")
        importlib.import_module("export_torch").export_mha(mha, os.path.join(cls.repository,
                                                                             "mha"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def server(self, *args):
        live_server = importlib.import_module("live_server")
        return live_server.LiveServer(ARGS.attnserve, "--model-repository", self.repository,
                                      *args)

    def attempts(self, client, x, timeout_s=30):
        """Attend attempts the client makes for `x` (retries included) and its final error."""
        calls = []

        def counted(request, timeout=None):
            calls.append(request)
            return client._stub.Attend(request, timeout=timeout)

        request = client_request(x)
        with self.assertRaises(self.attnserve.AttnserveError) as caught:
            client._call(counted, request, timeout_s)
        return len(calls), caught.exception

    def test_size_refusals_are_not_retried(self):
        # x of 64 tokens: 8 KiB of float32, over each limit below, however often it is sent.
        x = np.zeros((64, D_MODEL), np.float32)
        # gRPC's limit is RESOURCE_EXHAUSTED without the server's retry mark; a request larger
        # than a queue byte limit is INVALID_ARGUMENT (no empty queue would take it).
        cases = {"gRPC's message limit": (("--max-message-bytes", "4096"),
                                          grpc.StatusCode.RESOURCE_EXHAUSTED),
                 "one model's queued bytes": (("--max-queued-bytes-per-model", "4096"),
                                              grpc.StatusCode.INVALID_ARGUMENT),
                 "the server's queued bytes": (("--max-queued-bytes", "4096"),
                                               grpc.StatusCode.INVALID_ARGUMENT)}
        for name, (flags, code) in cases.items():
            with self.subTest(name), self.server(*flags) as server, self.attnserve.Client(
                    server.target, retries=self.RETRIES, backoff_s=0.001) as client:
                count, error = self.attempts(client, x)
                self.assertEqual(error.code, code, error.message)
                self.assertEqual(count, 1, error.message)
                # The same server answers a request within its limits.
                self.assertEqual(client.attend(x[:2]).shape, (2, D_MODEL))

    def test_full_queue_is_retried(self):
        # One queued request fills the queue (max_queue_size 1) and waits for a second
        # sequence (max_batch_sequences 2) far longer than the test: every other request is
        # refused "batch queue is full", which a retry can get past once the queue drains.
        x = np.zeros((1, D_MODEL), np.float32)
        with self.server("--max-queue-size", "1", "--max-batch-sequences", "2",
                         "--max-queue-delay-us", "60000000") as server, self.attnserve.Client(
                             server.target, retries=self.RETRIES, backoff_s=0.001) as client:
            request = client_request(x)
            for _ in range(20):  # Until the holder is the queued one (bounded).
                holder = client._stub.Attend.future(request, timeout=60)
                try:
                    client._stub.Attend(request, timeout=2)
                except grpc.RpcError as error:
                    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        break
                holder.cancel()
            else:
                self.fail("no request stayed queued")
            count, error = self.attempts(client, x)
            holder.cancel()
        self.assertEqual(error.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("batch queue is full", error.message)
        self.assertEqual(count, 1 + self.RETRIES)


class AllocatorTest(unittest.TestCase):
    """reuse_large_allocations(): the page faults of a loop that allocates and frees tensors of
    a few MiB, as a client's calls do, in a fresh process each (the setting is process-wide)."""

    LOOP = """
import resource, sys
import numpy as np
import attnserve
if sys.argv[1] == "reuse":
    assert attnserve.reuse_large_allocations()
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        request = np.ones(1 << 20, np.float32)
        answer = request + np.ones(1 << 20, np.float32)
        del request, answer
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(faults())
"""

    def faults(self, mode):
        site = os.path.dirname(os.path.dirname(install_package().__file__))
        run = subprocess.run([sys.executable, "-c", self.LOOP, mode], check=True,
                             capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": site})
        return int(run.stdout)

    def test_reused_blocks_need_no_fresh_pages(self):
        # 20 rounds of three 4 MiB arrays: ~1,000 faults a round by default (measured 1,500),
        # none once the blocks are reused.
        default, reused = self.faults("default"), self.faults("reuse")
        self.assertGreater(default, 5000)
        self.assertLess(reused, 200)


def client_request(x):
    """The AttendRequest that Client.attend sends for `x`."""
    client_module = importlib.import_module("attnserve.client")
    return client_module._attend_request("mha", x, None, False, None, None, False, None, None,
                                         "").request


class TlsTest(unittest.TestCase):
    """Client and AsyncClient over TLS and mutual TLS, against attnserve with certificates made
    by deploy/make-test-certs.sh (openssl, at test time)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.attnserve = install_package()
        cls.certs = os.path.join(cls.tmp.name, "certs")
        subprocess.run(["bash", os.path.join(ARGS.root, "deploy", "make-test-certs.sh"),
                        cls.certs], check=True)
        live_server = importlib.import_module("live_server")
        cls.server = live_server.LiveServer(
            ARGS.attnserve, "--model-repository", os.path.join(cls.tmp.name, "absent"),
            "--tls-cert-chain", cls.cert("server.pem"), "--tls-private-key", cls.cert("server.key"),
            "--tls-client-ca", cls.cert("ca.pem"))
        cls.server.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        cls.tmp.cleanup()

    @classmethod
    def cert(cls, name):
        return os.path.join(cls.certs, name)

    def mutual(self, **overrides):
        """Client arguments for mutual TLS with the test CA and client certificate."""
        return {"tls_ca": self.cert("ca.pem"), "tls_cert_chain": self.cert("client.pem"),
                "tls_private_key": self.cert("client.key"), "timeout_s": 10, **overrides}

    def test_mutual_tls_call(self):
        x = np.ones((4, 512), np.float32)
        with self.attnserve.Client(self.server.target, **self.mutual()) as client:
            self.assertTrue(client.health())
            self.assertEqual(client.attend(x).shape, (4, 512))
        # The certificate names localhost and 127.0.0.1: another name must be set explicitly.
        target = self.server.target.replace("127.0.0.1", "localhost")
        with self.attnserve.Client(target, **self.mutual(tls_server_name="localhost")) as client:
            self.assertTrue(client.health())

    def test_async_client_mutual_tls(self):
        async def run():
            async with self.attnserve.AsyncClient(self.server.target, **self.mutual()) as client:
                return await client.attend(np.ones((2, 512), np.float32))

        self.assertEqual(asyncio.run(run()).shape, (2, 512))

    def test_wrong_ca_fails_clearly(self):
        with self.attnserve.Client(self.server.target,
                                   **self.mutual(tls_ca=self.cert("other-ca.pem"))) as client:
            with self.assertRaises(self.attnserve.AttnserveError) as caught:
                client.health()
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("TLS handshake failed: is tls_ca the CA", str(caught.exception))

    def test_wrong_server_name_and_missing_client_certificate_fail(self):
        cases = {"wrong name": self.mutual(tls_server_name="wrong.example"),
                 "no client certificate": self.mutual(tls_cert_chain=None, tls_private_key=None)}
        for name, arguments in cases.items():
            with self.subTest(name), self.attnserve.Client(self.server.target,
                                                           **arguments) as client:
                with self.assertRaises(self.attnserve.AttnserveError) as caught:
                    client.health()
                self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_plaintext_client_fails(self):
        with self.attnserve.Client(self.server.target, timeout_s=10) as client:
            with self.assertRaises(self.attnserve.AttnserveError) as caught:
                client.health()
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_bad_arguments_name_the_argument(self):
        cases = {"tls_ca: cannot read": {"tls_ca": self.cert("absent.pem")},
                 "tls_cert_chain, tls_private_key: expected both":
                     {"tls_ca": self.cert("ca.pem"), "tls_cert_chain": self.cert("client.pem")},
                 "tls_ca: expected the PEM file": {"tls_server_name": "localhost"}}
        for message, arguments in cases.items():
            with self.subTest(message), self.assertRaises(ValueError) as caught:
                self.attnserve.Client(self.server.target, **arguments)
            self.assertIn(message, str(caught.exception))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--attnserve", required=True)
    parser.add_argument("--root", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest])
