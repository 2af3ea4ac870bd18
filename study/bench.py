"""``python -m study.bench [model=cpu] [--steps N] [--repeats R] [--variants a,b] [--quick] [--json PATH]``: throughput.

Prints tokens/s of a training step (forward, backward, AdamW, clipping) for
every variant in fp32 and bf16-mixed, eager and torch.compile'd, on random
tokens of the chosen model (default: the CPU default ``cpu``), for

* the plain PyTorch loop (reference, no Lightning), and
* the same step driven by Lightning's Trainer (``study.modeling.lit_module.GPTModule``),

with the ratios the project targets: Lightning / plain >= 0.95,
nonlinear_q / baseline >= 0.97 in the fastest precision, bf16 / fp32 >= 1.5
where the CPU has fast bf16, and an arm with QK-norm (``X_qknorm``) >= 0.97 of its arm ``X``
(QK-norm should cost at most 3%).  The recipe arms in one run:
``--variants baseline,nonlinear_q,baseline_qknorm,nonlinear_q_qknorm,nonlinear_q_ph,nonlinear_q_linear,split_depth``.  Timing skips warm-up steps (and compilation);
each figure is the median of ``--repeats`` measurements taken alternately
(plain, Lightning, plain, ...) so that the machine's drift hits both loops.
Every row also gives the model FLOPs utilisation (MFU: tokens/s x training FLOPs per token
over the device's peak, :func:`study.runner.throughput.device_peak_flops`) and, on GPUs, the peak memory allocated.
``--precisions`` / ``--modes`` pick the settings (e.g. ``--precisions bf16-mixed --modes compiled``);
``--json PATH`` rewrites PATH after every row (so a killed bench keeps its rows).
Figures go to stdout; docs/benchmarks.md records a measured table.  The loops and the measuring
are in ``study.runner.throughput``; this module parses the options, calls it per row and reports.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from study.config import load_config, project_root
from study.tasks import configured_rows
from study.runner.throughput import bench_device, bf16_fast, device_peak_flops, measure_row


def _positive(text: str) -> int:
    """argparse type: an int >= 1 (steps and repeats; 0 would leave nothing to time or take the median of)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: give one >= 1") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be >= 1")
    return n


def bench_header(base, device: str, fast: bool, steps: int, repeats: int) -> dict:
    """What a measurement ran on and at: date, device, machine, cores, torch, threads, the CPU kernels (pinned AVX2 or
    native: study/config/numerics.py), bf16 speed, steps and repeats, the model's shape and the trainer."""
    from study.config.numerics import cpu_capability, numerics_mode

    device_name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()
    return {"date": time.strftime("%Y-%m-%d"), "device": device_name, "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "bf16_fast": fast, "steps": steps, "repeats": repeats, "model": base.model.name,
            "n_layer": base.model.n_layer, "n_embd": base.model.n_embd, "block_size": base.model.block_size,
            "vocab_size": configured_rows(base), "batch_tokens": base.train.batch_tokens, "trainer": base.trainer.name,
            "kernels": f"{cpu_capability()} ({numerics_mode()})"}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The bench's options and the config overrides after them (KEY=VALUE, as every stage takes)."""
    parser = argparse.ArgumentParser(description="training throughput per variant, precision and loop",
                                     epilog="config overrides follow the options: KEY=VALUE (e.g. model=gpt3-small data=gpt2)")
    parser.add_argument("--steps", type=_positive, default=30, help="timed steps per measurement (after warm-up)")
    parser.add_argument("--repeats", type=_positive, default=3, help="measurements per loop; the median is reported")
    parser.add_argument("--variants", default="baseline,identity_q,nonlinear_q,baseline_mlp4.75")
    parser.add_argument("--precisions", default="32-true,bf16-mixed", help="comma-separated Lightning precisions")
    parser.add_argument("--modes", default="eager,compiled", help="eager, compiled or both (comma-separated)")
    parser.add_argument("--quick", action="store_true", help="fp32 eager only")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file (rewritten after every row)")
    return parser.parse_known_args(argv)


def bench_plan(base, args: argparse.Namespace) -> tuple[str, bool, list[str], list[str]]:
    """(device, fast bf16, modes, precisions) of a bench; raises ConfigError for a GPU trainer without a GPU or for
    modes/precisions it cannot run."""
    from study.config import ConfigError

    device = bench_device(base)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"trainer={base.trainer.name} asks for a GPU but torch {torch.__version__} sees none: "
                              f"use trainer=cpu")
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 parts, as Lightning advises
    fast = device == "cuda" or bf16_fast()  # GPUs: bf16 tensor cores
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [m for m in modes if m not in ("eager", "compiled")]
    if bad or not modes or not precisions:
        raise ConfigError(f"--modes {args.modes!r} / --precisions {args.precisions!r}: give modes from eager,compiled "
                          f"and at least one precision (e.g. 32-true,bf16-mixed)")
    if args.quick:
        modes, precisions = ["eager"], ["32-true"]
    return device, fast, modes, precisions


def print_summary(rows: list[dict], fast: bool) -> None:
    """The fastest setting of each variant against the baseline's, QK-norm's cost, and bf16 against fp32."""
    best = {}
    for r in rows:
        if r["lightning_tokens_per_s"] > best.get(r["variant"], (0.0,))[0]:
            best[r["variant"]] = (r["lightning_tokens_per_s"], r["precision"], r["mode"])
    if "baseline" in best:
        for name, (v, precision, mode) in best.items():
            print(f"fastest {name:<18s} {v:>9,.0f} tok/s ({precision}, {mode})"
                  f"  vs baseline {v / best['baseline'][0]:.3f}")
    for name, (v, precision, mode) in best.items():  # what QK-norm costs: the arm against its arm without it
        plain = name.removesuffix("_qknorm")
        if name.endswith("_qknorm") and plain in best:
            print(f"qk-norm cost {name:<18s} {v / best[plain][0]:.3f} of {plain}'s tokens/s "
                  f"(target >= 0.97; fastest setting of each)")
    fp32 = {r["variant"]: r["lightning_tokens_per_s"] for r in rows if r["precision"] == "32-true" and r["mode"] == "eager"}
    bf16 = {r["variant"]: r["lightning_tokens_per_s"] for r in rows if r["precision"] == "bf16-mixed" and r["mode"] == "eager"}
    for name in bf16:
        if name in fp32:
            print(f"bf16/fp32 {name:<18s} {bf16[name] / fp32[name]:.3f}"
                  f"{'' if fast else '  (this CPU has no fast bf16: the 1.5x target does not apply)'}")


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    if any(a.startswith("--cfg") for a in overrides):  # print the composed config (the stage runner's --cfg job)
        from study.config import run_stage
        return run_stage(lambda cfg, root: 0, overrides)
    root = project_root()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import logging
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    base = load_config(overrides, root)
    device, fast, modes, precisions = bench_plan(base, args)
    header = bench_header(base, device, fast, args.steps, args.repeats)
    print(f"# {header['date']}  {header['device']}  {header['machine']} {header['cpu_count']} cores  torch "
          f"{header['torch']}  threads {header['threads']}  kernels {header['kernels']}  bf16 fast: {fast}  steps "
          f"{args.steps} x {args.repeats} repeats (median)")
    rows = []

    def dump():
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**header, "rows": rows}, indent=1))
            tmp.replace(path)

    dump()
    for mode in modes:
        for precision in precisions:
            steps = args.steps if precision == "32-true" or fast else max(3, args.steps // 5)
            peak, peak_source = device_peak_flops(device, precision)
            for name in args.variants.split(","):
                cfg = load_config([*overrides, f"variant={name}"], root)
                row, peak_memory = measure_row(cfg, name, steps, precision, mode, args.repeats, peak, peak_source)
                p, li = row["plain_tokens_per_s"], row["lightning_tokens_per_s"]
                rows.append(row)
                dump()
                mem = f"  peak mem {peak_memory / 2**30:.2f} GiB" if peak_memory is not None else ""
                mfu = f"  MFU {row['mfu_plain']:.1%} / {row['mfu_lightning']:.1%}" if peak else ""
                print(f"{name:<18s} {precision:<10s} {mode:<8s} plain {p:>9,.0f} tok/s "
                      f"(range {row['plain_range'][0]:,.0f}-{row['plain_range'][1]:,.0f})  lightning {li:>9,.0f} tok/s "
                      f"(range {row['lightning_range'][0]:,.0f}-{row['lightning_range'][1]:,.0f})  ratio {li / p:.3f}"
                      f"{mfu}{mem}", flush=True)
    print_summary(rows, fast)
    return 0


def cli(argv: list[str] | None = None) -> int:
    """main() with the project's one-line errors (exit 2) for bad variants, keys or values."""
    from study.config import StudyError

    try:
        return main(argv)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
