"""Training throughput and MFU: a device's peak FLOP/s (:func:`peak_flops`), the ThroughputMonitor a GPU run logs
MFU with (:func:`throughput_monitor`), and the bench's two loops, a plain PyTorch loop and the same step under
Lightning.

Both loops train the chosen model on random tokens (forward, backward, AdamW, clipping) for
``steps`` timed steps after :data:`WARMUP` untimed ones (compilation included there);
:func:`measure` runs them alternately so that the machine's drift hits both, :func:`measure_row`
makes one row of ``python -m study.bench`` of them (medians, ranges, MFU, peak GPU memory).
"""
from __future__ import annotations

import gc
import math
import statistics
import time

import torch

from study.tasks import configured_rows

WARMUP = 3


def _batches(cfg, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    seqs = cfg.train.batch_tokens // cfg.model.block_size
    return [torch.randint(0, configured_rows(cfg), (seqs, cfg.model.block_size + 1), generator=g) for _ in range(n)]


def bench_device(cfg) -> str:
    """"cuda" for the gpu/ddp/fsdp trainers, else "cpu" (one device: the bench is per device)."""
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
    :func:`peak_flops` (GPUs: NVIDIA's dense datasheet figures, through Lightning's table or, for the H200 that
    Lightning misses, :data:`H200_SXM_DENSE`; CPUs: a measured 1024^3 fp32 matrix product); None when the GPU is
    unknown."""
    if device != "cuda":
        return peak_flops(torch.device("cpu"), precision), "measured fp32 matmul (1024^3)"
    return peak_flops(torch.device("cuda"), precision), f"datasheet dense peak of {torch.cuda.get_device_name()}"


def plain_loop(cfg, steps: int, precision: str, compile_: bool) -> dict:
    """A hand-written PyTorch training loop (same model, optimizer, clipping): ``tokens_per_s`` and
    ``peak_memory_bytes`` (GPU; None on CPUs).  The batches are on the device before timing starts."""
    from study.modeling.model import GPT

    torch.manual_seed(0)
    device = bench_device(cfg)
    before = _reset_memory(device)
    model = GPT(cfg.model, cfg.variant, configured_rows(cfg)).to(device)
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

    from study.modeling.lit_module import GPTModule

    from study.runner.spec import frozen

    cfg = frozen(cfg, {"trainer": {"compile": compile_}})
    device = bench_device(cfg)
    before = _reset_memory(device)
    torch.manual_seed(0)
    module = GPTModule(cfg)
    times = []

    class Timer(pl.Callback):
        def on_train_batch_start(self, trainer, *a):
            if trainer.global_step == WARMUP:
                _sync(bench_device(cfg))
                times.append(time.perf_counter())

        def on_train_end(self, trainer, *a):
            _sync(bench_device(cfg))
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


def measure_row(cfg, name: str, steps: int, precision: str, mode: str, repeats: int, peak: float | None,
                peak_source: str) -> tuple[dict, int | None]:
    """One row of the bench for variant ``name`` (configured by ``cfg``): the medians (and ranges) of :func:`measure`'s
    tokens/s of both loops, their ratio, MFU against ``peak`` FLOP/s, peak GPU memory; returns
    (row, the largest peak memory of all measurements in bytes, None on CPUs)."""
    from study.modeling.accounting import flops_per_token
    from study.modeling.model import GPT

    with torch.device("meta"):
        fpt = flops_per_token(GPT(cfg.model, cfg.variant, configured_rows(cfg)))
    plain, light = measure(cfg, steps, precision, mode == "compiled", repeats)
    p = statistics.median(r["tokens_per_s"] for r in plain)
    li = statistics.median(r["tokens_per_s"] for r in light)
    mems = [r["peak_memory_bytes"] for r in plain + light if r["peak_memory_bytes"] is not None]
    row = {"variant": name, "precision": precision, "mode": mode, "steps": steps,
           "plain_tokens_per_s": p, "lightning_tokens_per_s": li, "lightning_over_plain": li / p,
           "plain_range": [min(r["tokens_per_s"] for r in plain), max(r["tokens_per_s"] for r in plain)],
           "lightning_range": [min(r["tokens_per_s"] for r in light), max(r["tokens_per_s"] for r in light)],
           "flops_per_token": fpt, "peak_flops": peak, "peak_flops_source": peak_source,
           "mfu_plain": p * fpt / peak if peak else None, "mfu_lightning": li * fpt / peak if peak else None,
           "peak_memory_plain_bytes": max((r["peak_memory_bytes"] or 0) for r in plain) or None,
           "peak_memory_lightning_bytes": max((r["peak_memory_bytes"] or 0) for r in light) or None}
    return row, (max(mems) if mems else None)


def bf16_fast() -> bool:
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


H200_SXM_DENSE = {torch.bfloat16: 989.4e12, torch.float16: 989.4e12}  # FLOP/s, the H100 SXM's tensor cores


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one device, for MFU.

    GPUs/TPUs: Lightning's table of datasheet dense peaks
    (``lightning.fabric.utilities.throughput.get_available_flops``; e.g. H100 SXM bf16
    989.4 TFLOP/s, A100 bf16 312 TFLOP/s, per the NVIDIA datasheets), except the H200 SXM, which
    Lightning 2.6 does not match (torch names it "NVIDIA H200") and lists with its sparse figures:
    :data:`H200_SXM_DENSE` (the H200 datasheet's dense bf16/fp16 989 TFLOP/s).  CPUs: measured here,
    the best of five 1024^3 fp32 matrix products with torch's threads, for ``study.bench`` only, which
    states the method beside its figures: training runs log no MFU on CPUs (a peak timed on a shared
    machine is not a stable figure; one run logged MFU 1.06 against it).
    """
    if device.type != "cpu":
        from lightning.fabric.utilities.throughput import get_available_flops
        dtype = torch.bfloat16 if "bf16" in str(precision) else (torch.float16 if "16" in str(precision) else torch.float32)
        name = torch.cuda.get_device_name(device).lower() if device.type == "cuda" else ""
        if "h200" in name and "nvl" not in name and dtype in H200_SXM_DENSE:
            return H200_SXM_DENSE[dtype]
        return get_available_flops(device, dtype)
    a = torch.randn(1024, 1024)
    a @ a
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * 1024 ** 3 / best


def wants_throughput_monitor(trainer_cfg) -> bool:
    """Whether a run gets :func:`throughput_monitor`: on GPUs/TPUs, where a datasheet peak exists."""
    return trainer_cfg.accelerator != "cpu"


def throughput_monitor(window: int):
    """Lightning's ThroughputMonitor for a GPU run: logs ``train/device/items_per_sec`` (tokens/s per
    device), ``train/device/flops_per_sec`` and ``train/device/mfu`` (model FLOPs utilisation: achieved
    training FLOP/s per device over the device's datasheet peak, :func:`peak_flops`), rolling over
    ``window`` micro-batches, with the module's :attr:`GPTModule.flops_per_batch`."""
    from lightning.pytorch.callbacks import ThroughputMonitor

    class Monitor(ThroughputMonitor):
        def setup(self, trainer, pl_module, stage):
            super().setup(trainer, pl_module, stage)  # Lightning's own peak table ...
            device = trainer.strategy.root_device
            peak = peak_flops(device, trainer.precision) if device.type != "cpu" else None  # ... with the H200's
            if peak:
                self.available_flops = peak
                for throughput in self._throughputs.values():
                    throughput.available_flops = peak
                if trainer.logger is not None:  # the peak MFU is measured against, once
                    trainer.logger.log_metrics({"peak_flops": peak}, step=0)

    def tokens(b):  # a training batch (B, block_size + 1), or a validation batch (tokens, corpus index)
        return b[0] if isinstance(b, (list, tuple)) else b

    return Monitor(batch_size_fn=lambda b: tokens(b).shape[0],
                   length_fn=lambda b: tokens(b).shape[0] * (tokens(b).shape[1] - 1), window_size=max(2, window))
