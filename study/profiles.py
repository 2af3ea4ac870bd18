"""The two fairness profiles of the study: a learning-rate sweep and a scale ladder.

Both run through the same DVC pipeline and the same ``study.train`` stage; they
only choose *which* runs exist (see dvc.yaml and conf/study.yaml):

lr sweep (``lr_sweep.variants`` non-empty)
    ``runs/lr_sweep/lrLR/VARIANT-sSEED``: one short run (``lr_sweep.tokens``) per
    variant and peak lr of ``lr_sweep.lrs``; then ``runs/tuned/VARIANT-sSEED``: the
    full comparison over study.seeds with each variant at its best lr
    (``train.lr_from_sweep=true``).  The report sets the shared-lr verdict (the
    study's own runs) beside the tuned-lr verdict.

scale ladder (``scale_ladder.models`` non-empty)
    ``runs/scale_ladder/MODEL/VARIANT-sSEED``: every ladder variant x study.seeds at
    each model size, on tokens = ``tokens_per_param`` x the baseline's non-embedding
    parameters (compute grows with size; variants of one size get the same tokens).
    The report gives the effect against the baseline at each size with its 95%
    interval, a power-law fit of val loss against training FLOPs per variant, and
    each variant's compute multiplier at each size: the baseline compute that would
    reach its loss, divided by its own (> 1: the variant is worth more compute).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from study.config import RunConfig, load_config, run_name
from study.data import DataError
from study.stats import fit_power_law, mean_ci, paired, parameter_multiplier

SWEEP, TUNED, LADDER = "lr_sweep", "tuned", "scale_ladder"


# -- resolving a run's budget and learning rate ----------------------------------------------------
def sweep_results(cfg: RunConfig, root: Path, variant: str) -> list[dict]:
    """The lr-sweep runs of ``variant``, one per lr of ``lr_sweep.lrs``, in grid order.

    Returns: [{"lr", "val_loss" (nats, None when diverged), "status", "run"}].

    Raises:
        DataError: a grid point has no finished run (names the command that makes it).
    """
    found = {}
    seed = cfg.lr_sweep.seed
    for path in sorted((root / cfg.study.runs_dir / SWEEP).glob(f"*/{run_name(variant, seed)}/metrics.json")):
        m = json.loads(path.read_text())
        if m.get("lr") is not None:
            found[float(m["lr"])] = {"lr": float(m["lr"]), "val_loss": m["val_loss"], "status": m["status"],
                                     "tokens": m["tokens"], "run": str(path.parent)}
    out, missing = [], []
    tokens = cfg.lr_sweep.tokens // cfg.train.batch_tokens * cfg.train.batch_tokens  # whole steps
    for lr in cfg.lr_sweep.lrs:
        hit = [r for x, r in found.items() if math.isclose(x, float(lr), rel_tol=1e-9)]
        if hit and hit[0]["tokens"] == tokens:
            out.append(hit[0])
        else:
            missing.append(lr)
    if missing:
        raise DataError(f"the lr sweep of {variant!r} lacks finished runs at lr {missing} (seed {seed}, "
                        f"{cfg.lr_sweep.tokens:,} tokens) under {cfg.study.runs_dir}/{SWEEP}: run `dvc repro` with "
                        f"lr_sweep.variants including {variant!r} (README, 'A fair verdict')")
    return out


def best_lr(results: list[dict]) -> dict:
    """The best point of one variant's sweep: lowest final val_loss among runs that did not diverge.

    Returns: {"lr", "val_loss", "at_edge" (True when the best lr is the grid's smallest or largest:
    the optimum may lie outside the grid)}.

    Raises:
        DataError: every run of the sweep diverged.
    """
    ok = [r for r in results if r["status"] == "ok" and r["val_loss"] is not None]
    if not ok:
        raise DataError("every lr of the sweep diverged: lower lr_sweep.lrs")
    best = min(ok, key=lambda r: r["val_loss"])
    lrs = sorted(r["lr"] for r in results)
    return {"lr": best["lr"], "val_loss": best["val_loss"], "at_edge": best["lr"] in (lrs[0], lrs[-1])}


def resolve(cfg: RunConfig, root: Path) -> RunConfig:
    """Apply a run's derived settings before it is hashed and trained (in place; returns cfg).

    ``train.tokens_per_param`` sets ``train.tokens`` = tokens_per_param x the non-embedding
    parameters of the *baseline* at this model size, rounded down to whole steps of
    train.batch_tokens (at least one): every variant of one size trains on the same tokens.
    ``train.lr_from_sweep`` sets ``variant.lr`` to the variant's best swept lr (min_lr keeps
    the schedule's ratio, see :func:`study.config.peak_lr`).

    Raises:
        DataError: the lr sweep this run needs is missing or fully diverged.
    """
    if cfg.train.tokens_per_param is not None:
        from study.model import describe

        base = load_config([f"variant={cfg.study.baseline}"], root).variant
        n = describe(cfg.model, base)["non_embedding_params"]
        steps = max(1, int(cfg.train.tokens_per_param * n) // cfg.train.batch_tokens)
        cfg.train.tokens = steps * cfg.train.batch_tokens
    if cfg.train.lr_from_sweep:
        cfg.variant.lr = best_lr(sweep_results(cfg, root, cfg.variant.name))["lr"]
    return cfg


# -- reports -------------------------------------------------------------------------------------
def final_losses(runs: dict[str, dict[int, dict]]) -> dict[str, dict[int, float]]:
    """{variant: {seed: final val_loss (nats)}} of the runs that did not diverge."""
    return {v: {s: m["val_loss"] for s, m in r.items() if m["status"] == "ok" and m["val_loss"] is not None}
            for v, r in runs.items()}


def verdict(ok: dict[str, dict[int, float]], base: str) -> dict[str, dict]:
    """Every variant against ``base``, paired by seed (:func:`study.stats.paired`), with BH-adjusted p."""
    from study.stats import adjust

    out = {v: paired(ok[v], ok[base]) for v in ok if v != base}
    for v, p in adjust({v: c["p_value"] for v, c in out.items()}).items():
        out[v]["p_value_bh"] = p
    return out


def lr_sweep_report(cfg: RunConfig, root: Path, main_runs: dict[str, dict[int, dict]]) -> dict | None:
    """The lr-sweep profile's part of summary.json (None while the profile is off).

    Returns: {"lrs", "seed", "tokens", "shared_lr", "variants": {v: {"points": [{lr, val_loss, status}],
    "best_lr", "best_val_loss", "at_edge", "shared_val_loss_mean", "tuned_val_loss_mean", "tuning_gain"
    (tuned - shared, paired by seed)}}, "shared": verdict at train.lr, "tuned": verdict at each
    variant's best lr}.

    Raises:
        DataError: a sweep point or tuned run is missing, or a tuned run used another lr than the
            sweep's current best (stale: re-run ``dvc repro``).
    """
    from study.compare import load_runs

    sw, base = cfg.lr_sweep, cfg.study.baseline
    if not sw.variants:
        return None
    tuned_runs = load_runs(cfg, root, list(sw.variants), list(cfg.study.seeds), TUNED)
    shared_ok = final_losses({v: main_runs[v] for v in sw.variants})
    tuned_ok = final_losses(tuned_runs)
    variants = {}
    for v in sw.variants:
        points = sweep_results(cfg, root, v)
        best = best_lr(points)
        used = {m["lr"] for m in tuned_runs[v].values()}
        if any(not math.isclose(x, best["lr"], rel_tol=1e-9) for x in used):
            raise DataError(f"the tuned runs of {v!r} used lr {sorted(used)} but the sweep's best is now {best['lr']}: "
                            f"they are stale; re-run `dvc repro`")
        variants[v] = {"points": [{k: p[k] for k in ("lr", "val_loss", "status")} for p in points],
                       "best_lr": best["lr"], "best_val_loss": best["val_loss"], "at_edge": best["at_edge"],
                       "shared_val_loss_mean": float(np.mean(list(shared_ok[v].values()))) if shared_ok[v] else None,
                       "tuned_val_loss_mean": float(np.mean(list(tuned_ok[v].values()))) if tuned_ok[v] else None,
                       "tuning_gain": paired(tuned_ok[v], shared_ok[v])}
    return {"lrs": [float(x) for x in sw.lrs], "seed": sw.seed, "tokens": sw.tokens, "shared_lr": cfg.train.lr,
            "variants": variants, "shared": verdict(shared_ok, base), "tuned": verdict(tuned_ok, base)}


def effect_trend(sizes: list[dict], variant: str, base: str) -> dict:
    """Trend of the effect with scale: least-squares slope of the per-seed percent log-loss change
    (100 (L_v - L_base) / L_base, paired by seed) against log10 of the baseline's non-embedding
    parameters, with its 95% t interval (scipy.stats.linregress; n = sizes x seeds points).

    Returns: {"slope_pct_per_decade", "ci95", "p_value", "n_points"} (NaN with fewer than 3 points)."""
    from scipy import stats

    xs, ys = [], []
    for size in sizes:
        ok = size["_ok"]
        for s in sorted(set(ok.get(variant, {})) & set(ok.get(base, {}))):
            xs.append(math.log10(size["non_embedding_params"]))
            ys.append(100.0 * (ok[variant][s] - ok[base][s]) / ok[base][s])
    nan = float("nan")
    if len(xs) < 3 or len(set(xs)) < 2:
        return {"slope_pct_per_decade": nan, "ci95": [nan, nan], "p_value": nan, "n_points": len(xs)}
    fit = stats.linregress(xs, ys)
    t = stats.t.ppf(0.975, len(xs) - 2)
    return {"slope_pct_per_decade": float(fit.slope), "ci95": [float(fit.slope - t * fit.stderr),
            float(fit.slope + t * fit.stderr)], "p_value": float(fit.pvalue), "n_points": len(xs)}


def ladder_report(cfg: RunConfig, root: Path) -> dict | None:
    """The scale-ladder profile's part of summary.json (None while the profile is off).

    Returns: {"tokens_per_param", "sizes": [{"model", "n_layer", "n_head", "n_embd", "non_embedding_params"
    (the baseline's), "tokens", "variants": {v: {"n_seeds", "val_loss_mean", "val_loss_ci95",
    "non_embedding_params", "flops_per_token", "train_flops" (= flops_per_token x tokens)}},
    "vs_baseline": paired verdicts, "compute_multiplier": {v: ...}}], "fits": {v: {"slope",
    "intercept"}} of log L = intercept + slope log C (C: training FLOPs), "trend": {v: effect_trend}}.
    The compute multiplier of v at one size is C_base(L_v) / C_v, C_base(L) read off the baseline's
    fit over all sizes, with a joint-seed percentile bootstrap (:func:`study.stats.parameter_multiplier`,
    the same construction with compute in place of parameters).

    Raises:
        DataError: a ladder run is missing or the runs of one size differ in tokens.
    """
    from study.compare import load_runs

    la, base = cfg.scale_ladder, cfg.study.baseline
    if not la.models:
        return None
    sizes = []
    for model in la.models:
        runs = load_runs(cfg, root, list(la.variants), list(cfg.study.seeds), f"{LADDER}/{model}")
        ok = final_losses(runs)
        m = load_config([f"model={model}"], root).model
        size = {"model": model, "n_layer": m.n_layer, "n_head": m.n_head, "n_embd": m.n_embd, "variants": {},
                "_ok": ok}
        for v, r in runs.items():
            one = next(iter(r.values()))
            mean, lo, hi = mean_ci(list(ok[v].values())) if ok[v] else (float("nan"),) * 3
            size["variants"][v] = {"n_seeds": len(ok[v]), "val_loss_mean": mean, "val_loss_ci95": [lo, hi],
                                   "non_embedding_params": one["non_embedding_params"],
                                   "flops_per_token": one["flops_per_token"], "tokens": one["tokens"],
                                   "train_flops": float(one["flops_per_token"]) * one["tokens"],
                                   "diverged": {str(s): x["reason"] for s, x in r.items() if x["status"] != "ok"}}
        size["non_embedding_params"] = size["variants"][base]["non_embedding_params"]
        size["tokens"] = size["variants"][base]["tokens"]
        size["vs_baseline"] = verdict(ok, base)
        sizes.append(size)
    fits = {}
    for v in la.variants:
        pts = [(s["variants"][v]["train_flops"], s["variants"][v]["val_loss_mean"]) for s in sizes
               if math.isfinite(s["variants"][v]["val_loss_mean"])]
        if len({c for c, _ in pts}) >= 2:
            slope, intercept = fit_power_law([c for c, _ in pts], [x for _, x in pts])
            fits[v] = {"slope": slope, "intercept": intercept}
    family = {s["variants"][base]["train_flops"]: s["_ok"][base] for s in sizes if s["_ok"][base]}
    for s in sizes:
        s["compute_multiplier"] = {}
        for v in la.variants:
            if v == base or not s["_ok"][v] or len(family) < 2:
                continue
            mlt = parameter_multiplier(family, s["_ok"][v], s["variants"][v]["train_flops"])
            s["compute_multiplier"][v] = {"multiplier": mlt["multiplier"], "ci95": mlt["ci95"],
                                          "equivalent_flops": mlt["equivalent_params"],
                                          "bootstrap_defined": mlt.get("bootstrap_defined")}
    trend = {v: effect_trend(sizes, v, base) for v in la.variants if v != base}
    for s in sizes:
        s.pop("_ok")
    return {"tokens_per_param": la.tokens_per_param, "sizes": sizes, "fits": fits, "trend": trend}


def _f(x, spec=".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _pct(c: dict) -> str:
    lo, hi = c["pct_log_loss_ci95"]
    return f"{_f(c['pct_log_loss'], '+.2f')}% [{_f(lo, '+.2f')}, {_f(hi, '+.2f')}]"


def markdown(summary: dict) -> list[str]:
    """The profiles' sections of comparison.md (empty lines when both are off)."""
    lines = []
    sw, la, base = summary.get("lr_sweep"), summary.get("scale_ladder"), summary["baseline"]
    if sw:
        lines += ["", "## Learning-rate sweep: shared lr against tuned lr", "",
                  f"Each variant was trained once (seed {sw['seed']}, {sw['tokens']:,} tokens) at every peak lr of the "
                  f"grid; min_lr keeps the schedule's ratio. Final val loss (nats), best marked *:", "",
                  "| variant | " + " | ".join(f"lr {x:g}" for x in sw["lrs"]) + " | best lr |",
                  "|---|" + "---|" * (len(sw["lrs"]) + 1)]
        for v, r in sw["variants"].items():
            cells = [("*" if p["lr"] == r["best_lr"] else "") + (_f(p["val_loss"]) if p["status"] == "ok" else "diverged")
                     for p in r["points"]]
            edge = " (grid edge: the optimum may lie outside)" if r["at_edge"] else ""
            lines.append(f"| {v} | " + " | ".join(cells) + f" | {r['best_lr']:g}{edge} |")
        lines += ["", f"The two verdicts against `{base}`, each over all study seeds, paired by seed: percent log-loss "
                  f"change with its 95% interval, p (paired t) and p (BH). Shared: every variant at train.lr = "
                  f"{sw['shared_lr']:g}. Tuned: every variant, the baseline included, at its own best lr.", "",
                  "| variant | shared lr: change [95% CI] | p | tuned lr | tuned: change [95% CI] | p | "
                  "tuning gain of the variant itself |", "|---|---|---|---|---|---|---|"]
        for v, c in sw["shared"].items():
            t, r = sw["tuned"][v], sw["variants"][v]
            lines.append(f"| {v} | {_pct(c)} | {_f(c['p_value'], '.3g')} | {r['best_lr']:g} (baseline "
                         f"{sw['variants'][base]['best_lr']:g}) | {_pct(t)} | {_f(t['p_value'], '.3g')} | "
                         f"{_pct(r['tuning_gain'])} |")
        lines += ["", "What tuning alone changed, per variant (its tuned-lr runs against its shared-lr runs, paired by "
                  "seed; identical runs where the best lr is the shared one):", ""]
        lines += [f"- {v}: lr {sw['shared_lr']:g} -> {r['best_lr']:g}: {_pct(r['tuning_gain'])}"
                  for v, r in sw["variants"].items()]
    if la:
        lines += ["", "## Scale ladder: the effect against model size", "",
                  f"Every size trained on tokens = {la['tokens_per_param']:g} x the baseline's non-embedding "
                  f"parameters (the same tokens for every variant of a size). Change = percent log-loss change against "
                  f"`{base}` at that size, paired by seed, with its 95% interval. Compute multiplier = the baseline "
                  f"training compute that would reach the variant's loss (on the baseline's power-law fit of loss "
                  f"against training FLOPs over all sizes) divided by the variant's own; 95% joint-seed bootstrap.", "",
                  "| size | n_layer x n_embd | non-embedding params | tokens | variant | val loss | change [95% CI] | p | "
                  "compute multiplier [95% CI] |", "|---|---|---|---|---|---|---|---|---|"]
        for s in la["sizes"]:
            for v, c in s["vs_baseline"].items():
                mlt = s["compute_multiplier"].get(v, {})
                ci = mlt.get("ci95", [None, None])
                lines.append(f"| {s['model']} | {s['n_layer']} x {s['n_embd']} | {s['non_embedding_params']:,} | "
                             f"{s['tokens']:,} | {v} | {_f(s['variants'][v]['val_loss_mean'])} vs "
                             f"{_f(s['variants'][base]['val_loss_mean'])} | {_pct(c)} | {_f(c['p_value'], '.3g')} | "
                             f"{_f(mlt.get('multiplier'), '.3f')} [{_f(ci[0], '.3f')}, {_f(ci[1], '.3f')}] |")
        lines += ["", "Fits of log L = a + b log C (C: training FLOPs = FLOPs per token x tokens):", ""]
        lines += [f"- {v}: b = {f['slope']:+.4f}, a = {f['intercept']:.4f}" for v, f in la["fits"].items()]
        lines += ["", "Trend with scale: slope of the per-seed percent change against log10(parameters), "
                  "with its 95% interval (negative: the variant's advantage grows with size):", ""]
        lines += [f"- {v}: {_f(t['slope_pct_per_decade'], '+.2f')} points per decade "
                  f"[{_f(t['ci95'][0], '+.2f')}, {_f(t['ci95'][1], '+.2f')}], p {_f(t['p_value'], '.3g')} "
                  f"({t['n_points']} seed pairs)" for v, t in la["trend"].items()]
    return lines


def figures(summary: dict, out: Path, color) -> list[Path]:
    """reports/lr_sweep.png and reports/scale_ladder.png (a note in place of the plot while a profile is off)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sw, la, base = summary.get("lr_sweep"), summary.get("scale_ladder"), summary["baseline"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if sw:
        for v, r in sw["variants"].items():
            pts = [(p["lr"], p["val_loss"]) for p in r["points"] if p["status"] == "ok"]
            ax.plot(*zip(*pts), "o-", color=color(v), label=f"{v} (best {r['best_lr']:g})")
            ax.scatter([r["best_lr"]], [r["best_val_loss"]], color=color(v), s=160, marker="*", zorder=3)
        ax.axvline(sw["shared_lr"], color="grey", ls=":", label=f"shared lr {sw['shared_lr']:g}")
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("final validation loss (nats)")
        ax.set_title(f"lr sweep (seed {sw['seed']}, {sw['tokens']:,} tokens per point)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
    else:
        ax.text(0.5, 0.5, "lr-sweep profile not run (lr_sweep.variants is empty): make lr-sweep",
                transform=ax.transAxes, ha="center", color="grey")
        ax.set_axis_off()
    fig.tight_layout()
    paths = [out / "lr_sweep.png"]
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    if la:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        ax = axes[0]
        for v, fit in la["fits"].items():
            c = np.array([s["variants"][v]["train_flops"] for s in la["sizes"]])
            m = np.array([s["variants"][v]["val_loss_mean"] for s in la["sizes"]])
            ci = np.array([s["variants"][v]["val_loss_ci95"] for s in la["sizes"]], dtype=float)
            err = np.nan_to_num(np.abs(ci.T - m), nan=0.0)
            ax.errorbar(c, m, yerr=err, fmt="o", color=color(v), capsize=4, label=v)
            grid = np.geomspace(c.min() * 0.8, c.max() * 1.25, 50)
            ax.plot(grid, np.exp(fit["intercept"] + fit["slope"] * np.log(grid)), "--", color=color(v), lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("training FLOPs")
        ax.set_ylabel("final validation loss (nats)")
        ax.set_title("Loss against compute (fit per variant)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        n = [s["non_embedding_params"] for s in la["sizes"]]
        others = [v for v in la["fits"] if v != base] or list(la["trend"])
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
        axes[1].set_ylabel(f"log-loss change vs {base} (%), 95% CI")
        axes[1].set_title("Effect at each size")
        axes[2].axhline(1, color="black", lw=0.8)
        axes[2].set_ylabel("compute multiplier, 95% CI")
        axes[2].set_title(f"{base} compute to reach the variant's loss / its own")
        for ax in axes[1:]:
            ax.set_xscale("log")
            ax.set_xlabel("non-embedding parameters")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3, which="both")
    else:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.text(0.5, 0.5, "scale-ladder profile not run (scale_ladder.models is empty): make scale-ladder",
                transform=ax.transAxes, ha="center", color="grey")
        ax.set_axis_off()
    fig.tight_layout()
    paths.append(out / "scale_ladder.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
