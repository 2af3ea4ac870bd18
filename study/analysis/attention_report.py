"""comparison.md's section on attention's share: what the no-context arm can still do per task, the share against
the equivalence margin, and a warning where attention carries too little for the query's verdict to mean much."""
from __future__ import annotations

from study.tasks import get_task
from study.tasks.common import fmt

#: share / margin below which the report warns that the runs barely use their context (docs/verdict.md: the study's
#: default carries 56 margins; the nano study's runs, 16 steps each, carry none)
WEAK_SHARE = 10


def attention_lines(v: dict, task: str = "lm") -> list[str]:
    """comparison.md's opening lines on attention's share (summary.json "verdict" "attention") for ``task``."""
    rows = v.get("attention") or []
    if not rows:
        return ["", "Attention's share: not measured (no arm of study.arms has a variant with context: self; add "
                    "the no_context arm to measure what attention carries at this size).", ""]
    lines = ["", "## Attention's share", "",
             f"What attention carries at this size: the no-context arm (each position attends to itself only: "
             f"{get_task(task).NO_CONTEXT}) minus the reference, paired by seed, against the equivalence "
             f"margin in nats.", "",
             "| no-context arm | reference | pairs | share (nats) | 95% CI | margin (nats) | share / margin |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['reference']} | {r['n_pairs']} | {fmt(r['share'], '+.4f')} | "
                     f"[{fmt(r['ci95'][0], '+.4f')}, {fmt(r['ci95'][1], '+.4f')}] | {fmt(r['margin_nats'])} | "
                     f"{fmt(r['ratio'], '.1f')} |")
    drawn = any(r.get("position_loss") for r in (v.get("arms") or {}).values())  # lm: figures.position_loss
    left = [f"{a}'s curve is not drawn: {r['position_note']}: restore the file(s), or re-run the run(s)."
            for a, r in (v.get("arms") or {}).items() if drawn and not r.get("position_loss") and r.get("position_note")]
    weak = [r for r in rows if not r["ratio"] >= WEAK_SHARE]
    if weak:
        lines += ["", f"**Attention carries little here** (share / margin {', '.join(fmt(r['ratio'], '.1f') for r in weak)}, "
                      f"under {WEAK_SHARE}): the runs barely use their context, so the verdicts above say little about "
                      f"what the query changes; at this size and budget they exercise the pipeline, not the question."]
    return lines + (["", "![loss by position](figures/position_loss.png)", "", *left, *([""] if left else [])]
                    if drawn else [""])
