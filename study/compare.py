"""Stage 3, ``python -m study.compare [overrides]``: statistics and report over every run.

Reads ``runs/VARIANT-sSEED/{metrics.json,curve.csv}`` for the variants x seeds
of conf/study.yaml and writes to ``study.reports_dir`` (default reports/):
  summary.json          per variant: n_seeds, val_loss_mean/sd (nats), parameters;
                        vs the baseline, paired by seed: mean difference, 95% CI,
                        paired t-test p-value (and Benjamini-Hochberg adjusted),
                        percent log-loss and perplexity change (arXiv 2603.13381)
  comparison.md         the same as tables, with the runs that diverged
  val_loss_curves.png   val loss (nats) against training tokens, mean over seeds, band = min..max
  final_val_loss.png    final val loss per variant, mean with its 95% interval
Diverged runs are reported as such and left out of the statistics.
"""
from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np

from study.config import run_dir, run_name, run_stage
from study import profiles
from study.data import DataError
from study.stats import fit_power_law, mean_ci, parameter_multiplier
from study.tracking import log_verdict

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


def load_runs(cfg, root: Path, variants=None, seeds=None, group: str = "") -> dict[str, dict[int, dict]]:
    """{variant: {seed: metrics.json + "curve": rows}} for the runs of one group.

    Args:
        variants, seeds: default study.variants and study.seeds.
        group: sub-folder of runs_dir ("" = the study's own runs; "tuned", "scale_ladder/MODEL" ...).

    Raises:
        DataError: a run has no metrics.json (with the command that makes it), or the runs
            that finished differ in token budget or tokenizer.
    """
    runs: dict[str, dict[int, dict]] = {}
    missing = []
    for variant in (cfg.study.variants if variants is None else variants):
        for seed in (cfg.study.seeds if seeds is None else seeds):
            d = run_dir(root, cfg, variant, seed, group)
            if not (d / "metrics.json").is_file():
                missing.append(f"`python -m study.train variant={variant} seed={seed}"
                               f"{' study.group=' + group if group else ''}`")
                continue
            try:
                m = json.loads((d / "metrics.json").read_text())
                with open(d / "curve.csv") as f:
                    m["curve"] = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
            except (OSError, ValueError) as e:
                raise DataError(f"{d}: unreadable metrics.json or curve.csv ({e}); re-run "
                                f"`python -m study.train variant={variant} seed={seed}`") from e
            runs.setdefault(variant, {})[seed] = m
    if missing:
        raise DataError(f"{len(missing)} run(s) {'of ' + group + ' ' if group else 'of the study '}have no "
                        f"metrics.json; run `dvc repro` or {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    budgets = {(m["tokens"], m["tokenizer"]) for r in runs.values() for m in r.values() if m["status"] == "ok"}
    if len(budgets) > 1:
        raise DataError(f"the runs {'of ' + group + ' ' if group else 'of the study '}differ in (tokens, tokenizer): "
                        f"{sorted(budgets)}; a fair comparison needs one budget: re-run the stale runs (`dvc repro`)")
    return runs


def summarize(cfg, runs: dict[str, dict[int, dict]], root: Path) -> dict:
    """The content of summary.json (see the module docstring)."""
    base_name = cfg.study.baseline
    ok = {v: {s: m["val_loss"] for s, m in r.items() if m["status"] == "ok" and m["val_loss"] is not None}
          for v, r in runs.items()}
    variants = {}
    for v, r in runs.items():
        losses = list(ok[v].values())
        any_run = next(iter(r.values()))
        mean, lo, hi = mean_ci(losses) if losses else (float("nan"),) * 3
        sd = float(np.std(losses, ddof=1)) if len(losses) > 1 else float("nan")
        variants[v] = {"n_seeds": len(losses), "val_loss_mean": mean, "val_loss_sd": sd, "val_loss_ci95": [lo, hi],
                       "val_perplexity_mean": math.exp(mean) if math.isfinite(mean) else float("nan"),
                       "non_embedding_params": any_run["non_embedding_params"],
                       "total_params": any_run["total_params"], "flops_per_token": any_run["flops_per_token"],
                       "tokens": any_run["tokens"],
                       "diverged": {str(s): m["reason"] for s, m in r.items() if m["status"] != "ok"}}
    vs = profiles.verdict(ok, base_name) if base_name in ok else {}
    return {"study": cfg.study.name, "baseline": base_name, "seeds": list(cfg.study.seeds),
            "variants": variants, "vs_baseline": vs, "frontier": frontier(base_name, ok, variants),
            "lr_sweep": profiles.lr_sweep_report(cfg, root, runs), "scale_ladder": profiles.ladder_report(cfg, root)}


def in_family(variant: str, base_name: str) -> bool:
    """The baseline family of the parameter frontier: the baseline and its MLP-width siblings."""
    return variant == base_name or variant.startswith(f"{base_name}_mlp")


def frontier(base_name: str, ok: dict[str, dict[int, float]], variants: dict) -> dict | None:
    """Equivalent parameter multiplier of every non-family variant (None with < 2 family sizes)."""
    family = {variants[v]["non_embedding_params"]: ok[v] for v in ok if in_family(v, base_name) and len(ok[v]) > 0}
    if len(family) < 2:
        return None
    sizes = sorted(family)
    slope, intercept = fit_power_law(sizes, [float(np.mean(list(family[n].values()))) for n in sizes])
    out = {"family": sorted(v for v in ok if in_family(v, base_name)), "slope": slope, "intercept": intercept,
           "multipliers": {}}
    for v in ok:
        if not in_family(v, base_name) and ok[v]:
            out["multipliers"][v] = parameter_multiplier(family, ok[v], variants[v]["non_embedding_params"])
    return out


def finite_or_null(obj):
    """NaN/inf -> None, recursively: summary.json stays strict JSON for `dvc metrics show`."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def _fmt(x, spec=".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def markdown(summary: dict, cfg) -> str:
    b = summary["baseline"]
    lines = [f"# {summary['study']}: comparison of attention variants", "",
             f"Model `{cfg.model.name}` ({cfg.model.n_layer} layers, n_embd {cfg.model.n_embd}, block_size "
             f"{cfg.model.block_size}), tokenizer `{cfg.data.tokenizer}`, {cfg.train.tokens:,} training tokens per "
             f"run, seeds {summary['seeds']}. Losses are final validation cross-entropy in nats on the same fixed "
             f"{cfg.train.val_tokens:,} validation tokens for every run.", "",
             "## Final validation loss per variant", "",
             "| variant | non-embedding params | vs baseline params | seeds | val loss mean | sd | 95% CI | perplexity |",
             "|---|---|---|---|---|---|---|---|"]
    bp = summary["variants"].get(b, {}).get("non_embedding_params")
    for v, s in summary["variants"].items():
        rel = f"{100 * (s['non_embedding_params'] / bp - 1):+.2f}%" if bp else "n/a"
        lines.append(f"| {v} | {s['non_embedding_params']:,} | {rel} | {s['n_seeds']} | {_fmt(s['val_loss_mean'])} | "
                     f"{_fmt(s['val_loss_sd'])} | [{_fmt(s['val_loss_ci95'][0])}, {_fmt(s['val_loss_ci95'][1])}] | "
                     f"{_fmt(s['val_perplexity_mean'], '.2f')} |")
    lines += ["", f"## Against `{b}`, paired by seed", "",
              "Mean difference = variant - baseline (nats; negative is better), with the paired-t 95% confidence "
              "interval; p from the two-sided paired t-test, p (BH) adjusted over the variants by "
              "Benjamini-Hochberg. Percent log-loss change = (L - L_base) / L_base; percent perplexity change = "
              "exp(L - L_base) - 1 (the paper's two figures).", "",
              "| variant | pairs | mean diff | 95% CI | p | p (BH) | log-loss change | its 95% CI | perplexity change |",
              "|---|---|---|---|---|---|---|---|---|"]
    for v, c in summary["vs_baseline"].items():
        lines.append(f"| {v} | {c['n_pairs']} | {_fmt(c['mean_diff'], '+.4f')} | [{_fmt(c['ci95'][0], '+.4f')}, "
                     f"{_fmt(c['ci95'][1], '+.4f')}] | {_fmt(c['p_value'], '.3g')} | {_fmt(c.get('p_value_bh'), '.3g')} | "
                     f"{_fmt(c['pct_log_loss'], '+.2f')}% | [{_fmt(c['pct_log_loss_ci95'][0], '+.2f')}%, "
                     f"{_fmt(c['pct_log_loss_ci95'][1], '+.2f')}%] | {_fmt(c['pct_perplexity'], '+.2f')}% |")
    f = summary.get("frontier")
    lines += ["", "## Parameter frontier", ""]
    if f:
        lines += [f"Baseline family {f['family']}: fitted log L = {f['intercept']:.4f} {f['slope']:+.4f} log N "
                  f"(N = non-embedding parameters). A variant's multiplier is the baseline size that would reach "
                  f"its mean loss divided by its own size (> 1: worth more parameters than it has); 95% percentile "
                  f"bootstrap over seeds.", "",
                  "| variant | multiplier | 95% CI | equivalent baseline params |", "|---|---|---|---|"]
        for v, mlt in f["multipliers"].items():
            lines.append(f"| {v} | {_fmt(mlt['multiplier'], '.3f')} | [{_fmt(mlt['ci95'][0], '.3f')}, "
                         f"{_fmt(mlt['ci95'][1], '.3f')}] | {_fmt(mlt['equivalent_params'], ',.0f')} |")
    else:
        lines.append("Needs at least two baseline sizes (e.g. `baseline` and `baseline_mlp4.75`) in study.variants.")
    diverged = [(v, s, r) for v, x in summary["variants"].items() for s, r in x["diverged"].items()]
    lines += ["", "## Diverged runs", ""]
    lines += [f"- {run_name(v, s)}: {r}" for v, s, r in diverged] or ["None."]
    lines += profiles.markdown(summary)
    lines += ["", "Figures: `val_loss_curves.png` (validation loss against training tokens, mean over seeds, "
              "band = range over seeds), `final_val_loss.png` (final loss per variant with its 95% interval), `frontier.png`, `lr_sweep.png`, `scale_ladder.png` "
              "(the profiles).", ""]
    return "\n".join(lines)


def figures(summary: dict, runs: dict[str, dict[int, dict]], out: Path) -> list[Path]:
    """Write the two PNG figures; return their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v, r in runs.items():
        curves = [m["curve"] for m in r.values() if m["status"] == "ok" and m["curve"]]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        tokens = np.array([row["tokens"] for row in curves[0][:n]])
        vals = np.array([[row["val_loss"] for row in c[:n]] for c in curves])
        ax.plot(tokens, vals.mean(0), color=color(v), label=f"{v} (n={len(curves)})")
        ax.fill_between(tokens, vals.min(0), vals.max(0), color=color(v), alpha=0.2, linewidth=0)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title("Validation loss, mean over seeds (band: min..max)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "val_loss_curves.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(summary["variants"])
    for i, v in enumerate(names):
        s = summary["variants"][v]
        lo, hi = s["val_loss_ci95"]
        err = [[s["val_loss_mean"] - lo], [hi - s["val_loss_mean"]]] if math.isfinite(lo) else None
        ax.errorbar([i], [s["val_loss_mean"]], yerr=err, fmt="o", color=color(v), capsize=6, markersize=8)
        seeds = [m["val_loss"] for m in runs[v].values() if m["status"] == "ok"]
        ax.scatter([i] * len(seeds), seeds, color=color(v), alpha=0.4, s=14)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("Final validation loss: mean, 95% interval, seeds")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    paths.append(out / "final_val_loss.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    f = summary.get("frontier")
    for v, s in summary["variants"].items():
        if math.isfinite(s["val_loss_mean"]):
            ax.scatter([s["non_embedding_params"]], [s["val_loss_mean"]], color=color(v), s=50, label=v, zorder=3)
    if f:
        sizes = [summary["variants"][v]["non_embedding_params"] for v in f["family"]]
        n = np.geomspace(min(sizes) * 0.8, max(sizes) * 1.2, 100)
        ax.plot(n, np.exp(f["intercept"] + f["slope"] * np.log(n)), color="grey", ls="--", label="baseline frontier fit")
    else:
        ax.text(0.5, 0.5, "frontier needs two baseline sizes", transform=ax.transAxes, ha="center", color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("Parameter frontier of the baseline family")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    paths.append(out / "frontier.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def _report(cfg, root: Path) -> int:
    runs = load_runs(cfg, root)
    out = root / cfg.study.reports_dir
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(cfg, runs, root)
    figures(summary, runs, out)
    profiles.figures(summary, out, color)
    (out / "comparison.md").write_text(markdown(summary, cfg))
    (out / "summary.json").write_text(json.dumps(finite_or_null(summary), indent=1))
    for v, c in summary["vs_baseline"].items():
        print(f"{v:>20s}: {c['pct_log_loss']:+.2f}% log-loss, {c['pct_perplexity']:+.2f}% perplexity "
              f"vs {summary['baseline']} (p={c['p_value']:.3g}, n={c['n_pairs']})")
    print(f"wrote {out / 'comparison.md'}")
    log_verdict(root, cfg, out)  # the verdict in MLflow: run "compare" (tag kind=verdict) with the report's files
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_stage(_report, argv)


if __name__ == "__main__":
    sys.exit(main())
