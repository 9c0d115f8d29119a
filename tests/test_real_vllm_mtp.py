"""server-check against a REAL vLLM (0.32, CPU build, V1 model runner, fp32) serving MTP targets: a GLM-4.5-style MoE
target (`Glm4MoeForCausalLM`, vLLM's `glm4_moe_mtp.py`) and a MiMo-style dense one (`MiMoForCausalLM` on a Qwen2 body,
`mimo_mtp.py`), each with one MTP layer trained a little here (tests/mtp_fixtures.py), served with
`{"method": "mtp", "num_speculative_tokens": 2}` and `--per-request-spec-decode-metrics detailed`.

The oracle, wired with vLLM's convention for the family (heads/mtp/conventions.py: GLM post-norm input, position-0
masking, chain BEFORE the output norm; MiMo pre-norm input, masking, chain after it), must give every request's
tokens and its accepted drafts at every verify step; and the convention must show: the nearest other convention
(SGLang's) differs from the server on some request. One server per layout (each start costs 1-2 minutes on 2
cores); num_speculative_tokens is the server's, not a request's, so k = 2 only (k = 2 runs the chained step that
k = 1 would not). DeepSeek-V3 (MLA) and Qwen3-Next / Qwen3.5 (Gated DeltaNet) cannot be served correctly by this
build (docs/mtp.md): they are tested against transformers and the naive reference (tests/test_mtp_*.py).
Deselect with `-m "not real_vllm"` or EAGLE_EVAL_SKIP_REAL_VLLM=1.
"""

import pytest
from mtp_fixtures import make_mtp_target, read_prompts, train_mtp, write_prompts
from real_vllm import real_vllm_servers  # noqa: F401  (the fixture)

from eagle_eval import api
from eagle_eval.records import Prompt
from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.servers.vllm import SOURCE_DETAILED
from eagle_eval.settings import Settings

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

K, NEW, PROMPTS = 2, 24, 8
SPECULATIVE = {"method": "mtp", "num_speculative_tokens": K}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """family -> (target folder, prompts file): hidden 64, head_dim 32 (the CPU attention's sizes), MTP trained a
    little (8 steps: drafts accepted often, not always) under vLLM's convention on the target's greedy continuations
    of the checked prompts (a layer this small does not carry over to other prompts; what is checked is that the
    server computes what the oracle computes, not how well the layer predicts)."""
    root = tmp_path_factory.mktemp("real-vllm-mtp")
    prompts = write_prompts(root / "prompts.jsonl", n=PROMPTS, seed=5)
    out = {}
    for family in ("glm4_moe", "mimo"):
        folder = make_mtp_target(root / family, family, hidden=64, head_dim=32, seed=2)
        out[family] = (train_mtp(folder, read_prompts(prompts), steps=8, new_tokens=28), prompts)
    return out


def check(folder, prompts, url, convention="vllm"):
    cfg = Settings.of(target=str(folder), draft="mtp", num_steps=K, dtype="fp32", prompts=str(prompts),
                      max_new_tokens=NEW, mtp_convention=convention)
    return run_server_check(cfg, ServerCheckOptions(backend="vllm", url=url))


@pytest.mark.parametrize("family", ["glm4_moe", "mimo"])
def test_vllm_serves_the_mtp_layer_as_the_oracle_says_request_by_request(real_vllm_servers, served, family):
    folder, prompts = served[family]
    server = real_vllm_servers(folder, None, SPECULATIVE)
    result = check(folder, prompts, server.url)
    r, j = result.report, result.report["judgement"]
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert j["mode"] == "exact" and j["exact"] == j["requests"] == PROMPTS
    assert r["acceptance"]["sources"] == {SOURCE_DETAILED: PROMPTS}
    server_steps = {}
    for row in r["requests"]:
        o, s = row["oracle"], row["server"]
        assert s["accepted_per_cycle"] == o["accepted_per_cycle"], row["id"]
        server_steps[row["id"]] = s["accepted_per_cycle"]
    total = sum(sum(a) for a in server_steps.values())
    cycles = sum(len(a) for a in server_steps.values())
    assert 0 < total < K * cycles                           # drafts accepted, not always
    log = server.log_path.read_text()
    assert "Sharing target model" in log                    # vLLM shares the target's embedding / lm_head

    # the convention shows: SGLang's (GLM: no masking, chain after the norm; MiMo: post-norm input) is not the server
    other = api.load_oracle(Settings.of(target=str(folder), draft="mtp", num_steps=K, dtype="fp32",
                                        mtp_convention="sglang", max_new_tokens=NEW))
    differs = [i for i, p in enumerate(read_prompts(prompts))
               if other.decode(Prompt(id=f"p{i}", category="c", input_ids=p)).accepted_per_cycle != server_steps[f"p{i}"]]
    assert differs, "SGLang's convention gives the server's counts too: this target cannot tell the conventions apart"
