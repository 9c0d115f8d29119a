"""DFlash2's two additions: the grouped dynamic causal convolution and the candidate selector.

Contract (restated from z-lab PyPI 0.1.0 `dflash/model.py` `GroupedDynamicCausalConv`,
`_grouped_dynamic_convolve`, `CandidateSelector.select`; vLLM 0.32 `qwen3_dflash2.py` `DFlashGroupedConv`,
`CandidateSelector`):

- `GroupedDynamicCausalConv` wraps a sublayer (a draft layer's attention, and its MLP). From the sublayer's
  normed input u [1, B, H], `kernel_projection` gives per row t, per tap tau and per channel group g two
  coefficients delta; `prepare` returns z_t = sum_tau (b0_tau + delta0_{t,tau,g}) * u_{t-tau} (u = 0 before the
  block's first row: causal inside the block, blind to the context) and delta1; `finish` applies the same
  convolution with b1 and delta1 (still the coefficients of u's rows) to the sublayer's output.
  `base_kernel` [2, taps, H], `kernel_projection.weight` [2 * taps * H / group, H].
- `CandidateSelector.scores`: slot j's top-k tokens of its logits, each scored
  logits_j(c) + <P[p] * (W_h y_j), S[c]> given the previous slot's chosen token p (the anchor for slot 1);
  every other token gets -inf, so a decode policy's argmax picks the best candidate and its softmax at T > 0
  is the k-sparse q z-lab samples from. `predecessor_codebook` / `successor_codebook` [V, rank] are bare
  parameters, named without `.weight` as in the published files (z-lab's from_pretrained maps them).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def grouped_causal_conv(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group: int) -> torch.Tensor:
    """x [b, L, H], dynamic [b, L, taps, H / group], base [taps, H] -> [b, L, H]:
    out_t = sum_tau base_tau * x_{t-tau} + dynamic_{t,tau,g} * x_{t-tau}, x before row 0 = 0.

    >>> x = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])                 # L = 2, H = 2, one group of 2
    >>> base = torch.tensor([[1.0, 1.0], [10.0, 10.0]])             # taps 2: tau 0 weight 1, tau 1 weight 10
    >>> grouped_causal_conv(x, torch.zeros(1, 2, 2, 1), base, 2).tolist()
    [[[1.0, 2.0], [13.0, 24.0]]]
    """
    b, length, hidden = x.shape
    groups = hidden // group
    blocks = x.view(b, length, groups, group)
    out = torch.zeros_like(blocks)
    for tau in range(base.shape[0]):
        shifted = F.pad(blocks, (0, 0, 0, 0, tau, 0))[:, :length]                    # row t holds x_{t-tau}
        out = out + base[tau].view(1, 1, groups, group).to(x.dtype) * shifted
        out = torch.addcmul(out, dynamic[:, :, tau, :, None], shifted)
    return out.view(b, length, hidden)


class GroupedDynamicCausalConv(nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * (hidden_size // group_size), bias=False)

    def prepare(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u [1, B, H] -> (the first convolution of u [1, B, H], the second's coefficients [1, B, taps, groups])."""
        dynamic = self.kernel_projection(u).view(*u.shape[:-1], 2, self.kernel_size, u.shape[-1] // self.group_size)
        first = grouped_causal_conv(u, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size)
        return first, dynamic[..., 1, :, :]

    def finish(self, out: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        """The sublayer's output [1, B, H] -> its second convolution [1, B, H]."""
        return grouped_causal_conv(out, dynamic, self.base_kernel[1], self.group_size)


class CandidateSelector(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))
        self.successor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))

    def scores(self, logits: torch.Tensor, hidden: torch.Tensor, previous: int) -> torch.Tensor:
        """logits [V] float32 (slot j's, after output_multiplier and softcapping), hidden [H] (its final-norm row),
        previous: the chosen token of slot j-1 (the anchor for j = 1) -> scores [V] float32, -inf off the top-k."""
        prev = torch.tensor([previous], device=logits.device)
        return self.scores_rows(logits[None], hidden[None], prev)[0]

    def scores_rows(self, logits: torch.Tensor, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """`scores` of B rows at once (the batched loop's; the reference loop's through it): logits [B, V], hidden
        [B, H], previous [B] -> [B, V]."""
        unary, candidates = logits.topk(self.top_k, dim=-1)                           # [B, k], [B, k]
        gate = self.predecessor_codebook[previous] * self.hidden_projection(hidden)   # [B, rank]
        pair = torch.einsum("br,bkr->bk", gate, self.successor_codebook[candidates])  # [B, k]
        full = torch.full_like(logits, float("-inf"))
        return full.scatter(1, candidates, unary + pair.float())
