"""``python -m study.bench [model=cpu] [--steps N] [--repeats R] [--variants a,b] [--quick]``: throughput.

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
Figures go to stdout; docs/benchmarks.md records a measured table.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

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


def plain_loop(cfg, steps: int, precision: str, compile_: bool) -> float:
    """tokens/s of a hand-written PyTorch training loop (same model, optimizer, clipping)."""
    from study.model import GPT

    torch.manual_seed(0)
    device = _device(cfg)
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
    return steps * cfg.train.batch_tokens / (time.perf_counter() - t0)


def lightning_loop(cfg, steps: int, precision: str, compile_: bool) -> float:
    """tokens/s of the same step run by the project's LightningModule under a Lightning Trainer."""
    import lightning.pytorch as pl

    from study.lm import GPTModule

    cfg.trainer.compile = compile_
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

    loader = torch.utils.data.DataLoader(_batches(cfg, steps + WARMUP), batch_size=None)
    trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=precision, max_steps=steps + WARMUP,
                         gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=[Timer()])
    trainer.fit(module, train_dataloaders=loader)
    return steps * cfg.train.batch_tokens / (times[-1] - times[0])


def measure(cfg, steps: int, precision: str, compile_: bool, repeats: int) -> tuple[list[float], list[float]]:
    """tokens/s of the plain loop and of Lightning, measured alternately ``repeats`` times each
    (plain, Lightning, plain, ...), so that slow drifts of the machine hit both alike."""
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
    parser.add_argument("--quick", action="store_true", help="fp32 eager only")
    args, overrides = parser.parse_known_args(argv)
    root = project_root()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import logging
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    fast = _device(load_config(overrides, root)) == "cuda" or _bf16_fast()  # GPUs: bf16 tensor cores
    print(f"# {time.strftime('%Y-%m-%d')}  {platform.machine()} {os.cpu_count()} cores  torch {torch.__version__}"
          f"  threads {torch.get_num_threads()}  bf16 fast: {fast}  steps {args.steps} x {args.repeats} repeats (median)")
    rows = []
    settings = [("32-true", False)] if args.quick else [("32-true", False), ("bf16-mixed", False),
                                                        ("32-true", True), ("bf16-mixed", True)]
    variants = args.variants.split(",")
    for precision, comp in settings:
        steps = args.steps if precision == "32-true" or fast else max(3, args.steps // 5)
        for name in variants:
            cfg = load_config([*overrides, f"variant={name}"], root)
            plain, light = measure(cfg, steps, precision, comp, args.repeats)
            p, li = statistics.median(plain), statistics.median(light)
            rows.append((name, precision, comp, p, li))
            print(f"{name:<18s} {precision:<10s} {'compiled' if comp else 'eager':<8s} plain {p:>9,.0f} tok/s "
                  f"(range {min(plain):,.0f}-{max(plain):,.0f})  lightning {li:>9,.0f} tok/s "
                  f"(range {min(light):,.0f}-{max(light):,.0f})  ratio {li / p:.3f}", flush=True)
    best = {}
    for name, precision, comp, plain, light in rows:
        if light > best.get(name, (0.0,))[0]:
            best[name] = (light, precision, comp)
    if "baseline" in best:
        for name, (v, precision, comp) in best.items():
            print(f"fastest {name:<18s} {v:>9,.0f} tok/s ({precision}, {'compiled' if comp else 'eager'})"
                  f"  vs baseline {v / best['baseline'][0]:.3f}")
    fp32 = {r[0]: r[4] for r in rows if r[1] == "32-true" and not r[2]}
    bf16 = {r[0]: r[4] for r in rows if r[1] == "bf16-mixed" and not r[2]}
    for name in bf16:
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
