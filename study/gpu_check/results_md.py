"""The GPU check's results as markdown (``results.md``)."""
from __future__ import annotations




def _fmt(x, spec=",.0f", none="-"):
    return none if x is None else format(x, spec)


def bench_lines(res: dict) -> list[str]:
    """results.md's bench table (empty without a bench phase): tokens/s and MFU per variant and mode."""
    lines: list[str] = []
    setup = res.get("bench_setup")
    if res.get("bench"):
        if setup:
            lines.append(f"`study.bench` at `{setup['model']}` ({setup['n_layer']} layers, n_embd {setup['n_embd']}, "
                         f"block {setup['block_size']}, vocab {setup['vocab_size']}), {setup['batch_tokens']:,} tokens "
                         f"per step, trainer `{setup['trainer']}`, {setup['steps']} timed steps x {setup['repeats']} "
                         f"(median), on {setup['device']}, torch {setup['torch']}.")
            lines.append("")
        lines += ["| variant | precision | mode | plain tokens/s | Lightning tokens/s | Lightning / plain | MFU plain | "
                  "MFU Lightning | peak memory (GiB) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in res["bench"]:
            mem = max(filter(None, [r.get("peak_memory_plain_bytes"), r.get("peak_memory_lightning_bytes")]), default=None)
            lines.append(f"| {r['variant']} | {r['precision']} | {r['mode']} | {_fmt(r['plain_tokens_per_s'])} | "
                         f"{_fmt(r['lightning_tokens_per_s'])} | {r['lightning_over_plain']:.3f} | "
                         f"{_fmt(r['mfu_plain'], '.1%')} | {_fmt(r['mfu_lightning'], '.1%')} | "
                         f"{_fmt(mem / 2**30 if mem else None, '.1f')} |")
        peak = res["bench"][0].get("peak_flops")
        if peak:
            lines.append(f"\nMFU against {peak / 1e12:.4g} TFLOP/s ({res['bench'][0]['peak_flops_source']}), "
                         f"{res['bench'][0]['flops_per_token'] / 1e9:.4g} GFLOP per token (baseline).")
        lines.append("")
    return lines


def target_lines(res: dict) -> list[str]:
    """results.md's targets table (empty when none were measured)."""
    lines: list[str] = []
    if res.get("targets"):
        lines += ["| target | measured | wanted | met |", "|---|---|---|---|"]
        tg = res["targets"]
        if "mfu_baseline" in tg:
            t = tg["mfu_baseline"]
            lines.append(f"| baseline MFU, {t['mode']} (Lightning; plain) | {_fmt(t['lightning'], '.1%')}; "
                         f"{_fmt(t['value'], '.1%')} | >= {t['target']:.0%} | {'yes' if t['met'] else 'no'} |")
        if "nonlinear_over_baseline" in tg:
            t = tg["nonlinear_over_baseline"]
            lines.append(f"| nonlinear_q / baseline tokens/s, {t['mode']} | {t['value']:.3f} | >= {t['target']} | "
                         f"{'yes' if t['met'] else 'no'} |")
        if "lightning_over_plain" in tg:
            t = tg["lightning_over_plain"]
            lines.append(f"| Lightning / plain loop, {t['mode']} | {t['min']:.3f}-{t['max']:.3f} | >= {t['target']} | "
                         f"{'yes' if t['met'] else 'no'} |")
        lines.append("")
    return lines


def train_lines(res: dict) -> list[str]:
    """results.md's training run: killed, resumed, its curve and what the resumed process read."""
    lines: list[str] = []
    tr = res.get("train")
    if tr:
        lines.append(f"Training run: {tr['steps']} steps of {tr['batch_tokens']:,} tokens; killed (SIGKILL) with the "
                     f"checkpoint of step {tr.get('checkpoint_step')} on disk, then resumed.")
        if "curve" in tr:
            lines += ["", "| step | train_loss | val_loss |", "|---|---|---|"]
            lines += [f"| {r['step']} | {r['train_loss']:.4f} | {r['val_loss']:.4f} |" for r in tr["curve"]]
            lines.append(f"\nResumed process read {tr['resumed_windows_read']} training windows "
                         f"(expected {tr['resumed_reads_expected'][0]}-{tr['resumed_reads_expected'][1]}); "
                         f"{tr['windows_compared']} compared with the killed process's reads from the checkpoint on. "
                         f"Final val_loss {tr['val_loss']:.4f}; {_fmt(tr['tokens_per_s_resumed'])} tokens/s over the "
                         f"resumed part (evaluations and checkpoints included).")
            lm = tr.get("logged_median", {})
            if lm:
                lines.append(f"Logged to MLflow every {tr['log_every']} steps (median): "
                             f"{_fmt(lm.get('tokens_per_s'))} tokens/s, MFU {_fmt(lm.get('train/device/mfu'), '.1%')}.")
        if tr.get("error"):
            lines.append(f"\nError: {tr['error']}")
        lines.append("")
    return lines


def markdown(res: dict) -> str:
    """results.md: the environment, the bench table, the targets, the training run and the checks."""
    env = res.get("environment", {})
    lines = [f"# GPU check ({res['profile']} profile), {res['date']}", ""]
    if env:
        lines.append(", ".join(f"{k} {v}" for k, v in env.items() if k != "import_errors"))
        for k, v in env.get("import_errors", {}).items():
            lines.append(f"\nimport {k} FAILED: {v}")
        lines.append("")
    lines += bench_lines(res) + target_lines(res) + train_lines(res)
    ev = res.get("eval")
    if ev:
        vals = ", ".join(f"{v:.5f} (micro-batch {k})" for k, v in ev["val_loss"].items())
        lines.append(f"Validation of the final checkpoint (step {ev['checkpoint_step']}, {ev['windows']} windows, "
                     f"{ev['precision']}, eager): {vals}; difference {ev['abs_difference']:.2e} nats "
                     f"(tolerance {ev['tolerance']:.0e})"
                     + (f"; the training run's own final val_loss {ev['training_run_val_loss']:.5f}."
                        if "training_run_val_loss" in ev else "."))
        lines.append("")
    if res.get("checks"):
        lines += ["| check | passed |", "|---|---|"]
        lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in res["checks"].items()]
        lines.append("")
    lines += ["| phase | status | seconds |", "|---|---|---|"]
    lines += [f"| {k} | {v['status']} | {v['seconds']} |" for k, v in res["phases"].items()]
    lines.append(f"\nTotal {res.get('elapsed_s')} s.")
    return "\n".join(lines) + "\n"
