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

import re
from pathlib import Path

from eagle_eval.servers.judge import relative_difference
from eagle_eval.servers.engine import Engine, setting_row
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

    def generate(self, input_ids: list[int], max_new_tokens: int, sampling: dict | None = None) -> ServerReply:
        """sampling: {temperature, top_p, top_k, min_p, seed} (None: temperature 0), sent as SGLang's
        sampling_params name them (`top_k` -1 = off, the seed as `sampling_seed`; managers/io_struct.py)."""
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
        if sampling:
            params.update({k: v for k, v in sampling.items() if k not in ("seed", "top_k")},
                          top_k=sampling.get("top_k") or -1)
            if "seed" in sampling:
                params["sampling_seed"] = sampling["seed"]
        body = {"input_ids": list(input_ids), "sampling_params": params}
        return parse_sglang_generate(self.http.json("POST", "/generate", json=body), self.http.base + "/generate")


# -- the server's settings against the oracle's -----------------------------------------------------

def compare_sglang_settings(settings: dict, resolved: dict, draft_path: str) -> list[dict]:
    """/get_server_info against the oracle's resolved settings (ok None = not reported / informative).

    `resolved.num_draft_tokens` already carries SGLang's topk == 1 adjustment (D = S + 1).
    """
    rows = []
    algo = settings.get("speculative_algorithm")
    from eagle_eval.heads.kind import kind

    record = kind(resolved.head.kind)             # the algorithm SGLang runs it as (heads/kind.py sglang_algorithms)
    block = resolved.head.extra.get("block")
    expected = record.sglang_algorithms
    rows.append(setting_row("speculative_algorithm", algo, " or ".join(expected),
                            algo is not None and str(algo).upper() in expected,
                            "speculative decoding is off" if algo is None else None))
    if record.keyword is not None:                # a kind read from the target's checkpoint: drafted from its folder
        draft_path = resolved.target.path
    for key, ours in (("speculative_num_steps", "num_steps"), ("speculative_eagle_topk", "topk")):
        value, oracle = settings.get(key), getattr(resolved, ours)
        note = "not reported" if value is None else None
        if block is not None and key == "speculative_num_steps":
            oracle, note = 1, note or "DFLASH forces 1: its block is speculative_num_draft_tokens"
        rows.append(setting_row(key, value, oracle, None if value is None else value == oracle, note))
    d_server, d_oracle = settings.get("speculative_num_draft_tokens"), resolved.num_draft_tokens
    note = None
    if d_server is None:
        ok, note = None, "not reported"
    else:
        ok = d_server == d_oracle
        given = resolved.num_draft_tokens_given
        topk, steps = settings.get("speculative_eagle_topk"), settings.get("speculative_num_steps")
        if not ok and topk == 1 and steps is not None and d_server != steps + 1:
            note = (f"with speculative_eagle_topk == 1 SGLang sets speculative_num_draft_tokens = "
                    f"speculative_num_steps + 1 = {steps + 1}; this server reports {d_server} (not adjusted)")
        elif ok and given is not None and given != d_oracle:
            note = f"SGLang's topk == 1 adjustment applied (asked {given}, used {d_oracle})"
    if block is not None and not ok and d_server is not None:
        note = (f"DFLASH drafts blocks of speculative_num_draft_tokens = {d_server} rows, the oracle {d_oracle} "
                f"(the draft was trained with block_size {block['block_size']}; SGLang only warns on a mismatch)")
    rows.append(setting_row("speculative_num_draft_tokens", d_server, d_oracle, ok, note))
    path = settings.get("speculative_draft_model_path")
    if path is not None:
        same = Path(str(path).rstrip("/")).name == Path(str(draft_path).rstrip("/")).name
        rows.append(setting_row("speculative_draft_model_path", path, draft_path, None,
                         None if same else "the folder names differ: is the server running the same head?"))
    return rows


# -- SGLang decode log lines ------------------------------------------------------------------------

_DECODE = re.compile(r"Decode batch\b.*?accept len: (?P<len>[0-9.]+)(?:, accept rate: (?P<rate>[0-9.]+))?")
_RUNNING = re.compile(r"#running-req: (\d+)")


def parse_sglang_log(text: str) -> dict:
    """Decode-batch lines of an SGLang server log (`scheduler_metrics_mixin.py` log_decode_stats:
    "Decode batch, #running-req: N, ..., accept len: X.XX, accept rate: Y.YY, ...").

    >>> parse_sglang_log("[x] Decode batch, #running-req: 1, #token: 9, accept len: 2.50, accept rate: 0.50, ")
    {'lines': 1, 'accept_len': [2.5], 'accept_rate': [0.5], 'max_running_req': 1}
    """
    lens, rates, running = [], [], []
    for line in text.splitlines():
        m = _DECODE.search(line)
        if not m:
            continue
        lens.append(float(m.group("len")))
        if m.group("rate") is not None:
            rates.append(float(m.group("rate")))
        r = _RUNNING.search(line)
        if r:
            running.append(int(r.group(1)))
    return {"lines": len(lens), "accept_len": lens, "accept_rate": rates,
            "max_running_req": max(running) if running else None}


def accept_rate_definition(accept_len: float, accept_rate: float, num_draft_tokens: int) -> str | None:
    """Which of SGLang's accept-rate definitions a log line follows (they changed over 2025-2026).

    >>> accept_rate_definition(3.0, 0.67, 4), accept_rate_definition(3.0, 0.75, 4)
    ('(accept len - 1) / (num_draft_tokens - 1)', 'accept len / num_draft_tokens')
    """
    candidates = {"(accept len - 1) / (num_draft_tokens - 1)": (accept_len - 1) / max(num_draft_tokens - 1, 1),
                  "accept len / num_draft_tokens": accept_len / num_draft_tokens}
    name, value = min(candidates.items(), key=lambda kv: abs(kv[1] - accept_rate))
    return name if abs(value - accept_rate) <= 0.011 else None


def compare_sglang_log(parsed: dict, oracle_tau: float | None, num_draft_tokens: int, tolerance: float) -> dict:
    """The log's aggregate accept len (tau, bonus counted, prefill token NOT counted) vs the oracle's tau.

    With one request at a time every window holds decode_log_interval verify steps, so the plain mean
    over lines is the aggregate (the last, unlogged partial window is missing from it).
    """
    out = {"lines": parsed["lines"], "definition": "SGLang log 'accept len' = accepted tokens incl. bonus / "
           "verify steps over a decode_log_interval window (= tau); compared as the mean over lines",
           "oracle_accept_length": oracle_tau, "notes": []}
    if not parsed["lines"]:
        out.update(server_accept_length=None, relative_difference=None, within_tolerance=None)
        out["notes"].append("no 'Decode batch ... accept len:' lines in the log (speculative decoding off, or "
                            "another log level / file)")
        return out
    mean = sum(parsed["accept_len"]) / parsed["lines"]
    rel = relative_difference(mean, oracle_tau)
    out.update(server_accept_length=mean, relative_difference=rel, tolerance=tolerance,
               within_tolerance=None if rel is None else rel <= tolerance)
    if parsed["accept_rate"]:
        defs = {accept_rate_definition(a, r, num_draft_tokens)
                for a, r in zip(parsed["accept_len"], parsed["accept_rate"])}
        out["accept_rate_definition"] = defs.pop() if len(defs) == 1 else None
    if (parsed["max_running_req"] or 0) > 1:
        out["notes"].append(f"some lines show {parsed['max_running_req']} running requests: the log covers other "
                            "traffic too, or requests overlapped; windows are then weighted unevenly")
    return out


def _figure_counts(completion_tokens, verify_count, accepted_drafts) -> tuple[int, int] | None:
    """SGLang's spec_accept_length = completion_tokens / spec_verify_ct.

    >>> _figure_counts(12, 4, None)
    (12, 4)
    """
    return (completion_tokens, verify_count) if completion_tokens is not None and verify_count else None


def _compare_log(text: str, oracle_tau: float | None, num_draft_tokens: int, tolerance: float) -> dict:
    return compare_sglang_log(parse_sglang_log(text), oracle_tau, num_draft_tokens, tolerance)


def _server_num_steps(settings: dict) -> int | None:
    """The drafts per verify the server makes: speculative_num_steps, but for DFLASH (which forces it to 1) its block
    of speculative_num_draft_tokens rows less the anchor."""
    if str(settings.get("speculative_algorithm") or "").upper() == "DFLASH":
        d = settings.get("speculative_num_draft_tokens")
        return d - 1 if isinstance(d, int) else None
    return settings.get("speculative_num_steps")


ENGINE = Engine(
    name="sglang", figure="spec_accept_length",
    figure_definition="completion_tokens / spec_verify_ct (SGLang meta_info.spec_accept_length; counts the "
                      "prefill token); aggregate = sum of completion_tokens / sum of spec_verify_ct over compared "
                      "requests",
    figure_counts=_figure_counts, make_client=lambda http, options: SGLangClient(http),
    compare_settings=compare_sglang_settings, num_steps_setting="speculative_num_steps",
    server_num_steps=_server_num_steps,
    taps={"sglang": "sglang_reads_config", "sglang_before_25454": "sglang_before_25454_reads_config"},
    compare_log=_compare_log)
