"""Bad input, every class x every command that reads it: exit 2, one line naming the file, no traceback.

Each case corrupts one file of a temporary copy of the bundled pair (target, head, prompts) and runs
the CLI in-process (click's runner), so torch and transformers are imported once.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagle_eval.cli import main
from eagle_eval.settings import BUNDLED_DRAFT, BUNDLED_PROMPTS, BUNDLED_TARGET

FAST = {
    "run": ["run", "--limit", "1", "--max-new-tokens", "4"],
    "profile": ["profile", "--limit", "1", "--max-new-tokens", "4", "--max-steps", "2"],
    "ablate": ["ablate", "--limit", "1", "--max-new-tokens", "4", "--max-steps", "2", "--cost-ratio", "0.1"],
    "diagnose": ["diagnose", "--limit", "1", "--max-new-tokens", "4", "--no-sweep", "--no-template-check"],
    "server-check": ["server-check", "--backend", "sglang", "--limit", "1", "--max-new-tokens", "4"],
}
ALL = tuple(FAST)


@pytest.fixture
def pair(tmp_path):
    shutil.copytree(BUNDLED_TARGET, tmp_path / "target")
    shutil.copytree(BUNDLED_DRAFT, tmp_path / "draft")
    shutil.copy(BUNDLED_PROMPTS, tmp_path / "prompts.jsonl")
    (tmp_path / "server.log").write_text("")
    return tmp_path


def _truncate(file: Path, keep: int | None = None):
    data = file.read_bytes()
    file.write_bytes(data[: keep if keep is not None else len(data) // 2])


def _rewrite_tensors(file: Path, fn):
    tensors = load_file(str(file))
    fn(tensors)
    save_file(tensors, str(file))


def _edit_json(file: Path, fn):
    cfg = json.loads(file.read_text())
    fn(cfg)
    file.write_text(json.dumps(cfg))


def _d2t_out_of_range(t):
    t["d2t"] = t["d2t"].clone()
    t["d2t"][-1] = 10_000


def _prompt_rows(p: Path, rows):
    (p / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


# (name, corrupt(pair folder), what the line must name, commands)
CASES = [
    ("target-config-not-json", lambda p: (p / "target/config.json").write_text("{not json"),
     "target/config.json", ALL),
    ("target-config-binary", lambda p: (p / "target/config.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe"),
     "target/config.json", ALL),
    ("target-weights-truncated", lambda p: _truncate(p / "target/model.safetensors"),
     "target/model.safetensors", ALL),
    ("target-weights-not-safetensors", lambda p: (p / "target/model.safetensors").write_text("hello " * 100),
     "target/model.safetensors", ALL),
    ("target-no-tokenizer", lambda p: [(p / "target" / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
     "target", ALL),
    ("target-remote-code", lambda p: _edit_json(p / "target/config.json",
                                                lambda c: c.update(auto_map={"AutoModelForCausalLM": "m.M"})),
     "--trust-remote-code", ALL),
    ("draft-weights-truncated", lambda p: _truncate(p / "draft/model.safetensors"),
     "draft/model.safetensors", ALL),
    ("draft-weights-header-only", lambda p: _truncate(p / "draft/model.safetensors", 5),
     "draft/model.safetensors", ALL),
    ("draft-config-binary", lambda p: (p / "draft/config.json").write_bytes(bytes(range(256))),
     "draft/config.json", ALL),
    ("draft-config-list", lambda p: (p / "draft/config.json").write_text("[1, 2]"), "draft/config.json", ALL),
    ("draft-config-wrong-type", lambda p: _edit_json(p / "draft/config.json",
                                                     lambda c: c.update(num_attention_heads="six")),
     "draft/config.json", ("run", "profile")),
    ("d2t-out-of-range", lambda p: _rewrite_tensors(p / "draft/model.safetensors", _d2t_out_of_range),
     "'d2t'", ALL),
    ("prompt-ids-out-of-vocab", lambda p: _prompt_rows(p, [{"id": "a", "input_ids": [1, 5, 99999]}]),
     "token id 99999", ALL),
    ("prompt-ids-negative", lambda p: _prompt_rows(p, [{"id": "a", "input_ids": [1, -3]}]),
     "token id -3", ("run", "profile", "ablate", "diagnose")),
    ("prompt-too-long", lambda p: _prompt_rows(p, [{"id": "a", "input_ids": [5] * 1030}]),
     "max_position_embeddings", ALL),
    ("prompts-not-text", lambda p: (p / "prompts.jsonl").write_bytes(b"\xff\xfe\x00garbage\n"),
     "prompts.jsonl", ALL),
]


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=True)


def _assert_one_line(result, names: str):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    err = [ln for ln in result.stderr.splitlines() if ln.startswith("eagle-eval: error:")]
    assert len(err) == 1, result.stderr
    assert names in err[0], err[0]
    assert "Traceback" not in result.output + result.stderr


PARAMS = [pytest.param(name, cmd, corrupt, names, id=f"{name}-{cmd}")
          for name, corrupt, names, cmds in CASES for cmd in cmds]


@pytest.mark.parametrize("name, cmd, corrupt, names", PARAMS)
def test_bad_input_is_one_line(pair, name, cmd, corrupt, names):
    corrupt(pair)
    args = FAST[cmd] + ["--target", str(pair / "target"), "--draft", str(pair / "draft"),
                        "--prompts", str(pair / "prompts.jsonl")]
    if cmd == "server-check":
        args += ["--sglang-log", str(pair / "server.log")]
    _assert_one_line(_invoke(args), names)


@pytest.mark.parametrize("cmd", ["profile", "ablate"])
@pytest.mark.parametrize("rows, names", [
    ('{"id": "counting-01", "output_ids": [1, 2, 50000]}\n', "token id 50000"),
    ('{"id": "counting-01", "output_ids": "abc"}\n', "'output_ids'"),
    ('\xff\n', "responses.jsonl"),
    ('[1, 2]\n{"id": "x"}\n', "responses.jsonl:1"),
])
def test_bad_responses(pair, cmd, rows, names):
    (pair / "responses.jsonl").write_text(rows, encoding="latin-1")
    _assert_one_line(_invoke(FAST[cmd] + ["--responses", str(pair / "responses.jsonl")]), names)


@pytest.mark.parametrize("cmd", ALL)
def test_output_dir_that_is_a_file(tmp_path, cmd):
    (tmp_path / "f").write_text("x")
    extra = ["--sglang-log", str(tmp_path / "f")] if cmd == "server-check" else []
    _assert_one_line(_invoke(FAST[cmd] + extra + ["--output-dir", str(tmp_path / "f")]), "is a file")


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a CUDA device this machine has")
@pytest.mark.parametrize("cmd", ["run", "profile", "diagnose"])
def test_cuda_on_a_machine_without_one(cmd):
    _assert_one_line(_invoke(FAST[cmd] + ["--device-map", "cuda:0"]), "no CUDA device")


@pytest.mark.parametrize("flags", [["--num-steps", "5"], ["--topk", "2"], ["--num-draft-tokens", "4"]])
def test_eagle_flags_conflict_with_explicit_ones(flags):
    eagle = ["--eagle-depth", "3", "--eagle-top-k", "1", "--eagle-total-token", "4"]
    _assert_one_line(_invoke(FAST["run"] + eagle + flags), "conflict with --eagle-depth")


def test_resume_and_overwrite_exclude_each_other(tmp_path):
    _assert_one_line(_invoke(FAST["run"] + ["--output-dir", str(tmp_path), "--resume", "--overwrite"]),
                     "--resume and --overwrite")


def test_debug_prints_the_traceback_too(pair):
    (pair / "target/config.json").write_text("{not json")
    result = _invoke(["--debug"] + FAST["run"] + ["--target", str(pair / "target")])
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "JSONDecodeError" in result.stderr


def test_our_python_warning_is_not_printed_twice():
    result = _invoke(FAST["run"] + ["--num-draft-tokens", "3"])
    assert result.exit_code == 0, result.output
    said = "speculative_num_draft_tokens is adjusted"
    assert (result.stdout + result.stderr).count(said) == 1
