"""The decided verdict's part of summary.json ("verdict"): the test runs of every arm of ``study.arms`` (each at
its lr*, ``runs/test/ARM/VARIANT-sSEED``, trained by ``python -m study.test_runs``), each arm's own seed sd, every
comparison arm - reference paired by seed with Stein's interval, TOST and the paired t test, BH over all
comparisons, one word each, and the recipe decomposition (statistics: :mod:`study.analysis.decision`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from study.analysis.decision import compare_pair, decide, decomposition, frontier_worth, seed_list
from study.analysis.pairing import check
from study.analysis.runs import RunsError, final_losses, load_runs
from study.analysis.stats import mean_ci
from study.config.naming import RECIPE_KEYS, TEST_GROUP, TUNING_TABLE, testing_group
from study.config.task import task_fields
from study.tasks.common import fmt

#: the test stage's plan, under runs_dir/test: which seeds each arm needs (Stein's N from the first stage)
PLAN = "plan.json"


def no_context_arms(runs: dict[str, dict[int, dict]]) -> list[str]:
    """The arms whose runs recorded ``variant.context: self`` (each position attends to itself only): the
    no-context yardstick, whose loss above a reference is attention's share."""
    return [a for a, by_seed in runs.items()
            if by_seed and all(r["settings"].get("variant.context") == "self" for r in by_seed.values())]


def comparisons_of(cfg) -> list[tuple[str, str]]:
    """The (arm, reference) comparisons: study.pairs in order where set (each nonlinear arm against the linear arm
    of its own recipe), else every arm of study.arms that is not a reference against each reference."""
    if cfg.study.pairs:
        return [(str(p[0]), str(p[1])) for p in cfg.study.pairs]
    refs = list(cfg.study.references)
    return [(a, r) for a in cfg.study.arms if a not in refs for r in refs]


def attention_share(cfg, runs: dict[str, dict[int, dict]], ok: dict[str, dict[int, float]]) -> list[dict]:
    """What attention carries in this regime: for each no-context arm (:func:`no_context_arms`) and each reference
    of study.references, the paired difference
    no-context - reference (nats, by seed; 95% paired-t interval), the equivalence margin in nats (margin % of the
    reference's mean) and their ratio.  [] without a no-context arm.

    Returns: [{"arm", "reference", "n_pairs", "share" (nats), "ci95" [lo, hi], "margin_nats", "ratio"}].
    """
    out = []
    for a in no_context_arms(runs):
        for r in cfg.study.references:
            both = [s for s in ok.get(a, {}) if s in ok.get(r, {})]
            if not both:
                continue
            diffs = [ok[a][s] - ok[r][s] for s in both]
            m, lo, hi = mean_ci(diffs)
            margin = cfg.study.equivalence_margin / 100 * float(np.mean([ok[r][s] for s in both]))
            out.append({"arm": a, "reference": r, "n_pairs": len(both), "share": m, "ci95": [lo, hi],
                        "margin_nats": margin, "ratio": m / margin if margin > 0 else float("nan")})
    return out


def context_use(runs: dict[int, dict]) -> dict:
    """One arm's context use over its finished seeds: "in_context_gain" (mean, nats), "position_loss" (the mean
    per-position curve, nats at positions 1..block_size; None unless every finished run recorded a whole one) and
    "position_note" (why runs' curves are left out, in one line: a positions.csv missing, or holding fewer or more
    positions than the model.block_size its run recorded; None when none is) and "position_left_out" (how many)."""
    done = [(s, r) for s, r in sorted(runs.items()) if r["status"] == "ok"]
    gains = [r["in_context_gain"] for _, r in done if r.get("in_context_gain") is not None]
    curves, notes = [], []
    for s, r in done:
        c, block = r.get("position_loss"), (r.get("settings") or {}).get("model.block_size")
        where = f"{r.get('name') or 'seed ' + str(s)}/positions.csv"
        if not c:
            notes.append(f"{where} is missing")
        elif isinstance(block, int) and len(c) != block:
            notes.append(f"{where} holds {len(c)} positions, not the run's model.block_size {block} (truncated?)")
        else:
            curves.append(c)
    same = curves and not notes and len({len(c) for c in curves}) == 1
    return {"in_context_gain": float(np.mean(gains)) if gains else float("nan"),
            "position_loss": np.mean(curves, axis=0).tolist() if same else None,
            "position_note": "; ".join(notes[:3]) + (f" ({len(notes)} runs in all)" if len(notes) > 3 else "")
            if notes else None, "position_left_out": len(notes)}


def accuracy(runs: dict[int, dict]) -> dict:
    """One arm's (or variant's) final ``val_accuracy`` over its finished seeds (the mlm and mqar tasks record it:
    the share of scored positions whose argmax is the target, in [0, 1]): "val_accuracy_mean", "val_accuracy_sd"
    (NaN below 2 seeds), "val_accuracy_ci95" [lo, hi] (Student t over the seeds, as the loss's: NaN below 2
    seeds), "val_accuracy_n" (seeds); {} when no finished run recorded it (task lm)."""
    xs = [float(r["val_accuracy"]) for r in runs.values() if r["status"] == "ok" and r.get("val_accuracy") is not None]
    if not xs:
        return {}
    m, lo, hi = mean_ci(xs)
    return {"val_accuracy_mean": m, "val_accuracy_sd": float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan"),
            "val_accuracy_ci95": [lo, hi], "val_accuracy_n": len(xs)}


def comparison_name(arm: str, ref: str) -> str:
    return f"{arm} vs {ref}"


def all_seeds(cfg) -> list[int]:
    """Every seed the test stage may use, in order: study.seeds (Stein's first stage), then more up to max_seeds."""
    return seed_list(list(cfg.study.seeds), cfg.study.max_seeds, [*cfg.tune.seeds, *cfg.study.pilot_seeds])


def compare_all(cfg, ok: dict[str, dict[int, float]]) -> dict[str, dict]:
    """Every comparison (:func:`comparisons_of`) by :func:`decision.compare_pair`, BH-adjusted and worded."""
    s = cfg.study
    out = {comparison_name(a, r): {"arm": a, "reference": r,
                                   **compare_pair(ok.get(a, {}), ok.get(r, {}), all_seeds(cfg), len(s.seeds),
                                                  s.equivalence_margin, s.target_halfwidth, s.max_seeds)}
           for a, r in comparisons_of(cfg)}
    return decide(out)


def tuning_status(cfg, root: Path) -> dict[str, dict]:
    """{arm: {"status", "lr_star", "source"}} from the tuning table (tune.table_dir/table.json; {} without one)."""
    p = root / cfg.tune.table_dir / TUNING_TABLE
    if not p.is_file():
        return {}
    arms = json.loads(p.read_text()).get("arms", {})
    return {k: {x: a.get(x) for x in ("status", "lr_star", "source", "best_lr")} for k, a in arms.items()}


def read_plan(cfg, root: Path) -> dict:
    """runs/test/plan.json, the test stage's plan: {"seeds": {arm: [seed, ...]}, ...}.

    Raises:
        RunsError: it is missing, not JSON, or not a plan (one line naming the file and the stage that writes it).
    """
    p = root / cfg.study.runs_dir / TEST_GROUP / PLAN
    again = "`dvc repro -f test_runs`, or `python -m study.test_runs --params params.yaml`"
    try:
        plan = json.loads(p.read_text())
    except (OSError, ValueError):
        raise RunsError(f"{p} is missing or unreadable: run the test stage ({again})") from None
    seeds = plan.get("seeds") if isinstance(plan, dict) else None
    if not isinstance(seeds, dict) or not all(isinstance(x, list) and all(type(k) is int for k in x)
                                              for x in seeds.values()):
        raise RunsError(f"{p} is not the test stage's plan (it needs \"seeds\": {{ARM: [seed, ...]}}): restore it or "
                        f"run the test stage again ({again})")
    return plan


def check_planned_seeds(cfg, plan_path: Path, arm: str, seeds: list[int]) -> None:
    """Refuse a plan whose seeds for ``arm`` are not this study's: Stein's first stage (study.seeds) and seeds it may
    add (:func:`all_seeds`: never a tuning or pilot seed).

    Raises:
        RunsError: one line naming the plan, the arm, the seeds and the stage that writes the plan again.
    """
    first, allowed = list(cfg.study.seeds), all_seeds(cfg)
    if set(first) <= set(seeds) and set(seeds) <= set(allowed):
        return
    raise RunsError(f"{plan_path} plans seeds {seeds} for arm {arm!r}, but this study tests study.seeds={first} first, "
                    f"then up to study.max_seeds={cfg.study.max_seeds} in all, never a tuning or pilot seed: the plan "
                    f"was written for other settings; run the test stage again (`dvc repro -f test_runs`)")


def tested_runs(cfg, root: Path) -> dict[str, dict[int, dict]]:
    """{arm: {seed: run}}: the test runs of every arm of study.arms on the seeds of runs/test/plan.json.

    Raises:
        RunsError: the plan or a run it names is missing.
        PairingError: test runs differ in a setting other than the variant, its lr and the arms' own overrides.
    """
    s = cfg.study
    plan = read_plan(cfg, root)
    runs, ignore = {}, set()
    for a in s.arms:
        arm = cfg.arms[a]
        ignore.update(str(o).split("=", 1)[0].lstrip("+~") for o in arm.overrides)
        seeds = plan.get("seeds", {}).get(a)
        if seeds is None:
            raise RunsError(f"{root / s.runs_dir / TEST_GROUP / PLAN} plans no seeds for arm {a!r}: re-run the test "
                            f"stage (`dvc repro`)")
        runs[a] = load_runs(cfg, root, [arm.variant], seeds, group=testing_group(a), pair=False)[arm.variant]
        check_planned_seeds(cfg, root / s.runs_dir / TEST_GROUP / PLAN, a, seeds)
        for seed, run in runs[a].items():
            check_arm_run(cfg, root, a, seed, run)
    check(runs, "the test runs", ignore=tuple(sorted(ignore)))
    return runs


def _value(text: str):
    """An override's value as Hydra/OmegaConf reads it ("d2z", 1.0e-4, true, [1,2])."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.from_dotlist([f"x={text}"]))["x"]


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def arm_settings(cfg, name: str) -> dict:
    """{flat key: value} a test run of arm ``name`` must have recorded: ``lr`` (its peak lr: the arm's fixed lr, else
    tuned.lr[NAME]; absent when it has neither), the recipe fields (``model.*``/``data.*``/``train.*`` of
    :data:`study.config.naming.RECIPE_KEYS`) and the task's own settings (``task.*``), at the study's values, and
    every key its overrides set (their values)."""
    arm = cfg.arms[name]
    want = {k: cfg[k.split(".")[0]][k.split(".")[1]] for k in RECIPE_KEYS}
    want.update({f"task.{k}": cfg.task[k] for k in task_fields(cfg.task.name) or ()})
    for o in arm.overrides:
        key, _, text = str(o).partition("=")
        key = key.lstrip("+~")
        want[key if "." in key else f"{key}.name"] = _value(text)  # a group choice: the group's name
    lr = arm.lr if arm.lr is not None else cfg.tuned.lr.get(name)
    if lr is not None:
        want["lr"] = float(lr)
    return want


def check_arm_run(cfg, root: Path, name: str, seed: int, run: dict) -> None:
    """Refuse a test run of arm ``name`` whose recorded settings are not the arm's (:func:`arm_settings`): a run
    re-trained by hand without the arm's lr or overrides would stand in for the arm's.

    Raises:
        RunsError: one line naming the run, the first setting that differs, the command that re-trains it and
            `dvc repro -f test_runs` (which a dvc.lock written for params.yaml's new values needs).
    """
    from study.analysis.runs import train_hint_overrides
    from study.runfolder import train_command

    settings = run["settings"]
    got = {**settings, "lr": run.get("lr")}
    for key, want in arm_settings(cfg, name).items():
        if key != "lr" and key not in settings:
            continue  # a key runs of this code do not record: nothing to compare
        if not _same(got.get(key), want):
            group = testing_group(name)
            cmd = train_command(cfg.arms[name].variant, seed, group, train_hint_overrides(cfg, root, group))
            what = "peak lr" if key == "lr" else key
            raise RunsError(f"{run['name']} was trained at {what} {got.get(key)!r}, but arm {name!r} trains at "
                            f"{want!r}: it is not the arm's run at params.yaml's values (trained by hand without the "
                            f"arm's settings, or params.yaml changed after the test stage ran?); re-run it with {cmd}, or "
                            f"every test run at params.yaml's values with `dvc repro -f test_runs` (a plain `dvc repro` "
                            f"skips a test stage whose dvc.lock already records these values)")


def verdict_report(cfg, root: Path, runs: dict[str, dict[int, dict]] | None = None) -> dict | None:
    """summary.json's "verdict" (None while study.arms is empty), over ``runs`` ({arm: {seed: run}}: the test runs,
    read by :func:`tested_runs` when not given).

    Returns: {"arms": {arm: {"variant", "overrides", "lr", "lr_from" ("fixed"/"tuned"), "tuning" (status of its
    grid), "n_seeds", "val_loss_mean", "val_loss_sd" (its own, never pooled), "val_loss_ci95", "diverged"}},
    "comparisons": {"ARM vs REF": :func:`decision.compare_pair` + "p_value_bh", "tost_p_bh", "word", "verdict"},
    "margin_pct", "halfwidth_pct", "max_seeds", "n0", "decomposition", "attention" (:func:`attention_share`)};
    each arm also has "in_context_gain" and "position_loss" (:func:`context_use`) and, for the mlm and mqar tasks,
    its accuracy (:func:`accuracy`).

    Raises:
        RunsError: the plan or a run it names is missing.
        PairingError: test runs differ in a setting other than the variant, its lr and the arms' own overrides.
    """
    s = cfg.study
    if not s.arms:
        return None
    runs = tested_runs(cfg, root) if runs is None else runs
    ok = final_losses(runs)
    tuning = tuning_status(cfg, root)
    arms = {}
    for a in s.arms:
        xs = list(ok[a].values())
        m, lo, hi = mean_ci(xs) if xs else (float("nan"),) * 3
        one = next(iter(runs[a].values()), {})
        arms[a] = {"variant": cfg.arms[a].variant, "overrides": [str(o) for o in cfg.arms[a].overrides],
                   "lr": one.get("lr"), "lr_from": "fixed" if cfg.arms[a].lr is not None else "tuned",
                   "tuning": None if cfg.arms[a].lr is not None else (tuning.get(a) or {}).get("status"),
                   "n_seeds": len(xs), "val_loss_mean": m,
                   "val_loss_sd": float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan"),
                   "val_loss_ci95": [lo, hi], **context_use(runs[a]), **accuracy(runs[a]),
                   "diverged": {str(k): r.get("reason") for k, r in runs[a].items() if r["status"] != "ok"}}
    comps = compare_all(cfg, ok)
    for c in comps.values():
        unbracketed = [x for x in (c["arm"], c["reference"]) if arms[x]["tuning"] == "optimum not bracketed"]
        c["not_bracketed"] = unbracketed
        if unbracketed:
            c["verdict"] += f"; optimum not bracketed for {', '.join(unbracketed)}"
        for x in (c["arm"], c["reference"]):
            k = len(arms[x]["diverged"])
            if k:
                c["verdict"] += f"; {x} diverged on {k} of {k + arms[x]['n_seeds']} seeds"
        c["more"] = more_seeds(c, runs, s.jobs)
        if c["more"]:
            c["verdict"] += f"; {c['more']['seeds']} more seed(s) per arm{decide_hint(cfg, c['more'])}"
    d = cfg.decomposition
    dec = decomposition(ok, list(d.rows), d.start, d.end, d.linear) if d.rows else None
    params = {a: r["non_embedding_params"] for a, rs in runs.items() for r in rs.values() if r.get("non_embedding_params")}
    front = frontier_worth(ok, params, list(d.family), list(d.worth)) if d.family else None
    return {"arms": arms, "comparisons": comps, "margin_pct": s.equivalence_margin, "halfwidth_pct": s.target_halfwidth,
            "max_seeds": s.max_seeds, "n0": len(s.seeds), "decomposition": dec, "frontier": front, "attention":
            attention_share(cfg, runs, ok),
            "seed_roles": {"tuning": list(cfg.tune.seeds) if any(cfg.arms[a].lr is None for a in s.arms) else [],
                           "pilot": list(s.pilot_seeds),
                           "test": sorted({x for by_seed in runs.values() for x in by_seed})}}


def more_seeds(c: dict, runs: dict[str, dict[int, dict]], jobs: int) -> dict | None:
    """What deciding an undecided comparison would take: {"seeds": Stein's N minus the pairs in (per arm), "n_needed":
    Stein's N, "minutes":
    that many runs of both arms at the mean wall time of their runs so far, ``jobs`` at once (None without recorded
    wall times)}; None when the comparison is decided or Stein's N is in."""
    need = c["stein"]["n_needed"]
    if c["word"] != "undecided" or need is None or need <= c["n_pairs"]:
        return None
    walls = [r.get("wall_time_s") for x in (c["arm"], c["reference"]) for r in runs.get(x, {}).values()]
    walls = [w for w in walls if isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0]
    k = need - c["n_pairs"]
    return {"seeds": k, "n_needed": int(need),
            "minutes": 2 * k * sum(walls) / len(walls) / max(1, int(jobs)) / 60 if walls else None}


def decide_hint(cfg, more: dict) -> str:
    """How long the seeds ``more`` asks for take, and the command that runs them: `make decide` for the default
    study (runs/, task lm), ``study.max_seeds=N`` beside this study's own overrides for any other."""
    minutes = more["minutes"]
    took = "" if not minutes else (f", about {minutes:.0f} min" if minutes >= 1 else ", under a minute")
    took += f" at study.jobs={cfg.study.jobs}" if took else ""
    default = str(cfg.study.runs_dir).rstrip("/") == "runs" and cfg.task.name == "lm"
    how = "`make decide`" if default else f"the test stage again with study.max_seeds={more['n_needed']}"
    return f"{took} ({how})"



def lost(r: dict) -> str:
    """" (+k diverged)" after an arm's finished seeds, or nothing."""
    return f" (+{len(r['diverged'])} diverged)" if r["diverged"] else ""


def seed_roles_line(v: dict) -> list[str]:
    """The line that says which seeds served what (tuning, choosing the default, testing; disjoint by the config's
    checks), followed by a blank line; nothing for a verdict recorded without them."""
    roles = v.get("seed_roles")
    if not roles:
        return []
    show = (lambda xs: ", ".join(map(str, xs)) or "none")  # noqa: E731
    return [f"Seeds, each with one purpose: tuning {show(roles['tuning'])} (conf/tuning/); choosing the default "
            f"{show(roles['pilot'])} (docs/history.md); testing {show(roles['test'])}.", ""]


def claim_words(c: dict) -> str:
    """The paper's claim in one cell: ``excluded (p 0.001)``, ``not excluded (p 0.31)`` or ``n/a``."""
    excluded = (c.get("claim") or {}).get("excluded")
    if excluded is None:
        return "n/a"
    return f"{'excluded' if excluded else 'not excluded'} (p {fmt(c['claim_p_bh'], '.3g')})"


def verdict_section(v: dict) -> list[str]:
    """comparison.md's section of the decided verdict (every number a field of summary.json "verdict"); the arms'
    accuracy replaces the in-context gain (an lm measure) where the runs recorded one (tasks mlm, mqar)."""
    acc = any("val_accuracy_mean" in r for r in v["arms"].values())
    lines = ["", "## The decided verdict", ""] + (["![verdict](figures/verdict.png)", ""] if v["comparisons"] else []) + [
             f"Every arm at its lr* (conf/tuned.yaml, or its fixed lr) on the test seeds; Stein's first stage is the "
             f"first {v['n0']} seeds, from whose paired sd each comparison's N follows (target half-width "
             f"{v['halfwidth_pct']:g}% log-loss, at most {v['max_seeds']} seeds). Equivalence margin "
             f"+-{v['margin_pct']:g}% log-loss (TOST, statsmodels' ttost_paired); Benjamini-Hochberg over all "
             f"comparisons (paired t and TOST each). Stein's mean +- d covers with probability >= 95% once N pairs are in; "
             f"the exact 95% interval is mean +- t(0.975, n0 - 1) s0 / sqrt(n), s0 the first stage's sd (exact "
             f"coverage: the pivot is Student t whatever the true sd). Each arm's seed sd is its own, never pooled.",
             "", *seed_roles_line(v), 
             "| arm | variant | overrides | lr | lr from | tuning | seeds | val loss mean | sd | 95% CI | "
             + ("val accuracy mean | accuracy 95% CI |" if acc else "in-context gain |"),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if acc else "")]
    for a, r in v["arms"].items():
        lo, hi = r.get("val_accuracy_ci95") or (None, None)
        lines.append(f"| {a} | {r['variant']} | {' '.join(r['overrides']) or '-'} | {fmt(r['lr'], '.4g')} | "
                     f"{r['lr_from']} | {r['tuning'] or ('-' if r['lr_from'] == 'fixed' else 'n/a')} | {r['n_seeds']}{lost(r)} | {fmt(r['val_loss_mean'])} | "
                     f"{fmt(r['val_loss_sd'])} | [{fmt(r['val_loss_ci95'][0])}, {fmt(r['val_loss_ci95'][1])}] | "
                     + (f"{fmt(r.get('val_accuracy_mean'))} | [{fmt(lo)}, {fmt(hi)}] |" if acc
                        else f"{fmt(r.get('in_context_gain'))} |"))
    lines += ["", "| comparison | verdict | pairs | mean diff (nats) | paired sd | % log-loss | 95% t CI (%) | "
              "Stein mean +- d (%) | Stein exact 95% (%) | Stein N | 90% CI (%) | p (t, BH) | p (TOST, BH) | "
              "the paper's -2.40% (p, BH) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if not v["comparisons"]:
        lines += ["| (none: every arm of study.arms is a reference; list another arm to compare it) | | | | | | | | | | | | | |"]
    for k, c in v["comparisons"].items():
        p, st = c["pct"], c["stein"]
        lines.append(f"| {k} | **{c['word']}**{c['verdict'][len(c['word']):]} | {c['n_pairs']} | {fmt(c['mean_diff'], '+.4f')} | "
                     f"{fmt(c['sd_diff'])} | {fmt(p['mean'], '+.2f')} | [{fmt(p['ci95'][0], '+.2f')}, "
                     f"{fmt(p['ci95'][1], '+.2f')}] | [{fmt(p['stein'][0], '+.2f')}, {fmt(p['stein'][1], '+.2f')}]"
                     f"{' (>= 95%)' if st['n_needed'] is not None and c['n_pairs'] >= st['n_needed'] else ' (< N pairs)'} | "
                     f"[{fmt(p['stein_exact'][0], '+.2f')}, {fmt(p['stein_exact'][1], '+.2f')}] | "
                     f"{st['n_needed'] if st['n_needed'] is not None else 'n/a'} | "
                     f"[{fmt(p['ci90'][0], '+.2f')}, {fmt(p['ci90'][1], '+.2f')}] | {fmt(c['p_value_bh'], '.3g')} | "
                     f"{fmt(c['tost_p_bh'], '.3g')} | {claim_words(c)} |")
    if v["comparisons"]:
        lines += ["", "The paper's claim (arXiv 2603.13381: -2.40% log-loss) is tested for each comparison by a one-sided "
                      "paired t test of \"the effect is at least as large as claimed\" (Benjamini-Hochberg over the "
                      "comparisons): excluded when p < 0.05."]
    dec = v.get("decomposition")
    if dec:
        lines += ["", "### The recipe decomposition", "",
                  "| arm | seeds | val loss mean | sd | 95% CI |", "|---|---|---|---|---|"]
        for r in dec["rows"]:
            lines.append(f"| {r['arm']} | {r['n_seeds']} | {fmt(r['mean'])} | {fmt(r['sd'])} | "
                         f"[{fmt(r['ci95'][0])}, {fmt(r['ci95'][1])}] |")
        ci = dec.get("gap_ci95") or [None, None]
        head = (f"Gap {dec['start']} -> {dec['end']}: {fmt(dec['gap'], '+.4f')} nats (paired 95% interval "
                f"[{fmt(ci[0], '+.4f')}, {fmt(ci[1], '+.4f')}])")
        lines += ["", head + (f"; the linear recipe alone ({dec['linear']}) closes {100 * dec['share']:.0f}% of it"
                              if dec["share"] is not None else f"; {dec.get('note') or 'no share'}")
                  + " (the follow-up measured 88% at GPT-3 Large)."]
    return lines + frontier_lines(v.get("frontier"))


def frontier_lines(f: dict | None) -> list[str]:
    """comparison.md's parameter frontier of the decided verdict (summary.json "verdict" "frontier")."""
    if not f:
        return []
    lines = ["", "### The parameter frontier", "",
             "The baseline family's arms, each at its own lr*: log L = intercept + slope log N (N: non-embedding "
             "parameters), and what each priced arm is worth on it: the N of the family whose loss it reaches, over "
             "its own N (above 1: worth more parameters than it has). 95% interval: Student t over the seeds' own "
             "log multipliers (each seed's own frontier and loss).", "",
             "| family arm | non-embedding params | seeds | val loss mean |", "|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['non_embedding_params'] or 0:,} | {r['n_seeds']} | {fmt(r['mean'])} |" for r in f["family"]]
    if not f["fitted"]:
        return lines + ["", f"Frontier {f['reason']}."]
    lo, hi = f.get("slope_ci95") or (None, None)
    lines += ["", f"Slope {f['slope']:+.4f} (log nats per log parameter), 95% interval [{fmt(lo, '+.4f')}, "
                  f"{fmt(hi, '+.4f')}]" + ("." if f.get("falls") else
                  ": the family's loss does not fall measurably with its size, so no arm's worth in parameters can "
                  "be read off it; the multipliers below are the line's arithmetic, not a measurement."), "",
              "| arm | non-embedding params | worth (params) | multiplier | 95% interval |", "|---|---|---|---|---|"]
    for a, w in f["worth"].items():
        lines.append(f"| {a} | {w['non_embedding_params']:,} | {fmt(w['equivalent_params'], ',.0f')} | "
                     f"{fmt(w['multiplier'], '.3f')} | [{fmt(w['ci95'][0], '.3f')}, {fmt(w['ci95'][1], '.3f')}]"
                     f"{' (' + w['ci_note'] + ')' if w.get('ci_note') else ''}"
                     f"{' (extrapolated: outside the family sizes)' if w.get('extrapolated') else ''} |")
    return lines
