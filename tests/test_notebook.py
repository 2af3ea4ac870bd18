"""The analysis notebook (notebooks/analysis.ipynb) executed against a small study of the default's kind: arms at
fixed lrs, their test runs (runs/test/ARM/VARIANT-sSEED), compare's report (reports/summary.json) and the MLflow
store, made by the stages themselves (study.test_runs, study.compare) on the nano model.  Its tables are checked
against summary.json and against statistics recomputed here from the runs' metrics.json files."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import ROOT, copy_project, run_cli, write_params

#: the arms of the small study: the default's baseline, nonlinear query and no-context yardstick, and a
#: parameter-matched baseline; every lr fixed (nothing is tuned: tune.table_dir holds no table)
ARMS = {"baseline": "baseline", "nonlinear_q": "nonlinear_q", "no_context": "no_context",
        "baseline_mlp4.75": "baseline_mlp4.75"}
SEEDS = (1, 2, 3, 4, 5)

def arms_study(dest: Path, data_from: Path) -> Path:
    """A copy of the project whose conf/study.yaml (and params.yaml) is a nano study of ``ARMS`` on ``SEEDS``, its
    prepared data copied from ``data_from`` (a prepared nano project); nothing trained yet."""
    project = copy_project(dest, name="nb-study", arms=tuple(ARMS), seeds=SEEDS)
    study_yaml = project / "conf" / "study.yaml"
    text = study_yaml.read_text().replace("  pairs: []\n", "  pairs: [[nonlinear_q, baseline], [baseline_mlp4.75, baseline]]\n"
                                                           "  jobs: 2\n")
    study_yaml.write_text(text.replace("trainer: {}", "trainer:\n  threads: 1"))
    write_params(project)
    shutil.copytree(data_from / "data", project / "data", dirs_exist_ok=True)
    return project


def run_stages(project: Path) -> None:
    """The test stage and compare, as `dvc repro` runs them (`--params params.yaml`)."""
    for stage in ("study.test_runs", "study.compare"):
        r = run_cli(project, stage, "--params", "params.yaml", timeout=1500)
        assert r.returncode == 0, (stage, (r.stdout + r.stderr)[-4000:])


def execute(project: Path, out: Path):
    """notebooks/analysis.ipynb executed with STUDY_ROOT=project; returns the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks/analysis.ipynb", as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    old = dict(os.environ)
    os.environ.update(STUDY_ROOT=str(project), MLFLOW_DISABLE_TELEMETRY="true")
    os.environ.pop("MPLBACKEND", None)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return nb


def outputs(nb, mime: str) -> list:
    """Every output of ``mime`` of the executed notebook's code cells, in order."""
    return [o["data"][mime] for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if mime in o.get("data", {})]


def tables(nb) -> dict[str, list[dict]]:
    """{name: rows} of the notebook's tables, as each displayed table's output metadata holds them ("study_table")."""
    found = [o.get("metadata", {}).get("study_table") for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    return {t["name"]: t["rows"] for t in found if t}


def final_losses(project: Path) -> dict[str, dict[int, float]]:
    """{arm: {seed: final val_loss}} read here from the test runs' metrics.json files."""
    return {a: {s: json.loads((project / f"runs/test/{a}/{v}-s{s}/metrics.json").read_text())["val_loss"]
                for s in SEEDS} for a, v in ARMS.items()}


def by_hand(arm: dict[int, float], ref: dict[int, float]) -> dict:
    """The paired comparison computed here: mean difference (nats), its 95% t interval, both in % log-loss of the
    reference's mean, and the two-sided paired t test's p."""
    d = np.array([arm[s] - ref[s] for s in SEEDS])
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    base = np.mean([ref[s] for s in SEEDS])
    return {"mean_diff": d.mean(), "ci95": [d.mean() - half, d.mean() + half],
            "pct": 100 * d.mean() / base, "pct_ci95": [100 * (d.mean() - half) / base, 100 * (d.mean() + half) / base],
            "p": stats.ttest_rel([arm[s] for s in SEEDS], [ref[s] for s in SEEDS]).pvalue}


@pytest.fixture(scope="module")
def executed(nano_project, tmp_path_factory):
    project = arms_study(tmp_path_factory.mktemp("nb_study"), nano_project)
    run_stages(project)
    return project, execute(project, project / "notebooks")


@pytest.mark.slow  # 20 nano trainings (4 arms x 5 seeds), compare and the notebook's kernel
def test_the_notebooks_paired_differences_are_summary_jsons(executed):
    project, nb = executed
    summary = json.loads((project / "reports/summary.json").read_text())["verdict"]
    got = {r["comparison"]: r for r in tables(nb)["paired_differences"]}
    losses = final_losses(project)
    assert set(got) == {"nonlinear_q vs baseline", "baseline_mlp4.75 vs baseline"} == set(summary["comparisons"])
    for name, c in summary["comparisons"].items():
        row, hand = got[name], by_hand(losses[c["arm"]], losses[c["reference"]])
        assert row["pairs"] == c["n_pairs"] == len(SEEDS) and row["word"] == c["word"]
        assert row["mean_diff"] == f"{c['mean_diff']:+.4f}" == f"{hand['mean_diff']:+.4f}"
        assert row["pct_log_loss"] == f"{c['pct']['mean']:+.2f}" == f"{hand['pct']:+.2f}"
        assert row["ci95_pct"] == f"[{c['pct']['ci95'][0]:+.2f}, {c['pct']['ci95'][1]:+.2f}]" \
            == f"[{hand['pct_ci95'][0]:+.2f}, {hand['pct_ci95'][1]:+.2f}]"
        assert row["ci95_nats"] == f"[{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]" \
            == f"[{hand['ci95'][0]:+.4f}, {hand['ci95'][1]:+.4f}]"
        assert c["p_value"] == pytest.approx(hand["p"], rel=1e-9)
        assert row["p_bh"] == f"{c['p_value_bh']:.3g}" and row["tost_p_bh"] == f"{c['tost_p_bh']:.3g}"
        assert row["stein_N"] == c["stein"]["n_needed"]
    assert "the notebook's numbers are summary.json's" in "\n".join(outputs(nb, "text/plain") + [
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs])


@pytest.mark.slow
def test_the_notebook_shows_each_arm_and_seed_attention_share_and_the_matched_baseline(executed):
    project, nb = executed
    t = tables(nb)
    summary = json.loads((project / "reports/summary.json").read_text())["verdict"]
    losses = final_losses(project)
    rows = {(r["arm"], r["seed"]): r for r in t["runs"]}
    assert set(rows) == {(a, s) for a in ARMS for s in SEEDS}
    for (a, s), r in rows.items():
        assert r["val_loss"] == f"{losses[a][s]:.4f}" and r["mlflow_val_loss"] == r["val_loss"]
        assert r["status"] == "ok" and r["evaluations"] == 2  # 20480 tokens, evaluated every 5 of 10 steps
    share = {(r["arm"], r["reference"]): r for r in t["attention_share"]}
    assert set(share) == {("no_context", "baseline")}
    d = [losses["no_context"][s] - losses["baseline"][s] for s in SEEDS]
    assert share["no_context", "baseline"]["share_nats"] == f"{np.mean(d):+.4f}" \
        == f"{summary['attention'][0]['share']:+.4f}"
    matched = {r["arm"]: r for r in t["matched_baselines"]}
    assert set(matched) == {"baseline", "baseline_mlp4.75"}
    big, base = (json.loads((project / f"runs/test/{a}/{a}-s1/record.json").read_text())["non_embedding_params"]
                 for a in ("baseline_mlp4.75", "baseline"))
    assert matched["baseline_mlp4.75"]["params_vs_baseline"] == f"{big / base:.3f}" and big > base
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "frontier not fitted: 2 size(s)" in text
    pngs = outputs(nb, "image/png")
    assert len(pngs) >= 3  # the validation curves, the loss by position, the verdict
