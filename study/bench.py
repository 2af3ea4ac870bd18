"""``python -m study.bench [model=cpu] [--steps N] [--repeats R] [--variants a,b] [--quick] [--json PATH]``: throughput.

Prints tokens/s of a training step (forward, backward, AdamW, clipping) for
every variant in fp32 and bf16-mixed, eager and torch.compile'd, on random
tokens of the chosen model (default: the CPU default ``cpu``), for

* the plain PyTorch loop (reference, no Lightning), and
* the same step driven by Lightning's Trainer (``study.lm.GPTModule``),

with the ratios the project targets: Lightning / plain >= 0.95,
nonlinear_q / baseline >= 0.97 in the fastest precision, bf16 / fp32 >= 1.5
where the CPU has fast bf16.  Timing skips warm-up steps (and compilation);
each figure is the median of ``--repeats`` measurements taken alternately
(plain, Lightning, plain, ...) so that the machine's drift hits both loops.
Every row also gives the model FLOPs utilisation (MFU: tokens/s x training FLOPs per token
over the device's peak, :func:`device_peak_flops`) and, on GPUs, the peak memory allocated.
``--precisions`` / ``--modes`` pick the settings (e.g. ``--precisions bf16-mixed --modes compiled``);
``--json PATH`` rewrites PATH after every row (so a killed bench keeps its rows).
Figures go to stdout; docs/benchmarks.md records a measured table.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from study.config import load_config, project_root

WARMUP = 3


def _batches(cfg, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    seqs = cfg.train.batch_tokens // cfg.model.block_size
    return [torch.randint(0, cfg.model.vocab_size, (seqs, cfg.model.block_size + 1), generator=g) for _ in range(n)]


def _device(cfg) -> str:
    """"cuda" for the gpu/ddp/fsdp trainer profiles, else "cpu" (one device: the bench is per device)."""
    return "cuda" if cfg.trainer.accelerator in ("gpu", "cuda") else "cpu"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _reset_memory(device: str) -> int:
    """Free what can be freed and restart the GPU's peak-memory counter; returns the bytes still allocated
    (what earlier measurements left, e.g. in torch.compile's caches), which :func:`_peak_memory` subtracts."""
    gc.collect()
    if device != "cuda":
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def _peak_memory(device: str, before: int) -> int | None:
    """Peak bytes allocated on the GPU since :func:`_reset_memory` returned ``before``, less ``before``
    (None on CPUs): the measurement's own weights, optimizer state, activations and workspace."""
    return int(torch.cuda.max_memory_allocated()) - before if device == "cuda" else None


def device_peak_flops(device: str, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device for this precision, where the figure comes from):
    ``study.lm.peak_flops`` (GPUs: NVIDIA's dense datasheet figures, through Lightning's table or,
    for the H200 that Lightning misses, ``study.lm.H200_SXM_DENSE``; CPUs: a measured 1024^3 fp32
    matrix product); None when the GPU is unknown."""
    from study.lm import peak_flops

    if device != "cuda":
        return peak_flops(torch.device("cpu"), precision), "measured fp32 matmul (1024^3)"
    return peak_flops(torch.device("cuda"), precision), f"datasheet dense peak of {torch.cuda.get_device_name()}"


def plain_loop(cfg, steps: int, precision: str, compile_: bool) -> dict:
    """A hand-written PyTorch training loop (same model, optimizer, clipping): ``tokens_per_s`` and
    ``peak_memory_bytes`` (GPU; None on CPUs).  The batches are on the device before timing starts."""
    from study.model import GPT

    torch.manual_seed(0)
    device = _device(cfg)
    before = _reset_memory(device)
    model = GPT(cfg.model, cfg.variant).to(device)
    fwd = torch.compile(model) if compile_ else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))
    batches = [b.to(device) for b in _batches(cfg, steps + WARMUP)]
    t0 = 0.0
    for i, b in enumerate(batches):
        if i == WARMUP:
            _sync(device)
            t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            _, loss = fwd(b[:, :-1], b[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    tokens_per_s = steps * cfg.train.batch_tokens / (time.perf_counter() - t0)
    out = {"tokens_per_s": tokens_per_s, "peak_memory_bytes": _peak_memory(device, before)}
    del model, fwd, opt, batches
    return out


def lightning_loop(cfg, steps: int, precision: str, compile_: bool) -> dict:
    """The same step run by the project's LightningModule under a Lightning Trainer: ``tokens_per_s``
    and ``peak_memory_bytes``.  The batches come from a DataLoader of CPU tensors (pinned on GPUs, so
    that Lightning's copy to the device does not wait for the step before it)."""
    import lightning.pytorch as pl

    from study.lm import GPTModule

    cfg.trainer.compile = compile_
    device = _device(cfg)
    before = _reset_memory(device)
    torch.manual_seed(0)
    module = GPTModule(cfg)
    times = []

    class Timer(pl.Callback):
        def on_train_batch_start(self, trainer, *a):
            if trainer.global_step == WARMUP:
                _sync(_device(cfg))
                times.append(time.perf_counter())

        def on_train_end(self, trainer, *a):
            _sync(_device(cfg))
            times.append(time.perf_counter())

    loader = torch.utils.data.DataLoader(_batches(cfg, steps + WARMUP), batch_size=None, pin_memory=device == "cuda")
    trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=precision, max_steps=steps + WARMUP,
                         gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=[Timer()])
    trainer.fit(module, train_dataloaders=loader)
    out = {"tokens_per_s": steps * cfg.train.batch_tokens / (times[-1] - times[0]),
           "peak_memory_bytes": _peak_memory(device, before)}
    del trainer, module, loader
    return out


def measure(cfg, steps: int, precision: str, compile_: bool, repeats: int) -> tuple[list[dict], list[dict]]:
    """The plain loop and Lightning (each a list of :func:`plain_loop` / :func:`lightning_loop` results),
    measured alternately ``repeats`` times each (plain, Lightning, plain, ...), so that slow drifts of
    the machine hit both alike."""
    plain, light = [], []
    for _ in range(repeats):
        plain.append(plain_loop(cfg, steps, precision, compile_))
        light.append(lightning_loop(cfg, steps, precision, compile_))
    return plain, light


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="training throughput per variant, precision and loop")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per measurement (after warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per loop; the median is reported")
    parser.add_argument("--variants", default="baseline,identity_q,nonlinear_q,baseline_mlp4.75")
    parser.add_argument("--precisions", default="32-true,bf16-mixed", help="comma-separated Lightning precisions")
    parser.add_argument("--modes", default="eager,compiled", help="eager, compiled or both (comma-separated)")
    parser.add_argument("--quick", action="store_true", help="fp32 eager only")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file (rewritten after every row)")
    args, overrides = parser.parse_known_args(argv)
    if any(a.startswith("--cfg") for a in overrides):  # print the composed config (the stage runner's --cfg job)
        from study.config import run_stage
        return run_stage(lambda cfg, root: 0, overrides)
    root = project_root()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import logging
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from study.config import ConfigError
    from study.model import GPT, flops_per_token

    base = load_config(overrides, root)
    device = _device(base)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"trainer={base.trainer.name} asks for a GPU but torch {torch.__version__} sees none: "
                              f"use trainer=cpu")
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 parts, as Lightning advises
    fast = device == "cuda" or _bf16_fast()  # GPUs: bf16 tensor cores
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [m for m in modes if m not in ("eager", "compiled")]
    if bad or not modes or not precisions:
        raise ConfigError(f"--modes {args.modes!r} / --precisions {args.precisions!r}: give modes from eager,compiled "
                          f"and at least one precision (e.g. 32-true,bf16-mixed)")
    if args.quick:
        modes, precisions = ["eager"], ["32-true"]
    device_name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()
    header = {"date": time.strftime("%Y-%m-%d"), "device": device_name, "machine": platform.machine(),
              "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "bf16_fast": fast, "steps": args.steps, "repeats": args.repeats, "model": base.model.name,
              "n_layer": base.model.n_layer, "n_embd": base.model.n_embd, "block_size": base.model.block_size,
              "vocab_size": base.model.vocab_size, "batch_tokens": base.train.batch_tokens, "trainer": base.trainer.name}
    print(f"# {header['date']}  {device_name}  {platform.machine()} {os.cpu_count()} cores  torch {torch.__version__}"
          f"  threads {torch.get_num_threads()}  bf16 fast: {fast}  steps {args.steps} x {args.repeats} repeats (median)")
    rows = []

    def dump():
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**header, "rows": rows}, indent=1))
            tmp.replace(path)

    dump()
    variants = args.variants.split(",")
    for mode in modes:
        comp = mode == "compiled"
        for precision in precisions:
            steps = args.steps if precision == "32-true" or fast else max(3, args.steps // 5)
            peak, peak_source = device_peak_flops(device, precision)
            for name in variants:
                cfg = load_config([*overrides, f"variant={name}"], root)
                with torch.device("meta"):
                    fpt = flops_per_token(GPT(cfg.model, cfg.variant))
                plain, light = measure(cfg, steps, precision, comp, args.repeats)
                p = statistics.median(r["tokens_per_s"] for r in plain)
                li = statistics.median(r["tokens_per_s"] for r in light)
                mems = [r["peak_memory_bytes"] for r in plain + light if r["peak_memory_bytes"] is not None]
                row = {"variant": name, "precision": precision, "mode": mode, "steps": steps,
                       "plain_tokens_per_s": p, "lightning_tokens_per_s": li, "lightning_over_plain": li / p,
                       "plain_range": [min(r["tokens_per_s"] for r in plain), max(r["tokens_per_s"] for r in plain)],
                       "lightning_range": [min(r["tokens_per_s"] for r in light),
                                           max(r["tokens_per_s"] for r in light)],
                       "flops_per_token": fpt, "peak_flops": peak, "peak_flops_source": peak_source,
                       "mfu_plain": p * fpt / peak if peak else None, "mfu_lightning": li * fpt / peak if peak else None,
                       "peak_memory_plain_bytes": max((r["peak_memory_bytes"] or 0) for r in plain) or None,
                       "peak_memory_lightning_bytes": max((r["peak_memory_bytes"] or 0) for r in light) or None}
                rows.append(row)
                dump()
                mem = f"  peak mem {max(mems) / 2**30:.2f} GiB" if mems else ""
                mfu = f"  MFU {row['mfu_plain']:.1%} / {row['mfu_lightning']:.1%}" if peak else ""
                print(f"{name:<18s} {precision:<10s} {mode:<8s} plain {p:>9,.0f} tok/s "
                      f"(range {row['plain_range'][0]:,.0f}-{row['plain_range'][1]:,.0f})  lightning {li:>9,.0f} tok/s "
                      f"(range {row['lightning_range'][0]:,.0f}-{row['lightning_range'][1]:,.0f})  ratio {li / p:.3f}"
                      f"{mfu}{mem}", flush=True)
    best = {}
    for r in rows:
        if r["lightning_tokens_per_s"] > best.get(r["variant"], (0.0,))[0]:
            best[r["variant"]] = (r["lightning_tokens_per_s"], r["precision"], r["mode"])
    if "baseline" in best:
        for name, (v, precision, mode) in best.items():
            print(f"fastest {name:<18s} {v:>9,.0f} tok/s ({precision}, {mode})"
                  f"  vs baseline {v / best['baseline'][0]:.3f}")
    fp32 = {r["variant"]: r["lightning_tokens_per_s"] for r in rows if r["precision"] == "32-true" and r["mode"] == "eager"}
    bf16 = {r["variant"]: r["lightning_tokens_per_s"] for r in rows if r["precision"] == "bf16-mixed" and r["mode"] == "eager"}
    for name in bf16:
        if name in fp32:
            print(f"bf16/fp32 {name:<18s} {bf16[name] / fp32[name]:.3f}"
                  f"{'' if fast else '  (this CPU has no fast bf16: the 1.5x target does not apply)'}")
    return 0


def _bf16_fast() -> bool:
    """True when a bf16 matmul is at least as fast as fp32 on this CPU (measured, 256^3)."""
    a32 = torch.randn(256, 256)
    a16 = a32.bfloat16()
    def t(a):
        a @ a
        s = time.perf_counter()
        for _ in range(5):
            a @ a
        return time.perf_counter() - s
    return t(a16) <= t(a32)


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
