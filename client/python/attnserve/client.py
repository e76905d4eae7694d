"""Client and AsyncClient: attnserve.v1's Attend, Decode sessions (attnserve.decoding), ListModels,
GetModel and gRPC health.

Tensors travel as raw little-endian bytes (Tensor.raw): float32, or with wire_dtype "bf16" / "f16"
at 2 bytes per element both ways (rounded to nearest, ties to even; answers come back as float32
arrays whatever the wire carried). A list of [T_i, d] arrays is sent
as one padded [B, max T, d] request with lengths, and answered as a list again.

Retries: a call is retried with exponential backoff, `retries` times at most, within its
deadline, only where a retry can succeed:
- UNAVAILABLE (no connection, server restarting or draining);
- RESOURCE_EXHAUSTED from attnserve's queue admission, which the server alone marks: its message
  ends "; retry with backoff" (batch queue full: max_queue_size requests waiting; or queued bytes
  at max_queued_bytes). A request larger than a byte limit by itself is INVALID_ARGUMENT, since
  no drained queue would admit it (servers before that answered it RESOURCE_EXHAUSTED, naming
  "max_queued_bytes (L) ... this request holds B" with B > L: not retried either).
Every other RESOURCE_EXHAUSTED fails at once: gRPC's message size limits ("Received message
larger than max", on either side: the same request always fails), the server's own memory
failures, and anything else without the server's mark.
"""
import asyncio
import dataclasses
import random
import re
import time

import grpc
import numpy as np

from attnserve.v1 import attention_pb2 as pb
from attnserve.v1 import attention_pb2_grpc as pb_grpc

# See the module docstring: the server's mark on its queue admission refusals, and the sizes
# they name.
_RETRY_MARK = "; retry with backoff"
_QUEUED_BYTES = re.compile(r"max_queued_bytes \((\d+)\).*this request holds (\d+)")
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_MAX_MESSAGE_BYTES = 256 << 20


class AttnserveError(Exception):
    """A failed call: `code` (grpc.StatusCode) and `message`, the server's explanation."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    name: str
    d_model: int
    num_heads: int
    variant: str
    dtype: str
    version: int
    is_default: bool
    max_sequence_length: int
    server_version: str = ""  # the attnserve release that answered, e.g. "1.0.0"
    kv_cache_dtype: str = ""  # what decoding sessions' KV cache stores: fp32, bf16 or int8


def _model_info(info):
    return ModelInfo(info.name, info.d_model, info.num_heads, info.variant, info.dtype,
                     info.version, info.is_default, info.max_sequence_length,
                     info.server_version, info.kv_cache_dtype)


_WIRE_DTYPES = {"fp32": pb.DATA_TYPE_FP32, "bf16": pb.DATA_TYPE_BF16, "f16": pb.DATA_TYPE_FP16}


def _wire_dtype(name):
    if name not in _WIRE_DTYPES:
        raise ValueError(f"wire_dtype: expected one of fp32, bf16, f16, got {name!r}")
    return _WIRE_DTYPES[name]


def _encode(array, dtype):
    """float32 `array` as raw bytes of `dtype` (round to nearest, ties to even)."""
    if dtype == pb.DATA_TYPE_FP16:
        return array.astype("<f2").tobytes()
    if dtype == pb.DATA_TYPE_BF16:
        # numpy has no bfloat16: round the float32 bits (uint32 wraps only for NaNs, fixed below).
        bits = array.view("<u4")
        rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype("<u2")
        nan = np.isnan(array)
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype("<u2")  # stays a (quiet) NaN
        return rounded.tobytes()
    return array.tobytes()


def _decode(tensor):
    """A raw answer tensor as a float32 array of its shape, whatever its dtype."""
    if tensor.dtype == pb.DATA_TYPE_FP16:
        values = np.frombuffer(tensor.raw, dtype="<f2").astype(np.float32)
    elif tensor.dtype == pb.DATA_TYPE_BF16:
        values = (np.frombuffer(tensor.raw, dtype="<u2").astype("<u4") << 16).view("<f4")
    else:
        values = np.frombuffer(tensor.raw, dtype="<f4").copy()
    return values.reshape(tuple(tensor.shape))


def _fill_tensor(tensor, array, name, dtype=pb.DATA_TYPE_FP32):
    """Writes `array` into the request's pb.Tensor field `tensor` in place, as raw bytes of `dtype`
    (a CopyFrom of a separate message would copy the raw bytes once more)."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.number) and array.dtype != np.bool_:
        raise TypeError(f"{name}: expected a numeric array, got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype="<f4")
    tensor.shape.extend(array.shape)
    tensor.raw = _encode(array, dtype)
    tensor.dtype = dtype


def _pad(sequences, name):
    """A list of [T_i, d] arrays -> ([B, max T, d] float32, lengths)."""
    arrays = [np.asarray(s, dtype=np.float32) for s in sequences]
    if not arrays or any(a.ndim != 2 for a in arrays):
        raise ValueError(f"{name}: expected a non-empty list of [T_i, d_model] arrays")
    width = arrays[0].shape[1]
    if any(a.shape[1] != width for a in arrays):
        raise ValueError(f"{name}: expected every sequence to have d_model {width}")
    longest = max(a.shape[0] for a in arrays)
    padded = np.zeros((len(arrays), longest, width), dtype=np.float32)
    for i, a in enumerate(arrays):
        padded[i, :a.shape[0]] = a
    return padded, [a.shape[0] for a in arrays]


@dataclasses.dataclass
class _Call:
    request: object
    lengths: list = None  # set when the input was a list: answers are unpadded into a list
    key_lengths: list = None  # with lengths: each sequence's key columns in its weights


def _attend_request(model, x, memory, causal, attn_mask, head_mask, return_weights, lengths,
                    memory_lengths, request_id, wire_dtype="fp32"):
    dtype = _wire_dtype(wire_dtype)
    request = pb.AttendRequest(model=model, raw_output=True, request_id=request_id,
                               return_weights=return_weights, raw_output_dtype=dtype,
                               mask=pb.MASK_CAUSAL if causal else pb.MASK_NONE)
    listed = isinstance(x, (list, tuple))
    if listed:
        x, lengths = _pad(x, "x")
        if isinstance(memory, (list, tuple)):
            memory, memory_lengths = _pad(memory, "memory")
    _fill_tensor(request.input, x, "x", dtype)
    if memory is not None:
        _fill_tensor(request.memory, memory, "memory", dtype)
    if lengths is not None:
        request.lengths.extend(int(n) for n in lengths)
    if memory_lengths is not None:
        request.memory_lengths.extend(int(n) for n in memory_lengths)
    if attn_mask is not None:
        # attnserve's convention: non-zero / True = may attend, 0 / False = blocked.
        _fill_tensor(request.attn_mask, np.asarray(attn_mask) != 0, "attn_mask")
    if head_mask is not None:
        request.head_mask.extend(bool(h) for h in head_mask)
    if not listed:
        return _Call(request)
    # Keys are the queries themselves (self-attention), memory's own lengths, or, for a padded
    # memory without them, its every row.
    if memory is None:
        key_lengths = lengths
    elif memory_lengths is not None:
        key_lengths = [int(n) for n in memory_lengths]
    else:
        key_lengths = [request.memory.shape[-2]] * len(lengths)
    return _Call(request, lengths, key_lengths)


def _answer(call, response, return_weights):
    output = _decode(response.output)
    weights = _decode(response.weights) if return_weights else None
    if call.lengths is not None:
        output = [output[i, :n] for i, n in enumerate(call.lengths)]
        if weights is not None:
            weights = [weights[i, :, :n, :call.key_lengths[i]] for i, n in enumerate(call.lengths)]
    return (output, weights) if return_weights else output


def _health_request(service):
    data = service.encode()
    if len(data) > 127:
        raise ValueError("service: expected a name of at most 127 bytes")
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""


def _is_serving(response):
    # HealthCheckResponse{status = 1}: SERVING is 1; field 1 absent means UNKNOWN (0).
    return response == b"\x08\x01"


def _retryable(error):
    """Whether a retry of the call that failed with grpc.RpcError `error` can succeed."""
    code = error.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    if code != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    details = error.details() or ""
    if _RETRY_MARK not in details:
        return False
    sizes = _QUEUED_BYTES.search(details)
    return sizes is None or int(sizes.group(2)) <= int(sizes.group(1))


class _Retrying:
    def __init__(self, retries, backoff_s):
        self.retries = retries
        self.backoff_s = backoff_s

    def delays(self, deadline):
        """Backoff delays before each retry, stopping at `deadline` (time.monotonic, or None)."""
        for attempt in range(self.retries):
            delay = self.backoff_s * (2 ** attempt) * (0.5 + random.random())
            if deadline is not None and time.monotonic() + delay >= deadline:
                return
            yield delay


def _read(path, name):
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise ValueError(f"{name}: cannot read {path!r}: {error.strerror}") from None


def _channel_settings(credentials, options, tls_ca, tls_cert_chain, tls_private_key,
                      tls_server_name):
    """(credentials or None, channel options) from the constructor's TLS arguments."""
    opts = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES), *options]
    tls = (tls_ca, tls_cert_chain, tls_private_key, tls_server_name)
    if not any(tls):
        return credentials, opts
    if credentials is not None:
        raise ValueError("credentials: expected either credentials or the tls_* arguments, "
                         "not both")
    if not tls_ca:
        raise ValueError("tls_ca: expected the PEM file of the CA that signed the server's "
                         "certificate (or \"system\" for the system's trust store) when any "
                         "tls_* argument is given")
    if bool(tls_cert_chain) != bool(tls_private_key):
        raise ValueError("tls_cert_chain, tls_private_key: expected both (mutual TLS: this "
                         "client's certificate and its key) or neither")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=None if tls_ca == "system" else _read(tls_ca, "tls_ca"),
        private_key=_read(tls_private_key, "tls_private_key") if tls_private_key else None,
        certificate_chain=_read(tls_cert_chain, "tls_cert_chain") if tls_cert_chain else None)
    if tls_server_name:
        opts.append(("grpc.ssl_target_name_override", tls_server_name))
    return credentials, opts


def _error(error, tls):
    """AttnserveError for a failed call; a failed TLS handshake says what to check."""
    details = error.details() or ""
    if tls and error.code() == grpc.StatusCode.UNAVAILABLE and (
            "handshake" in details.lower() or "ssl" in details.lower()):
        details += (" (TLS handshake failed: is tls_ca the CA that signed the server's "
                    "certificate, does the certificate name the target or tls_server_name, is "
                    "it valid now, and does the server require a client certificate "
                    "(tls_cert_chain/tls_private_key)? The server's log says why.)")
    return AttnserveError(error.code(), details)


def _remaining(deadline):
    # Never 0: gRPC Python takes a zero timeout as none at all.
    return None if deadline is None else max(1e-6, deadline - time.monotonic())


class Client:
    """A blocking client of one attnserve target ("host:port"). Thread-safe; one channel.

    timeout_s: default deadline of each call (None = none). retries / backoff_s: the most retries
    of a call and the first backoff (doubling, jittered); which failures are retried: see the
    module docstring.
    TLS (all None: plaintext), as attnserve-cli's --tls-* flags: tls_ca, the PEM file of the CAs
    trusted to sign the server's certificate ("system": the system's trust store);
    tls_cert_chain and tls_private_key, this client's certificate and key for servers that
    require mutual TLS (both or neither); tls_server_name, the name the server's certificate must
    carry when it is not the target's host (an IP, a load balancer). The files are read here; a
    missing or unreadable one, or an incomplete set, raises ValueError naming the argument.
    credentials: ready-made grpc.ChannelCredentials instead of the tls_* arguments.
    wire_dtype: "fp32" (default), "bf16" or "f16": the raw encoding of tensors both ways.
    """

    def __init__(self, target, model="", timeout_s=None, retries=3, backoff_s=0.05,
                 credentials=None, options=(), tls_ca=None, tls_cert_chain=None,
                 tls_private_key=None, tls_server_name=None, wire_dtype="fp32"):
        credentials, opts = _channel_settings(credentials, options, tls_ca, tls_cert_chain,
                                              tls_private_key, tls_server_name)
        self._tls = credentials is not None
        self._channel = (grpc.secure_channel(target, credentials, opts) if credentials
                         else grpc.insecure_channel(target, opts))
        self._stub = pb_grpc.AttentionServiceStub(self._channel)
        self._health = self._channel.unary_unary(_HEALTH_CHECK)
        self.model = model
        self.timeout_s = timeout_s
        _wire_dtype(wire_dtype)
        self.wire_dtype = wire_dtype
        self._retry = _Retrying(retries, backoff_s)

    def _call(self, method, request, timeout_s):
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delays = self._retry.delays(deadline)
        while True:
            try:
                return method(request, timeout=_remaining(deadline))
            except grpc.RpcError as error:
                delay = next(delays, None) if _retryable(error) else None
                if delay is None:
                    raise _error(error, self._tls) from None
                time.sleep(delay)

    def attend(self, x, memory=None, causal=False, attn_mask=None, head_mask=None,
               return_weights=False, lengths=None, memory_lengths=None, model=None,
               timeout_s=None, request_id="", wire_dtype=None):
        """Attention over x ([T, d], [B, T, d], or a list of [T_i, d]); returns the output in
        x's form, or (output, weights) when return_weights. memory: cross-attention keys/values
        (same form as x, or padded [B, S, d] with a list x: then each sequence's weights are
        [heads, T_i, S], or S = memory_lengths[i] when given). attn_mask: [T, S] / [B, T, S],
        non-zero = may attend. head_mask: one flag per head. wire_dtype: "fp32", "bf16" or "f16"
        for this call (default: the client's)."""
        call = _attend_request(self.model if model is None else model, x, memory, causal,
                               attn_mask, head_mask, return_weights, lengths, memory_lengths,
                               request_id, wire_dtype or self.wire_dtype)
        response = self._call(self._stub.Attend, call.request, timeout_s)
        return _answer(call, response, return_weights)

    def decode_stream(self, timeout_s=None, wire_dtype=None):
        """A Decode stream for many sessions (attnserve.decoding.DecodeStream). timeout_s: the
        whole stream's deadline (default none: not the client's per-call timeout_s). Streams are
        not retried: a failed one fails its calls with AttnserveError."""
        from attnserve import decoding
        return decoding.DecodeStream(self._stub, timeout_s, wire_dtype or self.wire_dtype,
                                     self._tls)

    def decode(self, model=None, memory=None, expected_version=0, timeout_s=None,
               wire_dtype=None):
        """A decoding session on a stream of its own (attnserve.decoding.DecodeSession:
        prefill(rows), step(row), close(); a context manager). memory: an encoder output [S, d]
        to attend over (cross-attention); else each row attends causally over the session's rows.
        timeout_s: as decode_stream's."""
        from attnserve import decoding
        stream = self.decode_stream(timeout_s, wire_dtype)
        try:
            return stream.open(self.model if model is None else model, memory, expected_version,
                               _kind=decoding._OwnStreamSession)
        except BaseException:
            stream.close()
            raise

    def models(self, timeout_s=None):
        """Every serving model, sorted by name."""
        response = self._call(self._stub.ListModels, pb.ListModelsRequest(), timeout_s)
        return [_model_info(m) for m in response.models]

    def model_info(self, name="", timeout_s=None):
        return _model_info(self._call(self._stub.GetModel, pb.GetModelRequest(name=name),
                                      timeout_s))

    def health(self, service="", timeout_s=None):
        """Whether `service` ("" = the server; or a model name) is SERVING."""
        return _is_serving(self._call(self._health, _health_request(service), timeout_s))

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class AsyncClient:
    """Client's asyncio twin (grpc.aio): the same arguments (TLS included) and methods, as
    coroutines. Use from one loop."""

    def __init__(self, target, model="", timeout_s=None, retries=3, backoff_s=0.05,
                 credentials=None, options=(), tls_ca=None, tls_cert_chain=None,
                 tls_private_key=None, tls_server_name=None, wire_dtype="fp32"):
        credentials, opts = _channel_settings(credentials, options, tls_ca, tls_cert_chain,
                                              tls_private_key, tls_server_name)
        self._tls = credentials is not None
        self._channel = (grpc.aio.secure_channel(target, credentials, opts) if credentials
                         else grpc.aio.insecure_channel(target, opts))
        self._stub = pb_grpc.AttentionServiceStub(self._channel)
        self._health = self._channel.unary_unary(_HEALTH_CHECK)
        self.model = model
        self.timeout_s = timeout_s
        _wire_dtype(wire_dtype)
        self.wire_dtype = wire_dtype
        self._retry = _Retrying(retries, backoff_s)

    async def _call(self, method, request, timeout_s):
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delays = self._retry.delays(deadline)
        while True:
            try:
                return await method(request, timeout=_remaining(deadline))
            except grpc.RpcError as error:
                delay = next(delays, None) if _retryable(error) else None
                if delay is None:
                    raise _error(error, self._tls) from None
                await asyncio.sleep(delay)

    async def attend(self, x, memory=None, causal=False, attn_mask=None, head_mask=None,
                     return_weights=False, lengths=None, memory_lengths=None, model=None,
                     timeout_s=None, request_id="", wire_dtype=None):
        call = _attend_request(self.model if model is None else model, x, memory, causal,
                               attn_mask, head_mask, return_weights, lengths, memory_lengths,
                               request_id, wire_dtype or self.wire_dtype)
        response = await self._call(self._stub.Attend, call.request, timeout_s)
        return _answer(call, response, return_weights)

    def decode_stream(self, timeout_s=None, wire_dtype=None):
        """Client.decode_stream's asyncio twin (attnserve.decoding.AsyncDecodeStream): its
        methods are coroutines, and coroutines of this loop may step concurrently."""
        from attnserve import decoding
        return decoding.AsyncDecodeStream(self._stub, timeout_s, wire_dtype or self.wire_dtype,
                                          self._tls)

    async def decode(self, model=None, memory=None, expected_version=0, timeout_s=None,
                     wire_dtype=None):
        """Client.decode's asyncio twin: an AsyncDecodeSession on a stream of its own."""
        stream = self.decode_stream(timeout_s, wire_dtype)
        try:
            return await stream.open(self.model if model is None else model, memory,
                                     expected_version, _own_stream=True)
        except BaseException:
            await stream.close()
            raise

    async def models(self, timeout_s=None):
        response = await self._call(self._stub.ListModels, pb.ListModelsRequest(), timeout_s)
        return [_model_info(m) for m in response.models]

    async def model_info(self, name="", timeout_s=None):
        return _model_info(await self._call(self._stub.GetModel, pb.GetModelRequest(name=name),
                                            timeout_s))

    async def health(self, service="", timeout_s=None):
        return _is_serving(await self._call(self._health, _health_request(service), timeout_s))

    async def close(self):
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False
