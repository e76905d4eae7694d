"""attnserve: a Python client for attnserve's attention service.

    import numpy as np, attnserve
    with attnserve.Client("127.0.0.1:50051") as client:
        y = client.attend(np.random.rand(2, 16, 512).astype(np.float32), causal=True)

Client (blocking) and AsyncClient (asyncio) take and return numpy arrays; errors raise
AttnserveError with the gRPC code and message. Client.decode() / decode_stream() open decoding
sessions that keep their keys and values on the server (attnserve.decoding). attnserve.torch
holds RemoteMultiheadAttention and RemoteCausalDecoder. reuse_large_allocations() makes calls
with large tensors cheaper for the whole process (attnserve.allocator).
"""
from importlib import metadata as _metadata

from attnserve.allocator import reuse_large_allocations
from attnserve.client import AsyncClient, AttnserveError, Client, ModelInfo
from attnserve.decoding import AsyncDecodeSession, AsyncDecodeStream, DecodeSession, DecodeStream

try:
    __version__ = _metadata.version("attnserve")  # setup.py takes it from CMakeLists.txt
except _metadata.PackageNotFoundError:  # imported from the source tree, not installed
    __version__ = "unknown"

__all__ = ["AsyncClient", "AsyncDecodeSession", "AsyncDecodeStream", "AttnserveError", "Client",
           "DecodeSession", "DecodeStream", "ModelInfo", "reuse_large_allocations"]
