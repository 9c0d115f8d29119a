"""Sampled drafts (vllm-probabilistic, sglang-rs): P(A >= i) of every start, exactly at i = 1 and by an
unbiased estimate with its variance deeper, from the one teacher-forced pass.

Contract: d_i ~ q_i = softmax(draft logits / T) (rules/filters.py `draft_probs`; 0 outside the draft
vocab) is accepted with min(1, p_i(d_i) / q_i(d_i)), so given the drafts so far, P(accept d_i and d_i = x)
= min(p_i(x), q_i(x)) =: w_i(x), with mass alpha_i = sum_x w_i(x) (expected.overlap). Hence
P(A >= k) = sum over x_1..x_{k-1} of prod_{i<k} w_i(x_i) * alpha_k(x_<k) = E[prod_{i<=k} alpha_i] when each x_i
is drawn from w_i / alpha_i given x_<i. `rollout_expectations` draws M such paths per start (a rollout: the
draft continues from x_i, the target reads p_{i+1} after it, both for every start at once: the draft
through `unroll.unroll_chains` with a feed, the target as branch tokens over the pass's cache) and returns
the mean of prod alpha and its variance, the sample variance over the M paths / M (docs/sampling.md).
alpha_1 needs no path: the estimate is exact there (variance 0). Draws: one generator per sequence,
`prompt_generator(seed, prompt_id + "/rollouts", sample)`, independent of the continuation's own.
"""

from __future__ import annotations

import torch

from eagle_eval.profile.branches import BranchCache
from eagle_eval.profile.unroll import unroll_chains
from eagle_eval.rules.filters import draft_probs, prompt_generator, target_probs

ROLLOUT_STREAM = "/rollouts"          # suffix of the prompt id that seeds the rollouts' generator


def _sample(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [N, V] >= 0 (not normalised), u [N] -> index [N] by inverse CDF (0 where all weights are 0)."""
    cdf = weights.double().cumsum(-1)
    pick = torch.searchsorted(cdf, (u.to(cdf.device) * cdf[:, -1])[:, None], right=True)[:, 0]
    return torch.where(cdf[:, -1] > 0, pick.clamp(max=weights.shape[-1] - 1), torch.zeros_like(pick))


class _Rollout:
    """The feed of `unroll_chains`: at step j, p_j (the pass's row for j = 1, else the target over x_{j-1}),
    q_j (the draft's step j-1 at column p + j - 1), alpha_j, and x_j ~ w_j / alpha_j for every start."""

    def __init__(self, spec, cache, width, logits, ids, starts, max_new, k_max, decoding, generators, m,
                 chunk_tokens):
        self.spec, self.cache, self.width, self.logits, self.ids = spec, cache, width, logits, ids
        self.starts, self.max_new, self.k_max, self.decoding = starts, max_new, k_max, decoding
        self.generators, self.m, self.chunk_tokens = generators, m, chunk_tokens
        self.extended = BranchCache(spec.target, cache, width)
        b = ids.shape[0]
        device = ids.device
        head = spec.head
        self.vocab = head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=device))   # [V_d]
        self.q_cols = max_new * m                                            # queries per row: (rollout, start)
        k_idx = torch.arange(max_new, device=device)
        self.pairs = torch.stack([t - 1 + k_idx for t in starts])            # [B, P] start pairs p
        self.alpha = torch.zeros(b, m, max_new, k_max, dtype=torch.float64, device=device)
        self.x = None                                                       # [B, M, P] x_{j-1}
        self.base = ids[:, 1:].repeat_interleave(m, 0)                      # [B*M, W-1] true tokens (x_{q+1})

    def __call__(self, j: int, draft_logits: torch.Tensor) -> torch.Tensor:
        """Step j: alpha_j for every (rollout, start), x_j drawn (j < K); the embeddings of draft step j."""
        b, m, p, q = self.pairs.shape[0], self.m, self.max_new, self.q_cols
        u = torch.stack([torch.rand(m, p, generator=g, dtype=torch.float64) for g in self.generators]).view(b, q)
        alpha = torch.zeros(b, q, dtype=torch.float64, device=self.ids.device)
        x = torch.zeros(b, q, dtype=torch.long, device=self.ids.device)

        def consume(lo: int, hi: int, probs: torch.Tensor) -> None:
            """probs [B, n, V]: p_j of the columns lo..hi (column c = rollout * P + start)."""
            col = torch.arange(lo, hi, device=self.ids.device)
            rows = torch.arange(b, device=col.device)[:, None] * m + (col // p)[None]        # draft rows [B, n]
            z = draft_logits[rows, self.pairs[:, col % p] + j - 1]                       # q_j's logits [B, n, V_d]
            w = torch.minimum(probs.gather(-1, self.vocab.expand(b, hi - lo, -1)), draft_probs(z, self.decoding))
            alpha[:, lo:hi] = w.sum(-1).double()
            if j < self.k_max:                                               # the last alpha needs no draw
                pick = _sample(w.reshape(-1, w.shape[-1]), u[:, lo:hi].reshape(-1)).view(b, hi - lo)
                x[:, lo:hi] = self.vocab[pick]

        if j == 1:                                                           # p_1: the pass's row at the root
            width = max(1, self.chunk_tokens // max(b, 1))
            for lo in range(0, q, width):
                col = torch.arange(lo, min(q, lo + width), device=self.ids.device)
                roots = self.pairs[:, col % p] + 1                                           # [B, n]
                logits = self.logits[torch.arange(b, device=col.device)[:, None], roots]
                consume(lo, lo + len(col), target_probs(logits, self.decoding).to(self.ids.device))
        else:
            self._target_step(j, consume)
        self.alpha[..., j - 1] = alpha.view(b, m, p)
        if j == self.k_max:
            return self.spec.embed(self.base)
        self.x = x.view(b, m, p)                                             # target ids
        tokens = self.base.clone()
        tokens.scatter_(1, (self.pairs + j).repeat_interleave(m, 0), self.x.reshape(b * m, p))   # step j at p + j
        return self.spec.embed(tokens)

    def _target_step(self, j: int, consume) -> None:
        """Append x_{j-1} of every (rollout, start) at position p + j, attending to the sequence up to the
        root (p + 1) and to its own x_1..x_{j-2} (the previous step's node of the same column); p_j of each
        chunk of columns goes to consume(lo, hi, probs [B, n, V])."""
        b, m, p, q = self.pairs.shape[0], self.m, self.max_new, self.q_cols
        cols = torch.arange(q, device=self.ids.device)[None].expand(b, q)
        parents = (self.extended.appended - q + cols) if j > 2 else torch.full_like(cols, -1)
        self.extended.run(torch.arange(b, device=self.ids.device), self.x.reshape(b, q),
                          (self.pairs + j)[:, None].expand(b, m, p).reshape(b, q),
                          (self.pairs + 1)[:, None].expand(b, m, p).reshape(b, q), parents,
                          lambda lo, hi, logits: consume(lo, hi, target_probs(logits, self.decoding).to(self.ids.device)),
                          self.chunk_tokens)


@torch.no_grad()
def rollout_expectations(spec, cache, width: int, logits: torch.Tensor, aux: torch.Tensor, ids: torch.Tensor,
                         starts: list[int], keys: list[tuple[str, int]], k_max: int, max_new: int, decoding,
                         rollouts: int, chunk_tokens: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """(estimate, variance) of P(A >= i), each [B, max_new, K] float64, for the sampled-draft rules.

    keys[b] = (prompt id, sample) of row b (its generator); the cache holds the rows' sequences (width
    positions) and is rolled back to them afterwards."""
    gens = [prompt_generator(decoding.seed, pid + ROLLOUT_STREAM, sample) for pid, sample in keys]
    feed = _Rollout(spec, cache, width, logits, ids, starts, max_new, k_max, decoding, gens, rollouts, chunk_tokens)
    m = rollouts
    try:
        # K + 1 steps: the feed of step K computes alpha_K; step K's own draft is never used
        unroll_chains(spec.head, aux[:, :-1].repeat_interleave(m, 0), spec.embed(ids[:, 1:]).repeat_interleave(m, 0),
                      k_max + 1, spec.position_offset, argmax_only=True, feed=feed)
    finally:
        feed.extended.close()
    paths = feed.alpha.cumprod(-1)                                                   # [B, M, P, K]
    estimate = paths.mean(1)
    variance = paths.var(1, unbiased=True) / m if m > 1 else torch.full_like(estimate, float("nan"))
    return estimate, variance
