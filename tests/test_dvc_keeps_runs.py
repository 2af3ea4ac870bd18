"""Reliability, round three (issue 25 item 3): no DVC command the README or an error suggests deletes a
finished run (docs/failures.md).  The exact sequence of the reported failure, in a scratch copy of the project."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT, copy_project, env_for

RUN_FILES = ("metrics.json", "record.json", "curve.csv", "config.json", "checkpoints/last.ckpt", "checkpoints/run.json")


def _dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dvc"), *args], cwd=project, env=env_for(project), capture_output=True,
                          text=True, timeout=900)


def _digests(root: Path, files) -> dict[str, str]:
    return {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}


def test_every_stage_output_persists():
    """The rule (dvc.yaml's header): every output of a stage whose command can refuse to run is
    ``persist: true``, so DVC never deletes it before the command; compare's reports are remade from the runs."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        if name in ("check_params", "compare"):
            continue
        outs = [o for kind in ("outs", "metrics", "plots") for o in stage.get(kind, [])]
        assert outs, name
        for o in outs:
            path, opts = next(iter(o.items())) if isinstance(o, dict) else (o, {})
            assert (opts or {}).get("persist") is True, (name, path)


@pytest.mark.slow  # ~2-3 min: three dvc repro / exp run of one nano run in a scratch copy
def test_exp_run_then_a_conf_edit_then_repro_loses_nothing(tmp_path):
    """`dvc exp run -S arms.baseline.lr=6e-3`, an edit under conf/, then `dvc repro` and `dvc repro -f compare`: both
    refuse (params.yaml is not conf/ composed) and every file of the finished runs and of data/tokens is
    still there, byte for byte; `make params` (python -m study.config) then `dvc repro` replaces the runs."""
    project = copy_project(tmp_path / "p", name="keep", arms=("baseline",), seeds=(1, 2, 3, 4, 5), tokens=10240)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    r = _dvc(project, "repro")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    subprocess.run(git + ["add", "-A"], cwd=project, check=True)
    subprocess.run(git + ["commit", "-qm", "study"], cwd=project, check=True)
    r = _dvc(project, "exp", "run", "-S", "arms.baseline.lr=6e-3")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    run = project / "runs/test/baseline/baseline-s1"
    assert '"lr": 0.006' in (run / "record.json").read_text()
    kept = _digests(run, RUN_FILES)
    data = sorted(str(p.relative_to(project)) for p in (project / "data/tokens").rglob("*") if p.is_file())
    kept_data = _digests(project, data)

    with open(project / "conf/variant/baseline.yaml", "a") as f:
        f.write("# an edit under conf/\n")
    r = _dvc(project, "repro")
    assert r.returncode != 0 and "params.yaml is not conf/ composed" in r.stdout + r.stderr
    # DVC did run a stage that trains (the first of test_runs and scale_ladder): its command refused
    assert "Running stage 'test_runs'" in r.stdout or "Running stage 'scale_ladder'" in r.stdout, r.stdout
    assert _digests(run, RUN_FILES) == kept
    r = _dvc(project, "repro", "-f", "compare")
    assert r.returncode != 0 and "params.yaml is not conf/ composed" in r.stdout + r.stderr
    assert _digests(run, RUN_FILES) == kept and _digests(project, data) == kept_data

    # the error's own advice: compose params.yaml, then repro re-runs the changed stage and replaces the run
    subprocess.run([str(BIN / "python"), "-m", "study.config"], cwd=project, env=env_for(project), check=True,
                   capture_output=True)
    r = _dvc(project, "repro")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert '"lr": 0.003' in (run / "record.json").read_text() and (run / "metrics.json").is_file()
    assert not (run / ".replaced").exists()


def test_a_stage_that_trains_depends_on_every_study_module_the_training_module_imports():
    """study/modeling/diagnostics.py (attn_logit_max in curve.csv and record.json), imported by the
    LightningModule, must be a dependency of every stage that trains: every module of study/ that
    study/modeling/lit_module.py imports is one (a package's __init__ counts as the package's folder)."""
    import ast

    tree = ast.parse((ROOT / "study/modeling/lit_module.py").read_text())
    imported = {n.module for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("study.")}
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    training = {name: s["deps"] for name, s in stages.items() if "study/modeling/lit_module.py" in s.get("deps", [])}
    assert {"tune", "test_runs", "scale_ladder"} <= set(training)
    for name, deps in training.items():
        for module in imported:
            path = module.replace(".", "/")
            if (ROOT / path).is_dir() and not (ROOT / f"{path}.py").is_file():  # a package: its __init__
                path = path + "/__init__"
            assert f"{path}.py" in deps or any(path == d or path.startswith(d + "/") for d in deps), (name, module)
