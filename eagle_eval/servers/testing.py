"""The oracle for a serving engine's own test suite (pytest-friendly).

Contract: build the oracle ONCE for a target + head, ask it what a correct server returns for given
prompts at temperature 0 (output tokens and acceptance under each engine's definition), and assert
with messages that name the prompt, the position, both tokens, the target's logit margin and the
numbers behind an acceptance figure. Nothing here talks to a server: the test sends the request.
A prompt is text (the target's tokenizer renders it) or token ids of the target's vocabulary (others are
refused naming the prompt and the token). The example below runs as written against a server with the
bundled pair (tests/test_testing_api.py runs it against the SGLang stand-in); `sglang_url` is the server
suite's own fixture.

    import pytest
    import requests

    from eagle_eval.settings import BUNDLED_DRAFT, BUNDLED_TARGET
    from eagle_eval.testing import EagleOracle, assert_accept_length_close, assert_same_tokens

    @pytest.fixture(scope="session")
    def oracle():        # your target and head: folders or Hugging Face model ids; here the bundled pair
        return EagleOracle.from_paths(BUNDLED_TARGET, BUNDLED_DRAFT, num_steps=3, max_new_tokens=32)

    def test_eagle3_greedy(oracle, sglang_url):
        expected = oracle.expected("Count from one to ten.", id="count")
        out = requests.post(f"{sglang_url}/generate", json={"input_ids": expected.prompt_ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": 32}}).json()
        assert_same_tokens(expected, out["output_ids"])
        assert_accept_length_close(expected, out["meta_info"]["spec_accept_length"], rel=0.05)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle_eval.stats.acceptance import AcceptanceCounts
from eagle_eval.servers.figures import classify_divergence, relative_difference

__all__ = ["DEFINITIONS", "Expected", "EagleOracle", "assert_same_tokens", "assert_accept_length_close",
           "assert_mean_accept_length_close", "assert_verify_count", "assert_histogram_equal",
           "assert_sglang_response"]

DEFINITIONS = {
    "spec_accept_length": "SGLang meta_info.spec_accept_length = completion_tokens / spec_verify_ct",
    "accept_length": "tau = 1 + accepted drafts / verify steps (vLLM mean acceptance length, SGLang log accept len)",
}


@dataclass
class Expected:
    """What a correct server returns for one prompt (greedy), with the oracle's acceptance counts."""
    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    accepted_per_cycle: list[int]          # accepted drafts of each verify step, in order
    num_steps: int
    oracle: "EagleOracle | None" = field(default=None, repr=False, compare=False)

    @property
    def counts(self) -> AcceptanceCounts:
        return AcceptanceCounts.from_accepted(self.accepted_per_cycle, self.num_steps)

    @property
    def verify_count(self) -> int:
        """SGLang meta_info.spec_verify_ct; vLLM's num_drafts for this request."""
        return len(self.accepted_per_cycle)

    @property
    def accepted_drafts(self) -> int:
        return sum(self.accepted_per_cycle)

    @property
    def accept_length(self) -> float | None:
        """tau: 1 + accepted drafts / verify steps (vLLM's mean acceptance length)."""
        return self.counts.tau

    @property
    def spec_accept_length(self) -> float | None:
        """SGLang: completion_tokens / spec_verify_ct (counts the prefill token)."""
        return len(self.output_ids) / self.verify_count if self.verify_count else None

    @property
    def histogram(self) -> list[int]:
        """H[n] = verify steps that accepted exactly n drafts (SGLang spec_accept_histogram)."""
        return self.counts.histogram

    @property
    def accepted_per_position(self) -> list[int]:
        """Verify steps that accepted >= i drafts, i = 1..num_steps (vLLM num_accepted_tokens_per_pos)."""
        return self.counts.accepted

    def describe(self) -> str:
        return (f"{len(self.output_ids)} tokens in {self.verify_count} verify steps, {self.accepted_drafts} drafts "
                f"accepted, histogram {self.histogram}")


class EagleOracle:
    """A loaded target + head (eagle_eval.api.Oracle) with the settings a server should use."""

    def __init__(self, oracle):
        self.oracle = oracle

    @classmethod
    def from_paths(cls, target: str, draft: str, **options) -> "EagleOracle":
        """options: any setting by its flat name (num_steps, max_new_tokens, aux_layers, aux_convention,
        draft_embedding, position_offset, dtype, device_map, ...: eagle_eval.settings)."""
        from eagle_eval.settings import Settings
        return cls.from_settings(Settings.of(target=str(target), draft=str(draft), **options))

    @classmethod
    def from_settings(cls, settings) -> "EagleOracle":
        from eagle_eval.oracle import load_oracle
        return cls(load_oracle(settings))

    from_config = from_settings

    @property
    def resolved(self) -> dict:
        """Aux layers in all conventions, embedding table, num_steps/topk/num_draft_tokens really used."""
        return self.oracle.resolved.as_dict()

    @property
    def tokenizer(self):
        return self.oracle.tokenizer

    def expected(self, prompt, id: str | None = None, max_new_tokens: int | None = None) -> Expected:
        """prompt: token ids of the target's vocabulary, or text (tokenized with the target's tokenizer, special
        tokens added). Ids outside the vocabulary, or a prompt too long for the target, are refused
        (workload.data.DataError) naming the prompt."""
        from eagle_eval.records import Prompt
        from eagle_eval.workload.data import check_prompts

        ids = self.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else [int(i) for i in prompt]
        oracle = self.oracle
        if max_new_tokens is not None and max_new_tokens != oracle.settings.workload.max_new_tokens:
            oracle = oracle.with_(max_new_tokens=max_new_tokens)
        pid = id if id is not None else f"prompt[{len(ids)} tokens]"
        asked = Prompt(id=pid, category="testing", input_ids=ids)
        check_prompts([asked], oracle.limits(), "EagleOracle.expected")
        rec = oracle.decode(asked, check_lossless=False)
        return Expected(id=pid, prompt_ids=ids, output_ids=list(rec.output_ids),
                        accepted_per_cycle=list(rec.accepted_per_cycle), num_steps=oracle.resolved.num_steps,
                        oracle=self)

    def expected_many(self, prompts, ids=None, max_new_tokens: int | None = None) -> list[Expected]:
        ids = ids or [f"p{i}" for i in range(len(prompts))]
        return [self.expected(p, i, max_new_tokens) for p, i in zip(prompts, ids)]

    def divergence(self, expected: Expected, actual_ids: list[int]) -> dict | None:
        """None when equal; else position, both tokens and the target's logit margin there."""
        from eagle_eval.records import Prompt
        from eagle_eval.servers.check import divergence_from_oracle

        prompt = Prompt(id=expected.id, category="testing", input_ids=expected.prompt_ids)
        return divergence_from_oracle(self.oracle, prompt, list(actual_ids), expected.output_ids)

    def token_text(self, token: int | None) -> str:
        if token is None:
            return "-"
        try:
            return repr(self.tokenizer.decode([token]))
        except Exception:          # a token id the tokenizer cannot decode: show the id only
            return "?"


def assert_same_tokens(expected: Expected, actual_ids, tie_margin: float = 0.0) -> None:
    """The server's greedy output must equal the oracle's. With tie_margin > 0, a first divergence where
    the target's logit margin is below it counts as numerics (bf16 kernels) and passes."""
    actual = [int(t) for t in actual_ids]
    if actual == expected.output_ids:
        return
    oracle = expected.oracle
    div = oracle.divergence(expected, actual) if oracle is not None else None
    if div is not None and tie_margin > 0 and classify_divergence(div, tie_margin) == "near_tie":
        return
    if div is None or "server_token" not in div:
        n = next((i for i, (a, b) in enumerate(zip(actual, expected.output_ids)) if a != b),
                 min(len(actual), len(expected.output_ids)))
        detail = (f"lengths differ: server {len(actual)} tokens, oracle {len(expected.output_ids)} "
                  f"(equal up to position {n})" if div is None or div.get("reason") == "length"
                  else f"server token {actual[n]} at position {n}")
        raise AssertionError(f"prompt {expected.id!r}: server output differs from the oracle: {detail}")
    pos, s, o = div["position"], div["server_token"], div["oracle_token"]
    margin = div.get("margin")
    kind = "a near-tie: numerics" if margin is not None and abs(margin) < max(tie_margin, 1e-3) else \
        "not a near-tie: a logic error, not numerics"
    why = (f"target logit margin {margin:.4g} (oracle token's logit minus the server token's; {kind})"
           if margin is not None else div.get("reason", ""))
    lo = max(0, pos - 3)
    raise AssertionError(
        f"prompt {expected.id!r}: server output differs from the oracle at position {pos} of "
        f"{len(expected.output_ids)}: server token {s} {oracle.token_text(s)}, oracle token {o} "
        f"{oracle.token_text(o)}; {why}\n"
        f"  oracle [{lo}:{pos + 3}] {expected.output_ids[lo:pos + 3]}\n  server [{lo}:{pos + 3}] {actual[lo:pos + 3]}")


def _figure(expected: Expected, definition: str) -> float | None:
    if definition not in DEFINITIONS:
        raise ValueError(f"definition must be one of {list(DEFINITIONS)}, got {definition!r}")
    return getattr(expected, definition)


def assert_accept_length_close(expected: Expected, actual: float, rel: float = 0.05, abs_tol: float = 0.0,
                               definition: str = "spec_accept_length") -> None:
    """The server's per-request figure against the oracle's (definition: spec_accept_length = SGLang's
    meta_info; accept_length = tau, vLLM's)."""
    want = _figure(expected, definition)
    diff = relative_difference(float(actual), want)
    if want is None or diff is None:
        raise AssertionError(f"prompt {expected.id!r}: the oracle has no {definition} (no verify step)")
    if abs(float(actual) - want) <= abs_tol or diff <= rel:
        return
    raise AssertionError(
        f"prompt {expected.id!r}: {definition} ({DEFINITIONS[definition]}) server {float(actual):.4f} vs oracle "
        f"{want:.4f}: relative difference {diff:.1%} > {rel:.1%}; oracle: {expected.describe()}")


def assert_mean_accept_length_close(expected: list[Expected], actual: list[float], rel: float = 0.05,
                                    definition: str = "spec_accept_length") -> None:
    """Aggregate over prompts (mean of the per-request figures), naming the worst prompts on failure."""
    if len(expected) != len(actual) or not expected:
        raise AssertionError(f"{len(expected)} expected results but {len(actual)} server figures")
    want = [_figure(e, definition) for e in expected]
    mean_want, mean_got = sum(want) / len(want), sum(float(a) for a in actual) / len(actual)
    diff = relative_difference(mean_got, mean_want)
    if diff is not None and diff <= rel:
        return
    worst = sorted(zip(expected, want, actual), key=lambda t: -abs(float(t[2]) - t[1]))[:3]
    rows = ", ".join(f"{e.id}: server {float(a):.3f} / oracle {w:.3f}" for e, w, a in worst)
    raise AssertionError(f"mean {definition} over {len(expected)} prompts: server {mean_got:.4f} vs oracle "
                         f"{mean_want:.4f} (relative difference {diff:.1%} > {rel:.1%}); largest: {rows}")


def assert_verify_count(expected: Expected, actual: int) -> None:
    """SGLang spec_verify_ct (or vLLM's num_drafts delta) must equal the oracle's verify steps."""
    if int(actual) != expected.verify_count:
        raise AssertionError(f"prompt {expected.id!r}: server ran {int(actual)} verify steps, the oracle "
                             f"{expected.verify_count} ({expected.describe()})")


def assert_histogram_equal(expected: Expected, actual) -> None:
    """SGLang spec_accept_histogram (index n = steps that accepted exactly n drafts; may be shorter)."""
    n = max(len(actual), len(expected.histogram))
    got = [int(x) for x in actual] + [0] * (n - len(actual))
    want = expected.histogram + [0] * (n - len(expected.histogram))
    if got != want:
        first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        raise AssertionError(f"prompt {expected.id!r}: acceptance histogram server {got} vs oracle {want} "
                             f"(first difference: steps accepting exactly {first} drafts, {got[first]} vs "
                             f"{want[first]})")


def assert_sglang_response(expected: Expected, response: dict, rel: float = 0.05, tie_margin: float = 0.0) -> None:
    """One SGLang /generate JSON answer: output tokens, then spec_verify_ct / spec_accept_length / histogram."""
    from eagle_eval.servers.sglang import parse_sglang_generate

    reply = parse_sglang_generate(response, "/generate")
    if reply.output_ids is None:
        raise AssertionError(f"prompt {expected.id!r}: " + "; ".join(reply.notes))
    assert_same_tokens(expected, reply.output_ids, tie_margin)
    if reply.verify_count is None:
        raise AssertionError(f"prompt {expected.id!r}: " + "; ".join(reply.notes))
    assert_accept_length_close(expected, reply.completion_tokens / reply.verify_count, rel=rel)
    if reply.histogram is not None and rel == 0:
        assert_histogram_equal(expected, reply.histogram)
