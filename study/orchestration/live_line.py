"""The one live line of a stage while it waits for its trainings, on either launcher::

    tune baseline: 3/8 runs (1 lost), 02:41 elapsed, ~04:10 left | slurm array 812: 2 running, 3 pending (Resources)

runs finished (reused ones included) of the batch's total, lost points (diverged runs), elapsed time, the time
left estimated from the runs finished since the launch, and the launcher's queue state (under SLURM, why queued tasks
wait: squeue's reason, e.g. ``ReqNodeNotAvail, UnavailableNodes:n12`` for a drained node).  On a terminal the line is
rewritten in place; elsewhere (DVC's log, CI) it is printed when a count changes and once a minute.  Each
training's own lines are in its log (launcher.log_dir)."""
from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

from study.runfolder import METRICS_FILE, RECORD_FILE


def _clock(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def run_outcome(d: Path) -> str | None:
    """"ok", "lost" (a diverged run: a lost point) or None (not finished) of the run folder ``d``."""
    if not (d / METRICS_FILE).is_file():
        return None
    try:
        status = json.loads((d / RECORD_FILE).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return "ok"
    return "lost" if status == "diverged" else "ok"


def queue_words(tasks: list[tuple[str, str]]) -> str:
    """The queue of a SLURM stage from its active tasks' (state, reason): ``1 running, 3 pending (Resources)``; the
    pending tasks' reasons (squeue's %r; "None" left out) follow their count, each with its count when they differ."""
    count = collections.Counter(state.lower() for state, _ in tasks)
    why = collections.Counter(r for state, r in tasks if state == "PENDING" and r and r != "None")
    parts = []
    for state, n in sorted(count.items()):
        words = f"{n} {state}"
        if state == "pending" and why:
            words += " (" + "; ".join(k if len(why) == 1 else f"{m} {k}" for k, m in why.most_common()) + ")"
        parts.append(words)
    return ", ".join(parts)


class StageLine:
    """The live line of one launch: ``update(queue)`` after each look at the launcher, ``close()`` at the end.

    Args:
        label: the stage's words before the counts (e.g. "tune baseline").
        runs: every run folder of the batch; reused: how many of them were finished before the launch.
        stream: where the line goes (default sys.stderr); tty: rewrite in place (default: stream.isatty()).
        launched: the folders of ``runs`` that this launch trains; such a folder counts as finished only once its
            metrics.json is newer than the launch (a run re-trained under new settings still holds the old one
            until its training starts).  Default: none (every finished folder counts).
    """

    def __init__(self, label: str, runs: list[Path], reused: int, stream=None, tty: bool | None = None,
                 every_s: float = 60.0, launched: list[Path] = ()):
        self.label, self.runs, self.reused = label, list(runs), reused
        self.launched = set(launched)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.t0, self.every_s, self.last, self.shown = time.time(), every_s, "", 0.0

    def _outcome(self, d: Path) -> str | None:
        if d in self.launched:
            try:
                if (d / METRICS_FILE).stat().st_mtime < self.t0:
                    return None  # the previous settings' result, about to be replaced
            except OSError:
                return None
        return run_outcome(d)

    def text(self, queue: str = "") -> str:
        out = [self._outcome(d) for d in self.runs]
        done, lost, total = sum(o is not None for o in out), sum(o == "lost" for o in out), len(self.runs)
        elapsed = time.time() - self.t0
        new = done - self.reused
        left = "?" if new <= 0 else ("0:00" if done >= total else _clock(elapsed / new * (total - done)))
        line = f"{self.label}: {done}/{total} runs ({lost} lost), {_clock(elapsed)} elapsed, ~{left} left"
        return f"{line} | {queue}" if queue else line

    def update(self, queue: str = "") -> str:
        line = self.text(queue)
        counts = line.split(",", 1)[0] + line.split("|", 1)[-1]
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
        elif counts != self.last or time.time() - self.shown >= self.every_s:
            print(line, file=self.stream, flush=True)
            self.shown = time.time()
        self.last = counts
        return line

    def close(self, queue: str = "") -> None:
        line = self.text(queue)
        if self.tty:
            self.stream.write("\r\033[K" + line + "\n")
        else:
            print(line, file=self.stream)
        self.stream.flush()
