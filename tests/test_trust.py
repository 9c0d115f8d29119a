"""Trustworthy in CI and in careless hands (issue 21, the parts below the CLI): every class of fault has
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

from eagle_eval.config import BUNDLED_DRAFT
from eagle_eval.errors import EXIT_FAILED, EXIT_OK, EXIT_UNDECIDED, UserError
from eagle_eval.results import findings as fnd


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
    ((), EXIT_OK),
    (("info",), EXIT_OK),
    (("info", "warning"), EXIT_OK),
    (("undecided",), EXIT_UNDECIDED),
    (("warning", "undecided"), EXIT_UNDECIDED),
    (("error",), EXIT_FAILED),
    (("undecided", "error", "info"), EXIT_FAILED),
])
def test_the_exit_status_of_findings_follows_the_worst_severity(severities, status):
    found = [fnd.Finding(s, f"code-{i}", "m") for i, s in enumerate(severities)]
    decision = fnd.decide(found)
    assert decision.status == status
    assert decision.failing == tuple(f.code for f in found if f.severity == "error")
    assert decision.undecided == tuple(f.code for f in found if f.severity == "undecided")
    assert fnd.decide([f.as_dict() for f in found]) == decision          # as stored in a report


def test_a_load_time_error_stops_the_run_unless_allowed():
    found = [fnd.info("dialect", "ok"), fnd.error("lm_head-untrained", "lm_head still matches a fresh init"),
             fnd.warning("rope-theta-mismatch", "w")]
    with pytest.raises(fnd.LoadChecksFailed) as caught:
        fnd.gate(found)
    assert caught.value.status == EXIT_FAILED and not isinstance(caught.value, UserError)
    assert "lm_head-untrained" in str(caught.value) and "fresh init" in str(caught.value)
    assert fnd.gate(found, allow=True).status == EXIT_FAILED              # allowed: proceeds, still exit 1
    assert fnd.gate([f for f in found if f.severity != "error"]).status == EXIT_OK


def test_an_undecided_load_time_finding_does_not_stop_the_run():
    decision = fnd.gate([fnd.undecided("x", "could not tell")])
    assert decision.status == EXIT_UNDECIDED and decision.message() == "1 check(s) could not decide: x"


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
    from eagle_eval.models.heads.io import CheckpointError, load_head

    def edit(t):
        t[key] = (t[key].float() * 50).to(dtype) if key not in ("d2t", "t2d") else t[key].to(dtype)

    with pytest.raises(CheckpointError) as caught:
        load_head(_draft(tmp_path, edit))
    line = str(caught.value)
    assert "model.safetensors" in line and repr(key) in line and str(dtype).replace("torch.", "") in line
    assert said in line


def test_the_dtypes_a_head_may_have_load(tmp_path):
    from eagle_eval.models.heads.io import load_head

    def edit(t):
        t["d2t"] = t["d2t"].to(torch.int32)
        t["fc.weight"] = t["fc.weight"].to(torch.bfloat16)
        t["norm.weight"] = t["norm.weight"].to(torch.float16)

    loaded = load_head(_draft(tmp_path, edit))
    ref = load_head(BUNDLED_DRAFT)
    assert torch.equal(loaded.head.d2t, ref.head.d2t) and loaded.head.d2t.dtype == torch.long


def test_diagnose_never_reports_an_integer_weight_as_fp32(tmp_path):
    from eagle_eval.models.checks.sanity import dtype_findings

    draft = _draft(tmp_path)
    ok = dtype_findings(str(draft / "model.safetensors"), "fp32", None)
    assert ok[0].severity == "info" and "(d2t int64, t2d bool)" in ok[0].message

    def edit(t):
        t["lm_head.weight"] = (t["lm_head.weight"] * 100).to(torch.int16)

    bad = _draft(tmp_path, edit, "bad")
    found = dtype_findings(str(bad / "model.safetensors"), "fp32", None)
    assert [f.severity for f in found] == ["error"] and "lm_head.weight" in found[0].message
    assert "i16" in found[0].message or "int16" in found[0].message


def _head_with(tmp_path, edit):
    from eagle_eval.models.heads.io import load_head
    return load_head(_draft(tmp_path, edit))


@pytest.mark.parametrize("key, value", [("fc.weight", float("nan")), ("midlayer.mlp.down_proj.weight", float("inf")),
                                        ("norm.weight", float("-inf"))])
def test_a_non_finite_draft_tensor_is_an_error_finding_naming_it(tmp_path, key, value):
    from eagle_eval.models.checks.sanity import finite_findings

    def edit(t):
        t[key] = t[key].clone()
        t[key].view(-1)[3] = value

    found = finite_findings(_head_with(tmp_path, edit).head)
    assert [f.severity for f in found] == ["error"] and found[0].code == "weights-not-finite"
    assert key in found[0].message and fnd.decide(found).status == EXIT_FAILED
    assert finite_findings(_head_with(tmp_path / "ok", None).head)[0].severity == "info"


def _identity_d2t(t):
    t["d2t"] = torch.zeros_like(t["d2t"])


def _duplicate_d2t(t):
    t["d2t"] = t["d2t"].clone()
    t["d2t"][1] = t["d2t"][0] - 1            # draft ids 0 and 1 -> the same target id


@pytest.mark.parametrize("edit, code", [(_identity_d2t, "d2t-identity"), (_duplicate_d2t, "d2t-duplicates")])
def test_a_broken_vocab_map_is_an_error_finding(tmp_path, edit, code):
    from eagle_eval.models.checks.sanity import vocab_map_findings

    loaded = _head_with(tmp_path, edit)
    found = vocab_map_findings(loaded.head.d2t, loaded.head.t2d, False)
    assert code in [f.code for f in found if f.severity == "error"]
    assert fnd.decide(found).status == EXIT_FAILED
