"""Which wiring fault explains a server's acceptance: re-run the oracle under each and compare.

Contract: `candidate_hypotheses` lists the usual faults (EAGLE3.md sections 1-3) as changes to the
oracle's resolved wiring, pure and testable without a model; `oracle_variant` applies one to a loaded
oracle (sharing the target and head: only the aux taps, positions, embedding table or num_steps
change, exactly what a changed RunConfig would resolve to); `match_hypotheses` decodes the compared
prompts under every candidate and ranks them by how closely they reproduce the server's per-request
figure (mean absolute difference, smallest first).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from eagle_eval.models.capture import default_hf_layers
from eagle_eval.servers.compare import oracle_counts


@dataclass(frozen=True)
class Hypothesis:
    name: str
    description: str
    aux_hf: tuple[int, ...] | None = None      # HF indices the server would tap
    position_offset: int | None = None
    embedding: str | None = None               # "target" | "own"
    num_steps: int | None = None


def candidate_hypotheses(aux_hf, num_layers: int, position_offset: int = 0, embedding: str = "target",
                         has_own_embedding: bool = False, server_num_steps: int | None = None,
                         num_steps: int | None = None) -> list[Hypothesis]:
    """The faithful wiring first, then each usual fault that changes something (duplicates dropped).

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
        if len(set(hf)) == len(hf) and all(0 <= i < num_layers for i in hf) and \
                all(h.aux_hf != hf for h in out) and hf != aux:
            out.append(Hypothesis(name, f"{description}: aux HF {list(hf)}", aux_hf=hf))

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


def _embed_fn(oracle, which: str):
    target, head = oracle.speculator.target, oracle.speculator.head
    table = target.model.get_input_embeddings() if which == "target" else head.embed_tokens
    device, dtype = head.lm_head.weight.device, head.lm_head.weight.dtype

    def embed(ids):
        return table(ids.to(table.weight.device)).to(device, dtype)
    return embed


def oracle_variant(oracle, h: Hypothesis):
    """A copy of `oracle` wired as `h` says (the loaded target and head are shared, not reloaded)."""
    spec_changes, resolved = {}, dict(oracle.resolved)
    if h.aux_hf is not None:
        spec_changes["aux_hf"] = tuple(h.aux_hf)
        resolved["aux_layers"] = {"hf": list(h.aux_hf), "sglang": [i - 1 for i in h.aux_hf],
                                  "vllm": list(h.aux_hf), "source": f"hypothesis {h.name}"}
    if h.position_offset is not None:
        spec_changes["position_offset"] = resolved["position_offset"] = h.position_offset
    if h.embedding is not None:
        spec_changes["embed"] = _embed_fn(oracle, h.embedding)
        resolved["embedding"] = f"{'draft' if h.embedding == 'own' else 'target'} (hypothesis {h.name})"
    config = oracle.config
    if h.num_steps is not None:
        config = replace(config, num_steps=h.num_steps)
        resolved["num_steps"] = h.num_steps
    return replace(oracle, config=config, speculator=replace(oracle.speculator, **spec_changes), resolved=resolved)


def hypotheses_for(oracle, server_num_steps: int | None = None) -> list[Hypothesis]:
    r = oracle.resolved
    return candidate_hypotheses(
        r["aux_layers"]["hf"], oracle.speculator.target.num_layers, r["position_offset"],
        "target" if r["embedding"].startswith("target") else "own",
        oracle.speculator.head.embed_tokens is not None, server_num_steps, r["num_steps"])


def match_hypotheses(oracle, prompts: list, server_figures: dict[str, float], backend: str,
                     server_num_steps: int | None = None) -> dict:
    """Rank the hypotheses by mean |server figure - hypothesis figure| over the prompts in server_figures.

    prompts: records.Prompt; server_figures: prompt id -> the server's per-request figure.
    """
    chosen = [p for p in prompts if p.id in server_figures]
    table = []
    for h in hypotheses_for(oracle, server_num_steps):
        variant = oracle_variant(oracle, h)
        num = den = 0
        diffs, per_request = [], {}
        for p in chosen:
            c = oracle_counts(backend, variant.decode(p, check_lossless=False))
            if c is None:
                continue
            per_request[p.id] = c[0] / c[1]
            num, den = num + c[0], den + c[1]
            diffs.append(abs(per_request[p.id] - server_figures[p.id]))
        table.append({**asdict(h), "aux_hf": list(h.aux_hf) if h.aux_hf else None,
                      "aggregate": num / den if den else None,
                      "mean_abs_difference": sum(diffs) / len(diffs) if diffs else None,
                      "max_abs_difference": max(diffs) if diffs else None,
                      "exact_requests": sum(1 for d in diffs if d < 1e-9), "per_request": per_request})
    ranked = sorted(table, key=lambda row: (row["mean_abs_difference"] is None, row["mean_abs_difference"] or 0))
    best = ranked[0] if ranked and ranked[0]["mean_abs_difference"] is not None else None
    tied = [r["name"] for r in ranked if best and r["mean_abs_difference"] == best["mean_abs_difference"]]
    return {"requests": len(chosen), "ranking": ranked, "best": best["name"] if best else None, "tied": tied,
            "server_per_request": server_figures, "score": "mean over requests of |server figure - hypothesis "
            "figure| (figure as in acceptance.figure)"}

