"""SGLang's wire format for server-check (no torch).

Formats handled (read in the public sources; field names only, no code copied):

SGLang (sgl-project/sglang)
- `POST /generate` with `{"input_ids": [...], "sampling_params": {"temperature": 0, "max_new_tokens": n}}`
  (`managers/io_struct.py` GenerateReqInput). The answer is `{"text", "output_ids", "meta_info"}`
  (`managers/tokenizer_manager.py` `_handle_batch_output`); `meta_info.completion_tokens` always.
- speculative fields in `meta_info` (`tokenizer_manager.py` `_calculate_spec_decoding_metrics`):
  `spec_verify_ct` in every version with speculative decoding on; 2025 versions add
  `spec_accept_length` (= completion_tokens / spec_verify_ct), `spec_accept_rate`,
  `spec_accept_token_num`, `spec_draft_token_num` and `spec_accept_histogram` (index n = verify
  steps that accepted exactly n drafts, `schedule_batch.py` `update_spec_acceptance_histogram`);
  2026 versions rename the counts to `spec_accepted_drafts` / `spec_proposed_drafts`.
  Without `output_ids`, `meta_info.output_token_logprobs` ([logprob, token id, text] rows) is used.
- `GET /get_server_info` (newer builds also `/server_info`): the flattened ServerArgs
  (`speculative_algorithm`, `speculative_num_steps`, `speculative_eagle_topk`,
  `speculative_num_draft_tokens`, `speculative_draft_model_path`) and `avg_spec_accept_length`, at
  the top level in older builds and in `internal_states[0]` in newer ones.
"""

from __future__ import annotations

from eagle_eval.servers.http import Http, ServerError, ServerReply, int_list

SGLANG_SETTINGS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                   "speculative_num_draft_tokens", "speculative_draft_model_path", "model_path", "version")


def parse_sglang_generate(body, url: str) -> ServerReply:
    """An SGLang /generate answer -> ServerReply (see the module docstring for the versions)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict):
        raise ServerError(f"{url}: the JSON answer has no 'meta_info' object (is this SGLang's /generate?)")
    notes = []
    ids = int_list(body.get("output_ids"))
    if ids is None:
        rows = meta.get("output_token_logprobs")
        if isinstance(rows, list) and all(isinstance(r, (list, tuple)) and len(r) >= 2 for r in rows):
            ids = int_list([r[1] for r in rows])
    if ids is None:
        notes.append("the answer has no 'output_ids' (nor meta_info.output_token_logprobs): "
                     "output tokens are not compared")
    completion = meta.get("completion_tokens")
    completion = completion if isinstance(completion, int) else (len(ids) if ids is not None else None)
    verify = meta.get("spec_verify_ct")
    if not isinstance(verify, int):
        verify = None
        notes.append("meta_info has no 'spec_verify_ct': speculative decoding is off on this server (or the "
                     "build does not report it), so its acceptance cannot be compared")
    elif verify == 0 and (completion or 0) > 1:
        notes.append("meta_info.spec_verify_ct is 0 for a request that produced several tokens: "
                     "speculative decoding is not active on this server")
        verify = None
    accepted = next((meta[k] for k in ("spec_accepted_drafts", "spec_num_correct_drafts", "spec_accept_token_num")
                     if isinstance(meta.get(k), int)), None)
    proposed = next((meta[k] for k in ("spec_proposed_drafts", "spec_num_proposed_drafts", "spec_draft_token_num")
                     if isinstance(meta.get(k), int)), None)
    length = meta.get("spec_accept_length")
    hist = int_list(meta.get("spec_accept_histogram") or meta.get("spec_correct_drafts_histogram"))
    raw = {k: v for k, v in meta.items() if k.startswith("spec_") or k == "completion_tokens"}
    return ServerReply(output_ids=ids, completion_tokens=completion, verify_count=verify,
                       accepted_drafts=accepted, draft_tokens=proposed,
                       accept_length=float(length) if isinstance(length, (int, float)) else None,
                       histogram=hist, notes=notes, raw=raw)


def sglang_settings(info: dict) -> dict:
    """The speculative settings of a /get_server_info answer (None where absent)."""
    out = {k: info.get(k) for k in SGLANG_SETTINGS}
    states = info.get("internal_states")
    avg = info.get("avg_spec_accept_length")
    if avg is None and isinstance(states, list) and states and isinstance(states[0], dict):
        avg = states[0].get("avg_spec_accept_length")
    out["avg_spec_accept_length"] = avg
    return out


class SGLangClient:
    backend = "sglang"

    def __init__(self, http: Http):
        self.http = http

    def settings(self) -> tuple[dict | None, str | None]:
        """(settings, note): /get_server_info, else /server_info; (None, why) when neither answers."""
        for path in ("/get_server_info", "/server_info"):
            try:
                info = self.http.json("GET", path)
            except ServerError as exc:
                if " answered HTTP 404" in str(exc):
                    continue
                raise
            if not isinstance(info, dict):
                raise ServerError(f"{self.http.base + path}: expected a JSON object")
            return sglang_settings(info), None
        return None, "the server has neither /get_server_info nor /server_info: its settings are not compared"

    def generate(self, input_ids: list[int], max_new_tokens: int) -> ServerReply:
        body = {"input_ids": list(input_ids),
                "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens}}
        return parse_sglang_generate(self.http.json("POST", "/generate", json=body), self.http.base + "/generate")
