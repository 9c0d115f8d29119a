"""server-check against a REAL vLLM (0.32, CPU build, V1 model runner, fp32) serving P-EAGLE: the bundled target
with a P-EAGLE copy of the bundled EAGLE-3 head (its config gains `mask_token_id`, its weights a `mask_hidden`
row of k*H_t values, seeded), served with `{"method": "eagle3", "num_speculative_tokens": 3,
"parallel_drafting": true}` (the amazon P-EAGLE model cards' setting) and `--per-request-spec-decode-metrics
detailed`. vLLM falls back to the V1 runner for parallel drafting (config/vllm.py), the one this build runs.

The oracle drafts through heads/peagle/ (slot 0 the last real pair, two mask rows with fc(mask_hidden)) and must
give every request's tokens and its accepted drafts at every verify step; the same head read as a plain EAGLE-3
chain (no mask_hidden) must not (the server really drafts in parallel). The mask_hidden is not trained, so the mask
slots are accepted rarely (the second draft a few percent of cycles, the third never here): the check is that the
server computes what the oracle computes. A second server serves a two-layer copy of that head (vLLM's multi-layer
EAGLE-3 `LlamaModel`), exact too, while the one-layer head disagrees with it. Deselect with `-m "not real_vllm"` or
EAGLE_EVAL_SKIP_REAL_VLLM=1.
"""

import json
import shutil

import pytest
import torch
from real_vllm import REPO, real_vllm_servers  # noqa: F401  (the fixture)

from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.settings import Settings

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

TARGET, DRAFT = REPO / "checkpoints" / "target", REPO / "checkpoints" / "draft"
K, PROMPTS, MASK = 3, 8, 5
SPECULATIVE = {"method": "eagle3", "num_speculative_tokens": K, "parallel_drafting": True}


@pytest.fixture(scope="module")
def peagle_head(tmp_path_factory):
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("real-vllm-peagle") / "draft"
    shutil.copytree(DRAFT, folder)
    weights = load_file(str(folder / "model.safetensors"))
    width = weights["fc.weight"].shape[1]
    weights["mask_hidden"] = torch.randn(1, width, generator=torch.Generator().manual_seed(0)).to(
        weights["fc.weight"].dtype)
    save_file(weights, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "mask_token_id": MASK}, indent=2))
    return folder


def check(draft, url):
    cfg = Settings.of(target=str(TARGET), draft=str(draft), num_steps=K, dtype="fp32", limit=PROMPTS)
    return run_server_check(cfg, ServerCheckOptions(backend="vllm", url=url))


def test_vllm_serves_parallel_drafting_as_the_oracle_says_request_by_request(real_vllm_servers, peagle_head):
    server = real_vllm_servers(TARGET, peagle_head, SPECULATIVE)
    result = check(peagle_head, server.url)
    r, j = result.report, result.report["judgement"]
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert j["mode"] == "exact" and j["exact"] == j["requests"] == PROMPTS
    assert r["config"]["head"]["parallel_drafting"]["k"] == K
    for row in r["requests"]:
        assert row["server"]["accepted_per_cycle"] == row["oracle"]["accepted_per_cycle"], row["id"]
    accepted = [n for row in r["requests"] for n in row["oracle"]["accepted_per_cycle"]]
    assert {0, 1, 2} <= set(accepted), sorted(set(accepted))      # a mask slot's draft was accepted and compared


def test_the_same_head_as_a_chain_is_not_what_the_server_drafts(real_vllm_servers, peagle_head, tmp_path):
    """The head without mask_hidden is an ordinary EAGLE-3 chain (vLLM skips mask_hidden without parallel drafting):
    the parallel server disagrees with that oracle, so the agreement above is not the chain's."""
    from safetensors.torch import load_file, save_file

    server = real_vllm_servers(TARGET, peagle_head, SPECULATIVE)
    chain = shutil.copytree(peagle_head, tmp_path / "chain")
    weights = load_file(str(chain / "model.safetensors"))
    weights.pop("mask_hidden")
    save_file(weights, str(chain / "model.safetensors"))
    result = check(chain, server.url)
    assert result.report["verdict"] != "agree", render_server_check(result.report)


@pytest.fixture(scope="module")
def two_layer_head(peagle_head, tmp_path_factory):
    """The P-EAGLE copy with a second decoder layer (fixtures.add_decoder_layer: seeded weights of std 0.25, enough
    that all 8 requests' acceptance differs from the one-layer head's)."""
    from fixtures import add_decoder_layer

    return add_decoder_layer(peagle_head, tmp_path_factory.mktemp("real-vllm-peagle-2") / "draft")


def test_vllm_serves_a_two_layer_peagle_head_as_the_oracle_says(real_vllm_servers, two_layer_head, peagle_head):
    """vLLM's llama_eagle3.py LlamaModel runs layer 1 over layer 0's sum, each layer over its own KV cache, for the
    real pairs and the mask rows alike: exact on every request; the one-layer head (the same weights without
    layers.1) disagrees with that server, so layer 1 was computed, not skipped."""
    server = real_vllm_servers(TARGET, two_layer_head, SPECULATIVE)
    result = check(two_layer_head, server.url)
    r, j = result.report, result.report["judgement"]
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert j["mode"] == "exact" and j["exact"] == j["requests"] == PROMPTS
    assert r["config"]["head"]["variant"]["num_hidden_layers"] == 2
    accepted = [n for row in r["requests"] for n in row["oracle"]["accepted_per_cycle"]]
    assert {0, 1, 2} <= set(accepted), sorted(set(accepted))
    one = check(peagle_head, server.url)
    assert one.report["verdict"] != "agree", render_server_check(one.report)
