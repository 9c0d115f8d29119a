"""An unexpected exception is exit 70 (internal error), never 1 (a failed check) nor a bare traceback: one line
naming the prompt and the stage where a loop over prompts was at work (errors.stage), `--debug` adds the
traceback, and a run's rows already written stay valid for --resume. The faults are injected with monkeypatch
at the 3rd prompt (or the first batch) of each command's loop."""

import json

import pytest
from click.testing import CliRunner

from eagle_eval import cli
from eagle_eval.cli import main
from eagle_eval.errors import ExitCode, InternalError, stage
from eagle_eval.records import read_jsonl


def _common(tiny):
    return ["--target", str(tiny["target"]), "--draft", str(tiny["head"]), "--prompts", str(tiny["prompts"]),
            "--max-new-tokens", "8"]


def _fail_on_call(monkeypatch, owner, name: str, n: int):
    """owner.name raises RuntimeError on its n-th call (1-based), and works otherwise."""
    real, calls = getattr(owner, name), {"n": 0}

    def flaky(*args, **kw):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError(f"injected fault\nsecond line of the fault (call {n})")
        return real(*args, **kw)
    monkeypatch.setattr(owner, name, flaky)


def _one_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("eagle-eval:")]
    assert "Traceback" not in res.output and len(lines) == 1, res.output[-3000:]
    return lines[0]


def test_the_exit_code_table_names_70_and_1_stays_a_failed_check():
    assert ExitCode.INTERNAL == 70 and ExitCode.FAILED == 1
    table = (cli.__file__.rsplit("/eagle_eval/", 1)[0] + "/docs/exit-codes.md")
    assert "| 70 | internal error |" in open(table).read()
    assert "70 internal error" in CliRunner().invoke(main, ["--help"]).output


def test_stage_names_the_prompt_and_passes_bad_input_and_ctrl_c_through():
    from eagle_eval.errors import UserError

    with pytest.raises(InternalError, match=r"^prompt q17, decode: ZeroDivisionError: division by zero$") as info:
        with stage(["q17"], "decode"):
            1 / 0
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    for passing in (UserError("bad"), KeyboardInterrupt(), FileNotFoundError("x")):
        with pytest.raises(type(passing)):
            with stage(["q1"], "decode"):
                raise passing


def test_a_fault_at_the_third_prompt_is_one_line_exit_70_and_resume_completes_it(tiny, tmp_path, monkeypatch):
    import eagle_eval.oracle as oracle_module

    whole = tmp_path / "whole"
    assert CliRunner().invoke(main, ["run", *_common(tiny), "--output-dir", str(whole)]).exit_code == 0
    out = tmp_path / "cut"
    _fail_on_call(monkeypatch, oracle_module, "speculative_decode", 3)
    res = CliRunner().invoke(main, ["run", *_common(tiny), "--output-dir", str(out)])
    assert res.exit_code == ExitCode.INTERNAL
    line = _one_line(res)
    assert line.startswith("eagle-eval: internal error: prompt p2, decode: RuntimeError: injected fault ... "), line
    assert line.endswith(f"the finished prompts are in {out}/samples.jsonl: run the same command with --resume to "
                         "continue"), line
    assert [r["id"] for r in read_jsonl(out / "samples.jsonl")] == ["p0", "p1"]
    monkeypatch.undo()
    res = CliRunner().invoke(main, ["run", *_common(tiny), "--output-dir", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    assert read_jsonl(out / "samples.jsonl") == read_jsonl(whole / "samples.jsonl")
    resumed, full = (json.loads((d / "report.json").read_text()) for d in (out, whole))
    for key in ("summary", "per_position", "histogram"):
        assert resumed[key] == full[key]


def test_with_debug_the_traceback_comes_before_the_line(tiny, tmp_path, monkeypatch):
    import eagle_eval.oracle as oracle_module

    _fail_on_call(monkeypatch, oracle_module, "speculative_decode", 1)
    res = CliRunner().invoke(main, ["--debug", "run", *_common(tiny), "--limit", "1"])
    assert res.exit_code == 70
    assert "Traceback" in res.stderr and "RuntimeError: injected fault" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("eagle-eval: internal error: prompt p0, decode: ")


def test_the_batched_loop_names_its_batch(tiny, monkeypatch):
    import eagle_eval.loop.batched as batched

    _fail_on_call(monkeypatch, batched, "batched_decode", 1)
    res = CliRunner().invoke(main, ["run", *_common(tiny), "--batch-size", "2"])
    assert res.exit_code == 70
    assert _one_line(res).startswith("eagle-eval: internal error: prompts p0 .. p3 (4), decode (batched, 2 rows): "
                                     "RuntimeError: injected fault ...")


def test_profile_and_ablate_name_the_batch_and_the_variant(tiny, monkeypatch):
    import eagle_eval.profile.teacher_forced as prof

    _fail_on_call(monkeypatch, prof, "profile_batch", 1)
    res = CliRunner().invoke(main, ["profile", *_common(tiny), "--max-steps", "2"])
    assert res.exit_code == 70
    assert _one_line(res).startswith("eagle-eval: internal error: prompts p0 .. p3 (4), profile: RuntimeError: ")
    monkeypatch.undo()
    _fail_on_call(monkeypatch, prof, "profile_batch", 2)                  # the second variant's pass
    res = CliRunner().invoke(main, ["ablate", *_common(tiny), "--max-steps", "2", "--cost-ratio", "0.1",
                                    "--vary", "aux_layers=1,3,4"])
    assert res.exit_code == 70
    assert _one_line(res).startswith("eagle-eval: internal error: variant aux_layers=1,3,4: prompts p0 .. p3 (4), "
                                     "profile: RuntimeError: injected fault")


def test_diagnose_names_the_stage(tiny, monkeypatch):
    import eagle_eval.profile.teacher_forced as prof

    _fail_on_call(monkeypatch, prof, "greedy_continuations", 1)
    res = CliRunner().invoke(main, ["diagnose", *_common(tiny), "--no-sweep", "--no-template-check"])
    assert res.exit_code == 70
    assert _one_line(res).startswith("eagle-eval: internal error: prompts p0 .. p3 (4), generate (the target's "
                                     "greedy continuations): RuntimeError: injected fault")


def test_server_check_names_the_prompt_and_the_stage(tiny, monkeypatch):
    from fake_servers import Engine, serve

    import eagle_eval.servers.check as check
    from eagle_eval import api
    from eagle_eval.settings import Settings

    served = api.load_oracle(Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), max_new_tokens=8))
    _fail_on_call(monkeypatch, check, "compare_request", 3)
    with serve(Engine(served, "sglang")) as url:
        res = CliRunner().invoke(main, ["server-check", *_common(tiny), "--backend", "sglang", "--url", url])
    assert res.exit_code == 70
    assert _one_line(res).startswith("eagle-eval: internal error: prompt p2, comparison with the oracle: "
                                     "RuntimeError: injected fault")


def test_a_fault_outside_any_loop_is_one_line_exit_70(tiny, monkeypatch):
    import eagle_eval.results.report as report

    _fail_on_call(monkeypatch, report, "render_table", 1)
    res = CliRunner().invoke(main, ["run", *_common(tiny), "--limit", "1"])
    assert res.exit_code == 70
    assert _one_line(res).startswith("eagle-eval: internal error: RuntimeError: injected fault ... (a bug")


def test_the_script_entry_ends_an_escaped_exception_with_70_not_1(monkeypatch, capsys):
    def broken(*args, **kw):
        raise RuntimeError("escaped")
    monkeypatch.setattr(cli, "main", broken)
    with pytest.raises(SystemExit) as info:
        cli.entry([])
    assert info.value.code == 70 and "RuntimeError: escaped" in capsys.readouterr().err
