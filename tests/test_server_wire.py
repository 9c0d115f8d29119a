"""Wire formats, settings, log lines and hypotheses without a model or a server."""

from types import SimpleNamespace

import pytest

from eagle_eval.settings import ConfigError
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.servers.sglang import accept_rate_definition, compare_sglang_settings, parse_sglang_log
from eagle_eval.servers.http import ServerError
from eagle_eval.servers.hypotheses import candidate_hypotheses
from eagle_eval.servers.sglang import parse_sglang_generate, sglang_settings
from eagle_eval.servers.vllm import parse_vllm_completion, parse_vllm_metrics

URL = "http://127.0.0.1:1/generate"


def test_sglang_generate_2026_fields():
    reply = parse_sglang_generate({"text": "", "output_ids": [5, 6, 7, 8], "meta_info": {
        "completion_tokens": 4, "spec_verify_ct": 2, "spec_accept_length": 2.0, "spec_accepted_drafts": 2,
        "spec_proposed_drafts": 6, "spec_accept_histogram": [1, 0, 1]}}, URL)
    assert reply.output_ids == [5, 6, 7, 8] and reply.verify_count == 2 and reply.accepted_drafts == 2
    assert reply.histogram == [1, 0, 1] and reply.accept_length == 2.0 and reply.notes == []


def test_sglang_generate_2025_fields_and_logprob_ids():
    reply = parse_sglang_generate({"text": "", "meta_info": {
        "completion_tokens": 2, "spec_verify_ct": 1, "spec_accept_token_num": 1, "spec_draft_token_num": 3,
        "output_token_logprobs": [[-0.1, 11, None], [-0.2, 12, None]]}}, URL)
    assert reply.output_ids == [11, 12] and reply.accepted_drafts == 1 and reply.draft_tokens == 3


def test_sglang_without_spec_fields_degrades_with_a_reason():
    reply = parse_sglang_generate({"text": "x", "meta_info": {"completion_tokens": 3}}, URL)
    assert reply.output_ids is None and reply.verify_count is None
    assert any("no 'output_ids'" in n for n in reply.notes)
    assert any("no 'spec_verify_ct'" in n and "cannot be compared" in n for n in reply.notes)
    zero = parse_sglang_generate({"output_ids": [1, 2], "meta_info": {"completion_tokens": 2, "spec_verify_ct": 0}},
                                 URL)
    assert zero.verify_count is None and "not active" in zero.notes[0]
    with pytest.raises(ServerError, match="no 'meta_info' object"):
        parse_sglang_generate({"choices": []}, URL)


def test_sglang_server_info_old_and_new_layouts():
    old = sglang_settings({"speculative_num_steps": 3, "avg_spec_accept_length": 2.5})
    new = sglang_settings({"speculative_num_steps": 3, "internal_states": [{"avg_spec_accept_length": 2.7}]})
    assert old["avg_spec_accept_length"] == 2.5 and new["avg_spec_accept_length"] == 2.7
    assert new["speculative_eagle_topk"] is None


def _prometheus_text(engines=(0, 1)):
    """What vLLM's SpecDecodingProm exposes, produced by prometheus_client itself."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    reg = CollectorRegistry()
    drafts = Counter("vllm:spec_decode_num_drafts", "d", ["model_name", "engine"], registry=reg)
    accepted = Counter("vllm:spec_decode_num_accepted_tokens", "a", ["model_name", "engine"], registry=reg)
    per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "p", ["model_name", "engine", "position"],
                      registry=reg)
    for e in engines:
        drafts.labels("m", str(e)).inc(10)
        accepted.labels("m", str(e)).inc(12)
        for pos, n in enumerate([7, 4, 1]):
            per_pos.labels("m", str(e), str(pos)).inc(n)
    return generate_latest(reg).decode()


def test_vllm_metrics_sum_engines_and_ignore_created():
    text = _prometheus_text()
    assert "vllm:spec_decode_num_drafts_total" in text and "_created" in text
    c = parse_vllm_metrics(text)
    assert c.drafts == 20 and c.accepted == 24 and c.draft_tokens is None and c.per_position == (14, 8, 2)
    d = c.minus(parse_vllm_metrics(_prometheus_text(engines=(0,))))
    assert d.drafts == 10 and d.per_position == (7, 4, 1)
    with pytest.raises(ServerError, match="not Prometheus text"):
        parse_vllm_metrics('vllm:spec_decode_num_drafts_total{engine="0" 1\n', "http://h/metrics")


def test_vllm_completion_ids_from_token_ids_or_logprobs():
    assert parse_vllm_completion({"choices": [{"token_ids": [3, 4]}], "usage": {"completion_tokens": 2}}, URL) \
        == ([3, 4], 2)
    ids, n = parse_vllm_completion({"choices": [{"logprobs": {"tokens": ["token_id:9", "token_id:10"]}}]}, URL)
    assert ids == [9, 10] and n == 2
    assert parse_vllm_completion({"choices": [{"text": "hi"}]}, URL) == (None, None)
    with pytest.raises(ServerError, match="no 'choices' list"):
        parse_vllm_completion({"output_ids": []}, URL)


def test_sglang_settings_topk1_adjustment():
    resolved = SimpleNamespace(num_steps=3, topk=1, num_draft_tokens=4, num_draft_tokens_given=8,
                               head=SimpleNamespace(kind="llama", extra={}))       # an EAGLE-3 head
    info = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "speculative_draft_model_path": "/srv/heads/my-head/"}
    rows = {r["setting"]: r for r in compare_sglang_settings(info, resolved, "/local/my-head")}
    assert all(r["ok"] in (True, None) for r in rows.values())
    assert "asked 8, used 4" in rows["speculative_num_draft_tokens"]["note"]
    assert rows["speculative_draft_model_path"]["note"] is None          # same folder name
    bad = {r["setting"]: r for r in compare_sglang_settings({**info, "speculative_num_draft_tokens": 8,
                                                              "speculative_algorithm": None}, resolved, "/x/other")}
    assert bad["speculative_num_draft_tokens"]["ok"] is False
    assert "not adjusted" in bad["speculative_num_draft_tokens"]["note"]
    assert bad["speculative_algorithm"]["ok"] is False and "off" in bad["speculative_algorithm"]["note"]
    assert "folder names differ" in bad["speculative_draft_model_path"]["note"]


def test_sglang_log_lines():
    text = "\n".join([
        "[2026-05-01 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 9, #cached-token: 0, ",
        "[2026-05-01 10:00:01 TP0] Decode batch, #running-req: 1, #token: 40, token usage: 0.01, "
        "accept len: 2.85, accept rate: 0.46, cuda graph: True, gen throughput (token/s): 99.10, #queue-req: 0, ",
        "[2026-05-01 10:00:02] Decode batch, #running-req: 2, #token: 80, token usage: 0.02, accept len: 3.15, "
        "cuda graph: True, gen throughput (token/s): 120.00, #queue-req: 0, ",
    ])
    parsed = parse_sglang_log(text)
    assert parsed == {"lines": 2, "accept_len": [2.85, 3.15], "accept_rate": [0.46], "max_running_req": 2}
    assert accept_rate_definition(2.85, 0.46, 5) == "(accept len - 1) / (num_draft_tokens - 1)"
    assert accept_rate_definition(2.85, 0.57, 5) == "accept len / num_draft_tokens"
    assert accept_rate_definition(2.85, 0.10, 5) is None


def test_hypotheses_for_a_head_with_its_own_table_and_a_server_with_other_steps():
    hyps = {h.name: h for h in candidate_hypotheses((1, 16, 29), 32, embedding="own", has_own_embedding=True,
                                                     server_num_steps=5, num_steps=3)}
    assert list(hyps) == ["as_configured", "aux_hf_minus_1", "aux_hf_plus_1", "embedding_for_lowest",
                          "engine_default_layers", "position_offset", "embedding_table", "server_num_steps"]
    assert hyps["engine_default_layers"].aux_hf == (2, 16, 29) and hyps["embedding_table"].embedding == "target"
    assert hyps["server_num_steps"].num_steps == 5 and hyps["position_offset"].position_offset == 1


@pytest.mark.parametrize("kw, match", [
    (dict(backend="trt"), "--backend"),
    (dict(backend="sglang"), "--url is required"),
    (dict(backend="sglang", url="127.0.0.1:30000"), "http://"),
    (dict(backend="vllm", url="http://h:1", sglang_log="x.log"), "--sglang-log needs --backend sglang"),
    (dict(backend="vllm", url="http://h:1", tolerance=-1), "--tolerance"),
])
def test_check_config_validation(kw, match):
    with pytest.raises(ConfigError, match=match):
        ServerCheckOptions(**kw)


def _stalling_server(behaviour: str):
    """A socket server that sends the headers of an answer, then stalls (or hangs up) in the body."""
    import socket
    import threading
    import time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\": ")
        if behaviour == "stall":
            time.sleep(3)
        conn.close()
        srv.close()
    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}"


@pytest.mark.parametrize("behaviour, said", [("stall", "connected, but the answer was not complete within 1 s"),
                                              ("hang_up", "broke the connection while sending its answer")])
def test_a_body_that_stalls_or_breaks_is_named_as_such_not_cannot_connect(behaviour, said):
    from eagle_eval.servers.http import Http

    url = _stalling_server(behaviour)
    with pytest.raises(ServerError) as err:
        Http(url, timeout=1.0, retries=0).json("POST", "/generate", json={})
    assert said in str(err.value) and "cannot connect" not in str(err.value)
