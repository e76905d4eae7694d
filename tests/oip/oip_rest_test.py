#!/usr/bin/python3
"""The Open Inference Protocol's REST binding (KServe v2 REST) against a live attnserve on
127.0.0.1, with Python's own http.client (and curl when installed).

Covers every endpoint (status codes, JSON bodies, versions, 404 and 405), infer answers equal bit
for bit to gRPC ModelInfer's (JSON and the binary tensor data extension, mixed, causal, lengths,
attn_mask, memory, head_mask, weights and output selection, id), every class of malformed body
(400 naming the field), 429 when the queue is full and 503 while draining, the size limits (413
past --max-message-bytes, header lines and paths past 8 KiB), slow clients
(--http-read-timeout-ms), HTTPS with server and mutual TLS (deploy/make-test-certs.sh), and curl.

  oip_rest_test.py --attnserve build/server/attnserve --root .
"""
import argparse
import http.client
import importlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np
import torch
from grpc_tools import protoc

ARGS = None
HERE = os.path.dirname(os.path.abspath(__file__))
HEADER_LENGTH = "Inference-Header-Content-Length"
TIMEOUT_S = 30  # Bound on every single HTTP exchange.


def generate(proto_root, proto, out):
    """Python stubs of `proto` (relative to proto_root) into `out`, importable from it."""
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    code = protoc.main(["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out}",
                        f"--grpc_python_out={out}", proto])
    if code != 0:
        raise RuntimeError(f"protoc failed on {proto}")


_SHARED = {}


def shared():
    """Stubs, live_server and a repository with one exported model ("small": d_model 16, 4 heads),
    made once for every test class."""
    if not _SHARED:
        tmp = tempfile.TemporaryDirectory()
        generate(os.path.join(HERE, "proto"), "grpc_predict_v2.proto", tmp.name)
        sys.path.insert(0, tmp.name)
        sys.path.insert(0, HERE)
        sys.path.insert(0, os.path.join(ARGS.root, "tools"))
        export_torch = importlib.import_module("export_torch")
        torch.manual_seed(5)
        repository = os.path.join(tmp.name, "models")
        export_torch.export_mha(torch.nn.MultiheadAttention(16, 4, batch_first=True),
                                os.path.join(repository, "small"))
        _SHARED.update(tmp=tmp, repository=repository,
                       pb=importlib.import_module("grpc_predict_v2_pb2"),
                       rpc=importlib.import_module("grpc_predict_v2_pb2_grpc"),
                       live_server=importlib.import_module("live_server"))
    return _SHARED


def start_server(*args):
    """A LiveServer with the shared repository and the demo model, entered."""
    s = shared()
    server = s["live_server"].LiveServer(ARGS.attnserve, "--model-repository", s["repository"],
                                         "--demo-model", "always", "--default-model", "demo",
                                         "--model-poll-interval-s", "0", *args)
    server.__enter__()
    return server


class Reply:
    def __init__(self, response):
        self.status = response.status
        self.headers = {k.lower(): v for k, v in response.getheaders()}
        self.body = response.read()

    def json(self):
        return json.loads(self.body)

    def error(self):
        """The {"error": "..."} body's message (fails unless the body is exactly that)."""
        body = self.json()
        assert set(body) == {"error"} and isinstance(body["error"], str), body
        return body["error"]

    def __repr__(self):
        return f"Reply({self.status}, {self.body[:300]!r})"


def call(connection, method, path, body=None, headers=None):
    connection.request(method, path, body=body, headers=headers or {})
    return Reply(connection.getresponse())


def http_call(port, method, path, body=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        return call(connection, method, path, body, headers)
    finally:
        connection.close()


def read_until_closed(sock, deadline_s):
    """What `sock` receives until the peer closes it (closed=True) or deadline_s passes."""
    data = b""
    end = time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return data, False
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return data, False
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk


def status_of(raw):
    """The status code of the first answer in `raw` (an HTTP/1.1 answer), or None."""
    if not raw.startswith(b"HTTP/1.1 "):
        return None
    return int(raw[9:12])


def json_body_of(raw):
    """The JSON body of the first answer in `raw` (by its Content-Length)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return json.loads(rest[:int(value)])
    raise AssertionError(f"no Content-Length in {head!r}")


# ---------------------------------------------------------------------------------------------
# Infer bodies and answers.

def tensor_json(name, array, datatype=None):
    datatype = datatype or {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32",
                            np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "UINT8"}[array.dtype]
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "data": array.tolist()}


def le_bytes(array):
    if array.dtype == np.bool_:
        return array.astype(np.uint8).tobytes()
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def infer_body(inputs, binary=(), parameters=None, outputs=None, request_id=None):
    """(body bytes, headers) for an infer of `inputs` ({name: array}); the names in `binary` go
    as binary data after the JSON header, in input order."""
    header = {}
    if request_id is not None:
        header["id"] = request_id
    if parameters:
        header["parameters"] = parameters
    header["inputs"] = []
    tail = b""
    for name, array in inputs.items():
        tensor = tensor_json(name, array)
        if name in binary:
            data = le_bytes(array)
            del tensor["data"]
            tensor["parameters"] = {"binary_data_size": len(data)}
            tail += data
        header["inputs"].append(tensor)
    if outputs is not None:
        header["outputs"] = outputs
    text = json.dumps(header).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(text))}
    return text + tail, headers


def parse_answer(reply):
    """(JSON header, {output name: float32 array}, {output name: "binary" | "json"})."""
    body = reply.body
    if HEADER_LENGTH.lower() in reply.headers:
        length = int(reply.headers[HEADER_LENGTH.lower()])
        header, binary = json.loads(body[:length]), body[length:]
    else:
        header, binary = json.loads(body), b""
    arrays, kinds, offset = {}, {}, 0
    for output in header["outputs"]:
        assert output["datatype"] == "FP32", output
        shape = tuple(output["shape"])
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            values = np.frombuffer(binary[offset:offset + size], dtype="<f4")
            offset += size
            kinds[output["name"]] = "binary"
        else:
            values = np.array(output["data"], dtype=np.float64).astype(np.float32)
            kinds[output["name"]] = "json"
        arrays[output["name"]] = values.reshape(shape)
    assert offset == len(binary), f"{len(binary) - offset} trailing bytes of binary data"
    return header, arrays, kinds


class RestTestBase(unittest.TestCase):
    def assertError(self, reply, status, *fragments):
        self.assertEqual(reply.status, status, reply)
        self.assertEqual(reply.headers.get("content-type"), "application/json", reply.headers)
        message = reply.error()
        for fragment in fragments:
            self.assertIn(fragment, message)
        return message

    def grpc_infer(self, stub, model, inputs, parameters=None, outputs=None, request_id="g"):
        """ModelInfer with raw inputs: ({output name: float32 array}, [output names])."""
        pb = shared()["pb"]
        request = pb.ModelInferRequest(model_name=model, id=request_id)
        for name, array in inputs.items():
            tensor = tensor_json(name, array)
            request.inputs.add(name=name, datatype=tensor["datatype"], shape=tensor["shape"])
            request.raw_input_contents.append(le_bytes(array))
        for name, value in (parameters or {}).items():
            if isinstance(value, bool):
                request.parameters[name].bool_param = value
            else:
                request.parameters[name].string_param = value
        for name in outputs or ():
            request.outputs.add(name=name)
        response = stub.ModelInfer(request, timeout=TIMEOUT_S)
        self.assertEqual(response.id, request_id)
        arrays = {}
        for i, tensor in enumerate(response.outputs):
            arrays[tensor.name] = np.frombuffer(response.raw_output_contents[i],
                                                dtype="<f4").reshape(tuple(tensor.shape))
        return arrays, [t.name for t in response.outputs]

    def assertBitIdentical(self, got, expected):
        self.assertEqual(got.dtype, np.float32)
        self.assertEqual(got.shape, expected.shape)
        self.assertEqual(got.astype("<f4").tobytes(), expected.astype("<f4").tobytes())


# ---------------------------------------------------------------------------------------------

class RestEndpointsAndInferTest(RestTestBase):
    """One server (plaintext, default limits): endpoints, infer against ModelInfer, errors."""

    @classmethod
    def setUpClass(cls):
        cls.pb = shared()["pb"]
        cls.server = start_server()
        assert cls.server.http_scheme == "http" and cls.server.http_port, cls.server.http_port
        cls.port = cls.server.http_port
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.stub = shared()["rpc"].GRPCInferenceServiceStub(cls.channel)
        cls.connection = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=TIMEOUT_S)

    @classmethod
    def tearDownClass(cls):
        cls.connection.close()
        cls.channel.close()
        cls.server.__exit__(None, None, None)

    def get(self, path):
        return call(self.connection, "GET", path)

    def post(self, path, body, headers=None):
        return call(self.connection, "POST", path, body, headers)

    def rest_infer(self, model, inputs, binary=(), parameters=None, outputs=None,
                   request_id=None, path=None):
        body, headers = infer_body(inputs, binary, parameters, outputs, request_id)
        reply = self.post(path or f"/v2/models/{model}/infer", body, headers)
        self.assertEqual(reply.status, 200, reply)
        return reply

    # -- endpoints ------------------------------------------------------------------------------

    def test_server_metadata_live_ready(self):
        grpc_metadata = self.stub.ServerMetadata(self.pb.ServerMetadataRequest())
        for path in ("/v2", "/v2/"):
            reply = self.get(path)
            self.assertEqual(reply.status, 200, reply)
            self.assertEqual(reply.headers["content-type"], "application/json")
            self.assertEqual(reply.json(), {"name": "attnserve", "version": grpc_metadata.version,
                                            "extensions": ["binary_tensor_data"]})
        self.assertTrue(grpc_metadata.version)
        reply = self.get("/v2/health/live")
        self.assertEqual((reply.status, reply.json()), (200, {"live": True}))
        reply = self.get("/v2/health/ready")
        self.assertEqual((reply.status, reply.json()), (200, {"ready": True}))

    def test_model_metadata_equals_grpc(self):
        for name, d in (("demo", 512), ("small", 16)):
            grpc_metadata = self.stub.ModelMetadata(self.pb.ModelMetadataRequest(name=name))
            expected = {
                "name": name, "versions": ["1"], "platform": "attnserve_onednn",
                "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                           for t in grpc_metadata.inputs],
                "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                            for t in grpc_metadata.outputs]}
            for path in (f"/v2/models/{name}", f"/v2/models/{name}/versions/1"):
                reply = self.get(path)
                self.assertEqual(reply.status, 200, reply)
                self.assertEqual(reply.headers["content-type"], "application/json")
                body = reply.json()
                self.assertEqual(body, expected)
                inputs = {t["name"]: (t["datatype"], t["shape"]) for t in body["inputs"]}
                self.assertEqual(inputs["input"], ("FP32", [-1, -1, d]))
                self.assertEqual(inputs["lengths"], ("INT32", [-1]))
                self.assertEqual(inputs["attn_mask"][0], "BOOL")
                outputs = {t["name"]: (t["datatype"], t["shape"]) for t in body["outputs"]}
                self.assertEqual(outputs["output"], ("FP32", [-1, -1, d]))
                self.assertEqual(outputs["weights"][0], "FP32")
            for path in (f"/v2/models/{name}/ready", f"/v2/models/{name}/versions/1/ready"):
                reply = self.get(path)
                self.assertEqual((reply.status, reply.json()), (200, {"name": name, "ready": True}))

    def test_unknown_model_or_version_is_404(self):
        for path in ("/v2/models/nope", "/v2/models/nope/ready", "/v2/models/nope/versions/1",
                     "/v2/models/nope/versions/1/ready"):
            self.assertError(self.get(path), 404, "nope", "not found")
        for path in ("/v2/models/small/versions/7", "/v2/models/small/versions/7/ready"):
            self.assertError(self.get(path), 404, "version", '"7"', '"1"')
        x = np.zeros((2, 16), np.float32)
        body, headers = infer_body({"input": x})
        self.assertError(self.post("/v2/models/nope/infer", body, headers), 404, "nope")
        self.assertError(self.post("/v2/models/small/versions/7/infer", body, headers), 404,
                         "version", '"7"')
        # The serving version, named, answers.
        reply = self.rest_infer("small", {"input": x}, path="/v2/models/small/versions/1/infer")
        self.assertEqual(reply.json()["model_version"], "1")

    def test_wrong_method_is_405(self):
        get_paths = ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/demo",
                     "/v2/models/demo/versions/1", "/v2/models/demo/ready",
                     "/v2/models/small/versions/1/ready")
        for path in get_paths:
            for method in ("POST", "PUT", "DELETE"):
                reply = call(self.connection, method, path, b"" if method != "DELETE" else None)
                self.assertError(reply, 405, "method", "GET", method)
                self.assertEqual(reply.headers.get("allow"), "GET")
        for path in ("/v2/models/demo/infer", "/v2/models/small/versions/1/infer"):
            for method in ("GET", "PUT", "DELETE"):
                reply = call(self.connection, method, path, b"" if method == "PUT" else None)
                self.assertError(reply, 405, "method", "POST", method)
                self.assertEqual(reply.headers.get("allow"), "POST")

    def test_unknown_path_is_404(self):
        for path in ("/", "/v1", "/v3", "/v2/bogus", "/v2/health", "/v2/health/alive",
                     "/v2/models", "/v2/models/", "/v2/models/demo/bogus",
                     "/v2/models/demo/versions", "/v2/models/demo/versions/1/infer/x",
                     "/v2/repository/index"):
            self.assertError(self.get(path), 404, "path", path)
        self.assertError(self.post("/v2/models/demo/predict", b"{}"), 404, "path")

    # -- infer, bit for bit against ModelInfer --------------------------------------------------

    def test_json_in_json_out_equals_model_infer(self):
        rng = np.random.default_rng(1)
        for model, x in (("small", rng.standard_normal((2, 5, 16)).astype(np.float32)),
                         ("small", rng.standard_normal((3, 16)).astype(np.float32)),
                         ("demo", rng.standard_normal((1, 3, 512)).astype(np.float32))):
            reply = self.rest_infer(model, {"input": x}, request_id=f"json-{model}")
            self.assertEqual(reply.headers["content-type"], "application/json")
            self.assertNotIn(HEADER_LENGTH.lower(), reply.headers)
            header, got, kinds = parse_answer(reply)
            self.assertEqual((header["model_name"], header["model_version"], header["id"]),
                             (model, "1", f"json-{model}"))
            self.assertEqual(kinds, {"output": "json"})
            expected, _ = self.grpc_infer(self.stub, model, {"input": x})
            self.assertBitIdentical(got["output"], expected["output"])
            self.assertEqual(got["output"].shape, x.shape)

    def test_binary_in_binary_out_equals_model_infer(self):
        x = np.random.default_rng(2).standard_normal((2, 4, 16)).astype(np.float32)
        x[0, 0, 0] = -0.0
        reply = self.rest_infer("small", {"input": x}, binary={"input"},
                                parameters={"binary_data_output": True}, request_id="bin")
        self.assertEqual(reply.headers["content-type"], "application/octet-stream")
        length = int(reply.headers[HEADER_LENGTH.lower()])
        self.assertEqual(len(reply.body), length + x.size * 4)
        header, got, kinds = parse_answer(reply)
        self.assertEqual(header["id"], "bin")
        self.assertEqual(header["outputs"][0]["parameters"], {"binary_data_size": x.size * 4})
        self.assertNotIn("data", header["outputs"][0])
        self.assertEqual(kinds, {"output": "binary"})
        expected, _ = self.grpc_infer(self.stub, "small", {"input": x})
        self.assertBitIdentical(got["output"], expected["output"])
        # The same inputs as JSON answer the same bits.
        _, as_json, _ = parse_answer(self.rest_infer("small", {"input": x}))
        self.assertBitIdentical(as_json["output"], expected["output"])

    def test_mixed_binary_input_json_lengths(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((2, 3, 16)).astype(np.float32)
        lengths = np.array([3, 2], np.int32)
        # Binary input, JSON lengths; output as binary, weights as JSON.
        reply = self.rest_infer(
            "small", {"input": x, "lengths": lengths}, binary={"input"},
            outputs=[{"name": "output", "parameters": {"binary_data": True}},
                     {"name": "weights"}])
        self.assertEqual(reply.headers["content-type"], "application/octet-stream")
        _, got, kinds = parse_answer(reply)
        self.assertEqual(kinds, {"output": "binary", "weights": "json"})
        expected, names = self.grpc_infer(self.stub, "small", {"input": x, "lengths": lengths},
                                          outputs=["output", "weights"])
        self.assertEqual(names, ["output", "weights"])
        self.assertBitIdentical(got["output"], expected["output"])
        self.assertBitIdentical(got["weights"], expected["weights"])
        # binary_data_output for all, one output overriding it back to JSON.
        reply = self.rest_infer(
            "small", {"input": x, "lengths": lengths}, binary={"lengths"},
            parameters={"binary_data_output": True},
            outputs=[{"name": "output"}, {"name": "weights", "parameters": {"binary_data": False}}])
        _, got, kinds = parse_answer(reply)
        self.assertEqual(kinds, {"output": "binary", "weights": "json"})
        self.assertBitIdentical(got["output"], expected["output"])
        self.assertBitIdentical(got["weights"], expected["weights"])

    def test_causal(self):
        x = np.random.default_rng(4).standard_normal((2, 6, 16)).astype(np.float32)
        _, causal, _ = parse_answer(self.rest_infer("small", {"input": x},
                                                    parameters={"causal": True}))
        expected, _ = self.grpc_infer(self.stub, "small", {"input": x}, {"causal": True})
        self.assertBitIdentical(causal["output"], expected["output"])
        _, full, _ = parse_answer(self.rest_infer("small", {"input": x},
                                                  parameters={"causal": False}))
        plain, _ = self.grpc_infer(self.stub, "small", {"input": x})
        self.assertBitIdentical(full["output"], plain["output"])
        # The parameter matters: only the last position sees the same keys either way.
        self.assertFalse(np.array_equal(causal["output"][:, 0], full["output"][:, 0]))
        np.testing.assert_allclose(causal["output"][:, -1], full["output"][:, -1], rtol=1e-5,
                                   atol=1e-6)

    def test_lengths_with_padding(self):
        x = np.random.default_rng(5).standard_normal((3, 4, 16)).astype(np.float32)
        lengths = np.array([4, 2, 1], np.int32)
        _, got, _ = parse_answer(self.rest_infer("small", {"input": x, "lengths": lengths},
                                                 request_id="len"))
        expected, _ = self.grpc_infer(self.stub, "small", {"input": x, "lengths": lengths})
        self.assertBitIdentical(got["output"], expected["output"])
        self.assertTrue(np.all(got["output"][1, 2:] == 0))  # padding rows
        self.assertTrue(np.all(got["output"][2, 1:] == 0))
        _, alone, _ = parse_answer(self.rest_infer("small", {"input": x[1, :2]}))
        np.testing.assert_allclose(got["output"][1, :2], alone["output"], rtol=1e-5, atol=1e-6)

    def test_attn_mask(self):
        rng = np.random.default_rng(6)
        x = rng.standard_normal((2, 4, 16)).astype(np.float32)
        mask = rng.random((2, 4, 4)) < 0.5
        mask[:, np.arange(4), np.arange(4)] = True  # every query keeps at least one key
        _, got, _ = parse_answer(self.rest_infer("small", {"input": x, "attn_mask": mask}))
        expected, _ = self.grpc_infer(self.stub, "small", {"input": x, "attn_mask": mask})
        self.assertBitIdentical(got["output"], expected["output"])
        # As UINT8, in binary: the same answer.
        u8 = mask.astype(np.uint8)
        _, binary, _ = parse_answer(self.rest_infer("small", {"input": x, "attn_mask": u8},
                                                    binary={"attn_mask"}))
        self.assertBitIdentical(binary["output"], expected["output"])
        _, unmasked, _ = parse_answer(self.rest_infer("small", {"input": x}))
        self.assertFalse(np.array_equal(got["output"], unmasked["output"]))

    def test_memory_and_memory_lengths(self):
        rng = np.random.default_rng(7)
        x = rng.standard_normal((2, 3, 16)).astype(np.float32)
        memory = rng.standard_normal((2, 5, 16)).astype(np.float32)
        memory_lengths = np.array([5, 3], np.int32)
        inputs = {"input": x, "memory": memory, "memory_lengths": memory_lengths}
        _, got, _ = parse_answer(self.rest_infer("small", inputs, binary={"memory"}))
        expected, _ = self.grpc_infer(self.stub, "small", inputs)
        self.assertBitIdentical(got["output"], expected["output"])
        _, self_attention, _ = parse_answer(self.rest_infer("small", {"input": x}))
        self.assertFalse(np.array_equal(got["output"], self_attention["output"]))

    def test_return_weights_head_mask_and_output_selection(self):
        x = np.random.default_rng(8).standard_normal((1, 4, 16)).astype(np.float32)
        reply = self.rest_infer("small", {"input": x}, parameters={"return_weights": True},
                                request_id="w")
        header, got, _ = parse_answer(reply)
        self.assertEqual([o["name"] for o in header["outputs"]], ["output", "weights"])
        self.assertEqual(header["outputs"][1]["shape"], [1, 4, 4, 4])
        expected, names = self.grpc_infer(self.stub, "small", {"input": x},
                                          {"return_weights": True})
        self.assertEqual(names, ["output", "weights"])
        self.assertBitIdentical(got["output"], expected["output"])
        self.assertBitIdentical(got["weights"], expected["weights"])
        np.testing.assert_allclose(got["weights"].sum(axis=-1), 1.0, rtol=1e-5)
        # Only the weights, when only they are asked for.
        header, only, _ = parse_answer(self.rest_infer("small", {"input": x},
                                                       outputs=[{"name": "weights"}]))
        self.assertEqual([o["name"] for o in header["outputs"]], ["weights"])
        self.assertBitIdentical(only["weights"], expected["weights"])
        # Only the output, even with return_weights... as ModelInfer answers it.
        header, _, _ = parse_answer(self.rest_infer("small", {"input": x},
                                                    outputs=[{"name": "output"}]))
        self.assertEqual([o["name"] for o in header["outputs"]], ["output"])
        # head_mask, a string parameter.
        _, masked, _ = parse_answer(self.rest_infer("small", {"input": x},
                                                    parameters={"head_mask": "1,0,1,1"}))
        expected_masked, _ = self.grpc_infer(self.stub, "small", {"input": x},
                                             {"head_mask": "1,0,1,1"})
        self.assertBitIdentical(masked["output"], expected_masked["output"])
        self.assertFalse(np.array_equal(masked["output"], expected["output"]))

    def test_id_is_echoed_and_optional(self):
        x = np.zeros((2, 16), np.float32)
        for request_id in ("abc-123", "ünï \"quoted\"", ""):
            header, _, _ = parse_answer(self.rest_infer("small", {"input": x},
                                                        request_id=request_id))
            if request_id:
                self.assertEqual(header["id"], request_id)
        header, _, _ = parse_answer(self.rest_infer("small", {"input": x}))
        self.assertNotIn("id", header)

    # -- malformed bodies -----------------------------------------------------------------------

    def test_malformed_bodies_are_400_naming_the_field(self):
        good = {"name": "input", "shape": [2, 16], "datatype": "FP32", "data": [0.5] * 32}
        x = np.zeros((2, 16), np.float32)

        def body(**changes):
            document = {"inputs": [dict(good)]}
            for key, value in changes.items():
                if key.startswith("input_") and value is None:
                    del document["inputs"][0][key[len("input_"):]]
                elif key.startswith("input_"):
                    document["inputs"][0][key[len("input_"):]] = value
                else:
                    document[key] = value
            return json.dumps(document).encode()

        def plus(name, shape, datatype, data):
            """A body with the good input and a second one."""
            second = {"name": name, "shape": shape, "datatype": datatype, "data": data}
            return json.dumps({"inputs": [good, second]}).encode()

        raw_x = le_bytes(x)
        binary_header = json.dumps({"inputs": [{"name": "input", "shape": [2, 16],
                                                "datatype": "FP32",
                                                "parameters": {"binary_data_size": 128}}]})
        binary_header = binary_header.encode()
        both_header = json.dumps({"inputs": [dict(good, parameters={"binary_data_size": 128})]})
        both_header = both_header.encode()
        json_type = {"Content-Type": "application/json"}

        def with_length(length):
            return {HEADER_LENGTH: length}

        cases = [
            # (what, body, headers, fragments in the error)
            ("malformed JSON", b'{"inputs": [', json_type, ["malformed JSON", "byte"]),
            ("malformed JSON, trailing", body() + b"}", json_type, ["malformed JSON"]),
            ("NaN is no JSON", b'{"inputs": [{"name": "input", "shape": [1, 16], '
                               b'"datatype": "FP32", "data": [NaN]}]}', None, ["malformed JSON"]),
            ("empty body", b"", None, ["request body", "malformed JSON"]),
            ("not an object", b"[1, 2]", None, ["request body", "a JSON object", "an array"]),
            ("too deep", b'{"inputs": ' + b"[" * 40 + b"]" * 40 + b"}", None,
             ["nested at most 16"]),
            ("unknown key", body(inputz=[]), None, ["request body", "only the keys", '"inputz"']),
            ("unknown input key", body(input_dtype="FP32"), None, ["inputs[0]", '"dtype"']),
            ("unknown input parameter", body(input_parameters={"bogus": 1}), None,
             ["inputs[0].parameters", '"bogus"']),
            ("unknown output key", body(outputs=[{"name": "output", "binary": True}]), None,
             ["outputs[0]", '"binary"']),
            ("no inputs", b'{"id": "x"}', None, ["inputs", "got none"]),
            ("id not a string", body(id=5), None, ["id: expected a string", "an integer"]),
            ("inputs not an array", body(inputs={}), None, ["inputs: expected an array",
                                                            "an object"]),
            ("input not an object", body(inputs=[3]), None, ["inputs[0]: expected an object"]),
            ("name missing", body(input_name=None), None, ["inputs[0].name", "got none"]),
            ("datatype not a string", body(input_datatype=32), None,
             ["inputs[0].datatype", "a string", "an integer"]),
            ("shape not an array", body(input_shape="2,16"), None, ["inputs[0].shape",
                                                                    "a string"]),
            ("shape not integers", body(input_shape=[2, 16.5]), None, ["inputs[0].shape[1]",
                                                                       "16.5"]),
            ("data not numbers", body(input_data=["a"] * 32), None,
             ['inputs["input"].data[0]', "a number", "a string"]),
            ("data out of FP32 range", body(input_data=[1e39] * 32), None,
             ['inputs["input"].data[0]', "FP32"]),
            ("data missing", body(input_data=None), None, ["inputs[0].data", "got none"]),
            ("data null", body(input_data=[None] * 32), None,
             ['inputs["input"].data[0]', "a number", "null"]),
            ("lengths not integers", plus("lengths", [2], "INT32", [1.5, 2]), None,
             ['inputs["lengths"].data[0]', "INT32", "1.5"]),
            ("mask not booleans", plus("attn_mask", [2, 1, 1], "BOOL", [1, 0]), None,
             ['inputs["attn_mask"].data[0]', "true or false"]),
            ("FP64", body(input_datatype="FP64"), None, ['inputs["input"].datatype', "FP32",
                                                         "FP64"]),
            ("shape/data mismatch: fewer", body(input_data=[0.5] * 16), None,
             ['inputs["input"]', "32", "16"]),
            ("shape/data mismatch: more", body(input_data=[0.5] * 48), None,
             ['inputs["input"]', "32", "48"]),
            ("shape/model mismatch", body(input_shape=[4, 8]), None,
             ["input.shape[1]", "16", "8"]),
            ("unknown input name", plus("bogus", [1], "FP32", [1]), None,
             ["inputs[1].name", '"bogus"']),
            ("input twice", plus("input", [2, 16], "FP32", [0.5] * 32), None,
             ["inputs[1].name", "once"]),
            ("no input named input", body(input_name="lengths", input_datatype="INT32",
                                          input_shape=[1], input_data=[1]), None,
             ['tensor named "input"']),
            ("parameters not an object", body(parameters=[1]), None,
             ["parameters: expected an object"]),
            ("causal not a bool", body(parameters={"causal": "yes"}), None,
             ['parameters["causal"]', "bool_param", "string_param"]),
            ("unknown parameter", body(parameters={"bogus": True}), None,
             ['parameters["bogus"]']),
            ("head_mask wrong length", body(parameters={"head_mask": "1,0"}), None,
             ["head_mask", "4", "got 2"]),
            ("head_mask not flags", body(parameters={"head_mask": "yes"}), None,
             ["head_mask", '"yes"']),
            ("binary_data_output not a bool", body(parameters={"binary_data_output": 1}), None,
             ['parameters["binary_data_output"]', "true or false"]),
            ("outputs not an array", body(outputs={"name": "output"}), None,
             ["outputs: expected an array"]),
            ("unknown output", body(outputs=[{"name": "logits"}]), None,
             ["outputs[0].name", "logits"]),
            ("binary_data not a bool", body(outputs=[{"name": "output",
                                                      "parameters": {"binary_data": "yes"}}]),
             None, ["outputs[0].parameters.binary_data", "true or false"]),
            ("lengths out of range", plus("lengths", [2], "INT32", [9, 1]), None, ["lengths"]),
            # The binary data extension.
            ("header length not a number", binary_header + raw_x, with_length("abc"),
             [HEADER_LENGTH, '"abc"']),
            ("header length negative", binary_header + raw_x, with_length("-1"),
             [HEADER_LENGTH, '"-1"']),
            ("header length with junk", binary_header + raw_x,
             with_length(f"{len(binary_header)}x"), [HEADER_LENGTH]),
            ("header length empty", binary_header + raw_x, with_length(""), [HEADER_LENGTH]),
            ("header length past the body", binary_header + raw_x,
             with_length(str(len(binary_header) + 129)), [HEADER_LENGTH, "0..", "body's size"]),
            ("header length cuts the JSON", binary_header + raw_x,
             with_length(str(len(binary_header) - 3)), ["malformed JSON"]),
            ("binary input without the header", binary_header + raw_x, None,
             [HEADER_LENGTH, "got none"]),
            ("binary size past the body", binary_header + raw_x[:100],
             with_length(str(len(binary_header))),
             ['inputs["input"].parameters.binary_data_size', "100", "128"]),
            ("binary bytes left over", binary_header + raw_x + b"\0" * 4,
             with_length(str(len(binary_header))), ["request body", "128", "132"]),
            ("binary size not the shape's", binary_header.replace(b"128", b"124") + raw_x[:124],
             with_length(str(len(binary_header))), ['inputs["input"]', "128 bytes", "124"]),
            ("binary size negative", binary_header.replace(b"128", b"-128") + raw_x,
             with_length(str(len(binary_header) + 1)),
             ["inputs[0].parameters.binary_data_size", "an integer >= 0"]),
            ("binary size not an integer", binary_header.replace(b"128", b'"128"') + raw_x,
             with_length(str(len(binary_header) + 2)),
             ["inputs[0].parameters.binary_data_size", "a string"]),
            ("data and binary both", both_header + raw_x, with_length(str(len(both_header))),
             ["inputs[0]", "got both"]),
        ]
        for what, data, headers, fragments in cases:
            with self.subTest(what):
                reply = self.post("/v2/models/small/infer", data, headers)
                self.assertError(reply, 400, *fragments)
        # Still serving, on this same kept-alive connection and on a new one.
        reply = self.rest_infer("small", {"input": x})
        self.assertEqual(parse_answer(reply)[1]["output"].shape, (2, 16))
        self.assertEqual(http_call(self.port, "GET", "/v2/health/live").status, 200)
        self.assertTrue(self.stub.ServerLive(self.pb.ServerLiveRequest()).live)

    # -- curl -----------------------------------------------------------------------------------

    def test_curl_json_infer(self):
        curl = shutil.which("curl")
        if curl is None:
            self.skipTest("curl is not installed (apt-get install curl)")
        x = np.random.default_rng(9).standard_normal((2, 3, 16)).astype(np.float32)
        body, _ = infer_body({"input": x}, request_id="curl")
        with tempfile.NamedTemporaryFile(suffix=".json") as file:
            file.write(body)
            file.flush()
            run = subprocess.run(
                [curl, "-s", "-X", "POST", "-H", "Content-Type: application/json",
                 "-d", f"@{file.name}", "-w", "\n%{http_code}",
                 f"http://127.0.0.1:{self.port}/v2/models/small/infer"],
                capture_output=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual(run.returncode, 0, run.stderr)
        text, _, code = run.stdout.rpartition(b"\n")
        self.assertEqual(code, b"200", text)
        answer = json.loads(text)
        self.assertEqual(answer["id"], "curl")
        got = np.array(answer["outputs"][0]["data"], np.float64).astype(np.float32)
        expected, _ = self.grpc_infer(self.stub, "small", {"input": x})
        self.assertBitIdentical(got.reshape(x.shape), expected["output"])


# ---------------------------------------------------------------------------------------------

class LimitsAndSlowClientsTest(RestTestBase):
    """A server with --max-message-bytes 1024 and --http-read-timeout-ms 300."""

    LIMIT = 1024

    @classmethod
    def setUpClass(cls):
        cls.server = start_server("--max-message-bytes", str(cls.LIMIT),
                                  "--http-read-timeout-ms", "300")
        cls.port = cls.server.http_port

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def small_body(self, size):
        """A valid small-model infer body padded with spaces to exactly `size` bytes."""
        body, _ = infer_body({"input": np.full((1, 16), 0.25, np.float32)})
        self.assertLessEqual(len(body), size)
        return body[:-1] + b" " * (size - len(body)) + body[-1:]

    def test_body_past_max_message_bytes_is_413(self):
        reply = http_call(self.port, "POST", "/v2/models/small/infer",
                          self.small_body(self.LIMIT))
        self.assertEqual(reply.status, 200, reply)
        for size in (self.LIMIT + 1, 5000):
            reply = http_call(self.port, "POST", "/v2/models/small/infer", self.small_body(size))
            self.assertError(reply, 413, "request body", f"at most {self.LIMIT} bytes")
        self.assertEqual(http_call(self.port, "GET", "/v2/health/ready").status, 200)

    def test_header_line_past_8_kib_is_refused(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT_S)
        try:
            reply = call(connection, "GET", "/v2", headers={"X-Big": "a" * 8200})
        finally:
            connection.close()
        self.assertError(reply, 400, "header line past 8 KiB")
        # Just under the limit is fine.
        reply = http_call(self.port, "GET", "/v2", headers={"X-Big": "a" * 7000})
        self.assertEqual(reply.status, 200, reply)

    def test_path_past_8_kib_is_refused(self):
        reply = http_call(self.port, "GET", "/v2/models/" + "m" * 8300)
        self.assertError(reply, 414, "path", "8192")
        reply = http_call(self.port, "GET", "/v2/models/" + "m" * 7000)
        self.assertError(reply, 404, "not found")  # a model name, long but within the limit
        self.assertEqual(http_call(self.port, "GET", "/v2").status, 200)

    def test_silent_client_is_answered_400_while_others_are_served(self):
        for partial in (b"GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # half the headers
                        b"POST /v2/models/small/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Length: 300\r\n\r\n{\"inputs\": ["):  # half the body
            with self.subTest(partial[:40]):
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as slow:
                    start = time.monotonic()
                    slow.sendall(partial)
                    # Another client is served meanwhile.
                    reply = http_call(self.port, "POST", "/v2/models/small/infer",
                                      self.small_body(300))
                    self.assertEqual(reply.status, 200, reply)
                    # The silent one: a 400 (with a JSON error), soon after the 300 ms timeout.
                    data = b""
                    while b"}" not in data and time.monotonic() - start < 3:
                        more, closed = read_until_closed_once(slow, start + 3 - time.monotonic())
                        data += more
                        if closed:
                            break
                    elapsed = time.monotonic() - start
                    self.assertEqual(status_of(data), 400, data)
                    self.assertIn("read timeout", json_body_of(data)["error"])
                    self.assertIn(b"Connection: close", data)
                    self.assertGreaterEqual(elapsed, 0.25)
                    self.assertLess(elapsed, 3)
                    # ... and disconnected within a few seconds.
                    rest, closed = read_until_closed(slow, 8)
                    self.assertTrue(closed, "the silent client's connection stayed open")
                    self.assertEqual(rest, b"")
        self.assertEqual(http_call(self.port, "GET", "/v2/health/live").status, 200)

    def test_a_refused_body_is_never_read_as_a_request(self):
        """A body refused 413 (Content-Length past the limit) that arrives after the answer is
        not parsed as a next request: the server closes the connection after the 413."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"POST /v2/models/small/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Length: 2000\r\n\r\n")
            data, _ = read_until_closed_once(sock, 3)
            self.assertEqual(status_of(data), 413, data)
            smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: "
            smuggled += b"p" * (2000 - len(smuggled) - 4) + b"\r\n\r\n"
            try:
                sock.sendall(smuggled)
                more, _ = read_until_closed(sock, 1.5)
            except OSError:
                more = b""
            self.assertNotIn(b"200 OK", more, "the refused body was served as a request")


def read_until_closed_once(sock, timeout_s):
    """One recv within timeout_s: (bytes, closed)."""
    sock.settimeout(max(timeout_s, 0.01))
    try:
        chunk = sock.recv(65536)
    except socket.timeout:
        return b"", False
    except ConnectionResetError:
        return b"", True
    return chunk, not chunk


# ---------------------------------------------------------------------------------------------

class QueueFullAndDrainingTest(RestTestBase):
    """429 when a model's queue is full, 503 and not ready while the server drains."""

    def test_queue_full_is_429_then_draining_is_503(self):
        # Batches wait (up to 60 s) for 3 sequences and one request may queue: of two requests
        # of one sequence, one stays queued and the other is refused.
        server = start_server("--max-queue-size", "1", "--max-queue-delay-us", "60000000",
                              "--max-batch-sequences", "3", "--shutdown-grace-s", "10")
        port = server.http_port
        body, headers = infer_body({"input": np.full((1, 3, 16), 0.5, np.float32)})
        replies = {}

        def infer(key):
            replies[key] = http_call(port, "POST", "/v2/models/small/infer", body, headers)

        threads = [threading.Thread(target=infer, args=(key,)) for key in (0, 1)]
        try:
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 10
            while not replies and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(len(replies), 1, replies)
            refused = next(iter(replies))
            self.assertError(replies[refused], 429, "queue")
            # Draining: not ready, new infers refused 503, the queued one answered.
            server.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while True:
                ready = http_call(port, "GET", "/v2/health/ready")
                if ready.status != 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            self.assertEqual((ready.status, ready.json()), (503, {"ready": False}))
            self.assertEqual(http_call(port, "GET", "/v2/health/live").status, 200)
            reply = http_call(port, "GET", "/v2/models/small/ready")
            self.assertEqual((reply.status, reply.json()), (503, {"name": "small",
                                                                  "ready": False}))
            self.assertError(http_call(port, "POST", "/v2/models/small/infer", body, headers),
                             503)
            threads[1 - refused].join(timeout=15)
            self.assertFalse(threads[1 - refused].is_alive())
            queued = replies[1 - refused]
            self.assertEqual(queued.status, 200, queued)
            self.assertEqual(parse_answer(queued)[1]["output"].shape, (1, 3, 16))
            self.assertEqual(server.process.wait(timeout=15), 0)
        finally:
            for thread in threads:
                thread.join(timeout=15)
            server.__exit__(None, None, None)


# ---------------------------------------------------------------------------------------------

class HttpsTest(RestTestBase):
    """HTTPS on the REST port with the TLS files; mutual TLS with --tls-client-ca."""

    @classmethod
    def setUpClass(cls):
        cls.certs = tempfile.TemporaryDirectory()
        subprocess.run(["bash", os.path.join(ARGS.root, "deploy", "make-test-certs.sh"),
                        cls.certs.name], check=True, timeout=60)
        tls = ("--tls-cert-chain", cls.cert("server.pem"), "--tls-private-key",
               cls.cert("server.key"))
        cls.server = start_server(*tls)
        cls.mutual = start_server(*tls, "--tls-client-ca", cls.cert("ca.pem"))

    @classmethod
    def tearDownClass(cls):
        cls.mutual.__exit__(None, None, None)
        cls.server.__exit__(None, None, None)
        cls.certs.cleanup()

    @classmethod
    def cert(cls, name):
        return os.path.join(cls.certs.name, name)

    def context(self, ca="ca.pem", client=None):
        context = ssl.create_default_context(cafile=self.cert(ca))
        if client:
            context.load_cert_chain(self.cert(f"{client}.pem"), self.cert(f"{client}.key"))
        return context

    def https_call(self, port, method, path, context, body=None, headers=None, host="127.0.0.1"):
        connection = http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=context)
        try:
            return call(connection, method, path, body, headers)
        finally:
            connection.close()

    def test_verified_https_infer_equals_tls_model_infer(self):
        self.assertEqual(self.server.http_scheme, "https")
        port = self.server.http_port
        for host in ("127.0.0.1", "localhost"):
            reply = self.https_call(port, "GET", "/v2/health/ready", self.context(), host=host)
            self.assertEqual((reply.status, reply.json()), (200, {"ready": True}))
        x = np.random.default_rng(10).standard_normal((2, 3, 16)).astype(np.float32)
        body, headers = infer_body({"input": x}, binary={"input"},
                                   parameters={"binary_data_output": True}, request_id="tls")
        reply = self.https_call(port, "POST", "/v2/models/small/infer", self.context(), body,
                                headers)
        self.assertEqual(reply.status, 200, reply)
        header, got, _ = parse_answer(reply)
        self.assertEqual(header["id"], "tls")
        with open(self.cert("ca.pem"), "rb") as ca:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.read())
        with grpc.secure_channel(self.server.target, credentials) as channel:
            stub = shared()["rpc"].GRPCInferenceServiceStub(channel)
            expected, _ = self.grpc_infer(stub, "small", {"input": x})
        self.assertBitIdentical(got["output"], expected["output"])

    def test_untrusted_ca_fails_verification(self):
        with self.assertRaises(ssl.SSLCertVerificationError):
            self.https_call(self.server.http_port, "GET", "/v2", self.context("other-ca.pem"))

    def test_plain_http_to_https_port_fails(self):
        try:
            reply = http_call(self.server.http_port, "GET", "/v2/health/live")
        except (OSError, http.client.HTTPException):
            return  # refused at the TLS layer: no HTTP answer
        self.assertNotEqual(reply.status, 200, reply)
        self.assertNotIn(b'"live"', reply.body)

    def test_mutual_tls_refuses_clients_without_a_trusted_certificate(self):
        port = self.mutual.http_port
        self.assertEqual(self.mutual.http_scheme, "https")
        for client in (None, "client-untrusted"):
            with self.subTest(client=client):
                context = self.context(client=client)
                # The handshake fails, or (TLS 1.3) the server's alert ends the connection at
                # the first read: either way no answer.
                with self.assertRaises((ssl.SSLError, ConnectionError,
                                        http.client.HTTPException)) as caught:
                    self.https_call(port, "GET", "/v2/health/live", context)
                self.assertNotIsInstance(caught.exception, ssl.SSLCertVerificationError)
        reply = self.https_call(port, "GET", "/v2/health/live", self.context(client="client"))
        self.assertEqual((reply.status, reply.json()), (200, {"live": True}))
        x = np.zeros((1, 16), np.float32)
        body, headers = infer_body({"input": x})
        reply = self.https_call(port, "POST", "/v2/models/small/infer",
                                self.context(client="client"), body, headers)
        self.assertEqual(reply.status, 200, reply)
        self.assertEqual(parse_answer(reply)[1]["output"].shape, (1, 16))

    def test_curl_https(self):
        curl = shutil.which("curl")
        if curl is None:
            self.skipTest("curl is not installed (apt-get install curl)")
        base = [curl, "-s", "-w", "\n%{http_code}", "--cacert", self.cert("ca.pem")]
        run = subprocess.run(base + [f"https://127.0.0.1:{self.server.http_port}/v2/health/ready"],
                             capture_output=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout, b'{"ready":true}\n200')
        # Mutual TLS: with the client certificate, and refused without it.
        url = f"https://127.0.0.1:{self.mutual.http_port}/v2/health/live"
        run = subprocess.run(base + ["--cert", self.cert("client.pem"), "--key",
                                     self.cert("client.key"), url],
                             capture_output=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual((run.returncode, run.stdout), (0, b'{"live":true}\n200'), run.stderr)
        run = subprocess.run(base + [url], capture_output=True, timeout=TIMEOUT_S, check=False)
        self.assertNotEqual(run.returncode, 0, run.stdout)
        # Without --cacert the server's certificate is not trusted.
        run = subprocess.run([curl, "-s", f"https://127.0.0.1:{self.server.http_port}/v2"],
                             capture_output=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual(run.returncode, 60, run.stderr)  # CURLE_PEER_FAILED_VERIFICATION


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--attnserve", required=True)
    parser.add_argument("--root", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.attnserve = os.path.abspath(ARGS.attnserve)
    ARGS.root = os.path.abspath(ARGS.root)
    try:
        unittest.main(argv=[sys.argv[0], *rest])
    finally:
        if _SHARED:
            _SHARED["tmp"].cleanup()
