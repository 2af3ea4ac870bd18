"""SIGTERM as an exception: what every long-running stage (training, prepare) needs to end cleanly when it is
stopped: the runner's trainings, the launcher that waits on them, and the prepare stage around its build."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Killed(SystemExit):
    """Raised in the main thread by SIGTERM while a run trains (or prepare builds): exit status 128 + signal number."""


#: modules a SIGTERM must not unwind: an exception raised inside the tracking store's session would leave its
#: SQLite transaction open (the traceback holds the connection) and every other writer waiting on it
_SHIELDED = ("sqlalchemy", "mlflow", "sqlite3")

#: seconds between checks whether a SIGTERM held back inside a shielded module can be raised
REDELIVER_S = 0.2


def _inside_shielded(frame) -> bool:
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_SHIELDED):
            return True
        frame = frame.f_back
    return False


@contextmanager
def terminate_as_exception():
    """Turn SIGTERM into :class:`Killed` for the block (main thread only), so that the run is marked
    KILLED and its lock released instead of the process vanishing.  Lightning's own SIGTERM handler,
    installed during fit, calls this one after its own.

    A SIGTERM that lands inside the tracking store's code (MLflow, SQLAlchemy, sqlite3) is held back and raised as
    soon as that code has returned (checked every :data:`REDELIVER_S` seconds by SIGALRM): raised there, it would
    leave the store locked for every other training.  One held back when the block ends is raised as the block
    ends.  Once :class:`Killed` is raised, further SIGTERMs in the block are ignored, so that the run's clean-up
    (its MLflow status) is not cut short by a second one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"pending": 0, "fired": False}

    def fire(signum, frame):
        if state["fired"]:
            return
        if _inside_shielded(frame):
            state["pending"] = signum
            signal.setitimer(signal.ITIMER_REAL, REDELIVER_S)  # look again once the store's code may have left
            return
        state["fired"] = True
        raise Killed(128 + signum)

    def on_term(signum, frame):
        fire(signum, frame)

    def on_alarm(_signum, frame):
        if state["pending"]:
            fire(state["pending"], frame)

    previous = signal.signal(signal.SIGTERM, on_term)
    previous_alarm = signal.signal(signal.SIGALRM, on_alarm)
    ok = False
    try:
        yield
        ok = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_alarm)
        signal.signal(signal.SIGTERM, previous)
    if ok and state["pending"] and not state["fired"]:  # held back to the end of the block: raised here
        raise Killed(128 + state["pending"])
