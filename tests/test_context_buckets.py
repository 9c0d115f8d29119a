"""Acceptance by context length (issue 40), for every draft kind: the buckets of a run recomputed by hand from its
samples.jsonl (and of a profile from its per_start.jsonl), with nothing of eagle_eval's bucket code; the interval
checked by its coverage on synthetic clustered data and against diagnose's paired delta; `eagle-eval report`
re-bucketing saved folders; the long-context workload built from the bundled prompts, and what it refuses; the
training-length finding on planted decays (synthetic records and a real loop) and on too little data."""

import csv
import json
import math
import random
import shutil

import pytest
import torch
from click.testing import CliRunner
from test_report_command import _partly_right_drafts

from eagle_eval import oracle as oracle_module
from eagle_eval.cli import main
from eagle_eval.diagnose.decide import paired_delta
from eagle_eval.loop.draft import DraftState
from eagle_eval.loop.plain import plain_greedy
from eagle_eval.records import SampleRecord
from eagle_eval.results.comparison import Z95, tau_se_cycles
from eagle_eval.results.context import from_records
from eagle_eval.settings import BUNDLED_TARGET, WorkloadSettings
from eagle_eval.stats.clustered import difference, t_interval
from eagle_eval.workload.conversations import load_workload
from eagle_eval.workload.data import DataError

# Student's t 0.975 quantiles (printed tables), by degrees of freedom
T975 = {1: 12.706205, 2: 4.302653, 3: 3.182446, 4: 2.776445, 5: 2.570582, 6: 2.446912, 7: 2.364624}
STEPS = 3


def _by_hand(cycles: list[tuple[str, int, int]], edges: list[int], steps: int = STEPS) -> list[dict]:
    """cycles: (prompt, context, accepted) -> per bucket [e_i, e_i+1) (the last open): cycles, tau, u_i and tau's
    95% interval over prompts, SE = sqrt(J / (J - 1) sum_j (y_j - tau n_j)^2) / N, t at J - 1 df."""
    out = []
    for i, low in enumerate(edges):
        high = edges[i + 1] if i + 1 < len(edges) else math.inf
        mine = [(p, a) for p, c, a in cycles if low <= c < high]
        per = {}
        for p, a in mine:
            y, n = per.get(p, (0, 0))
            per[p] = (y + a + 1, n + 1)
        n_all = len(mine)
        tau = sum(a + 1 for _, a in mine) / n_all if n_all else None
        row = {"low": low, "cycles": n_all, "prompts": len(per), "tau": tau,
               "u": [sum(a >= k for _, a in mine) / n_all if n_all else None for k in range(1, steps + 1)]}
        if len(per) >= 2:
            se = math.sqrt(len(per) / (len(per) - 1) * sum((y - tau * n) ** 2 for y, n in per.values())) / n_all
            row["interval"] = (tau - T975[len(per) - 1] * se, tau + T975[len(per) - 1] * se)
        out.append(row)
    return out


def _cycles_of(folder) -> list[tuple[str, int, int]]:
    """(prompt, context, accepted) of every verify cycle in samples.jsonl: a cycle's root sits after the prompt
    and the tokens the earlier cycles emitted (the first root is the token the prefill emitted)."""
    out = []
    for line in (folder / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert sum(row["emitted_per_cycle"]) == len(row["output_ids"]) - 1        # the prefill emitted one
        position = row["prompt_len"]
        for accepted, emitted in zip(row["accepted_per_cycle"], row["emitted_per_cycle"]):
            out.append((row["id"], position, accepted))
            position += emitted
    return out


def _assert_buckets(saved: list[dict], hand: list[dict]) -> None:
    assert [b["low"] for b in saved] == [h["low"] for h in hand]
    for b, h in zip(saved, hand):
        assert (b["cycles"], b["prompts"]) == (h["cycles"], h["prompts"])
        assert b["accept_length"]["value"] == pytest.approx(h["tau"], abs=1e-12)
        assert [p["unconditional_rate"]["value"] for p in b["per_position"]] == pytest.approx(h["u"], abs=1e-12)
        if "interval" in h:
            assert (b["accept_length"]["low"], b["accept_length"]["high"]) == pytest.approx(h["interval"], abs=1e-5)


@pytest.fixture(scope="module")
def run_folder(tiny, tmp_path_factory):
    """A saved run of the tiny pair on 4 prompts (7..10 tokens, 40 new tokens), drafts wrong 1 time in 3, bucketed
    at 0, 16, 32, as a user would run it."""
    out = tmp_path_factory.mktemp("ctx") / "run"
    with pytest.MonkeyPatch.context() as mp:
        _partly_right_drafts(mp, 3)
        res = CliRunner().invoke(main, ["run", "--target", str(tiny["target"]), "--draft", str(tiny["head"]),
                                        "--prompts", str(tiny["prompts"]), "--num-steps", str(STEPS),
                                        "--max-new-tokens", "40", "--context-buckets", "0,16,32",
                                        "--output-dir", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.stdout


def test_run_buckets_are_the_records_counted_by_hand(run_folder):
    """report.json's by_context and acceptance.csv's context rows against samples.jsonl counted here."""
    folder, printed = run_folder
    report = json.loads((folder / "report.json").read_text())
    cycles = _cycles_of(folder)
    hand = _by_hand(cycles, [0, 16, 32])
    assert all(h["cycles"] for h in hand) and len({p for p, _, _ in cycles}) == 4      # every bucket holds cycles
    _assert_buckets(report["by_context"]["buckets"], hand)
    assert sum(b["cycles"] for b in report["by_context"]["buckets"]) == report["summary"]["cycles"]
    rows = {r["group"]: r for r in csv.DictReader(open(folder / "acceptance.csv"))}
    for h, group in zip(hand, ("context:0-16", "context:16-32", "context:32-inf")):
        assert int(rows[group]["cycles"]) == h["cycles"]
        assert float(rows[group]["acceptance_length"]) == pytest.approx(h["tau"], abs=1e-12)
        assert (float(rows[group]["acceptance_length_low"]), float(rows[group]["acceptance_length_high"])) == \
            pytest.approx(h["interval"], abs=1e-5)
    assert "acceptance by context" in printed and "[32, inf)" in printed
    assert "context_buckets:\n  - 0\n  - 16\n  - 32\n" in (folder / "settings.yaml").read_text()  # a rerun keeps them


def test_report_rebuckets_a_saved_run_without_a_model(run_folder, tmp_path):
    """Other edges and a training length, from samples.jsonl alone; the folder is not written to; the exit status
    is the finding's (decayed 1, not decayed 0, undecided 3)."""
    folder, _ = run_folder
    before = (folder / "report.json").read_bytes()
    res = CliRunner().invoke(main, ["report", str(folder), "--context-buckets", "0,24", "--train-context", "24",
                                    "--csv", str(tmp_path / "c.csv")])
    verdict = next(line for line in res.stdout.splitlines() if line.startswith("train context 24:"))
    status = {"DECAYED": 1, "NOT DECAYED": 0, "UNDECIDED": 3}[verdict.split("): ")[1].split(" (")[0]]
    assert res.exit_code == status, res.output
    hand = _by_hand(_cycles_of(folder), [0, 24])
    rows = [r for r in csv.DictReader(open(tmp_path / "c.csv")) if r["group"].startswith("context:")]
    assert [(r["group"], r["train_context_side"]) for r in rows] == [("context:0-24", "before"),
                                                                     ("context:24-inf", "past")]
    for r, h in zip(rows, hand):
        assert int(r["cycles"]) == h["cycles"] and float(r["acceptance_length"]) == pytest.approx(h["tau"])
    # the finding's difference, by hand: tau past - tau before
    assert f"past - before = {hand[1]['tau'] - hand[0]['tau']:+.3f}" in verdict
    assert (folder / "report.json").read_bytes() == before
    again = CliRunner().invoke(main, ["report", str(folder)])       # without the options: the saved buckets
    assert again.exit_code == 0 and "[16, 32)" in again.stdout and "train context" not in again.stdout


def test_report_refuses_to_rebucket_without_the_records(run_folder, tmp_path):
    shutil.copy(run_folder[0] / "report.json", tmp_path / "report.json")
    res = CliRunner().invoke(main, ["report", str(tmp_path / "report.json"), "--context-buckets", "0,24"])
    assert res.exit_code == 2
    assert f"{tmp_path / 'samples.jsonl'}: missing; re-bucketing a run by context reads it" in res.stderr
    bad = CliRunner().invoke(main, ["report", str(tmp_path / "report.json"), "--context-buckets", "24,0"])
    assert bad.exit_code == 2 and "--context-buckets must be auto or strictly increasing" in bad.stderr


def test_a_tampered_bucket_is_refused(run_folder, tmp_path):
    report = json.loads((run_folder[0] / "report.json").read_text())
    report["by_context"]["buckets"][1]["histogram"][0] += 1
    (tmp_path / "report.json").write_text(json.dumps(report))
    res = CliRunner().invoke(main, ["report", str(tmp_path / "report.json")])
    assert res.exit_code == 2 and "by_context bucket [16, 32): 'cycles'/'accept_length' do not follow" in res.stderr


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.7", "--samples-per-prompt", "2"]],
                         ids=["greedy", "T0.7"])
def test_profile_buckets_its_starts_and_report_rebuckets_them(tiny, tmp_path, sampling):
    """A profile's by_context is the mean over every start of its continuations (per_start.jsonl: P(A >= i), 0 or
    1 when greedy, exact at T > 0, every sample of a prompt in its unit) in the bucket of the start's root,
    prompt_len + start - 1; counted here by hand."""
    out = tmp_path / "prof"
    res = CliRunner().invoke(main, ["profile", "--target", str(tiny["target"]), "--draft", str(tiny["head"]),
                                    "--prompts", str(tiny["prompts"]), "--num-steps", "2", "--max-steps", "3",
                                    "--max-new-tokens", "24", "--output-dir", str(out), *sampling])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["report", str(out), "--context-buckets", "0,20", "--train-context", "20",
                                    "--csv", str(tmp_path / "p.csv")])
    verdict = next(line for line in res.stdout.splitlines() if line.startswith("train context 20:"))
    assert "expected tokens per step (1 + sum_i P(A >= i) per start) past - before" in verdict
    assert res.exit_code == {"DECAYED": 1, "NOT DECAYED": 0, "UNDECIDED": 3}[
        verdict.split("): ")[-1].split(" (")[0]], res.output
    rows = [json.loads(line) for line in (out / "per_start.jsonl").read_text().splitlines()]
    lens = {json.loads(line)["id"]: json.loads(line)["prompt_len"] for line in (out / "samples.jsonl").read_text()
            .splitlines()}
    mine = [r for r in rows if r["num_steps"] == 2]
    assert mine and all(r["prompt_len"] == lens[r["prompt_id"]] for r in mine)
    assert len({r["sample"] for r in mine}) == (2 if sampling else 1)
    got = {r["group"]: r for r in csv.DictReader(open(tmp_path / "p.csv")) if r["group"].startswith("context:")}
    for group, low, high in (("context:0-20", 0, 20), ("context:20-inf", 20, math.inf)):
        starts = [r for r in mine if low <= r["prompt_len"] + r["start"] - 1 < high]
        assert int(got[group]["starts"]) == len(starts) > 0
        assert float(got[group]["acceptance_length"]) == pytest.approx(
            1 + sum(sum(r["p_accept_at_least"]) for r in starts) / len(starts), abs=1e-12)
        assert float(got[group]["acceptance_at_pos_1"]) == pytest.approx(
            sum(r["p_accept_at_least"][1] for r in starts) / len(starts), abs=1e-12)
    assert "acceptance by context  (starts;" in res.stdout


def test_the_interval_covers_at_its_level_on_clustered_data():
    """Prompts of unequal difficulty (each its own acceptance rate) and length: the interval over prompts covers
    the true tau about 95% of the time, where the interval that takes cycles as independent (comparison.py's)
    covers about half the time: the test can tell an interval that ignores the prompts."""
    rng, steps, prompts, reps = random.Random(7), 3, 12, 1000
    true = 1 + steps * 0.55                       # E[accepted + 1] with the rate uniform on [0.2, 0.9]
    ours = naive = 0
    for _ in range(reps):
        units, hist = [], [0] * (steps + 1)
        for _ in range(prompts):
            rate, n = rng.uniform(0.2, 0.9), rng.randint(5, 30)
            accepted = [sum(rng.random() < rate for _ in range(steps)) for _ in range(n)]
            units.append((sum(a + 1 for a in accepted), n))
            for a in accepted:
                hist[a] += 1
        iv = t_interval(units)
        ours += iv["low"] <= true <= iv["high"]
        tau = sum((a + 1) * h for a, h in enumerate(hist)) / sum(hist)
        naive += abs(tau - true) <= Z95 * tau_se_cycles(hist)
    assert 0.91 <= ours / reps <= 0.975
    assert naive / reps < 0.8


def test_the_difference_is_diagnoses_paired_delta():
    """Over the same prompts, R2 - R1 and its SE equal diagnose/decide.py's paired delta (written before it)."""
    a = [(6, 3), (4, 1), (9, 4), (2, 2)]
    b = [(3, 3), (1, 1), (5, 4), (3, 2)]
    delta, se = paired_delta(a, b)                                   # tau(a) - tau(b)
    d = difference([(yb, nb, ya, na) for (ya, na), (yb, nb) in zip(a, b)])
    assert d["value"] == pytest.approx(delta, abs=1e-12) and d["se"] == pytest.approx(se, abs=1e-12)
    assert d["high"] - d["value"] == pytest.approx(T975[3] * se, abs=1e-5)


def _records(per_prompt: dict[str, list[tuple[int, int]]], prompt_len: int = 10) -> list[SampleRecord]:
    """Records whose cycles each emit accepted + 1 tokens: per prompt [(accepted, how many cycles)], in order."""
    out = []
    for pid, runs in per_prompt.items():
        accepted = [a for a, k in runs for _ in range(k)]
        out.append(SampleRecord(id=pid, category="c", prompt_len=prompt_len, output_ids=[5] * (1 + sum(accepted)
                                                                                              + len(accepted)),
                                accepted_per_cycle=accepted, emitted_per_cycle=[a + 1 for a in accepted],
                                verify_count=len(accepted)))
    return out


def _finding(samples, train_context: int = 64) -> dict:
    return from_records(samples, STEPS, None, train_context)["train_context_finding"]


def test_a_planted_decay_is_found_and_too_little_data_is_undecided():
    rng = random.Random(3)
    # six prompts: 3 drafts accepted (sometimes 2) up to position 64, then 0 (sometimes 1)
    decayed = {f"p{j}": [(3 - (rng.random() < 0.2), 1) for _ in range(14)] + [((rng.random() < 0.2), 1)
                                                                               for _ in range(30)] for j in range(6)}
    found = _finding(_records(decayed))
    assert found["verdict"] == "decayed" and found["prompts_past"] == 6 and found["difference"]["high"] < -1
    flat = {f"p{j}": [(2 + (j + k) % 2, 1) for k in range(40)] for j in range(8)}   # the same before and past
    assert _finding(_records(flat))["verdict"] == "not decayed"
    # one prompt reaches past 64: too few prompts on that side, however clear it looks
    one_past = {"p0": [(3, 14), (0, 30)], **{f"p{j}": [(3, 10)] for j in range(1, 6)}}
    found = _finding(_records(one_past))
    assert found["verdict"] == "undecided" and "too few prompts" in found["reason"]
    # two prompts, a few noisy cycles each side: the interval cannot tell
    few = {"p0": [(3, 14), (0, 1), (3, 1)], "p1": [(3, 14), (3, 1), (2, 1)]}     # contexts 10, 14, .., 62, then 66
    found = _finding(_records(few))
    assert found["verdict"] == "undecided" and found["cycles_past"] == 4


def _right_before(mp, length: int) -> None:
    """Drafts = the target's greedy continuation while the draft's position is before `length`, wrong from there:
    a decay planted at a training length, in the real loop."""
    current = {}
    real_decode = oracle_module.speculative_decode

    def decode(spec, prompt_ids, num_steps, max_new_tokens, *args, **kwargs):
        current["seq"] = prompt_ids + plain_greedy(spec.target, prompt_ids, max_new_tokens + num_steps + 1, set())
        return real_decode(spec, prompt_ids, num_steps, max_new_tokens, *args, **kwargs)

    def propose(self, s):
        nxt = current["seq"][self.real_len + 1: self.real_len + 1 + s]
        return torch.tensor([(t + 1) % 96 if self.real_len + 1 + j >= length else t for j, t in enumerate(nxt)])

    mp.setattr(oracle_module, "speculative_decode", decode)
    mp.setattr(DraftState, "propose_chain", propose)


def test_run_says_decayed_past_a_planted_training_length(tiny, monkeypatch):
    _right_before(monkeypatch, 24)
    res = CliRunner().invoke(main, ["run", "--target", str(tiny["target"]), "--draft", str(tiny["head"]),
                                    "--prompts", str(tiny["prompts"]), "--num-steps", str(STEPS),
                                    "--max-new-tokens", "48", "--train-context", "24"])
    assert res.exit_code == 1, res.output
    assert "DECAYED" in res.stdout and "[24, " in res.stdout


def test_long_context_prompts_from_the_bundled_prompts():
    """Each prompt reaches L tokens with the fewest texts (one text fewer falls short), ends with the question's
    own first text, and the lengths of one question share the start of one seeded order."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BUNDLED_TARGET)
    limits = (tok.vocab_size, 1024, 50, "max_position_embeddings")
    w = load_workload(WorkloadSettings(long_context=(64, 200), limit=3), tok, limits)
    assert [p.id for p in w.first_prompts] == [f"{q}/ctx{n}" for q in ("counting-01", "glossary-01", "story-01")
                                               for n in (64, 200)]
    info = w.resolved["long_context_workload"]
    assert info["lengths"] == [64, 200] and info["pool"]["texts"] == 32 and info["truncated"] == 0

    def tokens(content):
        text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                       add_generation_prompt=True)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    finals = {"counting-01": "Count up by ones from 410:", "glossary-01": "List Velsh words from deer.",
              "story-01": "Tell me a story about Finn, starting in SinPes."}
    def texts(p):                         # the user turn's texts, as the bundled template writes the turn
        return p.text.split("<|user|>\n")[1].split("</s>\n<|assistant|>")[0].split("\n\n")

    for q, short, long in zip(w.questions[::2], w.first_prompts[::2], w.first_prompts[1::2]):
        for p, n in ((short, 64), (long, 200)):
            t = texts(p)
            assert t[-1] == finals[q.id.split("/")[0]] and t[-1] not in t[:-1]
            assert len(p.input_ids) == tokens("\n\n".join(t)) >= n > tokens("\n\n".join(t[:-2] + t[-1:]))
        assert texts(long)[:len(texts(short)) - 1] == texts(short)[:-1]     # one order, its start shared


def test_long_context_truncates_to_fit_and_refuses_what_it_cannot_build(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BUNDLED_TARGET)
    # room for exactly 200 or 201 tokens: the fewest texts overshoot, so the texts are cut from the left
    w = load_workload(WorkloadSettings(long_context=(200,), limit=3), tok, (tok.vocab_size, 251, 50, "bound"))
    assert all(200 <= len(p.input_ids) <= 201 for p in w.first_prompts)
    assert w.resolved["long_context_workload"]["truncated"] >= 1
    with pytest.raises(DataError, match=r"--long-context 5000: .*prompts.jsonl cannot fill it: all 31 other texts"):
        load_workload(WorkloadSettings(long_context=(5000,), limit=1), tok, None)
    with pytest.raises(DataError, match=r"--long-context 2000: the target takes prompts of at most 974 tokens here"):
        load_workload(WorkloadSettings(long_context=(64, 2000), limit=1), tok, (tok.vocab_size, 1024, 50, "b"))
    ids_only = tmp_path / "ids.jsonl"
    ids_only.write_text(json.dumps({"id": "x", "input_ids": [1, 2, 3]}) + "\n")
    with pytest.raises(DataError, match="needs the question's text, and this row holds only 'input_ids'"):
        load_workload(WorkloadSettings(prompts=str(ids_only), long_context=(8,)), tok, None)


def test_long_context_is_one_command(tmp_path):
    """`run --long-context L --train-context N` with the bundled pair: every root past N, none before, so the
    finding is undecided (exit 3), and the report echoes how the prompts were built."""
    out = tmp_path / "long"
    res = CliRunner().invoke(main, ["run", "--limit", "2", "--max-new-tokens", "8", "--long-context", "96",
                                    "--train-context", "64", "--output-dir", str(out)])
    assert res.exit_code == 3, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["long_context_workload"]["lengths"] == [96]
    assert all(b["side"] == "past" for b in report["by_context"]["buckets"] if b["cycles"])
    assert report["by_context"]["train_context_finding"]["reason"].startswith("too few prompts on a side: 0 before")
    assert "long context  at least 96 tokens per prompt" in res.stdout
