"""comparison.md: the summary (:mod:`study.analysis.summary`) as markdown tables.

Nothing is computed here; every figure printed is a field of summary.json.  Undefined values
print as "n/a" with the reason beside them, never as "nan" or "p = 0".
"""
from __future__ import annotations

import math

from study.analysis.stats import PAPER_PCT_LOG_LOSS
from study.config import run_name
from study.tasks import get_task
from study.tasks.common import fmt


def pct_ci(c: dict) -> str:
    """"+1.23% [-0.50, +2.96]": a paired comparison's percent log-loss change and its 95% interval."""
    lo, hi = c["pct_log_loss_ci95"]
    if c.get("undefined"):
        return f"{fmt(c['pct_log_loss'], '+.2f')}% (no interval: {c['undefined']})"
    return f"{fmt(c['pct_log_loss'], '+.2f')}% [{fmt(lo, '+.2f')}, {fmt(hi, '+.2f')}]"


def p_text(c: dict, key: str = "p_value") -> str:
    """The p-value, or why the test is undefined (zero variance, one pair): never "nan" or "0"."""
    if c.get("undefined"):
        return f"undefined ({c['undefined']})"
    return fmt(c.get(key), ".3g")


def detectable(c: dict) -> str:
    """The smallest percent log-loss change detectable at 80% power with these pairs, or why none."""
    pw = c["power"]
    mde = pw["min_detectable_pct"]
    return f"{fmt(mde, '.2f')}%" if mde is not None and math.isfinite(mde) else f"n/a ({pw['note']})"


def header(summary: dict) -> list[str]:
    """The title and the settings the runs recorded (not conf/study.yaml's)."""
    s = summary.get("settings") or {}
    lines = [f"# {summary['study']}: comparison of attention variants", ""]
    if not s:
        return lines + ["The runs recorded no settings.", ""]

    def g(key, spec=""):
        v = s.get(key)
        return "n/a" if v is None else (format(v, spec) if spec and isinstance(v, (int, float)) else str(v))
    first = " (Stein's first stage: each arm's seeds are in the decided verdict)" if summary.get("verdict") else ""
    words = get_task(summary.get("task", "lm")).report_text(s)
    lines += [f"Settings as recorded by every run (`config.json`; the runs pair only because they agree on all of "
              f"these): model `{g('model.name')}` ({g('model.n_layer')} layers, {g('model.n_head')} heads, n_embd "
              f"{g('model.n_embd')}, block_size {g('model.block_size')}); data: "
              f"tokenizer `{g('data.tokenizer')}` ({words['ids']}), corpora {g('data.corpora')}, prepared-data digest "
              f"`{g('data_digest')}`; training: {g('train.tokens', ',')} tokens per run in steps of "
              f"{g('train.batch_tokens', ',')} tokens, warmup {g('train.warmup_tokens', ',')} tokens, weight decay "
              f"{g('train.weight_decay')}, betas ({g('train.beta1')}, {g('train.beta2')}), grad clip "
              f"{g('train.grad_clip')}, precision `{g('trainer.precision')}`; seeds {summary['seeds']}{first}. "
              + words["losses"]
              + "Each arm's peak lr is in the verdict's table; all recorded settings are listed at the end.", ""]
    return lines + words["lines"]


def corpus_table(summary: dict) -> list[str]:
    """Each arm's final loss per corpus (beside the yardsticks), and each comparison's paired change per corpus."""
    pc = summary.get("per_corpus")
    if not pc:
        return []
    if pc.get("note"):
        return ["", "## Per corpus", "", f"Not shown: {pc['note']}."]
    y = summary.get("yardsticks") or {}
    words = get_task(summary.get("task", "lm")).report_text(summary.get("settings") or {})
    marks = [k for k in words["corpus_yardsticks"] if y.get("available") and k in y]
    names, comps = list(pc["arms"]), list(pc["comparisons"])
    lines = ["", "## Per corpus", "",
             "Final validation loss (nats, mean over seeds) on each corpus's validation windows"
             + (", beside the yardsticks" if marks else "") + "; each comparison's change is paired by seed "
             "(percent log-loss of the reference, 95% t interval).", "",
             "| corpus | " + " | ".join(names) + "".join(f" | {k}" for k in marks) + " |",
             "|---|" + "---|" * (len(names) + len(marks))]
    for c in pc["corpora"]:
        cells = [fmt(pc["arms"][a].get(c)) for a in names]
        lines.append(f"| {c} | " + " | ".join(cells) + "".join(f" | {fmt(y[k].get(c))}" for k in marks) + " |")
    if comps:
        lines += ["", "| corpus | " + " | ".join(comps) + " |", "|---|" + "---|" * len(comps)]
        lines += [f"| {c} | " + " | ".join(pct_ci(pc["comparisons"][k][c]) for k in comps) + " |" for c in pc["corpora"]]
    return lines


def attention_logit_table(summary: dict) -> list[str]:
    """Final attn_logit_max per layer and arm (mean over seeds); nothing where no run recorded it."""
    rows = summary.get("attn_logit_max") or {}
    if not rows:
        return []
    n = max(len(x) for x in rows.values())
    lines = ["", "## Attention logits", "",
             "The largest attention logit at the last evaluation, max |q.k| x scale over the first validation batch, "
             "heads and causal positions, per layer (mean over seeds): its growth precedes divergence "
             "(arXiv 2309.14322); QK-norm bounds it by sqrt(head_dim) x scale x the gains.", "",
             "| arm | " + " | ".join(f"L{i}" for i in range(n)) + " | largest |", "|---|" + "---|" * (n + 1)]
    for a, x in rows.items():
        cells = [fmt(x[i], ".2f") if i < len(x) else "" for i in range(n)]
        lines.append(f"| {a} | " + " | ".join(cells) + f" | {fmt(max(x), '.2f')} |")
    return lines


def _lrs(r: dict) -> str:
    """" (lr 0.00434)" after a ladder variant's name: the peak lr its runs trained at."""
    return f" (lr {', '.join(format(x, '.3g') for x in r.get('lr') or [])})" if r.get("lr") else ""


def ladder_section(la: dict, base: str) -> list[str]:
    lines = ["", "## Scale ladder: the effect against model size", "",
             f"Every size trained on tokens = {la['tokens_per_param']:g} x the baseline's non-embedding "
             f"parameters (the same tokens for every variant of a size). Change = percent log-loss change against "
             f"`{base}` at that size, paired by seed, with its 95% interval. Compute multiplier = the baseline "
             f"training compute that would reach the variant's loss (on the baseline's power-law fit of loss "
             f"against training FLOPs over all sizes) divided by the variant's own; 95% t interval over the seeds' "
             f"own log multipliers. " + (("Each variant trains at the lr* tuned at its size by the same rule as the default "
                                           "size (conf/tuned.yaml tuned.size, `make ladder-tune`; conf/tuning/MODEL/)."
                                           if la.get("lr_per_size") else
                                           "Each variant trains at the lr* of its arm in conf/tuned.yaml, unchanged at "
                                          "every size (the transfer rule; `make ladder-check` checks it at one size).")
                                          if la.get("lr_from_tuned") else "Every variant trains at train.lr.") +
             " The lr of each is beside its name. In-context gain: mean loss at positions 1-4 minus the mean over the "
             "window's last quarter (nats; near 0: attention does little at that size).", "",
             "| size | n_layer x n_embd | non-embedding params | tokens | variant | val loss | in-context gain | "
             "change [95% CI] | p | detectable at 80% power | compute multiplier [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in la["sizes"]:
        for v, c in s["vs_baseline"].items():
            m = s["compute_multiplier"].get(v)
            if m is None:
                mult = f"n/a ({la.get('fit_note') or 'no fit'})"
            else:
                mult = (f"{fmt(m['multiplier'], '.3f')} " + (f"[{fmt(m['ci95'][0], '.3f')}, {fmt(m['ci95'][1], '.3f')}]"
                                                            if not m.get("ci_note") else f"({m['ci_note']})"))
            lines.append(f"| {s['model']} | {s['n_layer']} x {s['n_embd']} | {s['non_embedding_params']:,} | "
                         f"{s['tokens']:,} | {v}{_lrs(s['variants'][v])} | {fmt(s['variants'][v]['val_loss_mean'])} vs "
                         f"{fmt(s['variants'][base]['val_loss_mean'])} | "
                         f"{fmt(s['variants'][v].get('in_context_gain'), '.3f')} vs "
                         f"{fmt(s['variants'][base].get('in_context_gain'), '.3f')} | {pct_ci(c)} | {p_text(c)} | "
                         f"{detectable(c)} | {mult} |")
    lines += ["", "Fits of log L = a + b log C (C: training FLOPs = FLOPs per token x tokens):", ""]
    lines += ([f"- {v}: b = {f['slope']:+.4f}, a = {f['intercept']:.4f}" for v, f in la["fits"].items()]
              or [f"- {la.get('fit_note') or 'not fitted'}"])
    fitted = [(z["model"], z["baseline_fit"]) for z in la["sizes"] if z.get("baseline_fit")]
    if fitted:
        lines += ["", "The baseline's fit at each size (fitted / measured loss, nats): " + "; ".join(
            f"{m} {f['fitted']:.4f} / {f['fitted'] + f['residual']:.4f} (residual {f['residual']:+.4f})"
            for m, f in fitted) + ". A compute multiplier reads the variant's loss off this fit: where the residual "
            "is larger than the variant's difference from the baseline, the multiplier measures the fit's miss, "
            "not the variant."]
    lines += ["", "Trend with scale: slope of the per-seed percent change against log10(parameters), "
              "with its 95% interval (negative: the variant's advantage grows with size):", ""]
    lines += [f"- {v}: {fmt(t['slope_pct_per_decade'], '+.2f')} points per decade "
              f"[{fmt(t['ci95'][0], '+.2f')}, {fmt(t['ci95'][1], '+.2f')}], p {fmt(t['p_value'], '.3g')} "
              f"({t['n_points']} seed pairs){' - ' + t['note'] if t.get('note') else ''}" for v, t in la["trend"].items()]
    return lines + _extrapolation(la["trend"])


def _extrapolation(trend: dict) -> list[str]:
    """The trend's line at the paper's size (GPT-3 small), said as the extrapolation it is."""
    at = [(v, t["at"]) for v, t in trend.items() if t.get("at") and math.isfinite(t["at"]["effect_pct"])]
    if not at:
        return []
    n = 10 ** at[0][1]["x"]
    return ["", f"The line at the paper's size ({n / 1e6:.2f}M non-embedding parameters, GPT-3 small, "
            f"{at[0][1]['decades_beyond']:.1f} decades beyond the largest size): " + "; ".join(
                f"{v} {fmt(a['effect_pct'], '+.2f')}% [{fmt(a['ci95'][0], '+.2f')}, {fmt(a['ci95'][1], '+.2f')}]"
                for v, a in at) + f" (the paper: {PAPER_PCT_LOG_LOSS:+.2f}%). An extrapolation: it holds only if "
            "the effect stays linear in log size that far, which these sizes cannot show."]


def diverged_section(summary: dict) -> list[str]:
    """The lost points: every diverged run of the arms (and of the scale ladder's sizes), with its step and reason;
    they are left out of every mean and paired test above."""
    lost = [(f"{a} seed {s}", x) for a, r in (summary.get("diverged") or {}).items() for s, x in r.items()]
    for size in (summary.get("scale_ladder") or {}).get("sizes", []):
        lost += [(f"{size['model']}/{run_name(v, s)}", x) for v, r in size["variants"].items()
                 for s, x in r["diverged"].items()]
    lines = ["", "## Diverged runs (lost points)", ""]
    if not lost:
        return lines + ["None."]
    lines += [f"{len(lost)} run(s) diverged; each is a lost point, left out of the means and the paired tests "
              f"(a seed pairs only where both runs finished):", ""]
    return lines + [f"- {name}: diverged at step {x['step'] if x['step'] is not None else 'n/a'}: {x['reason']}"
                    for name, x in lost]


def yardstick_lines(summary: dict) -> list[str]:
    """The yardsticks in one paragraph, in the task's words (the decided verdict's arms are compared with them in its
    table)."""
    return get_task(summary.get("task", "lm")).yardstick_lines(summary.get("yardsticks") or {})


def markdown(summary: dict, figures: list[str] = ()) -> str:
    """comparison.md from summary.json's content; ``figures``: the names of the figures written."""
    from study.analysis.attention_report import attention_lines
    lines = header(summary) + (attention_lines(summary["verdict"], summary.get("task", "lm"))
                               if summary.get("verdict") else [])
    lines += yardstick_lines(summary) + corpus_table(summary) + attention_logit_table(summary)
    if summary.get("diverged") or summary.get("scale_ladder"):
        lines += diverged_section(summary)
    if summary.get("scale_ladder"):
        lines += ladder_section(summary["scale_ladder"], summary["baseline"])
    if summary.get("verdict"):
        from study.analysis.verdict import verdict_section
        lines += verdict_section(summary["verdict"])
    if figures:
        lines += ["", "## Figures", ""] + [f"- `figures/{f}`" for f in figures]
    if summary.get("settings"):
        lines += ["", "## Recorded settings", "", "Shared by every run of the study (the variant's own section aside):",
                  "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(summary["settings"].items())]
    return "\n".join(lines + [""])
