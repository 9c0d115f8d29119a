"""Which wiring fault explains a server's acceptance: re-run the oracle under each and compare.

Contract: `candidate_hypotheses` lists the usual faults (docs/eagle3.md sections 1-3) as changes to the
oracle's resolved wiring, pure and testable without a model, starting with what each engine of the
server's kind taps for this head's config (`capture.engine_taps`, e.g. vLLM's V1 runner reading the
nested SGLang-style ids unchanged); `oracle_variant` applies one to a loaded oracle through
`oracle.with_` (the target and head are shared: only the aux taps, positions, embedding table or
num_steps change); `match_hypotheses` decodes the compared prompts under every candidate and compares
each with the server request by request.

A hypothesis is called THE explanation only when it reproduces the server: in exact mode, the same
counts on most (more than half) of the compared requests; in tolerance mode, a 95% interval of the
per-request relative differences inside the tolerance (`judge`). Otherwise no hypothesis explains
the server, and the report lists the nearest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eagle_eval.models.capture import default_hf_layers
from eagle_eval.registry import HEAD_KINDS
from eagle_eval.stats.acceptance import AcceptanceCounts
from eagle_eval.servers.figures import oracle_counts
from eagle_eval.servers.judge import counts_equal, judge_interval, paired_interval


@dataclass(frozen=True)
class Hypothesis:
    name: str
    description: str
    aux_hf: tuple[int, ...] | None = None      # HF indices the server would tap
    position_offset: int | None = None
    embedding: str | None = None               # "target" | "own"
    num_steps: int | None = None
    settings: tuple = ()                       # (name, value) pairs of settings a head kind's variant changes


def candidate_hypotheses(aux_hf, num_layers: int, position_offset: int = 0, embedding: str = "target",
                         has_own_embedding: bool = False, server_num_steps: int | None = None,
                         num_steps: int | None = None, engine_reads=()) -> list[Hypothesis]:
    """The faithful wiring first, then each usual fault that changes something (duplicates dropped).

    engine_reads: (name, description, HF indices) for what the server's engine would tap for this
    head's config; they come before the generic faults, so a tap set is named after its cause.

    >>> [h.name for h in candidate_hypotheses((2, 4, 5), 8)]
    ['as_configured', 'aux_hf_minus_1', 'aux_hf_plus_1', 'embedding_for_lowest', 'position_offset']
    >>> [(h.name, h.aux_hf) for h in candidate_hypotheses((1, 4, 7), 8)[1:4]]   # HF[8] does not exist
    [('aux_hf_minus_1', (0, 3, 6)), ('embedding_for_lowest', (0, 4, 7)), ('engine_default_layers', (2, 4, 5))]
    """
    aux = tuple(sorted(aux_hf))
    out = [Hypothesis("as_configured", f"the oracle's own wiring (aux HF {list(aux)}, position offset "
                                       f"{position_offset}, {embedding} embedding)")]

    def add_aux(name, hf, description):
        hf = tuple(sorted(hf))
        if len(hf) == len(aux) and len(set(hf)) == len(hf) and all(0 <= i < num_layers for i in hf) and \
                all(h.aux_hf != hf for h in out) and hf != aux:
            out.append(Hypothesis(name, f"{description}: aux HF {list(hf)}", aux_hf=hf))

    for name, description, hf in engine_reads:
        if hf is not None:
            add_aux(name, hf, description)
    add_aux("aux_hf_minus_1", [i - 1 for i in aux],
            "aux ids read in the other convention, every HF index - 1 (SGLang-style ids read as vLLM-style)")
    add_aux("aux_hf_plus_1", [i + 1 for i in aux],
            "aux ids read in the other convention, every HF index + 1 (vLLM-style ids read as SGLang-style)")
    add_aux("embedding_for_lowest", [0] + list(aux[1:]), "the embedding output HF[0] in place of the lowest layer")
    add_aux("engine_default_layers", default_hf_layers(num_layers), "the engine's default layers")
    out.append(Hypothesis("position_offset", f"draft decode positions p+k+{1 - position_offset} instead of "
                          f"p+k+{position_offset} (SGLang before PR #25015 used p+k+1)",
                          position_offset=1 - position_offset))
    if has_own_embedding:
        other = "own" if embedding == "target" else "target"
        out.append(Hypothesis("embedding_table", f"the {'draft' if other == 'own' else 'target'}'s embedding "
                              f"table instead of the {'target' if other == 'own' else 'draft'}'s", embedding=other))
    if server_num_steps is not None and num_steps is not None and server_num_steps != num_steps:
        out.append(Hypothesis("server_num_steps", f"the server's num_steps={server_num_steps}",
                              num_steps=server_num_steps))
    return out


def oracle_variant(oracle, h: Hypothesis):
    """`oracle` wired as `h` says, through `oracle.with_` (the loaded target and head are shared, not reloaded)."""
    changes = {}
    if h.aux_hf is not None:
        top = oracle.speculator.target.num_layers
        changes.update(aux_layers=tuple(h.aux_hf), aux_convention="boundary" if top in h.aux_hf else "hf")
    if h.position_offset is not None:
        changes["position_offset"] = h.position_offset
    if h.embedding is not None:
        changes["draft_embedding"] = h.embedding
    if h.num_steps is not None:
        changes["num_steps"] = h.num_steps
    return oracle.with_(**changes, **dict(h.settings))


def engine_reads(resolved, backend: str) -> list[tuple]:
    """(name, description, HF) for what each engine of `backend` taps for the head's config."""
    from eagle_eval.servers.engine import engine

    e = engine(backend)
    out = [(name, f"{resolved.engines[key].name} reading this head's config: {resolved.engines[key].reads}",
            resolved.engines[key].hf) for key, name in e.taps.items() if key in resolved.engines]
    return out + (e.extra_taps(resolved) if e.extra_taps else [])


def hypotheses_for(oracle, server_num_steps: int | None = None, backend: str | None = None) -> list[Hypothesis]:
    """The usual faults of this head's wiring: its kind's own (heads/kind.py `HeadKind.variants`, e.g. an MTP layer's
    conventions) when it has them, else the aux-layer faults of `candidate_hypotheses`; then the ways the server's
    engine may run this kind otherwise (`HeadKind.server_variants`, e.g. vLLM's CPU build and a DFlash drafter's
    context keys)."""
    from eagle_eval.heads.kind import kind

    r = oracle.resolved
    record = kind(r.head.kind) if r.head.kind in HEAD_KINDS else None
    own = record.variants if record is not None else None
    if own is not None:
        out = [Hypothesis("as_configured", "the oracle's own wiring")]
        out += [Hypothesis(name, description, settings=tuple(changes.items()))
                for name, description, changes in own(oracle.settings, r)]
        if server_num_steps is not None and server_num_steps != r.num_steps:
            out.append(Hypothesis("server_num_steps", f"the server's num_steps={server_num_steps}",
                                  num_steps=server_num_steps))
    else:
        out = candidate_hypotheses(
            r.aux.hf, oracle.speculator.target.num_layers, r.position_offset, r.embedding_table,
            getattr(oracle.speculator.head, "embed_tokens", None) is not None, server_num_steps, r.num_steps,
            engine_reads(r, backend) if backend else ())
    served = record.server_variants if record is not None and backend else None
    if served is not None:
        out += [Hypothesis(name, description, settings=tuple(changes.items()))
                for name, description, changes in served(oracle.settings, r, backend)]
    return out


def _score(variant, prompts: list, rows: dict, backend: str, num_steps: int, tolerance: float) -> dict:
    """One hypothesis against the server's per-request rows (prompt id -> server-check row)."""
    num = den = 0
    diffs, rel, per_request, exact = [], [], {}, 0
    for p in prompts:
        rec = variant.decode(p, check_lossless=False)
        c = oracle_counts(backend, rec)
        if c is None:
            continue
        server = rows[p.id]["server"]
        per_request[p.id] = c[0] / c[1]
        num, den = num + c[0], den + c[1]
        diffs.append(abs(per_request[p.id] - server["figure"]))
        rel.append((server["figure"] - per_request[p.id]) / per_request[p.id])
        counts = AcceptanceCounts.from_accepted(rec.accepted_per_cycle, max(num_steps, variant.resolved.num_steps))
        mine = {"verify_count": rec.verify_count, "accepted_drafts": counts.accepted_drafts,
                "histogram": counts.histogram, "accepted_per_position": counts.accepted,
                "accepted_per_cycle": rec.accepted_per_cycle}
        exact += bool(counts_equal(mine, server, num_steps))
    interval = paired_interval(rel)
    return {"aggregate": num / den if den else None,
            "mean_abs_difference": sum(diffs) / len(diffs) if diffs else None,
            "max_abs_difference": max(diffs) if diffs else None, "exact_requests": exact,
            "interval": list(interval) if interval else None,
            "within_tolerance": judge_interval(interval, tolerance) == "agree", "per_request": per_request}


def match_hypotheses(oracle, prompts: list, rows: list[dict], backend: str, server_num_steps: int | None = None,
                     mode: str = "exact", tolerance: float = 0.05) -> dict:
    """Every hypothesis against the server on the requests whose tokens equal the oracle's.

    prompts: records.Prompt; rows: server-check's per-request rows (with the server's counts).
    Ranked by exact requests (exact mode) or by mean |server - hypothesis| figure (tolerance mode).
    """
    from eagle_eval.errors import UserError

    by_id = {r["id"]: r for r in rows if r["comparable"]}
    chosen = [p for p in prompts if p.id in by_id]
    num_steps = oracle.resolved.num_steps
    table, not_applicable = [], []
    for h in hypotheses_for(oracle, server_num_steps, backend):
        try:
            variant = oracle_variant(oracle, h)
        except UserError as exc:           # a wiring this head kind cannot have (a block drafter's draft positions)
            not_applicable.append({"name": h.name, "reason": str(exc)})
            continue
        table.append({**asdict(h), "aux_hf": list(h.aux_hf) if h.aux_hf else None,
                      **_score(variant, chosen, by_id, backend, num_steps, tolerance)})

    def rank(row):
        mad = row["mean_abs_difference"]
        return ((-row["exact_requests"], mad is None, mad or 0) if mode == "exact" else
                (mad is None, mad or 0, -row["exact_requests"]))
    ranked = sorted(table, key=rank)
    explains = [r for r in ranked if (r["exact_requests"] * 2 > len(chosen) if mode == "exact"
                                      else r["within_tolerance"])]
    best = explains[0] if explains else None
    tied = [r["name"] for r in explains if rank(r) == rank(best)] if best else []
    rule = ("the same counts as the server on more than half of the compared requests" if mode == "exact" else
            f"a 95% interval of the per-request relative differences inside +-{tolerance:.1%}")
    return {"requests": len(chosen), "mode": mode, "rule": rule, "ranking": ranked,
            "explanation": best["name"] if best else None, "tied": tied,
            "nearest": [r["name"] for r in ranked[:3]], "not_applicable": not_applicable,
            "server_per_request": {i: r["server"]["figure"] for i, r in by_id.items()},
            "score": "exact_requests: requests whose counts equal the server's; mean_abs_difference: mean over "
                     "requests of |server figure - hypothesis figure| (figure as in acceptance.figure)"}
