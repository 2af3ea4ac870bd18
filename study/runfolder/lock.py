"""The run folder's lock: one process writes a run folder at a time (an OS file lock, ``out_dir/.lock``, released
when its process dies, SIGKILL included)."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from study.config import StudyError
from study.runfolder import LOCK_FILE


class RunBusy(StudyError):
    """Another process is writing the same run folder."""


def run_lock(out_dir: Path):
    """The run folder's lock (``out_dir/.lock``, an OS file lock: released when its process dies,
    SIGKILL included).  Acquire with ``timeout=0``-style refusal: see :func:`hold_run_lock`."""
    from filelock import FileLock

    out_dir.mkdir(parents=True, exist_ok=True)
    return FileLock(str(out_dir / LOCK_FILE), timeout=0)


@contextmanager
def hold_run_lock(out_dir: Path):
    """Hold :func:`run_lock` for the block; a second holder is refused with :class:`RunBusy`."""
    from filelock import Timeout

    lock = run_lock(out_dir)
    try:
        lock.acquire()
    except Timeout:
        raise RunBusy(f"another process is writing {out_dir} (it holds {out_dir / '.lock'}): wait for it to end "
                      f"or stop it; a different run needs its own folder (study.group=NAME)") from None
    try:
        yield lock
    finally:
        lock.release()
