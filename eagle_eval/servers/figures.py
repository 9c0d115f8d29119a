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
| sglang log | `accept len` (tau) | per log window | mean over windows (servers/sglang.py) |

A request whose output tokens differ from the oracle's ran a different workload: it is reported
with its first divergence and left out of the acceptance comparison.
"""

from __future__ import annotations

from eagle_eval.stats.acceptance import AcceptanceCounts
from eagle_eval.records import SampleRecord
from eagle_eval.servers.judge import counts_equal, first_differing_cycle, relative_difference

def figure_counts(backend: str, completion_tokens, verify_count, accepted_drafts) -> tuple[int, int] | None:
    """(numerator, denominator) of the engine's figure (servers/engine.py), or None when a count is missing."""
    from eagle_eval.servers.engine import engine

    return engine(backend).figure_counts(completion_tokens, verify_count, accepted_drafts)


def oracle_counts(backend: str, rec: SampleRecord) -> tuple[int, int] | None:
    return figure_counts(backend, len(rec.output_ids), rec.verify_count, sum(rec.accepted_per_cycle))


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
        "prompt_len": rec.prompt_len,                  # places each step's root (results/context.py)
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
    from eagle_eval.servers.engine import engine

    name, definition = engine(backend).figure, engine(backend).figure_definition
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
