"""Server figures against the oracle's, under the SAME definition (pure functions, no torch).

Contract: every comparison works on integer counts and derives ratios at the end, so per-request
rows merge exactly into the aggregate. The figure compared depends on what the server reports:

| backend | figure | per request | aggregate |
|---|---|---|---|
| sglang | `spec_accept_length` | completion_tokens / spec_verify_ct | sum completion / sum verify |
| vllm | `accept_length` (tau) | 1 + accepted drafts / drafts | 1 + sum accepted / sum drafts |

In exact mode, when the server reports the accepted drafts of every verify step (vLLM's detailed
per-request metrics), that sequence is compared with the oracle's cycle by cycle, and a request whose
sequences differ names the first differing cycle (`first_differing_cycle`), even with equal totals.
| sglang log | `accept len` (tau) | per log window | mean over windows |

A request whose output tokens differ from the oracle's ran a different workload: it is reported
with its first divergence and left out of the acceptance comparison.
"""

from __future__ import annotations

import re
from pathlib import Path

from eagle_eval.results.acceptance import AcceptanceCounts
from eagle_eval.results.records import SampleRecord
from eagle_eval.servers.judge import counts_equal, first_differing_cycle

FIGURES = {
    "sglang": ("spec_accept_length",
               "completion_tokens / spec_verify_ct (SGLang meta_info.spec_accept_length; counts the prefill "
               "token); aggregate = sum of completion_tokens / sum of spec_verify_ct over compared requests"),
    "vllm": ("accept_length",
             "1 + accepted drafts / drafts (vLLM mean acceptance length, bonus counted), from each answer's "
             "metrics.speculative_decoding (num_spec_steps, num_accepted_draft_tokens) when the server offers "
             "per-request metrics, else from the deltas of vllm:spec_decode_num_drafts and "
             "..._num_accepted_tokens around each request (see each request's server.source); aggregate from "
             "the summed counts"),
}


def figure_counts(backend: str, completion_tokens, verify_count, accepted_drafts) -> tuple[int, int] | None:
    """(numerator, denominator) of the backend's figure, or None when a count is missing.

    >>> figure_counts("sglang", 12, 4, None), figure_counts("vllm", 12, 4, 7)
    ((12, 4), (11, 4))
    """
    if backend == "sglang":
        return (completion_tokens, verify_count) if completion_tokens is not None and verify_count else None
    return (verify_count + accepted_drafts, verify_count) if verify_count and accepted_drafts is not None else None


def oracle_counts(backend: str, rec: SampleRecord) -> tuple[int, int] | None:
    return figure_counts(backend, len(rec.output_ids), rec.verify_count, sum(rec.accepted_per_cycle))


def relative_difference(server: float | None, oracle: float | None) -> float | None:
    if server is None or oracle is None or oracle == 0:
        return None
    return abs(server - oracle) / abs(oracle)


def classify_divergence(div: dict | None, tie_margin: float) -> str:
    """'equal', 'near_tie' (target logit margin below tie_margin: numerics) or 'mismatch' (logic)."""
    if div is None:
        return "equal"
    margin = div.get("margin")
    if div.get("reason") != "length" and margin is not None and abs(margin) < tie_margin:
        return "near_tie"
    return "mismatch"


def _padded(hist, n: int) -> list[int]:
    return list(hist) + [0] * (n - len(hist))


def compare_request(backend: str, rec: SampleRecord, reply, divergence: dict | None, num_steps: int,
                    tie_margin: float) -> dict:
    """One request: tokens, counts and the figure on both sides (reply: server.ServerReply)."""
    counts = AcceptanceCounts.from_accepted(rec.accepted_per_cycle, num_steps)
    tokens = "unknown" if reply.output_ids is None else classify_divergence(divergence, tie_margin)
    o, s = oracle_counts(backend, rec), figure_counts(backend, reply.completion_tokens, reply.verify_count,
                                                      reply.accepted_drafts)
    row = {
        "id": rec.id,
        "tokens": tokens,
        "divergence": divergence,
        "oracle": {"output_tokens": len(rec.output_ids), "verify_count": rec.verify_count,
                   "accepted_drafts": counts.accepted_drafts, "histogram": counts.histogram,
                   "accepted_per_position": counts.accepted, "accepted_per_cycle": list(rec.accepted_per_cycle),
                   "figure": o[0] / o[1] if o else None},
        "server": {"output_tokens": reply.completion_tokens, "verify_count": reply.verify_count,
                   "accepted_drafts": reply.accepted_drafts, "histogram": reply.histogram,
                   "accepted_per_position": reply.accepted_per_position,
                   "accepted_per_cycle": reply.accepted_per_cycle, "source": reply.source,
                   "figure": s[0] / s[1] if s else None, "reported": reply.raw},
        "comparable": tokens in ("equal", "unknown") and s is not None and o is not None,
        "notes": list(reply.notes),
    }
    row["counts_equal"] = counts_equal(row["oracle"], row["server"], num_steps) if row["comparable"] else None
    if row["comparable"] and reply.accepted_per_cycle is not None:
        row["first_differing_cycle"] = first_differing_cycle(rec.accepted_per_cycle, reply.accepted_per_cycle)
    if row["server"]["figure"] is not None and row["oracle"]["figure"] is not None:
        row["figure_difference"] = row["server"]["figure"] - row["oracle"]["figure"]
    return row


def aggregate(backend: str, rows: list[dict], tolerance: float) -> dict:
    """The acceptance verdict over the comparable requests (within_tolerance None = nothing to compare)."""
    name, definition = FIGURES[backend]
    used = [r for r in rows if r["comparable"]]
    num = {"oracle": 0, "server": 0}
    den = {"oracle": 0, "server": 0}
    for r in used:
        for side in ("oracle", "server"):
            d = r[side]
            c = figure_counts(backend, d["output_tokens"], d["verify_count"], d["accepted_drafts"])
            num[side] += c[0]
            den[side] += c[1]
    oracle = num["oracle"] / den["oracle"] if den["oracle"] else None
    server = num["server"] / den["server"] if den["server"] else None
    rel = relative_difference(server, oracle)
    diffs = [abs(r["figure_difference"]) for r in used if "figure_difference" in r]
    outside = [r["id"] for r in used
               if (relative_difference(r["server"]["figure"], r["oracle"]["figure"]) or 0) > tolerance]
    return {
        "figure": name, "definition": definition,
        "requests": len(rows), "requests_compared": len(used),
        "requests_left_out": {r["id"]: ("output tokens differ" if r["tokens"] in ("mismatch", "near_tie")
                                        else "no acceptance figure (a count is missing or zero)") for r in rows
                              if not r["comparable"]},
        "oracle": oracle, "server": server, "relative_difference": rel, "tolerance": tolerance,
        "within_tolerance": None if rel is None else rel <= tolerance,
        "per_request": {"mean_abs_difference": sum(diffs) / len(diffs) if diffs else None,
                        "max_abs_difference": max(diffs) if diffs else None,
                        "outside_tolerance": outside,
                        "counts_equal": sum(1 for r in used if r["counts_equal"]),
                        "per_cycle_compared": sum(1 for r in used if "first_differing_cycle" in r),
                        "per_cycle_equal": sum(1 for r in used if "first_differing_cycle" in r
                                               and r["first_differing_cycle"] is None)},
        # where the server's counts came from (vLLM: per-request metrics or counter deltas), when named
        "sources": {src: sum(1 for r in rows if r["server"].get("source") == src)
                    for src in dict.fromkeys(r["server"].get("source") for r in rows) if src is not None},
    }


def server_distribution(backend: str, rows: list[dict], num_steps: int) -> dict:
    """Summed histogram (SGLang) or per-position accepted counts (vLLM) on both sides, where reported."""
    used = [r for r in rows if r["comparable"]]
    out = {}
    if used and all(r["server"]["histogram"] is not None for r in used):
        n = max([num_steps + 1] + [len(r["server"]["histogram"]) for r in used])
        out["histogram"] = {side: [sum(col) for col in zip(*(_padded(r[side]["histogram"], n) for r in used))]
                            for side in ("oracle", "server")}
    if used and all(r["server"]["accepted_per_position"] is not None for r in used):
        n = max([num_steps] + [len(r["server"]["accepted_per_position"]) for r in used])
        cycles = {side: sum(r[side]["verify_count"] for r in used) for side in ("oracle", "server")}
        out["per_position"] = [
            {"position": i + 1, **{f"{side}_accepted": sum(_padded(r[side]["accepted_per_position"], n)[i]
                                                            for r in used) for side in ("oracle", "server")}}
            for i in range(n)]
        for p in out["per_position"]:
            for side in ("oracle", "server"):
                p[f"{side}_rate"] = p[f"{side}_accepted"] / cycles[side] if cycles[side] else None
    return out


# -- the server's own settings ----------------------------------------------------------------------

def _row(name, server, oracle, ok, note=None) -> dict:
    return {"setting": name, "server": server, "oracle": oracle, "ok": ok, "note": note}


def compare_sglang_settings(settings: dict, resolved: dict, draft_path: str) -> list[dict]:
    """/get_server_info against the oracle's resolved settings (ok None = not reported / informative).

    `resolved["num_draft_tokens"]` already carries SGLang's topk == 1 adjustment (D = S + 1).
    """
    rows = []
    algo = settings.get("speculative_algorithm")
    rows.append(_row("speculative_algorithm", algo, "EAGLE3", algo is not None and str(algo).upper() == "EAGLE3",
                     "speculative decoding is off" if algo is None else None))
    for key, ours in (("speculative_num_steps", "num_steps"), ("speculative_eagle_topk", "topk")):
        value = settings.get(key)
        rows.append(_row(key, value, resolved[ours], None if value is None else value == resolved[ours],
                         "not reported" if value is None else None))
    d_server, d_oracle = settings.get("speculative_num_draft_tokens"), resolved["num_draft_tokens"]
    note = None
    if d_server is None:
        ok, note = None, "not reported"
    else:
        ok = d_server == d_oracle
        given = resolved.get("num_draft_tokens_given")
        topk, steps = settings.get("speculative_eagle_topk"), settings.get("speculative_num_steps")
        if not ok and topk == 1 and steps is not None and d_server != steps + 1:
            note = (f"with speculative_eagle_topk == 1 SGLang sets speculative_num_draft_tokens = "
                    f"speculative_num_steps + 1 = {steps + 1}; this server reports {d_server} (not adjusted)")
        elif ok and given is not None and given != d_oracle:
            note = f"SGLang's topk == 1 adjustment applied (asked {given}, used {d_oracle})"
    rows.append(_row("speculative_num_draft_tokens", d_server, d_oracle, ok, note))
    path = settings.get("speculative_draft_model_path")
    if path is not None:
        same = Path(str(path).rstrip("/")).name == Path(str(draft_path).rstrip("/")).name
        rows.append(_row("speculative_draft_model_path", path, draft_path, None,
                         None if same else "the folder names differ: is the server running the same head?"))
    return rows


def compare_vllm_settings(settings: dict, resolved: dict) -> list[dict]:
    k = settings.get("num_speculative_tokens")
    return [_row("num_speculative_tokens", k, resolved["num_steps"], None if k is None else k == resolved["num_steps"],
                 "not reported" if k is None else
                 "the position labels of vllm:spec_decode_num_accepted_tokens_per_pos")]


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
