"""MLflow: each run's artifacts, params, metric steps; artifacts relative to the project; compare's verdict run;
MFU through Lightning's ThroughputMonitor (study/runner/tracking.py, study/runner/run.py, study/modeling/lit_module.py)."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT


def _client(db: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{db}")


def _dir(path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _study(root: Path, **over):
    from study.config import load_config

    return load_config([f"study.{k}={v}" for k, v in over.items()], root).study


@pytest.mark.slow  # one nano training
def test_run_logs_its_files_shaping_params_and_steps_of_the_curve(run_in, nano_project, tmp_path):
    from omegaconf import OmegaConf

    from study.runner.tracking import artifact_repo

    m = run_in("variant=nonlinear_q", "seed=2")
    client = _client(tmp_path / "mlruns.db")
    run = client.get_run(m["mlflow_run_id"])
    exp = client.get_experiment(run.info.experiment_id)
    # locations hold no absolute path: the proxied scheme, resolved against the project folder at run time
    assert exp.artifact_location == "mlflow-artifacts:/test-study"
    assert run.info.artifact_uri == f"mlflow-artifacts:/test-study/{run.info.run_id}/artifacts"
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on its runs table
    study = _study(nano_project, tracking_db=tmp_path / "mlruns.db", artifact_dir=tmp_path / "mlartifacts")
    repo = artifact_repo(nano_project, study, run.info.artifact_uri)
    assert sorted(a.path for a in repo.list_artifacts()) == ["config.yaml", "curve.csv", "metrics.json", "positions.csv",
                                                                  "record.json"]
    got = Path(repo.download_artifacts("", _dir(tmp_path / "dl")))
    run_dir = tmp_path / "runs" / "nonlinear_q-s2"
    for name in ("curve.csv", "metrics.json", "record.json"):
        assert (got / name).read_bytes() == (run_dir / name).read_bytes()
    config = OmegaConf.load(got / "config.yaml")
    assert config.variant.name == "nonlinear_q" and config.seed == 2 and config.train.tokens == 20480
    assert config.study.runs_dir == str(tmp_path / "runs")  # the whole resolved config, study included

    # params: what shapes a run only; the excluded groups are exactly these (study, profiles, defaults, cosmetics)
    params = run.data.params
    assert {k.split(".")[0] for k in params} == {"data", "model", "seed", "task", "train", "trainer", "variant", "arm",
                                                  "numerics", "code_digest", "spec"}  # and what it computed under
    spec = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith("spec.")}  # the run's specification
    assert (spec["arm"], spec["lr_source"], spec["lr"], spec["seed"]) == ("nonlinear_q", "train.lr", params["train.lr"], "2")
    assert len(spec) == 11
    from study.runfolder.digests import code_digest
    assert params["code_digest"] == code_digest() and params["numerics.cpu_capability"] == "AVX2"
    assert "trainer.progress_bar" not in params and "data.num_proc" not in params and "train.overwrite" not in params
    assert params["variant.query"] == "nonlinear" and params["train.tokens"] == "20480" and params["seed"] == "2"
    numerics = [k for k in params if k.startswith("numerics.")]
    assert len(numerics) == 10 and len(params) == len(numerics) + 1 + len(spec) + len(  # + code_digest
        [k for k in _flat(OmegaConf.to_container(config)) if k.split(".")[0] in
         ("data", "model", "seed", "task", "train", "trainer", "variant", "arm")]) - 4  # - progress_bar,
    # num_proc, hf_cache_dir, overwrite (lets a hand-started run replace a finished one: it shapes nothing)

    # metric steps are the optimizer steps of curve.csv (5, 10), not Lightning's global_step - 1
    with open(run_dir / "curve.csv") as f:
        curve = list(csv.DictReader(f))
    history = client.get_metric_history(run.info.run_id, "val_loss")
    assert [h.step for h in history] == [int(r["step"]) for r in curve] == [5, 10]
    assert [h.value for h in history] == pytest.approx([float(r["val_loss"]) for r in curve], rel=1e-6)
    assert [h.step for h in client.get_metric_history(run.info.run_id, "train_loss")] == [5, 10]
    # no MFU on a CPU (no stable peak), no constant epoch metric
    assert not {"mfu", "peak_flops", "epoch"} & set(run.data.metrics)


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def test_run_params_leave_out_what_does_not_change_a_run(nano_project):
    from study.config import load_config
    from study.runner.tracking import run_params

    base = run_params(load_config([], nano_project))
    same = run_params(load_config(["study.arms=[baseline,nonlinear_q]", "study.seeds=[1,2,3,4,5]",
                                   "study.references=[baseline]", "scale_ladder.models=[ladder-64,ladder-96]", "scale_ladder.lr_from_tuned=false", "trainer.progress_bar=false",
                                   "study.name=other"], nano_project))
    assert same == base
    other = run_params(load_config(["train.lr=1e-3"], nano_project))
    assert {k for k in base if base[k] != other[k]} == {"train.lr"}


@pytest.mark.slow  # one nano training
def test_moved_project_keeps_artifacts_readable(run_in, nano_project, tmp_path):
    """The store and artifact folder move together (as a project folder does): nothing points at the old place."""
    from study.runner.tracking import artifact_repo

    m = run_in("variant=baseline", "seed=1")
    moved = tmp_path / "elsewhere" / "project"
    moved.mkdir(parents=True)
    shutil.move(tmp_path / "mlruns.db", moved / "mlruns.db")
    shutil.move(tmp_path / "mlartifacts", moved / "mlartifacts")
    study = _study(nano_project, tracking_db=moved / "mlruns.db", artifact_dir=moved / "mlartifacts")
    run = _client(moved / "mlruns.db").get_run(m["mlflow_run_id"])
    text = Path(artifact_repo(nano_project, study, run.info.artifact_uri).download_artifacts(
        "metrics.json", _dir(tmp_path / "dl"))).read_text()
    assert json.loads(text)["val_loss"] == pytest.approx(m["val_loss"])


def test_log_verdict_records_the_report_as_one_run(nano_project, tmp_path):
    from study.config import load_config
    from study.runner.tracking import artifact_repo, log_verdict

    cfg = load_config([f"study.tracking_db={tmp_path / 'mlruns.db'}", f"study.artifact_dir={tmp_path / 'art'}"],
                      nano_project)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "comparison.md").write_text("# verdict\n")
    (reports / "summary.json").write_text(json.dumps({"verdict": {"comparisons": {"nonlinear_q vs baseline": {
        "verdict": "undecided (12 seeds needed)", "mean_diff": -0.1, "p_value_bh": 0.14, "tost_p_bh": 0.3,
        "pct": {"mean": -2.5}}}}}))
    (reports / "val_loss_curves.png").write_bytes(b"\x89PNG fake")
    (reports / "ui_runs.png").write_bytes(b"\x89PNG screenshot")  # a UI screenshot is no part of the verdict
    first = log_verdict(nano_project, cfg, reports)
    (reports / "comparison.md").write_text("# verdict, second\n")
    second = log_verdict(nano_project, cfg, reports)
    client = _client(tmp_path / "mlruns.db")
    runs = client.search_runs([client.get_experiment_by_name("test-study").experiment_id])
    assert [r.info.run_id for r in runs] == [second] != [first]  # a new compare replaces the verdict
    run = runs[0]
    assert run.info.run_name == "compare" and run.data.tags["kind"] == "verdict" and run.info.status == "FINISHED"
    key = "nonlinear_q_vs_baseline"
    assert run.data.metrics == {f"verdict_pct_log_loss/{key}": -2.5, f"verdict_mean_diff/{key}": -0.1,
                                f"verdict_p_value_bh/{key}": 0.14, f"verdict_tost_p_bh/{key}": 0.3}
    assert run.data.tags[f"verdict/{key}"] == "undecided (12 seeds needed)" and run.data.tags["verdict_of"] == "study"
    repo = artifact_repo(nano_project, cfg.study, run.info.artifact_uri)
    assert sorted(a.path for a in repo.list_artifacts()) == ["comparison.md", "summary.json", "val_loss_curves.png"]
    got = Path(repo.download_artifacts("comparison.md", _dir(tmp_path / "dl")))
    assert got.read_text() == "# verdict, second\n"


@pytest.mark.slow  # one nano training
def test_mfu_comes_from_lightnings_throughput_monitor(run_in, tmp_path, monkeypatch):
    """On a GPU the ThroughputMonitor logs MFU against the datasheet peak; here its peak is given (1 TFLOP/s)
    and the monitor switched on for a CPU run: MFU = tokens/s x training FLOPs per token / peak."""
    import lightning.pytorch.callbacks.throughput_monitor as tm

    import study.runner.throughput

    monkeypatch.setattr(tm, "get_available_flops", lambda device, dtype: 10 ** 12)
    monkeypatch.setattr(study.runner.throughput, "wants_throughput_monitor", lambda trainer_cfg: True)
    m = run_in("variant=baseline", "seed=1", "train.log_every=1")
    run = _client(tmp_path / "mlruns.db").get_run(m["mlflow_run_id"])
    got = run.data.metrics
    fpt = m["flops_per_token"]
    assert got["train/device/flops_per_sec"] == pytest.approx(got["train/device/items_per_sec"] * fpt, rel=1e-9)
    assert got["train/device/mfu"] == pytest.approx(got["train/device/flops_per_sec"] / 1e12, rel=1e-9)
    assert 0 < got["train/device/mfu"] < 1
