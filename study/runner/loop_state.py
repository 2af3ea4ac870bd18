"""Lightning's loop state across a resume: the loop counters of a checkpoint rescaled to this run's gradient
accumulation (a resume on another world size keeps the optimizer step), and the run's wall-clock seconds, which every
checkpoint carries so that a killed and resumed run counts every segment."""
from __future__ import annotations

import time
from pathlib import Path

from study.config import StudyError


def rescale_loop_state(checkpoint: dict, accum: int) -> None:
    """Express a checkpoint's Lightning loop progress in this run's micro-batches (in place).

    Lightning counts the fit loop's progress in micro-batches per rank (``epoch_loop.batch_progress``)
    and decides from it when an optimizer step and an evaluation fall (``ready % accumulation``,
    ``val_check_interval``).  A run resumed with another accumulation (another world size or
    micro-batch) would otherwise take its first step on a partial accumulation and every later step
    across two global batches.  The counters become ``optimizer steps x accum``: the old accumulation is
    ``total micro-batches / global_step``."""
    steps = checkpoint.get("global_step", 0)
    bp = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
    if not steps or not bp or not bp.get("total", {}).get("completed"):
        return
    old = bp["total"]["completed"] / steps
    if old == accum:
        return
    for part in ("total", "current"):
        n = round(bp[part]["completed"] / old)  # optimizer steps (all, this epoch)
        for key in bp[part]:
            bp[part][key] = n * accum


def loop_state_callback(accum: int):
    from lightning.pytorch.callbacks import Callback

    class RescaleLoopState(Callback):
        """Calls :func:`rescale_loop_state` on the loaded checkpoint, before Lightning restores its loops."""

        def on_load_checkpoint(self, trainer, pl_module, checkpoint):
            rescale_loop_state(checkpoint, accum)
    return RescaleLoopState()


def read_resume_checkpoint(resume: Path, wall_clock_key: str) -> tuple[int, float]:
    """(global step, training seconds of the earlier segments) of the checkpoint a run resumes.

    Raises:
        StudyError: the checkpoint cannot be loaded (cut short by a kill or a full disk, edited): one
            line naming it and saying to delete the run's checkpoints; it is never deleted here.
    """
    import torch

    try:
        ckpt = torch.load(resume, map_location="cpu", weights_only=False)
        step, earlier = int(ckpt["global_step"]), float(ckpt.get(wall_clock_key) or 0.0)
    except Exception as e:  # noqa: BLE001  (torch raises RuntimeError, EOFError, UnpicklingError ...)
        why = " ".join(str(e).split())[:120] or type(e).__name__
        raise StudyError(f"{resume} is unreadable ({type(e).__name__}: {why}): delete {resume.parent} to start "
                         f"the run afresh") from None
    return step, earlier


#: the checkpoint key of a run's training time up to that checkpoint (s, every segment of a resumed run)
WALL_CLOCK_KEY = "study_wall_time_s"


def wall_clock_callback():
    """A callback that writes the run's wall time so far into every checkpoint (:data:`WALL_CLOCK_KEY`:
    ``earlier`` (the segments before this process, from the resumed checkpoint) + the time since ``t0``),
    so that record.json's wall_time_s of a killed and resumed run counts every segment."""
    from lightning.pytorch.callbacks import Callback

    class WallClock(Callback):
        earlier, t0 = 0.0, None

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if self.t0 is not None:
                checkpoint[WALL_CLOCK_KEY] = self.earlier + time.time() - self.t0
    return WallClock()
