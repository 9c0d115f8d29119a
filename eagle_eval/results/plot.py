"""PNG of saved results: per-position acceptance curves and tau by category (matplotlib, optional).

Contract: `plot_results(results, path)` draws, for every result, the conditional rates a_i (solid)
and the unconditional rates u_i (dashed) against the draft position, and beside them tau per
category as grouped bars with the 95% normal interval of `compare.tau_se_cycles`. matplotlib is the optional
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


def plot_results(results: list[Result], path: str | Path) -> None:
    """Runs and server-checks (per-position curves and tau by category); other kinds are refused."""
    other = [r for r in results if getattr(r, "kind", "run") not in ("run", "server_check")]
    if other:
        raise ConfigError(f"--plot: {other[0].label} is {other[0].kind.replace('_', '-')} results; --plot draws runs "
                          "and server-checks (`eagle-eval ablate` writes its own ablation.png)")
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        _curves(left, results)
        _tau_bars(right, results)
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


def ablation_figure(rows: list[dict]):
    """tau and modelled speedup against num_steps, one line per variant, a style each (`variant_style`);
    one legend for both panels, outside them on the right, so 20 variants stay readable; curves with
    server step times share the variant's style with hollow markers."""
    plt = _pyplot()
    names = list(dict.fromkeys(r["variant"] for r in rows))
    server = any("speedup_server" in r for r in rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4 + 0.12 * max(0, len(names) - 12)))
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


def plot_ablation(path: Path, rows: list[dict]) -> None:
    """ablate's PNG (`ablation_figure`), written atomically; the legend is kept whole (tight bounds)."""
    plt = _pyplot()
    fig = ablation_figure(rows)
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
