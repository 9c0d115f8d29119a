"""The loop at temperature > 0 on real (tiny) models: T -> 0 is the greedy loop exactly, the output is plain
sampling from the target (the distribution check) for every rule and fails on a planted wrong residual, seeds
reproduce runs byte for byte, and reports echo the rule, its filter order and the seed."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from fixtures import load_prompts, make_head, make_target, write_prompts

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.commands.run import evaluate
from eagle_eval.stats.distribution import CellCounts, judge
from eagle_eval.settings import ConfigError, DecodingSettings, LoopOptions, Settings
from eagle_eval.registry import RULES
from eagle_eval.rules import base as rules
from eagle_eval.loop.reference import speculative_decode

CHAINS = [("vllm", 1, None), ("vllm-probabilistic", 1, None), ("sglang-rs", 1, None), ("sglang", 1, None),
          ("eagle", 1, None)]
TREES = [("sglang", 3, 7), ("eagle", 3, 7)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A random tiny target (flat p at T = 1) and a head with the full vocab (sglang-rs needs it)."""
    root = tmp_path_factory.mktemp("sampling")
    return {"target": make_target(root / "target"), "head": make_head(root / "head"),
            "reduced": make_head(root / "reduced", draft_vocab=40),
            "prompts": write_prompts(root / "prompts.jsonl", n=6), "root": root}


@pytest.fixture(scope="module")
def greedy(pair):
    s = Settings.of(target=str(pair["target"]), draft=str(pair["head"]), prompts=str(pair["prompts"]),
                    max_new_tokens=24, num_steps=3)
    oracle = api.load_oracle(s)
    return oracle, load_prompts(s.workload.prompts, oracle.tokenizer)


def _rule(oracle, rule, topk, d, **decoding):
    return oracle.with_(accept_rule=rule, topk=topk, num_draft_tokens=d, **decoding)


@pytest.mark.parametrize("rule,topk,d", CHAINS + TREES)
def test_temperature_to_zero_is_the_greedy_loop(greedy, rule, topk, d):
    """Tokens and per-cycle acceptance equal the greedy loop's: at T = 1e-6 through the oracle (p and q
    one-hot in float32), and the rule itself at T = 0 (no oracle shortcut to GREEDY)."""
    oracle, prompts = greedy
    plain = _rule(oracle, rule, topk, d)
    near_zero = _rule(oracle, rule, topk, d, temperature=1e-6)
    at_zero = replace(plain.speculator, policy=RULES.get(rule).policy(DecodingSettings(temperature=0.0, accept_rule=rule)))
    r = plain.resolved
    for p in prompts[:3]:
        want = plain.decode(p)
        got = near_zero.decode(p)
        assert (got.output_ids, got.accepted_per_cycle) == (want.output_ids, want.accepted_per_cycle)
        exact = speculative_decode(at_zero, p.input_ids, r.num_steps, 24, plain.eos_ids, r.topk, r.num_draft_tokens,
                                   generator=torch.Generator().manual_seed(0))
        assert (exact.output_ids, exact.accepted_per_cycle) == (want.output_ids, want.accepted_per_cycle)
    assert near_zero.speculator.policy.name == rule and plain.speculator.policy.name == "greedy"


def _pooled_check(oracle, prompts, samples: int) -> dict:
    pooled = CellCounts()
    for s in range(samples):
        for p in prompts:
            rec = oracle.decode(p, check_lossless=True, sample=s)
            assert rec.lossless is None and rec.extra["sample"] == s
            pooled = pooled.merge(CellCounts.from_dict(rec.extra["distribution_check"]))
    return judge(pooled)


def _consistent(oracle, prompts, rule, topk, d):
    verdict = _pooled_check(_rule(oracle, rule, topk, d, temperature=1.0), prompts, samples=3)
    assert verdict["verdict"] == "consistent", verdict
    assert verdict["tokens"] >= 350 and verdict["outside_support"] == 0


@pytest.mark.parametrize("rule,topk,d", [CHAINS[1], TREES[1]])
def test_the_loop_is_plain_sampling(greedy, rule, topk, d):
    _consistent(*greedy, rule, topk, d)


@pytest.mark.slow
@pytest.mark.parametrize("rule,topk,d", [c for c in CHAINS + TREES if c not in (CHAINS[1], TREES[1])])
def test_the_loop_is_plain_sampling_under_every_rule(greedy, rule, topk, d):
    _consistent(*greedy, rule, topk, d)


@pytest.fixture(scope="module")
def bundled():
    oracle = api.load_oracle(Settings.of(max_new_tokens=40, num_steps=4))
    return oracle, load_prompts(oracle.settings.workload.prompts, oracle.tokenizer)


@pytest.mark.slow
def test_a_planted_wrong_residual_fails_the_check(bundled, monkeypatch):
    """The bundled pair (a trained head, so drafts are often right and a rejected right draft is common) at a
    temperature where p is not one-hot: the rule passes; residual = p instead of p without the rejected draft
    (relu(p - q) with q one-hot) fails; so do SGLang's thresholds below 1, which bias SGLang's output too."""
    oracle, prompts = bundled
    vllm = oracle.with_(temperature=3.0, top_k=4, accept_rule="vllm")
    assert _pooled_check(vllm, prompts, 1)["verdict"] == "consistent"
    biased = oracle.with_(temperature=3.0, top_k=4, accept_rule="sglang", topk=3, num_draft_tokens=8,
                          accept_threshold_single=0.3)
    assert _pooled_check(biased, prompts, 1)["verdict"] == "differs"
    monkeypatch.setattr(rules, "without", lambda p, tokens: p.clone())
    planted = _pooled_check(vllm, prompts, 1)
    assert planted["verdict"] == "differs" and planted["p_value"] < 1e-4, planted


def test_a_token_outside_the_filtered_support_differs_with_exit_1(pair, monkeypatch, tmp_path):
    """A residual that puts its mass on the least likely token: with top-k 3 that token has p = 0, so the
    check decides on the first one (and `run` exits 1)."""
    monkeypatch.setattr(rules, "without", lambda p, tokens: torch.nn.functional.one_hot(p.argmin(), len(p)).float())
    res = CliRunner().invoke(main, ["run", "--target", str(pair["target"]), "--draft", str(pair["head"]),
                                    "--prompts", str(pair["prompts"]), "--temperature", "1", "--top-k", "3",
                                    "--check-lossless", "--max-new-tokens", "12", "--output-dir", str(tmp_path / "o")])
    assert res.exit_code == 1, res.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    check = report["summary"]["distribution_check"]
    assert check["verdict"] == "differs" and check["outside_support"] > 0 and report["summary"]["lossless"] is False
    assert "distribution vs plain sampling (rank cells)          differs" in res.output


def test_too_few_tokens_are_undecided_with_exit_3(pair, tmp_path):
    res = CliRunner().invoke(main, ["run", "--target", str(pair["target"]), "--draft", str(pair["head"]),
                                    "--prompts", str(pair["prompts"]), "--temperature", "1", "--limit", "2",
                                    "--check-lossless", "--max-new-tokens", "8"])
    assert res.exit_code == 3, res.output
    assert "undecided" in res.output


@pytest.mark.parametrize("thresholds", [["--accept-threshold-single", "0.5"], ["--accept-threshold-acc", "0.9"]])
def test_thresholds_below_one_fail_the_check_by_construction_with_exit_1(pair, tmp_path, thresholds):
    """Too few tokens for the statistic to see anything (8 tokens a prompt): the check still fails, because
    the run's own report says the rule is not plain sampling; never "consistent", never "undecided"."""
    res = CliRunner().invoke(main, ["run", "--target", str(pair["target"]), "--draft", str(pair["head"]),
                                    "--prompts", str(pair["prompts"]), "--temperature", "1", "--limit", "2",
                                    "--accept-rule", "sglang", *thresholds, "--check-lossless",
                                    "--max-new-tokens", "8", "--output-dir", str(tmp_path / "o")])
    assert res.exit_code == 1, res.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    check = report["summary"]["distribution_check"]
    assert check["verdict"] == "differs" and "not plain sampling from p by construction" in check["reason"]
    assert report["summary"]["lossless"] is False and "not plain sampling" in report["config"]["decoding"]["output"]
    assert "differs" in res.output and "not plain sampling from p by construction" in res.output


def _run(pair, out: Path, seed: int, rule: str = "eagle", topk: int = 2) -> Path:
    s = Settings.of(target=str(pair["target"]), draft=str(pair["head"]), prompts=str(pair["prompts"]),
                    max_new_tokens=16, num_steps=3, topk=topk, num_draft_tokens=5 if topk > 1 else None,
                    temperature=0.8, top_p=0.9, accept_rule=rule, seed=seed, output_dir=str(out))
    evaluate(s, LoopOptions(check_lossless=True), progress=False)
    return out


def test_seeds_reproduce_runs_byte_for_byte(pair, tmp_path):
    a = _run(pair, tmp_path / "a", seed=3)
    b = _run(pair, tmp_path / "b", seed=3)
    c = _run(pair, tmp_path / "c", seed=4)
    assert (a / "samples.jsonl").read_bytes() == (b / "samples.jsonl").read_bytes()
    ra, rb = (json.loads((x / "report.json").read_text()) for x in (a, b))
    for r in (ra, rb):
        r.pop("provenance")
        r["config"].pop("output_dir")
    assert ra == rb
    outputs = lambda x: [json.loads(line)["output_ids"] for line in (x / "samples.jsonl").read_text().splitlines()]
    assert outputs(a) != outputs(c)


def test_a_prompts_draws_do_not_depend_on_the_others(greedy):
    """prompt_generator(seed, prompt id, sample): the same record alone, after other prompts, in another order."""
    oracle, prompts = greedy
    sampled = _rule(oracle, "vllm-probabilistic", 1, None, temperature=1.0)
    forward = [sampled.decode(p).to_json() for p in prompts]
    backward = [sampled.decode(p).to_json() for p in reversed(prompts)][::-1]
    alone = sampled.with_(seed=0).decode(prompts[3]).to_json()
    assert forward == backward and alone == forward[3]
    assert sampled.decode(prompts[3], sample=1).output_ids != forward[3]["output_ids"]


@pytest.mark.slow
def test_a_run_in_another_process_is_the_same_bytes(pair, tmp_path):
    a = _run(pair, tmp_path / "here", seed=9, rule="vllm", topk=1)
    cmd = [sys.executable, "-m", "eagle_eval.cli", "run", "--target", str(pair["target"]), "--draft", str(pair["head"]),
           "--prompts", str(pair["prompts"]), "--max-new-tokens", "16", "--num-steps", "3", "--temperature", "0.8",
           "--top-p", "0.9", "--accept-rule", "vllm", "--seed", "9", "--check-lossless",
           "--output-dir", str(tmp_path / "there")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert out.returncode in (0, 3), out.stderr[-2000:]
    assert (a / "samples.jsonl").read_bytes() == (tmp_path / "there" / "samples.jsonl").read_bytes()


def test_the_report_echoes_the_rule_its_filter_order_and_the_seed(pair, tmp_path):
    out = _run(pair, tmp_path / "r", seed=5, rule="sglang")
    report = json.loads((out / "report.json").read_text())
    dec = report["config"]["decoding"]
    assert dec["rule"] == "sglang" and dec["filter_order"] == RULES.get("sglang").filter_order and dec["seed"] == 5
    assert dec["temperature"] == 0.8 and dec["top_p"] == 0.9 and dec["thresholds"] == {"single": 1.0, "acc": 1.0}
    assert "tree" in dec["drafts"] and "plain sampling" in dec["output"]
    assert report["provenance"]["seed"] == 5 and report["config"]["accept_rule"] == "sglang"
    assert report["summary"]["distribution_check"]["samples_checked"] == 6
    from eagle_eval.results.report import render_table
    text = render_table(report)
    assert "rule sglang (thresholds single 1, acc 1); seed 5" in text and RULES.get("sglang").filter_order in text
    greedy_cfg = api.load_oracle(Settings.of(target=str(pair["target"]), draft=str(pair["head"]))).resolved.as_dict()
    assert greedy_cfg["decoding"]["rule"] == "greedy"


def test_what_the_oracle_refuses(greedy, pair):
    oracle, _ = greedy
    with pytest.raises(ConfigError, match="--accept-rule vllm with --topk 3: vLLM 0.32 verifies EAGLE drafts as a "
                                          "chain"):
        oracle.with_(temperature=0.7, topk=3, num_draft_tokens=6)
    assert oracle.with_(temperature=0.0, topk=3, num_draft_tokens=6).speculator.policy.name == "greedy"
    reduced = api.load_oracle(Settings.of(target=str(pair["target"]), draft=str(pair["reduced"])))
    with pytest.raises(ConfigError, match=f"{pair['reduced']}: draft vocab 40 < target vocab 96.*sglang-rs"):
        reduced.with_(temperature=0.7, accept_rule="sglang-rs")
    sampled = reduced.with_(temperature=0.7, accept_rule="vllm-probabilistic")       # q is 0 outside the draft vocab
    assert sampled.speculator.policy.name == "vllm-probabilistic"
