"""Fixed-capacity KV caches with one length per row, for the batched and the graph-captured loops.

Contract: a cache holds B rows of `capacity` slots; row b's valid entries are slots 0..lengths[b]-1
(`lengths` [B] long, on the device). A forward over T new tokens, opened with `begin(base, intra)`,
writes row b's token t at slot base[b] + t and attends through the [B, 1, T, capacity] mask `begin`
returns: slot s is visible to token t when s < base[b], or s = base[b] + j with intra[t, j] (causal
for a chain, the ancestor mask for a tree). Rolling back is setting `lengths`: nothing is copied,
slots past a length are garbage, masked out, and overwritten by the next forward. No shape depends on
the data, so a forward over these caches can be captured once as a CUDA graph and replayed.

`RowCache` is what transformers' attention layers call `update(key, value, layer_idx)` on (duck-typed,
not a transformers `Cache`: a 4D mask passed to the model is used as given, masking_utils
`_preprocess_mask_arguments`). transformers' own StaticCache is not used: in 5.x its layers write at
their own `cumulative_length` counter rather than at the positions passed in (cache_utils
`StaticLayer.update`), and it has one length for the whole batch. `RowDraftCache` is the draft
head's, written by `loop/batched.py`.
"""

from __future__ import annotations

import torch


def block_slots(base: torch.Tensor, width: int) -> torch.Tensor:
    """base [B] -> slots [B, width] = base[b] + 0..width-1."""
    return base[:, None] + torch.arange(width, device=base.device)


def block_visible(base: torch.Tensor, width: int, capacity: int, intra: torch.Tensor | None) -> torch.Tensor:
    """bool [B, 1, width, capacity]: slot s is visible to block token t (see the module contract).
    intra: [width, width] or [B, width, width] bool, None = causal."""
    b = base.shape[0]
    s = torch.arange(capacity, device=base.device)
    rel = s[None, :] - base[:, None]                                           # [B, L]: slot - base
    if intra is None:
        t = torch.arange(width, device=base.device)
        inside = (rel[:, None, :] >= 0) & (rel[:, None, :] <= t[None, :, None])  # [B, T, L]
    else:
        intra = intra.to(base.device).expand(b, width, width)
        in_block = (rel >= 0) & (rel < width)                                  # [B, L]
        picked = intra.gather(2, rel.clamp(0, width - 1)[:, None, :].expand(b, width, capacity))
        inside = picked & in_block[:, None, :]
    return ((rel < 0)[:, None, :] | inside)[:, None]


class RowCache:
    """The target's KV cache: per layer keys/values [B, heads, capacity, d] (allocated at the first
    write, any head count and width: MLA latents are single-head), one length per row."""

    is_compileable = False            # transformers reads it (masks); the mask here is always given

    def __init__(self, batch: int, capacity: int, device):
        self.batch, self.capacity, self.device = batch, capacity, torch.device(device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._rows = slice(None)
        self._slots: torch.Tensor | None = None       # [B', T] slots of the forward in flight

    def begin(self, width: int, dtype, intra: torch.Tensor | None = None, depths: torch.Tensor | None = None,
              rows: slice | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Open a forward of `width` tokens per row at base = lengths (rows: a slice or a [B'] index
        tensor, for a prefill of some rows only). Returns (position ids [B', T] = base + depths (default
        0..T-1), additive mask [B', 1, T, capacity] in `dtype`)."""
        self._rows = rows if rows is not None else slice(None)
        base = self.lengths[self._rows]
        self._slots = block_slots(base, width)
        depths = torch.arange(width, device=self.device) if depths is None else depths.to(self.device)
        visible = block_visible(base, width, self.capacity, intra)
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.device)
        return base[:, None] + depths, mask.masked_fill(~visible, torch.finfo(dtype).min)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """transformers' cache call: key/value [B', heads, T, d] of layer `layer_idx` -> the whole
        row buffers [B', heads, capacity, d] (the mask hides what is not valid)."""
        if layer_idx == len(self.keys):
            shape = lambda x: (self.batch, x.shape[1], self.capacity, x.shape[3])   # noqa: E731
            self.keys.append(torch.zeros(shape(key), dtype=key.dtype, device=key.device))
            self.values.append(torch.zeros(shape(value), dtype=value.dtype, device=value.device))
        slots = self._slots.to(key.device)           # a layer accelerate placed elsewhere (a no-op otherwise)
        return (_write_rows(self.keys[layer_idx], self._rows, slots, key),
                _write_rows(self.values[layer_idx], self._rows, slots, value))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Never needed (the loops pass position ids); the capacity, without a device read."""
        return self.capacity

    def keep(self, path: torch.Tensor, base: torch.Tensor) -> None:
        """After a tree verify written at `base` [B]: move each row's accepted nodes path [B, P] (tree
        indices, root first, padded with any index) to slots base + 0..P-1. Lengths are the caller's."""
        src = base[:, None] + path
        dst = block_slots(base, path.shape[1])
        for buf in self.keys + self.values:
            s, d = src.to(buf.device), dst.to(buf.device)
            picked = buf.gather(2, s[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3]))
            _write(buf, d, picked)


class RowDraftCache:
    """The draft head's KV cache: keys/values [B, kv_heads, capacity, d], one length per row. A multi-layer head
    writes each layer above the first into its own buffers (`layer(i)`), at the same slots, under these lengths."""

    def __init__(self, batch: int, capacity: int, device):
        self.batch, self.capacity, self.device = batch, capacity, torch.device(device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.upper: list[RowDraftCache] = []

    def layer(self, i: int) -> "RowDraftCache":
        """Layer i's buffers (0: this one); the lengths are this cache's."""
        if i == 0:
            return self
        while len(self.upper) < i:
            self.upper.append(RowDraftCache(self.batch, self.capacity, self.device))
            self.upper[-1].lengths = self.lengths
        return self.upper[i - 1]

    def write(self, k: torch.Tensor, v: torch.Tensor, base: torch.Tensor,
              rows: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v [B', kv, T, d] at slots base[b] + t of `rows` (a slice or an index tensor) -> those rows'
        whole buffers."""
        if self.keys is None:
            self.keys = torch.zeros(self.batch, k.shape[1], self.capacity, k.shape[3], dtype=k.dtype, device=k.device)
            self.values = torch.zeros(self.batch, v.shape[1], self.capacity, v.shape[3], dtype=v.dtype, device=v.device)
        slots = block_slots(base, k.shape[2])
        return _write_rows(self.keys, rows, slots, k), _write_rows(self.values, rows, slots, v)


def _write(buf: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """buf [B, h, L, d] <- x [B, h, T, d] at slots [B, T] (in place; capturable: no host read)."""
    buf.scatter_(2, slots[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3]), x)


def _write_rows(buf: torch.Tensor, rows: slice | torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Rows `rows` of buf <- x at slots (see `_write`) -> those rows' buffers. A slice writes through a
    view (capturable); an index tensor (a prefill of rows that are not adjacent) through a copy put back."""
    if isinstance(rows, slice):
        part = buf[rows]
        _write(part, slots, x)
        return part
    rows = rows.to(buf.device)
    part = buf.index_select(0, rows)
    _write(part, slots, x)
    buf.index_copy_(0, rows, part)
    return part
