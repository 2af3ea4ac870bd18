"""Load finished runs and the settings they recorded, from run folders or from the MLflow store.

A run, as every reader of runs (compare, the scale ladder, the notebook) sees it, is one dict:
the run's ``metrics.json`` (numbers only, the DVC metric: ``val_loss`` in nats, ``val_perplexity``,
``in_context_gain`` (nats, study.modeling.lm.in_context_gain), ``tokens``, ``tokens_per_s``; None where the file has no value, as for a diverged run's loss) and its
``record.json`` (``status`` "ok"/"diverged", ``reason``, ``diverged_step``, ``variant``, ``seed``, ``lr``,
``non_embedding_params``, ``flops_per_token``, ``mlflow_run_id`` ..., optionally
``val_loss_per_corpus`` {corpus: nats} and ``attn_logit_max`` [per layer, last evaluation]) in one
dict, plus
  "curve"     [{"tokens", "train_loss", "val_loss", "val_loss/<corpus>", "attn_logit_max/L<i>" ...}] one
              row per evaluation
              (nats; train_loss = mean since the previous evaluation)
  "position_loss"  [nats at position 1, 2, ... block_size] of the final evaluation (positions.csv), None for
              a diverged run or a run folder written before runs recorded it
  "settings"  the resolved config the run trained with, flattened ({"model.n_layer": 4, ...}, the
              study/scale_ladder/defaults sections left out) plus "data_digest" (sha256 of
              the prepared data's meta.json, 16 hex)
  "name"      where it came from: the run folder relative to the project, or the MLflow run name.

``study.train`` writes ``config.json`` (the settings) next to ``metrics.json``; a run folder
without it (or without ``record.json``) was trained before runs recorded them and is refused (re-run it).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from study.analysis.pairing import check
from study.config import LAUNCH_SECTIONS, VERDICT_SECTIONS, flatten, run_dir
from study.data import DataError
from study.data.records import MISSING, json_kind
from study.runner.run_state import METRICS, REPLACED

#: sections of the resolved config that say which runs exist, not how one run trained
NOT_SETTINGS = ("study", "scale_ladder", "defaults", *VERDICT_SECTIONS, *LAUNCH_SECTIONS)


class RunsError(DataError):
    """A run is missing or unreadable; the message names it and the command that makes it."""


def settings_of(config: dict) -> dict:
    """The flat settings of a recorded config (config.json): every key but :data:`NOT_SETTINGS`."""
    return flatten({k: v for k, v in config.items() if k not in NOT_SETTINGS})


#: the study keys a training run reads (where its folder and MLflow run go); the others say which runs exist
RUN_STUDY_KEYS = ("study.name", "study.runs_dir", "study.tracking_db", "study.artifact_dir", "study.baseline")


def train_command(variant: str, seed, group: str, overrides: list[str] = ()) -> str:
    """The ``python -m study.train ...`` command (in backquotes) that trains run VARIANT-sSEED of ``group``."""
    return (f"`python -m study.train variant={variant} seed={seed}{''.join(' ' + o for o in overrides)}"
            f"{' study.group=' + group if group else ''}`")


def _value(v) -> str:
    return "[" + ",".join(map(str, v)) + "]" if isinstance(v, (list, tuple)) else str(v)


def _composed(overrides: list[str], root: Path):
    """conf/study.yaml composed with ``overrides``: validated where it passes, else as composed (group
    names set), for comparison only."""
    from study.config import ConfigError, load_config
    from study.config.compose import _compose, _name_groups

    try:
        return load_config(overrides, root)
    except ConfigError:
        cfg, choices = _compose(root / "conf", "study", overrides)
        _name_groups(cfg, choices, root / "conf")
        return cfg


def train_hint_overrides(cfg, root: Path, group: str = "") -> list[str]:
    """The overrides that make ``study.train`` train a run of ``group`` under ``cfg``: the group choices
    (``model=NAME`` ...) and fields where ``cfg`` differs from the project's default composition (as
    ``compare model=nano train.tokens=...`` was given them), then the group's own settings, as the
    stages give them (test/ARM: the arm's lr and recipe; scale_ladder/MODEL: the model and the
    compute-matched budget).  For the one line that names the command training a missing run
    (:func:`train_command`)."""
    from study.config import load_config, to_dict

    out, picks = [], []
    try:
        base = load_config([], root)
        picks = [f"{g}={getattr(cfg, g).name}" for g in ("model", "data", "trainer")
                 if getattr(getattr(cfg, g), "name", None) != getattr(getattr(base, g), "name", None)]
        out = list(picks)
        # the picks alone may fail validation (model=nano with the default BPE vocabulary): compared
        # with their composition unvalidated, so the settings given with them stay in the hint
        base = _composed(picks, root) if picks else base
        now, was = flatten(to_dict(cfg)), flatten(to_dict(base))
        out = picks + [f"{k}={_value(v)}" for k, v in now.items()
                       if (k.split(".", 1)[0] in ("model", "data", "train", "trainer") or k in RUN_STUDY_KEYS)
                       and not k.endswith(".name") and v != was.get(k)]
    except Exception:  # noqa: BLE001  (a hint never hides the error it belongs to)
        out = out or picks
    if group.startswith("test/") and group.split("/", 1)[1] in getattr(cfg, "arms", {}):
        # a test run: the arm's peak lr (fixed, else tuned.lr) and its recipe overrides, as the test_runs stage gives them
        name = group.split("/", 1)[1]
        arm = cfg.arms[name]
        lr = arm.lr if arm.lr is not None else cfg.tuned.lr.get(name)
        out += ([f"variant.lr={float(lr)!r}"] if lr is not None else []) + [str(o) for o in arm.overrides]
    elif group.startswith("scale_ladder/"):
        out = [o for o in out if not o.startswith("model=")]
        out += [f"model={group.split('/', 1)[1]}", f"train.tokens_per_param={cfg.scale_ladder.tokens_per_param}",
                f"train.warmup_tokens={cfg.scale_ladder.warmup_tokens}",
                f"train.lr_from_tuned={str(cfg.scale_ladder.lr_from_tuned).lower()}",
                f"train.lr_per_size={str(cfg.scale_ladder.lr_per_size).lower()}"]
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: record.json keys read as numbers where present (null allowed: not every run has each)
RECORD_NUMBERS = ("seed", "steps", "lr", "min_lr", "non_embedding_params", "total_params", "flops_per_token",
                  "wall_time_s", "data_seed", "init_seed", "diverged_step")

#: the keys of a diverged run's result that are its lost final loss: read as None, whatever the files hold
#: (runs written before diverged runs were written as lost points kept a NaN or an absurd last value)
LOST = ("val_loss", "val_perplexity", "val_loss_per_corpus")


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

    record, metrics = load("record.json"), load("metrics.json")
    if record.get("status", MISSING) not in ("ok", "diverged"):
        raise bad("record.json", "status", record.get("status", MISSING), '"ok" or "diverged"')
    if record["status"] == "diverged":  # a lost point: what it holds of a final loss is not a result
        record = {**record, **dict.fromkeys(LOST)}
        metrics = {k: v for k, v in metrics.items() if k not in LOST}
        record.setdefault("diverged_step", None)
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
    m["curve"] = read_curve(d / "curve.csv", fix, need_rows=m["status"] == "ok")
    m["position_loss"] = read_positions(d / "positions.csv", fix) if (d / "positions.csv").is_file() else None
    try:
        config = json.loads((d / "config.json").read_text())
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


#: the columns every curve.csv has (study.train's write_curve); val_loss/CORPUS columns may follow
CURVE_COLUMNS = ("step", "tokens", "train_loss", "val_loss", "lr")


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
    """A run's positions.csv (study.train's write_positions): the per-position validation loss, (block_size,)
    nats, position 1 first.

    Raises:
        RunsError: unreadable, a column missing, positions not 1, 2, ... in order, or a value not a finite number.
    """
    rows = read_curve(path, fix, need_rows=True, columns=("position", "val_loss"))
    if [r["position"] for r in rows] != list(range(1, len(rows) + 1)):
        raise RunsError(f"{path}: the positions are not 1..{len(rows)} in order: {fix}")
    if not all(math.isfinite(r["val_loss"]) for r in rows):
        raise RunsError(f"{path}: a val_loss is not a finite number: {fix}")
    return [r["val_loss"] for r in rows]


def load_runs(cfg, root: Path, variants=None, seeds=None, group: str = "", pair: bool = True) -> dict[str, dict[int, dict]]:
    """{variant: {seed: run}} for the run folders of one group, checked to pair (see :func:`check`).

    Args:
        variants, seeds: default study.variants and study.seeds.
        group: sub-folder of runs_dir ("" = the study's own runs; "tuned", "scale_ladder/MODEL" ...).
        pair: check that the runs agree on every setting but the variant (default True).

    Raises:
        RunsError: a run has no metrics.json or config.json (with the command that makes it).
        PairingError: a run differs from the others in a setting other than the variant.
    """
    runs: dict[str, dict[int, dict]] = {}
    missing, aside, overrides = [], [], None
    for variant in (cfg.study.variants if variants is None else variants):
        for seed in (cfg.study.seeds if seeds is None else seeds):
            d = run_dir(root, cfg, variant, seed, group)
            if not (d / "metrics.json").is_file():
                overrides = train_hint_overrides(cfg, root, group) if overrides is None else overrides
                missing.append(train_command(variant, seed, group, overrides))
                if (d / REPLACED / "metrics.json").is_file():  # a start killed before its Trainer was built
                    aside.append(str((d / REPLACED).relative_to(root)) if (d / REPLACED).is_relative_to(root)
                                 else str(d / REPLACED))
                continue
            try:
                runs.setdefault(variant, {})[seed] = read_run(d, root)
            except RunsError:  # again, with the overrides this run needs in the advice (computed only now)
                overrides = train_hint_overrides(cfg, root, group) if overrides is None else overrides
                read_run(d, root, train_command(variant, seed, group, overrides))
                raise
    if missing:
        kept = (f" ({len(aside)} of them finished before: {', '.join(aside[:3])}{' ...' if len(aside) > 3 else ''} "
                f"holds what a start killed before its Trainer existed had set aside; that train command puts it "
                f"back first)") if aside else ""
        raise RunsError(f"{len(missing)} run(s) {'of ' + group + ' ' if group else 'of the study '}have no "
                        f"metrics.json{kept}; run `dvc repro` or {', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}")
    if pair:
        check(runs, f"the runs of {group}" if group else "the study's runs")
    return runs


def final_losses(runs: dict[str, dict[int, dict]]) -> dict[str, dict[int, float]]:
    """{variant: {seed: final val_loss (nats)}} of the runs that did not diverge."""
    return {v: {s: m["val_loss"] for s, m in r.items() if m["status"] == "ok" and m["val_loss"] is not None}
            for v, r in runs.items()}


def lost_points(by_seed: dict[int, dict]) -> dict[str, dict]:
    """{seed: {"step", "reason"}} of the diverged runs of one variant ({seed: run}): the lost points."""
    return {str(s): {"step": m.get("diverged_step"), "reason": m.get("reason")}
            for s, m in sorted(by_seed.items()) if m["status"] != "ok"}


# -- the MLflow store ------------------------------------------------------------------------------
def load_mlflow(cfg, root: Path, group: str = "main", pair: bool = True) -> dict[str, dict[int, dict]]:
    """{variant: {seed: run}} from the project's MLflow store (experiment study.name), one group.

    Only runs whose status is FINISHED count (killed and failed runs end KILLED/FAILED); a diverged
    run ends FINISHED with the tag ``status=diverged`` (and ``diverged``: the reason, ``diverged_step``)
    and is read as a lost point (status "diverged", val_loss None); where a (variant, seed) finished
    more than once the newest run stands for it.  Settings are the
    run's parameters (the flattened resolved config) and its ``data_digest`` tag; the curve is
    rebuilt from the ``val_loss``, ``val_loss/<corpus>`` and ``train_loss`` histories.

    Raises:
        RunsError: the experiment does not exist.
        PairingError: the runs do not pair (see :func:`check`).
    """
    from mlflow import MlflowClient

    from study.runner.tracking import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(root, cfg.study))
    exp = client.get_experiment_by_name(cfg.study.name)
    if exp is None:
        raise RunsError(f"no MLflow experiment {cfg.study.name!r} in {tracking_uri(root, cfg.study)}: run the study "
                        f"first (`dvc repro`)")
    found = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'",
                               order_by=["attributes.start_time DESC"])
    runs: dict[str, dict[int, dict]] = {}
    for r in found:
        tags, params, metrics = r.data.tags, r.data.params, r.data.metrics
        if tags.get("group", "main") != group or "variant" not in tags:
            continue
        variant, seed = tags["variant"], int(tags["seed"])
        if seed in runs.get(variant, {}):
            continue  # an older run of the same (variant, seed)
        batch = int(params["train.batch_tokens"])
        val = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "val_loss")}
        corpora = sorted(k for k in metrics if k.startswith("val_loss/"))
        per = {k: {m.step: m.value for m in client.get_metric_history(r.info.run_id, k)} for k in corpora}
        train = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, "train_loss"))
        curve, prev = [], -1
        for step in sorted(val):
            seen = [x for s, x in train if prev < s <= step]
            curve.append({"step": float(step), "tokens": float(step * batch), "val_loss": val[step],
                          "train_loss": sum(seen) / len(seen) if seen else float("nan"),
                          **{k: per[k].get(step, float("nan")) for k in corpora}})
            prev = step
        lost = tags.get("status") == "diverged"
        final = None if lost else metrics.get("final_val_loss", metrics.get("val_loss"))
        step = tags.get("diverged_step")
        runs.setdefault(variant, {})[seed] = {
            "variant": variant, "seed": seed, "status": "diverged" if lost else "ok",
            "reason": tags.get("diverged") if lost else None,
            "diverged_step": int(step) if lost and step and step.isdigit() else None, "val_loss": final,
            "tokens": int(params["train.tokens"]), "non_embedding_params": int(metrics["non_embedding_params"]),
            "flops_per_token": metrics.get("flops_per_token"), "run_id": r.info.run_id,
            "val_loss_per_corpus": None if lost else
            ({k.split("/", 1)[1]: per[k][max(per[k])] for k in corpora if per[k]} or None),
            "curve": curve, "name": r.info.run_name, "attn_logit_max": _layer_values(metrics, "attn_logit_max"),
            "settings": {**{k: v for k, v in params.items() if k.split(".", 1)[0] not in NOT_SETTINGS},
                         "data_digest": tags.get("data_digest")}}
    order = {v: i for i, v in enumerate(cfg.study.variants)}
    runs = {v: dict(sorted(runs[v].items())) for v in sorted(runs, key=lambda v: (order.get(v, len(order)), v))}
    if pair:
        check(runs, f"the MLflow runs of experiment {cfg.study.name!r}")
    return runs


def _layer_values(metrics: dict, name: str) -> list[float] | None:
    """[layer 0, 1, ...] of the MLflow metrics ``diag/L{i}/NAME`` (their latest values), None without them."""
    layers = sorted(int(k.split("/")[1][1:]) for k in metrics
                    if k.startswith("diag/L") and k.endswith(f"/{name}") and k.count("/") == 2)
    return [metrics[f"diag/L{i}/{name}"] for i in layers] or None
