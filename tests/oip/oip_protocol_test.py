#!/usr/bin/python3
"""The Open Inference Protocol against a live attnserve, from a client generated at test time
from the protocol's own .proto (tests/oip/proto, a copy kept apart from the server's proto/).

Drives every RPC: liveness, readiness and metadata of the demo model and of a repository model,
raw and typed inference, requested-outputs filtering, weights, errors; and checks ModelInfer
answers bit-identically to attnserve.v1's Attend for the same inputs.

  oip_protocol_test.py --attnserve build/server/attnserve --root .
"""
import argparse
import importlib
import os
import sys
import tempfile
import unittest

import grpc
import numpy as np
import torch
from grpc_tools import protoc

ARGS = None


def generate(proto_root, proto, out):
    """Python stubs of `proto` (relative to proto_root) into `out`, importable from it."""
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    code = protoc.main(["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out}",
                        f"--grpc_python_out={out}", proto])
    if code != 0:
        raise RuntimeError(f"protoc failed on {proto}")


class OipTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        here = os.path.dirname(os.path.abspath(__file__))
        generate(os.path.join(here, "proto"), "grpc_predict_v2.proto", cls.tmp.name)
        generate(os.path.join(ARGS.root, "proto"), "attnserve/v1/attention.proto", cls.tmp.name)
        sys.path.insert(0, cls.tmp.name)
        sys.path.insert(0, here)
        cls.pb = importlib.import_module("grpc_predict_v2_pb2")
        cls.rpc = importlib.import_module("grpc_predict_v2_pb2_grpc")
        cls.v1 = importlib.import_module("attnserve.v1.attention_pb2")
        cls.v1rpc = importlib.import_module("attnserve.v1.attention_pb2_grpc")
        # A repository with one exported model besides the demo model.
        sys.path.insert(0, os.path.join(ARGS.root, "tools"))
        export_torch = importlib.import_module("export_torch")
        torch.manual_seed(3)
        mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        repository = os.path.join(cls.tmp.name, "models")
        export_torch.export_mha(mha, os.path.join(repository, "small"))
        live_server = importlib.import_module("live_server")
        cls.server = live_server.LiveServer(ARGS.attnserve, "--model-repository", repository,
                                            "--demo-model", "always", "--default-model", "demo")
        cls.server.__enter__()
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.stub = cls.rpc.GRPCInferenceServiceStub(cls.channel)
        cls.attend = cls.v1rpc.AttentionServiceStub(cls.channel)
        cls.d_model = cls.attend.GetModel(cls.v1.GetModelRequest(name="demo")).d_model

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.__exit__(None, None, None)
        cls.tmp.cleanup()

    def infer_request(self, x, raw=True, model="demo", **extra):
        request = self.pb.ModelInferRequest(model_name=model, id="r1")
        tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        if raw:
            request.raw_input_contents.append(x.astype("<f4").tobytes())
        else:
            tensor.contents.fp32_contents.extend(x.ravel().tolist())
        for name, value in extra.items():
            request.parameters[name].bool_param = value
        return request

    def output(self, response, name):
        for i, tensor in enumerate(response.outputs):
            if tensor.name == name:
                if response.raw_output_contents:
                    data = np.frombuffer(response.raw_output_contents[i], dtype="<f4")
                else:
                    data = np.array(tensor.contents.fp32_contents, dtype=np.float32)
                return data.reshape(tuple(tensor.shape))
        self.fail(f"no output {name} in {[t.name for t in response.outputs]}")

    def expect_invalid(self, request, *fragments):
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelInfer(request)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         caught.exception.details())
        for fragment in fragments:
            self.assertIn(fragment, caught.exception.details())

    def test_live_ready_and_server_metadata(self):
        self.assertTrue(self.stub.ServerLive(self.pb.ServerLiveRequest()).live)
        self.assertTrue(self.stub.ServerReady(self.pb.ServerReadyRequest()).ready)
        metadata = self.stub.ServerMetadata(self.pb.ServerMetadataRequest())
        self.assertEqual(metadata.name, "attnserve")
        self.assertTrue(metadata.version)

    def test_model_ready_and_metadata(self):
        for name, d in (("demo", self.d_model), ("small", 16)):
            self.assertTrue(self.stub.ModelReady(self.pb.ModelReadyRequest(name=name)).ready)
            metadata = self.stub.ModelMetadata(self.pb.ModelMetadataRequest(name=name))
            self.assertEqual(metadata.name, name)
            self.assertEqual(metadata.platform, "attnserve_onednn")
            self.assertEqual(list(metadata.versions), ["1"])
            inputs = {t.name: (t.datatype, list(t.shape)) for t in metadata.inputs}
            self.assertEqual(inputs["input"], ("FP32", [-1, -1, d]))
            self.assertEqual(inputs["lengths"], ("INT32", [-1]))
            outputs = {t.name: (t.datatype, list(t.shape)) for t in metadata.outputs}
            self.assertEqual(outputs["output"], ("FP32", [-1, -1, d]))
        self.assertFalse(self.stub.ModelReady(self.pb.ModelReadyRequest(name="nope")).ready)
        self.assertFalse(
            self.stub.ModelReady(self.pb.ModelReadyRequest(name="small", version="7")).ready)
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelMetadata(self.pb.ModelMetadataRequest(name="nope"))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_raw_infer_equals_attend_bit_for_bit(self):
        x = np.random.default_rng(1).standard_normal((2, 5, self.d_model)).astype(np.float32)
        response = self.stub.ModelInfer(self.infer_request(x, causal=True))
        self.assertTrue(response.raw_output_contents)
        self.assertEqual(response.model_name, "demo")
        self.assertEqual(response.id, "r1")
        got = self.output(response, "output")
        attend = self.attend.Attend(self.v1.AttendRequest(
            model="demo", input=self.v1.Tensor(shape=list(x.shape), raw=x.tobytes()),
            mask=self.v1.MASK_CAUSAL, raw_output=True))
        expected = np.frombuffer(attend.output.raw, dtype="<f4").reshape(x.shape)
        self.assertEqual(got.tobytes(), expected.tobytes())

    def test_typed_infer_answers_typed(self):
        x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
        response = self.stub.ModelInfer(self.infer_request(x, raw=False, model="small"))
        self.assertFalse(response.raw_output_contents)
        got = self.output(response, "output")
        self.assertEqual(got.shape, (3, 16))
        raw = self.output(self.stub.ModelInfer(self.infer_request(x, model="small")), "output")
        self.assertEqual(got.tobytes(), raw.tobytes())

    def test_requested_outputs_and_weights(self):
        x = np.random.default_rng(3).standard_normal((1, 4, 16)).astype(np.float32)
        request = self.infer_request(x, model="small")
        request.outputs.add(name="weights")
        response = self.stub.ModelInfer(request)
        self.assertEqual([t.name for t in response.outputs], ["weights"])
        weights = self.output(response, "weights")
        self.assertEqual(weights.shape, (1, 4, 4, 4))
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)
        both = self.stub.ModelInfer(self.infer_request(x, model="small", return_weights=True))
        self.assertEqual([t.name for t in both.outputs], ["output", "weights"])

    def test_lengths_and_mask(self):
        x = np.random.default_rng(4).standard_normal((2, 3, 16)).astype(np.float32)
        request = self.infer_request(x, model="small")
        request.inputs.add(name="lengths", datatype="INT32", shape=[2])
        request.raw_input_contents.append(np.array([3, 2], dtype="<i4").tobytes())
        request.inputs.add(name="attn_mask", datatype="BOOL", shape=[2, 3, 3])
        request.raw_input_contents.append(np.ones((2, 3, 3), dtype=np.uint8).tobytes())
        got = self.output(self.stub.ModelInfer(request), "output")
        self.assertTrue(np.all(got[1, 2] == 0))  # padding row
        alone = self.output(self.stub.ModelInfer(self.infer_request(x[1:, :2], model="small")),
                            "output")
        np.testing.assert_allclose(got[1, :2], alone[0], rtol=1e-5, atol=1e-6)

    def test_errors_name_the_tensor_or_parameter(self):
        x = np.zeros((2, 8), dtype=np.float32)
        self.expect_invalid(self.infer_request(x, model="small"), "input.shape[1]", "16", "8")
        request = self.infer_request(np.zeros((2, 16), np.float32), model="small")
        request.inputs[0].datatype = "FP64"
        self.expect_invalid(request, 'inputs["input"].datatype', "FP32", "FP64")
        request = self.infer_request(np.zeros((2, 16), np.float32), model="small")
        request.raw_input_contents[0] = b"\0" * 12
        self.expect_invalid(request, 'inputs["input"]', "128 bytes", "got 12")
        request = self.infer_request(np.zeros((2, 16), np.float32), model="small")
        request.parameters["causal"].string_param = "yes"
        self.expect_invalid(request, 'parameters["causal"]', "bool_param", "string_param")
        request = self.infer_request(np.zeros((2, 16), np.float32), model="small")
        request.parameters["bogus"].bool_param = True
        self.expect_invalid(request, 'parameters["bogus"]')
        request = self.infer_request(np.zeros((2, 16), np.float32), model="small")
        request.outputs.add(name="logits")
        self.expect_invalid(request, "outputs[0].name", "logits")
        request = self.infer_request(np.zeros((2, 16), np.float32), model="small")
        request.parameters["head_mask"].string_param = "1,0"
        self.expect_invalid(request, "head_mask", "4", "got 2")
        request = self.pb.ModelInferRequest(model_name="small")
        self.expect_invalid(request, 'tensor named "input"')
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelInfer(self.infer_request(x, model="nope"))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)
        # The server keeps serving.
        self.assertTrue(self.stub.ServerLive(self.pb.ServerLiveRequest()).live)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--attnserve", required=True)
    parser.add_argument("--root", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest])
