"""The run plan of the GPU check: the phases, their budgets and settings on a GPU and on a CPU, the
throughput targets, and the error every step raises."""
from __future__ import annotations



class GpuCheckError(Exception):
    """A step of the GPU check that cannot go on; the message names the problem and the fix."""



# -- phase profiles -------------------------------------------------------------------------------------
GPU = {
    "model": ["model=gpt3-small", "data=gpt2", "trainer=gpu"],
    "bench": {"steps": 20, "repeats": 1, "batch_tokens": 16 * 1024, "precision": "bf16-mixed",
              "variants": "baseline,nonlinear_q,identity_q"},
    # 250 steps of 16 x 1024 tokens, checkpoints every 50 steps, killed past step 100
    "train": {"steps": 250, "batch_tokens": 16 * 1024, "micro": 16, "lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 20,
              "eval_every": 50, "kill_after": 100, "val_windows": 32, "val_micro": 16},
    "eval_micro": (16, 4),
    "val_tolerance": 2e-2,  # nats: bf16 autocast sums in another order at another batch size
    # seconds per phase, in the order they run; bench_eager gets what the others leave of the total
    "budgets": {"install": 60, "env": 30, "bench_compiled": 180, "train": 180, "eval": 45, "bench_eager": 120},
    "total": 470,
}
CPU = {
    "model": ["model=nano", "trainer=cpu", "data.tokenizer=bpe", "data.vocab_size=512", "trainer.threads=1"],
    "bench": {"steps": 3, "repeats": 1, "batch_tokens": 2048, "precision": "32-true", "variants": "baseline,nonlinear_q"},
    "train": {"steps": 60, "batch_tokens": 2048, "micro": 32, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 4,
              "eval_every": 10, "kill_after": 10, "val_windows": 64, "val_micro": 32},
    "eval_micro": (32, 8),
    "val_tolerance": 1e-4,  # nats: fp32
    "budgets": {"install": 90, "env": 60, "bench_compiled": 0, "train": 240, "eval": 90, "bench_eager": 120},
    "total": 900,
}
PHASES = ("bench_compiled", "train", "eval", "bench_eager")  # after install and env, in this order (eval needs train)
TARGETS = {"mfu_baseline_compiled": 0.45, "nonlinear_over_baseline": 0.97, "lightning_over_plain": 0.97}
