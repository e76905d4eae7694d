"""attnserve: a Python client for attnserve's attention service.

    import numpy as np, attnserve
    with attnserve.Client("127.0.0.1:50051") as client:
        y = client.attend(np.random.rand(2, 16, 512).astype(np.float32), causal=True)

Client (blocking) and AsyncClient (asyncio) take and return numpy arrays; errors raise
AttnserveError with the gRPC code and message. attnserve.torch holds RemoteMultiheadAttention.
"""
from attnserve.client import AsyncClient, AttnserveError, Client, ModelInfo

__all__ = ["AsyncClient", "AttnserveError", "Client", "ModelInfo"]
