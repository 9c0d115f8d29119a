"""The API around the loop: resolved settings, embedding rule, SGLang's topk=1 adjustment, resume."""

import json

import pytest
import torch
from fixtures import make_head

from eagle_eval import api
from eagle_eval.settings import LoopOptions, ConfigError, Settings
from eagle_eval.errors import UserError
from eagle_eval.models.target import TargetError
from eagle_eval.records import read_jsonl
from eagle_eval.workload.data import DataError


def _cfg(tiny, **kw):
    return Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), prompts=str(tiny["prompts"]),
                     max_new_tokens=12, **kw)


def test_resolved_settings_are_echoed(tiny):
    report = api.evaluate(_cfg(tiny, num_steps=3), progress=False).report
    cfg = report["config"]
    assert cfg["num_steps"] == 3 and cfg["topk"] == 1 and cfg["num_draft_tokens"] == 4
    assert cfg["aux_layers"]["hf"] == [2, 4, 5] and cfg["aux_layers"]["sglang"] == [1, 3, 4]
    assert cfg["aux_layers"]["vllm"] == [2, 4, 5]
    assert cfg["embedding"].startswith("target")
    assert cfg["vocab_map"] == {"draft_vocab_size": 40, "vocab_size": 96, "d2t": "checkpoint", "d2t_identity": False}
    assert cfg["dtype"] == "fp32"
    prov = report["provenance"]
    assert prov["seed"] == 0 and prov["versions"]["torch"] == torch.__version__ and prov["date"]
    assert report["schema_version"] == 1 and report["summary"]["prompts"] == 4


def test_sglang_topk1_adjustment(tiny):
    with pytest.warns(UserWarning, match="adjusted to speculative_num_steps \\+ 1"):
        oracle = api.load_oracle(_cfg(tiny, num_steps=3, num_draft_tokens=8))
    assert oracle.resolved.as_dict()["num_draft_tokens"] == 4 and oracle.resolved.as_dict()["num_draft_tokens_given"] == 8


def test_embedding_rule(tiny, tmp_path):
    own = make_head(tmp_path / "own", with_embedding=True)
    cfg = dict(target=str(tiny["target"]), draft=str(own), prompts=str(tiny["prompts"]))
    assert api.load_oracle(Settings.of(**cfg)).resolved.as_dict()["embedding"].startswith("draft")          # vLLM: own
    assert api.load_oracle(Settings.of(**cfg, draft_embedding="target")).resolved.as_dict()["embedding"].startswith("target")
    # a copy of the target's table counts as "not different": auto falls back to the target's
    from safetensors.torch import load_file, save_file
    tensors = load_file(own / "model.safetensors")
    tensors["embed_tokens.weight"] = load_file(tiny["target"] / "model.safetensors")["model.embed_tokens.weight"]
    save_file(tensors, str(own / "model.safetensors"))
    assert api.load_oracle(Settings.of(**cfg)).resolved.as_dict()["embedding"].startswith("target")
    assert api.load_oracle(Settings.of(**cfg, draft_embedding="own")).resolved.as_dict()["embedding"].startswith("draft")
    with pytest.raises(ConfigError, match="no 'embed_tokens.weight'"):
        api.load_oracle(_cfg(tiny, draft_embedding="own"))


def test_identity_d2t_on_reduced_vocab_warns(tiny, tmp_path):
    from safetensors.torch import load_file, save_file
    path = make_head(tmp_path / "h", draft_vocab=40)
    tensors = load_file(path / "model.safetensors")
    tensors["d2t"] = torch.zeros_like(tensors["d2t"])
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.warns(UserWarning, match="identity"):
        oracle = api.load_oracle(Settings.of(target=str(tiny["target"]), draft=str(path)))
    assert oracle.resolved.as_dict()["vocab_map"]["d2t_identity"] is True


def test_aux_layers_from_cli_and_config(tiny, tmp_path):
    head = make_head(tmp_path / "h", aux_ids_sglang=[0, 3, 6])
    oracle = api.load_oracle(Settings.of(target=str(tiny["target"]), draft=str(head)))
    assert oracle.resolved.as_dict()["aux_layers"]["hf"] == [1, 4, 7]
    oracle = api.load_oracle(Settings.of(target=str(tiny["target"]), draft=str(head), aux_layers=(2, 4, 5),
                                       aux_convention="vllm"))
    assert oracle.resolved.as_dict()["aux_layers"]["hf"] == [2, 4, 5]


def test_interrupted_run_keeps_rows_and_resumes(tiny, tmp_path, monkeypatch):
    out = tmp_path / "run"
    full = api.evaluate(_cfg(tiny), progress=False).report
    calls = {"n": 0}
    real = api.Oracle.decode

    def flaky(self, prompt, check_lossless=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, prompt, check_lossless)

    monkeypatch.setattr(api.Oracle, "decode", flaky)
    with pytest.raises(KeyboardInterrupt):
        api.evaluate(_cfg(tiny, output_dir=str(out)), progress=False)
    assert [r["id"] for r in read_jsonl(out / "samples.jsonl")] == ["p0", "p1"]
    assert not (out / "report.json").exists()

    with pytest.raises(UserError, match="--resume"):          # refuses to mix runs silently
        api.evaluate(_cfg(tiny, output_dir=str(out)), progress=False)
    with pytest.raises(UserError, match="num_steps: 5 -> 3"):
        api.evaluate(_cfg(tiny, output_dir=str(out), resume=True, num_steps=3), progress=False)

    monkeypatch.setattr(api.Oracle, "decode", real)
    calls["n"] = 0
    resumed = api.evaluate(_cfg(tiny, output_dir=str(out), resume=True), progress=False).report
    assert [r["id"] for r in read_jsonl(out / "samples.jsonl")] == ["p0", "p1", "p2", "p3"]
    for key in ("summary", "per_position", "histogram"):
        assert resumed[key] == full[key]
    assert json.loads((out / "report.json").read_text())["summary"] == full["summary"]


def test_resume_drops_a_line_cut_short(tiny, tmp_path):
    out = tmp_path / "run"
    api.evaluate(_cfg(tiny, output_dir=str(out), limit=2), progress=False)
    with open(out / "samples.jsonl", "a") as f:
        f.write('{"id": "p2", "categ')               # the write an interrupt cut short
    report = api.evaluate(_cfg(tiny, output_dir=str(out), resume=True), progress=False).report
    assert report["summary"]["prompts"] == 4
    assert [r["id"] for r in read_jsonl(out / "samples.jsonl")] == ["p0", "p1", "p2", "p3"]


def test_samples_rows(tiny, tmp_path):
    out = tmp_path / "run"
    api.evaluate(_cfg(tiny, output_dir=str(out)), LoopOptions(check_lossless=True), progress=False)
    rows = read_jsonl(out / "samples.jsonl")
    for r in rows:
        assert {"id", "category", "prompt_len", "output_ids", "accepted_per_cycle", "verify_count"} <= set(r)
        assert r["verify_count"] == len(r["accepted_per_cycle"])
        n = len(r["output_ids"])
        assert n == 12 or (n < 12 and r["output_ids"][-1] == 2)      # cut at max_new_tokens or after EOS
        assert r["lossless"] is True
        assert r["spec_accept_length"] == pytest.approx(n / r["verify_count"])


@pytest.mark.parametrize("line, match", [
    ('{"id": "a"}', "none of the keys"),
    ('{"input_ids": "abc"}', "'input_ids' must be"),
    ('{"messages": [{"content": "x"}]}', "'messages' must be"),
    ("not json", "not valid JSON"),
])
def test_bad_prompt_rows(tiny, tmp_path, line, match):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w1 w2"}\n' + line + "\n")
    with pytest.raises(DataError, match=f"bad.jsonl:2: .*{match}"):
        api.evaluate(Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), prompts=str(bad)),
                     progress=False)


def test_missing_target_folder(tiny, tmp_path):
    with pytest.raises(TargetError, match=r"does not exist \(nor a Hugging Face model id"):
        api.load_oracle(Settings.of(target=str(tmp_path / "meta-llama/Llama-3.1-8B"), draft=str(tiny["head"])))
