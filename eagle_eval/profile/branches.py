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
Chains that reach the same node (row, context, parent, token) share it: `shared_nodes` within one call,
`KnownNodes` across calls (p depends on the tokens alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.models.target import Target, TargetError
from eagle_eval.profile.run_lengths import rank_in_row
from eagle_eval.rules.filters import target_probs

PROB_ELEMENTS = 1 << 25          # logits entries turned into probabilities at once (memory bound)


def probs_at(logits: torch.Tensor, tokens: torch.Tensor, decoding, rows: torch.Tensor | None = None) -> torch.Tensor:
    """logits [L, V] (any float dtype), tokens [N, M] (target ids, -1 = nothing asked) -> [N, M] float32:
    p(token) with p = target_probs(logits[rows[n]]) (rows [N]; default: row n), 0 where nothing was asked.
    A bounded number of rows is turned into probabilities at a time, each distinct row once."""
    v = logits.shape[-1]
    n = tokens.shape[0]
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=logits.device)
    if n == 0 or tokens.numel() == 0:
        return out
    tokens = tokens.to(logits.device)
    rows = torch.arange(n, device=logits.device) if rows is None else rows.to(logits.device)
    distinct, which = torch.unique(rows, return_inverse=True)                       # which: entry -> distinct row
    order = torch.argsort(which, stable=True)
    bounds = torch.searchsorted(which[order], torch.arange(0, distinct.numel() + 1, device=rows.device)).tolist()
    step = max(1, PROB_ELEMENTS // v)
    for i in range(0, distinct.numel(), step):
        entries = order[bounds[i]: bounds[min(i + step, distinct.numel())]]
        ask = tokens[entries]
        asked = ask >= 0
        if not bool(asked.any()):
            continue
        p = target_probs(logits[distinct[i: i + step]], decoding)
        out[entries] = p[which[entries] - i].gather(-1, ask.clamp(min=0)) * asked
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


GROUP_OVERHEAD_TOKENS = 128     # what one more forward costs, in padded query tokens (row grouping)


class BranchCache:
    """The pass's KV cache of B rows, extended by branch nodes call after call: a node attends to the
    sequence positions 0..context_end of its row and to its ancestors among the nodes appended so far (an
    earlier call's or its own call's). `close()` rolls the cache back to the sequence. Padding nodes:
    context_end -1 (they attend to position 0). Each call runs the rows that have nodes in groups of similar
    counts (padding is what a group's longest row sets), each group on a copy of its rows' cache whose new
    entries are then written back (the other rows get masked-out entries there)."""

    def __init__(self, target: Target, cache, seq_len: int):
        if Target.cache_len(cache) != seq_len:
            raise RuntimeError(f"BranchCache: the cache holds {Target.cache_len(cache)} positions, not {seq_len}")
        self.target, self.cache, self.seq_len = target, cache, seq_len
        self.batch = cache.layers[0].keys.shape[0]
        self.parents: torch.Tensor | None = None                       # [B, appended] global parent columns

    @property
    def appended(self) -> int:
        return 0 if self.parents is None else self.parents.shape[1]

    def run(self, rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, context_end: torch.Tensor,
            parents: torch.Tensor, consume, chunk_tokens: int = 4096) -> int:
        """Append nodes [R, n] to `rows` [R] (parents: global columns, -1 = none), in chunks of columns:
        consume(lo, hi, logits [R, hi - lo, V]) per chunk. Returns the global column of the first node."""
        r, n = tokens.shape
        first = self.appended
        whole = r == self.batch and bool((rows == torch.arange(r, device=rows.device)).all())
        cache = self.cache if whole else _rows_cache(self.target, self.cache, rows)
        grown = torch.full((self.batch, n), -1, dtype=torch.long, device=parents.device)
        grown[rows] = parents
        self.parents = grown if self.parents is None else torch.cat([self.parents, grown], dim=1)
        mine = self.parents[rows]                                                       # [R, appended]
        width = max(1, chunk_tokens // max(r, 1))
        seq_pos = torch.arange(self.seq_len, device=tokens.device)
        dtype = self.target.model.dtype
        for lo in range(0, n, width):
            hi = min(n, lo + width)
            own = _ancestor_rows(mine[:, : first + hi], first + lo, first + hi)          # [R, c, first + hi]
            ends = context_end[:, lo:hi]
            seq = seq_pos[None, None, :] <= ends[..., None]                              # [R, c, W]
            seq[..., 0] |= ends < 0
            allowed = torch.cat([seq, own], dim=-1)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]          # [R, 1, c, W + first + hi]
            consume(lo, hi, self.target.forward(tokens[:, lo:hi], cache, position_ids=positions[:, lo:hi],
                                                attention_mask=mask, upcast=False))
        if not whole:
            _write_back(self.cache, cache, rows, n)
        return first

    def probs(self, branches: Branches, decoding, chunk_tokens: int = 4096,
              local_parents: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `branches` -> (p(asked) [B, Q, M], the global column of each node [B, Q]). Each row's real
        nodes come first; parents: indices in this call's list of the row (local_parents), else global
        columns of earlier calls."""
        counts = (branches.context_end >= 0).sum(1)
        out = torch.zeros(branches.asked.shape, dtype=torch.float32, device=branches.asked.device)
        cols = torch.full(branches.tokens.shape, -1, dtype=torch.long, device=branches.tokens.device)
        for rows, q in _groups(counts.tolist()):
            rows = torch.tensor(rows, device=branches.tokens.device)
            base = self.appended
            parents = branches.parents[rows, :q]
            if local_parents:
                parents = torch.where(parents >= 0, parents + base, parents)
            asked = branches.asked[rows, :q]

            def consume(lo, hi, logits, rows=rows, asked=asked):
                a = asked[:, lo:hi]
                got = probs_at(logits.reshape(-1, logits.shape[-1]), a.reshape(-1, a.shape[-1]), decoding)
                out[rows, lo:hi] = got.reshape(a.shape).to(out.device)
            self.run(rows, branches.tokens[rows, :q], branches.positions[rows, :q], branches.context_end[rows, :q],
                     parents, consume, chunk_tokens)
            cols[rows, :q] = base + torch.arange(q, device=cols.device)
        return out, cols

    def close(self) -> None:
        Target.rollback(self.cache, self.seq_len)


def _groups(counts: list[int]) -> list[tuple[list[int], int]]:
    """Rows with nodes grouped to bound padding: [(rows, their longest count)], contiguous runs of the rows
    sorted by count, minimising sum(rows * longest) + GROUP_OVERHEAD_TOKENS per group (exact DP).

    >>> _groups([300, 0, 2, 290, 1]), _groups([30, 0, 2, 29, 1])
    ([([0, 3], 300), ([2, 4], 2)], [([0, 2, 3, 4], 30)])
    """
    order = sorted((i for i, c in enumerate(counts) if c > 0), key=lambda i: -counts[i])
    n = len(order)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):                    # best[j]: cost of the first j rows; group = order[i:j]
        for i in range(j):
            cost = best[i] + (j - i) * counts[order[i]] + GROUP_OVERHEAD_TOKENS
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], n
    while j > 0:
        i = cut[j]
        out.append((sorted(order[i:j]), counts[order[i]]))
        j = i
    return out[::-1]


def _layers(cache):
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise TargetError("the profile at temperature > 0 runs drafts off the continuation on the target's KV "
                              "cache and needs full-attention KV layers; this target has sliding-window layers: "
                              "profile it at temperature 0")
        yield layer


def _rows_cache(target: Target, cache, rows: torch.Tensor):
    """A new cache holding copies of `rows` of `cache` (every layer's keys and values, through the cache's
    public `update`)."""
    sub = target.new_cache()
    for i, layer in enumerate(_layers(cache)):
        sub.update(layer.keys.index_select(0, rows), layer.values.index_select(0, rows), i)
    return sub


def _write_back(cache, sub, rows: torch.Tensor, n: int) -> None:
    """Append the last n entries of `sub` (rows `rows`) to every layer of `cache`; other rows get zeros."""
    for full, part in zip(_layers(cache), sub.layers):
        for name in ("keys", "values"):
            old, new = getattr(full, name), getattr(part, name)[..., -n:, :]
            grown = torch.zeros(*old.shape[:-2], n, old.shape[-1], dtype=old.dtype, device=old.device)
            grown[rows] = new
            setattr(full, name, torch.cat([old, grown], dim=-2))


def _ancestor_rows(parents: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """[B, hi - lo, hi] bool: node lo + i may attend to node j (j is lo + i or one of its ancestors; parents
    [B, >= hi] global columns, -1 = none)."""
    b = parents.shape[0]
    cur = torch.arange(lo, hi, device=parents.device)[None].expand(b, -1).clone()      # [B, n]
    allowed = torch.zeros(b, hi - lo, hi + 1, dtype=torch.bool, device=parents.device)  # column hi: a sink
    while True:
        ok = cur >= 0
        if not bool(ok.any()):
            return allowed[..., :hi]
        allowed.scatter_(2, torch.where(ok, cur, hi)[..., None], True)
        cur = torch.where(ok, parents.gather(1, cur.clamp(min=0)), cur)


@torch.no_grad()
def branch_probs(target: Target, cache, seq_len: int, branches: Branches, decoding,
                 chunk_tokens: int = 4096) -> torch.Tensor:
    """p(asked token) [B, Q, M] at each branch node's output (the distribution after its context, its
    ancestors and itself), all nodes in one `BranchCache` call; the cache is rolled back afterwards."""
    if branches.size == 0:
        return torch.zeros(branches.asked.shape, dtype=torch.float32, device=branches.asked.device)
    extended = BranchCache(target, cache, seq_len)
    try:
        return extended.probs(branches, decoding, chunk_tokens)[0]
    finally:
        extended.close()


class KnownNodes:
    """The branch nodes run so far for a pass: (row, context_end, parent column, token) -> (its column, {asked
    token: p}). A chain that reaches a known node asking a known token reads it there (a later start that left
    the continuation at the same place with the same drafts); a known node asked a new token runs again."""

    def __init__(self):
        self.nodes: dict[tuple, tuple[int, dict]] = {}

    def lookup(self, *keys) -> tuple[torch.Tensor, torch.Tensor]:
        """keys: row, context_end, parent, token, ask [N] -> (p [N] float64, column [N]; -1 = not known)."""
        device = keys[0].device
        val, col = [0.0] * keys[0].shape[0], [-1] * keys[0].shape[0]
        for n, (*key, ask) in enumerate(zip(*(k.tolist() for k in keys))):
            hit = self.nodes.get(tuple(key))
            if hit is not None and ask in hit[1]:
                val[n], col[n] = hit[1][ask], hit[0]
        return (torch.tensor(val, dtype=torch.float64, device=device),
                torch.tensor(col, dtype=torch.long, device=device))

    def add(self, *keys_ask_val_col) -> None:
        for *key, ask, val, col in zip(*(k.tolist() for k in keys_ask_val_col)):
            self.nodes.setdefault(tuple(key), (col, {}))[1][ask] = val


def group_ids(*columns: torch.Tensor) -> torch.Tensor:
    """Equal rows of the columns [N] each -> one id, ids 0..G-1 in lexicographic order of the rows (1-D uniques
    of mixed-radix codes, each below N^2: no overflow, and faster than torch.unique over rows).

    >>> group_ids(torch.tensor([1, 0, 1, 0]), torch.tensor([5, 9, 5, 2])).tolist()
    [2, 1, 2, 0]
    """
    ids = torch.zeros_like(columns[0])
    for col in columns:
        values, rank = torch.unique(col, return_inverse=True)
        ids = torch.unique(ids * values.shape[0] + rank, return_inverse=True)[1]
    return ids


def shared_nodes(rows: int, bb, token, position, context_end, parent, ask) -> tuple[Branches, torch.Tensor,
                                                                                     torch.Tensor]:
    """One branch level for N chains (row bb, node token at position over context_end / under parent, asking
    `ask`) -> (Branches with each distinct (row, context_end, parent, token) once and each of its distinct
    asked tokens once, each chain's node slot [N], each chain's asked slot [N])."""
    inv = group_ids(bb, context_end, parent, token)                                 # rows ascending
    count = int(inv.max()) + 1
    nodes = torch.zeros(count, 5, dtype=torch.long, device=bb.device)
    nodes[inv] = torch.stack([bb, context_end, parent, token, position], dim=1)
    slot = rank_in_row(nodes[:, 0], rows)
    ask_inv = group_ids(inv, ask)
    pairs = torch.zeros(int(ask_inv.max()) + 1, 2, dtype=torch.long, device=bb.device)
    pairs[ask_inv] = torch.stack([inv, ask], dim=1)
    ask_slot = rank_in_row(pairs[:, 0], count)
    q, m = int(slot.max()) + 1, int(ask_slot.max()) + 1
    r = nodes[:, 0]

    def grid(values, fill):
        out = torch.full((rows, q), fill, dtype=torch.long, device=bb.device)
        out[r, slot] = values
        return out
    asked = torch.full((rows, q, m), -1, dtype=torch.long, device=bb.device)
    asked[r[pairs[:, 0]], slot[pairs[:, 0]], ask_slot] = pairs[:, 1]
    branches = Branches(tokens=grid(nodes[:, 3], 0), positions=grid(nodes[:, 4], 0),
                        context_end=grid(nodes[:, 1], -1), parents=grid(nodes[:, 2], -1), asked=asked)
    return branches, slot[inv], ask_slot[ask_inv]
