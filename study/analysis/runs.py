"""Load finished runs and the settings they recorded, from run folders or from the MLflow store.

A run, as every reader of runs (compare, the scale ladder, the notebook) sees it, is one dict:
the run's ``metrics.json`` (numbers only, the DVC metric: ``val_loss`` in nats, ``val_perplexity``,
``in_context_gain`` (nats, study.modeling.lit_module.in_context_gain), ``tokens``, ``tokens_per_s``; None where the file has no value, as for a diverged run's loss) and its
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
The files, their names and their readers are the run folder's contract, study.runfolder (re-exported here); this
module finds the runs of a study and loads them, from run folders or the MLflow store.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from study.analysis.pairing import check
from study.config import flatten, run_dir
from study.config.naming import LADDER_GROUP, ladder_overrides
from study.runfolder import METRICS_FILE, NOT_SETTINGS, REPLACED, RunsError, read_run, train_command


#: the study keys a training run reads (where its folder and MLflow run go); the others say which runs exist
RUN_STUDY_KEYS = ("study.name", "study.runs_dir", "study.tracking_db", "study.artifact_dir", "study.baseline")



def _value(v) -> str:
    return "[" + ",".join(map(str, v)) + "]" if isinstance(v, (list, tuple)) else str(v)


def _composed(overrides: list[str], root: Path):
    """conf/study.yaml composed with ``overrides``: validated where it passes, else as composed (group
    names set), for comparison only."""
    from study.config import ConfigError, load_config
    from study.config.compose import compose_conf, name_groups

    try:
        return load_config(overrides, root)
    except ConfigError:
        from study.config import resolve_task

        cfg, choices = compose_conf(root / "conf", "study", overrides)
        name_groups(cfg, choices, root / "conf")
        try:
            return resolve_task(cfg)  # the task's folders and positions, as a validated config has them
        except ConfigError:
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
        picks = [f"{g}={getattr(cfg, g).name}" for g in ("model", "data", "trainer", "task")
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
        out += ([f"arm.lr={float(lr)!r}"] if lr is not None else []) + [str(o) for o in arm.overrides]
    elif group.startswith(f"{LADDER_GROUP}/"):
        out = [o for o in out if not o.startswith("model=")]
        out += [o for o in ladder_overrides(cfg, group.split("/", 1)[1]) if not o.startswith("study.group=")]
    return out




def load_runs(cfg, root: Path, variants: list[str], seeds: list[int], group: str, pair: bool = True
              ) -> dict[str, dict[int, dict]]:
    """{variant: {seed: run}} for the run folders of one group, checked to pair (see :func:`check`).

    Args:
        variants, seeds: the runs to read.
        group: sub-folder of runs_dir ("test/ARM", "scale_ladder/MODEL", "" for runs trained without a group).
        pair: check that the runs agree on every setting but the variant (default True).

    Raises:
        RunsError: a run has no metrics.json or config.json (with the command that makes it); a run of another task
            than ``cfg.task.name`` (:func:`check_task`); a val_accuracy outside [0, 1] (:func:`check_task_metrics`).
        PairingError: a run differs from the others in a setting other than the variant.
    """
    runs: dict[str, dict[int, dict]] = {}
    missing, aside, overrides = [], [], None
    for variant in variants:
        for seed in seeds:
            d = run_dir(root, cfg, variant, seed, group)
            if not (d / METRICS_FILE).is_file():
                overrides = train_hint_overrides(cfg, root, group) if overrides is None else overrides
                missing.append(train_command(variant, seed, group, overrides))
                if (d / REPLACED / METRICS_FILE).is_file():  # a re-run killed before it wrote its own outputs
                    aside.append(str((d / REPLACED).relative_to(root)) if (d / REPLACED).is_relative_to(root)
                                 else str(d / REPLACED))
                continue
            try:
                run = runs.setdefault(variant, {})[seed] = read_run(d, root)
            except RunsError:  # again, with the overrides this run needs in the advice (computed only now)
                overrides = train_hint_overrides(cfg, root, group) if overrides is None else overrides
                read_run(d, root, train_command(variant, seed, group, overrides))
                raise
            check_task(cfg, run)
            check_task_metrics(d, run, lambda: train_command(variant, seed, group, train_hint_overrides(cfg, root, group)))
    if missing:
        kept = (f" ({len(aside)} of them finished before: {', '.join(aside[:3])}{' ...' if len(aside) > 3 else ''} "
                f"holds what a re-run killed before it wrote its outputs had set aside; that train command puts it "
                f"back first)") if aside else ""
        raise RunsError(f"{len(missing)} run(s) {'of ' + group + ' ' if group else 'of the study '}have no "
                        f"metrics.json{kept}; run `dvc repro` or {', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}")
    if pair:
        check(runs, f"the runs of {group}" if group else "the study's runs")
    return runs


def recorded_task(run: dict) -> str:
    """The task a run trained (config.json's ``task.name``, else record.json's ``task``); "lm" for a run recorded
    before runs had tasks (they all learned the next token)."""
    return str(run["settings"].get("task.name") or run.get("task") or "lm")


def check_task(cfg, run: dict) -> None:
    """Refuse a run of another task than the one compare was asked for (``cfg.task.name``): an mlm run's loss is a
    masked-LM loss, never an lm result, whatever settings it shares with the lm runs.

    Raises:
        RunsError: one line naming the run, both tasks and the command that compares the run's own task.
    """
    got, want = recorded_task(run), str(cfg.task.name)
    if got != want:
        raise RunsError(f"{run['name']} is a run of task {got!r}, but compare was asked for task {want!r} (its runs "
                        f"folder, study.runs_dir {cfg.study.runs_dir}, holds another task's runs): compare them with "
                        f"`python -m study.compare --params params.yaml task={got}`, or point study.runs_dir at the "
                        f"{want} runs")


def check_task_metrics(d: Path, run: dict, command) -> None:
    """Refuse a finished run whose metrics.json holds a ``val_accuracy`` (the mlm and mqar tasks: the share of scored
    positions predicted right) that is not a number in [0, 1]; null or absent is no accuracy (task lm).

    Args:
        command: () -> the command (in backquotes) that re-trains the run, for the advice.

    Raises:
        RunsError: one line naming the file, the value and the fix.
    """
    v = run.get("val_accuracy")
    if v is None or run["status"] != "ok":
        return
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1:
        return
    raise RunsError(f"{d / 'metrics.json'}: 'val_accuracy' is {json.dumps(v)[:40]}, expected a share in [0, 1] "
                    f"(the scored positions predicted right): restore the file, or re-run the run with {command()}")


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

    from study.runfolder.store import tracking_uri

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
        corpora = sorted(k for k in metrics if k.startswith("val_loss/"))
        per = {k: {m.step: m.value for m in client.get_metric_history(r.info.run_id, k)} for k in corpora}
        curve = _mlflow_curve(client, r.info.run_id, int(params["train.batch_tokens"]), per)
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
    runs = {v: dict(sorted(runs[v].items())) for v in sorted(runs)}
    if pair:
        check(runs, f"the MLflow runs of experiment {cfg.study.name!r}")
    return runs


def _mlflow_curve(client, run_id: str, batch: int, per: dict[str, dict[int, float]]) -> list[dict]:
    """curve.csv's rows rebuilt from a run's MLflow histories: at each validation step its val_loss, the mean
    train_loss since the previous one, the tokens seen (``batch`` tokens a step) and ``per`` corpus's loss."""
    val = {m.step: m.value for m in client.get_metric_history(run_id, "val_loss")}
    train = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train_loss"))
    curve, prev = [], -1
    for step in sorted(val):
        seen = [x for s, x in train if prev < s <= step]
        curve.append({"step": float(step), "tokens": float(step * batch), "val_loss": val[step],
                      "train_loss": sum(seen) / len(seen) if seen else float("nan"),
                      **{k: per[k].get(step, float("nan")) for k in per}})
        prev = step
    return curve


def _layer_values(metrics: dict, name: str) -> list[float] | None:
    """[layer 0, 1, ...] of the MLflow metrics ``diag/L{i}/NAME`` (their latest values), None without them."""
    layers = sorted(int(k.split("/")[1][1:]) for k in metrics
                    if k.startswith("diag/L") and k.endswith(f"/{name}") and k.count("/") == 2)
    return [metrics[f"diag/L{i}/{name}"] for i in layers] or None
