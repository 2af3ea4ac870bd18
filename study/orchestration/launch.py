"""The launchers: where a stage's missing runs train (conf/launcher/, resolved by study.config.launcher).

``local``: ``study.jobs`` trainings at once on this machine, a ``concurrent.futures`` thread pool whose workers each
run one :mod:`study.orchestration.job` command as a child process (its lines in ``launcher.log_dir``); with a GPU
trainer, one training per GPU (``launcher.jobs_per_gpu`` per GPU; ``trainer.devices`` GPUs each), every GPU the
machine shows, each training its own ``CUDA_VISIBLE_DEVICES`` (study.config.launcher.gpu_slots); every
training dies with its stage (PR_SET_PDEATHSIG, armed by the training itself: ``STUDY_PARENT_PID``), and Ctrl-C or
SIGTERM of the stage terminates them (each marks its run KILLED and frees its lock); so does SIGHUP (the terminal closed).

``slurm``: one job array per batch of missing runs, submitted by submitit's SLURM executor (``map_array``), one
training per job, and recorded beside the runs (study.orchestration.arrays); the stage polls ``squeue`` (every state,
so a finished task's own state is read, and a queued task's reason) until every task has ended, and Ctrl-C, SIGTERM or
SIGHUP of the stage cancels the array.  A requeued task (preemption, time limit) stays in the queue and resumes from
its checkpoint.  A stage that ended without cancelling (SIGKILL) leaves its array queued: the next start waits for
the tasks that still train its runs instead of submitting them again.

Either way the stage then reads the run folders: a run without metrics.json is a failure, named with its job
(exit status or SLURM job id and state) and its log; a diverged run is a lost point, not a failure.
"""
from __future__ import annotations

import contextlib
import io
import os
import queue
import signal
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from study.config import StudyError
from study.config.launcher import gpu_slots, resolve_launcher
from study.runner.signals import Killed
from study.orchestration.arrays import ACTIVE, check_commands, drop_if_ended, squeue_tasks, write_record
from study.orchestration.job import TrainJob, log_path, train_argv
from study.orchestration.live_line import StageLine, queue_words, run_outcome

#: the environment variable that tells a training the pid of the stage it must die with (study.runner.world)
PARENT_ENV = "STUDY_PARENT_PID"


def _last_line(path: Path) -> str:
    """The last non-empty line of a log (at most 200 characters), or ''."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 8192))
            lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def launch(todo: list[tuple[Path, list[str]]], root: Path, params: str | None, cfg, line: StageLine,
           jobs: int | None = None, earlier: dict | None = None) -> list[str]:
    """Train every (run folder, study.train overrides) of ``todo`` on ``cfg``'s launcher; wait until all have ended.
    ``earlier`` (slurm): {run folder: the task of an earlier array that trains it} (study.orchestration.arrays.
    earlier_tasks): waited for, not submitted again.

    Returns: one description per run that did not finish (no metrics.json): the folder, the job (exit status, or
    SLURM job id and state) and its log.

    Raises:
        StudyError: under slurm, SLURM's commands are missing or sbatch refused the array (one line).
    """
    res = resolve_launcher(cfg)
    if res["executor"] == "slurm":
        return SlurmLauncher(res, root, params).run(todo, line, earlier)
    gpu = cfg.trainer.accelerator in ("gpu", "cuda")
    slots = gpu_slots(cfg, visible_gpus()) if gpu else None  # every GPU, jobs_per_gpu trainings each (not study.jobs)
    return LocalLauncher(res, root, params, len(slots) if slots else jobs or cfg.study.jobs, slots).run(todo, line)


def visible_gpus() -> list[str]:
    """The GPU ids this machine shows, in order: CUDA_VISIBLE_DEVICES where set (its entries), else torch's device
    count (0, 1, ...); [] without CUDA.  (Asked only for a GPU trainer: study.config.launcher.gpu_slots.)"""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [x.strip() for x in env.split(",") if x.strip() and x.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


class LocalLauncher:
    """``jobs`` trainings at once on this machine (see the module docstring)."""

    def __init__(self, res: dict, root: Path, params: str | None, jobs: int, slots: list[str] | None = None):
        self.root, self.params, self.jobs, self.log_dir = Path(root), params, max(1, int(jobs)), res["log_dir"]
        self.live: dict[Path, subprocess.Popen] = {}
        self.lock, self.stopping = threading.Lock(), threading.Event()
        self.slots = queue.SimpleQueue()  # each training's CUDA_VISIBLE_DEVICES (None: a CPU training)
        for slot in (slots or [None] * self.jobs):
            self.slots.put(slot)

    def _one(self, d: Path, overrides: list[str]) -> int | None:
        log = log_path(self.root, self.log_dir, d)
        log.parent.mkdir(parents=True, exist_ok=True)
        slot = self.slots.get()  # one is free: the pool runs at most as many trainings as there are slots
        env = {**os.environ, PARENT_ENV: str(os.getpid()), **({"CUDA_VISIBLE_DEVICES": slot} if slot else {})}
        try:
            with self.lock:  # never start a training once the stage is stopping
                if self.stopping.is_set():
                    return None
                with open(log, "wb") as f:  # the latest attempt's lines
                    proc = subprocess.Popen(train_argv(self.params, overrides), cwd=self.root, env=env, stdout=f,
                                            stderr=subprocess.STDOUT)
                self.live[d] = proc
            try:
                return proc.wait()
            finally:
                with self.lock:
                    self.live.pop(d, None)
        finally:
            self.slots.put(slot)

    def queue(self, waiting: int) -> str:
        return f"local: {len(self.live)} running, {waiting} waiting ({self.jobs} at once)"

    def run(self, todo: list[tuple[Path, list[str]]], line: StageLine) -> list[str]:
        from study.runner.signals import terminate_as_exception

        failed = []
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="study-train")
        try:
            with terminate_as_exception(), hangup_as_exception():
                futures = {pool.submit(self._one, d, o): d for d, o in todo}
                left = set(futures)
                while left:
                    done, left = wait(left, timeout=1.0, return_when=FIRST_COMPLETED)
                    for fu in done:
                        d, rc = futures[fu], fu.result()
                        if rc and run_outcome(d) is None:
                            log = log_path(self.root, self.log_dir, d)
                            failed.append((d, f"{d} (exit {rc}, log {log}: {_last_line(log) or 'empty'})"))
                    line.update(self.queue(max(0, len(left) - len(self.live))))
        finally:
            self.stopping.set()
            with self.lock:
                procs = list(self.live.values())
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:  # each marks its run KILLED and releases its lock; one that hangs is killed
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            pool.shutdown(wait=True, cancel_futures=True)
        line.close(self.queue(0))
        order = {d: i for i, (d, _) in enumerate(todo)}
        return [text for _, text in sorted(failed, key=lambda x: order[x[0]])]  # in the order of the runs


def slurm_parameters(res: dict, root: Path, name: str) -> dict:
    """submitit's SlurmExecutor parameters of a resolved launcher (study.config.launcher.resolve_launcher)."""
    p = {"job_name": name, "time": int(res["timeout_min"]), "nodes": int(res["nodes"]),
         "ntasks_per_node": int(res["tasks_per_node"]), "cpus_per_task": int(res["cpus_per_task"]),
         "array_parallelism": int(res["array_parallelism"]),
         "setup": [f"cd {root}", f"export PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}", *res["setup"]]}
    for key in ("partition", "account", "qos", "constraint"):
        if res[key]:
            p[key] = str(res[key])
    if res["gpus_per_node"]:
        p["gpus_per_node"] = int(res["gpus_per_node"])
    if res["mem_gb"]:
        p["mem"] = f"{int(res['mem_gb'] * 1024)}M"
    if res["additional"]:
        p["additional_parameters"] = dict(res["additional"])
    return p


def sacct_state(job_id: str) -> str:
    """The final state of one job from SLURM's accounting, or "ended" where accounting is off."""
    try:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], capture_output=True,
                             text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out[0] if out else "ended"


@contextlib.contextmanager
def hangup_as_exception():
    """SIGHUP (the stage's terminal closed, a login session lost) raises :class:`study.runner.signals.Killed` in the
    block, as SIGTERM does, so that the stage stops its trainings (cancels its array) before it exits.  Not where
    SIGHUP is ignored (``nohup``) or off the main thread."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        yield
        return

    def on_hup(signum, _frame):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # one is enough: the clean-up is not cut short by another
        raise Killed(128 + signum)

    previous = signal.signal(signal.SIGHUP, on_hup)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _say(text: str) -> None:
    """Print a line; a terminal that is gone (SIGHUP) is no reason to stop a clean-up."""
    try:
        print(text, flush=True)
    except OSError:
        pass


class SlurmLauncher:
    """One job array per batch, through submitit (see the module docstring); the tasks of an earlier array that
    still train runs of the batch (study.orchestration.arrays) are waited for, not submitted again."""

    def __init__(self, res: dict, root: Path, params: str | None):
        self.res, self.root, self.params = res, Path(root), params
        self.folder = self.root / res["log_dir"]

    def submit(self, todo: list[tuple[Path, list[str]]], name: str):
        """Submit the array; returns submitit's jobs (one per run, in order).

        Raises:
            StudyError: SLURM's commands are not on PATH, or sbatch refused the array (what it said; one line).
        """
        import submitit
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        check_commands()
        try:
            ex = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=int(self.res["max_requeues"]))
            ex.update_parameters(**slurm_parameters(self.res, self.root, name))
            with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's refusal too: said once, below
                return ex.map_array(TrainJob(str(self.root), self.params), [list(o) for _, o in todo])
        except (FailedJobError, FailedSubmissionError, subprocess.SubprocessError, RuntimeError, ValueError) as e:
            said = "; ".join(x.strip() for x in str(e).splitlines() if x.strip())[:400] or type(e).__name__
            raise StudyError(f"SLURM refused the job array: {said}: fix what it names (conf/launcher/slurm.yaml, "
                             f"launcher.* overrides such as launcher.partition, or the cluster's SLURM set-up), or "
                             f"train on this machine with launcher=local") from None

    def run(self, todo: list[tuple[Path, list[str]]], line: StageLine, earlier: dict | None = None) -> list[str]:
        """Submit the runs of ``todo`` that no task of ``earlier`` ({folder: task}, study.orchestration.arrays.
        earlier_tasks) trains, wait for all; Ctrl-C, SIGTERM or SIGHUP cancels them (the new array and the earlier
        tasks).  Returns the failures (see :func:`launch`)."""
        from study.runner.signals import terminate_as_exception

        earlier = dict(earlier or {})
        jobs_of = {d: (t["job"], Path(t["log_folder"]) / f"{t['job']}_0_log.err") for d, t in earlier.items()}
        arrays = sorted({t["job"].split("_")[0] for t in earlier.values()})
        records = {t["record"] for t in earlier.values()}
        for a in arrays:
            n = sum(t["job"].split("_")[0] == a for t in earlier.values())
            _say(f"{line.label}: waiting for SLURM job array {a}, submitted earlier: {n} of its runs are still queued "
                 f"or running (not submitted again)")
        new = [(d, o) for d, o in todo if d not in earlier]
        states = {}
        try:
            with terminate_as_exception(), hangup_as_exception():
                if new:
                    jobs = self.submit(new, "study-" + line.label.replace(" ", "-").replace(":", ""))
                    array = jobs[0].job_id.split("_")[0]
                    records.add(write_record(new, [j.job_id for j in jobs], array, self.folder, self.params))
                    jobs_of.update({d: (j.job_id, j.paths.stderr) for (d, _), j in zip(new, jobs)})
                    arrays.append(array)
                    _say(f"{line.label}: submitted SLURM job array {array} ({len(jobs)} runs; logs in {self.folder})")
                states = self._wait(arrays, [j for j, _ in jobs_of.values()], line)
        except BaseException:
            self._cancel(arrays, earlier, records, line)
            raise
        for rec in records:
            drop_if_ended(rec)
        failed = []
        for d, _ in todo:
            if run_outcome(d) is None:
                job, err = jobs_of[d]
                state = states.get(job)
                state = sacct_state(job) if state in (None, "GONE") else state
                failed.append(f"{d} (SLURM job {job}, {state}, log {err}: {_last_line(err) or 'empty'})")
        return failed

    def _wait(self, arrays: list[str], ids: list[str], line: StageLine) -> dict[str, str]:
        """Poll squeue (every state) until no task of ``ids`` is queued or running; returns their last states."""
        states, reasons, t0 = {i: "PENDING" for i in ids}, {}, time.time()
        while True:
            for a in arrays:
                now = squeue_tasks(a)
                for i in [i for i in ids if i.split("_")[0] == a] if now is not None else ():
                    if i in now:
                        states[i], reasons[i] = now[i]
                    elif states[i] != "PENDING" or time.time() - t0 > 60:  # gone from SLURM's memory: ended
                        states[i] = "GONE" if states[i] in ACTIVE else states[i]
            active = [(states[i], reasons.get(i, "")) for i in ids if states[i] in ACTIVE]
            line.update(f"slurm array {', '.join(arrays)}: " + (queue_words(active) or "all ended"))
            if not active:
                line.close(f"slurm array {', '.join(arrays)}: all ended")
                return states
            time.sleep(float(self.res["poll_s"]))

    def _cancel(self, arrays: list[str], earlier: dict, records: set, line: StageLine) -> None:
        """scancel the stage's new array (whole) and the earlier tasks it had taken over; drop the new array's record."""
        mine = [a for a in arrays if a not in {t["job"].split("_")[0] for t in earlier.values()}]
        got = subprocess.run(["scancel", *mine, *[t["job"] for t in earlier.values()]], capture_output=True)
        if got.returncode == 0:
            for rec in records:
                if rec.stem in mine:
                    rec.unlink(missing_ok=True)
        _say(f"\n{line.label}: cancelled SLURM job array {', '.join(arrays)}")
