"""The report's figures (matplotlib, Agg), drawn from the summary and the runs' curves.

Every figure is written only when what it shows exists (a profile's figure only when the profile ran, the per-corpus
chart only when the runs logged per-corpus losses); :func:`write_all` removes every other figure of its folder, which
is the report's own.  Token axes are in millions of training tokens from 0.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from study.analysis.stats import PAPER_PCT_LOG_LOSS

PALETTE = {"baseline": "#1f77b4", "identity_q": "#2ca02c", "nonlinear_q": "#d62728", "baseline_mlp4.75": "#9467bd",
           "residual_linear_q": "#ff7f0e", "nonlinear_q_nores": "#8c564b", "nonlinear_q_r4": "#e377c2",
           "nonlinear_q_r1": "#7f7f7f", "nonlinear_q_relu2": "#bcbd22", "nonlinear_q_silu": "#17becf",
           "nonlinear_k": "#aec7e8", "nonlinear_v": "#ffbb78", "identity_q_mlp4.5": "#98df8a",
           "baseline_mlp3.5": "#c5b0d5", "baseline_mlp4.5": "#c49c94", "baseline_mlp5": "#f7b6d2"}


def color(variant: str) -> str:
    """The colour of a variant, the same in every figure (and the notebook)."""
    if variant in PALETTE:
        return PALETTE[variant]
    import matplotlib
    return matplotlib.colors.to_hex(matplotlib.colormaps["tab20"](sum(map(ord, variant)) % 20))


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def panel(width: float = 7.0):
    """(fig, ax): one panel, 4.5 inches high."""
    return _plt().subplots(figsize=(width, 4.5))


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _plt().close(fig)
    return path


def finish(ax, title: str, ylabel: str, xlabel: str | None = None, xlog: bool = False, grid: str = "both") -> None:
    """Labels, title, legend and grid of one panel (log x axis when ``xlog``)."""
    if xlog:
        ax.set_xscale("log")
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis=grid, which="both" if xlog else "major")


def tokens_axis(ax) -> None:
    """x axis in millions of training tokens, from 0, without an offset or a "1e6" factor."""
    ax.set_xlim(left=0)
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.set_xlabel("training tokens (millions)")


def curves(runs: dict[str, dict[int, dict]], key: str, ax) -> None:
    """Mean over seeds of ``key`` (nats) against tokens, band = min..max over seeds, one line per arm."""
    for v, r in runs.items():
        cs = [m["curve"] for m in r.values() if m["status"] == "ok" and m["curve"]]
        cs = [c for c in cs if all(key in row for row in c)]
        if not cs:
            continue
        n = min(len(c) for c in cs)
        tokens = np.array([row["tokens"] for row in cs[0][:n]]) / 1e6
        vals = np.array([[row[key] for row in c[:n]] for c in cs], dtype=float)
        keep = np.isfinite(vals).all(0)
        ax.plot(tokens[keep], vals.mean(0)[keep], color=color(v), label=f"{v} (n={len(cs)})")
        ax.fill_between(tokens[keep], vals.min(0)[keep], vals.max(0)[keep], color=color(v), alpha=0.2, linewidth=0)
    tokens_axis(ax)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def loss_curves(runs, out: Path, key: str, title: str, name: str) -> Path:
    fig, ax = panel()
    curves(runs, key, ax)
    ax.set_ylabel(f"{'validation' if key == 'val_loss' else 'training'} loss (nats)")
    ax.set_title(title)
    return save(fig, out / name)


def verdict(v: dict, out: Path) -> Path:
    """The decided verdict (summary.json "verdict"): per comparison, each seed's paired difference (% log-loss of
    the reference), the mean with its 95% t interval, the +-margin band of equivalence and the one word."""
    fig, ax = panel()
    comps = v["comparisons"]
    m = v["margin_pct"]
    ax.axhspan(-m, m, color="#2ca02c", alpha=0.12, label=f"equivalent within +-{m:g}%")
    for i, (k, c) in enumerate(comps.items()):
        pct = [100.0 * x / c["ref_mean"] for x in c["diffs"]]
        col = color(v["arms"][c["arm"]]["variant"])
        ax.scatter([i - 0.15 + 0.02 * (j - (len(pct) - 1) / 2) for j in range(len(pct))], pct, color=col, alpha=0.5, s=16)
        mean, (lo, hi) = c["pct"]["mean"], c["pct"]["ci95"]
        if math.isfinite(lo):
            ax.errorbar([i + 0.15], [mean], yerr=[[mean - lo], [hi - mean]], fmt="o", color=col, capsize=6)
        ax.annotate(f"{c['word']} (n={c['n_pairs']})", (i + 0.15, hi if math.isfinite(hi) else mean),
                    xytext=(0, 6), textcoords="offset points", ha="center", fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(PAPER_PCT_LOG_LOSS, color="grey", ls="--", lw=0.8, label=f"paper's {PAPER_PCT_LOG_LOSS:+.2f}%")
    ax.set_xticks(range(len(comps)), list(comps), rotation=15)
    finish(ax, "The decided verdict: paired differences by seed; mean with 95% t interval",
           "log-loss change vs the reference (%)", grid="y")
    return save(fig, out / "verdict.png")


def position_loss(summary: dict, out: Path) -> Path:
    """Validation loss by position (tokens of context, log axis), mean over each arm's seeds, one line per arm;
    the bigram yardstick dashed and each no-context arm dotted (what the models score without context); an arm
    whose runs' positions.csv is missing or truncated ("position_note") is named in the legend as not drawn."""
    v = summary["verdict"]
    fig, ax = panel()
    yard = {r["arm"] for r in v.get("attention") or []}
    for a, r in v["arms"].items():
        if r.get("position_loss"):
            y = np.array(r["position_loss"], dtype=float)
            ax.plot(np.arange(1, len(y) + 1), y, color=color(a), ls=":" if a in yard else "-",
                    label=f"{a} (in-context gain {r['in_context_gain']:.3f})")
        elif r.get("position_note"):
            ax.plot([], [], " ", label=f"{a}: not drawn ({r.get('position_left_out')} run(s)' positions.csv "
                                       f"missing or truncated)")
    y = summary.get("yardsticks") or {}
    if y.get("available") and "all" in (y.get("bigram") or {}):
        ax.axhline(y["bigram"]["all"], color="black", ls="--", lw=1, label=f"bigram yardstick {y['bigram']['all']:.3f}")
    finish(ax, "Validation loss by position, mean over seeds", "validation loss (nats)",
           "position (tokens of context)", xlog=True)
    return save(fig, out / "position_loss.png")


def per_corpus(summary: dict, out: Path) -> Path:
    """Final validation loss per corpus and arm (mean over seeds), with the yardsticks as dashed lines."""
    pc = summary["per_corpus"]
    corpora, names = pc["corpora"], list(pc["arms"])
    y = summary.get("yardsticks") or {}
    fig, ax = panel(width=max(7, 1.8 * len(corpora) + 3))
    w = 0.6 / len(names)
    for k, v in enumerate(names):
        vals = [pc["arms"][v].get(c, np.nan) for c in corpora]
        ax.scatter(np.arange(len(corpora)) + (k - (len(names) - 1) / 2) * w, vals, color=color(v), s=40, label=v,
                   zorder=3)
    for name, ls in (("unigram", "--"), ("bigram", ":")):
        if y.get("available") and name in y:
            ax.hlines([y[name].get(c, np.nan) for c in corpora], np.arange(len(corpora)) - 0.4,
                      np.arange(len(corpora)) + 0.4, colors="black", linestyles=ls, label=f"{name} yardstick")
    ax.set_xticks(range(len(corpora)), corpora)
    finish(ax, "Validation loss per corpus (mean over seeds)", "final validation loss (nats)", grid="y")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))  # outside: the yardsticks span the panel
    return save(fig, out / "per_corpus.png")


def scale_ladder(summary: dict, out: Path) -> Path:
    plt = _plt()
    la, base = summary["scale_ladder"], summary["baseline"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    variants = list(la["sizes"][0]["variants"])
    for v in variants:
        c = np.array([s["variants"][v]["train_flops"] for s in la["sizes"]])
        m = np.array([s["variants"][v]["val_loss_mean"] for s in la["sizes"]])
        ci = np.array([s["variants"][v]["val_loss_ci95"] for s in la["sizes"]], dtype=float)
        err = np.nan_to_num(np.abs(ci.T - m), nan=0.0)
        ax.errorbar(c, m, yerr=err, fmt="o", color=color(v), capsize=4, label=v)
        if v in la["fits"]:
            fit = la["fits"][v]
            grid = np.geomspace(c.min(), c.max(), 50)
            ax.plot(grid, np.exp(fit["intercept"] + fit["slope"] * np.log(grid)), "--", color=color(v), lw=1)
    finish(ax, "Loss against compute" + ("" if la["fits"] else " (not fitted: fewer than 3 sizes)"),
           "final validation loss (nats)", "training FLOPs", xlog=True)
    n = [s["non_embedding_params"] for s in la["sizes"]]
    others = [v for v in variants if v != base]
    for k, v in enumerate(others):
        shift = 1 + 0.03 * (k - (len(others) - 1) / 2)
        pct = [s["vs_baseline"][v] for s in la["sizes"]]
        y = np.array([c["pct_log_loss"] for c in pct], dtype=float)
        lo = np.array([c["pct_log_loss_ci95"][0] for c in pct], dtype=float)
        hi = np.array([c["pct_log_loss_ci95"][1] for c in pct], dtype=float)
        axes[1].errorbar(np.array(n) * shift, y, yerr=np.nan_to_num([y - lo, hi - y]), fmt="o-", color=color(v),
                         capsize=4, label=v)
        mm = [s["compute_multiplier"].get(v, {}) for s in la["sizes"]]
        y = np.array([x.get("multiplier", np.nan) for x in mm], dtype=float)
        lo = np.array([(x.get("ci95") or [np.nan])[0] for x in mm], dtype=float)
        hi = np.array([(x.get("ci95") or [np.nan, np.nan])[1] for x in mm], dtype=float)
        axes[2].errorbar(np.array(n) * shift, y, yerr=np.nan_to_num([y - lo, hi - y]), fmt="o-", color=color(v),
                         capsize=4, label=v)
    axes[1].axhline(0, color="black", lw=0.8)
    finish(axes[1], "Effect at each size", f"log-loss change vs {base} (%), 95% CI", "non-embedding parameters",
           xlog=True)
    if any(s["compute_multiplier"] for s in la["sizes"]):
        axes[2].axhline(1, color="black", lw=0.8)
        finish(axes[2], f"{base} compute to reach the variant's loss / its own", "compute multiplier, 95% CI",
               "non-embedding parameters", xlog=True)
    else:
        axes[2].clear()
        axes[2].text(0.5, 0.5, "compute multiplier not fitted:\nfewer than 3 sizes", transform=axes[2].transAxes,
                     ha="center", color="grey")
        axes[2].set_axis_off()
    return save(fig, out / "scale_ladder.png")


def write_all(summary: dict, runs: dict[str, dict[int, dict]], out: Path) -> list[str]:
    """Write every figure that applies into ``out`` (created), delete every other figure there (an earlier report's
    that no longer applies); return the names written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [loss_curves(runs, out, "val_loss", "Validation loss, mean over seeds (band: min..max)",
                           "val_loss_curves.png"),
               loss_curves(runs, out, "train_loss", "Training loss (mean between evaluations), "
                           "mean over seeds", "train_loss_curves.png")] if runs else []
    if (summary.get("verdict") or {}).get("comparisons"):
        written.append(verdict(summary["verdict"], out))
    if any(r.get("position_loss") for r in ((summary.get("verdict") or {}).get("arms") or {}).values()):
        written.append(position_loss(summary, out))
    if (summary.get("per_corpus") or {}).get("arms"):
        written.append(per_corpus(summary, out))
    if summary.get("scale_ladder"):
        written.append(scale_ladder(summary, out))
    names = [p.name for p in written]
    for stale in out.glob("*.png"):  # the folder is the report's: a figure not written now is stale
        if stale.name not in names:
            stale.unlink()
    return names
