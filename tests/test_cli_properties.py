"""No traceback from any input a user can produce, found systematically: hypothesis generates option values
(odd numbers, text, lists, paths) and corrupted files (truncated checkpoints, configs that are not JSON or
hold the wrong types, non-UTF-8 text, folders where files go and files where folders go) for every command,
and every invocation must end with an exit status of the table (docs/exit-codes.md) and no traceback; every
corrupted input must be exit 2 with one line naming it. Bounded: a fixed number of examples per command,
each decoding at most one prompt for two tokens."""

import json
import shutil
import string

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle_eval.cli import main
from eagle_eval.settings import BUNDLED_DRAFT, BUNDLED_TARGET

FAST = {"run": ["--limit", "1", "--max-new-tokens", "2"],
        "profile": ["--limit", "1", "--max-new-tokens", "2", "--max-steps", "2"],
        "ablate": ["--limit", "1", "--max-new-tokens", "2", "--max-steps", "2", "--cost-ratio", "0.1"],
        "diagnose": ["--limit", "1", "--max-new-tokens", "2", "--no-sweep", "--no-template-check"],
        "server-check": ["--limit", "1", "--max-new-tokens", "2", "--backend", "sglang",
                         "--url", "http://127.0.0.1:9", "--retries", "0", "--timeout", "1"]}
STATUSES = {0, 1, 2, 3}
EXAMPLES = 30                                   # per command and property: the CI budget


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=True)


def _check(res, args):
    """An exit status of the table, never a traceback; exit 2 is exactly one line (ours or click's usage error)."""
    text = res.output
    assert "Traceback" not in text, (args, text[-2000:])
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception), text[-2000:])
    assert res.exit_code in STATUSES, (args, res.exit_code, text[-2000:])
    if res.exit_code == 2:
        ours = [ln for ln in res.stderr.splitlines() if ln.startswith("eagle-eval: error:")]
        click_usage = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
        assert len(ours) + len(click_usage) == 1, (args, res.stderr[-2000:])
        return (ours or click_usage)[0]
    return None


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """Corrupted inputs, each a path a user could pass."""
    root = tmp_path_factory.mktemp("bad")
    files = {}
    files["missing"] = root / "no-such-thing"
    (root / "empty-dir").mkdir()
    files["empty_dir"] = root / "empty-dir"
    files["binary"] = root / "binary.bin"
    files["binary"].write_bytes(bytes(range(256)) * 4)
    files["not_utf8"] = root / "latin1.jsonl"
    files["not_utf8"].write_bytes(b'{"prompt": "caf\xe9"}\n')
    files["json_list"] = root / "list.json"
    files["json_list"].write_text("[1, 2, 3]")
    files["empty"] = root / "empty.jsonl"
    files["empty"].write_text("")
    files["bad_rows"] = root / "rows.jsonl"
    files["bad_rows"].write_text('{"prompt": 3}\n{"input_ids": [true, 2]}\n{"category": ["a"], "prompt": "x"}\n')
    # a head whose weights are cut short, one whose config is not JSON, one whose config has wrong types
    for name, edit in (("head_truncated", "truncate"), ("head_config_broken", "config"), ("head_types", "types")):
        d = root / name
        shutil.copytree(BUNDLED_DRAFT, d)
        if edit == "truncate":
            data = (d / "model.safetensors").read_bytes()
            (d / "model.safetensors").write_bytes(data[: len(data) // 3])
        elif edit == "config":
            (d / "config.json").write_text("{half")
        else:
            cfg = json.loads((d / "config.json").read_text())
            cfg.update(hidden_size="64", num_attention_heads=True)
            (d / "config.json").write_text(json.dumps(cfg))
        files[name] = d
    t = root / "target_truncated"
    shutil.copytree(BUNDLED_TARGET, t)
    data = (t / "model.safetensors").read_bytes()
    (t / "model.safetensors").write_bytes(data[: len(data) // 2])
    files["target_truncated"] = t
    t2 = root / "target_config_types"
    shutil.copytree(BUNDLED_TARGET, t2)
    cfg = json.loads((t2 / "config.json").read_text())
    cfg["num_hidden_layers"] = "eight"
    (t2 / "config.json").write_text(json.dumps(cfg))
    files["target_config_types"] = t2
    files["settings_bad"] = root / "settings.yaml"
    files["settings_bad"].write_text("speculation: {num_steps: many}\n")
    return files


# which corrupted inputs each file-reading option may get (all of them are bad for it)
FILE_OPTIONS = {
    "--target": ["missing", "empty_dir", "binary", "target_truncated", "target_config_types"],
    "--draft": ["missing", "empty_dir", "binary", "head_truncated", "head_config_broken", "head_types"],
    "--prompts": ["missing", "empty_dir", "binary", "not_utf8", "json_list", "empty", "bad_rows"],
    "--dataset": ["missing", "empty_dir", "binary", "not_utf8", "empty"],
    "--chat-template": ["missing", "empty_dir", "binary"],
    "--config": ["missing", "empty_dir", "binary", "not_utf8", "json_list", "settings_bad"],
}
OWN_FILE_OPTIONS = {"profile": {"--responses": ["missing", "empty_dir", "binary", "not_utf8", "json_list", "empty"]},
                    "diagnose": {"--train-dump": ["missing", "empty_dir", "binary", "json_list"]}}


def _options(command: str) -> list:
    cmd = main.get_command(None, command)
    return [p for p in cmd.params if p.opts and p.opts[0].startswith("--") and p.name != "help"]


ODD_TEXT = st.one_of(st.sampled_from(["", " ", "-1", "0", "nan", "inf", "-inf", "1e309", "true", "none", "[]",
                                      "1,2", "1,,2", "[1, 2, 3]", "2,2,2", "-5,-6,-7", "x=y", "a;b", "1.5",
                                      "99999999999999999999", "auto", "cuda:7", "0=1GiB", "cpu=1b"]),
                     st.text(string.printable, max_size=12))


def _odd_args(command: str):
    """One option of `command` with an odd value (a flag: given bare)."""
    opts = _options(command)

    @st.composite
    def build(draw):
        p = draw(st.sampled_from(opts))
        if p.is_flag:
            return [p.opts[0]] if not p.secondary_opts else [draw(st.sampled_from(p.opts + p.secondary_opts))]
        return [p.opts[0], draw(ODD_TEXT)]
    return build()


COMMANDS = ["run", "profile", "ablate", "diagnose", "server-check"]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_odd_option_values_never_give_a_traceback(command, tmp_path):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(_odd_args(command))
    def prop(extra):
        out = tmp_path / "out"
        if out.exists():
            shutil.rmtree(out)
        args = [command, *FAST[command], *extra, "--output-dir", str(out)]
        _check(_invoke(args), args)
    prop()


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_corrupted_inputs_are_one_line_exit_2(command, bad, tmp_path):
    choices = [(opt, name) for opt, names in {**FILE_OPTIONS, **OWN_FILE_OPTIONS.get(command, {})}.items()
               for name in names]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.sampled_from(choices))
    def prop(choice):
        opt, name = choice
        args = [command, *FAST[command], opt, str(bad[name])]
        res = _invoke(args)
        line = _check(res, args)
        assert res.exit_code == 2 and line is not None, (args, res.exit_code, res.output[-1500:])
    prop()


@pytest.mark.slow
def test_report_on_corrupted_files_is_one_line_exit_2(bad, tmp_path):
    under_file = bad["binary"] / "report.json"           # a path under a file
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for path in [*(bad[k] for k in ("missing", "empty_dir", "binary", "not_utf8", "json_list", "empty")),
                 under_file, loop]:
        args = ["report", str(path)]
        res = _invoke(args)
        assert _check(res, args) is not None and res.exit_code == 2, (path, res.output)
