"""The command line as a library's is: `--version` from the package metadata, and every boolean option has its
off switch (`--check-lossless/--no-check-lossless`), so a `true` in a settings file (`--config FILE`) can be
turned off on the command line; docs/cli.md (generated) shows both forms."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from eagle_eval import cli
from eagle_eval.cli import main

REPO = Path(__file__).resolve().parent.parent


def _commands():
    ctx = main.make_context("eagle-eval", ["--help"], resilient_parsing=True)
    return [("eagle-eval", main)] + [(n, main.get_command(ctx, n)) for n in main.list_commands(ctx)]


def test_version_is_the_package_metadatas(tmp_path):
    want = importlib.metadata.version("eagle-eval")
    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0 and res.output.startswith(f"eagle-eval {want} (torch "), res.output
    assert f"transformers {importlib.metadata.version('transformers')}" in res.output
    # `python -m eagle_eval` (what torchrun starts) answers the same, from any folder, without loading torch
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "eagle_eval", "--version"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == res.output.strip()
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines() if ln.startswith("import time:")}
    assert "click" in imported and "torch" not in imported and "transformers" not in imported


def test_every_boolean_option_of_every_command_has_an_off_switch():
    checked = 0
    for name, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and p.is_bool_flag and p.expose_value and p.name != "help":
                assert p.secondary_opts, f"{name} {p.opts[0]} has no off switch"
                checked += 1
    assert checked >= 40                  # every command's booleans (run alone has 12)


def _parsed(command: str, args: list[str]):
    """(Settings, own options) that `eagle-eval COMMAND ARGS` would run with (nothing loaded)."""
    root = main.make_context("eagle-eval", [command], resilient_parsing=True)   # -h as the real CLI has it
    cmd = main.get_command(root, command)
    ctx = cmd.make_context(command, list(args), parent=root)
    with ctx:
        return cli.build(command, ctx.params)


@pytest.fixture
def all_true(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("model:\n  trust_remote_code: true\n  allow_load_errors: true\n  allow_unknown_head_keys: true\n"
                    "workload:\n  no_chat_template: true\noutput:\n  output_dir: out\n  overwrite: true\n"
                    "  full_fingerprint: true\noptions:\n  check_lossless: true\n  cuda_graphs: true\n")
    return path


def test_booleans_true_in_a_settings_file_are_turned_off_by_flags(all_true):
    settings, options = _parsed("run", ["--config", str(all_true)])
    assert settings.model.trust_remote_code and settings.workload.no_chat_template and options.check_lossless
    flags = ["--no-trust-remote-code", "--no-allow-load-errors", "--no-allow-unknown-head-keys",
             "--use-chat-template", "--no-overwrite", "--no-full-fingerprint", "--no-check-lossless",
             "--no-cuda-graphs"]
    settings, options = _parsed("run", ["--config", str(all_true), *flags])
    m, w, o = settings.model, settings.workload, settings.output
    assert (m.trust_remote_code, m.allow_load_errors, m.allow_unknown_head_keys) == (False, False, False)
    assert (w.no_chat_template, o.overwrite, o.full_fingerprint) == (False, False, False)
    assert (options.check_lossless, options.cuda_graphs) == (False, False)
    # one flag turns one setting off; the file's others stay
    settings, options = _parsed("run", ["--config", str(all_true), "--no-check-lossless"])
    assert not options.check_lossless and settings.model.allow_load_errors and settings.output.overwrite


def test_the_commands_own_booleans_too(tmp_path):
    diag = tmp_path / "diagnose.yaml"
    diag.write_text("options:\n  sweep: true\n  template_check: true\n  fingerprint: true\n")
    _, options = _parsed("diagnose", ["--config", str(diag), "--no-sweep", "--no-template-check", "--no-fingerprint"])
    assert (options.sweep, options.template_check, options.fingerprint) == (False, False, False)
    check = tmp_path / "check.yaml"
    check.write_text("options:\n  hypotheses: true\n")
    _, options = _parsed("server-check", ["--config", str(check), "--no-hypotheses", "--backend", "vllm",
                                          "--url", "http://127.0.0.1:9"])
    assert options.hypotheses is False


def test_a_run_from_a_settings_file_with_the_check_turned_off_runs_no_check(tiny, tmp_path):
    import json

    cfg = tmp_path / "settings.yaml"
    cfg.write_text(f"model:\n  target: {tiny['target']}\n  draft: {tiny['head']}\nworkload:\n  prompts: "
                   f"{tiny['prompts']}\n  limit: 1\n  max_new_tokens: 4\noptions:\n  check_lossless: true\n")
    on = CliRunner().invoke(main, ["run", "--config", str(cfg), "--output-dir", str(tmp_path / "on")])
    off = CliRunner().invoke(main, ["run", "--config", str(cfg), "--no-check-lossless", "--output-dir",
                                    str(tmp_path / "off")])
    assert on.exit_code == 0 and off.exit_code == 0, (on.output, off.output)
    rows = {k: json.loads((tmp_path / k / "samples.jsonl").read_text().splitlines()[0]) for k in ("on", "off")}
    assert rows["on"]["lossless"] is True and rows["off"]["lossless"] is None
    assert "check_lossless: false" in (tmp_path / "off" / "settings.yaml").read_text()


def test_docs_cli_shows_both_forms():
    doc = (REPO / "docs" / "cli.md").read_text()
    for pair in ("--check-lossless / --no-check-lossless", "--no-chat-template / --use-chat-template",
                 "--resume / --no-resume", "--sweep / --no-sweep", "--trust-remote-code / --no-trust-remote-code",
                 "--markdown / --no-markdown", "--debug / --no-debug", "--enable-thinking / --disable-thinking"):
        assert f"| `{pair}` |" in doc, pair
    assert "| `--version` |" in doc
