"""server-check over SGLang's and vLLM's wire formats, against local stand-in servers (127.0.0.1 only,
tests/fake_servers.py) that serve an eagle_eval oracle.

What this shows is the wire and the judgement, not agreement with an engine: a stand-in serving the check's own
oracle answers with exactly the oracle's tokens and counts, so its agreeing says that server-check reads each
engine's fields, per-request metrics, settings and logs right, and nothing about SGLang's or vLLM's own
decoding (SGLang never runs in these tests; the real vLLM does in tests/test_real_vllm*.py). Each injected
fault must be caught, and for the wiring faults the hypothesis matching must name the fault that was injected.
The faulty stand-ins' oracles are built from changed settings (not through the hypotheses' own variant code),
so naming the fault is a real test of the hypotheses.
"""

import json
import re
import socket
from dataclasses import replace

import pytest
from click.testing import CliRunner
from fake_servers import Engine, serve
from trained import AUX_HF, NEW_TOKENS, NUM_PROMPTS, NUM_STEPS, trained

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.settings import ConfigError, Settings
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.http import ServerError

# wiring faults as a server would have them, written as the settings that reproduce each
WIRING_FAULTS = {
    "aux_hf_plus_1": dict(aux_layers=tuple(i + 1 for i in AUX_HF), aux_convention="hf"),
    "aux_hf_minus_1": dict(aux_layers=tuple(i - 1 for i in AUX_HF), aux_convention="hf"),
    "embedding_for_lowest": dict(aux_layers=(0,) + AUX_HF[1:], aux_convention="hf"),
    "position_offset": dict(position_offset=1),
    # no hypothesis models this one: the lowest and highest taps moved in opposite directions
    "unmodelled_taps": dict(aux_layers=(1, 4, 6), aux_convention="hf"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return trained(tmp_path_factory)


@pytest.fixture(scope="module")
def run_config(models):
    return Settings.of(target=str(models["target"]), draft=str(models["head"]), prompts=str(models["prompts"]),
                     num_steps=NUM_STEPS, max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def checker(run_config):
    return api.load_oracle(run_config)


@pytest.fixture(scope="module")
def server_oracle(run_config):
    cache = {}

    def get(fault=None):
        if fault not in cache:
            cache[fault] = api.load_oracle(run_config.with_(**WIRING_FAULTS.get(fault, {})))
        return cache[fault]
    return get


def _check(run_config, checker, url, backend, **kw):
    cfg = ServerCheckOptions(backend=backend, url=url, metrics_settle=0, retries=0, **kw)
    return run_server_check(run_config, cfg, oracle=checker)


def _cli(run_config, *args):
    base = ["server-check", "--target", run_config.model.target, "--draft", run_config.model.draft, "--prompts",
            run_config.workload.prompts, "--num-steps", str(NUM_STEPS), "--max-new-tokens", str(NEW_TOKENS),
            "--metrics-settle", "0"]
    return CliRunner().invoke(main, base + list(args))


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_the_oracle_served_over_each_wire_agrees_with_itself(run_config, checker, server_oracle, backend):
    with serve(Engine(server_oracle(), backend)) as url:
        result = _check(run_config, checker, url, backend)
    r = result.report
    assert result.exit_status == 0 and r["verdict"] == "agree" and r["reasons"] == []
    assert r["tokens"]["equal"] == NUM_PROMPTS and not r["divergences"]
    acc = r["acceptance"]
    assert acc["requests_compared"] == NUM_PROMPTS and acc["relative_difference"] == 0
    assert acc["per_request"]["counts_equal"] == NUM_PROMPTS        # verify steps, accepted, histogram/per-pos
    assert acc["oracle"] > 3.0                                     # the trained head accepts most drafts
    assert all(s["ok"] in (True, None) for s in r["server"]["settings_check"])
    dist = r["distribution"]["histogram" if backend == "sglang" else "per_position"]
    if backend == "sglang":
        assert dist["oracle"] == dist["server"] == r["histogram"]
    else:
        assert all(p["oracle_accepted"] == p["server_accepted"] for p in dist)
    assert r["hypotheses"] is None


MODELLED = [f for f in WIRING_FAULTS if f != "unmodelled_taps"]


@pytest.mark.parametrize("backend, fault", [("sglang", f) for f in MODELLED] +
                         [("vllm", "aux_hf_plus_1"), ("vllm", "position_offset")])
def test_a_stand_in_with_a_wiring_fault_is_caught_and_named(run_config, checker, server_oracle, backend, fault):
    with serve(Engine(server_oracle(fault), backend)) as url:
        result = _check(run_config, checker, url, backend)
    r = result.report
    assert result.exit_status == 1 and r["verdict"] == "disagree"
    assert r["tokens"]["equal"] == NUM_PROMPTS            # a wiring fault costs speed, never tokens
    j = r["judgement"]
    assert j["mode"] == "exact" and j["counts_differ"] > 0 and j["exact"] + j["counts_differ"] == NUM_PROMPTS
    assert r["acceptance"]["server"] < r["acceptance"]["oracle"]
    hyp = r["hypotheses"]
    assert hyp["explanation"] == fault and hyp["tied"] == [fault]
    best = hyp["ranking"][0]
    assert best["mean_abs_difference"] == 0 and best["exact_requests"] == NUM_PROMPTS
    faithful = next(h for h in hyp["ranking"] if h["name"] == "as_configured")
    assert faithful["mean_abs_difference"] > 0.2 and faithful["exact_requests"] == j["exact"]


def test_a_fault_no_hypothesis_models_is_not_explained(run_config, checker, server_oracle):
    with serve(Engine(server_oracle("unmodelled_taps"), "sglang")) as url:
        result = _check(run_config, checker, url, "sglang")
    r = result.report
    assert result.exit_status == 1 and r["judgement"]["counts_differ"] > 0
    hyp = r["hypotheses"]
    assert hyp["explanation"] is None and hyp["tied"] == [] and len(hyp["nearest"]) == 3
    assert all(h["exact_requests"] * 2 <= hyp["requests"] for h in hyp["ranking"])
    assert "no hypothesis explains the server" in render_server_check(r)


@pytest.mark.parametrize("level", ["detailed", "summary"])
def test_vllm_per_request_metrics_are_read_from_each_answer(run_config, checker, server_oracle, level):
    with serve(Engine(server_oracle(), "vllm", per_request=level)) as url:
        result = _check(run_config, checker, url, "vllm")
    r = result.report
    assert result.exit_status == 0 and r["judgement"]["exact"] == NUM_PROMPTS
    source = f"per-request metrics ({level})"
    assert r["acceptance"]["sources"] == {source: NUM_PROMPTS}
    assert all(row["server"]["source"] == source and "counter_deltas" not in row["server"]["reported"]
               for row in r["requests"])
    compared = r["acceptance"]["per_request"]["per_cycle_compared"]
    text = render_server_check(r)
    assert f"server counts from {source} ({NUM_PROMPTS}/{NUM_PROMPTS} requests)" in text
    if level == "detailed":
        assert compared == r["acceptance"]["per_request"]["per_cycle_equal"] == NUM_PROMPTS
        assert all(row["server"]["accepted_per_cycle"] == row["oracle"]["accepted_per_cycle"]
                   for row in r["requests"])
        assert f"verify step by verify step on {NUM_PROMPTS} requests: {NUM_PROMPTS} equal" in text
        # the server's per-step counts bucketed by context (results/context.py) are the oracle's, bucket by bucket
        assert r["server_by_context"]["requests"] == NUM_PROMPTS
        assert r["server_by_context"]["buckets"] == r["by_context"]["buckets"]
        assert "server acceptance by context (its per-step counts)" in text
    else:
        assert compared == 0 and any("summary level" in w for w in r["warnings"])
        assert r["server_by_context"] is None and r["by_context"]["buckets"]     # no per-step counts: no buckets


def test_vllm_per_step_order_differs_with_equal_totals(run_config, checker, server_oracle):
    """The stand-in reports each request's verify steps in reverse: every total and per-position count is
    the oracle's, so only the per-cycle comparison can fail it; it must, naming the first cycle. (Both
    sides run the aux_hf_plus_1 wiring: the trained head's faithful sequences are all 3s, the same reversed.)"""
    wiring = run_config.with_(**WIRING_FAULTS["aux_hf_plus_1"])
    oracle = server_oracle("aux_hf_plus_1")
    with serve(Engine(oracle, "vllm", fault="per_step_reversed", per_request="detailed")) as url:
        result = _check(wiring, oracle, url, "vllm", hypotheses=False)
    r = result.report
    assert result.exit_status == 1 and r["verdict"] == "disagree"
    assert r["acceptance"]["relative_difference"] == 0 and r["acceptance"]["per_request"]["outside_tolerance"] == []
    palindromes = sum(row["oracle"]["accepted_per_cycle"] == row["oracle"]["accepted_per_cycle"][::-1]
                      for row in r["requests"])
    assert r["judgement"]["counts_differ"] == NUM_PROMPTS - palindromes > 0
    for row in r["requests"]:
        o, s = row["oracle"], row["server"]
        assert (s["verify_count"], s["accepted_drafts"], s["histogram"], s["accepted_per_position"]) == \
            (o["verify_count"], o["accepted_drafts"], o["histogram"], o["accepted_per_position"])
        d = row["first_differing_cycle"]
        if row["counts_equal"] is False:
            i = d["cycle"]
            assert o["accepted_per_cycle"][:i] == s["accepted_per_cycle"][:i] and d["server"] != d["oracle"]
            assert d["server"] == o["accepted_per_cycle"][-1 - i]
    assert "accepted drafts per verify step first differ at step" in r["reasons"][0]


def test_vllm_wiring_fault_named_with_per_cycle_counts(run_config, checker, server_oracle):
    with serve(Engine(server_oracle("aux_hf_plus_1"), "vllm", per_request="detailed")) as url:
        result = _check(run_config, checker, url, "vllm")
    r = result.report
    assert result.exit_status == 1 and r["judgement"]["counts_differ"] > 0
    assert all(row["first_differing_cycle"] is not None for row in r["requests"] if row["counts_equal"] is False)
    hyp = r["hypotheses"]
    assert hyp["explanation"] == "aux_hf_plus_1" and hyp["ranking"][0]["exact_requests"] == NUM_PROMPTS


def test_vllm_metrics_choice_needs_vllm():
    with pytest.raises(ConfigError, match="--vllm-metrics needs --backend vllm"):
        ServerCheckOptions(backend="sglang", url="http://127.0.0.1:1", vllm_metrics="counters")
    with pytest.raises(ConfigError, match="--vllm-metrics must be one of auto, per-request, counters"):
        ServerCheckOptions(backend="vllm", url="http://127.0.0.1:1", vllm_metrics="both")


def test_cli_vllm_metrics_per_request_never_falls_back_to_counters(run_config, server_oracle):
    with serve(Engine(server_oracle(), "vllm")) as url:          # answers without per-request metrics
        result = _cli(run_config, "--backend", "vllm", "--url", url, "--vllm-metrics", "per-request")
    assert result.exit_code == 3, result.output
    assert "verdict: INCOMPLETE" in result.output and "--per-request-spec-decode-metrics detailed" in result.output
    assert "counter deltas are not read (--vllm-metrics per-request)" in result.output


def test_tolerance_mode_judges_the_per_request_interval(run_config, checker, server_oracle):
    with serve(Engine(server_oracle(), "vllm")) as url:
        faithful = _check(run_config, checker, url, "vllm", mode="tolerance")
    assert faithful.exit_status == 0 and faithful.report["judgement"]["interval"]["mean"] == 0
    with serve(Engine(server_oracle("embedding_for_lowest"), "vllm")) as url:
        faulty = _check(run_config, checker, url, "vllm", mode="tolerance")
    iv = faulty.report["judgement"]["interval"]
    assert faulty.exit_status == 1 and iv["high"] < -0.05         # wholly below -tolerance
    assert faulty.report["hypotheses"]["explanation"] == "embedding_for_lowest"
    assert "judged      tolerance mode" in render_server_check(faulty.report)


def test_unadjusted_num_draft_tokens_is_a_settings_mismatch(run_config, checker, server_oracle):
    with serve(Engine(server_oracle(), "sglang", fault="draft_tokens_info")) as url:
        result = _check(run_config, checker, url, "sglang")
    row = next(s for s in result.report["server"]["settings_check"] if s["setting"] == "speculative_num_draft_tokens")
    assert row["ok"] is False and row["server"] == 8 and row["oracle"] == NUM_STEPS + 1
    assert "not adjusted" in row["note"]
    assert result.exit_status == 1 and result.report["acceptance"]["within_tolerance"] is True
    assert any("speculative_num_draft_tokens" in reason for reason in result.report["reasons"])


def test_topk1_adjustment_is_expected(run_config, server_oracle):
    asked = run_config.with_(num_draft_tokens=8)             # SGLang turns this into num_steps + 1
    with pytest.warns(UserWarning, match="adjusted"):
        oracle = api.load_oracle(asked)
    with serve(Engine(server_oracle(), "sglang")) as url:
        result = _check(asked, oracle, url, "sglang")
    row = next(s for s in result.report["server"]["settings_check"] if s["setting"] == "speculative_num_draft_tokens")
    assert row["ok"] is True and "adjustment applied (asked 8, used 4)" in row["note"]
    assert result.exit_status == 0


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_non_greedy_output_is_reported_with_the_margin(run_config, checker, server_oracle, backend):
    with serve(Engine(server_oracle(), backend, fault="non_greedy")) as url:
        result = _check(run_config, checker, url, backend)
    r = result.report
    assert result.exit_status == 1 and r["tokens"]["mismatch"] == NUM_PROMPTS
    d = r["divergences"][0]
    assert d["kind"] == "mismatch" and d["position"] == 3 and d["server_token"] != d["oracle_token"]
    assert d["margin"] > 1.0 and d["margin"] == pytest.approx(d["logit_oracle"] - d["logit_server"])
    assert r["acceptance"]["requests_compared"] == 0                # a different workload is not compared
    assert "differ from the oracle's greedy output" in r["reasons"][0]


def test_missing_spec_verify_ct_is_incomplete(run_config, checker, server_oracle):
    with serve(Engine(server_oracle(), "sglang", fault="no_verify_ct")) as url:
        result = _check(run_config, checker, url, "sglang")
    assert result.exit_status == 3 and result.report["verdict"] == "incomplete"
    assert result.report["tokens"]["equal"] == NUM_PROMPTS
    assert "spec_verify_ct" in result.report["reasons"][0]
    assert any("speculative decoding is off" in w for w in result.report["warnings"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend, fault, message", [
    ("sglang", "http_500", "/generate answered HTTP 500: {\"error\": \"CUDA error"),
    ("sglang", "malformed_json", "/generate answered with a body that is not JSON: <html>502 Bad Gateway"),
    ("sglang", "slow", "/generate: connected, but the answer was not complete within 0.5 s (no byte of the answer yet; "
                       "--timeout 0.5 s a request"),
    ("vllm", "http_500", "/v1/completions answered HTTP 500"),
    ("vllm", "malformed_json", "/v1/completions answered with a body that is not JSON"),
    ("vllm", "slow", "/v1/completions: connected, but the answer was not complete within 0.5 s (no byte of the "
                     "answer yet; --timeout 0.5 s a request"),
])
def test_transport_errors_are_one_clear_line(run_config, checker, server_oracle, backend, fault, message):
    with serve(Engine(server_oracle(), backend, fault=fault)) as url:
        with pytest.raises(ServerError) as info:
            _check(run_config, checker, url, backend, timeout=0.5)
    text = str(info.value)
    assert message in text and url in text and "\n" not in text


def test_cli_refused_connection_exits_2_with_one_line(run_config):
    """Checked before the target is loaded; the CLI prints USER_ERRORS as one line, exit status 2."""
    url = f"http://127.0.0.1:{_free_port()}"
    result = _cli(run_config, "--backend", "sglang", "--url", url)
    assert result.exit_code == 2
    assert re.fullmatch(rf"eagle-eval: error: cannot connect to {url}/get_server_info \(\[Errno 111\] Connection "
                        r"refused; 3 attempts in [\d.]+ s; --retries 2, --timeout 300 s a request, --retry-budget 60 s "
                        r"for its attempts\): is the server running at --url\?", result.stderr.strip()), result.stderr
    assert "Loading weights" not in result.stderr          # failed before loading the target


def test_cli_report_and_sglang_log(run_config, server_oracle, tmp_path):
    log = tmp_path / "sglang.log"
    # earlier traffic in the same log must not count: only lines appended during the check do
    log.write_text("[2026-05-01 09:00:00] Decode batch, #running-req: 9, #token: 1, token usage: 0.00, "
                   "accept len: 1.00, accept rate: 0.00, cuda graph: True, gen throughput (token/s): 1.00, \n")
    out = tmp_path / "out"
    with serve(Engine(server_oracle(), "sglang", log_path=log, log_interval=10)) as url:
        result = _cli(run_config, "--backend", "sglang", "--url", url, "--sglang-log", str(log),
                      "--output-dir", str(out))
    assert result.exit_code == 0, result.output
    assert "verdict: AGREE" in result.output and "server_check.json" in result.output
    report = json.loads((out / "server_check.json").read_text())
    for key in ("schema_version", "config", "summary", "per_position", "histogram", "provenance",   # run's shape
                "server", "tokens", "acceptance", "requests", "divergences", "hypotheses", "sglang_log", "verdict"):
        assert key in report, key
    assert report["config"]["aux_layers"]["hf"] == list(AUX_HF) and report["exit_status"] == 0
    lg = report["sglang_log"]
    assert lg["lines"] >= 2 and lg["within_tolerance"] is True and lg["read_from_byte"] > 0
    assert lg["accept_rate_definition"] == "(accept len - 1) / (num_draft_tokens - 1)"
    assert len(report["requests"]) == NUM_PROMPTS and report["requests"][0]["server"]["reported"]["spec_verify_ct"]


def test_sglang_log_alone_catches_a_faulty_server(run_config, checker, server_oracle, tmp_path):
    log = tmp_path / "sglang.log"
    log.touch()
    with serve(Engine(server_oracle("aux_hf_minus_1"), "sglang", log_path=log, log_interval=10)) as url:
        _check(run_config, checker, url, "sglang", hypotheses=False)      # the workload, as a user would run it
    result = run_server_check(run_config, ServerCheckOptions(backend="sglang", sglang_log=str(log)), oracle=checker)
    lg = result.report["sglang_log"]
    assert result.exit_status == 1 and lg["within_tolerance"] is False
    assert lg["server_accept_length"] < 0.75 * lg["oracle_accept_length"]
    assert result.report["acceptance"] is None and "SGLang log" in result.report["reasons"][0]
