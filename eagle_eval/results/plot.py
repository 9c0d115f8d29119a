"""PNG of saved results: per-position acceptance curves, tau by category and by context (matplotlib, optional).

Contract: `plot_results(results, path)` draws, for every result, the conditional rates a_i (solid)
and the unconditional rates u_i (dashed) against the draft position, and beside them tau per
category as grouped bars with the 95% normal interval of `compare.tau_se_cycles`; where the results hold
acceptance by context (results/context.py), a second row: tau by context with its interval over prompts and
u_i by context, the training length dashed. matplotlib is the optional
extra `eagle-eval[plot]`; without it the error says how to install it.
"""

from __future__ import annotations

from pathlib import Path

from eagle_eval.settings import ConfigError
from eagle_eval.results.comparison import Z95, Result, tau_se_cycles

INSTALL_HINT = "--plot needs matplotlib: pip install 'eagle-eval[plot]'"


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError(INSTALL_HINT) from exc
    matplotlib.use("Agg")                     # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _curves(ax, results: list[Result]) -> None:
    for k, r in enumerate(results):
        pp = r.report["per_position"]
        pos = [p["position"] for p in pp]
        color = f"C{k}"
        ax.plot(pos, [p["conditional_rate"] for p in pp], "o-", color=color, label=f"{r.label}: a_i (cond.)")
        ax.plot(pos, [p["unconditional_rate"] for p in pp], "s--", color=color, label=f"{r.label}: u_i (uncond.)")
    ax.set_xticks(sorted({p["position"] for r in results for p in r.report["per_position"]}))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_title("per-position acceptance")
    ax.legend(fontsize="x-small")


def _tau_bars(ax, results: list[Result]) -> None:
    names = sorted({c for r in results for c in r.report.get("by_category", {})}) or ["all"]
    width = 0.8 / len(results)
    for k, r in enumerate(results):
        bodies = [r.report.get("by_category", {}).get(c) or (r.report if c == "all" else None) for c in names]
        taus = [b["summary"]["accept_length"] or 0.0 if b else 0.0 for b in bodies]
        errs = [Z95 * (tau_se_cycles(b["histogram"]) or 0.0) if b else 0.0 for b in bodies]
        xs = [i + (k - (len(results) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, taus, width, yerr=errs, capsize=2, color=f"C{k}", label=r.label)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize="small")
    ax.set_ylabel("tau (accepted + 1 per cycle)")
    ax.set_title("tau by category (95% interval)")
    ax.legend(fontsize="x-small")


def _context_x(bucket: dict) -> float:
    """Where a context bucket is drawn: the mean context of its cycles (or starts); without their sum, the
    bucket's geometric middle."""
    n = bucket.get("cycles", bucket.get("starts"))
    if "context_sum" in bucket and n:
        return max(bucket["context_sum"] / n, 1.0)
    low, high = max(bucket["low"], 1), bucket["high"]
    return (low * high) ** 0.5 if high is not None else low * 2 ** 0.5


def context_sections(results: list[Result]) -> list[tuple[str, dict]]:
    """(label, section) of every result's acceptance by context: the oracle's (or the profile's per-start
    expectation) and, for a server-check, the server's."""
    out = []
    for r in results:
        if r.report.get("by_context"):
            out.append((r.label, r.report["by_context"]))
        if r.report.get("server_by_context"):
            out.append((f"{r.label} (server)", r.report["server_by_context"]))
    return out


def context_panels(tau_ax, rate_ax, named: list[tuple[str, dict]]) -> None:
    """tau by context with its 95% interval over prompts (left) and u_i by context (right), one colour per
    section, the training length a dashed line; x: the bucket's middle, log scale."""
    trains = set()
    for k, (name, section) in enumerate(named):
        buckets = [b for b in section["buckets"] if b["accept_length"]["value"] is not None]
        xs = [_context_x(b) for b in buckets]
        tau = [b["accept_length"] for b in buckets]
        err = [[t["value"] - (t["low"] if t["low"] is not None else t["value"]) for t in tau],
               [(t["high"] if t["high"] is not None else t["value"]) - t["value"] for t in tau]]
        tau_ax.errorbar(xs, [t["value"] for t in tau], yerr=err, capsize=3, marker="o", color=f"C{k}", label=name)
        steps = max((len(b["per_position"]) for b in buckets), default=0)
        for i in range(steps):
            rate_ax.plot(xs, [b["per_position"][i]["unconditional_rate"]["value"] for b in buckets],
                         marker=MARKERS[i % len(MARKERS)], linestyle=LINESTYLES[i % len(LINESTYLES)], color=f"C{k}",
                         label=f"{name}: u_{i + 1}", linewidth=1)
        if section.get("train_context"):
            trains.add(section["train_context"])
    for ax in (tau_ax, rate_ax):
        for t in sorted(trains):
            ax.axvline(t, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context: the cycle's (or start's) root position (prompt + generated before it)")
    starts = any(section.get("kind") == "starts" for _, section in named)
    tau_ax.set_ylabel("tau (accepted + 1 per cycle" + ("; a profile: expected per start)" if starts else ")"))
    tau_ax.set_title("tau by context (95% interval over prompts" + ("; dashed: --train-context)" if trains else ")"))
    rate_ax.set_ylabel("u_i = P(>= i drafts accepted)")
    rate_ax.set_ylim(0, 1.05)
    rate_ax.set_title("per-position acceptance by context")
    tau_ax.legend(fontsize="x-small")
    rate_ax.legend(fontsize="xx-small", ncol=2)


def plot_results(results: list[Result], path: str | Path) -> None:
    """Runs and server-checks (per-position curves and tau by category; by context too, where the results hold
    it); profiles by context (their per-start expectation: a profile holds no decode to draw curves of);
    other kinds are refused."""
    kinds = [getattr(r, "kind", "run") for r in results]
    other = [r for r, k in zip(results, kinds) if k not in ("run", "server_check", "profile")]
    if other:
        raise ConfigError(f"--plot: {other[0].label} is {other[0].kind.replace('_', '-')} results; --plot draws runs, "
                          "server-checks and profiles' acceptance by context (`eagle-eval ablate` writes its own "
                          "ablation.png)")
    decodes = [r for r, k in zip(results, kinds) if k != "profile"]
    named = context_sections(results)
    if not decodes and not named:
        raise ConfigError(f"--plot: {results[0].label} is a profile without acceptance by context (written before "
                          "it existed): re-bucket it with --context-buckets, or plot runs")
    plt = _pyplot()
    rows = (1 if decodes else 0) + (1 if named else 0)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4.5 * rows), squeeze=False)
    try:
        if decodes:
            _curves(axes[0][0], decodes)
            _tau_bars(axes[0][1], decodes)
        if named:
            context_panels(axes[-1][0], axes[-1][1], named)
        fig.tight_layout()
        _save_png(fig, path)
    finally:
        plt.close(fig)


LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LABEL_CHARS = 48


def variant_style(k: int) -> dict:
    """The k-th variant's line: 10 colours x 4 line styles, with markers, unique for 40 variants."""
    return {"color": f"C{k % 10}", "linestyle": LINESTYLES[(k // 10) % len(LINESTYLES)],
            "marker": MARKERS[k % len(MARKERS)]}


def _label(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 3] + "..."


def ablation_figure(rows: list[dict], variants: list[dict] | None = None):
    """tau and modelled speedup against num_steps, one line per variant, a style each (`variant_style`);
    one legend for both panels, outside them on the right, so 20 variants stay readable; curves with
    server step times share the variant's style with hollow markers. Variants holding acceptance by context
    (results/context.py: the per-start expectation at the profile's num_steps) add a third panel, tau by context."""
    plt = _pyplot()
    names = list(dict.fromkeys(r["variant"] for r in rows))
    server = any("speedup_server" in r for r in rows)
    context = {v["variant"]: v["by_context"] for v in variants or () if v.get("by_context")}
    fig, axes = plt.subplots(1, 3 if context else 2, figsize=(16.5 if context else 11,
                                                                4 + 0.12 * max(0, len(names) - 12)))
    ax1, ax2 = axes[0], axes[1]
    if context:
        _context_by_variant(axes[2], names, context)
    for k, name in enumerate(names):
        mine = [r for r in rows if r["variant"] == name]
        xs, style = [r["num_steps"] for r in mine], variant_style(k)
        ax1.plot(xs, [r["tau"] for r in mine], label=_label(name), **style)
        ax2.plot(xs, [r["speedup_model"] for r in mine], **style)
        if "speedup_server" in mine[0]:
            ax2.plot(xs, [r["speedup_server"] for r in mine], markerfacecolor="none", linewidth=0.8, **style)
    ax1.set(xlabel="num_steps", ylabel="tau (accepted + 1 per cycle)", title="accept length")
    ax2.set(xlabel="num_steps", ylabel="modelled speedup", title="S(k) = (1 + sum u_i) / (k c + r(k))")
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({r["num_steps"] for r in rows}))
    fig.tight_layout()
    fig.legend(*ax1.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.0, 0.98),
               fontsize="small", ncol=1 if len(names) <= 24 else 2, title="variant"
               + ("\n(hollow: server step times)" if server else ""), frameon=False)
    return fig


def _context_by_variant(ax, names: list[str], context: dict) -> None:
    """tau by context per variant (each in its `variant_style`), with the 95% interval over prompts."""
    trains = set()
    for k, name in enumerate(names):
        section = context.get(name)
        if section is None:
            continue
        buckets = [b for b in section["buckets"] if b["accept_length"]["value"] is not None]
        tau = [b["accept_length"] for b in buckets]
        err = [[t["value"] - (t["low"] if t["low"] is not None else t["value"]) for t in tau],
               [(t["high"] if t["high"] is not None else t["value"]) - t["value"] for t in tau]]
        ax.errorbar([_context_x(b) for b in buckets], [t["value"] for t in tau], yerr=err, capsize=2,
                    **variant_style(k))
        if section.get("train_context"):
            trains.add(section["train_context"])
    for t in sorted(trains):
        ax.axvline(t, color="grey", linestyle="--", linewidth=1)
    section = next(iter(context.values()))
    ax.set_xscale("log", base=2)
    ax.set(xlabel="context: the start's root position", ylabel="expected tokens per step",
           title=f"tau by context at num_steps {section['num_steps']} (95% interval)")


def plot_ablation(path: Path, rows: list[dict], variants: list[dict] | None = None) -> None:
    """ablate's PNG (`ablation_figure`), written atomically; the legend is kept whole (tight bounds)."""
    plt = _pyplot()
    fig = ablation_figure(rows, variants)
    try:
        _save_png(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)


def _save_png(fig, path, **savefig) -> None:
    """Render to memory, then write the file atomically (results/run_folder.write_atomic)."""
    import io

    from eagle_eval.results.run_folder import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, **savefig)
    write_atomic(path, buf.getvalue())
