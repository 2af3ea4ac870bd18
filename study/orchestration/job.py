"""One job of a launch: exactly the training a DVC stage runs, ``python -m study.train [--params P] OVERRIDES``, as a
child process of the job, in the project root.  The same command on both launchers, so the same numbers.

Under SLURM (submitit) the job's own process is submitit's: it holds submitit's preemption handler (USR2, 90 s before
the time limit, or ``scancel --signal=USR2``), which calls :meth:`TrainJob.checkpoint` (the same training again: it
resumes from its run folder's last checkpoint, bit-exact) and requeues the job with ``scontrol requeue``; SLURM's
SIGTERM then ends the training as KILLED (its lock released) and the requeued job resumes it.  The training ignores
USR2 (it is submitit's, not Lightning's), and Lightning's own SLURM requeue (SIGUSR1, hpc checkpoints) is off
(study.runner.world.build_trainer): one requeue, submitit's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def train_argv(params: str | None, overrides: list[str]) -> list[str]:
    """The training's command line (``trainer.progress_bar=false``: its lines go to a log, not a terminal)."""
    return [sys.executable, "-m", "study.train", *(["--params", str(params)] if params else []), *overrides,
            "trainer.progress_bar=false"]


def _ignore_usr2() -> None:  # preexec_fn in submitit's one-threaded job process: the ignore survives exec
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class TrainJob:
    """A picklable job: ``TrainJob(root, params)(overrides)`` trains one run in ``root`` and returns its exit status.

    Raises:
        RuntimeError: the training exited non-zero (submitit records it with the job's log).
    """

    def __init__(self, root: str, params: str | None):
        self.root, self.params = str(root), params

    def __call__(self, overrides: list[str]) -> int:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([self.root, *[p for p in [env.get("PYTHONPATH")] if p]])
        env.pop("STUDY_PARENT_PID", None)  # a SLURM job outlives the stage that submitted it
        proc = subprocess.Popen(train_argv(self.params, list(overrides)), cwd=self.root, env=env,
                                preexec_fn=_ignore_usr2)
        try:
            rc = proc.wait()
        finally:  # submitit's requeue ends this process (SystemExit in its handler): the training goes first
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if rc:
            raise RuntimeError(f"python -m study.train {' '.join(overrides)} exited with status {rc}")
        return rc

    def checkpoint(self, overrides: list[str]):
        """submitit's preemption or time-limit hook: the same training, which resumes from its last checkpoint."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(TrainJob(self.root, self.params), overrides)


def log_path(root: Path, log_dir: str, run: Path) -> Path:
    """The local launcher's log of the run in folder ``run``: ``log_dir/<run folder relative to root>.log``."""
    try:
        rel = run.resolve().relative_to(root.resolve())
    except ValueError:
        rel = Path(*run.resolve().parts[-3:])
    return root / log_dir / f"{rel.as_posix()}.log"
