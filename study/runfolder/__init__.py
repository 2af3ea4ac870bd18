"""The run folder: the one contract between the training that writes a run and everything that reads it.

A run folder (``runs/[GROUP/]VARIANT-sSEED/``, :func:`study.config.run_dir`) holds:
  metrics.json   (:data:`METRICS_FILE`) the DVC metric, numbers only: :data:`METRICS` (final ``val_loss`` in nats,
                 ``val_perplexity``, ``in_context_gain`` in nats, ``tokens``, ``tokens_per_s``) and for the mlm and
                 mqar tasks :data:`TASK_METRICS`; a key without a finite value is left out.  Written last: a folder
                 with metrics.json holds a finished run.
  record.json    (:data:`RECORD_FILE`) the rest of the run's result (:func:`split_result`): variant, seed, status
                 "ok"/"diverged", reason, diverged_step, lr, parameter and FLOP counts, wall time, config_hash ...
  curve.csv      (:data:`CURVE_FILE`) one row per evaluation: :data:`CURVE_WRITTEN`, then val_accuracy (mlm, mqar),
                 val_loss/CORPUS and the per-layer diagnostics (:func:`write_curve`, :func:`read_curve`)
  positions.csv  (:data:`POSITIONS_FILE`) position, val_loss: the per-position validation loss of the final
                 evaluation (:func:`write_positions`, :func:`read_positions`)
  config.json    (:data:`CONFIG_FILE`) the resolved config the run trained with, without :data:`NOT_SETTINGS`, plus
                 the numerics it computed under (``numerics``: CPU kernels, torch, threads), the training code's
                 digest (``code_digest``: its syntax trees without docstrings, :mod:`study.runfolder.digests`) and the
                 prepared data's digest (:func:`recorded_config`, :func:`settings_of`, :func:`recorded_settings`)
  checkpoints/   (:data:`CHECKPOINTS`) last.ckpt (resumable) and run.json (the resume key and the settings it
                 covers, the MLflow run id): study.runner.run_state; the folder's lock: study.runfolder.lock
  .lock          (:data:`LOCK_FILE`) held by the one process that writes the folder
  .replaced/     (:data:`REPLACED`) only while a start builds its Trainer: the last run's :data:`RUN_OUTPUTS` it
                 replaces

Training (study.runner.run) writes through the writers here, every reader (analysis, the stages, the tests) reads
through the readers here (:func:`read_result`, :func:`read_run`), so a name or a column is defined once.  It imports
config and data only: analysis, runner and orchestration all import it.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from study.config import LAUNCH_SECTIONS, VERDICT_SECTIONS, flatten, resume_part, to_dict
from study.data import DataError
from study.data.records import MISSING, json_kind
from study.runfolder.digests import code_digest

# -- the names ------------------------------------------------------------------------------------
METRICS_FILE, RECORD_FILE, CURVE_FILE, POSITIONS_FILE, CONFIG_FILE = (
    "metrics.json", "record.json", "curve.csv", "positions.csv", "config.json")
#: the checkpoints folder, its resumable checkpoint and its state file (resume key, MLflow run id)
CHECKPOINTS, LAST_CKPT, RUN_JSON = "checkpoints", "last.ckpt", "run.json"
LOCK_FILE = ".lock"
REPLACED = ".replaced"  # a run folder's sub-folder holding what a start replaces until its Trainer exists

#: what a new start of a run folder replaces: the outputs of its last run and (starting afresh) its checkpoints
RUN_OUTPUTS = (METRICS_FILE, RECORD_FILE, CURVE_FILE, CONFIG_FILE, POSITIONS_FILE)
#: what a finished run logs to MLflow as artifacts, in this order
LOGGED_FILES = (CURVE_FILE, POSITIONS_FILE, METRICS_FILE, RECORD_FILE)

#: the keys of a run's result that go to metrics.json (the DVC metric: numbers, few enough that
#: ``dvc metrics show`` fits a terminal); every other key goes to record.json
METRICS = ("val_loss", "val_perplexity", "in_context_gain", "tokens", "tokens_per_s")
#: what the mlm and mqar tasks add to metrics.json (study/tasks/): accuracy at the scored positions
TASK_METRICS = ("val_accuracy",)


def split_result(result: dict) -> tuple[dict, dict]:
    """A run's result -> (metrics.json, record.json): :data:`METRICS` and :data:`TASK_METRICS` with a numeric value
    (None and non-finite values left out: DVC shows them as '-'), and everything else."""
    keys = METRICS + TASK_METRICS
    metrics = {k: result[k] for k in keys if isinstance(result.get(k), (int, float)) and math.isfinite(result[k])}
    return metrics, {k: v for k, v in result.items() if k not in keys}


#: sections of the resolved config that say which runs exist, not how one run trained: left out of config.json
#: and of a run's settings
NOT_SETTINGS = ("study", "scale_ladder", "defaults", *VERDICT_SECTIONS, *LAUNCH_SECTIONS)


def recorded_config(cfg, data_digest: str) -> dict:
    """config.json of a run: the resolved config it trained with (without :data:`NOT_SETTINGS`, which say which
    runs exist), the numerics it computed under (:func:`study.config.numerics.run_numerics`: kernels, torch,
    threads), the training code's digest (``study.runfolder.digests.code_digest``) and the prepared data's digest; compare pairs only runs
    whose config.json agree on everything but the variant."""
    from study.config.numerics import run_numerics

    d = {k: v for k, v in to_dict(cfg).items() if k not in NOT_SETTINGS}
    return {**d, "numerics": run_numerics(cfg.trainer), "code_digest": code_digest(cfg.task.name),
            "data_digest": data_digest}


def settings_of(config: dict) -> dict:
    """The flat settings of a recorded config (config.json): every key but :data:`NOT_SETTINGS`."""
    return flatten({k: v for k, v in config.items() if k not in NOT_SETTINGS})


def recorded_settings(out_dir: Path) -> dict | None:
    """The resume settings of the finished run in ``out_dir`` as its ``config.json`` records them (the
    folder's ``checkpoints/run.json``, which holds them too, may have been deleted); None when unreadable."""
    try:
        recorded = json.loads((out_dir / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict):
        return None
    recorded.pop("data_digest", None)
    recorded.pop("code_digest", None)
    return resume_part(flatten(recorded))


#: the columns every curve.csv has and a reader needs (runs written before in_context_gain lack that one)
CURVE_COLUMNS = ("step", "tokens", "train_loss", "val_loss", "lr")
#: the columns :func:`write_curve` writes first, in this order; val_accuracy, val_loss/CORPUS and diagnostics follow
CURVE_WRITTEN = (*CURVE_COLUMNS, "in_context_gain")
#: the columns of positions.csv
POSITION_COLUMNS = ("position", "val_loss")


# -- the writers (training) -------------------------------------------------------------------------
def write_curve(path: Path, rows: list[dict], diagnostics: tuple[str, ...] = (), layer_order=None) -> None:
    """curve.csv: :data:`CURVE_WRITTEN` (step, tokens, train_loss, val_loss, lr, in_context_gain; nats), then
    val_accuracy (when a row has it: the mlm and mqar tasks), val_loss/CORPUS per corpus, then the ``NAME/L{i}``
    columns of each of ``diagnostics`` (study.modeling.diagnostics.CURVE_DIAGNOSTICS: attn_logit_max/L0, /L1 ...,
    sorted by ``layer_order``, study.modeling.diagnostics.layer_order); "nan" in a row without a column; floats with
    6 decimals; written atomically."""
    tmp = path.with_suffix(".tmp")
    extra = ["val_accuracy"] if any("val_accuracy" in r for r in rows) else []  # the mlm and mqar tasks
    extra += sorted({k for r in rows for k in r if k.startswith("val_loss/")})
    extra += sorted({k for r in rows for k in r if k.split("/")[0] in diagnostics}, key=layer_order)
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*CURVE_WRITTEN, *extra], restval="nan")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})
    tmp.replace(path)


def write_positions(path: Path, position_loss: list[float]) -> None:
    """positions.csv: ``position`` (1..block_size: the number of tokens of context) and ``val_loss`` (nats,
    mean over the fixed validation windows), one row per position, written atomically."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(POSITION_COLUMNS)
        w.writerows([i, f"{v:.6f}"] for i, v in enumerate(position_loss, start=1))
    tmp.replace(path)


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as strict JSON (NaN/inf refused: ValueError), written atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False))
    tmp.replace(path)


# -- the readers -----------------------------------------------------------------------------------
class RunsError(DataError):
    """A run is missing or unreadable; the message names it and the command that makes it."""



def train_command(variant: str, seed, group: str, overrides: list[str] = ()) -> str:
    """The ``python -m study.train ...`` command (in backquotes) that trains run VARIANT-sSEED of ``group``."""
    return (f"`python -m study.train variant={variant} seed={seed}{''.join(' ' + o for o in overrides)}"
            f"{' study.group=' + group if group else ''}`")



def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: record.json keys read as numbers where present (null allowed: not every run has each)
RECORD_NUMBERS = ("seed", "steps", "lr", "min_lr", "non_embedding_params", "total_params", "flops_per_token",
                  "wall_time_s", "data_seed", "init_seed", "diverged_step")

#: the keys of a diverged run's result that are its lost final loss: read as None, whatever the files hold
#: (runs written before diverged runs were written as lost points kept a NaN or an absurd last value)
LOST = ("val_loss", "val_perplexity", "val_loss_per_corpus")


def _check_record_numbers(record: dict, bad) -> None:
    """record.json's numbers (:data:`RECORD_NUMBERS`), ``val_loss_per_corpus`` and ``attn_logit_max`` (null where a
    diverged run's last logits were not finite); ``bad(file, key, value, want)`` makes :func:`read_result`'s error."""
    for k in RECORD_NUMBERS:
        if record.get(k) is not None and not _number(record[k]):
            raise bad("record.json", k, record[k], "a number")
    per = record.get("val_loss_per_corpus")
    if per is not None and not (isinstance(per, dict) and all(_number(x) for x in per.values())):
        raise bad("record.json", "val_loss_per_corpus", per, "an object of numbers")
    alm = record.get("attn_logit_max")
    lost_ok = record.get("status") == "diverged"  # a diverged run's last logits may be non-finite (null)
    if alm is not None and not (isinstance(alm, list) and all(_number(x) or (lost_ok and x is None) for x in alm)):
        raise bad("record.json", "attn_logit_max", alm, "a list of numbers (one per layer)")


def read_result(d: Path, train_cmd: str | None = None) -> dict:
    """A run folder's result: record.json and metrics.json in one dict (metric keys the file lacks
    are None), checked: both JSON objects; metrics.json's values finite numbers, with a ``val_loss``
    unless record.json says the run diverged; record.json's ``status`` "ok"/"diverged" and its numbers
    (:data:`RECORD_NUMBERS`, ``val_loss_per_corpus``) numbers.  A diverged run is a lost point: its
    :data:`LOST` keys are None (never checked, never a reason to stop).

    Args:
        train_cmd: the command that re-runs this run (with the overrides it needs), for the errors'
            advice; default ``python -m study.train variant=V seed=S``.

    Raises:
        RunsError: a file missing, not JSON or with a bad value, in one line that names the file and the
            key and says to restore it or re-run the run.
    """
    variant, _, seed = d.name.rpartition("-s")
    fix = f"restore the file, or re-run the run with {train_cmd or train_command(variant or d.name, seed, '')}"
    named = _named(d)

    def load(name: str) -> dict:
        try:
            obj = json.loads((d / name).read_text())
        except OSError as e:
            raise RunsError(f"{d / name} cannot be read ({e.strerror or e}): {fix}") from None
        except ValueError as e:
            raise RunsError(f"{d / name} is not valid JSON ({e}): {fix}") from None
        if not isinstance(obj, dict):
            raise RunsError(f"{d / name} holds {json_kind(obj)}, not a JSON object: {fix}")
        return obj

    def bad(name: str, key: str, v, want: str) -> RunsError:
        got = "missing" if v is MISSING else f"{json_kind(v)} ({json.dumps(v)[:40]})"
        return RunsError(f"{d / name}: {key!r} is {got}, expected {want}: {fix}")

    record, metrics = load(RECORD_FILE), load(METRICS_FILE)
    if record.get("status", MISSING) not in ("ok", "diverged"):
        raise bad("record.json", "status", record.get("status", MISSING), '"ok" or "diverged"')
    if record["status"] == "diverged":  # a lost point: what it holds of a final loss is not a result
        record = {**record, **dict.fromkeys(LOST)}
        metrics = {k: v for k, v in metrics.items() if k not in LOST}
        record.setdefault("diverged_step", None)
    _check_record_numbers(record, bad)
    for k, v in metrics.items():
        if k in METRICS and not _number(v):
            raise bad("metrics.json", k, v, "a finite number")
    if record["status"] == "ok" and "val_loss" not in metrics:
        raise bad("metrics.json", "val_loss", MISSING, "the run's final validation loss (record.json says status ok)")
    # A cross-entropy in nats: a trained LM's loss lies below ln(vocab_size) (ln 50257 = 10.8 for GPT-2's
    # vocabulary, ln 512 = 6.2 for nano's), and a diverged run carries no val_loss at all; 100 nats, ten
    # times the largest vocabulary's uniform loss, leaves a wide margin and keeps exp(val_loss) finite.
    if "val_loss" in metrics and not 0 < metrics["val_loss"] <= MAX_LOSS:
        raise bad("metrics.json", "val_loss", metrics["val_loss"], f"a cross-entropy in (0, {MAX_LOSS:g}] nats")
    if named is not None:
        _same_run(d, "record.json", named, record.get("variant", MISSING), record.get("seed", MISSING))
    return {**record, **dict.fromkeys(METRICS), **metrics}



#: the largest val_loss (nats) a run may record (see :func:`read_result`)
MAX_LOSS = 100.0


def _named(d: Path) -> tuple[str, int] | None:
    """(variant, seed) a run folder's name VARIANT-sSEED says, or None for a folder not so named."""
    variant, _, seed = d.name.rpartition("-s")
    return (variant, int(seed)) if variant and seed.isdigit() else None


def _same_run(d: Path, name: str, named: tuple[str, int], variant, seed) -> None:
    """Refuse a run file whose variant/seed are not the folder's: a folder copied or renamed onto
    another run's name, or a hand-edited file, would stand in for a run it is not."""
    if variant == named[0] and type(seed) is int and seed == named[1]:
        return
    shown = lambda v: "missing" if v is MISSING else json.dumps(v)[:40]  # noqa: E731
    home = d.parent / f"{variant}-s{seed}" if isinstance(variant, str) and type(seed) is int else None
    raise RunsError(f"{d / name} records variant {shown(variant)} seed {shown(seed)}, but the folder {d} is "
                    f"{named[0]}-s{named[1]}: it holds another run, or was edited; "
                    f"{'move the folder back to ' + str(home) + ', ' if home is not None else ''}"
                    f"restore the file, or re-run the run with {train_command(named[0], named[1], '')}")


def read_run(d: Path, root: Path | None = None, train_cmd: str | None = None) -> dict:
    """One run folder -> a run dict (see the module docstring); ``train_cmd``: as :func:`read_result`.

    Raises:
        RunsError: metrics.json, record.json, curve.csv or config.json is missing or unreadable.
    """
    name = str(d.relative_to(root)) if root is not None and d.is_relative_to(root) else str(d)
    m = read_result(d, train_cmd)
    variant, _, seed = d.name.rpartition("-s")
    fix = f"restore it, or re-run the run with {train_cmd or train_command(variant or d.name, seed, '')}"
    m["curve"] = read_curve(d / CURVE_FILE, fix, need_rows=m["status"] == "ok")
    m["position_loss"] = read_positions(d / "positions.csv", fix) if (d / POSITIONS_FILE).is_file() else None
    try:
        config = json.loads((d / CONFIG_FILE).read_text())
    except OSError:
        raise RunsError(f"{name} has no config.json (the settings it trained with): it predates runs that record "
                        f"them, so it cannot be checked to pair with the others; re-run it (`dvc repro`)") from None
    except ValueError as e:
        raise RunsError(f"{d / 'config.json'} is not valid JSON ({e}): {fix}") from None
    if not isinstance(config, dict):
        raise RunsError(f"{d / 'config.json'} holds {json_kind(config)}, not a JSON object: {fix}")
    named = _named(d)
    if named is not None:
        var = config.get("variant", MISSING)
        _same_run(d, "config.json", named, var.get("name", MISSING) if isinstance(var, dict) else var,
                  config.get("seed", MISSING))
    digest = config.pop("data_digest", None)
    m["settings"] = {**settings_of(config), "data_digest": digest}
    m["name"] = name
    return m


def read_curve(path: Path, fix: str, need_rows: bool = True, columns=CURVE_COLUMNS) -> list[dict]:
    """A run's curve.csv, one dict of floats per row, checked: the ``columns`` (:data:`CURVE_COLUMNS`) present, every
    cell of every row a number (nan allowed: a train_loss before any step, a diverged evaluation), at
    least one row when ``need_rows`` (a finished run evaluated at least once).

    Raises:
        RunsError: in one line naming the file, the row and the column.
    """
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise RunsError(f"{path} cannot be read ({getattr(e, 'strerror', None) or e}): {fix}") from None
    if not header:
        raise RunsError(f"{path} is empty (no header row {','.join(columns)}): {fix}")
    lacking = [c for c in columns if c not in header]
    if lacking:
        raise RunsError(f"{path} lacks the column(s) {', '.join(lacking)} (header {','.join(header)[:80]}): {fix}")
    out = []
    for i, row in enumerate(rows, start=2):
        if not row:
            continue  # a blank line
        if len(row) != len(header):
            raise RunsError(f"{path} line {i} has {len(row)} value(s) for {len(header)} column(s): {fix}")
        vals = {}
        for k, v in zip(header, row):
            try:
                vals[k] = float(v)
            except ValueError:
                raise RunsError(f"{path} line {i}: {k} is {v[:20]!r}, not a number: {fix}") from None
        out.append(vals)
    if need_rows and not out:
        raise RunsError(f"{path} has no rows (the run finished, so it evaluated at least once): {fix}")
    return out


def read_positions(path: Path, fix: str) -> list[float]:
    """A run's positions.csv (:func:`write_positions`): the per-position validation loss, (block_size,)
    nats, position 1 first.

    Raises:
        RunsError: unreadable, a column missing, positions not 1, 2, ... in order, or a value not a finite number.
    """
    rows = read_curve(path, fix, need_rows=True, columns=POSITION_COLUMNS)
    if [r["position"] for r in rows] != list(range(1, len(rows) + 1)):
        raise RunsError(f"{path}: the positions are not 1..{len(rows)} in order: {fix}")
    if not all(math.isfinite(r["val_loss"]) for r in rows):
        raise RunsError(f"{path}: a val_loss is not a finite number: {fix}")
    return [r["val_loss"] for r in rows]
