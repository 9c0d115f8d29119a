"""Multi-turn construction: turn 2 is built from the target's own answer to turn 1; turns are
recorded separately and reported separately (by_turn) and together (summary)."""

import json
from pathlib import Path

from fixtures import make_tokenizer

from eagle_eval import api
from eagle_eval.settings import LoopOptions, Settings
from eagle_eval.records import SampleRecord, read_jsonl
from eagle_eval.results.report import summarize
from eagle_eval.workload.conversations import load_workload, run_turns

DATA = Path(__file__).parent / "data"
MT_BENCH = str(DATA / "mt_bench_question.jsonl")


def _record(prompt, output_ids):
    return SampleRecord(id=prompt.id, category=prompt.category, prompt_len=len(prompt.input_ids),
                        output_ids=output_ids, accepted_per_cycle=[0], emitted_per_cycle=[1], verify_count=1)


def test_second_turn_is_built_from_the_first_answer():
    tok = make_tokenizer()
    workload = load_workload(Settings.of(dataset=MT_BENCH, limit=1).workload, tok)
    seen = []

    def decode(prompt):                      # turn 1 answers "w7 w8" then EOS (id 2)
        seen.append(prompt)
        return _record(prompt, [12, 13, 2] if len(seen) == 1 else [14])

    records = list(run_turns(workload, decode))
    assert [(r.id, r.turn) for r in records] == [("81/turn1", 1), ("81/turn2", 2)]
    assert seen[0].text == "<|user|> w10 w11 w12 w13 <|assistant|> "
    assert seen[1].text == "<|user|> w10 w11 w12 w13 <|assistant|> w7 w8 <|user|> w14 w15 w16 <|assistant|> "
    assert seen[1].input_ids[:len(seen[0].input_ids) + 2] == seen[0].input_ids + [12, 13]   # EOS dropped


def test_mt_bench_run_reports_turns_separately_and_together(tiny, tmp_path, monkeypatch):
    prompts = {}
    real = api.Oracle.decode

    def spy(self, prompt, check_lossless=None):
        prompts[prompt.id] = prompt
        return real(self, prompt, check_lossless)

    monkeypatch.setattr(api.Oracle, "decode", spy)
    cfg = Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), dataset=MT_BENCH, max_new_tokens=6,
                    output_dir=str(tmp_path / "run"))
    result = api.evaluate(cfg, LoopOptions(check_lossless=True), progress=False)
    recs = {r.id: r for r in result.samples}
    assert sorted(recs) == ["111/turn1", "111/turn2", "81/turn1", "81/turn2", "82/turn1", "82/turn2"]
    special = set(make_tokenizer().all_special_ids)
    for qid in ("81", "82", "111"):
        first, second = prompts[f"{qid}/turn1"], prompts[f"{qid}/turn2"]
        answer = [t for t in recs[f"{qid}/turn1"].output_ids if t not in special]
        assert second.input_ids[:len(first.input_ids) + len(answer)] == first.input_ids + answer
        assert recs[f"{qid}/turn1"].lossless and recs[f"{qid}/turn2"].lossless   # the answer is plain greedy
    report = result.report
    assert report["summary"]["prompts"] == 6
    assert sorted(report["by_turn"]) == ["1", "2"] and sorted(report["by_category"]) == ["math", "writing"]
    for turn in (1, 2):
        assert report["by_turn"][str(turn)] == summarize([r for r in result.samples if r.turn == turn], 5)
    assert report["by_category"]["writing"] == summarize([r for r in result.samples if r.category == "writing"], 5)
    assert {r["turn"] for r in read_jsonl(tmp_path / "run" / "samples.jsonl")} == {1, 2}


def test_resume_rebuilds_turn_two_from_the_saved_first_answer(tiny, tmp_path):
    out = tmp_path / "run"
    cfg = dict(target=str(tiny["target"]), draft=str(tiny["head"]), dataset=MT_BENCH, max_new_tokens=6,
               output_dir=str(out))
    full = api.evaluate(Settings.of(**cfg), progress=False).report
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert lines[-1].startswith('{"id": "111/turn2"')
    (out / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")       # as if stopped before 111/turn2
    resumed = api.evaluate(Settings.of(**cfg, resume=True), progress=False).report
    for key in ("summary", "per_position", "histogram", "by_category", "by_turn"):
        assert resumed[key] == full[key]


def test_cli_dataset_options_reach_the_report(tiny, tmp_path):
    from click.testing import CliRunner

    from dataclasses import fields

    from eagle_eval.cli import NOT_USED, main
    from eagle_eval.settings import GROUPS

    run = main.get_command(None, "run")
    names = {f.name for cls in GROUPS.values() for f in fields(cls) if f.metadata.get("cli", True)}
    assert names - NOT_USED["run"] == {p.name for p in run.params} & names   # flags mirror the fields run uses
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", "--target", str(tiny["target"]), "--draft", str(tiny["head"]), "--dataset", str(DATA / "sharegpt.json"),
        "--categories", "sharegpt", "--shuffle-seed", "1", "--limit", "1", "--system-prompt", "w9",
        "--max-new-tokens", "4", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    cfg = report["config"]
    assert (cfg["dataset_format"], cfg["categories"], cfg["shuffle_seed"], cfg["limit"]) == \
        ("sharegpt", ["sharegpt"], 1, 1)
    assert report["sample_prompt"].startswith("<|system|> w9 <|user|> ")
    assert (out / "acceptance.csv").is_file()
    bad = CliRunner().invoke(main, ["run", "--target", str(tiny["target"]), "--draft", str(tiny["head"]),
                                    "--dataset", str(DATA / "gsm8k_test.jsonl"), "--categories", "poetry"])
    assert bad.exit_code == 2 and "gsm8k_test.jsonl: --categories 'poetry' matches no question" in bad.stderr
