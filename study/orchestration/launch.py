"""The launchers: where a stage's missing runs train (conf/launcher/, resolved by study.config.launcher).

``local``: ``study.jobs`` trainings at once on this machine, a ``concurrent.futures`` thread pool whose workers each
run one :mod:`study.orchestration.job` command as a child process (its lines in ``launcher.log_dir``); every
training dies with its stage (PR_SET_PDEATHSIG, armed by the training itself: ``STUDY_PARENT_PID``), and Ctrl-C or
SIGTERM of the stage terminates them (each marks its run KILLED and frees its lock).

``slurm``: one job array per batch of missing runs, submitted by submitit's SLURM executor (``map_array``), one
training per job; the stage polls ``squeue`` (every state, so a finished task's own state is read) until every task
has ended, and Ctrl-C or SIGTERM of the stage cancels the array.  A requeued task (preemption, time limit) stays in
the queue and resumes from its checkpoint.

Either way the stage then reads the run folders: a run without metrics.json is a failure, named with its job
(exit status or SLURM job id and state) and its log; a diverged run is a lost point, not a failure.
"""
from __future__ import annotations

import collections
import os
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from study.config.launcher import resolve_launcher
from study.orchestration.job import TrainJob, log_path, train_command
from study.orchestration.progress import StageLine, run_outcome

#: the environment variable that tells a training the pid of the stage it must die with (study.runner.launch)
PARENT_ENV = "STUDY_PARENT_PID"
#: SLURM states of a task that has not ended (it may still run, or run again after a requeue)
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}


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
           jobs: int | None = None) -> list[str]:
    """Train every (run folder, study.train overrides) of ``todo`` on ``cfg``'s launcher; wait until all have ended.

    Returns: one description per run that did not finish (no metrics.json): the folder, the job (exit status, or
    SLURM job id and state) and its log.
    """
    res = resolve_launcher(cfg)
    if res["executor"] == "slurm":
        return SlurmLauncher(res, root, params).run(todo, line)
    return LocalLauncher(res, root, params, jobs or cfg.study.jobs).run(todo, line)


class LocalLauncher:
    """``jobs`` trainings at once on this machine (see the module docstring)."""

    def __init__(self, res: dict, root: Path, params: str | None, jobs: int):
        self.root, self.params, self.jobs, self.log_dir = Path(root), params, max(1, int(jobs)), res["log_dir"]
        self.live: dict[Path, subprocess.Popen] = {}
        self.lock, self.stopping = threading.Lock(), threading.Event()

    def _one(self, d: Path, overrides: list[str]) -> int | None:
        log = log_path(self.root, self.log_dir, d)
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        with self.lock:  # never start a training once the stage is stopping
            if self.stopping.is_set():
                return None
            with open(log, "wb") as f:  # the latest attempt's lines
                proc = subprocess.Popen(train_command(self.params, overrides), cwd=self.root, env=env, stdout=f,
                                        stderr=subprocess.STDOUT)
            self.live[d] = proc
        try:
            return proc.wait()
        finally:
            with self.lock:
                self.live.pop(d, None)

    def queue(self, waiting: int) -> str:
        return f"local: {len(self.live)} running, {waiting} waiting ({self.jobs} at once)"

    def run(self, todo: list[tuple[Path, list[str]]], line: StageLine) -> list[str]:
        from study.runner.run_state import terminate_as_exception

        failed = []
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="study-train")
        try:
            with terminate_as_exception():
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


def squeue_states(array_id: str) -> dict[str, str] | None:
    """{task id "ARRAY_TASK": state} of every task of the array SLURM still knows (any state; None on an error)."""
    try:
        got = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", str(array_id), "-o", "%i %T"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if got.returncode:
        return None if "Invalid job id" not in got.stderr else {}
    out = got.stdout
    return dict(x.split(None, 1) for x in out.splitlines() if len(x.split(None, 1)) == 2)


def sacct_state(job_id: str) -> str:
    """The final state of one job from SLURM's accounting, or "ended" where accounting is off."""
    try:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], capture_output=True,
                             text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out[0] if out else "ended"


class SlurmLauncher:
    """One job array per batch, through submitit (see the module docstring)."""

    def __init__(self, res: dict, root: Path, params: str | None):
        self.res, self.root, self.params = res, Path(root), params
        self.folder = self.root / res["log_dir"]

    def submit(self, todo: list[tuple[Path, list[str]]], name: str):
        """Submit the array; returns submitit's jobs (one per run, in order)."""
        import submitit

        ex = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=int(self.res["max_requeues"]))
        ex.update_parameters(**slurm_parameters(self.res, self.root, name))
        return ex.map_array(TrainJob(str(self.root), self.params), [list(o) for _, o in todo])

    def run(self, todo: list[tuple[Path, list[str]]], line: StageLine) -> list[str]:
        from study.runner.run_state import terminate_as_exception

        jobs = self.submit(todo, "study-" + line.label.replace(" ", "-").replace(":", ""))
        array = jobs[0].job_id.split("_")[0]
        print(f"{line.label}: submitted SLURM job array {array} ({len(jobs)} runs; logs in {self.folder})", flush=True)
        ids = [j.job_id for j in jobs]
        states, t0 = {i: "PENDING" for i in ids}, time.time()
        try:
            with terminate_as_exception():
                while True:
                    now = squeue_states(array)
                    for i in ids if now is not None else ():
                        if i in now:
                            states[i] = now[i]
                        elif states[i] != "PENDING" or time.time() - t0 > 60:  # gone from SLURM's memory: ended
                            states[i] = "GONE" if states[i] in ACTIVE else states[i]
                    active = [i for i in ids if states[i] in ACTIVE]
                    count = collections.Counter(states[i].lower() for i in active)
                    line.update(f"slurm array {array}: " + (", ".join(f"{n} {s}" for s, n in sorted(count.items()))
                                                            or "all ended"))
                    if not active:
                        break
                    time.sleep(float(self.res["poll_s"]))
        except BaseException:
            subprocess.run(["scancel", array], capture_output=True)
            print(f"\n{line.label}: cancelled SLURM job array {array}", flush=True)
            raise
        line.close(f"slurm array {array}: all ended")
        failed = []
        for (d, _), job in zip(todo, jobs):
            if run_outcome(d) is None:
                state = states.get(job.job_id)
                state = sacct_state(job.job_id) if state in (None, "GONE") else state
                err = job.paths.stderr
                failed.append(f"{d} (SLURM job {job.job_id}, {state}, log {err}: {_last_line(err) or 'empty'})")
        return failed
