"""vLLM's wire format for server-check (no torch).

Formats handled (read in the public sources; field names only, no code copied):

vLLM (vllm-project/vllm, V1 engine)
- `POST /v1/completions` with a token-id prompt `{"prompt": [ids], "max_tokens": n, "temperature": 0}`;
  output ids from `choices[0].token_ids` when `return_token_ids` is set (`entrypoints/openai/protocol.py`
  CompletionResponseChoice, 2025 versions), else from `logprobs.tokens` written as `token_id:N` with
  `return_tokens_as_token_ids`.
- `GET /metrics`: Prometheus counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
  `..._num_accepted_tokens` and `..._num_accepted_tokens_per_pos{position="0".."k-1"}`
  (`v1/spec_decode/metrics.py` SpecDecodingProm; exposed with the `_total` suffix by prometheus_client),
  summed over the `engine` label. Per request = the difference of two reads around it: server-wide, so
  only valid one request at a time with no other traffic on the server.
- Per-request metrics (vLLM 0.32 read; marked experimental there), offered when the server runs with
  `--per-request-spec-decode-metrics summary|detailed` (`config/observability.py`
  ObservabilityConfig.per_request_spec_decode_metrics; `engine/arg_utils.py`): the response's top-level
  `metrics.speculative_decoding` (`entrypoints/openai/completion/serving.py` sets
  CompletionResponse.metrics for a single prompt with n == 1; the model is SpeculativeDecodingMetrics in
  `entrypoints/generate/base/protocol.py`, filled by RequestSpecDecodeMetrics.to_dict in
  `v1/metrics/stats.py`, observed by `v1/core/sched/scheduler.py` in the same place as the Prometheus
  counters): `num_spec_tokens` (k), `acceptance_histogram` [k+1] (index j = verify steps that accepted
  exactly j drafts), `num_spec_steps`, `num_accepted_draft_tokens`, `num_draft_tokens`, and at the
  `detailed` level `per_step_accepted` / `per_step_drafted`, one entry per verify step in order (left
  out when empty, i.e. a request without a verify step). Independent of `--disable-log-stats`.

Which source a reply's counts come from is `ServerReply.source`: `SOURCE_DETAILED`, `SOURCE_SUMMARY`
or `SOURCE_COUNTERS`; the client's `metrics_source` chooses (`METRICS_SOURCES`): `auto` (per-request
metrics when the answer carries them, else counter deltas), `per-request` (never counter deltas: a
shared server), `counters` (always counter deltas; the per-request metrics, when present, are kept in
`raw` and compared with them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from eagle_eval.servers.engine import Engine, setting_row
from eagle_eval.servers.http import Http, ServerError, ServerReply, int_list, snippet

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SOURCE_DETAILED = "per-request metrics (detailed)"
SOURCE_SUMMARY = "per-request metrics (summary)"
SOURCE_COUNTERS = "counter deltas"
METRICS_SOURCES = ("auto", "per-request", "counters")
SERVE_FLAG = "--per-request-spec-decode-metrics detailed"


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative counters at one instant, summed over engines (None = not exposed)."""
    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    per_position: tuple[float, ...]      # index i = position label i (0-based draft position)

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        def d(a, b):
            return None if a is None or b is None else a - b
        n = max(len(self.per_position), len(before.per_position))
        pad = lambda t: tuple(t) + (0.0,) * (n - len(t))  # noqa: E731
        return SpecCounters(d(self.drafts, before.drafts), d(self.draft_tokens, before.draft_tokens),
                            d(self.accepted, before.accepted),
                            tuple(a - b for a, b in zip(pad(self.per_position), pad(before.per_position))))


def parse_vllm_metrics(text: str, url: str = "/metrics") -> SpecCounters:
    """Prometheus text -> SpecCounters, with prometheus_client's parser; `_total` suffix optional.

    >>> t = ('vllm:spec_decode_num_drafts_total{engine="0"} 4.0\\n'
    ...      'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 2.0\\n')
    >>> c = parse_vllm_metrics(t)
    >>> c.drafts, c.accepted, c.per_position
    (4.0, None, (0.0, 2.0))
    """
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.endswith(("_created", "_bucket", "_count", "_sum")):
                    continue
                name = s.name[:-len("_total")] if s.name.endswith("_total") else s.name
                if name == VLLM_PER_POS:
                    pos = int(s.labels.get("position", -1))
                    if pos < 0:
                        raise ValueError(f"{s.name} sample without a 'position' label")
                    per_pos[pos] = per_pos.get(pos, 0.0) + s.value
                elif name in (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED):
                    sums[name] = sums.get(name, 0.0) + s.value
    except ValueError as exc:
        raise ServerError(f"{url}: not Prometheus text ({snippet(exc)})") from None
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(sums.get(VLLM_DRAFTS), sums.get(VLLM_DRAFT_TOKENS), sums.get(VLLM_ACCEPTED), positions)


def parse_vllm_completion(body, url: str) -> tuple[list[int] | None, int | None]:
    """A /v1/completions answer -> (output ids or None, usage.completion_tokens or None)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerError(f"{url}: the JSON answer has no 'choices' list (is this vLLM's /v1/completions?)")
    choice = choices[0]
    ids = int_list(choice.get("token_ids"))
    if ids is None:
        tokens = (choice.get("logprobs") or {}).get("tokens")
        if isinstance(tokens, list) and tokens and all(isinstance(t, str) and t.startswith("token_id:")
                                                       for t in tokens):
            ids = [int(t.split(":", 1)[1]) for t in tokens]
    usage = body.get("usage") or {}
    completion = usage.get("completion_tokens")
    return ids, completion if isinstance(completion, int) else (len(ids) if ids is not None else None)


@dataclass(frozen=True)
class RequestSpecMetrics:
    """One answer's `metrics.speculative_decoding`, checked for consistency (see the module docstring)."""
    num_spec_tokens: int                        # k, vLLM's num_speculative_tokens
    histogram: tuple[int, ...]                  # [k+1]: index j = verify steps that accepted exactly j drafts
    num_spec_steps: int
    accepted_drafts: int                        # num_accepted_draft_tokens, bonus not counted
    draft_tokens: int                           # num_draft_tokens (proposed)
    per_step_accepted: tuple[int, ...] | None   # [num_spec_steps], in order; None at the summary level
    per_step_drafted: tuple[int, ...] | None

    @property
    def level(self) -> str:
        return "summary" if self.per_step_accepted is None else "detailed"

    @property
    def accepted_per_position(self) -> list[int]:
        """[k]: verify steps that accepted at least i+1 drafts (the Prometheus ..._per_pos position i),
        counted from the per-step sequence when there is one, else from the histogram."""
        if self.per_step_accepted is not None:
            return [sum(1 for a in self.per_step_accepted if a > i) for i in range(self.num_spec_tokens)]
        return [sum(self.histogram[i + 1:]) for i in range(self.num_spec_tokens)]


def parse_vllm_spec_metrics(body, url: str) -> RequestSpecMetrics | None:
    """A /v1/completions answer -> its per-request speculative metrics, or None when it carries none.

    A request without a verify step carries no per-step arrays at either level (vLLM leaves empty ones
    out); its per-step sequence is then the empty one. Fields that contradict each other are a
    ServerError: the counts could not be trusted.

    >>> m = parse_vllm_spec_metrics({"metrics": {"speculative_decoding": {"num_spec_tokens": 2,
    ...     "acceptance_histogram": [1, 0, 2], "num_spec_steps": 3, "num_accepted_draft_tokens": 4,
    ...     "num_draft_tokens": 6, "per_step_accepted": [2, 0, 2], "per_step_drafted": [2, 2, 2]}}}, "u")
    >>> m.level, m.accepted_per_position, m.per_step_accepted
    ('detailed', [2, 2], (2, 0, 2))
    """
    metrics = body.get("metrics") if isinstance(body, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec is None:
        return None

    def bad(why: str):
        return ServerError(f"{url}: metrics.speculative_decoding {why} (vLLM's per-request metrics, experimental: "
                           "another shape than vLLM 0.32's?)")
    if not isinstance(spec, dict):
        raise bad("is not an object")
    ints = {}
    for key in ("num_spec_tokens", "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens"):
        value = spec.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(f"has no count {key} (got {snippet(value)})")
        ints[key] = value
    k, steps = ints["num_spec_tokens"], ints["num_spec_steps"]
    hist = int_list(spec.get("acceptance_histogram"))
    if hist is None or len(hist) != k + 1 or min(hist) < 0:
        raise bad(f"acceptance_histogram is not {k + 1} counts (got {snippet(spec.get('acceptance_histogram'))})")
    if sum(hist) != steps or sum(j * h for j, h in enumerate(hist)) != ints["num_accepted_draft_tokens"]:
        raise bad(f"acceptance_histogram {hist} does not sum to num_spec_steps {steps} and "
                  f"num_accepted_draft_tokens {ints['num_accepted_draft_tokens']}")
    accepted, drafted = spec.get("per_step_accepted"), spec.get("per_step_drafted")
    if accepted is None and drafted is None:
        accepted = drafted = [] if steps == 0 else None
    if accepted is not None:
        accepted, drafted = int_list(accepted), int_list(drafted)
        if accepted is None or drafted is None or len(accepted) != steps or len(drafted) != steps:
            raise bad(f"per_step_accepted / per_step_drafted are not {steps} counts each")
        if [accepted.count(j) for j in range(k + 1)] != hist or \
                any(not 0 <= a <= d for a, d in zip(accepted, drafted)) or sum(drafted) != ints["num_draft_tokens"]:
            raise bad(f"per_step_accepted {snippet(accepted)} / per_step_drafted {snippet(drafted)} contradict "
                      f"acceptance_histogram {hist} or num_draft_tokens {ints['num_draft_tokens']}")
    return RequestSpecMetrics(k, tuple(hist), steps, ints["num_accepted_draft_tokens"], ints["num_draft_tokens"],
                              None if accepted is None else tuple(accepted),
                              None if drafted is None else tuple(drafted))


def reply_counts(spec: RequestSpecMetrics) -> dict:
    """ServerReply's count fields from per-request metrics."""
    return {"verify_count": spec.num_spec_steps, "accepted_drafts": spec.accepted_drafts,
            "draft_tokens": spec.draft_tokens, "histogram": list(spec.histogram),
            "accepted_per_position": spec.accepted_per_position,
            "accepted_per_cycle": None if spec.per_step_accepted is None else list(spec.per_step_accepted),
            "source": SOURCE_DETAILED if spec.level == "detailed" else SOURCE_SUMMARY}


def delta_counts(delta: SpecCounters) -> dict:
    """ServerReply's count fields from counter deltas (no histogram, no per-step sequence)."""
    as_int = lambda x: None if x is None else int(round(x))  # noqa: E731
    return {"verify_count": as_int(delta.drafts), "accepted_drafts": as_int(delta.accepted),
            "draft_tokens": as_int(delta.draft_tokens),
            "accepted_per_position": [int(round(x)) for x in delta.per_position] or None,
            "source": SOURCE_COUNTERS}


def sources_differ(deltas: dict, spec: RequestSpecMetrics) -> list[str]:
    """The counts on which counter deltas and per-request metrics of one request differ (names)."""
    mine = reply_counts(spec)
    out = [key for key in ("verify_count", "accepted_drafts", "draft_tokens") if deltas[key] != mine[key]]
    n = max(len(deltas["accepted_per_position"] or []), spec.num_spec_tokens)
    pad = lambda x: list(x or []) + [0] * (n - len(x or []))  # noqa: E731
    if pad(deltas["accepted_per_position"]) != pad(mine["accepted_per_position"]):
        out.append("accepted_per_position")
    return out


class VLLMClient:
    backend = "vllm"

    def __init__(self, http: Http, model: str | None = None, settle: float = 0.2, metrics_source: str = "auto"):
        if metrics_source not in METRICS_SOURCES:
            raise ValueError(f"metrics_source must be one of {METRICS_SOURCES}, got {metrics_source!r}")
        self.http, self._model, self.settle, self.metrics_source = http, model, settle, metrics_source
        self._per_request_seen = False     # auto: once an answer carried them, /metrics is no longer read

    def model(self) -> str:
        if self._model is None:
            data = self.http.json("GET", "/v1/models").get("data") or []
            if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                raise ServerError(f"{self.http.base}/v1/models lists no model: pass --served-model-name")
            self._model = data[0]["id"]
        return self._model

    def counters(self) -> SpecCounters:
        url = self.http.base + "/metrics"
        return parse_vllm_metrics(self.http.request("GET", "/metrics").text, url)

    def settled_counters(self, tries: int = 10) -> SpecCounters:
        """vLLM records a step's stats after the answer may have gone out: read until two reads agree (at most
        `tries` more reads, `settle` s apart; a wait past HEARTBEAT_S is said on the Http's heartbeat)."""
        from eagle_eval.servers.http import HEARTBEAT_S

        start = time.monotonic()
        beat, say = start + HEARTBEAT_S, getattr(self.http, "heartbeat", None)
        last = self.counters()
        for i in range(tries):
            if self.settle <= 0:
                return last
            time.sleep(self.settle)
            if say is not None and time.monotonic() >= beat:
                say(f"{self.http.base}/metrics: {time.monotonic() - start:.0f} s reading until two reads agree "
                    f"({i + 1} reads so far, at most {tries + 1}, --metrics-settle {self.settle:g} s apart)")
                beat = time.monotonic() + HEARTBEAT_S
            now = self.counters()
            if now == last:
                return now
            last = now
        return last

    def settings(self) -> tuple[dict | None, str | None]:
        c = self.counters()
        if c.drafts is None:
            return None, (f"{self.http.base}/metrics has no {VLLM_DRAFTS} counter: speculative decoding is off, "
                          "or this is a vLLM without the V1 spec-decode metrics")
        return {"num_speculative_tokens": len(c.per_position) or None}, None

    def generate(self, input_ids: list[int], max_new_tokens: int, sampling: dict | None = None) -> ServerReply:
        """One request; its acceptance from the answer's per-request metrics or from counter deltas
        (`metrics_source`, see the module docstring), the source named in the reply. sampling: {temperature,
        top_p, top_k, min_p, seed} of the request (None: temperature 0), as vLLM's SamplingParams name them
        (`top_k` 0 = off; vllm/sampling_params.py)."""
        url = self.http.base + "/v1/completions"
        body = {"model": self.model(), "prompt": list(input_ids), "max_tokens": max_new_tokens,
                "temperature": 0.0, "return_token_ids": True, "logprobs": 0, "return_tokens_as_token_ids": True,
                **(sampling or {})}
        read_counters = self.metrics_source == "counters" or (self.metrics_source == "auto"
                                                              and not self._per_request_seen)
        before = self.counters() if read_counters else None     # the previous request's read already settled
        answer = self.http.json("POST", "/v1/completions", json=body)
        ids, completion = parse_vllm_completion(answer, url)
        spec = parse_vllm_spec_metrics(answer, url)
        notes = [] if ids is not None else [
            "the answer has neither choices[0].token_ids nor token-id logprobs: output tokens are not compared"]
        raw = {} if spec is None else {"per_request_metrics": answer["metrics"]["speculative_decoding"]}
        if spec is not None and self.metrics_source != "counters":
            self._per_request_seen = True
            if spec.level == "summary":
                notes.append(f"vLLM's per-request metrics are at the summary level: no per-step sequence to compare "
                             f"verify step by verify step (start vLLM with {SERVE_FLAG})")
            return ServerReply(output_ids=ids, completion_tokens=completion, notes=notes, raw=raw,
                               **reply_counts(spec))
        if before is None:
            notes.append(f"the answer carries no metrics.speculative_decoding (start vLLM with {SERVE_FLAG}), and "
                         f"counter deltas are not read (--vllm-metrics {self.metrics_source}): acceptance cannot be "
                         "compared")
            return ServerReply(output_ids=ids, completion_tokens=completion, notes=notes, raw=raw)
        delta = self.settled_counters().minus(before)
        counts = delta_counts(delta)
        if delta.drafts is None or delta.accepted is None:
            notes.append(f"/metrics has no {VLLM_DRAFTS} / {VLLM_ACCEPTED}: acceptance cannot be compared")
            counts["source"] = None
        elif spec is None:
            notes.append(f"acceptance from counter deltas of the server-wide /metrics (the answers carry no "
                         f"per-request metrics; start vLLM with {SERVE_FLAG} for them): valid only with no other "
                         "traffic on the server")
        raw["counter_deltas"] = {"num_drafts": delta.drafts, "num_draft_tokens": delta.draft_tokens,
                                 "num_accepted_tokens": delta.accepted,
                                 "num_accepted_tokens_per_pos": list(delta.per_position)}
        if spec is not None and counts["source"] is not None:
            differ = sources_differ(counts, spec)
            raw["sources_differ"] = differ
            if differ:
                notes.append(f"counter deltas differ from the answer's own per-request metrics on {', '.join(differ)}: "
                             "other traffic on the server while the request ran?")
        return ServerReply(output_ids=ids, completion_tokens=completion, notes=notes, raw=raw, **counts)


# -- the server's settings against the oracle's -----------------------------------------------------

def compare_vllm_settings(settings: dict, resolved: dict) -> list[dict]:
    k = settings.get("num_speculative_tokens")
    note = "not reported" if k is None else "the position labels of vllm:spec_decode_num_accepted_tokens_per_pos"
    block = resolved.head.extra.get("block")
    if block is not None and k is not None and k != block["vllm_num_speculative_tokens"]:
        note += (f"; method dflash drafts blocks of 1 + K = {k + 1} rows, the draft was trained with block_size "
                 f"{block['block_size']} (K = {block['vllm_num_speculative_tokens']})")
    return [setting_row("num_speculative_tokens", k, resolved.num_steps, None if k is None else k == resolved.num_steps,
                        note)]


def _figure_counts(completion_tokens, verify_count, accepted_drafts) -> tuple[int, int] | None:
    """vLLM's mean acceptance length = 1 + accepted drafts / drafts.

    >>> _figure_counts(12, 4, 7)
    (11, 4)
    """
    return (verify_count + accepted_drafts, verify_count) if verify_count and accepted_drafts is not None else None


def _nested_ids_taps(resolved) -> list[tuple]:
    """The server may have been given a config with only the nested key, which vLLM's V1 runner reads raw (an
    EAGLE-3 config's key: a block drafter's target_layer_ids are read + 1 by every runner)."""
    if resolved.head.extra.get("block") is not None:
        return []
    hf = list(resolved.aux.hf)
    return [("vllm_v1_reads_nested_ids", f"vLLM's V1 runner reading SGLang-style nested ids {[i - 1 for i in hf]} "
             "unchanged as vLLM-style (input-of-layer) ids, one layer low (a served config with only "
             "eagle_config.eagle_aux_hidden_state_layer_ids)", [i - 1 for i in hf])]


ENGINE = Engine(
    name="vllm", figure="accept_length",
    figure_definition="1 + accepted drafts / drafts (vLLM mean acceptance length, bonus counted), from each "
                      "answer's metrics.speculative_decoding (num_spec_steps, num_accepted_draft_tokens) when the "
                      "server offers per-request metrics, else from the deltas of vllm:spec_decode_num_drafts and "
                      "..._num_accepted_tokens around each request (see each request's server.source); aggregate "
                      "from the summed counts",
    figure_counts=_figure_counts,
    make_client=lambda http, o: VLLMClient(http, o.served_model_name, o.metrics_settle, o.vllm_metrics),
    compare_settings=lambda settings, resolved, draft_path: compare_vllm_settings(settings, resolved),
    num_steps_setting="num_speculative_tokens",
    taps={"vllm_v1": "vllm_v1_reads_config", "vllm_v2": "vllm_v2_reads_config"},
    extra_taps=_nested_ids_taps, options=("served_model_name", "metrics_settle", "vllm_metrics"))
