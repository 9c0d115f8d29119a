"""Sampled drafts (vllm-probabilistic, sglang-rs) from the one teacher-forced pass: P(A >= i) of every start,
exactly at i = 1 and by an importance-weighted estimate along the sampled continuation deeper.

Contract: d_i ~ q_i = softmax(draft logits / T) is kept with min(1, p_i(d_i) / q_i(d_i)), so (profile/
rollouts.py) P(A >= k) = sum over x_1..x_{k-1} of prod_{i<k} w_i(x_i) * alpha_k(x_<k), w_i = min(p_i, q_i),
alpha_i = sum_x w_i(x). The continuation after start t is itself a draw from the target at these settings:
x_{t+i} ~ p_i given x_{t+1}..x_{t+i-1}. Weighting that one path by prod w_i / p_i gives, per start,

    W_k = prod_{i<k} rho_i * alpha_k,    rho_i = min(p_i(x_{t+i}), q_i(x_{t+i})) / p_i(x_{t+i})  (0 where p = 0),

with E[W_k | the context] = P(A >= k): unbiased, from one draw, W_k in [0, 1]. Everything it reads is in the
pass: p_i is the pass's row at root + i - 1 (the root being the t-th continuation token), q_i the draft's step
i - 1 teacher-forced on the continuation (`run_lengths.SparseChains` at every start: the drafts d_1..d_{i-1}
set to the continuation's tokens, whose q_i the draft head gives after exactly those tokens), x_{t+i} the
continuation's token. No target forward runs beyond the pass; the draft runs max_steps steps at every start.
Variance (docs/sampling.md): Var W_k = sum_{x_<k} prod_{i<k} w_i(x_i)^2 / p_i(x_i) * alpha_k(x_<k)^2 - P(A >= k)^2
<= P(A >= k) (1 - P(A >= k)), the variance of observing one cycle's [A >= k]. One draw per start gives no
estimate of it; the starts of one prompt share their continuation, so the profile's intervals take the prompt
as the unit, which holds this noise with the contexts'. Valid only where the continuation was sampled from
the target at these settings (not for given responses: the profile runs rollouts there).
"""

from __future__ import annotations

import torch

from eagle_eval.profile.run_lengths import SparseChains
from eagle_eval.rules.filters import draft_probs, target_probs

CHUNK_ELEMENTS = 1 << 26        # target probabilities held at once (rows x positions x vocab, float32: 256 MiB)


def weight(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """rho = min(p, q) / p at the continuation's token (0 where p = 0): the likelihood ratio of "accepted and
    equal to x" (min(p, q)) to "the target emitted x" (p).

    >>> weight(torch.tensor([0.5, 0.2, 0.0], dtype=torch.float64), torch.tensor([0.25, 0.4, 0.3], dtype=torch.float64)).tolist()
    [0.5, 1.0, 0.0]
    """
    return torch.where(p > 0, torch.minimum(p, q) / p.clamp(min=1e-300), torch.zeros_like(p))


@torch.no_grad()
def weighted_expectations(spec, tf, k_max: int, max_new: int, decoding) -> torch.Tensor:
    """P(A >= i) estimates [B, max_new, K] float64 of every start (k = t - 1) of the batch's pass `tf`
    (profile_sampled._Pass), whose continuations hold max_new + k_max tokens sampled from `decoding`'s p."""
    head, ids = spec.head, tf.ids
    b, device = ids.shape[0], ids.device
    vocab = head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=device))       # [V_d] target ids
    to_draft = torch.full((tf.logits.shape[-1],), -1, dtype=torch.long, device=device)
    to_draft[vocab] = torch.arange(len(vocab), device=device)
    embeds = spec.embed(ids[:, 1:])                                                          # x_1..x_{W-1}
    drafter = SparseChains(head, tf.aux[:, :-1], embeds, spec.position_offset)
    pairs = torch.tensor(tf.starts, device=device)[:, None] - 1 + torch.arange(max_new, device=device)[None]
    bi, pi = torch.arange(b, device=device).repeat_interleave(max_new), pairs.reshape(-1)
    for j in range(1, k_max):                   # step j of every start, reading the continuation's token
        drafter.step_out(j, bi, pi + j, embeds[bi, pi + j])
    alpha = torch.zeros(b, max_new, k_max, dtype=torch.float64, device=device)
    rho = torch.zeros_like(alpha)
    starts = torch.tensor(tf.starts, device=device)
    span = max_new + k_max - 1                                   # p rows at positions T .. T + span - 1
    per = max(1, CHUNK_ELEMENTS // (span * tf.logits.shape[-1]))
    for lo in range(0, b, per):                                  # rows in chunks: p is [R, span, V]
        r = torch.arange(lo, min(b, lo + per), device=device)
        pos = starts[r][:, None] + torch.arange(span, device=device)[None]                    # [R, span]
        probs = target_probs(tf.logits[r.to(tf.logits.device)[:, None], pos.to(tf.logits.device)],
                             decoding).to(device)                                            # [R, span, V]
        nxt = ids[r[:, None], pos + 1]                           # the continuation's token each row predicts
        p_next = probs.gather(-1, nxt[..., None])[..., 0].double()                           # [R, span]
        p_vocab = probs[..., vocab]                                                          # [R, span, V_d]
        del probs
        for i in range(1, k_max + 1):       # depth i: q_i = step i - 1 at column p + i - 1, p_i at position p + i
            q = draft_probs(head.lm(drafter.outs[i - 1][r[:, None], pairs[r] + i - 1]), decoding)   # [R, P, V_d]
            at = pairs[r] + i - starts[r][:, None]                                           # p_i's row in span
            alpha[r, :, i - 1] = torch.minimum(p_vocab.gather(1, at[..., None].expand(-1, -1, q.shape[-1])),
                                               q).sum(-1).double()
            col = to_draft[nxt.gather(1, at)]                                                # [R, P]
            q_next = torch.where(col >= 0, q.gather(-1, col.clamp(min=0)[..., None])[..., 0].double(), 0.0)
            px = p_next.gather(1, at)
            rho[r, :, i - 1] = weight(px, q_next)
    carried = torch.cat([torch.ones_like(rho[..., :1]), rho[..., :-1]], -1).cumprod(-1)        # prod_{i<k} rho_i
    return carried * alpha
