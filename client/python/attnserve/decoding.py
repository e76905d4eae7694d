"""Decoding sessions over attnserve.v1's Decode stream: the server keeps each session's keys and
values (its KV cache), so every call sends only the new rows and is answered with their outputs,
causal over every row the session has seen (or, with an encoder memory, attending over it).

    with client.decode(model="mha") as session:
        y = session.prefill(prompt)        # [T, d] -> [T, d]
        y_next = session.step(row)         # [d] -> [d]

    with client.decode_stream() as stream:  # one stream, many sessions
        sessions = [stream.open() for _ in range(64)]
        outputs = stream.step_all([(s, row) for s, row in zip(sessions, rows)])  # one message

DecodeStream (blocking) sends one message at a time and waits for its answer; it is not
thread-safe. AsyncDecodeStream (asyncio) lets any number of coroutines have messages in flight on
one stream. A failed item raises AttnserveError with its code and the server's message; the
session is left as it was (a failed step appends nothing). A failed stream (deadline, server gone,
drained) fails every later call with the stream's status.
"""
import asyncio
import itertools
import queue

import grpc
import numpy as np

from attnserve.client import AttnserveError, _decode, _error, _fill_tensor, _wire_dtype
from attnserve.v1 import attention_pb2 as pb

_END = object()
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _fail(error):
    """AttnserveError from a pb.ErrorStatus."""
    return AttnserveError(_STATUS_CODES.get(error.code, grpc.StatusCode.UNKNOWN), error.message)


def _rows(array, name):
    """A [T, d] float32 array from [T, d] (or [d] for one row); whether a single row was given."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"{name}: expected a numeric array, got dtype {array.dtype}")
    single = array.ndim == 1
    array = np.ascontiguousarray(array[None] if single else array, dtype="<f4")
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValueError(f"{name}: expected [rows, d_model] with rows >= 1 (or one [d_model] "
                         f"row), got shape {tuple(np.shape(array))}")
    return array, single


class DecodeSession:
    """One decoding session of a stream. `tag`: its name on the stream; `model` and `version`:
    what the server computes it with. Use from the stream's thread (or loop)."""

    def __init__(self, stream, tag, model, version):
        self._stream = stream
        self.tag = tag
        self.model = model
        self.version = version
        self.closed = False

    def prefill(self, rows):
        """Appends `rows` ([T, d]) to the session; returns their outputs [T, d]."""
        return self._stream.step_all([(self, rows)])[0]

    def step(self, row):
        """Appends one row ([d], or [1, d]); returns its output in the same shape."""
        return self._stream.step_all([(self, row)])[0]

    def close(self):
        """Closes the session on the server (frees its cache); closing twice does nothing."""
        if not self.closed:
            self._stream.close_sessions([self])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Messages:
    """Builds the Decode messages and reads their answers; shared by both stream kinds."""

    def __init__(self, wire_dtype, tls):
        self._wire_dtype = _wire_dtype(wire_dtype)
        self._tls = tls
        self._ids = itertools.count(1)
        self._tags = itertools.count(1)
        self.error = None  # the stream's failure, once it failed

    def request(self):
        return pb.DecodeRequest(request_id=str(next(self._ids)))

    def open_request(self, model, memory, expected_version):
        request = self.request()
        item = request.opens.add(session=f"s{next(self._tags)}", model=model,
                                 expected_version=expected_version)
        if memory is not None:
            array, _ = _rows(memory, "memory")
            _fill_tensor(item.memory, array, "memory", self._wire_dtype)
        return request

    @staticmethod
    def opened(stream, response, kind):
        result = response.opens[0]
        if result.HasField("error"):
            raise _fail(result.error)
        return kind(stream, result.session, result.model, result.model_version)

    def step_request(self, items):
        request = self.request()
        shapes = []
        for session, rows in items:
            if session.closed:
                raise ValueError(f"session {session.tag}: the session is closed")
            array, single = _rows(rows, "rows")
            step = request.steps.add(session=session.tag, raw_output=True,
                                     raw_output_dtype=self._wire_dtype)
            _fill_tensor(step.rows, array, "rows", self._wire_dtype)
            shapes.append(single)
        return request, shapes

    @staticmethod
    def stepped(response, shapes):
        outputs, first_error = [], None
        for result, single in zip(response.steps, shapes):
            if result.HasField("error"):
                error = _fail(result.error)
                first_error = first_error or error
                outputs.append(error)
            else:
                output = _decode(result.output)
                outputs.append(output[0] if single else output)
        if first_error is not None:
            first_error.results = outputs  # every item's output or error, in order
            raise first_error
        return outputs

    def close_request(self, sessions):
        request = self.request()
        for session in sessions:
            request.closes.add(session=session.tag)
        return request

    @staticmethod
    def closed(response, sessions):
        first_error = None
        for result, session in zip(response.closes, sessions):
            session.closed = True  # closed, or unknown to the server: unusable either way
            if result.HasField("error") and first_error is None:
                first_error = _fail(result.error)
        if first_error is not None:
            raise first_error

    def checked(self, response):
        if response.HasField("error"):
            raise _fail(response.error)
        return response

    def stream_failed(self, error):
        if isinstance(error, grpc.RpcError):
            self.error = _error(error, self._tls)
        else:
            self.error = AttnserveError(grpc.StatusCode.UNAVAILABLE,
                                        "the server ended the decode stream")
        return self.error


class DecodeStream:
    """A blocking Decode stream (Client.decode_stream()). Not thread-safe. Closing it (or
    leaving its `with` block) ends the stream; the server then frees its sessions."""

    def __init__(self, stub, timeout_s, wire_dtype, tls):
        self._messages = _Messages(wire_dtype, tls)
        self._requests = queue.Queue()
        self._responses = stub.Decode(iter(self._requests.get, _END), timeout=timeout_s)
        self._ended = False

    def _exchange(self, request):
        if self._messages.error is not None:
            raise self._messages.error
        if self._ended:
            raise ValueError("decode stream: the stream is closed")
        self._requests.put(request)
        try:
            response = next(self._responses)
        except (grpc.RpcError, StopIteration) as error:
            raise self._messages.stream_failed(error) from None
        return self._messages.checked(response)

    def open(self, model="", memory=None, expected_version=0, _kind=DecodeSession):
        """Opens a session on `model` ("" = the default model). memory: an encoder output
        [S, d] the session attends over (cross-attention) instead of its own rows.
        expected_version: 0 = any, else FAILED_PRECONDITION unless that version is served."""
        request = self._messages.open_request(model, memory, expected_version)
        return self._messages.opened(self, self._exchange(request), _kind)

    def step_all(self, items):
        """Appends rows to several sessions in one message: items is a list of (session, rows),
        rows [T, d] or one [d] row. Returns the outputs in order, each in its rows' shape. If an
        item fails, raises its AttnserveError (the first in order) with `.results`: every item's
        output or AttnserveError; the other items were applied."""
        request, shapes = self._messages.step_request(items)
        return self._messages.stepped(self._exchange(request), shapes)

    def close_sessions(self, sessions):
        """Closes `sessions` (of this stream) in one message. On a stream that failed or ended,
        the server has freed them already: they are only marked closed."""
        sessions = [s for s in sessions if not s.closed]
        if self._messages.error is not None or self._ended:
            for session in sessions:
                session.closed = True
        elif sessions:
            self._messages.closed(self._exchange(self._messages.close_request(sessions)),
                                  sessions)

    def close(self):
        """Ends the stream (its open sessions end with it)."""
        if not self._ended:
            self._ended = True
            self._requests.put(_END)
            if self._messages.error is None:
                try:
                    for _ in self._responses:
                        pass
                except grpc.RpcError:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _OwnStreamSession(DecodeSession):
    """Client.decode()'s session: it has a stream of its own, ended when it closes."""

    def close(self):
        try:
            super().close()
        finally:
            self._stream.close()


class AsyncDecodeStream:
    """AsyncClient.decode_stream()'s stream: any number of coroutines of one loop may have
    messages in flight; answers are matched to them by request_id. Use `async with`, or call
    `await close()`."""

    def __init__(self, stub, timeout_s, wire_dtype, tls):
        self._messages = _Messages(wire_dtype, tls)
        self._call = stub.Decode(timeout=timeout_s)
        self._waiting = {}  # request_id -> future of its response
        self._writing = asyncio.Lock()  # gRPC takes one write at a time on a call
        self._reader = None
        self._ended = False

    async def _read_answers(self):
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    failure = self._messages.stream_failed(None)
                    break
                future = self._waiting.pop(response.request_id, None)
                if future is not None and not future.done():
                    future.set_result(response)
        except grpc.RpcError as error:
            failure = self._messages.stream_failed(error)
        except asyncio.CancelledError:
            failure = AttnserveError(grpc.StatusCode.CANCELLED, "decode stream: closed")
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(failure)
        self._waiting.clear()

    async def _exchange(self, request):
        if self._messages.error is not None:
            raise self._messages.error
        if self._ended:
            raise ValueError("decode stream: the stream is closed")
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read_answers())
        future = asyncio.get_running_loop().create_future()
        self._waiting[request.request_id] = future
        try:
            async with self._writing:
                await self._call.write(request)
        except grpc.RpcError as error:
            self._waiting.pop(request.request_id, None)
            raise self._messages.stream_failed(error) from None
        except BaseException:
            self._waiting.pop(request.request_id, None)
            raise
        return self._messages.checked(await future)

    async def open(self, model="", memory=None, expected_version=0, _own_stream=False):
        """As DecodeStream.open, returning an AsyncDecodeSession."""
        request = self._messages.open_request(model, memory, expected_version)
        session = self._messages.opened(self, await self._exchange(request), DecodeSession)
        return AsyncDecodeSession(session, _own_stream)

    async def step_all(self, items):
        """As DecodeStream.step_all."""
        items = [(getattr(s, "_session", s), rows) for s, rows in items]
        request, shapes = self._messages.step_request(items)
        return self._messages.stepped(await self._exchange(request), shapes)

    async def close_sessions(self, sessions):
        sessions = [getattr(s, "_session", s) for s in sessions]
        sessions = [s for s in sessions if not s.closed]
        if self._messages.error is not None or self._ended:
            for session in sessions:
                session.closed = True
        elif sessions:
            response = await self._exchange(self._messages.close_request(sessions))
            self._messages.closed(response, sessions)

    async def close(self):
        if self._ended:
            return
        self._ended = True
        if self._messages.error is None:
            try:
                async with self._writing:
                    await self._call.done_writing()
            except grpc.RpcError:
                pass
        if self._reader is not None:
            try:
                await self._reader
            except Exception:  # noqa: BLE001 - the reader reports through its futures
                pass
        else:
            self._call.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False


class AsyncDecodeSession:
    """DecodeSession's asyncio twin: prefill, step and close are coroutines."""

    def __init__(self, session, own_stream=False):
        self._session = session
        self._own_stream = own_stream
        self.tag, self.model, self.version = session.tag, session.model, session.version

    @property
    def closed(self):
        return self._session.closed

    async def prefill(self, rows):
        return (await self._session._stream.step_all([(self._session, rows)]))[0]

    async def step(self, row):
        return (await self._session._stream.step_all([(self._session, row)]))[0]

    async def close(self):
        try:
            await self._session._stream.close_sessions([self._session])
        finally:
            if self._own_stream:
                await self._session._stream.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False
