"""SIGTERM as an exception: what every long-running stage (training, prepare) needs to end cleanly when it is
stopped, at the lowest layer so that the data package and the runner both use it."""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager


class Killed(SystemExit):
    """Raised in the main thread by SIGTERM while a run trains (or prepare builds): exit status 128 + signal number."""


#: modules a SIGTERM must not unwind: an exception raised inside the tracking store's session would leave its
#: SQLite transaction open (the traceback holds the connection) and every other writer waiting on it
_SHIELDED = ("sqlalchemy", "mlflow", "sqlite3", "filelock")

#: seconds before a SIGTERM that arrived inside a shielded module is delivered again
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
    installed during fit, calls this one after its own.  A SIGTERM that lands inside the tracking store's code
    (MLflow, SQLAlchemy, sqlite3, filelock) is delivered again :data:`REDELIVER_S` seconds later, once that code
    has left: raised there, it would leave the store locked for every other training."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _inside_shielded(frame):
            timer = threading.Timer(REDELIVER_S, os.kill, (os.getpid(), signum))
            timer.daemon = True
            timer.start()
            return
        raise Killed(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
