"""server-check with a block drafter (issue 40) over SGLang's and vLLM's wire formats, against the local stand-in
servers of tests/fake_servers.py: a STAND-IN, not an engine (SGLang's DFLASH never runs here; the real vLLM serving
a DFlash draft is tests/test_real_vllm_dflash.py). What it shows: server-check reads a DFLASH server's settings
(num_steps forced to 1, the block in speculative_num_draft_tokens) and vLLM dflash's counters and per-request
metrics for a block drafter, and names the faults a block drafter is served with: another block length than the
oracle's (SGLang's and vLLM's silent mismatch) and taps shifted by one (target_layer_ids read as HF indices). The
faulty stand-ins' oracles are built from changed settings, not by the hypotheses' own code."""

import pytest
from dflash_fixtures import dflash_pair
from fake_servers import Engine, serve

from eagle_eval import api
from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.settings import Settings

NEW = 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return dflash_pair(tmp_path_factory.mktemp("dflash_server"))


@pytest.fixture(scope="module")
def settings(pair):
    return Settings.of(target=str(pair["target"]), draft=str(pair["dflash"]), prompts=str(pair["prompts"]),
                       dtype="fp32", num_steps=3, max_new_tokens=NEW)


@pytest.fixture(scope="module")
def checker(settings):
    return api.load_oracle(settings)


def _check(settings, checker, url, backend, **kw):
    return run_server_check(settings, ServerCheckOptions(backend=backend, url=url, metrics_settle=0, retries=0, **kw),
                            oracle=checker)


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_a_faithful_block_drafter_server_agrees_exactly(settings, checker, backend):
    engine = Engine(checker, backend, per_request="detailed" if backend == "vllm" else None)
    with serve(engine) as url:
        result = _check(settings, checker, url, backend)
    r = result.report
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert r["judgement"]["exact"] == r["judgement"]["requests"] == 6
    rows = {row["setting"]: row for row in r["server"]["settings_check"]}
    if backend == "sglang":
        assert rows["speculative_algorithm"]["server"] == "DFLASH" and rows["speculative_algorithm"]["ok"]
        assert rows["speculative_num_steps"]["server"] == 1 and rows["speculative_num_steps"]["ok"]
        assert rows["speculative_num_draft_tokens"]["server"] == 4 and rows["speculative_num_draft_tokens"]["ok"]
    else:
        assert rows["num_speculative_tokens"]["server"] == 3 and rows["num_speculative_tokens"]["ok"]
        for row in r["requests"]:
            assert row["server"]["accepted_per_cycle"] == row["oracle"]["accepted_per_cycle"]
    assert sum(sum(row["oracle"]["accepted_per_cycle"]) for row in r["requests"]) > 6       # not trivial


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_a_server_drafting_another_block_length_is_caught_and_named(settings, checker, backend):
    """The server drafts blocks of 3 rows (vLLM num_speculative_tokens 2, SGLang --speculative-num-draft-tokens 3)
    on the block_size 4 draft the oracle runs with num_steps 3: the settings disagree, and the hypothesis of the
    server's num_steps reproduces every request."""
    served = api.load_oracle(settings.with_(num_steps=2))
    with serve(Engine(served, backend, per_request="detailed" if backend == "vllm" else None)) as url:
        result = _check(settings, checker, url, backend)
    r = result.report
    assert result.exit_status == 1 and r["verdict"] == "disagree"
    setting = "speculative_num_draft_tokens" if backend == "sglang" else "num_speculative_tokens"
    (row,) = [s for s in r["server"]["settings_check"] if s["setting"] == setting]
    assert row["ok"] is False and "trained with block_size 4" in row["note"]
    hyp = r["hypotheses"]
    assert hyp["explanation"] == "server_num_steps", render_server_check(r)
    best = next(h for h in hyp["ranking"] if h["name"] == "server_num_steps")
    assert best["num_steps"] == 2 and best["exact_requests"] == hyp["requests"] == 6
    assert [h["name"] for h in hyp["not_applicable"]] == ["position_offset"]


def test_taps_read_as_hf_indices_are_named(settings, checker):
    """A server tapping target_layer_ids unshifted (HF [1, 3] instead of [2, 4]): caught, and the -1 hypothesis
    reproduces it."""
    served = api.load_oracle(settings.with_(aux_layers=(1, 3), aux_convention="hf"))
    with serve(Engine(served, "vllm", per_request="detailed")) as url:
        result = _check(settings, checker, url, "vllm")
    hyp = result.report["hypotheses"]
    assert result.exit_status == 1 and hyp["explanation"] == "aux_hf_minus_1", render_server_check(result.report)
    assert "vllm_v1_reads_nested_ids" not in [h["name"] for h in hyp["ranking"]]     # an EAGLE-3 config's key


def test_a_server_norming_context_keys_as_vllms_cpu_build_is_named(settings, checker):
    """A stand-in drafting as vLLM 0.32's CPU build does (draft layer 0's k_norm on every draft layer's context keys;
    the real server is tests/test_real_vllm_dflash.py): the published oracle disagrees, and the hypothesis of the CPU
    build's context keys reproduces every request. An SGLang server is not offered that hypothesis (it is vLLM's)."""
    served = api.load_oracle(settings.with_(dflash_convention="vllm-cpu"))
    with serve(Engine(served, "vllm", per_request="detailed")) as url:
        result = _check(settings, checker, url, "vllm")
    r, hyp = result.report, result.report["hypotheses"]
    assert result.exit_status == 1 and hyp["explanation"] == "vllm_cpu_context_k_norm", render_server_check(r)
    best = next(h for h in hyp["ranking"] if h["name"] == "vllm_cpu_context_k_norm")
    assert best["exact_requests"] == hyp["requests"] == 6
    assert [tuple(s) for s in best["settings"]] == [("dflash_convention", "vllm-cpu")]
    with serve(Engine(served, "sglang")) as url:
        names = [h["name"] for h in _check(settings, checker, url, "sglang").report["hypotheses"]["ranking"]]
    assert "vllm_cpu_context_k_norm" not in names and "as_configured" in names
