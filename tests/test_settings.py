"""One typed settings object: groups validated once, a CLI generated from it, a --config file that reruns a
run, and `oracle.with_` that reuses every loaded weight a change does not touch (the settings issue)."""

import json
from dataclasses import fields

import pytest
import yaml
from click.testing import CliRunner

from eagle_eval import oracle as oracle_module
from eagle_eval.cli import NOT_USED, OWN_ONLY, SETTINGS_COMMANDS, _own_options, main, reference_markdown
from eagle_eval.settings import (
    GROUPS,
    REPO_ROOT,
    AblateOptions,
    ConfigError,
    Settings,
    choices_of,
    parse_setting,
    read_settings_file,
)

RUN = ["run", "--limit", "2", "--max-new-tokens", "6"]


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=True)


def test_groups_hold_every_setting_once_and_flat_names_are_unique():
    names = [f.name for cls in GROUPS.values() for f in fields(cls)]
    assert len(names) == len(set(names))
    s = Settings.of(num_steps=3, limit=4, dtype="bf16", output_dir="x")
    assert (s.speculation.num_steps, s.workload.limit, s.model.dtype, s.output.output_dir) == (3, 4, "bf16", "x")
    assert s.flat()["num_steps"] == 3 and set(s.flat()) == set(names)


@pytest.mark.parametrize("flat, message", [
    ({"num_steps": True}, "--num-steps: expected an integer, got bool"),
    ({"aux_layers": [1, "2", 3]}, r"--aux-layers\[1\]: expected an integer, got str"),
    ({"aux_layers": [True, 2, 3]}, r"--aux-layers\[0\]: expected an integer, got bool"),
    ({"categories": "writing"}, "--categories: expected a list, got str"),
    ({"max_new_tokens": 2.5}, "--max-new-tokens: expected an integer, got float"),
    ({"temperature": float("nan")}, "--temperature: expected a finite number"),
    ({"top_p": float("inf")}, "--top-p: expected a finite number"),
    ({"dtype": "bf8"}, "--dtype must be one of auto, bf16, fp16, fp32"),
    ({"position_offset": 2}, "--position-offset must be one of 0, 1"),
    ({"no_such_setting": 1}, "unknown setting 'no_such_setting'"),
    ({"resume": True}, "--resume needs --output-dir"),
    ({"eagle_depth": 3}, "go together"),
    ({"eagle_depth": 3, "eagle_top_k": 2, "eagle_total_token": 8, "num_steps": 4}, "conflict with --eagle-depth"),
])
def test_wrong_values_are_errors_naming_the_setting(flat, message):
    with pytest.raises(ConfigError, match=message):
        Settings.of(**flat)


def test_with_changes_one_field_and_keeps_eagle_names_consistent():
    eagle = Settings.of(eagle_depth=3, eagle_top_k=2, eagle_total_token=8)
    assert (eagle.speculation.num_steps, eagle.speculation.topk) == (4, 2)
    moved = eagle.with_(aux_layers=(1, 2, 3))                 # an unrelated change keeps EAGLE's names
    assert moved.speculation.eagle_depth == 3 and moved.speculation.num_steps == 4
    explicit = eagle.with_(num_steps=2)                      # SGLang's names replace EAGLE's
    assert explicit.speculation.eagle_depth is None and explicit.speculation.topk == 2
    assert Settings.of().with_(eagle_depth=1, eagle_top_k=1, eagle_total_token=3).speculation.num_steps == 2


def test_a_command_refuses_an_option_it_does_not_use():
    res = _invoke(["profile", "--resume", "--output-dir", "x"])
    assert res.exit_code == 2 and "No such option '--resume'" in res.output
    res = _invoke(["run", "--max-steps", "3"])
    assert res.exit_code == 2 and "No such option '--max-steps'" in res.output
    res = _invoke(["run", "--samples-per-prompt", "2"])          # the profile's; run decodes each prompt once
    assert res.exit_code == 2 and "No such option '--samples-per-prompt'" in res.output


def test_a_settings_file_may_not_set_what_the_command_ignores(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("output: {resume: true}\n")
    res = _invoke(["profile", "--config", str(path)])
    assert res.exit_code == 2 and "resume is not a setting of `profile`" in res.output, res.output
    path.write_text("output: {resume: false}\nworkload: {limit: 1, max_new_tokens: 4}\n")
    assert _invoke(["profile", "--config", str(path), "--max-steps", "2"]).exit_code == 0   # the default: harmless


@pytest.mark.parametrize("command", sorted(SETTINGS_COMMANDS))
def test_every_field_is_an_option_of_every_command_with_its_help_and_choices(command):
    """Each command's options are its settings groups' fields (less those it does not use) and its own options'
    fields, each with the field's help and choices, and nothing else but --config: no command is written by
    hand beside the generated ones (a hand-written `plan` once shadowed the generated one)."""
    cmd = main.get_command(None, command)
    params = {p.name: p for p in cmd.params}
    groups = [] if command in OWN_ONLY else list(GROUPS.values())
    own = _own_options(command)
    expected = {"config_file"}
    for cls in [*groups, *([own] if own else [])]:
        for f in fields(cls):
            if f.name in NOT_USED.get(command, set()) or not f.metadata.get("cli", True):
                assert f.name not in params, f.name
                continue
            expected.add(f.name)
            assert f.name in params, f.name
            assert params[f.name].help == f.metadata["help"], f.name
            if choices_of(f):
                assert list(params[f.name].type.choices) == [str(c) for c in choices_of(f)], f.name
    assert set(params) == expected, set(params) ^ expected


def test_settings_file_reruns_the_run_and_flags_override_it(tmp_path):
    first = tmp_path / "first"
    assert _invoke(RUN + ["--num-steps", "3", "--output-dir", str(first)]).exit_code == 0
    saved = yaml.safe_load((first / "settings.yaml").read_text())
    assert saved["command"] == "run" and saved["speculation"]["num_steps"] == 3 and saved["workload"]["limit"] == 2
    again = _invoke(["run", "--config", str(first / "settings.yaml"), "--output-dir", str(tmp_path / "again")])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "again" / "samples.jsonl").read_bytes() == (first / "samples.jsonl").read_bytes()
    rep = [json.loads((d / "report.json").read_text())["config"] for d in (first, tmp_path / "again")]
    assert {k: v for k, v in rep[0].items() if k != "output_dir"} == {k: v for k, v in rep[1].items() if k != "output_dir"}
    # a flag overrides the file; the file's other settings stay
    other = _invoke(["run", "--config", str(first / "settings.yaml"), "--num-steps", "2", "--output-dir",
                     str(tmp_path / "other")])
    assert other.exit_code == 0, other.output
    cfg = json.loads((tmp_path / "other" / "report.json").read_text())["config"]
    assert cfg["num_steps"] == 2 and cfg["limit"] == 2 and cfg["max_new_tokens"] == 6


def test_a_json_settings_file_with_flat_keys_equals_the_flags(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"num_steps": 2, "limit": 2, "max_new_tokens": 6, "aux_layers": "1,3,4"}))
    a = _invoke(["run", "--config", str(path), "--output-dir", str(tmp_path / "a")])
    b = _invoke(RUN + ["--num-steps", "2", "--aux-layers", "1,3,4", "--output-dir", str(tmp_path / "b")])
    assert a.exit_code == b.exit_code == 0, (a.output, b.output)
    assert (tmp_path / "a" / "samples.jsonl").read_bytes() == (tmp_path / "b" / "samples.jsonl").read_bytes()


@pytest.mark.parametrize("text, message", [
    ("command: profile\n", "key 'command' is 'profile'"),
    ("speculation: {num_stepz: 3}\n", "key 'speculation.num_stepz' is not a setting"),
    ("max_steps: 3\n", "key 'max_steps' is not a setting of `eagle-eval run`"),
    ("[1, 2]\n", "expected a mapping"),
    ("num_steps: [3\n", "not valid YAML"),
])
def test_bad_settings_files_are_one_line_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    res = _invoke(["run", "--config", str(path)])
    assert res.exit_code == 2 and message in res.output and str(path) in res.output, res.output
    assert "Traceback" not in res.output


def test_vary_values_parse_as_their_flags_do():
    assert parse_setting("aux_layers", "0,3,6") == (0, 3, 6)
    assert parse_setting("no_chat_template", "true") is True and parse_setting("limit", "none") is None
    with pytest.raises(ConfigError, match="expected an integer"):
        parse_setting("max_new_tokens", "many")
    assert read_settings_file  # the same reader the CLI uses (below)


def test_the_cli_reference_in_docs_is_generated_from_the_settings():
    doc = (REPO_ROOT / "docs" / "cli.md").read_text()
    assert doc == reference_markdown(), "docs/cli.md is stale: python -m eagle_eval.cli reference > docs/cli.md"
    assert "`--num-steps INTEGER`" in doc and "Draft steps S per cycle." in doc


def _count_loads(monkeypatch):
    counts = {"target": 0, "head": 0}
    real_target, real_head = oracle_module.load_target, oracle_module.load_head

    def target(*a, **k):
        counts["target"] += 1
        return real_target(*a, **k)

    def head(*a, **k):
        counts["head"] += 1
        return real_head(*a, **k)
    monkeypatch.setattr(oracle_module, "load_target", target)
    monkeypatch.setattr(oracle_module, "load_head", head)
    return counts


EIGHT = ("aux_layers=1,3,4", "aux_layers=3,5,6", "aux_convention=vllm", "position_offset=1",
         "draft_embedding=target", "max_new_tokens=8", "no_chat_template=true", "aux_layers=2,4,6")


def test_an_ablation_of_eight_variants_loads_the_target_and_the_head_once(monkeypatch):
    from eagle_eval.commands.ablate import ablate

    counts = _count_loads(monkeypatch)
    result = ablate(Settings.of(limit=2, max_new_tokens=6), AblateOptions(max_steps=3, cost_ratio=0.1, vary=EIGHT),
                    progress=False)
    assert counts == {"target": 1, "head": 1}
    assert len(result["variants"]) == 9
    # a variant through with_ equals the same settings loaded afresh
    monkeypatch.undo()
    from eagle_eval.commands.profile import profile
    fresh = profile(Settings.of(limit=2, max_new_tokens=6, aux_layers=(1, 3, 4)),
                    AblateOptions(max_steps=3).profile_options(), progress=False)
    assert result["variants"][1]["by_num_steps"] == fresh.report["by_num_steps"]


def test_a_model_change_loads_again(monkeypatch):
    counts = _count_loads(monkeypatch)
    base = oracle_module.load_oracle(Settings.of(limit=1))
    assert base.with_(num_steps=2).loaded is base.loaded
    other = base.with_(dtype="bf16")
    assert other.loaded is not base.loaded and counts == {"target": 2, "head": 2}
    assert str(other.speculator.target.model.dtype) == "torch.bfloat16"

