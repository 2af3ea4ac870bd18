"""SIGTERM as an exception: what every long-running stage (training, prepare) needs to end cleanly when it is
stopped, at the lowest layer so that the data package and the runner both use it."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Killed(SystemExit):
    """Raised in the main thread by SIGTERM while a run trains (or prepare builds): exit status 128 + signal number."""


@contextmanager
def terminate_as_exception():
    """Turn SIGTERM into :class:`Killed` for the block (main thread only), so that the run is marked
    KILLED and its lock released instead of the process vanishing.  Lightning's own SIGTERM handler,
    installed during fit, calls this one after its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Killed(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
