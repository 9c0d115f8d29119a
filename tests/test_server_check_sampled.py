"""server-check at temperature > 0 over the wire, against stand-in servers (tests/fake_servers.py) that sample
with each engine's rule from an eagle_eval oracle.

A stand-in serving the check's own oracle is the oracle compared with itself behind an engine's wire format:
its agreeing shows the check reads and judges that wire (samples of the target, per-step counts re-drafted
along its own answers, the expectation along them), not that SGLang or vLLM sample that way. What the check
must catch is planted in a stand-in: tokens that are not samples of the target, a residual that keeps the
rejected draft, a wiring fault (the stand-in's oracle tapping other layers). The real vLLM CPU build is
tests/test_real_vllm.py."""

import pytest
from fake_servers import Engine, serve

from eagle_eval.oracle import load_oracle
from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.servers.sampled import compare_redrafted, redrafted, request_sampling
from eagle_eval.settings import DecodingSettings, Settings

BASE = Settings.of(limit=8, max_new_tokens=48)


@pytest.fixture(scope="module")
def oracle():
    return load_oracle(BASE)


def _check(oracle, backend, fault=None, rule=None, per_request="detailed", server=None, limit=None, **decoding):
    """server-check of a stand-in; `server`: the stand-in's own oracle (a wiring fault), default the check's."""
    with serve(Engine(server or oracle, backend, fault=fault, per_request=per_request, rule=rule)) as url:
        settings = BASE.with_(accept_rule=rule or backend, **decoding, **({"limit": limit} if limit else {}))
        sampled_drafts = settings.decoding.accept_rule in ("vllm-probabilistic", "sglang-rs")
        return run_server_check(settings, ServerCheckOptions(backend=backend, url=url, metrics_settle=0, retries=0,
                                                             **({"rollouts": 8} if sampled_drafts else {})),
                                oracle=oracle)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_the_oracle_sampling_over_each_wire_agrees_with_itself(oracle, backend):
    """At T = 2 (top-p 0.95) the bundled target's p is spread (sampled mass 0.35): its 8 x 48 tokens are enough
    for the distribution check to see a server halfway to greedy. At T = 0.9 it is nearly one-hot (0.02), and
    the same tokens are undecided (stats/distribution.py: the departure the settings imply)."""
    result = _check(oracle, backend, temperature=2.0, top_p=0.95)
    r = result.report
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert r["plausibility"]["verdict"] == "consistent"
    assert all(row["redrafted"]["equal"] for row in r["requests"])
    assert r["sampling"]["exact_per_request"] and r["sampling"]["rule"] == backend


@pytest.mark.slow
def test_tokens_that_are_not_samples_of_the_target_are_named(oracle):
    result = _check(oracle, "vllm", fault="not_samples", temperature=0.7, top_p=0.95)
    r = result.report
    assert result.exit_status == 1 and r["plausibility"]["verdict"] == "differs"
    assert r["reasons"][0].startswith("the server's tokens are not samples of the target at these settings")
    assert r["plausibility"]["mean_log_p"] < r["plausibility"]["mean_log_p_of_samples"] - 10


@pytest.mark.slow
def test_a_residual_that_keeps_the_rejected_draft_is_caught_per_request(oracle):
    """At T = 3, top-k 4 the bundled target is flat enough for a rejected draft to come back often: the
    server then reports it rejected where its own answer continues with it."""
    result = _check(oracle, "vllm", fault="wrong_residual", temperature=3.0, top_k=4)
    r = result.report
    assert result.exit_status == 1 and any("accepted other drafts than the drafts re-made" in x for x in r["reasons"])
    faithful = _check(oracle, "vllm", temperature=3.0, top_k=4)
    assert faithful.exit_status == 0, render_server_check(faithful.report)


@pytest.mark.slow
def test_a_rule_with_sampled_drafts_without_per_step_counts_checks_only_the_distribution(oracle):
    result = _check(oracle, "vllm", rule="vllm-probabilistic", per_request="summary", temperature=2.0)
    r = result.report
    assert not r["sampling"]["exact_per_request"] and r["plausibility"]["verdict"] == "consistent"
    assert r["expectation"] is None
    assert result.exit_status == 3 and "no per-request count follows" in " ".join(r["reasons"])


@pytest.mark.slow
def test_sampled_drafts_a_wiring_fault_is_caught_by_the_expected_acceptance_alone(oracle):
    """vllm-probabilistic is lossless whatever the head: a server tapping HF layers 0, 1, 2 (the head wants
    2, 4, 5) emits samples of the target, so the distribution check passes; its acceptance along its own answers
    falls short of what the oracle's head expects there, cycle by cycle, and that decides it."""
    wrong = oracle.with_(aux_layers=(0, 1, 2))
    bad = _check(oracle, "vllm", rule="vllm-probabilistic", server=wrong, limit=12, temperature=0.9)
    r = bad.report
    # its tokens are samples of the target; at T = 0.9 (sampled mass 0.02) too few to be called consistent
    assert r["plausibility"]["verdict"] == "undecided" and r["expectation"]["verdict"] == "differs"
    assert bad.exit_status == 1 and r["expectation"]["z"] < -3.29
    assert any(x.startswith("the server's acceptance is not what a faithful engine gives") for x in r["reasons"])
    good = _check(oracle, "vllm", rule="vllm-probabilistic", limit=12, temperature=0.9)
    assert good.report["expectation"]["verdict"] != "differs" and good.exit_status in (0, 3), \
        render_server_check(good.report)
    assert good.report["expectation"]["cycles"] > 100


@pytest.mark.slow
def test_one_hot_rules_the_oracle_over_the_wire_meets_its_expectation_and_a_wiring_fault_does_not(oracle):
    """Under vLLM's default rule the oracle over vLLM's wire (a stand-in serving the check's own oracle) has counts
    exact per request, whose sum lies where the expectation along its answers says; a stand-in with a wiring
    fault is far outside it."""
    good = _check(oracle, "vllm", temperature=0.9)
    assert good.report["expectation"]["verdict"] == "consistent" and good.report["verdict"] == "undecided"
    # undecided only because 8 x 48 tokens at T = 0.9 are too few for the distribution check's power
    assert [x.startswith("too few tokens to tell whether the server's tokens are samples") for x in
            good.report["reasons"]] == [True]
    bad = _check(oracle, "vllm", server=oracle.with_(aux_layers=(0, 1, 2)), temperature=0.9)
    assert bad.exit_status == 1 and bad.report["expectation"]["z"] < -10
    first = bad.report["expectation"]["per_position"][0]          # the shortfall starts at the first draft
    assert first["interval"][1] < 0 and first["server_rate"] < first["expected_rate"]
    rates = [q["server_rate"] for q in good.report["expectation"]["per_position"]]
    assert rates == sorted(rates, reverse=True) and all(
        q["interval"][0] <= 0 <= q["interval"][1] or abs(q["z"]) < 3.29 for q in good.report["expectation"]["per_position"])


def test_the_expectation_statistic_is_standard_normal_for_a_faithful_engine():
    """Cycles drawn from known P(A >= i | root): z of a faithful server is about N(0, 1) (5% beyond 1.96),
    a server accepting one draft fewer a tenth of the time is called differs."""
    import torch

    from eagle_eval.servers.sampled import expectation_check

    gen, s = torch.Generator().manual_seed(0), 4
    beyond, shifted = 0, 0
    for rep in range(300):
        at_least = torch.rand(200, s, generator=gen).clamp(0.05, 0.95).cumprod(1)      # decreasing in i
        pmf = torch.cat([1 - at_least[:, :1], at_least[:, :-1] - at_least[:, 1:], at_least[:, -1:]], 1)
        steps, k, answer_len = [], 0, 200
        while k + s + 1 < answer_len:
            a = int(torch.multinomial(pmf[k], 1, generator=gen))
            steps.append(a)
            k += a + 1
        steps.append(0)                                           # the last cycle, at the end: not used
        row = {"server": {"accepted_per_cycle": steps}, "output_ids": [0] * answer_len}
        z = expectation_check([row], [(at_least, None)], s, 0.05)["z"]
        beyond += abs(z) > 1.96
        if rep < 30:
            low = [max(a - 1, 0) if i % 10 == 0 else a for i, a in enumerate(steps)]
            shifted += expectation_check([{**row, "server": {"accepted_per_cycle": low}}],
                                         [(at_least, None)], s, 0.05)["verdict"] == "differs"
    assert 0.02 < beyond / 300 < 0.09, beyond
    certain = torch.ones(50, s)
    row = {"server": {"accepted_per_cycle": [s] * 9}, "output_ids": [0] * 50}
    assert expectation_check([row], [(certain, None)], s, 0.05)["verdict"] == "consistent"
    row = {"server": {"accepted_per_cycle": [s - 1] * 9}, "output_ids": [0] * 50}
    assert expectation_check([row], [(certain, None)], s, 0.05)["verdict"] == "differs"


def test_per_step_counts_must_add_up_to_the_answer():
    from eagle_eval.servers.sampled import emitted_mismatch

    assert not emitted_mismatch([2, 0, 1], [7] * 6)          # 1 + 3 + 1 + 2 = 7 emitted, the last cut: 6 kept
    assert not emitted_mismatch([2, 0, 1], [7] * 7)
    assert emitted_mismatch([2, 0, 1], [7] * 8)               # more tokens than the steps emit
    assert emitted_mismatch([2, 0, 1], [7] * 5)               # the last step emitted nothing that was kept


def test_requests_carry_the_settings_and_a_seed_per_prompt():
    d = DecodingSettings(temperature=0.6, top_p=0.9, top_k=20, seed=7)
    a, b = request_sampling(d, "q1"), request_sampling(d, "q2")
    assert (a["temperature"], a["top_p"], a["top_k"]) == (0.6, 0.9, 20) and a["seed"] != b["seed"]
    assert request_sampling(d, "q1") == a                               # reruns send the same requests


def test_the_redrafted_counts_are_the_greedy_loops_on_its_own_answer(oracle):
    """At temperature 0 a server's answer is the target's greedy output, and the counts re-drafted along it are
    the reference loop's, cycle by cycle (the last one may only be a lower bound)."""
    from eagle_eval.oracle import checked_workload

    for prompt in checked_workload(oracle).first_prompts[:4]:
        rec = oracle.decode(prompt)
        ours, capped = redrafted(oracle, prompt, rec.output_ids)
        assert ours[:-1] == rec.accepted_per_cycle[:-1] and len(ours) == len(rec.accepted_per_cycle)
        assert ours[-1] <= rec.accepted_per_cycle[-1] and (capped or ours[-1] == rec.accepted_per_cycle[-1])
        assert compare_redrafted(ours, capped, {"accepted_per_cycle": rec.accepted_per_cycle}, 5)["equal"]


def test_a_check_at_temperature_above_zero_needs_a_url(oracle, tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text("")
    from eagle_eval.settings import ConfigError

    with pytest.raises(ConfigError, match="needs --url"):
        run_server_check(BASE.with_(temperature=0.7), ServerCheckOptions(backend="sglang", sglang_log=str(log)),
                         oracle=oracle)
