"""server-check against a REAL vLLM (0.32, CPU build, V1 model runner, fp32) serving the bundled pair.

The oracle is exact here: wired the same way, every request has the oracle's tokens AND counts. Each
wiring fault is served for real, by editing the config.json of the head copy vLLM loads (the oracle
keeps reading the committed head), and must be caught in exact mode and named by the hypothesis that
reproduces it request by request. Each server start costs 1-2 minutes on 2 cores, so there is one
server per wiring. Every speculative server runs with `--per-request-spec-decode-metrics detailed`
(tests/real_vllm.py): server-check reads each request's acceptance from its own answer, verify step by
verify step; one test forces the counter deltas on the same server and checks that both sources agree.
Deselect with `-m "not real_vllm"` or EAGLE_EVAL_SKIP_REAL_VLLM=1.
"""

import json
import shutil

import pytest
from real_vllm import REPO, real_vllm_servers  # noqa: F401  (the fixture)

from eagle_eval import api
from eagle_eval.settings import Settings
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.vllm import SOURCE_COUNTERS, SOURCE_DETAILED

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

TARGET, DRAFT = REPO / "checkpoints" / "target", REPO / "checkpoints" / "draft"
NUM_STEPS = 5
FAULT_PROMPTS = 12                     # the faults are judged on the first 12 bundled prompts
COUNTER_PROMPTS = 8                    # the counter-delta path, checked against the per-request metrics
SPECULATIVE = {"num_speculative_tokens": NUM_STEPS}


@pytest.fixture(scope="module")
def oracle():
    return api.load_oracle(Settings.of(target=str(TARGET), draft=str(DRAFT), num_steps=NUM_STEPS, dtype="fp32"))


def served_head(tmp_path, name, nested=None, top=None):
    """A copy of the bundled head whose config.json carries these aux id keys (None: key removed)."""
    folder = tmp_path / name
    shutil.copytree(DRAFT, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("eagle_aux_hidden_state_layer_ids", None)
    config["eagle_config"].pop("eagle_aux_hidden_state_layer_ids", None)
    if nested is not None:
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = nested
    if top is not None:
        config["eagle_aux_hidden_state_layer_ids"] = top
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def check(oracle, url, limit=None, **kw):
    cfg = Settings.of(target=str(TARGET), draft=str(DRAFT), num_steps=NUM_STEPS, dtype="fp32", limit=limit)
    return run_server_check(cfg, ServerCheckOptions(backend="vllm", url=url, **kw), oracle=oracle)


def sampled_check(oracle, url, limit=8, **decoding):
    cfg = Settings.of(target=str(TARGET), draft=str(DRAFT), num_steps=NUM_STEPS, dtype="fp32", limit=limit,
                      max_new_tokens=48, **decoding)
    return run_server_check(cfg, ServerCheckOptions(backend="vllm", url=url), oracle=oracle)


def test_sampling_on_the_cpu_build_is_caught_as_not_samples_of_the_target(real_vllm_servers, oracle):
    """vLLM 0.32's CPU build serves the bundled pair exactly at temperature 0 (above), but its speculative
    sampling is broken: at temperature 0.7, top-p 0.95 and a per-request seed it returns tokens the target gives
    probability 0 at those settings. server-check at temperature > 0 must say that, not only that acceptance
    differs."""
    server = real_vllm_servers(TARGET, DRAFT, SPECULATIVE)
    result = sampled_check(oracle, server.url, temperature=0.7, top_p=0.95)
    r = result.report
    assert result.exit_status == 1 and r["verdict"] == "disagree", render_server_check(r)
    assert r["plausibility"]["verdict"] == "differs" and r["plausibility"]["outside_support"] > 0
    assert r["plausibility"]["mean_log_p"] < r["plausibility"]["mean_log_p_of_samples"] - 5
    assert "not samples of the target at these settings" in r["reasons"][0]
    assert r["expectation"]["verdict"] == "differs" and r["expectation"]["z"] < -3.29     # accept length too low
    assert all(row["sampling"]["temperature"] == 0.7 and row["sampling"]["top_p"] == 0.95 for row in r["requests"])
    assert len({row["sampling"]["seed"] for row in r["requests"]}) == len(r["requests"])       # a seed per request
    assert "not samples of the target" in render_server_check(r)


def taps_logged(server) -> str:
    lines = [ln for ln in server.log_path.read_text().splitlines() if "Using auxiliary layers" in ln]
    return lines[-1].split("config:")[-1].strip() if lines else ""


def test_faithful_wiring_is_exact_request_by_request(real_vllm_servers, oracle):
    """The committed head carries both id keys: vLLM taps the trained HF[2, 4, 5]; 32/32 exact, read from
    each answer's per-request metrics, with the oracle's accepted drafts at every verify step."""
    server = real_vllm_servers(TARGET, DRAFT, SPECULATIVE)
    assert taps_logged(server) == "(2, 4, 5)"
    result = check(oracle, server.url)
    r, j = result.report, result.report["judgement"]
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert j["mode"] == "exact" and j["exact"] == j["requests"] == 32
    assert r["acceptance"]["sources"] == {SOURCE_DETAILED: 32}
    for row in r["requests"]:
        o, s = row["oracle"], row["server"]
        assert s["accepted_per_cycle"] == o["accepted_per_cycle"] and row["first_differing_cycle"] is None, row["id"]
        assert s["reported"]["per_request_metrics"]["per_step_accepted"] == o["accepted_per_cycle"]   # its own field
        assert "counter_deltas" not in s["reported"]
    assert r["acceptance"]["per_request"]["per_cycle_equal"] == 32
    assert sum(len(row["oracle"]["accepted_per_cycle"]) for row in r["requests"]) > 32 * 10     # not trivial
    assert len({tuple(row["oracle"]["accepted_per_cycle"]) for row in r["requests"]}) > 16
    assert r["hypotheses"] is None
    text = render_server_check(r)
    assert "exact 32/32" in text and f"server counts from {SOURCE_DETAILED} (32/32 requests)" in text


def test_counter_deltas_agree_with_per_request_metrics(real_vllm_servers, oracle):
    """The same quiet server, the counter-delta path forced: exact again, and per request the deltas of
    the server-wide counters equal the answer's own metrics (both as vLLM reported them)."""
    server = real_vllm_servers(TARGET, DRAFT, SPECULATIVE)
    result = check(oracle, server.url, limit=COUNTER_PROMPTS, vllm_metrics="counters")
    r = result.report
    assert result.exit_status == 0 and r["judgement"]["exact"] == COUNTER_PROMPTS, render_server_check(r)
    assert r["acceptance"]["sources"] == {SOURCE_COUNTERS: COUNTER_PROMPTS}
    for row in r["requests"]:
        reported = row["server"]["reported"]
        delta, own = reported["counter_deltas"], reported["per_request_metrics"]
        steps = own["per_step_accepted"]
        assert (delta["num_drafts"], delta["num_accepted_tokens"], delta["num_draft_tokens"]) == \
            (own["num_spec_steps"], own["num_accepted_draft_tokens"], own["num_draft_tokens"]), row["id"]
        assert delta["num_accepted_tokens_per_pos"] == [sum(a > i for a in steps) for i in range(NUM_STEPS)]
        assert steps == row["oracle"]["accepted_per_cycle"] and reported["sources_differ"] == []
        assert row["server"]["accepted_per_cycle"] is None             # counter deltas have no order


def test_the_bundled_head_before_its_config_fix(real_vllm_servers, oracle, tmp_path):
    """Only the nested SGLang-style ids (the config before the fix): vLLM's V1 runner reads them raw,
    one layer low (HF[1, 3, 4]); exact mode fails and the engine-tap hypothesis reproduces it."""
    server = real_vllm_servers(TARGET, served_head(tmp_path, "nested-only", nested=[1, 3, 4]), SPECULATIVE)
    assert taps_logged(server) == "(1, 3, 4)"
    result = check(oracle, server.url, limit=FAULT_PROMPTS)
    r = result.report
    assert result.exit_status == 1 and r["tokens"]["equal"] == FAULT_PROMPTS      # speed, never tokens
    assert r["judgement"]["counts_differ"] > 0 and r["acceptance"]["sources"] == {SOURCE_DETAILED: FAULT_PROMPTS}
    differing = [row for row in r["requests"] if row["counts_equal"] is False]
    for row in differing:             # named at the first verify step whose accepted drafts differ
        d, o, s = row["first_differing_cycle"], row["oracle"]["accepted_per_cycle"], row["server"]["accepted_per_cycle"]
        assert o[:d["cycle"]] == s[:d["cycle"]] and d["oracle"] != d["server"], row["id"]
    assert "accepted drafts per verify step first differ at step" in r["reasons"][0]
    hyp = r["hypotheses"]
    assert hyp["explanation"] == "vllm_v1_reads_nested_ids"
    best = next(h for h in hyp["ranking"] if h["name"] == "vllm_v1_reads_nested_ids")
    assert best["exact_requests"] == FAULT_PROMPTS and best["aux_hf"] == [1, 3, 4]


def test_the_embedding_in_place_of_the_lowest_layer(real_vllm_servers, oracle, tmp_path):
    """The deployment's bug, served: its aggregate moves only ~5%, exact mode fails it anyway."""
    head = served_head(tmp_path, "embedding", nested=[-1, 3, 4], top=[0, 4, 5])
    server = real_vllm_servers(TARGET, head, SPECULATIVE)
    assert taps_logged(server) == "(0, 4, 5)"
    result = check(oracle, server.url, limit=FAULT_PROMPTS)
    r = result.report
    assert result.exit_status == 1 and r["verdict"] == "disagree" and r["tokens"]["equal"] == FAULT_PROMPTS
    hyp = r["hypotheses"]
    assert hyp["explanation"] == "embedding_for_lowest"
    best = next(h for h in hyp["ranking"] if h["name"] == "embedding_for_lowest")
    assert best["exact_requests"] == FAULT_PROMPTS


def test_a_fault_no_hypothesis_models(real_vllm_servers, oracle, tmp_path):
    """Lowest and highest taps moved in opposite directions (HF[1, 4, 6]): caught, and not explained."""
    server = real_vllm_servers(TARGET, served_head(tmp_path, "unmodelled", nested=[0, 3, 5], top=[1, 4, 6]),
                               SPECULATIVE)
    assert taps_logged(server) == "(1, 4, 6)"
    result = check(oracle, server.url, limit=FAULT_PROMPTS)
    hyp = result.report["hypotheses"]
    assert result.exit_status == 1 and hyp["explanation"] is None
    assert "no hypothesis explains the server" in render_server_check(result.report)


def test_plain_vllm_has_no_speculative_counters(real_vllm_servers, oracle):
    server = real_vllm_servers(TARGET)
    result = check(oracle, server.url, limit=4)
    r = result.report
    assert result.exit_status == 3 and r["verdict"] == "incomplete"
    assert r["tokens"]["equal"] == 4                      # greedy tokens still equal the oracle's
    assert any("spec_decode" in w for w in r["warnings"])
    tau = r["summary"]["accept_length"]
    assert tau > 1 and f"{tau:.3f}" in render_server_check(r)   # the oracle's own figure is still printed


def test_a_two_layer_head_is_exact_and_its_first_layer_alone_is_not(real_vllm_servers, oracle, tmp_path):
    """A two-layer copy of the bundled head (fixtures.add_decoder_layer: `layers.1.*` seeded, std 0.25): vLLM's
    llama_eagle3.py LlamaModel runs layer 1 over layer 0's sum, each layer over its own KV cache, and feeds the
    LAST layer's pre-norm sum back as the next step's hidden input. Exact on 12/12 requests; the one-layer oracle
    (the committed head) disagrees with that server on every request."""
    from fixtures import add_decoder_layer

    head = add_decoder_layer(DRAFT, tmp_path / "two-layer")
    server = real_vllm_servers(TARGET, head, SPECULATIVE)
    cfg = Settings.of(target=str(TARGET), draft=str(head), num_steps=NUM_STEPS, dtype="fp32", limit=FAULT_PROMPTS)
    result = run_server_check(cfg, ServerCheckOptions(backend="vllm", url=server.url))
    r, j = result.report, result.report["judgement"]
    assert result.exit_status == 0 and r["verdict"] == "agree", render_server_check(r)
    assert j["mode"] == "exact" and j["exact"] == j["requests"] == FAULT_PROMPTS
    assert r["config"]["head"]["variant"]["num_hidden_layers"] == 2
    assert {0, 1, 2, 3} <= {n for row in r["requests"] for n in row["oracle"]["accepted_per_cycle"]}
    one = check(oracle, server.url, limit=FAULT_PROMPTS)
    assert one.report["verdict"] != "agree", render_server_check(one.report)
    assert sum(row["first_differing_cycle"] is not None for row in one.report["requests"]) == FAULT_PROMPTS
