"""The profile at temperature > 0 against the reference loop itself, start by start: for a start t (the context
prompt + the first t tokens of the sampled continuation, x_t the root; docs/sampling.md), the loop
(loop/reference.py `speculative_decode` with the rule's policy of rules/base.py) decodes from that
context with the root forced, many times with independent random streams, and the frequencies of its first
cycle's A >= k must hold the profile's P(A >= k) of that start (Wilson intervals). Chains under SGLang's
thresholds below 1 (the case the product of p got wrong), an SGLang tree under the same thresholds, and an
EAGLE tree.

Cost: the context is fixed, so a decode's drafts and target logits are the same every time and only its
random stream differs. One decode per start runs the loop; at its verify the policy's decision is taken
again with each of the R streams (`Replayed`), which is what R decodes from that context would decide, draw
for draw: a few of them are run as whole decodes and must give the same counts."""

import math

import pytest
import torch

from eagle_eval import api
from eagle_eval.commands.profile import profile_oracle
from eagle_eval.settings import ProfileOptions, Settings
from eagle_eval.loop.reference import speculative_decode
from eagle_eval.rules.base import policy_for
from eagle_eval.rules.filters import prompt_generator

R = 2000                 # decisions per start
Z = 4.5                  # Wilson interval: two-sided alpha 6.8e-6 per comparison (about 40 in this file)
WHOLE = 3                # of them run as whole decodes too


@pytest.fixture(scope="module")
def oracle():
    return api.load_oracle(Settings.of(max_new_tokens=16, limit=6))


class Replayed:
    """The rule's policy for one start: the prefill's token forced to the start's root (the context is then
    exactly the start's), and the first verify's decision also taken with each of `streams` (the first
    cycle's accepted drafts of a decode drawing from that stream). `counts[i]`: A of stream i."""

    def __init__(self, rule, root: int, streams: list[str]):
        self.rule, self.root, self.streams = rule, root, streams
        self.name, self.inner, self.vocab, self.counts = rule.name, None, None, None

    def start(self, generator, draft_vocab):
        self.inner, self.vocab = self.rule.start(generator, draft_vocab), draft_vocab
        return self

    def first_token(self, logits):
        return self.root

    def propose(self, draft_logits):
        return self.inner.propose(draft_logits)

    def accept_chain(self, drafts, target_logits):
        if self.counts is None and self.streams:
            self.counts = [self._fresh(s).accept_chain(drafts, target_logits)[0] for s in self.streams]
        return self.inner.accept_chain(drafts, target_logits)

    def accept_tree(self, tree, target_logits):
        if self.counts is None and self.streams:
            self.counts = [len(self._fresh(s).accept_tree(tree, target_logits)[0]) - 1 for s in self.streams]
        return self.inner.accept_tree(tree, target_logits)

    def _fresh(self, stream: str):
        return self.rule.start(prompt_generator(0, stream, 0), self.vocab)


def decode_from(oracle, rule, ctx: list[int], s: int, streams: list[str], topk: int, d: int | None,
                stream: str = "whole") -> tuple[int, list[int] | None]:
    """One decode from the start whose context is ctx (its last token the root): (its first cycle's A, the A
    each of `streams` would give)."""
    from dataclasses import replace

    policy = Replayed(rule, ctx[-1], streams)
    spec = replace(oracle.speculator, policy=policy)
    out = speculative_decode(spec, ctx[:-1], s, 2, set(), topk=topk, num_draft_tokens=d,
                             generator=prompt_generator(0, stream, 0))
    return out.accepted_per_cycle[0], policy.counts


def wilson(successes: int, n: int, z: float = Z) -> tuple[float, float]:
    phat = successes / n
    denom = 1 + z * z / n
    center = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return center - half, center + half


def outside(counts: list[int], at_least: list[float]) -> list[tuple[int, float, float]]:
    """(k, frequency of A >= k, P(A >= k)) wherever P is outside the frequency's interval."""
    out = []
    for k, want in enumerate(at_least, start=1):
        hits = sum(a >= k for a in counts)
        lo, hi = wilson(hits, len(counts))
        if not lo - 1e-9 <= want <= hi + 1e-9:
            out.append((k, hits / len(counts), want))
    return out


def informative(rows: list[dict], n: int) -> list[dict]:
    """The n starts whose P(A >= k) are furthest from 0 and 1 (the most a frequency can contradict)."""
    return sorted(rows, key=lambda r: -sum(min(x, 1 - x) for x in r["p_accept_at_least"]))[:n]


def check_starts(oracle, o, res, rows: list[dict], s: int, topk: int, d: int | None) -> None:
    conts = {p.prompt.id: p for p in res.profiled}
    rule = policy_for(o.settings.decoding, topk)
    for row in rows:
        p = conts[row["prompt_id"]]
        ctx = p.prompt.input_ids + p.continuation[: row["start"]]
        key = f"{row['prompt_id']}/{row['start']}"
        streams = [f"{key}/{i}" for i in range(R)]
        _, counts = decode_from(oracle, rule, ctx, s, streams, topk, d)
        for i in range(WHOLE):                              # the replayed decision is the whole decode's
            whole, _ = decode_from(oracle, rule, ctx, s, [], topk, d, stream=streams[i])
            assert whole == counts[i], (key, i)
        assert not outside(counts, row["p_accept_at_least"]), (key, row["p_accept_at_least"], outside(
            counts, row["p_accept_at_least"]))
        row["loop_counts"] = counts


def test_chain_under_sglang_thresholds_equals_the_loop_per_start(oracle):
    """SGLang, thresholds single 0.6 / acc 0.5, chains of 4 at T = 2: the starts where the profile's chain form
    differs most from the product of p (what the profile computed before, the vLLM rule's form on the same
    drafts) are checked, and the product misses there."""
    s = 4
    o = oracle.with_(temperature=2.0, accept_rule="sglang", accept_threshold_single=0.6, accept_threshold_acc=0.5)
    res = profile_oracle(o, ProfileOptions(max_steps=s, expectation_floor=0.0))
    product = profile_oracle(oracle.with_(temperature=2.0, accept_rule="vllm"),
                             ProfileOptions(max_steps=s, expectation_floor=0.0))
    old = {(r["prompt_id"], r["start"]): r["p_accept_at_least"] for r in product.per_start if r["num_steps"] == s}
    rows = [r for r in res.per_start if r["num_steps"] == s]
    rows = sorted(rows, key=lambda r: -max(abs(x - y) for x, y in zip(r["p_accept_at_least"],
                                                                       old[(r["prompt_id"], r["start"])])))[:3]
    check_starts(oracle, o, res, rows, s, 1, None)
    for row in rows:
        assert outside(row["loop_counts"], old[(row["prompt_id"], row["start"])]), row["prompt_id"]


@pytest.mark.parametrize("dec, topk, d", [
    (dict(temperature=2.0, accept_rule="sglang", accept_threshold_single=0.6, accept_threshold_acc=0.5), 3, 8),
    (dict(temperature=1.5, top_p=0.95, accept_rule="eagle"), 2, 6)])
def test_tree_equals_the_loop_per_start(oracle, dec, topk, d):
    s = 3
    o = oracle.with_(topk=topk, num_draft_tokens=d, **dec)
    res = profile_oracle(o, ProfileOptions(max_steps=s, expectation_floor=0.0))
    rows = [r for r in res.per_start if r["num_steps"] == s and r["num_draft_tokens"] == d]
    check_starts(oracle, o, res, informative(rows, 3), s, topk, d)


def test_figures_along_the_texts_only_where_they_are_the_rules(oracle):
    """Under SGLang thresholds below 1 the loop's text is not a sample of p, so the prefix match along the
    target's samples is not the rule's acceptance: the report has the per-context figure alone (as for sampled
    drafts) and says why; at thresholds 1 the figures along the texts are there. per_start rows keep their keys."""
    from eagle_eval.results.expectation import section_rates

    opts = ProfileOptions(max_steps=3, expectation_floor=0.0)
    biased = profile_oracle(oracle.with_(temperature=1.0, accept_rule="sglang", accept_threshold_single=0.6,
                                         accept_threshold_acc=0.5), opts)
    lossless = profile_oracle(oracle.with_(temperature=1.0, accept_rule="sglang"), opts)
    for s, section in biased.report["by_num_steps"].items():
        assert set(section) == {"expected"} and set(section["expected"]) == {"per_context", "by_category"}, s
        assert all(set(c) == {"per_context"} for c in section["expected"]["by_category"].values())
        assert section_rates(section)["source"] == "per_context"
        assert set(lossless.report["by_num_steps"][s]["expected"]) >= {"per_context", "along_trajectories", "sampled"}
        assert "summary" in lossless.report["by_num_steps"][s]
    assert biased.samples == [] and len(lossless.samples) == len(lossless.profiled)
    assert any("only the per-context expectation is reported" in w for w in biased.report["warnings"])
    assert not any("thresholds below 1" in w for w in lossless.report["warnings"])
    assert [sorted(r) for r in biased.per_start] == [sorted(r) for r in lossless.per_start]
