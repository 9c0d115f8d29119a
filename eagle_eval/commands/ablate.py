"""Ablations: acceptance and modelled speedup over num_steps (one profile) and over other axes.

Contract: a variant is the base oracle with some settings changed (`--vary FIELD=VALUE`, through
`oracle.with_`, so the target and the head load once unless a variant changes a model setting); each
variant costs one profile, which gives every num_steps <= max_steps at once. The speedup model is
docs/eagle3.md section 5: S(k) = (1 + sum_{i<=k} u_i) / (k c + r(k)), with c and r(k) timed on the
current device (`measure_costs`) or given. Its CSV and PNG writers live in `results/` like every other writer.

A block drafter (DFlash): row num_steps = k drafts ONE block of k + 1 rows, one draft forward per block length over
every start (the profile's; a shorter block is not a truncation of a longer one), so the sweep over num_steps is the
sweep over block lengths; a cycle costs one draft forward of that block (commands/ablate_costs.py). Each row says
the block it drafted beside the trained one, and a block of another length is the variant's finding
dflash-block-size (its kind's `per_num_steps`); trees are refused as the kind refuses them, before any profile.
ablation.csv holds each variant's acceptance by context after the rows (`context:LOW-HIGH`, results/context.py).
"""

from __future__ import annotations

from dataclasses import replace

from eagle_eval.commands.ablate_costs import (BLOCK_MODEL, CHAIN_MODEL, Costs, measure_costs, timing_dict, timings_of,
                                              variant_rows)
from eagle_eval.commands.folder import open_folder
from eagle_eval.commands.profile import profile_oracle
from eagle_eval.errors import within
from eagle_eval.oracle import load_oracle
from eagle_eval import parallel
from eagle_eval.stats.advice import advise, settings_from_rows
from eagle_eval.results.context import ablation_csv_rows
from eagle_eval.results.plot import plot_ablation
from eagle_eval.results.tables import write_rows_csv
from eagle_eval.settings import FIELD_GROUP, AblateOptions, ConfigError, Settings, parse_setting
from eagle_eval.loop.tree import pool_size


NOT_AXES = ("output_dir", "resume", "overwrite", "full_fingerprint", "prompts", "dataset", "target", "draft", "seed",
            "context_buckets", "train_context")
# the profile's own axes: every num_steps <= --max-steps at once, trees by --topk-grid and --draft-tokens-grid
GRID_AXES = ("num_steps", "topk", "num_draft_tokens", "eagle_depth", "eagle_top_k", "eagle_total_token")


def parse_variant(text: str) -> tuple[str, dict]:
    """'aux_layers=0,3,6' -> ('aux_layers=0,3,6', {'aux_layers': (0, 3, 6)}); several with ';'. Values are
    parsed as the setting's own flag would parse them."""
    overrides = {}
    for part in text.split(";"):
        if "=" not in part:
            raise ConfigError(f"--vary {text!r}: expected FIELD=VALUE (e.g. aux_layers=0,3,6 or dtype=bf16)")
        key, value = (s.strip() for s in part.split("=", 1))
        key = key.replace("-", "_")
        if key == "block_size":
            raise ConfigError("--vary block_size: a block drafter drafts blocks of num_steps + 1 rows, and every "
                              "num_steps <= --max-steps is profiled at once (one draft forward per block length): "
                              "--max-steps B sweeps the blocks 2..B + 1")
        if key in GRID_AXES:
            raise ConfigError(f"--vary {key!r}: not a variant: every num_steps <= --max-steps is profiled at once, "
                              "and tree shapes are --topk-grid and --draft-tokens-grid")
        if key not in FIELD_GROUP or key in NOT_AXES:
            raise ConfigError(f"--vary {key!r}: not an ablation axis; use a setting of `run` such as "
                              "aux_layers, aux_convention, dtype, max_new_tokens, draft_embedding, position_offset")
        try:
            overrides[key] = parse_setting(key, value)
        except ConfigError as exc:
            raise ConfigError(f"--vary {part.strip()}: {exc}") from exc
    return text, overrides


def best_num_steps(rows: list[dict], key: str = "speedup_model") -> int:
    return max(rows, key=lambda r: r[key])["num_steps"]


def best_row(rows: list[dict], key: str = "speedup_model") -> dict:
    return max(rows, key=lambda r: r[key])


def ablate(settings: Settings, options: AblateOptions = AblateOptions(), progress: bool = True) -> dict:
    """Profile the base settings and each `--vary` variant (for each topk of the grid, with every
    num_draft_tokens of the grid from one tree expansion); tabulate tau and modelled speedup per
    (num_steps, topk, num_draft_tokens). Server step times, when given, are a second speedup column."""
    named = [("base", {})] + [parse_variant(v) for v in options.vary]       # bad variants fail before any load
    refuse_idle(settings, options, named)
    folder = open_folder("ablate", settings, options)
    try:
        result = _ablate(settings, options, named, progress)
        if folder is not None:
            _write_ablation(folder, result)
        return result
    finally:
        if folder is not None:
            folder.close()


def refuse_idle(settings: Settings, options: AblateOptions, named: list) -> None:
    """Options and variants that would change no profile of the ablation are refused (commands/effect.py)."""
    from eagle_eval.commands.effect import refuse_idle_variants, refuse_no_effect, refuse_unfit_grid

    temps = list(options.temperature_grid or [None])
    if options.temperature_grid and any("temperature" in o for _, o in named):
        raise ConfigError("--vary temperature=... and --temperature-grid both set the temperature: give one")
    refuse_idle_variants(settings, named, temps)
    variants = [settings.with_(**o).decoding for _, o in named]
    decodings = [d if t is None else replace(d, temperature=t) for d in variants for t in temps]
    topks = tuple(options.topk_grid or [settings.speculation.topk])
    refuse_no_effect(decodings, options, topks)
    refuse_unfit_grid(topks, options)
    grid = options.draft_tokens_grid or (() if settings.speculation.num_draft_tokens is None
                                         else (settings.speculation.num_draft_tokens,))
    for k in (k for k in topks if k > 1 and grid):
        most = pool_size(options.max_steps, k) + 1
        if min(grid) > most:
            raise ConfigError(f"--topk-grid {k}: a tree of topk {k} and num_steps <= --max-steps {options.max_steps} "
                              f"has at most {most} nodes, fewer than every num_draft_tokens given ({min(grid)} and "
                              f"up); give one <= {most} or raise --max-steps")


def _write_ablation(folder, result: dict) -> None:
    folder.write_with("ablation.csv", lambda path: write_rows_csv(path, result["rows"] + ablation_csv_rows(result)))
    result["files"] = ["ablation.json", "ablation.csv"]
    try:
        folder.write_with("ablation.png", lambda path: plot_ablation(path, result["rows"], result["variants"]))
        result["files"].append("ablation.png")
    except ConfigError as exc:          # matplotlib is an optional extra
        result["warnings"] = result.get("warnings", []) + [f"ablation.png not written: {exc}"]
    folder.write_json("ablation.json", result)
    folder.finish()


def _ablate(settings: Settings, options: AblateOptions, named: list, progress: bool) -> dict:
    from eagle_eval.heads.kind import kind as head_kind
    from eagle_eval.results.report import provenance

    base = settings.with_(output_dir=None, resume=False, overwrite=False)
    spec = base.speculation
    topks = list(options.topk_grid or [spec.topk])
    grid = tuple(options.draft_tokens_grid or ())
    if any(k > 1 for k in topks) and not grid and spec.num_draft_tokens is None:
        raise ConfigError("a topk > 1 in the grid needs --draft-tokens-grid (or --num-draft-tokens)")
    k_max = options.max_steps
    sizes = {s + 1 for s in range(1, k_max + 1)} | set(grid) | ({spec.num_draft_tokens} if spec.num_draft_tokens else set())
    server_ms = (options.server_draft_ms, options.server_target_ms) if options.server_draft_ms is not None else None
    server = Costs(server_ms[0] / server_ms[1], {}, "server step times (r = 1)") if server_ms else None
    base_oracle = load_oracle(base)
    base_oracle.refuse_load_errors()
    temps = list(options.temperature_grid or [None])
    d_of = {k: None if k == 1 else max(d for d in (grid or (spec.num_draft_tokens,)) if d <= pool_size(k_max, k) + 1)
            for k in topks}
    for k in topks:                    # what the head kind refuses (a block drafter's trees), before any profile
        try:
            base_oracle.with_(topk=k, num_draft_tokens=d_of[k])
        except ConfigError as exc:
            raise ConfigError(f"--topk-grid {k}: {exc}") from exc
    sampled = [t for t in temps if t] + ([base.decoding.temperature] if not base.decoding.greedy else [])
    if sampled and getattr(base_oracle.speculator.draft_state, "run_lengths", None) is not None:
        raise ConfigError(f"--temperature {sampled[0]:g} in ablate with a {base_oracle.resolved.head.kind} draft: the "
                          "profile at temperature > 0 is not implemented for drafts made by one forward per cycle "
                          "(block drafters, P-EAGLE's parallel drafting); ablate them at temperature 0, and `eagle-eval "
                          "run` runs the loop at any temperature")
    loaded_head = base_oracle.loaded.head
    per_num_steps = head_kind(loaded_head.kind).per_num_steps        # a block drafter's block per row (heads/kind.py)
    one_forward = getattr(base_oracle.speculator.draft_state, "one_forward", False)
    rows, sections, costs, timing = [], [], None, None
    for name, overrides, k, temp in [(n, o, k, t) for n, o in named for k in topks for t in temps]:
        d_main = d_of[k]
        at = {} if temp is None else {"temperature": temp}           # one profile (one pass) per temperature
        oracle = base_oracle.with_(**overrides, topk=k, num_draft_tokens=d_main, **at)
        label = (name if len(topks) == 1 else f"{name} topk={k}") + ("" if temp is None else f" T={temp:g}")
        with within(f"variant {label}"):
            res = profile_oracle(oracle, replace_grid(options, grid if k > 1 else None), progress=progress)
        if costs is None:
            if options.cost_ratio is not None:
                costs, timing = Costs(options.cost_ratio, {}, "given (--cost-ratio; r = 1)"), None
            else:                          # timed on rank 0 alone, the others waiting: one clock for every row
                costs, timing = parallel.current().from_main(lambda: measure_costs(oracle, sizes))
        temperature = oracle.settings.decoding.temperature
        shapes = ({str(d): sec for d, sec in res.report.get("by_num_draft_tokens", {}).items()}
                  if k > 1 and grid else {None: res.report["by_num_steps"]})
        for d, by_steps in shapes.items():
            mine = variant_rows(label if d is None else f"{label} D={d}", by_steps, costs, server, k,
                                int(d) if d else None, temperature, one_forward)
            step_findings = _per_num_steps(per_num_steps, oracle.loaded.head, mine)
            rows += mine
            best = best_row(mine)
            sections.append({"variant": mine[0]["variant"], "overrides": {
                kk: list(v) if isinstance(v, tuple) else v for kk, v in overrides.items()},
                "topk": k, "num_draft_tokens": int(d) if d else None, "temperature": temperature,
                "aux_layers": res.report["config"]["aux_layers"],
                "prompt_format": res.report["config"].get("prompt_format"),
                "best_num_steps": best["num_steps"], "best_speedup_model": best["speedup_model"],
                "best_num_steps_server": best_row(mine, "speedup_server")["num_steps"] if server else None,
                "advice": advise(settings_from_rows(mine), timings_of(timing, options)).as_dict(),
                "sanity": _merged(res.report["config"]["sanity"], step_findings), "by_num_steps": by_steps,
                "by_context": _variant_context(res, int(d) if d else None)})
    overall = best_row(rows)
    result = {"schema_version": 1,
              "config": {**settings.flat(), **options.as_dict(), "topk_grid": topks, "draft_tokens_grid": list(grid),
                         "temperature_grid": [t for t in temps if t is not None]},
              "costs": {"cost_ratio": costs.cost_ratio,
                        "verify_ratio": {str(n): v for n, v in costs.verify_ratio.items()},
                        "block_ratio": {str(n): v for n, v in costs.block_ratio.items()},
                        "source": costs.source, "times_ms": costs.times_ms,
                        "timings": timing_dict(timing),
                        "server_ms": {"draft_step": server_ms[0], "target_step": server_ms[1]} if server_ms else None},
              "speedup_model": BLOCK_MODEL if one_forward else CHAIN_MODEL,
              "best": {k: overall[k] for k in ("variant", "num_steps", "topk", "num_draft_tokens", "speedup_model")},
              "advice": advise(settings_from_rows(rows), timings_of(timing, options)).as_dict(),
              "variants": sections, "rows": rows, "provenance": provenance(settings.decoding.seed)}
    if any("trained_block_size" in r for r in rows):
        result["block"] = _block_echo(rows, base_oracle.resolved.head.as_dict().get("block"))
    return result


def _per_num_steps(per_num_steps, loaded_head, rows: list[dict]) -> list[dict]:
    """Each row's echo of what its num_steps runs with this head kind (a block drafter: its block beside the trained
    one), put in the row; the findings of every row, as dicts (none for a kind that has nothing to say)."""
    if per_num_steps is None:
        return []
    found = []
    for row in rows:
        echo, findings = per_num_steps(loaded_head, row["num_steps"])
        row.update(echo)
        found += [f.as_dict() for f in findings]
    return found


def _merged(sanity: list[dict], more: list[dict]) -> list[dict]:
    """The profile's load-time findings, then the rows' own that it does not already hold."""
    return list(sanity) + [f for f in more if f not in sanity]


def _block_echo(rows: list[dict], block: dict | None) -> dict:
    """What an ablation of a block drafter says once: the trained block, the engines' settings for it, and which
    rows drafted another block length."""
    trained = rows[0]["trained_block_size"]
    other = sorted({r["num_steps"] for r in rows if not r["matches_trained_block"]})
    return {"trained_block_size": trained, "vllm_num_speculative_tokens": trained - 1,
            "sglang_num_draft_tokens": trained, "variant": (block or {}).get("variant"),
            "drafted_block_rows": sorted({r["block_rows"] for r in rows}),
            "num_steps_other_than_trained": other,
            "rule": "row num_steps S drafts one block of S + 1 rows: one draft forward per block length over every "
                    "start (the block is non-causal, so a shorter block is not a truncation of a longer one); a cycle "
                    "costs one draft forward of that block; a row whose block differs from the trained one is the "
                    "variant's finding dflash-block-size"}


def _variant_context(res, d: int | None) -> dict | None:
    """A variant's acceptance by context (results/context.py): its profile's per-start expectation at the base
    num_steps; a tree of the grid at its num_draft_tokens, where that tree fits the num_steps (else None)."""
    from eagle_eval.results.context import from_starts

    if d is None:
        return res.report.get("by_context")
    cfg = res.report["config"]
    s = min(cfg["num_steps"], cfg["max_steps"])
    rows = [r for r in res.per_start or () if r["num_steps"] == s and r.get("num_draft_tokens") == d]
    return from_starts(rows, {}, s, d, cfg.get("context_buckets"), cfg.get("train_context")) if rows else None


def replace_grid(options: AblateOptions, grid):
    """The profile options of one variant: the ablation's, with the tree grid given (None for a chain)."""
    return replace(options.profile_options(), draft_tokens_grid=grid)
