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
  summed over the `engine` label. Per request = the difference of two reads around it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from eagle_eval.servers.http import Http, ServerError, ServerReply, int_list, snippet

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


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


class VLLMClient:
    backend = "vllm"

    def __init__(self, http: Http, model: str | None = None, settle: float = 0.2):
        self.http, self._model, self.settle = http, model, settle

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
        """vLLM records a step's stats after the answer may have gone out: read until two reads agree."""
        last = self.counters()
        for _ in range(tries):
            if self.settle <= 0:
                return last
            time.sleep(self.settle)
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

    def generate(self, input_ids: list[int], max_new_tokens: int) -> ServerReply:
        url = self.http.base + "/v1/completions"
        body = {"model": self.model(), "prompt": list(input_ids), "max_tokens": max_new_tokens,
                "temperature": 0.0, "return_token_ids": True, "logprobs": 0, "return_tokens_as_token_ids": True}
        before = self.counters()          # the previous request's read already settled
        ids, completion = parse_vllm_completion(self.http.json("POST", "/v1/completions", json=body), url)
        delta = self.settled_counters().minus(before)
        notes = []
        if ids is None:
            notes.append("the answer has neither choices[0].token_ids nor token-id logprobs: output tokens "
                         "are not compared")
        if delta.drafts is None or delta.accepted is None:
            notes.append(f"/metrics has no {VLLM_DRAFTS} / {VLLM_ACCEPTED}: acceptance cannot be compared")
        as_int = lambda x: None if x is None else int(round(x))  # noqa: E731
        return ServerReply(output_ids=ids, completion_tokens=completion, verify_count=as_int(delta.drafts),
                           accepted_drafts=as_int(delta.accepted), draft_tokens=as_int(delta.draft_tokens),
                           accepted_per_position=[int(round(x)) for x in delta.per_position] or None,
                           notes=notes, raw={"counter_deltas": {"num_drafts": delta.drafts,
                                                                "num_draft_tokens": delta.draft_tokens,
                                                                "num_accepted_tokens": delta.accepted,
                                                                "num_accepted_tokens_per_pos":
                                                                    list(delta.per_position)}})
