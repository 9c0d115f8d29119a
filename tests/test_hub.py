"""A Hugging Face model id as --target / --draft (models/hub.py), found as `from_pretrained` finds it: in a
local cache laid out as the hub lays it out (models--ORG--NAME/blobs, snapshots/COMMIT/..., refs/REVISION),
with HF_HUB_OFFLINE honoured. There is no network here: the cache is written by the test, and the one
"online" case points the hub at a closed port on 127.0.0.1."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.models.hub import HubError, model_folder
from eagle_eval.settings import ConfigError, Settings

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def cache_repo(cache: Path, repo_id: str, folder: Path, commit: str, refs=("main",)) -> Path:
    """Put `folder`'s files into `cache` as the hub's snapshot `commit` of `repo_id` (blobs by content, the
    snapshot's files relative links to them, refs/REF holding the commit); the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / f.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An offline hub cache under tmp_path (huggingface_hub reads its environment once, at import: the
    constants it read are what is patched here; tests in a new process set HF_HOME instead)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def cached(hub, tiny, tmp_path):
    """acme/tiny-target (main) and acme/tiny-head: main = the tiny head, tag v2 = another head."""
    from fixtures import make_head

    cache_repo(hub, "acme/tiny-target", tiny["target"], COMMIT_A)
    cache_repo(hub, "acme/tiny-head", tiny["head"], COMMIT_A)
    other = make_head(tmp_path / "other-head", draft_vocab=40, seed=7)
    cache_repo(hub, "acme/tiny-head", other, COMMIT_B, refs=("v2",))
    return {"hub": hub, "other": other}


def _settings(tiny, **kw):
    return Settings.of(prompts=str(tiny["prompts"]), max_new_tokens=8, limit=2, **kw)


def test_a_model_id_in_the_cache_loads_the_snapshot_transformers_finds(cached, tiny):
    from transformers import AutoConfig

    snapshot = cached["hub"] / "models--acme--tiny-target" / "snapshots" / COMMIT_A
    assert model_folder("acme/tiny-target", None, "--target") == snapshot
    # the layout is the hub's: transformers' own loader reads the same id from this cache
    assert AutoConfig.from_pretrained("acme/tiny-target").num_hidden_layers == \
        json.loads((tiny["target"] / "config.json").read_text())["num_hidden_layers"]
    by_id = api.load_oracle(_settings(tiny, target="acme/tiny-target", draft="acme/tiny-head"))
    by_folder = api.load_oracle(_settings(tiny, target=str(tiny["target"]), draft=str(tiny["head"])))
    prompts = api.checked_workload(by_folder).first_prompts
    assert [by_id.decode(p).output_ids for p in prompts] == [by_folder.decode(p).output_ids for p in prompts]
    assert [by_id.decode(p).accepted_per_cycle for p in prompts] == \
        [by_folder.decode(p).accepted_per_cycle for p in prompts]


def test_a_revision_picks_the_snapshot_its_ref_or_commit_names(cached, tiny):
    from safetensors.torch import load_file

    heads = cached["hub"] / "models--acme--tiny-head" / "snapshots"
    assert model_folder("acme/tiny-head", "v2", "--draft") == heads / COMMIT_B
    assert model_folder("acme/tiny-head", COMMIT_B, "--draft") == heads / COMMIT_B
    assert model_folder("acme/tiny-head", None, "--draft") == heads / COMMIT_A
    main_w = api.load_oracle(_settings(tiny, target="acme/tiny-target", draft="acme/tiny-head"))
    v2 = main_w.with_(draft_revision="v2")
    want = load_file(cached["other"] / "model.safetensors")["fc.weight"]
    assert torch.equal(v2.speculator.head.fc.weight.detach().cpu(), want)
    assert not torch.equal(main_w.speculator.head.fc.weight.detach().cpu(), want)
    with pytest.raises(HubError, match=r"--draft acme/tiny-head: no such folder, and as a Hugging Face model id "
                                       r"\(revision v3\) it is not in the cache .*HF_HUB_OFFLINE is set"):
        model_folder("acme/tiny-head", "v3", "--draft")


def test_offline_a_model_id_not_in_the_cache_says_so_in_one_line(hub, tiny):
    args = ["run", "--target", "acme/absent", "--draft", str(tiny["head"]), "--prompts", str(tiny["prompts"])]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"eagle-eval: error: --target acme/absent: no such folder, and as a Hugging Face model id (revision main) it "
        f"is not in the cache {hub}; HF_HUB_OFFLINE is set, so nothing is downloaded"), lines


def test_a_missing_folder_that_is_no_model_id_keeps_its_message(hub, tiny, tmp_path):
    for path in (tmp_path / "models" / "target", "./no-such-target", "a/b/c"):
        res = CliRunner().invoke(main, ["run", "--target", str(path), "--draft", str(tiny["head"])])
        assert res.exit_code == 2
        assert res.stderr.strip() == f"eagle-eval: error: {path}: target folder does not exist (nor a Hugging " \
                                     "Face model id: org/name)", res.stderr
    res = CliRunner().invoke(main, ["run", "--target", str(tiny["target"]), "--draft", "./no/such/head"])
    assert res.exit_code == 2 and "error: no/such/head: draft checkpoint folder does not exist" in res.stderr


def test_a_revision_of_a_local_folder_is_refused(tiny):
    with pytest.raises(ConfigError, match=r"--revision v1: --target .* is a local folder; a revision applies to a "
                                          r"Hugging Face model id"):
        model_folder(str(tiny["target"]), "v1", "--target")
    with pytest.raises(ConfigError, match="--draft-revision v1: --draft"):
        api.load_oracle(Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), draft_revision="v1"))


def test_online_with_the_hub_unreachable_the_cached_snapshot_is_used(cached, monkeypatch):
    """As transformers does: the hub is asked first, and when it cannot be reached the cache answers."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")        # nothing listens there
    snapshot = cached["hub"] / "models--acme--tiny-target" / "snapshots" / COMMIT_A
    assert model_folder("acme/tiny-target", None, "--target") == snapshot
    with pytest.raises(HubError, match=r"--target acme/absent: .* not in the cache .*, and the hub could not be "
                                       r"reached \(ConnectError: "):
        model_folder("acme/absent", None, "--target")


def test_the_cli_takes_model_ids_from_hf_home_in_a_new_process(tiny, tmp_path):
    """HF_HOME and HF_HUB_OFFLINE as a user sets them (read when the process starts); the run folder's owner
    file fingerprints the snapshot's files."""
    cache = tmp_path / "home" / "hub"
    cache_repo(cache, "acme/tiny-target", tiny["target"], COMMIT_A)
    cache_repo(cache, "acme/tiny-head", tiny["head"], COMMIT_A)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eagle_eval", "run", "--target", "acme/tiny-target", "--draft", "acme/tiny-head",
           "--prompts", str(tiny["prompts"]), "--limit", "2", "--max-new-tokens", "6", "--output-dir", str(out)]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    from eagle_eval.results.run_folder import OWNER_FILE

    inputs = json.loads((out / OWNER_FILE).read_text())["inputs"]
    assert inputs["target"]["path"] == str(cache / "models--acme--tiny-target" / "snapshots" / COMMIT_A)
    assert set(inputs["target"]["fingerprint"]["files"]) >= {"config.json", "model.safetensors"}
    report = json.loads((out / "report.json").read_text())["config"]
    assert report["target"]["path"] == inputs["target"]["path"] and report["draft"] == "acme/tiny-head"
    assert "target: acme/tiny-target" in (out / "settings.yaml").read_text()       # reruns from the id


def test_plan_takes_a_model_id_reading_its_config_only(hub, tiny, tmp_path):
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    (only_config / "config.json").write_bytes((tiny["target"] / "config.json").read_bytes())
    cache_repo(hub, "acme/big", only_config, COMMIT_A)
    res = CliRunner().invoke(main, ["plan", "--target", "acme/big", "--gpus", "1", "--gpu-memory", "80GB"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["plan", "--target", "acme/big", "--revision", "v9", "--gpus", "1",
                                    "--gpu-memory", "80GB"])
    assert res.exit_code == 2 and "--revision v9: no such folder" not in res.stderr
    assert "(revision v9) it is not in the cache" in res.stderr
