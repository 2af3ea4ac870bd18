"""The eval phase's subprocess (``python -m study.gpu_check --eval-checkpoint``): a checkpoint's val_loss
at several validation micro-batch sizes."""
from __future__ import annotations

import json
from pathlib import Path

from study.gpu_check.plan import GpuCheckError


def evaluate_checkpoint(ckpt: Path, micros: list[int], overrides: list[str], out: Path) -> dict:
    """val_loss (nats) of a training checkpoint with the project's validation step (GPTModule +
    TokenDataModule's fixed validation windows, Lightning's ``validate``) at each validation micro-batch
    size of ``micros``; eager (not compiled), the run's precision.  Written to ``out`` as JSON."""
    import lightning.pytorch as pl
    import torch

    from study.config import load_config, project_root, run_seeds
    from study.data.datamodule import TokenDataModule
    from study.modeling.lit_module import GPTModule

    root = project_root()
    cfg = load_config([*overrides, "trainer.compile=false"], root)
    n_val = cfg.train.val_tokens // cfg.model.block_size
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    result = {"checkpoint_step": int(state["global_step"]), "windows": n_val, "val_loss": {},
              "precision": cfg.trainer.precision}
    for m in micros:
        if n_val % m:
            raise GpuCheckError(f"validation micro-batch {m} does not divide the {n_val} validation windows")
        dm = TokenDataModule(root / cfg.data.dir, cfg.model.block_size, cfg.train.micro_batch_size, run_seeds(cfg)[0],
                             n_val, m)
        module = GPTModule(cfg, corpora=dm.corpora)
        module.load_state_dict(state["state_dict"])
        trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             limit_val_batches=n_val // m, enable_checkpointing=False)
        trainer.validate(module, datamodule=dm, verbose=False)
        result["val_loss"][str(m)] = float(trainer.callback_metrics["val_loss"])
    out.write_text(json.dumps(result, indent=1))
    return result
