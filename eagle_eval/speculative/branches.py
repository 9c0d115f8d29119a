"""The target off the teacher-forced sequence: its processed probabilities after draft tokens the
continuation does not hold, from the KV cache of the one teacher-forced pass.

Contract: at temperature > 0 the expectation of a cycle needs p_i after the committed sequence plus
d_1..d_{i-1} (EAGLE3.md section 8). Where the drafts follow the continuation, that is the teacher-forced
pass's own row (`probs_at`); where they leave it, `branch_probs` runs the left drafts as extra query
tokens over the pass's cache: each one attends to the sequence up to its `context_end` and to its own
branch ancestors, at the position it would have in the loop (tree attention, the mask of
`Target.tree_mask` generalised to a batch), and returns p(token) for the tokens asked at it. The cache
is rolled back to the sequence afterwards. Probabilities are `sampling.target_probs` (the accept
rule's engine order), read for the requested tokens only, a bounded number of rows at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.models.target import Target
from eagle_eval.speculative.sampling import target_probs

PROB_ELEMENTS = 1 << 25          # logits entries turned into probabilities at once (memory bound)


def probs_at(logits: torch.Tensor, tokens: torch.Tensor, decoding, rows: torch.Tensor | None = None) -> torch.Tensor:
    """logits [L, V] (any float dtype), tokens [N, M] (target ids, -1 = nothing asked) -> [N, M] float32:
    p(token) with p = target_probs(logits[rows[n]]) (rows [N]; default: row n), 0 where nothing was asked.
    A bounded number of rows is turned into probabilities at a time."""
    v = logits.shape[-1]
    n = tokens.shape[0]
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=logits.device)
    if n == 0 or tokens.numel() == 0:
        return out
    tokens = tokens.to(logits.device)
    step = max(1, PROB_ELEMENTS // v)
    for i in range(0, n, step):
        ask = tokens[i: i + step]
        asked = ask >= 0
        if not bool(asked.any()):
            continue
        block = logits[i: i + step] if rows is None else logits[rows[i: i + step].to(logits.device)]
        out[i: i + step] = target_probs(block, decoding).gather(-1, ask.clamp(min=0)) * asked
    return out


@dataclass
class Branches:
    """Query tokens off the sequence, per row of the batch (padded to Q; `parents` before children).

    tokens, positions, context_end, parents [B, Q]; asked [B, Q, M]. A node attends to the sequence
    positions 0..context_end and to its ancestors in this row's list (parents: index in the list, -1 = it
    hangs from the sequence). Padding: context_end = -1 (nothing asked there)."""
    tokens: torch.Tensor
    positions: torch.Tensor
    context_end: torch.Tensor
    parents: torch.Tensor
    asked: torch.Tensor

    @classmethod
    def from_rows(cls, rows: list[list[tuple]], asked_width: int, device) -> "Branches":
        """rows[b] = [(token, position, context_end, parent, [asked tokens]), ...]."""
        q = max([len(r) for r in rows] + [0])
        pad = (0, 0, -1, -1, [])
        cols = list(zip(*[row + [pad] * (q - len(row)) for row in rows])) if q else []
        if not cols:
            empty = torch.zeros(len(rows), 0, dtype=torch.long, device=device)
            return cls(empty, empty, empty, empty, torch.zeros(len(rows), 0, asked_width, dtype=torch.long,
                                                              device=device))
        fields = [[[node[f] for node in col] for col in cols] for f in range(4)]             # [f][Q][B]
        tokens, positions, context_end, parents = (torch.tensor(x, dtype=torch.long, device=device).T for x in fields)
        asked = torch.tensor([[node[4] + [-1] * (asked_width - len(node[4])) for node in col] for col in cols],
                             dtype=torch.long, device=device).transpose(0, 1)
        return cls(tokens, positions, context_end, parents, asked)

    @property
    def size(self) -> int:
        return self.tokens.shape[1]


def _ancestor_rows(parents: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """[B, hi - lo, hi] bool: query lo + i may attend to branch node j (j is i or one of its ancestors)."""
    b = parents.shape[0]
    idx = torch.arange(lo, hi, device=parents.device)[None].expand(b, -1)              # [B, n]
    allowed = torch.zeros(b, hi - lo, hi, dtype=torch.bool, device=parents.device)
    cur = idx.clone()
    while True:
        ok = cur >= 0
        if not bool(ok.any()):
            return allowed
        allowed.scatter_(2, cur.clamp(min=0)[..., None], ok[..., None])
        cur = torch.where(ok, parents.gather(1, cur.clamp(min=0)), cur)


@torch.no_grad()
def branch_probs(target: Target, cache, seq_len: int, branches: Branches, decoding,
                 chunk_tokens: int = 4096) -> torch.Tensor:
    """p(asked token) [B, Q, M] at each branch node's output (the distribution after its context, its
    ancestors and itself). `cache` holds the teacher-forced sequence (seq_len positions per row, padding
    included); the branch nodes are appended in chunks of columns (KV kept until the end, so a node may
    hang from one of an earlier chunk), then the cache is rolled back to seq_len."""
    b, q = branches.tokens.shape
    out = torch.zeros(branches.asked.shape, dtype=torch.float32, device=branches.asked.device)
    if q == 0:
        return out
    if Target.cache_len(cache) != seq_len:
        raise RuntimeError(f"branch_probs: the cache holds {Target.cache_len(cache)} positions, not {seq_len}")
    width = max(1, chunk_tokens // max(b, 1))
    dtype = target.model.dtype
    seq_pos = torch.arange(seq_len, device=branches.tokens.device)
    try:
        for lo in range(0, q, width):
            hi = min(q, lo + width)
            own = _ancestor_rows(branches.parents, lo, hi)                                 # [B, n, hi]
            ends = branches.context_end[:, lo:hi]
            seq = seq_pos[None, None, :] <= ends[..., None]                                # [B, n, W]
            seq[..., 0] |= ends < 0                                  # padding rows attend to one position
            allowed = torch.cat([seq, own], dim=-1)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]            # [B, 1, n, W + hi]
            logits = target.forward(branches.tokens[:, lo:hi], cache, position_ids=branches.positions[:, lo:hi],
                                    attention_mask=mask, upcast=False)                     # [B, n, V]
            asked = branches.asked[:, lo:hi]
            got = probs_at(logits.reshape(-1, logits.shape[-1]), asked.reshape(-1, asked.shape[-1]), decoding)
            out[:, lo:hi] = got.reshape(asked.shape).to(out.device)
    finally:
        Target.rollback(cache, seq_len)
    return out
