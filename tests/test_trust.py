"""Trustworthy in CI and in careless hands (the parts below the CLI): every class of fault has
cases of its own here. Exit statuses from findings, weight dtypes, no tracebacks from folders and files,
nothing coerced, resume with planted rows, `report` over every command's results, ablate's advice,
progress and fingerprints.
"""

import errno
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle_eval.settings import BUNDLED_DRAFT, Settings
from eagle_eval.errors import ExitCode
from eagle_eval import findings as fnd


def _draft(tmp_path: Path, edit=None, name: str = "draft") -> Path:
    """A copy of the bundled head, its tensors passed through `edit(tensors)` first."""
    out = tmp_path / name
    shutil.copytree(BUNDLED_DRAFT, out)
    if edit is not None:
        tensors = load_file(str(out / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(out / "model.safetensors"))
    return out


def _edit_config(folder: Path, edit) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# -- exit statuses from findings: each severity, and the load-time gate ----------------------------------

@pytest.mark.parametrize("severities, status", [
    ((), ExitCode.OK),
    (("info",), ExitCode.OK),
    (("info", "warning"), ExitCode.OK),
    (("undecided",), ExitCode.UNDECIDED),
    (("warning", "undecided"), ExitCode.UNDECIDED),
    (("error",), ExitCode.FAILED),
    (("undecided", "error", "info"), ExitCode.FAILED),
])
def test_the_exit_status_of_findings_follows_the_worst_severity(severities, status):
    found = [fnd.Finding(s, f"code-{i}", "m") for i, s in enumerate(severities)]
    decision = fnd.decide(found)
    assert decision.status == status == fnd.exit_status(found)
    assert decision.failing == tuple(f.code for f in found if f.severity == "error")
    assert decision.undecided == tuple(f.code for f in found if f.severity == "undecided")
    assert fnd.decide([f.as_dict() for f in found]) == decision          # as stored in a report


def test_a_decision_names_the_findings_that_set_it():
    assert fnd.decide([fnd.undecided("x", "could not tell")]).message() == "1 check(s) could not decide: x"
    assert fnd.decide([fnd.error("a", ""), fnd.error("b", ""), fnd.error("a", "")]).message("load-time check") == \
        "2 load-time check(s) failed: a, b"
    assert fnd.decide([fnd.info("c", "")]).message() == ""


# -- weight dtypes: every head tensor against what it may be ---------------------------------------------

@pytest.mark.parametrize("key, dtype, said", [
    ("lm_head.weight", torch.int32, "int32"),
    ("midlayer.self_attn.q_proj.weight", torch.int8, "int8"),
    ("fc.weight", torch.bool, "bool"),
    ("norm.weight", torch.float8_e4m3fn, "quantized head"),
    ("d2t", torch.float32, "an integer type"),
    ("d2t", torch.bool, "an integer type"),
    ("t2d", torch.int64, "bool"),
])
def test_a_tensor_stored_in_a_dtype_it_may_not_have_is_refused_at_load(tmp_path, key, dtype, said):
    from eagle_eval.heads.io import CheckpointError, load_head

    def edit(t):
        t[key] = (t[key].float() * 50).to(dtype) if key not in ("d2t", "t2d") else t[key].to(dtype)

    with pytest.raises(CheckpointError) as caught:
        load_head(_draft(tmp_path, edit))
    line = str(caught.value)
    assert "model.safetensors" in line and repr(key) in line and str(dtype).replace("torch.", "") in line
    assert said in line


def test_the_dtypes_a_head_may_have_load(tmp_path):
    from eagle_eval.heads.io import load_head

    def edit(t):
        t["d2t"] = t["d2t"].to(torch.int32)
        t["fc.weight"] = t["fc.weight"].to(torch.bfloat16)
        t["norm.weight"] = t["norm.weight"].to(torch.float16)

    loaded = load_head(_draft(tmp_path, edit))
    ref = load_head(BUNDLED_DRAFT)
    assert torch.equal(loaded.head.d2t, ref.head.d2t) and loaded.head.d2t.dtype == torch.long


def test_diagnose_never_reports_an_integer_weight_as_fp32(tmp_path):
    from eagle_eval.heads.checks.sanity import dtype_findings

    draft = _draft(tmp_path)
    ok = dtype_findings(str(draft / "model.safetensors"), "fp32", None)
    assert ok[0].severity == "info" and "(d2t int64, t2d bool)" in ok[0].message

    def edit(t):
        t["lm_head.weight"] = (t["lm_head.weight"] * 100).to(torch.int16)

    bad = _draft(tmp_path, edit, "bad")
    found = dtype_findings(str(bad / "model.safetensors"), "fp32", None)
    assert [f.severity for f in found] == ["error"] and "lm_head.weight" in found[0].message
    assert "i16" in found[0].message or "int16" in found[0].message


@pytest.mark.parametrize("cmd", [["diagnose", "--no-sweep", "--no-template-check"], ["run"]])
def test_diagnose_and_run_refuse_an_integer_weight_in_one_line(tmp_path, cmd):
    def edit(t):
        t["lm_head.weight"] = (t["lm_head.weight"] * 100).to(torch.int32)

    line = _one_error(_cli(cmd + ["--limit", "1", "--max-new-tokens", "4", "--draft", str(_draft(tmp_path, edit))]))
    assert "'lm_head.weight' is stored as int32" in line and "fp32" not in line.split("expected")[0]


def _head_with(tmp_path, edit):
    from eagle_eval.heads.io import load_head
    return load_head(_draft(tmp_path, edit))


@pytest.mark.parametrize("key, value", [("fc.weight", float("nan")), ("midlayer.mlp.down_proj.weight", float("inf")),
                                        ("norm.weight", float("-inf"))])
def test_a_non_finite_draft_tensor_is_an_error_finding_naming_it(tmp_path, key, value):
    from eagle_eval.heads.checks.sanity import finite_findings

    def edit(t):
        t[key] = t[key].clone()
        t[key].view(-1)[3] = value

    found = finite_findings(_head_with(tmp_path, edit).head)
    assert [f.severity for f in found] == ["error"] and found[0].code == "weights-not-finite"
    assert key in found[0].message and fnd.decide(found).status == ExitCode.FAILED
    assert finite_findings(_head_with(tmp_path / "ok", None).head)[0].severity == "info"


def _identity_d2t(t):
    t["d2t"] = torch.zeros_like(t["d2t"])


def _duplicate_d2t(t):
    t["d2t"] = t["d2t"].clone()
    t["d2t"][1] = t["d2t"][0] - 1            # draft ids 0 and 1 -> the same target id


@pytest.mark.parametrize("edit, code", [(_identity_d2t, "d2t-identity"), (_duplicate_d2t, "d2t-duplicates")])
def test_a_broken_vocab_map_is_an_error_finding(tmp_path, edit, code):
    from eagle_eval.heads.checks.sanity import vocab_map_findings

    loaded = _head_with(tmp_path, edit)
    found = vocab_map_findings(loaded.head.d2t, loaded.head.t2d, False)
    assert code in [f.code for f in found if f.severity == "error"]
    assert fnd.decide(found).status == ExitCode.FAILED


# -- no traceback from an output folder: read-only, full, inside a symlink loop ------------------------

def _folder(path, **kw):
    from eagle_eval.results import run_folder as rf
    return rf.open_run_folder(path, "run", {"x": 1}, {}, **kw)


def test_an_output_folder_inside_a_symlink_loop_is_one_error_naming_it(tmp_path):
    from eagle_eval.results.run_folder import RunFolderError

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for out in (tmp_path / "a" / "out", tmp_path / "a"):
        with pytest.raises(RunFolderError) as caught:
            _folder(out)
        assert str(out) in str(caught.value) and "symbolic links" in str(caught.value)


def _refuse_writes_under(monkeypatch, root: Path, code: int):
    """Writes under `root` fail with errno `code`, as the kernel says it for a read-only or full file
    system (root ignores permission bits, so a chmod cannot stand in for either)."""
    import os
    import tempfile

    def under(path) -> bool:
        return str(Path(path)).startswith(str(root))

    def fail(path):
        raise OSError(code, os.strerror(code), str(path))

    real_open, real_mkstemp, real_mkdir = os.open, tempfile.mkstemp, os.mkdir

    def fake_open(path, flags, *a, **kw):
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            fail(path)
        return real_open(path, flags, *a, **kw)

    def fake_mkstemp(*a, dir=None, **kw):
        if dir is not None and under(dir):
            fail(Path(dir) / "tmp")
        return real_mkstemp(*a, dir=dir, **kw)

    def fake_mkdir(path, *a, **kw):
        if under(path):
            fail(path)
        return real_mkdir(path, *a, **kw)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(tempfile, "mkstemp", fake_mkstemp)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


@pytest.mark.parametrize("exists", [True, False])
def test_an_output_folder_on_a_read_only_file_system_is_one_error(tmp_path, monkeypatch, exists):
    from eagle_eval.results.run_folder import RunFolderError

    out = tmp_path / "ro" / "out"
    if exists:
        out.mkdir(parents=True)
    _refuse_writes_under(monkeypatch, tmp_path / "ro", errno.EROFS)
    with pytest.raises(RunFolderError) as caught:
        _folder(out)
    line = str(caught.value)
    assert line.startswith(f"--output-dir {out}: cannot be ") and "read-only file system" in line
    assert "\n" not in line


def _no_space_on_fsync(monkeypatch, only: str | None = None):
    """fsync fails with ENOSPC (a full disk reports it there, or at write), for files named `only`."""
    import os
    real = os.fsync

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if only is None or name.endswith(only):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_full_disk_when_the_folder_is_taken_is_one_error(tmp_path, monkeypatch):
    from eagle_eval.results.run_folder import OWNER_FILE, RunFolderError

    _no_space_on_fsync(monkeypatch)
    with pytest.raises(RunFolderError) as caught:
        _folder(tmp_path / "out")
    assert str(tmp_path / "out") in str(caught.value) and "no space left on device" in str(caught.value)
    assert OWNER_FILE in str(caught.value)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]   # no temporary left behind


def test_a_full_disk_while_rows_are_appended_keeps_the_rows_and_says_resume(tmp_path, monkeypatch):
    from eagle_eval.results.run_folder import RunFolderError

    folder = _folder(tmp_path / "out")
    folder.append_row("samples.jsonl", {"id": "a"})
    _no_space_on_fsync(monkeypatch, only="samples.jsonl")
    with pytest.raises(RunFolderError) as caught:
        folder.append_row("samples.jsonl", {"id": "b"})
    folder.close()
    line = str(caught.value)
    assert "samples.jsonl" in line and "no space left on device" in line and "--resume" in line


def test_a_results_file_under_a_file_is_one_error(tmp_path):
    from eagle_eval.results.run_folder import RunFolderError, write_atomic
    from eagle_eval.results.tables import write_csv

    (tmp_path / "f").write_text("x")
    with pytest.raises(RunFolderError, match="a part of the path is a file"):
        write_atomic(tmp_path / "f" / "a.json", "{}")
    with pytest.raises(RunFolderError, match=r"out\.csv: cannot be written"):
        write_csv(tmp_path / "f" / "out.csv", [(None, {"config": {"num_draft_tokens": 2}, "summary": {
            "prompts": 0, "cycles": 0, "accepted_drafts": 0, "accept_length": None}, "per_position": [],
            "histogram": [0]})])


def test_an_unreadable_input_is_one_error_naming_its_option(tmp_path, monkeypatch):
    from eagle_eval.results import run_folder as rf

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr("eagle_eval.results.input_digests.file_digest", lambda path, *a, **kw: denied(path))
    with pytest.raises(rf.RunFolderError) as caught:
        rf.open_run_folder(tmp_path / "out", "run", {}, {"draft": str(BUNDLED_DRAFT)})
    assert str(caught.value).startswith(f"--draft {BUNDLED_DRAFT}: cannot be read (permission denied")


def test_the_cli_says_a_full_disk_in_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from eagle_eval.cli import main

    _no_space_on_fsync(monkeypatch, only="samples.jsonl")
    res = CliRunner().invoke(main, ["run", "--limit", "1", "--max-new-tokens", "4", "--output-dir",
                                    str(tmp_path / "out")])
    assert res.exit_code == 2, (res.output, res.exception)
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("eagle-eval: error:")]
    assert len(err) == 1 and "no space left on device" in err[0] and "Traceback" not in res.stderr


# -- targets: pickle-only weights, a file for a folder, --max-memory -------------------------------------

def _pickle_target(tmp_path, names=("pytorch_model.bin",)) -> tuple[Path, Path]:
    """The bundled target with its safetensors replaced by pickles that would create `marker` if unpickled."""
    import pickle

    from eagle_eval.settings import BUNDLED_TARGET

    target, marker = tmp_path / "target", tmp_path / "UNPICKLED"
    shutil.copytree(BUNDLED_TARGET, target)
    (target / "model.safetensors").unlink()

    class Trap:
        def __reduce__(self):
            return (Path.touch, (marker,))

    for name in names:
        (target / name).write_bytes(pickle.dumps(Trap()))
    return target, marker


@pytest.mark.parametrize("names", [("pytorch_model.bin",),
                                   ("pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                                    "pytorch_model.bin.index.json")])
def test_a_target_holding_only_pickles_is_refused_without_unpickling(tmp_path, names):
    from eagle_eval.models.target import TargetError, load_target

    target, marker = _pickle_target(tmp_path, names)
    with pytest.raises(TargetError) as caught:
        load_target(str(target), dtype="fp32", device_map="cpu")
    line = str(caught.value)
    assert line.startswith(f"{target}: holds only pickle weights") and names[0] in line
    assert "never unpickles" in line and not marker.exists()


def test_a_file_given_as_the_target_or_the_draft_says_it_is_a_file(tmp_path):
    from eagle_eval.heads.io import CheckpointError, load_head
    from eagle_eval.models.target import TargetError, load_target

    (tmp_path / "f").write_text("x")
    with pytest.raises(TargetError, match="is a file"):
        load_target(str(tmp_path / "f"), dtype="fp32", device_map="cpu")
    with pytest.raises(CheckpointError, match="is a file"):
        load_head(tmp_path / "f")


@pytest.mark.parametrize("text, said", [
    ("0=70Gb", "bits"), ("0=70gb", "bits"), ("0=70", "not a size"), ("0=lots", "not a size"),
    ("cuda:0=70GiB", "write 0=..."), ("gpu=1GiB", "not a GPU index"), ("0=1GiB,0=2GiB", "given twice"),
    ("0=0GiB", "not a positive size"), ("70GiB", "not DEVICE=SIZE"), ("", "is empty"),
])
def test_a_max_memory_accelerate_cannot_read_is_an_error(text, said):
    from eagle_eval.models.target import TargetError, parse_max_memory

    with pytest.raises(TargetError, match="--max-memory") as caught:
        parse_max_memory(text)
    assert said in str(caught.value)


def test_max_memory_is_refused_where_it_would_be_ignored(tmp_path):
    from eagle_eval.settings import BUNDLED_TARGET
    from eagle_eval.models.target import TargetError, load_target, parse_max_memory

    assert parse_max_memory("0=70GiB, 1=1.5GB,cpu=100GiB") == {0: 70 * 2**30, 1: 1_500_000_000, "cpu": 100 * 2**30}
    with pytest.raises(TargetError, match="--max-memory applies to --device-map auto"):
        load_target(str(BUNDLED_TARGET), dtype="fp32", device_map="cpu", max_memory="cpu=1GiB")
    if not torch.cuda.is_available():                  # without a GPU, auto places over the CPU and the disk
        with pytest.raises(TargetError, match="names GPU 0, but this machine has no CUDA device"):
            load_target(str(BUNDLED_TARGET), dtype="fp32", device_map="auto", max_memory="0=1GiB")


# -- head configs: values of the wrong type name the file and the key ----------------------------------

@pytest.mark.parametrize("edit, key, expected", [
    (lambda c: c.update(num_attention_heads="six"), "'num_attention_heads'", "a positive integer"),
    (lambda c: c.update(hidden_size=True), "'hidden_size'", "a positive integer"),
    (lambda c: c.update(intermediate_size=384.0), "'intermediate_size'", "a positive integer"),
    (lambda c: c.update(rope_theta="10000"), "'rope_theta'", "a positive number"),
    (lambda c: c.update(rms_norm_eps=[1e-6]), "'rms_norm_eps'", "a positive number"),
    (lambda c: c.update(hidden_act=["silu"]), "'hidden_act'", "a string"),
    (lambda c: c.update(norm_before_residual="false"), "'norm_before_residual'", "true or false"),
    (lambda c: c.update(attention_bias=0), "'attention_bias'", "true or false"),
    (lambda c: c.update(eagle_config=[1, 3, 4]), "'eagle_config'", "a JSON object"),
    (lambda c: c["eagle_config"].update(use_aux_hidden_state="yes"), "eagle_config.'use_aux_hidden_state'",
     "true or false"),
    (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[True, 3, 4]),
     "eagle_config.'eagle_aux_hidden_state_layer_ids'", "a list of integer layer ids"),
    (lambda c: c.update(eagle_aux_hidden_state_layer_ids="2,4,5"), "'eagle_aux_hidden_state_layer_ids'",
     "a list of integer layer ids"),
    (lambda c: c.update(architectures="LlamaForCausalLMEagle3"), "'architectures'", "a list of strings"),
    (lambda c: c.update(rope_scaling="linear"), "'rope_scaling'", "a JSON object"),
    (lambda c: c.update(max_position_embeddings="1024"), "'max_position_embeddings'", "a positive integer"),
])
def test_a_head_config_value_of_the_wrong_type_names_the_file_and_the_key(tmp_path, edit, key, expected):
    from eagle_eval.heads.io import CheckpointError, load_head

    draft = _edit_config(_draft(tmp_path), edit)
    with pytest.raises(CheckpointError) as caught:
        load_head(draft)
    line = str(caught.value)
    assert line.startswith(str(draft / "config.json")) and key in line and f"expected {expected}" in line


def test_a_speculators_layer_config_of_the_wrong_type_names_its_section(tmp_path):
    from eagle_eval.heads.io import CheckpointError, load_head, save_head

    save_head(load_head(BUNDLED_DRAFT).head, tmp_path / "spec", aux_layer_ids_sglang=[1, 3, 4], dialect="speculators")
    assert load_head(tmp_path / "spec").dialect == "speculators"
    _edit_config(tmp_path / "spec", lambda c: c["transformer_layer_config"].update(num_key_value_heads="2"))
    with pytest.raises(CheckpointError, match=r"transformer_layer_config\.'num_key_value_heads' = \"2\": "
                                              "expected a positive integer"):
        load_head(tmp_path / "spec")


@pytest.mark.parametrize("changes, key", [
    (dict(kv_lora_rank="16"), "'kv_lora_rank'"), (dict(q_lora_rank=True), "'q_lora_rank'"),
    (dict(fc_norm="true"), "'fc_norm'"), (dict(model_type=["deepseek_v3"]), "'model_type'"),
])
def test_an_mla_head_config_value_of_the_wrong_type_names_the_key(tmp_path, changes, key):
    from test_mla_head import YARN, random_mla_head

    from eagle_eval.heads.io import CheckpointError, load_head

    path = random_mla_head(tmp_path / "h", rope_scaling=YARN)
    _edit_config(path, lambda c: c.update(changes))
    with pytest.raises(CheckpointError, match=rf"config\.json: key {key} = .*: expected "):
        load_head(path)


def test_aux_layer_ids_are_never_coerced():
    from eagle_eval.models.capture import AuxLayerError, to_hf

    assert to_hf([1, 3, 4], "sglang") == [2, 4, 5]
    for bad in ([True, 3, 4], [1.0, 3, 4], ["1", 3, 4]):
        with pytest.raises(AuxLayerError, match="must be integers"):
            to_hf(bad, "vllm")


# -- nothing coerced in prompt files ---------------------------------------------------------------------

@pytest.mark.parametrize("row, said", [
    ({"id": "a", "prompt": "hello", "category": ["x", "y"]}, "key 'category' = [\"x\", \"y\"]: expected a non-empty string"),
    ({"id": "a", "prompt": "hello", "category": 3}, "key 'category' = 3"),
    ({"id": True, "prompt": "hello"}, "key 'id' = true: expected a string or an integer id"),
    ({"id": ["a"], "prompt": "hello"}, "key 'id' = [\"a\"]"),
    ({"id": "a", "input_ids": [1, True, 5]}, "key 'input_ids' must be a non-empty list of integers"),
])
def test_a_prompt_row_value_of_the_wrong_type_is_an_error_naming_the_line_and_key(tmp_path, row, said):
    from eagle_eval.settings import BUNDLED_TARGET
    from eagle_eval.workload.conversations import load_workload
    from eagle_eval.workload.data import DataError
    from transformers import AutoTokenizer

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "ok", "prompt": "fine"}) + "\n" + json.dumps(row) + "\n")
    tok = AutoTokenizer.from_pretrained(str(BUNDLED_TARGET))
    with pytest.raises(DataError) as caught:
        load_workload(Settings.of(prompts=str(prompts)).workload, tok)
    assert str(caught.value).startswith(f"{prompts}:2: ") and said in str(caught.value)


@pytest.mark.parametrize("row, said", [
    ({"question_id": 81.0, "category": "writing", "turns": ["a"]}, "key 'question_id' = 81.0"),
    ({"question_id": 81, "category": {"w": 1}, "turns": ["a"]}, "key 'category'"),
])
def test_a_benchmark_row_value_of_the_wrong_type_is_an_error(tmp_path, row, said):
    from eagle_eval.workload.data import DataError
    from eagle_eval.workload.datasets import read_questions

    data = tmp_path / "mt.jsonl"
    data.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["x"]}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=f"{data}:2: ") as caught:
        read_questions(data)
    assert said in str(caught.value)
    data.write_text(json.dumps({"question_id": 81, "category": "writing", "turns": ["a"]}) + "\n")
    assert read_questions(data)[0][0].id == "81"                     # an integer id is an id


# -- resume: a duplicated or foreign row is repaired with a message or refused, never double-counted ------

RUN2 = ["run", "--limit", "2", "--max-new-tokens", "4"]


def _cli(args):
    from click.testing import CliRunner

    from eagle_eval.cli import main
    return CliRunner().invoke(main, args, catch_exceptions=True)


@pytest.fixture(scope="module")
def finished_two(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "run"
    res = _cli(RUN2 + ["--output-dir", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _resume_with(tmp_path, finished, edit):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    rows = [json.loads(ln) for ln in (out / "samples.jsonl").read_text().splitlines()]
    rows = edit(rows)
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, _cli(RUN2 + ["--output-dir", str(out), "--resume"])


def _one_error(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("eagle-eval: error:")]
    assert len(err) == 1 and "Traceback" not in res.stderr
    return err[0]


@pytest.mark.parametrize("where", ["end", "middle"])
def test_an_identical_duplicated_row_is_kept_once_with_a_warning(tmp_path, finished_two, where):
    before = json.loads((finished_two / "report.json").read_text())
    out, res = _resume_with(tmp_path, finished_two,
                            lambda r: r + [r[0]] if where == "end" else [r[0], r[0], r[1]])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("identical duplicate rows") == 1 and "kept once" in res.stderr
    after = json.loads((out / "report.json").read_text())
    assert after["summary"] == before["summary"] and after["histogram"] == before["histogram"]
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2


def test_two_different_rows_for_one_prompt_are_refused(tmp_path, finished_two):
    def edit(rows):
        other = dict(rows[0], output_ids=[(t + 1) % 900 for t in rows[0]["output_ids"]])
        return rows + [other]

    line = _one_error(_resume_with(tmp_path, finished_two, edit)[1])
    assert "two different rows (1 and 3)" in line and "samples.jsonl" in line


@pytest.mark.parametrize("change, said", [
    (dict(id="not-in-this-workload"), "is not a prompt of this workload"),
    (dict(category="elsewhere"), "has category 'elsewhere'"),
    (dict(prompt_len=999), "has prompt_len 999"),
    (dict(accepted_per_cycle="abc"), "key 'accepted_per_cycle' is not a list of integers"),
    (dict(verify_count=99), "'verify_count' 99"),
    (dict(output_ids=[1]), "key 'output_ids' holds 1 tokens"),
    (dict(accepted_per_cycle=[-1, 0, 0], emitted_per_cycle=[1, 1, 1], verify_count=3), "holds a count outside 0.."),
])
def test_a_foreign_or_malformed_row_refuses_the_resume_naming_it(tmp_path, finished_two, change, said):
    out, res = _resume_with(tmp_path, finished_two, lambda r: [r[0], dict(r[1], **change)])
    line = _one_error(res)
    assert "row 2" in line and said in line and "--overwrite" in line


# row 2 of the bundled pair at --max-new-tokens 4: output [15, 753, 31, 388], accepted [0, 1], emitted [1, 2];
# each change below keeps the checks that were there before (lengths add up, 1 <= emitted <= accepted + 1)
@pytest.mark.parametrize("change, said", [
    (dict(accepted_per_cycle=[1, 1]), "cycle 1 of 2 accepted 1 drafts but emitted 1 tokens: only the last cycle"),
    (dict(output_ids=[15, 2, 31, 388]), "holds EOS 2 at token 2 and 2 more after it"),
    (dict(output_ids=[15, 753, 31], emitted_per_cycle=[1, 1]), "holds 3 tokens, fewer than max_new_tokens 4, and "
                                                               "does not end in EOS"),
    (dict(output_ids=[15, 753, 31, 388, 5], accepted_per_cycle=[0, 2], emitted_per_cycle=[1, 3]),
     "holds 5 tokens, more than max_new_tokens 4"),
    (dict(spec_accept_length=3.0), "key 'spec_accept_length' is 3.0, its tokens per verify cycle are 2.0"),
    (dict(lossless=False), "key 'lossless' is False but 'divergence' is null"),
])
def test_a_row_whose_counts_contradict_its_tokens_refuses_the_resume(tmp_path, finished_two, change, said):
    out, res = _resume_with(tmp_path, finished_two, lambda r: [r[0], dict(r[1], **change)])
    line = _one_error(res)
    assert "row 2 (id 'glossary-01')" in line and said in line, line


@pytest.mark.parametrize("version, said", [(99, "has schema_version 99"), (None, "has no schema_version"),
                                           ("3", 'has schema_version "3"')])
def test_an_owner_file_of_an_unknown_schema_refuses_the_resume(tmp_path, finished_two, version, said):
    out = tmp_path / "run"
    shutil.copytree(finished_two, out)
    owner = json.loads((out / "eagle_eval_run.json").read_text())
    owner["schema_version"] = version
    (out / "eagle_eval_run.json").write_text(json.dumps(owner))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    line = _one_error(_cli(RUN2 + ["--output-dir", str(out), "--resume"]))
    assert f"{out / 'eagle_eval_run.json'} {said}" in line and "schema_version 3 only" in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before            # nothing touched


def test_a_lower_limit_resumes_the_rows_it_covers_and_keeps_the_others(tmp_path, finished_two):
    """docs/run.md: --limit may change on --resume. A lower one reports the rows it covers; the finished rows
    past it are kept aside (never deleted), and a resume with the larger limit takes them back unchanged."""
    out = tmp_path / "run"
    shutil.copytree(finished_two, out)
    rows = (finished_two / "samples.jsonl").read_text().splitlines(keepends=True)
    lower = _cli(RUN2[:2] + ["1"] + RUN2[3:] + ["--output-dir", str(out), "--resume"])
    assert lower.exit_code == 0, lower.output
    assert "1 finished row(s) of prompts past this --limit kept in" in lower.stderr
    assert (out / "samples.jsonl").read_text() == rows[0] and (out / "samples_beyond_limit.jsonl").read_text() == rows[1]
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["prompts"] == 1 and report["config"]["limit"] == 1
    owner = json.loads((out / "eagle_eval_run.json").read_text())
    assert "samples_beyond_limit.jsonl" in owner["files"] and owner["status"] == "finished"
    again = _cli(RUN2 + ["--output-dir", str(out), "--resume"])
    assert again.exit_code == 0, again.output
    assert (out / "samples.jsonl").read_bytes() == (finished_two / "samples.jsonl").read_bytes()
    assert not (out / "samples_beyond_limit.jsonl").exists()
    assert "samples_beyond_limit.jsonl" not in json.loads((out / "eagle_eval_run.json").read_text())["files"]
    assert json.loads((out / "report.json").read_text())["summary"] == \
        json.loads((finished_two / "report.json").read_text())["summary"]


# -- report: every command's results, schema versions, files it cannot read, like with like, findings -----

SMALL = ["--limit", "2", "--max-new-tokens", "4"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One output folder of each command on the bundled pair."""
    root = tmp_path_factory.mktemp("saved")
    (root / "server.log").write_text("")
    commands = {
        "run": ["run", "--num-steps", "2"],
        "profile": ["profile", "--max-steps", "3", "--num-steps", "2"],
        "ablation": ["ablate", "--max-steps", "2", "--cost-ratio", "0.1"],
        "diagnosis": ["diagnose", "--no-sweep", "--no-template-check"],
        "server_check": ["server-check", "--backend", "sglang", "--sglang-log", str(root / "server.log"),
                         "--num-steps", "2"],
    }
    out = {}
    for kind, args in commands.items():
        res = _cli(args + SMALL + ["--output-dir", str(root / kind)])
        assert res.exit_code in (0, 1, 3), (kind, res.output, res.exception)
        out[kind] = root / kind
    return out


def test_report_reads_every_commands_folder(saved):
    from eagle_eval.results.report import render_ablation, render_steps_table, render_table
    from eagle_eval.results.saved import FILES, read_result

    from eagle_eval.servers.check import render_server_check

    firsts = {"run": render_table, "profile": render_steps_table, "ablation": render_ablation,
              "server_check": render_server_check}          # as each command printed it
    for kind, folder in saved.items():
        result = read_result(folder)
        assert result.kind == kind and Path(result.path).name == FILES[kind]
        from eagle_eval.results.comparison import load_result

        res = _cli(["report", str(folder)])
        assert res.exit_code == load_result(folder).status, (kind, res.output, res.exception)   # the result's own
        assert "Traceback" not in res.output
        if kind in firsts:
            assert res.output.startswith(firsts[kind](result.report)), kind
        if kind not in ("diagnosis", "ablation"):          # ablation.json keeps none yet (the lead wires it)
            assert "load-time checks" in res.output          # re-rendered as the command printed them
    diag = _cli(["report", str(saved["diagnosis"] / "diagnosis.json")])
    assert "findings" in diag.output and "lm_head" in diag.output


@pytest.mark.parametrize("kind, version", [("run", 2), ("profile", "1"), ("diagnosis", 1), ("ablation", None)])
def test_report_refuses_an_unknown_schema_version_naming_the_known_one(saved, tmp_path, kind, version):
    from eagle_eval.results.saved import FILES, SCHEMAS

    file = tmp_path / FILES[kind]
    data = json.loads((saved[kind] / FILES[kind]).read_text())
    data["schema_version"] = version
    if version is None:
        del data["schema_version"]
    file.write_text(json.dumps(data))
    line = _one_error(_cli(["report", str(file)]))
    assert str(file) in line and f"of schema_version {SCHEMAS[kind]} only" in line


@pytest.mark.parametrize("kind, edit, said", [
    ("run", lambda d: d["config"].update(num_steps=5), "config.num_steps is 5 but its table (histogram and "
                                                       "per_position) covers num_steps 2"),
    ("server_check", lambda d: d["config"].update(num_steps=1), "config.num_steps is 1 but its table"),
    ("profile", lambda d: d["config"].update(max_steps=5), "config.max_steps is 5 but 'by_num_steps' holds "
                                                           "num_steps 1, 2, 3"),
    ("profile", lambda d: d["by_num_steps"].pop("3"), "config.max_steps is 3 but 'by_num_steps' holds num_steps 1, 2"),
    ("ablation", lambda d: d["config"].update(max_steps=1), "config.max_steps is 1 but 'variants[0].by_num_steps'"),
])
def test_report_refuses_a_header_that_disagrees_with_its_table(saved, tmp_path, kind, edit, said):
    """The terminal table prints num_steps from the config and the rows from the counts: a file where they
    disagree is refused naming the file and both values, never rendered."""
    from eagle_eval.results.saved import FILES

    file = tmp_path / FILES[kind]
    data = json.loads((saved[kind] / FILES[kind]).read_text())
    edit(data)
    file.write_text(json.dumps(data))
    line = _one_error(_cli(["report", str(file)]))
    assert str(file) in line and said in line and "contradicts itself" in line, line


def test_report_on_files_it_cannot_read_is_one_line(tmp_path, saved):
    (tmp_path / "latin1.json").write_bytes('{"a": "\xe9"}'.encode("latin-1"))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "empty").mkdir()
    (tmp_path / "deep.json").write_text("[" * 100000)
    (tmp_path / "list.json").write_text("[1, 2]")
    cases = [("latin1.json", "not a UTF-8 text file"), ("afile/report.json", "afile is a file, not a folder"),
             ("loop", "cannot be read"), ("empty", "holds no eagle-eval results"),
             ("deep.json", "nested too deeply"), ("list.json", "a JSON object is expected")]
    for name, said in cases:
        line = _one_error(_cli(["report", str(tmp_path / name)]))
        assert said in line, (name, line)


def test_report_compares_a_run_with_the_profile_at_its_num_steps(saved):
    from eagle_eval.results.comparison import comparison, load_result

    run, prof = load_result(saved["run"]), load_result(saved["profile"])
    text = comparison(run, prof)
    assert "at num_steps 2" in text
    all_row = next(ln for ln in text.splitlines() if ln.strip().startswith("all "))
    assert "+0.000" in all_row and "*" not in all_row               # the profile reproduces the loop exactly
    flipped = comparison(prof, run)
    assert flipped.index(f"A = {prof.label} at num_steps 2") > 0


def test_report_says_why_unlike_results_are_not_compared(saved, tmp_path):
    from eagle_eval.results.comparison import comparison, load_result

    run, abl, diag = (load_result(saved[k]) for k in ("run", "ablation", "diagnosis"))
    for a, b in ((run, abl), (diag, run), (abl, diag)):
        assert comparison(a, b).startswith("not compared: ")
    res = _cli(["report", str(saved["run"]), str(saved["ablation"])])
    assert res.exit_code == 0 and "not compared: " in res.output and "an ablation" in res.output
    other = json.loads((saved["profile"] / "profile.json").read_text())
    other["config"]["topk"], other["config"]["num_draft_tokens"] = 2, 4
    (tmp_path / "tree.json").write_text(json.dumps(other))
    assert "their topk differ" in comparison(run, load_result(tmp_path / "tree.json"))
    assert comparison(run, load_result(saved["server_check"])).startswith("differences B - A")


@pytest.mark.parametrize("severity, status", [("info", 0), ("warning", 0), ("undecided", 3), ("error", 1)])
def test_a_re_render_keeps_the_load_time_findings_and_their_exit_status(saved, tmp_path, severity, status):
    from eagle_eval.results.comparison import load_result, render_result, results_status

    report = json.loads((saved["run"] / "report.json").read_text())
    report["config"]["sanity"].append({"severity": severity, "code": "planted-check", "message": "planted here"})
    (tmp_path / "report.json").write_text(json.dumps(report))
    result = load_result(tmp_path)
    assert result.status == status and results_status([load_result(saved["run"]), result]) == status
    text = render_result(result)
    assert ("planted-check" in text) == (severity != "info")
    assert (f"exit status {status}: 1 load-time check(s)" in text) == (status != 0)


def test_a_run_of_a_head_with_nan_weights_fails_and_its_re_render_too(tmp_path):
    from eagle_eval.results.comparison import load_result, render_result

    def edit(t):
        t["fc.weight"] = t["fc.weight"].clone()
        t["fc.weight"][0, 0] = float("nan")

    args = ["run", "--draft", str(_draft(tmp_path, edit)), "--limit", "1", "--max-new-tokens", "4", "--output-dir",
            str(tmp_path / "out")]
    stopped = _cli(args)
    assert stopped.exit_code == 1 and "weights-not-finite" in stopped.stderr, stopped.output
    res = _cli(args + ["--overwrite", "--allow-load-errors"])
    assert res.exit_code == 0, res.output
    result = load_result(tmp_path / "out")
    text = render_result(result)
    assert result.status == 1 and "weights-not-finite" in text
    assert "exit status 1: 1 load-time check(s) failed: weights-not-finite" in text


def test_csv_and_plot_of_results_without_an_acceptance_table(saved, tmp_path):
    from eagle_eval.results.tables import read_csv

    res = _cli(["report", str(saved["profile"]), "--csv", str(tmp_path / "p.csv")])
    assert res.exit_code == 0, res.output
    groups = [r["group"] for r in read_csv(tmp_path / "p.csv")]
    # the acceptance table's rows, then the acceptance by context (one row per bucket, results/context.py)
    table = [g for g in groups if not g.startswith("context:")]
    assert table == ["num_steps:1", "num_steps:2", "num_steps:3"]
    assert groups[:3] == table and len(groups) > 3
    assert "holds no acceptance table" in _one_error(_cli(["report", str(saved["ablation"]), "--csv",
                                                           str(tmp_path / "a.csv")]))
    assert "--plot draws runs" in _one_error(_cli(["report", str(saved["ablation"]), "--plot",
                                                   str(tmp_path / "a.png")]))


def test_plot_of_a_profile_draws_its_acceptance_by_context(saved, tmp_path):
    """A profile holds no decode to draw curves of: --plot draws its per-start expectation by context (one row of
    panels); beside a run, the run's curves and both sections' context panels (two rows)."""
    from PIL import Image

    res = _cli(["report", str(saved["profile"]), "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
    one = Image.open(tmp_path / "p.png").size
    res = _cli(["report", str(saved["run"]), str(saved["profile"]), "--plot", str(tmp_path / "rp.png")])
    assert res.exit_code == 0, res.output
    two = Image.open(tmp_path / "rp.png").size
    assert one[0] == two[0] and 1.8 < two[1] / one[1] < 2.2


# -- ablate's advice: intervals from repeated timings, undecided when they overlap, never impossible ------

def _noisy(center: float, spread: float, n: int = 25, seed: int = 0) -> tuple:
    import random
    rng = random.Random(seed)
    return tuple(center * (1 + spread * (2 * rng.random() - 1)) for _ in range(n))


def _two_settings(tau_short=1.8, tau_long=2.6):
    from eagle_eval.stats.advice import Setting
    return [Setting("base num_steps=1", 1, 2, tau_short), Setting("base num_steps=3", 3, 4, tau_long)]


def test_a_clear_winner_under_tight_timings_is_recommended():
    from eagle_eval.stats.advice import RECOMMENDED, Timings, advise

    t = Timings(target_ms=_noisy(10, 0.01), draft_ms=_noisy(1, 0.01, seed=1),
                verify_ms={2: _noisy(10.5, 0.01, seed=2), 4: _noisy(11, 0.01, seed=3)})
    a = advise(_two_settings(), t)
    assert a.verdict == RECOMMENDED and a.best.setting.name == "base num_steps=3"
    for e in a.estimates:                          # the point estimate from the medians, inside its interval
        c, r = t.ratios(e.setting.verify_tokens)
        assert e.speedup == pytest.approx(e.setting.tau / (e.setting.num_steps * c + r), rel=1e-12)
        assert e.low <= e.speedup <= e.high
    assert a.difference[0] > 0 and a.message().startswith("recommended: base num_steps=3")
    assert advise(_two_settings(), t) == a          # seeded: the same samples give the same advice


def test_timing_noise_that_can_reverse_the_order_is_undecided_naming_both():
    from eagle_eval.stats.advice import UNDECIDED, Timings, advise

    # S_1 = 1.8 t / (d + v2) and S_3 = 2.6 t / (3 d + v4) nearly tie; 30% noise
    t = Timings(target_ms=_noisy(10, 0.3), draft_ms=_noisy(1.6, 0.3, seed=1),
                verify_ms={2: _noisy(10.5, 0.3, seed=2), 4: _noisy(11, 0.3, seed=3)})
    a = advise(_two_settings(), t)
    assert a.verdict == UNDECIDED and a.difference[0] <= 0 <= a.difference[1]
    msg = a.message()
    assert msg.startswith("undecided between") and "base num_steps=1" in msg and "base num_steps=3" in msg
    tight = Timings(*(tuple(x for x in xs[:1]) * 25 for xs in (t.target_ms, t.draft_ms)),
                    verify_ms={n: xs[:1] * 25 for n, xs in t.verify_ms.items()})
    assert advise(_two_settings(), tight).verdict == "recommended"    # the same medians, no noise: decided


def test_a_setting_whose_speedup_exceeds_its_accept_length_is_never_recommended():
    from eagle_eval.stats.advice import RECOMMENDED, Setting, Timings, advise

    # verify of 2 tokens timed faster than one target token: r = 0.5, so S = 2.0 / (0.05 + 0.5) > tau
    t = Timings(target_ms=(10.0,) * 9, draft_ms=(0.5,) * 9, verify_ms={2: (5.0,) * 9, 4: (12.0,) * 9})
    settings = [Setting("noisy num_steps=1", 1, 2, 2.0), Setting("sane num_steps=3", 3, 4, 2.4)]
    a = advise(settings, t)
    noisy = next(e for e in a.estimates if e.setting.name.startswith("noisy"))
    assert noisy.speedup > noisy.setting.tau and noisy.impossible
    assert a.verdict == RECOMMENDED and a.best.setting.name == "sane num_steps=3" and a.runner_up is None
    assert "exceeds its accept length" in a.as_dict()["impossible"][0]
    only = advise(settings[:1], t)
    assert only.verdict == "none" and only.best is None


def test_given_costs_decide_without_noise_and_ties_stay_undecided():
    from eagle_eval.stats.advice import Setting, Timings, advise, settings_from_rows

    rows = [{"variant": "base", "num_steps": k, "topk": 1, "num_draft_tokens": k + 1, "tau": tau}
            for k, tau in ((1, 1.5), (2, 1.9), (3, 2.1))]
    a = advise(settings_from_rows(rows), Timings.given(0.1))
    speedups = [tau / (k * 0.1 + 1) for k, tau in ((1, 1.5), (2, 1.9), (3, 2.1))]
    assert a.verdict == "recommended" and a.best.speedup == max(speedups) and a.best.low == a.best.high
    tie = advise([Setting("a", 1, 2, 1.1), Setting("b", 1, 2, 1.1)], Timings.given(0.1))
    assert tie.verdict == "undecided"


def test_the_recommended_setting_never_exceeds_its_accept_length_for_any_timings():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from eagle_eval.stats.advice import NONE, Setting, Timings, advise

    ms = st.lists(st.floats(0.01, 100.0), min_size=1, max_size=8).map(tuple)

    @settings(max_examples=60, deadline=None)
    @given(ms, ms, ms, ms, st.floats(1.0, 5.0), st.floats(1.0, 5.0))
    def check(target, draft, v2, v4, tau1, tau3):
        t = Timings(target, draft, {2: v2, 4: v4})
        a = advise([Setting("s1", 1, 2, tau1), Setting("s3", 3, 4, tau3)], t, resamples=50)
        if a.verdict != NONE:
            assert a.best.speedup <= a.best.setting.tau * (1 + 1e-9)
            assert a.best.low <= a.best.speedup <= a.best.high

    check()


def test_median_interval_covers_at_the_stated_level():
    import random

    from eagle_eval.stats.advice import median_interval

    rng, n, hits = random.Random(0), 15, 0
    for _ in range(2000):
        lo, hi = median_interval([rng.expovariate(1.0) for _ in range(n)])
        hits += lo <= 0.6931471805599453 <= hi                 # the exponential's median, ln 2
    assert hits / 2000 >= 0.95 - 0.015


def test_timings_repeat_until_narrow_or_the_limit(monkeypatch):
    from eagle_eval import api
    from eagle_eval.profile.costs import measure_timings, stop_rule

    spec = api.load_oracle(Settings.of(max_new_tokens=4)).speculator

    def steady():                       # a clock where every timed call takes exactly 0.5 ms
        now = [0.0]

        def clock():
            now[0] += 0.0005
            return now[0]
        return clock

    run = measure_timings(spec, [3, 4], context=8, min_reps=4, max_reps=30, clock=steady())
    assert run.narrow and run.rounds == 4 and set(run.timings.verify_ms) == {3, 4}
    assert run.timings.target_ms == pytest.approx((0.5,) * 4) and run.timings.draft_ms == pytest.approx((0.5,) * 4)
    real = measure_timings(spec, [3], context=8, min_reps=3, max_reps=5, rel_width=1e-9)
    assert not real.narrow and real.rounds == 5 and len(real.timings.target_ms) == 5
    assert stop_rule({"a": [1.0, 2.0, 3.0]}, 3, 100.0, 3, 50, 0.01, 60.0) == (True, False, 0.5)   # budget spent


def test_the_ablation_plot_stays_readable_with_20_variants(tmp_path):
    from eagle_eval.results.plot import ablation_figure, plot_ablation, variant_style

    rows = [{"variant": f"aux_layers=0,{i},{i + 3};dtype=bf16;system_prompt=a long one {i}", "num_steps": k,
             "tau": 1 + 0.05 * i + 0.2 * k, "speedup_model": 1 + 0.04 * i + 0.1 * k,
             "speedup_server": 1 + 0.03 * i + 0.1 * k} for i in range(20) for k in range(1, 6)]
    styles = [tuple(sorted(variant_style(k).items())) for k in range(20)]
    assert len(set(styles)) == 20
    fig = ablation_figure(rows)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    assert len(legend.get_texts()) == 20
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:                               # the legend covers no curve
        assert not box.overlaps(ax.get_window_extent(renderer))
    plot_ablation(tmp_path / "a.png", rows)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- progress on long phases; fingerprints that cost seconds, with every byte on request -----------------

def test_the_generation_phase_reports_progress_and_the_tokens_do_not_change():
    from eagle_eval import api
    from eagle_eval.profile.teacher_forced import greedy_continuations

    spec = api.load_oracle(Settings.of(max_new_tokens=4)).speculator
    prompts = [[1, 5, 9, 12], [3, 4], [7, 8, 9, 10, 11, 12]]
    seen = []
    with_bar = greedy_continuations(spec, prompts, 6, 0, 20, progress=seen.append)   # batches of <= 2 rows
    assert with_bar == greedy_continuations(spec, prompts, 6, 0, 20)
    assert sum(seen) == len(prompts) * 6 and len(seen) == 6 * 2          # one call per decode step per batch


def test_diagnose_shows_a_generation_bar(capsys):
    from eagle_eval.diagnose.options import DiagnoseOptions
    from eagle_eval.diagnose.run import diagnose

    diagnose(Settings.of(limit=2, max_new_tokens=4), DiagnoseOptions(sweep=False, template_check=False), progress=True)
    assert "generate" in capsys.readouterr().err
    diagnose(Settings.of(limit=2, max_new_tokens=4), DiagnoseOptions(sweep=False, template_check=False), progress=False)
    assert "generate" not in capsys.readouterr().err


@pytest.fixture
def sampled(monkeypatch):
    """Every file larger than 1 KiB is sampled (the bundled checkpoints are small enough to be hashed whole)."""
    from eagle_eval.results import input_digests as fingerprints
    monkeypatch.setattr(fingerprints, "FULL_BELOW", 1024)
    fingerprints._cache.clear()
    return fingerprints


@pytest.mark.parametrize("key", ["fc.weight", "lm_head.weight", "norm.weight", "d2t"])
def test_a_sampled_fingerprint_catches_a_tensor_changed_in_place(tmp_path, sampled, key):
    def edit(t):
        t[key] = t[key] * 2 if key != "d2t" else t[key].flip(0)

    a, b = _draft(tmp_path, name="a"), _draft(tmp_path, edit, name="b")
    fa, fb = sampled.fingerprint(a), sampled.fingerprint(b)
    assert fa["method"] == "sampled-v1" and fa != fb
    assert fa == sampled.fingerprint(str(_draft(tmp_path, name="c")) + "/")       # same bytes, another spelling


def test_the_cli_refuses_a_resume_after_a_sampled_change_in_place(tmp_path, sampled):
    draft = _draft(tmp_path)
    args = ["run", "--limit", "1", "--max-new-tokens", "4", "--draft", str(draft), "--output-dir", str(tmp_path / "o")]
    assert _cli(args).exit_code == 0
    owner = json.loads((tmp_path / "o" / "eagle_eval_run.json").read_text())
    assert owner["inputs"]["draft"]["fingerprint"]["method"] == "sampled-v1"
    assert "first, middle and last" in owner["inputs"]["draft"]["fingerprint"]["covers"]
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"] * 1.01
    save_file(tensors, str(draft / "model.safetensors"))
    line = _one_error(_cli(args + ["--resume"]))
    assert "--draft" in line and "contents differ" in line


def test_what_a_sampled_fingerprint_covers_and_what_full_adds(tmp_path, sampled):
    import numpy as np

    big = {"w": np.arange(40000, dtype=np.float32).reshape(200, 200)}
    from safetensors.numpy import save_file as save_np
    save_np(big, str(tmp_path / "a.safetensors"))
    big["w"][50, 7] = -1.0            # one value at byte 40028 of 160000: between the first and middle blocks
    save_np(big, str(tmp_path / "b.safetensors"))
    same = sampled.fingerprint(tmp_path / "a.safetensors") == sampled.fingerprint(tmp_path / "b.safetensors")
    assert same                                        # documented: sampled blocks miss such an edit
    assert sampled.fingerprint(tmp_path / "a.safetensors", full=True) != \
        sampled.fingerprint(tmp_path / "b.safetensors", full=True)


def test_a_sampled_fingerprint_reads_a_small_part_of_a_large_file(tmp_path, sampled, monkeypatch):
    import builtins

    import numpy as np
    from safetensors.numpy import save_file as save_np

    save_np({f"t{i}": np.random.default_rng(i).standard_normal((512, 512)).astype(np.float32) for i in range(16)},
            str(tmp_path / "m.safetensors"))
    torch.save({f"t{i}": torch.randn(512, 512) for i in range(8)}, tmp_path / "m.bin")
    read, real_open = [0], builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read[0] += len(data)
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(sampled, "open", lambda *a, **kw: Counting(real_open(*a, **kw)), raising=False)
    for name in ("m.safetensors", "m.bin"):
        read[0] = 0
        size = (tmp_path / name).stat().st_size
        sampled.file_digest(tmp_path / name)
        assert read[0] < size / 20, (name, read[0], size)


def test_a_changed_zip_torch_file_is_caught_by_sampling(tmp_path, sampled):
    tensors = {"a": torch.randn(300, 300), "b": torch.randn(300, 300)}
    for folder, saved in (("x", tensors), ("y", {"a": tensors["a"], "b": tensors["b"] * 3}), ("z", tensors)):
        (tmp_path / folder).mkdir()
        torch.save(saved, tmp_path / folder / "pytorch_model.bin")    # torch names the archive after the file
    fx, fy, fz = (sampled.file_digest(tmp_path / n / "pytorch_model.bin") for n in "xyz")
    assert fx != fy and fx == fz


def test_old_owner_fingerprints_and_a_full_one_are_compared_by_their_own_method(tmp_path, sampled):
    import hashlib

    from eagle_eval.results import run_folder as rf

    draft = _draft(tmp_path)
    old = {"kind": "folder", "files": {n: hashlib.sha256((draft / n).read_bytes()).hexdigest()
                                       for n in ("config.json", "model.safetensors")}}      # schema-2 owner files
    now = sampled.fingerprint(draft)
    assert sampled.same_contents(old, draft, now) and not sampled.same_contents(
        {**old, "files": {**old["files"], "config.json": "0" * 64}}, draft, now)
    with rf.open_run_folder(tmp_path / "o", "run", {"x": 1}, {"draft": str(draft)}, full_fingerprint=True) as f:
        assert f.owner["inputs"]["draft"]["fingerprint"]["method"] == "full"
    with rf.open_run_folder(tmp_path / "o", "run", {"x": 1}, {"draft": str(draft)}, resume=True):
        pass                                            # sampled now, full then: compared in full, the same


def test_a_long_full_fingerprint_shows_a_bar(tmp_path, sampled, monkeypatch, capsys):
    monkeypatch.setattr(sampled, "LONG_READ", 1)
    draft = _draft(tmp_path)
    sampled.fingerprint(draft)
    assert "fingerprint" not in capsys.readouterr().err
    sampled.fingerprint(draft, full=True)
    assert "fingerprint (every byte" in capsys.readouterr().err


# -- messages that name the right cause -------------------------------------------------------------------

def test_a_folder_given_for_a_file_says_it_is_a_folder(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t.jinja").write_bytes(b"\xff\xfe{{ bad }}")
    for args, said in ((["--prompts", str(tmp_path / "p")], "is a folder; --prompts is a JSONL file"),
                       (["--chat-template", str(tmp_path / "p")], "is a folder, a Jinja template file"),
                       (["--chat-template", str(tmp_path / "t.jinja")], "not a UTF-8 text file")):
        line = _one_error(_cli(["run", "--limit", "1", "--max-new-tokens", "4"] + args))
        assert said in line and "does not exist" not in line


def test_the_ablation_table_says_the_advice_when_it_has_one(saved):
    from eagle_eval.stats.advice import Timings, advise, settings_from_rows
    from eagle_eval.results.report import render_ablation

    result = json.loads((saved["ablation"] / "ablation.json").read_text())
    assert "overall: " in render_ablation(result) and result["advice"]["verdict"] in ("recommended", "undecided")
    del result["advice"]
    assert "best overall:" in render_ablation(result)                      # a result written without advice
    noisy = Timings(target_ms=_noisy(10, 0.4), draft_ms=_noisy(10 / 6, 0.4, seed=1))   # c = 1/6: S_1 = S_2
    result["advice"] = advise(settings_from_rows(result["rows"]), noisy).as_dict()
    text = render_ablation(result)
    line = next(ln for ln in text.splitlines() if ln.startswith("overall: "))
    assert "best overall:" not in text and line.startswith("overall: undecided between base num_steps=")
    assert "base num_steps=1" in line and "base num_steps=2" in line and "includes 0" in line


def test_a_diagnosis_whose_exit_status_does_not_follow_from_its_findings_is_refused(saved, tmp_path):
    from eagle_eval.results.comparison import load_result

    data = json.loads((saved["diagnosis"] / "diagnosis.json").read_text())
    data["findings"].append({"severity": "undecided", "code": "aux-sweep", "message": "could not tell"})
    for recorded, ok in ((3, True), (1, True), (0, False)):      # 1: diagnose's rule before errors.ExitCode
        data["exit_status"] = recorded
        (tmp_path / "diagnosis.json").write_text(json.dumps(data))
        if ok:
            assert load_result(tmp_path / "diagnosis.json").status == 3
        else:
            assert "does not follow from its findings" in _one_error(_cli(["report", str(tmp_path / "diagnosis.json")]))
