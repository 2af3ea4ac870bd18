"""The measurement: each phase of the GPU check run as a subprocess under its own time limit, what the
phases read back (checkpoints, MLflow metrics, curves, the training windows read) and the results kept."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from study.gpu_check.image import SITECUSTOMIZE, image_blocklist, wheel_name
from study.gpu_check.plan import TARGETS, GpuCheckError
from study.gpu_check.results_md import markdown


# -- running phases ----------------------------------------------------------------------------------------
class Runner:
    """Runs each phase as a subprocess under its own time limit and a global deadline; keeps the results
    and rewrites ``out/results.json`` + ``out/results.md`` after every phase."""

    def __init__(self, args, profile: dict, root: Path, out: Path, work: Path):
        self.args, self.p, self.root, self.out, self.work = args, profile, root, out, work
        self.t0 = time.monotonic()
        self.deadline = self.t0 + (args.budget or profile["total"])
        self.log = out / "log.txt"
        self.env = dict(os.environ)
        self.env.update(PYTHONUNBUFFERED="1", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
        self.env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [self.env.get("PYTHONPATH")])])
        self.results: dict = {"profile": "cpu" if args.cpu else "gpu", "date": time.strftime("%Y-%m-%d"),
                              "phases": {}, "checks": {}, "targets": {}}

    # phase bookkeeping
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, phase: str) -> float:
        return max(0.0, min(float(self.p["budgets"][phase]), self.left()))

    def run(self, phase: str, cmd: list[str], limit: float, env: dict | None = None) -> tuple[int | None, float]:
        """Run ``cmd`` (cwd = project root) with output appended to log.txt; kill its process group at
        ``limit`` seconds.  Returns (exit code or None when killed, seconds)."""
        t = time.monotonic()
        with open(self.log, "a") as log:
            log.write(f"\n=== {phase}: {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.root, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
                log.write(f"=== {phase}: killed at its limit of {limit:.0f} s\n")
        return rc, time.monotonic() - t

    def phase(self, name: str, status: str, seconds: float, **extra) -> None:
        self.results["phases"][name] = {"status": status, "seconds": round(seconds, 1), **extra}
        self.write()

    def write(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.out / "results.json")
        (self.out / "results.md").write_text(markdown(self.results))

    # -- the phases -------------------------------------------------------------------------------------
    def install(self) -> bool:
        wheels = sorted((self.args.gpu_dir / "wheels").glob("*.whl"))
        site = self.args.gpu_dir / "site"
        if self.args.simulate_image:  # this Python's packages, less what the GPU machine would lack
            if not wheels:
                raise GpuCheckError(f"--simulate-image needs the wheels in {self.args.gpu_dir / 'wheels'}: run "
                                    f"`make gpu-prep` first")
            blocked = image_blocklist({wheel_name(w) for w in wheels})
            sim = self.work / "image-sim"
            sim.mkdir(parents=True, exist_ok=True)
            (sim / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=sorted(blocked)))
            self.env["PYTHONPATH"] = os.pathsep.join([str(sim), self.env["PYTHONPATH"]])
            self.phase("install", "skipped (--simulate-image: this Python's packages less those the image lacks "
                                  "and .gpu/wheels does not carry)", 0.0, blocked=sorted(blocked))
            return True
        if self.args.cpu or not wheels:  # the wheels are for the GPU machine's Python 3.12
            self.phase("install", "skipped (the running Python's own packages are used)", 0.0)
            return True
        shutil.rmtree(site, ignore_errors=True)
        rc, s = self.run("install", [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                     "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--target", str(site),
                                     *map(str, wheels)], self.limit("install"))
        ok = rc == 0
        if ok:
            self.env["PYTHONPATH"] = os.pathsep.join([str(site.resolve()), self.env["PYTHONPATH"]])
        self.phase("install", "ok" if ok else f"failed (exit {rc}, see log.txt)", s, wheels=len(wheels))
        return ok

    def environment(self) -> bool:
        """Versions, the GPU, and whether each package the phases import imports (each one alone, so that
        one failure names itself); False only when the GPU profile finds no GPU (nothing else can run)."""
        probe = self.work / "env.json"
        code = ("import importlib, json, platform, sys\n"
                "d = {'python': sys.version.split()[0], 'machine': platform.machine(), 'import_errors': {}}\n"
                "for name in ('torch', 'lightning', 'torchmetrics', 'omegaconf', 'litdata', 'mlflow', 'sqlalchemy',"
                " 'alembic', 'boto3'):\n"
                "    try:\n"
                "        d[name] = getattr(importlib.import_module(name), '__version__', '?')\n"
                "    except Exception as e:\n"
                "        d['import_errors'][name] = '%s: %s' % (type(e).__name__, str(e).splitlines()[0] if str(e) else '')\n"
                "import torch\n"
                "d['cuda'] = torch.cuda.is_available()\n"
                "if d['cuda']:\n"
                "    p = torch.cuda.get_device_properties(0)\n"
                "    d.update(device=torch.cuda.get_device_name(0), capability='%d.%d' % (p.major, p.minor),"
                " memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,"
                " cuda_version=torch.version.cuda)\n"
                f"open({str(probe)!r}, 'w').write(json.dumps(d))\n")
        rc, s = self.run("env", [sys.executable, "-c", code], self.limit("env"))
        env = json.loads(probe.read_text()) if rc == 0 and probe.is_file() else {}
        self.results["environment"] = env
        ok = bool(env) and not env["import_errors"]
        status = "ok" if ok else ("failed (see log.txt)" if not env else
                                  f"import errors: {', '.join(env['import_errors'])} (see results.json)")
        self.phase("env", status, s)
        return bool(env) and (self.args.cpu or env["cuda"])

    def bench(self, mode: str) -> None:
        phase = f"bench_{mode}"
        limit = self.limit(phase)
        if limit < 5:
            self.phase(phase, "skipped (no time left)" if self.p["budgets"][phase] else "skipped (not in this profile)", 0.0)
            return
        b = self.p["bench"]
        path = self.work / f"{phase}.json"
        cmd = [sys.executable, "-m", "study.bench", "--steps", str(b["steps"]), "--repeats", str(b["repeats"]),
               "--variants", b["variants"], "--precisions", b["precision"], "--modes", mode, "--json", str(path),
               *self.p["model"], f"train.batch_tokens={b['batch_tokens']}"]
        rc, s = self.run(phase, cmd, limit)
        rows = json.loads(path.read_text())["rows"] if path.is_file() else []
        self.results.setdefault("bench", []).extend(rows)
        if path.is_file():
            self.results["bench_setup"] = {k: v for k, v in json.loads(path.read_text()).items() if k != "rows"}
        status = "ok" if rc == 0 else ("killed at its time limit" if rc is None else f"failed (exit {rc})")
        self.phase(phase, status, s, rows=len(rows))
        self.targets()

    def train_overrides(self) -> list[str]:
        t, w = self.p["train"], self.work
        # the data.* settings the tokens were prepared with, read where the trainings run: study.data needs
        # omegaconf, which this process lacks on a GPU image until the wheels are on the phases' PYTHONPATH
        code = ("import json, sys; from study.data.records import prepared_overrides; "
                "print(json.dumps(prepared_overrides(sys.argv[1])))")
        done = subprocess.run([sys.executable, "-c", code, str(self.args.tokens.resolve())], cwd=self.root,
                              env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise GpuCheckError(f"reading {self.args.tokens}/meta.json failed: "
                                f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        prepared = json.loads(done.stdout.strip().splitlines()[-1])
        return [*self.p["model"], *prepared, "variant=baseline", "seed=1",
                f"data.dir={self.args.tokens.resolve()}",
                f"study.runs_dir={w / 'runs'}", f"study.tracking_db={w / 'mlruns.db'}",
                f"study.artifact_dir={w / 'mlartifacts'}", "study.name=gpu-check",
                f"train.tokens={t['steps'] * t['batch_tokens']}", f"train.batch_tokens={t['batch_tokens']}",
                f"train.micro_batch_size={t['micro']}", f"train.lr={t['lr']}", f"train.min_lr={t['min_lr']}",
                f"train.warmup_tokens={t['warmup_steps'] * t['batch_tokens']}", f"train.eval_every={t['eval_every']}",
                f"train.val_tokens={t['val_windows'] * self.block_size()}", f"train.val_micro_batch_size={t['val_micro']}",
                f"train.log_every={min(10, t['eval_every'])}", "trainer.progress_bar=false"]

    def block_size(self) -> int:
        return 1024 if not self.args.cpu else 64

    def train(self) -> bool:
        """Train, SIGKILL once a checkpoint past ``kill_after`` steps is on disk, train again (resume)."""
        import torch  # noqa: F401 (imported now, not when the first checkpoint appears: seconds the watch may not have)

        t = self.p["train"]
        limit = self.limit("train")
        t_start = time.monotonic()
        run = self.work / "runs" / "baseline-s1"
        ckpt = run / "checkpoints" / "last.ckpt"
        rec1, rec2 = self.work / "windows-first", self.work / "windows-resumed"
        cmd = [sys.executable, "-m", "study.train", *self.train_overrides()]
        out: dict = {"steps": t["steps"], "batch_tokens": t["batch_tokens"], "kill_after": t["kill_after"],
                     "log_every": min(10, t["eval_every"])}
        out["first_exit"], killed_at = self.train_until_killed(cmd, ckpt, rec1, t_start, limit)
        out["first_seconds"] = round(time.monotonic() - t_start, 1)
        if killed_at is None:
            out["error"] = ("the first run ended or ran out of time before a checkpoint past step "
                            f"{t['kill_after']} was written")
            return self.train_failed(out, "failed (see log.txt)", t_start)
        out["checkpoint_step"] = resume_step = checkpoint_step(ckpt)  # what the second run resumes from
        state = run / "checkpoints" / "run.json"
        first_mlflow_run = json.loads(state.read_text()).get("mlflow_run_id") if state.is_file() else None
        rc, _ = self.run("train (resumed)", cmd, max(1.0, limit - (time.monotonic() - t_start)),
                         env={**self.env, "STUDY_RECORD_WINDOWS": str(rec2)})
        out["resumed_exit"] = rc
        if rc != 0 or not (run / "metrics.json").is_file():
            out["error"] = "the resumed run did not finish (see log.txt)"
            return self.train_failed(out, "killed at its time limit" if rc is None else f"failed (exit {rc})", t_start)
        self.resume_checks(out, run, _windows(rec1), _windows(rec2), resume_step, first_mlflow_run)
        self.results["train"] = out
        self.phase("train", "ok", time.monotonic() - t_start)
        return True

    def train_failed(self, out: dict, status: str, t_start: float) -> bool:
        """Record a failed training phase (its partial results and status); returns False."""
        self.results["train"] = out
        self.phase("train", status, time.monotonic() - t_start)
        return False

    def train_until_killed(self, cmd: list[str], ckpt: Path, windows: Path, t_start: float,
                           limit: float) -> tuple[int, int | None]:
        """The first training, SIGKILLed once ``ckpt`` holds a step >= kill_after (or at the time limit).

        Returns: (its exit status, the checkpoint step seen at the kill; None if it never got that far)."""
        kill_after = self.p["train"]["kill_after"]
        with open(self.log, "a") as log:
            log.write(f"\n=== train (first, to be killed): {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.root, env={**self.env, "STUDY_RECORD_WINDOWS": str(windows)},
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            killed_at, seen = None, None
            while time.monotonic() - t_start < limit and proc.poll() is None:
                stamp = ckpt.stat().st_mtime_ns if ckpt.is_file() else None
                step = checkpoint_step(ckpt) if stamp is not None and stamp != seen else None
                if step is not None:
                    seen = stamp  # read each checkpoint once (Lightning replaces last.ckpt atomically)
                    if step >= kill_after:
                        os.killpg(proc.pid, signal.SIGKILL)
                        killed_at = step
                        break
                time.sleep(0.05)
            if proc.poll() is None and killed_at is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.write(f"=== train (first): exit {proc.returncode}, checkpoint step seen at the kill: {killed_at}\n")
        return proc.returncode, killed_at

    def resume_checks(self, out: dict, run: Path, first: list, resumed: list, resume_step: int,
                      first_mlflow_run: str | None) -> None:
        """The resumed run's numbers into ``out`` and its checks into results["checks"]: it finished, its loss fell,
        it continued the first MLflow run, and it read the windows after the checkpoint in the killed run's order."""
        t = self.p["train"]
        # the run's result: record.json (status, steps, ids) beside metrics.json (the numbers DVC shows)
        metrics = {**json.loads((run / "record.json").read_text()), **json.loads((run / "metrics.json").read_text())}
        curve = curve_points(run / "curve.csv")
        per_step = t["batch_tokens"] // self.block_size()
        done = resume_step * per_step
        overlap = max(0, min(len(first) - done, len(resumed)))
        out.update(
            final_steps=metrics["steps"], val_loss=metrics["val_loss"], tokens_per_s_resumed=metrics["tokens_per_s"],
            wall_time_s=metrics["wall_time_s"], curve=curve, first_windows_read=len(first),
            resumed_windows_read=len(resumed), windows_per_step=per_step, windows_compared=overlap,
            # every step after the checkpoint, plus at most what Lightning fetches ahead and a partial batch
            # dropped at an epoch's end
            resumed_reads_expected=[(t["steps"] - resume_step) * per_step, (t["steps"] - resume_step + 2) * per_step],
        )
        logged = logged_metrics(self.work / "mlruns.db", metrics["mlflow_run_id"], ("tokens_per_s", "train/device/mfu"))
        out["logged_median"] = {k: median(v) for k, v in logged.items()}  # MLflow, every log_every steps
        first_row, last_row = curve[0], curve[-1]
        checks = self.results["checks"]
        checks["mlflow_run_continued"] = first_mlflow_run is not None and first_mlflow_run == metrics["mlflow_run_id"]
        checks["train_finished"] = metrics["status"] == "ok" and metrics["steps"] == t["steps"]
        checks["loss_fell"] = bool(last_row["val_loss"] < first_row["val_loss"] and
                                   last_row["train_loss"] < first_row["train_loss"] and
                                   last_row["val_loss"] < math.log(50257 if not self.args.cpu else 512))
        # the resumed process read the windows of the steps after the checkpoint (no more: a restart from
        # step 0 would read all of them), in the order the killed process had read them from that step on
        checks["resumed_from_checkpoint"] = bool(
            0 < resume_step < t["steps"]
            and out["resumed_reads_expected"][0] <= len(resumed) <= out["resumed_reads_expected"][1]
            and first[done:done + overlap] == resumed[:overlap])
        checks["curve_spans_the_kill"] = bool(any(r["step"] <= resume_step for r in curve)
                                              and any(r["step"] > resume_step for r in curve))

    def evaluate(self) -> None:
        limit = self.limit("eval")
        ckpt = self.work / "runs" / "baseline-s1" / "checkpoints" / "last.ckpt"
        if limit < 5 or not ckpt.is_file():
            self.phase("eval", "skipped (no time left or no checkpoint)", 0.0)
            return
        path = self.work / "eval.json"
        a, b = self.p["eval_micro"]
        cmd = [sys.executable, "-m", "study.gpu_check", "--eval-checkpoint", str(ckpt), "--eval-micro", f"{a},{b}",
               "--eval-json", str(path), "--", *self.train_overrides()]
        rc, s = self.run("eval", cmd, limit)
        if rc != 0 or not path.is_file():
            self.phase("eval", "killed at its time limit" if rc is None else f"failed (exit {rc})", s)
            return
        ev = json.loads(path.read_text())
        losses = [ev["val_loss"][str(m)] for m in (a, b)]
        ev["abs_difference"] = abs(losses[0] - losses[1])
        ev["tolerance"] = self.p["val_tolerance"]
        trained = self.results.get("train", {}).get("val_loss")
        if trained is not None:
            ev["training_run_val_loss"] = trained
            ev["abs_difference_to_training_run"] = abs(losses[0] - trained)
        self.results["eval"] = ev
        self.results["checks"]["val_loss_agrees_across_batch_sizes"] = ev["abs_difference"] <= ev["tolerance"]
        self.phase("eval", "ok", s)

    def targets(self) -> None:
        rows = self.results.get("bench", [])
        best = {(r["variant"], r["mode"]): r for r in rows}
        tg = self.results["targets"]
        base = best.get(("baseline", "compiled")) or best.get(("baseline", "eager"))
        if base:
            tg["mfu_baseline"] = {"mode": base["mode"], "value": base["mfu_plain"], "lightning": base["mfu_lightning"],
                                  "target": TARGETS["mfu_baseline_compiled"],
                                  "met": base["mfu_lightning"] is not None
                                  and base["mfu_lightning"] >= TARGETS["mfu_baseline_compiled"]}
            nl = best.get(("nonlinear_q", base["mode"]))
            if nl:
                v = nl["lightning_tokens_per_s"] / base["lightning_tokens_per_s"]
                tg["nonlinear_over_baseline"] = {"mode": base["mode"], "value": v,
                                                 "target": TARGETS["nonlinear_over_baseline"],
                                                 "met": v >= TARGETS["nonlinear_over_baseline"]}
            ratios = [r["lightning_over_plain"] for r in rows if r["mode"] == base["mode"]]
            tg["lightning_over_plain"] = {"mode": base["mode"], "min": min(ratios), "max": max(ratios),
                                          "target": TARGETS["lightning_over_plain"],
                                          "met": min(ratios) >= TARGETS["lightning_over_plain"]}


def checkpoint_step(path: Path) -> int | None:
    """global_step of a Lightning checkpoint (memory-mapped: the tensors are not read), or None while
    there is none or it cannot be read yet."""
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"])
    except Exception:  # not there yet, or being replaced
        return None


def logged_metrics(db: Path, run_id: str, keys: tuple[str, ...]) -> dict[str, list[float]]:
    """The values of ``keys`` an MLflow run logged in the SQLite store ``db``, in step order."""
    import sqlite3

    if not db.is_file():
        return {}
    with sqlite3.connect(db) as con:
        rows = con.execute(f"SELECT key, value FROM metrics WHERE run_uuid = ? AND key IN ({','.join('?' * len(keys))})"
                           " ORDER BY step, timestamp", (run_id, *keys)).fetchall()
    out: dict[str, list[float]] = {}
    for key, value in rows:
        out.setdefault(key, []).append(float(value))
    return out


def median(values: list[float]) -> float | None:
    v = sorted(values)
    return None if not v else (v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2)


def _windows(folder: Path) -> list[int]:
    """Training windows a run read, in order (study.data's STUDY_RECORD_WINDOWS files, one rank)."""
    f = folder / "train-windows-rank0.txt"
    return [int(x) for x in f.read_text().split()] if f.is_file() else []


def curve_points(path: Path) -> list[dict]:
    """A run's curve.csv as rows of numbers (step and tokens as int), unchecked: this driver runs before the image has
    the study's own dependencies, so it reads the file itself rather than through study.runfolder."""
    import csv

    with open(path) as f:
        return [{k: (int(v) if k in ("step", "tokens") else float(v)) for k, v in row.items()} for row in csv.DictReader(f)]
