"""What DVC shows (issue 14 item 4): metrics files hold numbers only, strings and ids live in each run's
record.json, the validation curves are one interactive DVC plot with a line per run, generated files are
ignored by git, and compare's hint for a missing run is a command that makes that very run."""
from __future__ import annotations

import json
import math
import re
import shlex
import subprocess

import pytest

from conftest import BIN, copy_project, env_for
from tests.synthetic_runs import arms_overrides, write_arms


def _numbers_only(d: dict) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in d.values())


@pytest.mark.slow  # one nano training
def test_a_run_writes_numbers_to_metrics_json_and_the_rest_to_record_json(run_in, tmp_path):
    from study.analysis.runs import read_run
    from study.runfolder import METRICS

    m = run_in("variant=nonlinear_q", "seed=2", "train.tokens=4096", "train.eval_every=1")
    d = tmp_path / "runs/nonlinear_q-s2"
    metrics = json.loads((d / "metrics.json").read_text())
    record = json.loads((d / "record.json").read_text())
    assert sorted(metrics) == sorted(METRICS) and _numbers_only(metrics), metrics
    assert metrics["val_loss"] == m["val_loss"] and metrics["tokens"] == 4096
    assert metrics["val_perplexity"] == pytest.approx(math.exp(m["val_loss"]))
    # the strings, ids and counts: in the record, not in the metric
    assert record["status"] == "ok" and record["reason"] is None and record["variant"] == "nonlinear_q"
    assert record["seed"] == 2 and record["mlflow_run_id"] == m["mlflow_run_id"] and len(record["config_hash"]) == 16
    assert record["steps"] == 2 and set(record["val_loss_per_corpus"]) == {"sotu", "shakespeare", "kjv"}
    assert not set(METRICS) & set(record)
    # readers see one dict, as train returned it
    run = read_run(d)
    assert {k: run[k] for k in m} == m


def test_a_diverged_result_keeps_only_the_numbers_it_has():
    from study.runfolder import split_result

    metrics, record = split_result({"variant": "baseline", "status": "diverged", "reason": "loss rose",
                                    "val_loss": None, "val_perplexity": float("nan"), "tokens": 2048,
                                    "tokens_per_s": 1234.5, "steps": 1, "mlflow_run_id": "abc"})
    assert metrics == {"tokens": 2048, "tokens_per_s": 1234.5}
    assert record == {"variant": "baseline", "status": "diverged", "reason": "loss rose", "steps": 1,
                      "mlflow_run_id": "abc"}


SEEDS = (1, 2, 3, 4, 5)


def _synthetic_study(runs, missing=(), **kw):
    """The test runs of the arms baseline and nonlinear_q on SEEDS, but ``missing`` ((arm, seed) pairs)."""
    losses = {"baseline": {1: 4.00, 2: 4.10, 3: 3.95, 4: 4.05, 5: 3.98},
              "nonlinear_q": {1: 3.97, 2: 4.02, 3: 3.94, 4: 4.06, 5: 3.95}}
    write_arms(runs, {a: {s: x for s, x in by_seed.items() if (a, s) not in missing} for a, by_seed in losses.items()},
               **kw)
    plan = runs / "test/plan.json"  # the plan names every seed, missing runs too
    plan.write_text(json.dumps({"seeds": {a: list(SEEDS) for a in losses}}))


def _flat(d: dict, prefix: str = "") -> dict:
    return {k2: v2 for k, v in d.items() for k2, v2 in
            (_flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(f"{prefix}{k}", v)])}


@pytest.mark.slow  # dvc processes
def test_dvc_metrics_and_plots_of_the_pipeline(tmp_path, monkeypatch):
    """In a copy of the project (a git and DVC repository): compare's metric files are numbers only, one
    per arm; `dvc metrics show` lists them; `dvc plots show` draws one val_loss chart with
    one line per run; `dvc plots diff` one line per run and revision; git sees no generated file."""
    from study.compare import main

    project = copy_project(tmp_path / "p", arms=("baseline", "nonlinear_q"), seeds=SEEDS)
    _synthetic_study(project / "runs")
    monkeypatch.chdir(project)
    assert main([]) == 0
    verdict = json.loads((project / "reports/summary.json").read_text())["verdict"]
    files = sorted(p.name for p in (project / "reports/metrics").iterdir())
    assert files == ["baseline.json", "nonlinear_q.json"]
    nq = json.loads((project / "reports/metrics/nonlinear_q.json").read_text())
    c = verdict["comparisons"]["nonlinear_q vs baseline"]
    assert _flat(nq) == pytest.approx({"val_loss": verdict["arms"]["nonlinear_q"]["val_loss_mean"], "n": 5,
                                       "vs_baseline.pct_log_loss": c["pct"]["mean"], "vs_baseline.ci_low": c["pct"]["ci95"][0],
                                       "vs_baseline.ci_high": c["pct"]["ci95"][1], "vs_baseline.p": c["p_value_bh"],
                                       "vs_baseline.n": 5})
    env = env_for(project)
    dvc = [str(BIN / "dvc")]
    shown = subprocess.run(dvc + ["metrics", "show", "--json"], cwd=project, env=env, capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout[shown.stdout.index("{"):])
    per_file = data["workspace"]["data"] if "workspace" in data else data[""]["data"]
    got = {path: entry["data"] for path, entry in per_file.items() if "data" in entry}
    assert {"reports/metrics/baseline.json", "reports/metrics/nonlinear_q.json"} <= set(got)
    assert "reports/summary.json" not in got
    assert all(_numbers_only(_flat(d)) for d in got.values()), got
    # the curves: one chart, one line per run
    plots = subprocess.run(dvc + ["plots", "show", "--json", "val_loss"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=300)
    assert plots.returncode == 0, plots.stderr
    charts = json.loads(plots.stdout[plots.stdout.index("{"):])["data"]["val_loss"]
    assert len(charts) == 1 and charts[0]["type"] == "vega"
    spec = charts[0]["content"]
    assert spec["encoding"]["color"]["field"] == "run" and spec["encoding"]["x"]["field"] == "tokens"
    values = spec["data"]["values"]
    assert sorted({r["run"] for r in values}) == [f"{a}-s{s}" for a in ("baseline", "nonlinear_q") for s in SEEDS]
    assert len(values) == 10 * 3 and {r["rev"] for r in values} == {"workspace"}
    b1 = [float(r["val_loss"]) for r in values if r["run"] == "baseline-s1"]
    assert b1 == pytest.approx([4.2, 4.1, 4.0])  # the synthetic curve, falling to the final loss
    # dvc plots diff: the committed curves against the workspace's, one line per run and revision
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["add", "-f", "reports/curves.csv"], cwd=project, check=True)
    subprocess.run(git + ["commit", "-qm", "curves"], cwd=project, check=True)
    (project / "reports/curves.csv").write_text((project / "reports/curves.csv").read_text().replace(",4.2", ",4.3"))
    diff = subprocess.run(dvc + ["plots", "diff", "HEAD", "--json", "--targets", "val_loss"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert diff.returncode == 0, diff.stderr
    values = json.loads(diff.stdout[diff.stdout.index("{"):])["data"]["val_loss"][0]["content"]["data"]["values"]
    assert len({(r["rev"], r["run"]) for r in values}) == 20
    # nothing compare wrote is offered to git (dvc_plots/ neither)
    subprocess.run(git + ["rm", "-q", "--cached", "reports/curves.csv"], cwd=project, check=True)
    subprocess.run(dvc + ["plots", "show", "-q"], cwd=project, env=env, check=True, timeout=300)
    assert (project / "dvc_plots/index.html").is_file()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=project,
                            capture_output=True, text=True, check=True).stdout
    assert status.splitlines() == ["D  reports/curves.csv"], status


def test_stale_arm_metrics_are_removed(tmp_path):
    from study.analysis.report import write_metrics

    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "identity_q.json").write_text("{}")
    summary = {"verdict": {"arms": {"baseline": {"val_loss_mean": 4.0, "n_seeds": 1}}, "comparisons": {}}}
    write_metrics(summary, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["baseline.json"]
    # one seed: no sd, so nothing undefined is written (NaN is not a number for DVC)
    assert json.loads((folder / "baseline.json").read_text()) == {"val_loss": 4.0, "n": 1}


def test_missing_run_hint_is_a_command_that_makes_that_run(nano_project, tmp_path, monkeypatch, capsys):
    """The hint carries compare's own settings (model field, lr, runs folder): run as printed, it trains
    the missing run with those settings, into the folder compare reads."""
    from study.compare import main
    from study.config import load_config, run_dir

    runs = tmp_path / "runs"
    _synthetic_study(runs, missing={("nonlinear_q", 2)}, model={"n_layer": 3})
    monkeypatch.chdir(nano_project)
    args = [*arms_overrides(tmp_path), "model.n_layer=3", "arms.nonlinear_q.lr=0.002"]
    assert main(args) == 2
    err = capsys.readouterr().err
    cmd = re.search(r"`python -m study\.train ([^`]*)`", err)
    assert cmd, err
    overrides = shlex.split(cmd.group(1))
    assert overrides[:2] == ["variant=nonlinear_q", "seed=2"]
    assert {"model.n_layer=3", "arm.lr=0.002", f"study.runs_dir={runs}"} <= set(overrides), overrides
    assert not [o for o in overrides if o.startswith(("study.reports_dir", "study.arms", "study.seeds"))]
    cfg = load_config(overrides, nano_project)
    assert cfg.model.n_layer == 3 and cfg.arm.lr == 0.002
    assert run_dir(nano_project, cfg, cfg.variant.name, cfg.seed, cfg.study.group) == runs / "test/nonlinear_q/nonlinear_q-s2"


def test_missing_profile_run_hint_carries_the_profile_settings(nano_project):
    from study.analysis.runs import train_hint_overrides
    from study.config import load_config

    cfg = load_config([], nano_project)
    ladder = train_hint_overrides(cfg, nano_project, "scale_ladder/ladder-64")
    assert ladder == ["model=ladder-64", "train.tokens_per_param=0.5", "train.warmup_tokens=2048", "train.lr_from_tuned=true",
                      "train.lr_per_size=true"]
    cfg = load_config(["model=ladder-96"], nano_project)  # the study's own model choice gives way to the size's
    assert [o for o in train_hint_overrides(cfg, nano_project, "scale_ladder/ladder-64") if o.startswith("model=")] == [
        "model=ladder-64"]
