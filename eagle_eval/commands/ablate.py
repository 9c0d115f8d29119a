"""Ablations: acceptance and modelled speedup over num_steps (one profile) and over other axes.

Contract: a variant is the base oracle with some settings changed (`--vary FIELD=VALUE`, through
`oracle.with_`, so the target and the head load once unless a variant changes a model setting); each
variant costs one profile, which gives every num_steps <= max_steps at once. The speedup model is
docs/eagle3.md section 5: S(k) = (1 + sum_{i<=k} u_i) / (k c + r(k)), with c and r(k) timed on the
current device (`measure_costs`) or given. Its CSV and PNG writers live in `results/` like every other writer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from eagle_eval.commands.folder import open_folder
from eagle_eval.commands.profile import profile_oracle
from eagle_eval.errors import within
from eagle_eval.oracle import load_oracle
from eagle_eval import parallel
from eagle_eval.stats.acceptance import speedup
from eagle_eval.stats.advice import advise, settings_from_rows
from eagle_eval.results.expectation import section_rates
from eagle_eval.results.plot import plot_ablation
from eagle_eval.results.tables import write_rows_csv
from eagle_eval.settings import FIELD_GROUP, AblateOptions, ConfigError, Settings, parse_setting
from eagle_eval.loop.tree import pool_size


@dataclass(frozen=True)
class Costs:
    """c = T_draft_step / T_target_step and r = T_verify(n tokens) / T_target(1 token), where a
    verify forward holds n = num_steps + 1 tokens for a chain and num_draft_tokens for a tree."""
    cost_ratio: float
    verify_ratio: dict                 # n verify tokens -> r
    source: str                        # "measured on DEVICE" or "given (--cost-ratio)"
    times_ms: dict | None = None

    def r(self, verify_tokens: int) -> float:
        return self.verify_ratio.get(verify_tokens, 1.0)


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


def measure_costs(oracle, verify_sizes, progress: bool = False) -> tuple[Costs, object]:
    """The speedup model's costs timed on this device (profile/costs.py: interleaved rounds of every
    timing until each median interval is narrow, or a limit) -> (Costs from the medians, the TimingRun)."""
    from eagle_eval.profile.costs import measure_timings

    run = measure_timings(oracle.speculator, verify_sizes)
    t = run.timings
    sizes = sorted(t.verify_ms)
    c = t.ratios(sizes[0] if sizes else 1)[0]
    costs = Costs(cost_ratio=c, verify_ratio={n: t.ratios(n)[1] for n in sizes},
                  source=f"measured on {oracle.speculator.draft_device} ({run.rounds} rounds, "
                         f"{'narrow' if run.narrow else 'NOT narrow: widest median interval '}"
                         f"{'' if run.narrow else f'+-{run.widest:.1%}'})",
                  times_ms={"target_1_token": statistics.median(t.target_ms), "draft_step": statistics.median(t.draft_ms),
                            "verify": {str(n): statistics.median(xs) for n, xs in t.verify_ms.items()}})
    return costs, run


def variant_rows(name: str, by_num_steps: dict, costs: Costs, server: Costs | None, topk: int = 1,
                 num_draft_tokens: int | None = None, temperature: float = 0.0) -> list[dict]:
    """One row per num_steps; chains verify S+1 tokens, trees num_draft_tokens (given, or the section's). At
    temperature > 0, tau and u_i are the expectation (results/expectation.py `section_rates` says which one, in
    `rates`), tau_sampled the accept length realized along the sampled continuations."""
    rows = []
    for s, section in sorted(by_num_steps.items(), key=lambda kv: int(kv[0])):
        k = int(s)
        d = num_draft_tokens or section.get("num_draft_tokens") or k + 1
        rates = section_rates(section)
        u, a, summary = rates["u"], rates["a"], section.get("summary") or {}
        row = {"variant": name, "num_steps": k, "topk": topk, "num_draft_tokens": d, "temperature": temperature,
               "tau": rates["tau"], "rates": rates["source"],
               "tau_sampled": summary.get("accept_length") if temperature > 0 else None,
               "cycles": summary.get("cycles"), "accepted_drafts": summary.get("accepted_drafts"),
               "speedup_model": speedup(u, costs.cost_ratio, costs.r(d))}
        if server is not None:
            row["speedup_server"] = speedup(u, server.cost_ratio, server.r(d))
        row.update({f"u_{i + 1}": v for i, v in enumerate(u)})
        row.update({f"a_{i + 1}": v for i, v in enumerate(a)})
        rows.append(row)
    return rows


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
    folder.write_with("ablation.csv", lambda path: write_rows_csv(path, result["rows"]))
    result["files"] = ["ablation.json", "ablation.csv"]
    try:
        folder.write_with("ablation.png", lambda path: plot_ablation(path, result["rows"], result["variants"]))
        result["files"].append("ablation.png")
    except ConfigError as exc:          # matplotlib is an optional extra
        result["warnings"] = result.get("warnings", []) + [f"ablation.png not written: {exc}"]
    folder.write_json("ablation.json", result)
    folder.finish()


def _ablate(settings: Settings, options: AblateOptions, named: list, progress: bool) -> dict:
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
    rows, sections, costs, timing = [], [], None, None
    for name, overrides, k, temp in [(n, o, k, t) for n, o in named for k in topks for t in temps]:
        d_main = None if k == 1 else max(d for d in (grid or (spec.num_draft_tokens,))
                                         if d <= pool_size(k_max, k) + 1)
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
                                int(d) if d else None, temperature)
            rows += mine
            best = best_row(mine)
            sections.append({"variant": mine[0]["variant"], "overrides": {
                kk: list(v) if isinstance(v, tuple) else v for kk, v in overrides.items()},
                "topk": k, "num_draft_tokens": int(d) if d else None, "temperature": temperature,
                "aux_layers": res.report["config"]["aux_layers"],
                "best_num_steps": best["num_steps"], "best_speedup_model": best["speedup_model"],
                "best_num_steps_server": best_row(mine, "speedup_server")["num_steps"] if server else None,
                "advice": advise(settings_from_rows(mine), timings_of(timing, options)).as_dict(),
                "sanity": res.report["config"]["sanity"], "by_num_steps": by_steps,
                "by_context": _variant_context(res, int(d) if d else None)})
    overall = best_row(rows)
    result = {"schema_version": 1,
              "config": {**settings.flat(), **options.as_dict(), "topk_grid": topks, "draft_tokens_grid": list(grid),
                         "temperature_grid": [t for t in temps if t is not None]},
              "costs": {"cost_ratio": costs.cost_ratio,
                        "verify_ratio": {str(n): v for n, v in costs.verify_ratio.items()},
                        "source": costs.source, "times_ms": costs.times_ms,
                        "timings": _timing_dict(timing),
                        "server_ms": {"draft_step": server_ms[0], "target_step": server_ms[1]} if server_ms else None},
              "speedup_model": "S = (1 + sum_{i<=S} u_i) / (S c + r), c = T_draft_step / T_target_step, "
                               "r = T_verify(S+1 tokens, or num_draft_tokens for a tree) / T_target(1 token)",
              "best": {k: overall[k] for k in ("variant", "num_steps", "topk", "num_draft_tokens", "speedup_model")},
              "advice": advise(settings_from_rows(rows), timings_of(timing, options)).as_dict(),
              "variants": sections, "rows": rows, "provenance": provenance(settings.decoding.seed)}
    return result


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


def timings_of(timing, options: AblateOptions):
    """The timings the advice is decided from: measured, or given (--cost-ratio: no timing noise)."""
    from eagle_eval.stats.advice import Timings

    return timing.timings if timing is not None else Timings.given(options.cost_ratio)


def _timing_dict(timing) -> dict | None:
    if timing is None:
        return None
    t = timing.timings
    return {"rounds": timing.rounds, "narrow": timing.narrow, "widest": timing.widest, "rule": timing.rule,
            "samples_ms": {"target_1_token": list(t.target_ms), "draft_step": list(t.draft_ms),
                           "verify": {str(n): list(xs) for n, xs in t.verify_ms.items()}}}


def replace_grid(options: AblateOptions, grid):
    """The profile options of one variant: the ablation's, with the tree grid given (None for a chain)."""
    return replace(options.profile_options(), draft_tokens_grid=grid)
