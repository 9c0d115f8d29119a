"""vLLM's per-request speculative metrics, read from REAL answers (no server started here).

tests/data/vllm_0.32_completion_detailed.json and ..._summary.json were recorded from a real vLLM
0.32 CPU build serving the bundled pair (num_speculative_tokens 5, fp32) with
`--per-request-spec-decode-metrics detailed` / `summary`, by `python scripts/record_vllm_answer.py`:
one request (the first bundled prompt, the body server-check sends), the answer as received, and the
`spec_decode` lines of /metrics read before and after it. The expected counts below were worked out by
hand from the answer's `per_step_accepted` (17 verify steps: 3 accepted nothing, so 14 reached position
0; one accepted exactly 1, so 13 reached position 1; two accepted 2 -> 11; two accepted 3 -> 9; four
accepted all 5 -> 4), and the server's own counters say the same.
"""

import copy
import json
from pathlib import Path

import pytest

from eagle_eval.servers.http import ServerError
from eagle_eval.servers.vllm import (
    SOURCE_COUNTERS,
    SOURCE_DETAILED,
    SOURCE_SUMMARY,
    VLLMClient,
    parse_vllm_metrics,
    parse_vllm_spec_metrics,
)

DATA = Path(__file__).parent / "data"
PER_STEP = [0, 0, 4, 5, 4, 3, 5, 4, 4, 2, 3, 5, 1, 4, 2, 0, 5]     # copied from the recorded answer
PER_POSITION = [14, 13, 11, 9, 4]                                    # by hand, see the module docstring


def recorded(level: str) -> dict:
    return json.loads((DATA / f"vllm_0.32_completion_{level}.json").read_text())


def test_the_recording_is_what_server_check_sends_to_a_flagged_server():
    rec = recorded("detailed")
    command = rec["recorded"]["server_command"]
    assert command[command.index("--per-request-spec-decode-metrics") + 1] == "detailed"
    assert rec["request"]["return_token_ids"] is True and rec["request"]["temperature"] == 0.0
    # where vLLM 0.32 puts them: the answer's top-level metrics.speculative_decoding
    assert set(rec["response"]["metrics"]["speculative_decoding"]) >= {"num_spec_steps", "per_step_accepted"}


def test_detailed_answer_parses_to_per_step_counts():
    spec = parse_vllm_spec_metrics(recorded("detailed")["response"], "u")
    assert spec.level == "detailed" and spec.num_spec_tokens == 5
    assert list(spec.per_step_accepted) == PER_STEP and list(spec.per_step_drafted) == [5] * 17
    assert (spec.num_spec_steps, spec.accepted_drafts, spec.draft_tokens) == (17, 51, 85)
    assert spec.accepted_per_position == PER_POSITION


def test_summary_answer_has_totals_but_no_sequence():
    spec = parse_vllm_spec_metrics(recorded("summary")["response"], "u")
    assert spec.level == "summary" and spec.per_step_accepted is None
    assert (spec.num_spec_steps, spec.accepted_drafts, spec.draft_tokens) == (17, 51, 85)
    assert spec.accepted_per_position == PER_POSITION          # from the histogram


@pytest.mark.parametrize("level", ["detailed", "summary"])
def test_recorded_counter_deltas_agree_with_the_per_request_metrics(level):
    rec = recorded(level)
    delta = parse_vllm_metrics(rec["metrics_after"]).minus(parse_vllm_metrics(rec["metrics_before"]))
    assert (delta.drafts, delta.accepted, delta.draft_tokens) == (17, 51, 85)
    assert list(delta.per_position) == PER_POSITION


def test_answers_without_per_request_metrics():
    body = recorded("detailed")["response"]
    for metrics in (None, {"time_to_first_token_ms": None, "speculative_decoding": None}):
        assert parse_vllm_spec_metrics({**body, "metrics": metrics}, "u") is None
    assert parse_vllm_spec_metrics({k: v for k, v in body.items() if k != "metrics"}, "u") is None


def _spec_edit(**changes) -> dict:
    body = copy.deepcopy(recorded("detailed")["response"])
    body["metrics"]["speculative_decoding"].update(changes)
    return body


@pytest.mark.parametrize("changes, words", [
    (dict(per_step_accepted=PER_STEP[:-1]), "are not 17 counts"),
    (dict(per_step_accepted=PER_STEP[::-1][:16] + [1]), "contradict acceptance_histogram"),
    (dict(acceptance_histogram=[3, 1, 2, 2, 5]), "is not 6 counts"),
    (dict(num_spec_steps=18), "does not sum"),
    (dict(num_draft_tokens=84), "contradict"),
    (dict(num_accepted_draft_tokens="51"), "has no count num_accepted_draft_tokens"),
])
def test_contradictory_metrics_are_a_one_line_server_error(changes, words):
    with pytest.raises(ServerError, match=words) as err:
        parse_vllm_spec_metrics(_spec_edit(**changes), "http://h/v1/completions")
    assert str(err.value).startswith("http://h/v1/completions: ") and "\n" not in str(err.value)


def test_no_verify_step_is_an_empty_sequence_at_either_level():
    """vLLM leaves the per-step arrays out when empty (v1/metrics/stats.py to_dict)."""
    body = _spec_edit(acceptance_histogram=[1, 0, 0, 0, 0, 0], num_spec_steps=1, num_accepted_draft_tokens=0,
                      num_draft_tokens=5, per_step_accepted=[0], per_step_drafted=[5])
    assert parse_vllm_spec_metrics(body, "u").per_step_accepted == (0,)
    body = _spec_edit(acceptance_histogram=[0] * 6, num_spec_steps=0, num_accepted_draft_tokens=0,
                      num_draft_tokens=0, per_step_accepted=None, per_step_drafted=None)
    spec = parse_vllm_spec_metrics(body, "u")
    assert spec.per_step_accepted == () and spec.accepted_per_position == [0] * 5


class ReplayHttp:
    """Answers like the recorded server: /metrics before, then the answer, then /metrics after."""

    def __init__(self, rec: dict):
        self.base, self.rec, self.metrics_reads, self.posts = "http://replay", rec, 0, 0

    def request(self, method, path, **kw):
        assert (method, path) == ("GET", "/metrics")
        self.metrics_reads += 1

        class R:
            text = self.rec["metrics_before" if self.posts == 0 else "metrics_after"]
        return R()

    def json(self, method, path, json=None, **kw):
        assert (method, path) == ("POST", "/v1/completions") and json["prompt"] == self.rec["request"]["prompt"]
        self.posts += 1
        return self.rec["response"]


def _generate(rec, source):
    http = ReplayHttp(rec)
    client = VLLMClient(http, model="bundled-target", settle=0.01, metrics_source=source)
    return client, http, client.generate(rec["request"]["prompt"], rec["request"]["max_tokens"])


def test_client_reads_the_per_request_metrics_and_stops_reading_counters():
    rec = recorded("detailed")
    client, http, reply = _generate(rec, "auto")
    assert reply.source == SOURCE_DETAILED and reply.accepted_per_cycle == PER_STEP
    assert (reply.verify_count, reply.accepted_drafts, reply.draft_tokens) == (17, 51, 85)
    assert reply.accepted_per_position == PER_POSITION and reply.histogram == [3, 1, 2, 2, 5, 4]
    assert reply.output_ids == rec["response"]["choices"][0]["token_ids"] and reply.notes == []
    assert "counter_deltas" not in reply.raw
    reads = http.metrics_reads
    client.generate(rec["request"]["prompt"], rec["request"]["max_tokens"])
    assert http.metrics_reads == reads            # auto: once offered, /metrics is not read around requests


def test_client_summary_level_says_what_is_missing():
    _, _, reply = _generate(recorded("summary"), "auto")
    assert reply.source == SOURCE_SUMMARY and reply.accepted_per_cycle is None
    assert reply.accepted_per_position == PER_POSITION
    assert any("summary level" in n and "--per-request-spec-decode-metrics detailed" in n for n in reply.notes)


def test_client_forced_to_counters_reads_both_and_they_agree():
    _, http, reply = _generate(recorded("detailed"), "counters")
    assert reply.source == SOURCE_COUNTERS and reply.accepted_per_cycle is None and http.metrics_reads >= 3
    assert (reply.verify_count, reply.accepted_drafts, reply.draft_tokens) == (17, 51, 85)
    assert reply.accepted_per_position == PER_POSITION
    assert reply.raw["sources_differ"] == [] and reply.notes == []
    assert reply.raw["per_request_metrics"]["per_step_accepted"] == PER_STEP


def test_counters_that_moved_for_other_traffic_are_named():
    rec = recorded("detailed")
    rec["metrics_after"] = rec["metrics_after"].replace("} 17.0", "} 19.0")      # two more drafts elsewhere
    _, _, reply = _generate(rec, "counters")
    assert reply.verify_count == 19 and reply.raw["sources_differ"] == ["verify_count"]
    assert any("other traffic" in n for n in reply.notes)


def test_fallback_and_refusal_without_per_request_metrics():
    rec = recorded("detailed")
    rec["response"] = {**rec["response"], "metrics": None}
    _, http, reply = _generate(rec, "auto")
    assert reply.source == SOURCE_COUNTERS and reply.verify_count == 17 and reply.accepted_per_cycle is None
    assert any("valid only with no other traffic" in n for n in reply.notes)
    _, http, reply = _generate(rec, "per-request")
    assert http.metrics_reads == 0 and reply.source is None and reply.verify_count is None
    assert any("--per-request-spec-decode-metrics detailed" in n for n in reply.notes)
