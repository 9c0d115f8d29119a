"""The reference loop: output equals plain greedy decoding; acceptance logic with oracle drafts."""

import pytest
import torch
from fixtures import load_prompts, make_head, make_target, write_prompts

from eagle_eval import api
from eagle_eval import oracle as oracle_module
from eagle_eval.settings import LoopOptions, Settings
from eagle_eval.loop import reference as chain
from eagle_eval.loop.draft import DraftState
from eagle_eval.loop.plain import plain_greedy


@pytest.fixture(scope="module")
def oracle_and_prompts(tiny):
    cfg = Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), prompts=str(tiny["prompts"]),
                    max_new_tokens=24)
    oracle = api.load_oracle(cfg)
    return oracle, load_prompts(cfg.workload.prompts, oracle.tokenizer)


@pytest.mark.parametrize("num_steps", [1, 2, 3, 5, 8])
def test_speculative_equals_greedy(oracle_and_prompts, num_steps):
    oracle, prompts = oracle_and_prompts
    spec = oracle.speculator
    for p in prompts:
        d = chain.speculative_decode(spec, p.input_ids, num_steps, 24, oracle.eos_ids)
        greedy = plain_greedy(spec.target, p.input_ids, 24, oracle.eos_ids)
        assert d.output_ids == greedy
        assert len(d.accepted_per_cycle) == len(d.emitted_per_cycle)
        assert 1 + sum(d.emitted_per_cycle) == len(d.output_ids)
        assert all(0 <= n <= num_steps for n in d.accepted_per_cycle)


def test_lossless_check_reports_no_divergence(oracle_and_prompts):
    oracle, prompts = oracle_and_prompts
    rec = oracle.decode(prompts[0], check_lossless=True)
    assert rec.lossless is True and rec.divergence is None


def _greedy_sequence(oracle, prompt, n):
    return prompt.input_ids + plain_greedy(oracle.speculator.target, prompt.input_ids, n, oracle.eos_ids)


@pytest.mark.parametrize("right", [True, False])
def test_always_right_and_always_wrong_drafts(oracle_and_prompts, monkeypatch, right):
    """Replace the head's proposals by an oracle that knows the greedy continuation (or avoids it)."""
    oracle, prompts = oracle_and_prompts
    num_steps, max_new = 4, 30
    for prompt in prompts[:2]:
        seq = _greedy_sequence(oracle, prompt, max_new + num_steps + 1)
        vocab = oracle.speculator.head.config.vocab_size

        def propose(self, s, seq=seq):
            # verified so far: seq[: real_len + 1] (the root is seq[real_len])
            nxt = torch.tensor(seq[self.real_len + 1: self.real_len + 1 + s])
            return nxt if right else (nxt + 1) % vocab

        monkeypatch.setattr(DraftState, "propose_chain", propose)
        d = chain.speculative_decode(oracle.speculator, prompt.input_ids, num_steps, max_new, oracle.eos_ids)
        assert d.output_ids == seq[len(prompt.input_ids):][:max_new]
        if right:
            assert all(n == num_steps for n in d.accepted_per_cycle)
        else:
            assert all(n == 0 for n in d.accepted_per_cycle)
            assert len(d.accepted_per_cycle) == max_new - 1


def test_always_right_report_rates(tiny, monkeypatch):
    """Through the API and the report: every rate 1.0 and tau = S + 1 (always right), 0.0 and 1.0 (wrong)."""
    cfg = Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), prompts=str(tiny["prompts"]),
                    max_new_tokens=21, num_steps=4)
    oracle = api.load_oracle(cfg)
    vocab = oracle.speculator.head.config.vocab_size
    seqs = {tuple(p.input_ids): _greedy_sequence(oracle, p, 40)
            for p in load_prompts(cfg.workload.prompts, oracle.tokenizer)}
    current = {}
    real_decode = chain.speculative_decode

    def decode(spec, prompt_ids, *args, **kwargs):
        current["seq"] = seqs[tuple(prompt_ids)]
        return real_decode(spec, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(oracle_module, "speculative_decode", decode)
    for right in (True, False):
        def propose(self, s, right=right):
            nxt = torch.tensor(current["seq"][self.real_len + 1: self.real_len + 1 + s])
            return nxt if right else (nxt + 1) % vocab

        monkeypatch.setattr(DraftState, "propose_chain", propose)
        report = api.evaluate(cfg, progress=False).report
        pp = report["per_position"]
        if right:
            # 20 tokens after the first one: 4 full cycles of 5 tokens per prompt
            assert all(p["conditional_rate"] == 1.0 and p["unconditional_rate"] == 1.0 for p in pp)
            assert report["summary"]["accept_length"] == 5.0
            assert report["histogram"] == [0, 0, 0, 0, report["summary"]["cycles"]]
        else:
            assert all(p["unconditional_rate"] == 0.0 for p in pp)
            assert pp[0]["conditional_rate"] == 0.0 and pp[1]["reached"] == 0
            assert report["summary"]["accept_length"] == 1.0


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_other_families_lossless(tmp_path, family):
    target = make_target(tmp_path / "t", family=family)
    head = make_head(tmp_path / "h")
    prompts = write_prompts(tmp_path / "p.jsonl", n=2)
    cfg = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=16,
                    num_steps=3)
    result = api.evaluate(cfg, LoopOptions(check_lossless=True), progress=False)
    assert result.report["summary"]["lossless"] is True
    assert result.report["config"]["target"]["architecture"].lower().startswith(family.split("_")[0])


def test_eos_stops_and_is_kept(tmp_path):
    """With EOS set to a token the target emits, both decoders stop right after it."""
    target = make_target(tmp_path / "t0")
    head = make_head(tmp_path / "h")
    prompts = write_prompts(tmp_path / "p.jsonl", n=1)
    cfg = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=20)
    oracle = api.load_oracle(cfg)
    prompt = load_prompts(cfg.workload.prompts, oracle.tokenizer)[0]
    full = plain_greedy(oracle.speculator.target, prompt.input_ids, 20, set())
    eos = full[5]
    cut = full[: full.index(eos) + 1]
    d = chain.speculative_decode(oracle.speculator, prompt.input_ids, 3, 20, {eos})
    assert d.output_ids == cut == plain_greedy(oracle.speculator.target, prompt.input_ids, 20, {eos})
