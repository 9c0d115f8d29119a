"""Timing the costs of the speedup model, repeated until each is known narrowly (or a budget ends).

Contract: `measure_timings(spec, verify_sizes)` times, round after round on a `context`-token cache, one
1-token target forward, one verify forward of each size in `verify_sizes` and one draft step (head
forward, lm_head, argmax), interleaved so that drift over the measurement touches every cost alike. A block
drafter (its drafting state class says `one_forward`: heads/dflash/state.py) drafts a cycle's k tokens in one
forward of k + 1 rows, so its draft cost is timed per block: one proposal (the block forward, lm_head, argmax) of
each n - 1 drafts for n in `verify_sizes` (`Timings.block_ms`; `draft_ms` is its smallest block's). It
stops once every timing's 95% median interval (results/advice.median_interval) is within `rel_width`
of its median, or after `max_reps` rounds, or when `budget_s` has passed; `TimingRun.narrow` says
which. The samples go to results/advice.advise, which decides the recommendation from them. The first
call of each kind is a warm-up and not kept. Computation only: `progress(round, widest)` is the
caller's bar (STYLE.md 12).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from eagle_eval.stats.advice import Timings, relative_width


@dataclass(frozen=True)
class TimingRun:
    timings: Timings
    rounds: int
    narrow: bool              # every timing's median interval within rel_width
    widest: float             # the largest relative half-width reached
    rule: str


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def stop_rule(samples: dict[str, list[float]], rounds: int, elapsed: float, min_reps: int, max_reps: int,
              rel_width: float, budget_s: float) -> tuple[bool, bool, float]:
    """(stop, narrow, widest relative half-width) after a round: narrow once every timing is within
    rel_width (from min_reps rounds on), else stop at max_reps or when the budget is spent."""
    widest = max(relative_width(xs) for xs in samples.values())
    narrow = rounds >= min_reps and widest <= rel_width
    return narrow or rounds >= max_reps or elapsed >= budget_s, narrow, widest


@torch.no_grad()
def measure_timings(spec, verify_sizes, context: int = 128, min_reps: int = 6, max_reps: int = 60,
                    rel_width: float = 0.02, budget_s: float = 60.0, clock: Callable[[], float] = time.perf_counter,
                    progress: Callable[[int, float], None] | None = None) -> TimingRun:
    """Repeated timings of the model's costs (module docstring); `clock` is injectable for tests."""
    from eagle_eval.loop.draft import DraftState
    from eagle_eval.loop.policy import GREEDY

    target, head, device = spec.target, spec.head, spec.draft_device
    vocab = target.info.vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = target.new_cache()
    target.forward(torch.randint(0, vocab, (1, context), generator=gen), cache)
    one_forward = getattr(spec.draft_state, "one_forward", False)
    state = (spec.draft_state(head, spec.embed, 0, GREEDY.start()) if one_forward else DraftState(head, spec.embed))
    state.extend(torch.randn(1, context, head.config.num_aux * head.config.target_hidden_size, generator=gen)
                 .to(device=device, dtype=head.lm_head.weight.dtype),
                 torch.randint(0, vocab, (1, context), generator=gen).to(device))
    token = torch.randint(0, vocab, (1, 1), generator=gen).to(device)
    position = torch.tensor([[context]], device=device)
    sizes = sorted(set(int(n) for n in verify_sizes))
    ids = {n: torch.randint(0, vocab, (1, n), generator=gen) for n in {1, *sizes}}

    def verify(n):
        target.forward(ids[n], cache)
        target.rollback(cache, context)

    def draft_step():             # one head forward + lm_head + argmax, as in each decode step
        out = head.step(spec.embed(token), state.last_out, position, state.cache)
        head.logits(out).argmax(-1)
        state.cache.rollback(context)

    blocks = [n for n in sizes if n >= 2] if one_forward else []
    # a block drafter: one proposal = one forward of n rows + lm_head + argmax
    drafts = ({f"block:{n}": (lambda n=n: state.propose_chain(n - 1)) for n in blocks} if one_forward
              else {"draft": draft_step})
    if one_forward and not blocks:
        raise ValueError(f"verify sizes {sizes}: a block drafter's draft cost is timed per block of >= 2 rows")
    jobs = {"target": lambda: verify(1), **drafts, **{f"verify:{n}": (lambda n=n: verify(n)) for n in sizes}}

    def timed(fn) -> float:
        _synchronize()
        t0 = clock()
        fn()
        _synchronize()
        return (clock() - t0) * 1e3

    for fn in jobs.values():       # warm-up, not kept
        timed(fn)
    samples: dict[str, list[float]] = {k: [] for k in jobs}
    start, rounds = clock(), 0
    while True:
        for k, fn in jobs.items():
            samples[k].append(timed(fn))
        rounds += 1
        stop, narrow, widest = stop_rule(samples, rounds, clock() - start, min_reps, max_reps, rel_width, budget_s)
        if progress is not None:
            progress(rounds, widest)
        if stop:
            break
    block_ms = {n: tuple(samples[f"block:{n}"]) for n in blocks}
    timings = Timings(target_ms=tuple(samples["target"]),
                      draft_ms=block_ms[blocks[0]] if one_forward else tuple(samples["draft"]),
                      verify_ms={n: tuple(samples[f"verify:{n}"]) for n in sizes}, block_ms=block_ms)
    rule = (f"rounds of every timing until each 95% median interval is within {rel_width:.0%} of its median "
            f"(at least {min_reps}, at most {max_reps} rounds, {budget_s:g} s)")
    return TimingRun(timings, rounds, narrow, widest, rule)
