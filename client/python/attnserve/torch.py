"""RemoteMultiheadAttention: a drop-in torch.nn.MultiheadAttention computed by attnserve;
RemoteCausalDecoder: the same layer's causal self-attention, decoded incrementally.

The server holds the weights (export the local module with tools/export_torch.py); this module
holds none. Its forward has nn.MultiheadAttention's signature and returns the same values (to
float32 rounding): self-attention when key and value are the query, cross-attention when key and
value are one other tensor (attnserve computes K and V from the same memory). Masks follow
PyTorch's conventions (bool True = not allowed; float 0 / -inf added) and are sent as one
explicit mask; rows with every key masked are refused as PyTorch would give NaN for them.
Outputs and weights come back on the query's device and in its dtype, as nn.MultiheadAttention's
do (computed in float32 by the server). No gradients flow through the remote call.
"""
import numpy as np
import torch

from attnserve.client import Client


def _blocked(mask, name):
    """A bool tensor, True = may not attend, from PyTorch's bool or additive float mask."""
    if mask.dtype == torch.bool:
        return mask
    if not torch.is_floating_point(mask):
        raise TypeError(f"{name}: expected a bool or float mask, got {mask.dtype}")
    finite = torch.isfinite(mask)
    if bool((mask[finite] != 0).any()):
        raise ValueError(f"{name}: attnserve takes float masks of 0 and -inf only")
    return ~finite


class RemoteMultiheadAttention(torch.nn.Module):
    """nn.MultiheadAttention(embed_dim, num_heads, batch_first=...) served by `target`'s
    `model` ("" = the server's default). `client` may be shared (then `target` is ignored)."""

    def __init__(self, embed_dim, num_heads, target=None, model="", batch_first=False,
                 client=None, timeout_s=None):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.batch_first = batch_first
        self.model = model
        self._client = client if client is not None else Client(target, timeout_s=timeout_s)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if key is not value and not torch.equal(key, value):
            raise ValueError("key and value: attnserve takes one memory tensor for both; "
                             "pass the same tensor")
        unbatched = query.dim() == 2
        if unbatched:
            query, key = query.unsqueeze(1), key.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if not self.batch_first or unbatched:  # [L, N, E] -> [N, L, E]
            query, key = query.transpose(0, 1), key.transpose(0, 1)
        self_attention = key is query or torch.equal(key, query)
        batch, length, source = query.shape[0], query.shape[1], key.shape[1]

        blocked = torch.zeros(batch, length, source, dtype=torch.bool)
        explicit = False
        if attn_mask is not None:
            mask = _blocked(attn_mask.detach().cpu(), "attn_mask")
            if mask.dim() == 3:  # [N * num_heads, L, S]: attnserve's mask is per sequence
                mask = mask.view(batch, self.num_heads, length, source)
                if not bool((mask == mask[:, :1]).all()):
                    raise ValueError("attn_mask: attnserve takes one mask per sequence, "
                                     "not per head")
                mask = mask[:, 0]
            blocked = blocked | mask
            explicit = True
        if key_padding_mask is not None:
            padding = _blocked(key_padding_mask.detach().cpu(), "key_padding_mask")
            blocked = blocked | padding[:, None, :]
            explicit = True
        if explicit and bool(blocked.all(dim=-1).any()):
            raise ValueError("attn_mask / key_padding_mask: a query row may attend to no key")

        x = query.detach().cpu().float().numpy()
        memory = None if self_attention else key.detach().cpu().float().numpy()
        result = self._client.attend(
            x, memory=memory, causal=bool(is_causal),
            attn_mask=(~blocked).numpy() if explicit else None,
            return_weights=bool(need_weights), model=self.model)
        output, weights = result if need_weights else (result, None)

        # As nn.MultiheadAttention answers: on the query's device, in its dtype (the wire's
        # float32 rounded once, after the head average).
        like = dict(device=query.device, dtype=query.dtype)
        output = torch.from_numpy(np.ascontiguousarray(output)).to(**like)
        if not self.batch_first or unbatched:
            output = output.transpose(0, 1)
        if unbatched:
            output = output.squeeze(1)
        if weights is None:
            return output, None
        weights = torch.from_numpy(weights)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if unbatched:
            weights = weights.squeeze(0)
        return output, weights.to(**like)


class RemoteCausalDecoder(torch.nn.Module):
    """Causal self-attention of `model` computed incrementally by attnserve: one decoding session
    per sequence of the batch keeps the keys and values on the server, so each forward sends
    only the new rows. forward(x) takes the new rows — [N, T_new, E] with batch_first, else
    [T_new, N, E], or unbatched [T_new, E] — and returns their attention output in x's layout,
    dtype and device: what nn.MultiheadAttention over the whole sequence so far with a causal
    mask gives for those rows. The batch size stays fixed until reset(), which ends the
    sessions (the next forward starts new sequences). close() (or `with`) also ends the stream.
    No attention weights (the server's decode path does not return them), no gradients."""

    def __init__(self, embed_dim, target=None, model="", batch_first=False, client=None,
                 timeout_s=None):
        super().__init__()
        self.embed_dim = embed_dim
        self.batch_first = batch_first
        self.model = model
        self._own_client = client is None
        self._client = client if client is not None else Client(target)
        self._timeout_s = timeout_s
        self._stream = None
        self._sessions = []

    def forward(self, x):
        unbatched = x.dim() == 2
        rows = x.unsqueeze(0) if unbatched else (x if self.batch_first else x.transpose(0, 1))
        if rows.dim() != 3 or rows.shape[-1] != self.embed_dim:
            raise ValueError(f"x: expected [N, T, {self.embed_dim}] (or [T, N, ...], or "
                             f"[T, {self.embed_dim}]), got {tuple(x.shape)}")
        if self._sessions and len(self._sessions) != rows.shape[0]:
            raise ValueError(f"x: {rows.shape[0]} sequences, but this decoder holds "
                             f"{len(self._sessions)} until reset()")
        if self._stream is None:
            self._stream = self._client.decode_stream(self._timeout_s)
        while len(self._sessions) < rows.shape[0]:
            self._sessions.append(self._stream.open(self.model))
        values = rows.detach().cpu().float().numpy()
        outputs = self._stream.step_all(list(zip(self._sessions, values)))
        output = torch.from_numpy(np.stack(outputs)).to(device=x.device, dtype=x.dtype)
        if unbatched:
            return output.squeeze(0)
        return output if self.batch_first else output.transpose(0, 1)

    def reset(self):
        """Ends the sessions: the next forward starts new sequences."""
        sessions, self._sessions = self._sessions, []
        if self._stream is not None and sessions:
            self._stream.close_sessions(sessions)

    def close(self):
        """Ends the sessions and the stream (and the client, if this module made it)."""
        try:
            self.reset()
        finally:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
            if self._own_client:
                self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
