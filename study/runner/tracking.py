"""MLflow settings in one place: the project's SQLite store, its artifacts, params and the verdict run.

MLflow 3 refuses the plain file store by default, so every caller uses an
SQLite tracking URI (``sqlite:///<root>/mlruns.db``) with telemetry off.

Artifacts are stored relative to the project: every experiment's artifact
location is the proxied URI ``mlflow-artifacts:/<experiment name>`` (no host, no
absolute path in the store), which ``mlflow server --artifacts-destination
<root>/mlartifacts`` (``make ui``, :mod:`study.ui`) serves from the folder the
project is in now.  Writers and readers outside the server map the same URI to
``<root>/<study.artifact_dir>/...`` with :func:`artifact_repo`, so moving or
copying the project folder keeps every artifact readable.

``MLFLOW_TRACKING_URI``, when set, replaces the SQLite store: any store MLflow
supports (``sqlite:///``, ``postgresql://``, ``mysql://``, ``mssql://``, a
tracking server ``http(s)://``, ``databricks``; the file store ``file:PATH`` only
with ``MLFLOW_ALLOW_FILE_STORE=true``, MLflow 3's own opt-in); anything else is
refused in one line.
"""
from __future__ import annotations

import os
import subprocess
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

from study.config import StudyConfig
from study.runfolder.store import tracking_uri

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

PROXY_SCHEME = "mlflow-artifacts"
# Config keys (dotted prefixes) that do not change a run's numbers: which runs exist (study.*, the
# profiles), cosmetics and how prepare runs.  Left out of a run's MLflow params; kept in step with
# study.config.config_hash, which hashes what changes a run's numbers.
NOT_RUN_SHAPING = ("defaults", "study", "scale_ladder", "trainer.progress_bar", "data.num_proc",
                   "data.hf_cache_dir", "train.overwrite", "arms", "tune", "tuned", "decomposition", "launcher")
# The MLflow 3 UI opens an experiment on its runs table (not the GenAI traces page) with this tag.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def artifact_location(root: Path, study: StudyConfig) -> str:
    """The experiment's artifact location, relative to the project: ``mlflow-artifacts:/<study.name>``.

    Resolved to ``<root>/<study.artifact_dir>/<study.name>`` by :func:`artifact_repo` and by the UI
    server (``--artifacts-destination``); ``root`` is accepted for symmetry with :func:`tracking_uri`."""
    return f"{PROXY_SCHEME}:/{urllib.parse.quote(study.name, safe='')}"


def artifact_root(root: Path, study: StudyConfig) -> Path:
    """The folder that ``mlflow-artifacts:/`` stands for: ``<root>/<study.artifact_dir>`` (absolute)."""
    return (root / study.artifact_dir).resolve()


def artifact_repo(root: Path, study: StudyConfig, artifact_uri: str):
    """An MLflow artifact repository for a run's ``artifact_uri``: ``mlflow-artifacts:/X`` is the local
    folder ``artifact_root(root, study)/X`` (as the UI server maps it); any other URI is MLflow's own."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    parsed = urllib.parse.urlparse(artifact_uri)
    if parsed.scheme == PROXY_SCHEME:
        path = urllib.parse.unquote(parsed.path).lstrip("/")
        return LocalArtifactRepository(str(artifact_root(root, study) / path))
    return get_artifact_repository(artifact_uri)


def log_files(root: Path, study: StudyConfig, run_id: str, paths: list[Path], artifact_path: str | None = None) -> None:
    """Copy ``paths`` (files that exist) into the artifacts of MLflow run ``run_id``."""
    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri=tracking_uri(root, study)).get_run(run_id)
    repo = artifact_repo(root, study, run.info.artifact_uri)
    for p in paths:
        if Path(p).is_file():
            repo.log_artifact(str(p), artifact_path)


def log_text(root: Path, study: StudyConfig, run_id: str, text: str, name: str) -> None:
    """Write ``text`` as the artifact ``name`` of MLflow run ``run_id``."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text)
        log_files(root, study, run_id, [path])


def run_params(cfg) -> dict:
    """The resolved config as flat MLflow params, only the keys that shape a run (not
    :data:`NOT_RUN_SHAPING`): ``{"model.n_layer": 4, "train.lr": 0.002, "seed": 1, ...}``."""
    from study.config import flatten, to_dict

    return {k: v for k, v in flatten(to_dict(cfg)).items()
            if not any(k == p or k.startswith(p + ".") for p in NOT_RUN_SHAPING)}


def ensure_experiment(client, root: Path, study: StudyConfig) -> str:
    """The id of the study's experiment, created with :func:`artifact_location` and the runs-table
    kind tag if missing (call under :func:`store_lock`)."""
    exp = client.get_experiment_by_name(study.name)
    if exp is None:
        return client.create_experiment(study.name, artifact_location=artifact_location(root, study),
                                        tags=EXPERIMENT_KIND)
    if exp.tags.get("mlflow.experimentKind") is None:
        client.set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND["mlflow.experimentKind"])
    return exp.experiment_id


def step_aligned_logger(**kwargs):
    """Lightning's MLFlowLogger whose metric steps are the optimizer step count (``trainer.global_step``)
    once ``logger.step_of = lambda: trainer.global_step`` is set: Lightning itself logs the metrics of a
    validation inside training at ``global_step - 1``, while curve.csv and the report count steps after
    the optimizer step (32, 64, ... 256).  Lightning's constant ``epoch`` metric is left out.

    ``logger.logged_through = {key: step}`` (a resumed run: :func:`logged_steps` of its MLflow run) drops
    a metric at a step its earlier segment already logged (the steps between the checkpoint and the kill,
    which the resumed run takes again), so every metric holds each step once."""
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    class StepAlignedMLFlowLogger(MLFlowLogger):
        step_of = None
        logged_through: dict[str, int] = {}

        @rank_zero_only
        def log_metrics(self, metrics, step=None):
            step = self.step_of() if self.step_of is not None else step
            metrics = {k: v for k, v in metrics.items() if k != "epoch"  # one endless epoch: always 0
                       and (step is None or step > self.logged_through.get(k, -1))}
            if metrics:
                super().log_metrics(metrics, step)

    return StepAlignedMLFlowLogger(**kwargs)


def logged_steps(client, run_id: str) -> dict[str, int]:
    """{metric key: the largest step MLflow run ``run_id`` holds for it} (one history read per key)."""
    keys = client.get_run(run_id).data.metrics
    return {k: max((m.step for m in client.get_metric_history(run_id, k)), default=-1) for k in keys}


def log_verdict(root: Path, cfg, report_dir: Path) -> str:
    """Record compare's verdict in MLflow as its own run, name ``compare`` (tags ``kind=verdict`` and
    ``group=verdict``, so readers of the training runs by group, as the notebook, leave it out), in the
    study's experiment: comparison.md, summary.json and the figures of ``report_dir`` as artifacts, each
    comparison's word as a tag (``verdict/ARM_vs_REF``) and its numbers as metrics (``verdict_pct_log_loss/...``,
    ``verdict_mean_diff/...``, ``verdict_p_value_bh/...``, ``verdict_tost_p_bh/...``).  A re-run of compare
    replaces the previous verdict run of the experiment (tag ``verdict_of=study``).  Returns the run id."""
    import json
    import time

    from mlflow import MlflowClient
    from mlflow.entities import Metric, RunTag

    study = cfg.study
    client = MlflowClient(tracking_uri=tracking_uri(root, study))
    with store_lock(root, study):
        exp_id = ensure_experiment(client, root, study)
        for old in client.search_runs([exp_id], filter_string="tags.kind = 'verdict' and tags.verdict_of = 'study'"):
            artifact_repo(root, study, old.info.artifact_uri).delete_artifacts()
            client.delete_run(old.info.run_id)
        run = client.create_run(exp_id, run_name="compare",
                                tags={"kind": "verdict", "group": "verdict", "verdict_of": "study",
                                      "git_commit": git_commit(root),
                                      "mlflow.note.content": "compare's verdict: comparison.md, summary.json, figures"})
    run_id = run.info.run_id
    try:
        summary_path = report_dir / "summary.json"
        metrics, tags = [], [RunTag("baseline", str(cfg.study.baseline))]
        if summary_path.is_file():
            summary = json.loads(summary_path.read_text())
            for name, c in ((summary.get("verdict") or {}).get("comparisons") or {}).items():
                key = name.replace(" vs ", "_vs_")  # the decided verdict: one word and its numbers per comparison
                tags.append(RunTag(f"verdict/{key}", str(c.get("verdict"))))
                for m in ("mean_diff", "p_value_bh", "tost_p_bh"):
                    if isinstance(c.get(m), (int, float)):
                        metrics.append(Metric(f"verdict_{m}/{key}", float(c[m]), int(time.time() * 1000), 0))
                if isinstance((c.get("pct") or {}).get("mean"), (int, float)):
                    metrics.append(Metric(f"verdict_pct_log_loss/{key}", float(c["pct"]["mean"]),
                                          int(time.time() * 1000), 0))
        if metrics or len(tags) > 1:
            client.log_batch(run_id, metrics=metrics, tags=tags)
        figures = [p for p in sorted(report_dir.glob("*.png")) + sorted((report_dir / "figures").glob("*.png"))
                   if not p.name.startswith("ui_")]  # the report's figures, not UI screenshots
        files = [report_dir / "comparison.md", summary_path] + figures
        log_files(root, study, run_id, files)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id


def git_commit(root: Path) -> str:
    """The commit of the working tree (``+dirty`` when it has changes), or ``unknown``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("+dirty" if dirty else "")) if sha else "unknown"


def store_lock(root: Path, study: StudyConfig):
    """An inter-process lock (filelock) held while a run creates the SQLite store, experiment or run."""
    from filelock import FileLock

    db = (root / study.tracking_db).resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock", timeout=600)


def settle_previous_run(uri: str, run_id: str, resuming: bool, state: dict) -> dict:
    """Put the MLflow run of a run folder's last process in order before this one starts.

    Called by global rank 0 while it holds the folder's lock, so no live process owns ``run_id``:
    a run still RUNNING died without a word (SIGKILL, power loss) and is marked KILLED with an end time,
    unless this start resumes it; a resumed run is set RUNNING again.  A resumed run whose MLflow run
    is gone (another store) gets a new one.  Returns ``state`` (``mlflow_run_id`` dropped if gone)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    try:
        info = client.get_run(run_id).info
    except MlflowException:
        info = None
    if info is None:
        return {k: v for k, v in state.items() if k != "mlflow_run_id"}
    if resuming:
        if info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
    elif info.status == "RUNNING":
        client.set_terminated(run_id, "KILLED")
    return state


#: the MLflow tag naming a run's folder (absolute), so that a start can find its folder's earlier runs
RUN_FOLDER_TAG = "run_folder"


def run_folder_tag(out_dir: Path) -> str:
    """The value of :data:`RUN_FOLDER_TAG` for a run folder: its absolute path."""
    return str(Path(out_dir).resolve())


def end_orphaned_runs(client, experiment_id: str, out_dir: Path, keep: str | None = None) -> list[str]:
    """Mark KILLED (with an end time) every MLflow run of ``out_dir`` (tag :data:`RUN_FOLDER_TAG`) that is
    still RUNNING, but ``keep`` (the run this start resumes); return their ids.

    Called by global rank 0 while it holds the folder's lock: no live process owns such a run, so it died
    without a word (SIGKILL, power loss).  :func:`settle_previous_run` does the same from run.json's id; this
    one still finds the run when run.json is gone (``checkpoints/`` deleted to start afresh, as the error of an
    unreadable checkpoint advises)."""
    folder = run_folder_tag(out_dir)
    found = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'")
    ended = [r.info.run_id for r in found if r.data.tags.get(RUN_FOLDER_TAG) == folder and r.info.run_id != keep]
    for run_id in ended:
        client.set_terminated(run_id, "KILLED")
    return ended


@contextmanager
def restore_env(name: str):
    """Give environment variable ``name`` its value from before the block back after it.  Lightning's
    MLFlowLogger calls ``mlflow.set_tracking_uri``, which exports MLFLOW_TRACKING_URI to the process: a
    second run in the same process (or a subprocess it starts) would then take the first run's store
    for the user's choice (study.runner.tracking.tracking_uri honours the variable)."""
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
