"""Token arrays -> litdata chunks (``litdata.optimize`` with ``TokensLoader``).

litdata's ``optimize`` runs its worker function in a worker process that imports this module, so it
stays light: litdata and pyarrow are imported inside the functions, torch and Lightning never.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path

HF_ROWS_PER_INPUT = 4096  # rows of the tokenised dataset per litdata input (source hf)


def _emit(tokens):
    """litdata worker function: yield one document's token array (must be importable)."""
    yield tokens


def write_chunks(inputs, out_dir: Path, chunk_bytes: str, fn=_emit) -> None:
    """Write ``fn(input)`` for every input as litdata token chunks to ``out_dir`` (one worker, so the
    chunks are in input order), then make its index.json stable (:func:`stable_index`)."""
    from litdata import TokensLoader, optimize

    with _ctrl_c_raises():
        optimize(fn=fn, inputs=inputs, output_dir=str(out_dir), chunk_bytes=chunk_bytes,
                 item_loader=TokensLoader(), num_workers=1, mode="overwrite", verbose=False)
    stable_index(out_dir)


@contextmanager
def _ctrl_c_raises():
    """Ctrl-C during ``optimize`` raises KeyboardInterrupt, as anywhere else.  litdata's DataProcessor
    installs a SIGINT handler that stops its workers and calls ``os._exit(0)``: the prepare vanished
    with status 0, its temporary folder left behind; and the handler stayed installed after optimize.
    Here the workers are stopped the same way, then KeyboardInterrupt unwinds the build (which removes
    its temporary folder), and the previous SIGINT handler comes back afterwards."""
    import signal
    import threading

    from litdata.processing.data_processor import DataProcessor

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(self, signum, frame):
        for stop_queue in getattr(self, "stop_queues", None) or []:
            stop_queue.put(None)
        for w in getattr(self, "workers", None) or []:
            w.join(0)
        raise KeyboardInterrupt

    previous, original = signal.getsignal(signal.SIGINT), DataProcessor.__dict__.get("_signal_handler")
    DataProcessor._signal_handler = handler
    try:
        yield
    finally:
        if original is not None:
            DataProcessor._signal_handler = original
        else:
            del DataProcessor._signal_handler
        signal.signal(signal.SIGINT, previous)


def stable_index(split_dir: Path) -> None:
    """Make litdata's ``index.json`` a function of the data alone: litdata writes the wall-clock time
    of ``optimize`` as ``updated_at`` (its cache key for remote copies), which would give identical
    chunks a new DVC hash on every prepare; it becomes a digest of the chunk list and config instead
    (litdata only compares it for equality).  Same format as litdata's (``json.dump``, sorted keys)."""
    path = split_dir / "index.json"
    index = json.loads(path.read_text())
    body = {k: v for k, v in index.items() if k != "updated_at"}
    index["updated_at"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index, sort_keys=True))
    tmp.replace(path)


_TOKEN_COLUMNS: dict = {}


def emit_hf_rows(spec):
    """litdata worker function (importable: litdata spawns its worker): ``spec`` = (arrow files of the
    tokenised dataset, sorted row indices of one block); yield each row's token array, one item per
    document, in row order.  The files are memory-mapped once per process."""
    import pyarrow as pa

    files, rows = spec
    column = _TOKEN_COLUMNS.get(files)
    if column is None:
        column = _TOKEN_COLUMNS[files] = pa.concat_tables(
            [pa.ipc.open_stream(pa.memory_map(f)).read_all() for f in files]).column("ids")
    start = int(rows[0])
    block = column.slice(start, int(rows[-1]) + 1 - start).combine_chunks()
    offsets, values = block.offsets.to_numpy(), block.values.to_numpy()
    for r in rows:
        j = int(r) - start
        yield values[offsets[j]:offsets[j + 1]]


def release_hf_rows() -> None:
    """Drop the memory maps :func:`emit_hf_rows` holds in this process."""
    _TOKEN_COLUMNS.clear()
