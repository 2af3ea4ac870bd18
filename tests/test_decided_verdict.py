"""The tuning and test stages end to end on synthetic runs: study.tune (grid, extension, lost points, reuse,
byte-stable table and figure, conf/tuned.yaml), study.test_runs (Stein's second stage) and compare's decided verdict
(comparison.md, summary.json, MLflow).  Runs are faked (study.runner.arms.TRAIN) with losses from a known bowl in ln lr."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from tests.synthetic_runs import write_run

BEST = {"baseline": 4e-3, "nonlinear_q": 1.6e-2}
DIVERGE = {"baseline": math.inf, "nonlinear_q": 2e-2}


def noise(variant: str, seed: int) -> float:
    base = 0.01 * (((seed * 7) % 5) - 2)
    return base + (0.015 * math.sin(3.0 * seed) if variant == "nonlinear_q" else 0.0)


def loss(variant: str, lr: float, seed: int) -> float | None:
    if variant.startswith("baseline_mlp"):  # the baseline family: its bowl, 0.1 nats lower per e-fold of MLP width
        return loss("baseline", lr, seed) - 0.1 * math.log(float(variant[len("baseline_mlp"):]) / 4)
    if lr > DIVERGE[variant]:
        return None
    return 4.0 + 0.05 * math.log(lr / BEST[variant]) ** 2 + noise(variant, seed) - (0.05 if variant == "nonlinear_q" else 0)


def fake_params(variant) -> int:
    """A run's non-embedding parameters: 1000 at the default MLP width, 250 per unit of a family arm's MLP ratio."""
    return 1000 if variant.mlp_ratio is None else int(250 * variant.mlp_ratio)


@pytest.fixture
def fake_train(monkeypatch):
    import study.runner.arms
    from study.config import run_dir
    from study.runner.resume_key import run_digest
    from study.runfolder import recorded_config

    calls = []

    def train(cfg, root):
        d = run_dir(root, cfg, cfg.variant.name, cfg.seed)
        x = loss(cfg.variant.name, cfg.arm.lr, cfg.seed)
        write_run(d, cfg.variant.name, cfg.seed, 9.0 if x is None else x, lr=cfg.arm.lr, tokens=cfg.train.tokens,
                  status="ok" if x is not None else "diverged", params=fake_params(cfg.variant))
        rec = json.loads((d / "record.json").read_text())
        rec["config_hash"] = run_digest(cfg, root / cfg.data.dir)
        (d / "record.json").write_text(json.dumps(rec))
        # the settings as study.train records them: reuse and compare check config.json against the run's key
        (d / "config.json").write_text(json.dumps(recorded_config(cfg, "0123456789abcdef")))
        calls.append((cfg.study.group, cfg.variant.name, cfg.seed))
        overwrites.append(bool(cfg.train.overwrite))
    overwrites = []
    train.overwrites = overwrites
    monkeypatch.setattr(study.runner.arms, "TRAIN", train)
    return calls


def test_a_finished_run_is_reused_and_one_of_other_settings_replaced(nano_project, tmp_path, monkeypatch, fake_train):
    import study.runner.arms
    from study.runner.arms import ensure_run

    monkeypatch.chdir(nano_project)
    over = [f"study.runs_dir={tmp_path / 'runs'}", "variant=baseline", "seed=3", "arm.lr=0.003",
            "study.group=test/x", "train.batch_tokens=2048", "train.tokens=20480"]
    d, reused = ensure_run(over, nano_project, None)
    assert not reused and d == tmp_path / "runs/test/x/baseline-s3" and len(fake_train) == 1
    assert ensure_run(over, nano_project, None) == (d, True) and len(fake_train) == 1
    # another lr is another run folder's business; here the same folder under another key (code, data or settings)
    rec = json.loads((d / "record.json").read_text())
    (d / "record.json").write_text(json.dumps({**rec, "config_hash": "0000000000000000"}))
    assert ensure_run(over, nano_project, None) == (d, False) and len(fake_train) == 2
    assert study.runner.arms.TRAIN.overwrites == [False, True]  # replaced, as DVC replaces a stage's outputs


def write_params(project: Path, tmp: Path, tuned: dict | None = None) -> Path:
    """A params.yaml as DVC's Hydra mode composes it (inside `dvc exp run`), with three arms."""
    from study.config import composed_params

    data = yaml.safe_load(composed_params(project, [
        f"study.runs_dir={tmp / 'runs'}", f"study.reports_dir={tmp / 'reports'}",
        f"study.tracking_db={tmp / 'mlruns.db'}", f"study.artifact_dir={tmp / 'mlartifacts'}",
        "study.seeds=[1,2,3,4,5]", f"tune.runs_dir={tmp / 'runs_tune'}", f"tune.table_dir={tmp / 'tuning'}",
        "train.batch_tokens=2048", "train.tokens=20480"]))
    data["arms"] = {"today": {"variant": "baseline", "overrides": [], "lr": 3e-3, "description": ""},
                    "base": {"variant": "baseline", "overrides": [], "lr": None, "description": ""},
                    "nlq": {"variant": "nonlinear_q", "overrides": [], "lr": None, "description": ""}}
    data["tune"]["arms"] = ["base", "nlq"]
    data["study"].update(arms=["today", "base", "nlq"], references=["base"], pairs=[], max_seeds=12, target_halfwidth=0.2)
    data["decomposition"] = {"rows": ["today", "base", "nlq"], "start": "today", "end": "nlq", "linear": "base"}
    data["tuned"] = tuned if tuned and "lr" in tuned else {"lr": tuned or {}}  # the tuned section, or its lrs alone
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def stein_n_by_hand(s0: float, d: float, n0: int = 5) -> int:
    """Stein's N from a first stage of n0 pairs with sd s0, for half-width d: max(n0, floor(t^2 s0^2 / d^2) + 1)."""
    return max(n0, math.floor(stats.t.ppf(0.975, n0 - 1) ** 2 * s0 ** 2 / d ** 2) + 1)


def tuned_params(project: Path, tmp: Path, monkeypatch) -> tuple[Path, dict, dict]:
    """Inside a faked `dvc exp run` in ``project``: base and nlq tuned (faked runs), their table written; returns
    params.yaml's path, its data with the tuned section (to edit and write back) and that tuned section."""
    from study.config import load_config
    from study.tune import main as tune
    from study.tuning.table import write_table

    monkeypatch.chdir(project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    params = write_params(project, tmp)
    for arm in ("base", "nlq"):
        assert tune(["--arm", arm, "--params", str(params)]) == 0
    write_table(load_config([], project, params=str(params)), project, tmp / "tuned.yaml")
    tuned_all = yaml.safe_load((tmp / "tuned.yaml").read_text())["tuned"]
    return params, yaml.safe_load(write_params(project, tmp, tuned_all).read_text()), tuned_all


@pytest.mark.slow  # tune, test and compare stages end to end on faked trainings (~45 s)
def test_tune_then_test_then_compare(nano_project, tmp_path, monkeypatch, fake_train, capsys):
    from study.compare import main as compare
    from study.config import load_config
    from study.tune import main as tune
    from study.tuning.table import write_table
    from study.test_runs import main as verdict

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")  # params.yaml is DVC's composition, as inside `dvc exp run`
    params = write_params(nano_project, tmp_path)

    # tuning: baseline brackets on the first grid; nonlinear_q extends upwards, and 2.4e-2 diverges (lost)
    assert tune(["--arm", "base", "--params", str(params)]) == 0
    assert tune(["--arm", "nlq", "--params", str(params)]) == 0
    base = json.loads((tmp_path / "runs_tune/base/tuning.json").read_text())
    nlq = json.loads((tmp_path / "runs_tune/nlq/tuning.json").read_text())
    assert [p["lr"] for p in base["points"]] == [1.5e-3, 3e-3, 6e-3] and base["status"] == "bracketed"
    # the bowl is a parabola in ln lr and the seed offsets cancel in the mean: the vertex is its optimum exactly
    assert base["source"] == "vertex" and base["lr_star"] == pytest.approx(4e-3, rel=1e-9)
    assert [p["lr"] for p in nlq["points"]] == [1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2]
    assert nlq["points"][-1]["status"] == "lost" and nlq["points"][-1]["mean"] is None
    assert nlq["status"] == "bracketed" and nlq["lr_star"] == 1.2e-2 and nlq["source"] == "best point"
    assert len(fake_train) == 2 * 3 + 2 * 5
    # a second tuning reuses every finished run
    assert tune(["--arm", "nlq", "--params", str(params)]) == 0 and len(fake_train) == 16

    # the table, figure and tuned file: byte-stable
    cfg = load_config([], nano_project, params=str(params))
    tuned_file = tmp_path / "tuned.yaml"
    write_table(cfg, nano_project, tuned_file)
    first = {p.name: p.read_bytes() for p in (tmp_path / "tuning").iterdir()}
    write_table(cfg, nano_project, tuned_file)
    assert {p.name: p.read_bytes() for p in (tmp_path / "tuning").iterdir()} == first
    assert set(first) == {"table.json", "table.md", "tuning.png"} and first["tuning.png"][:4] == b"\x89PNG"
    # tuning one arm again keeps the other arm's row and lr* (nothing tuned before is lost)
    write_table(load_config(["tune.arms=[base]"], nano_project, params=str(params)), nano_project, tmp_path / "t1.yaml")
    assert {p.name: p.read_bytes() for p in (tmp_path / "tuning").iterdir()} == first
    assert (tmp_path / "t1.yaml").read_bytes() == tuned_file.read_bytes()
    tuned_all = yaml.safe_load(tuned_file.read_text())["tuned"]
    tuned = tuned_all["lr"]
    assert tuned == {"base": base["lr_star"], "nlq": 1.2e-2}
    assert "| nlq | nonlinear_q | - | bracketed | 0.012 |" in first["table.md"].decode()
    # each lr* beside the model and budget it was tuned at (the params above: 20480 tokens of 2048)
    at = tuned_all["recipe"]["nlq"]
    assert at["train"]["tokens"] == 20480 and at["train"]["batch_tokens"] == 2048 and at["model"]["name"] == cfg.model.name
    assert at["train"]["warmup_tokens"] == cfg.train.warmup_tokens and tuned_all["recipe"]["base"] == at

    # the test stage refuses a tuned file that disagrees with its table (its lrs, or the recipe beside them), and an
    # lr* tuned at another warmup than the study's; then runs Stein's two stages
    assert verdict(["--params", str(write_params(nano_project, tmp_path, {"base": 5e-3, "nlq": 1.2e-2}))]) == 2
    assert verdict(["--params", str(write_params(nano_project, tmp_path, tuned))]) == 2  # lrs without their recipe
    params = write_params(nano_project, tmp_path, tuned_all)
    data = yaml.safe_load(params.read_text())
    data["train"]["warmup_tokens"] = at["train"]["warmup_tokens"] + 2048
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert verdict(["--params", str(params)]) == 2 and not (tmp_path / "runs/test/plan.json").exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: arm 'base'") and "\n" not in err
    assert f"tuned at train.warmup_tokens={at['train']['warmup_tokens']}, but this study runs " \
           f"train.warmup_tokens={at['train']['warmup_tokens'] + 2048}: re-tune it" in err
    params = write_params(nano_project, tmp_path, tuned_all)
    assert verdict(["--params", str(params)]) == 0
    plan = json.loads((tmp_path / "runs/test/plan.json").read_text())
    # Stein's N by hand from the first five seeds: d = 0.2% of the reference's first-stage mean loss
    ref = {s: loss("baseline", tuned["base"], s) for s in range(1, 13)}
    d5 = 0.002 * np.mean([ref[s] for s in range(1, 6)])
    for arm in ("today", "nlq"):
        s0 = plan["stage_one"][f"{arm} vs base"]["s0"]
        want = stein_n_by_hand(s0, d5)
        assert plan["stage_one"][f"{arm} vs base"]["n_needed"] == want
        assert plan["seeds"][arm] == list(range(1, min(12, want) + 1))
    assert plan["seeds"]["base"] == list(range(1, max(len(plan["seeds"]["today"]), len(plan["seeds"]["nlq"])) + 1))
    assert len(plan["seeds"]["base"]) > 5  # the second stage trained more seeds
    n_before = len(fake_train)
    assert verdict(["--params", str(params)]) == 0 and len(fake_train) == n_before  # every run reused

    # compare: the decided verdict of the test runs
    assert compare(["--params", str(params)]) == 0
    summary = json.loads((tmp_path / "reports/summary.json").read_text())
    v = summary["verdict"]
    assert set(v["comparisons"]) == {"today vs base", "nlq vs base"}
    c = v["comparisons"]["nlq vs base"]
    n = c["n_pairs"]
    diffs = [loss("nonlinear_q", 1.2e-2, s) - loss("baseline", tuned["base"], s) for s in range(1, n + 1)]
    assert c["mean_diff"] == pytest.approx(np.mean(diffs), rel=1e-9)
    assert c["p_value"] == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue, rel=1e-9)
    claim = -0.024 * np.mean([loss("baseline", tuned["base"], s) for s in range(1, n + 1)])  # the paper's -2.40%
    assert c["claim"]["p_value"] == pytest.approx(stats.ttest_1samp(diffs, claim, alternative="greater").pvalue,
                                                  rel=1e-9)
    assert c["claim"]["excluded"] == (c["claim_p_bh"] < 0.05)
    assert c["word"] in ("better", "worse", "equivalent", "undecided") and c["verdict"].startswith(c["word"])
    assert v["arms"]["nlq"]["val_loss_sd"] == pytest.approx(np.std(
        [loss("nonlinear_q", 1.2e-2, s) for s in range(1, n + 1)], ddof=1), rel=1e-9)
    dec = v["decomposition"]
    assert [r["arm"] for r in dec["rows"]] == ["today", "base", "nlq"] and dec["share"] is not None
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "## The decided verdict" in md and f"| nlq vs base | **{c['word']}**{c['verdict'][len(c['word']):]} | {n} |" in md
    assert "### The recipe decomposition" in md

    # an arm whose grid hit the cap: every verdict involving it says so
    table = json.loads((tmp_path / "tuning/table.json").read_text())
    table["arms"]["nlq"]["status"] = "optimum not bracketed"
    (tmp_path / "tuning/table.json").write_text(json.dumps(table))
    assert compare(["--params", str(params)]) == 0
    again = json.loads((tmp_path / "reports/summary.json").read_text())["verdict"]["comparisons"]
    assert again["nlq vs base"]["verdict"] == c["verdict"] + "; optimum not bracketed for nlq"
    assert again["today vs base"]["verdict"] == v["comparisons"]["today vs base"]["verdict"]
    c = again["nlq vs base"]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    exp = client.get_experiment_by_name(summary["study"])
    run = client.search_runs([exp.experiment_id], filter_string="tags.kind = 'verdict'")[0]
    assert run.data.tags["verdict/nlq_vs_base"] == c["verdict"]
    assert run.data.metrics["verdict_mean_diff/nlq_vs_base"] == pytest.approx(c["mean_diff"])


@pytest.mark.slow
def test_make_tune_through_dvc(tmp_path):
    """The real thing at nano size: `dvc repro tune@base` trains the arm's grid through study.train, `--write` turns
    it into conf/tuned.yaml, a second repro trains nothing, and compare's upstream holds no tuning stage."""
    import subprocess

    from conftest import BIN, ROOT, copy_project, env_for, run_cli

    project = copy_project(tmp_path / "p", seeds=(1, 2))
    study = project / "conf/study.yaml"
    study.write_text(study.read_text().replace("  - trainer: cpu\n", "  - trainer: cpu\n  - tuned\n")
                     .replace("arms:\n", "arms:\n  base: {variant: baseline}\n")
                     + "tune:\n  arms: [base]\n  points: 3\n  max_points: 4\n  tokens: 4096\n")
    assert run_cli(project, "study.config").returncode == 0
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["commit", "-qam", "tune base"], cwd=project, check=True)

    def dvc(*args):
        return subprocess.run([str(BIN / "dvc"), *args], cwd=project, env=env_for(project), capture_output=True,
                              text=True, timeout=1500)
    r = run_cli(project, "study.tune", "--targets", "--params", "params.yaml")
    assert r.stdout.split() == ["tune@base"], r.stderr
    r = dvc("repro", "tune@base")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads((project / "runs_tune/base/tuning.json").read_text())
    assert len(res["points"]) >= 3 and res["status"] in ("bracketed", "optimum not bracketed")
    for p in res["points"]:
        for seed in (101, 102):
            d = project / f"runs_tune/base/lr{p['lr']:.6g}/baseline-s{seed}"
            assert (d / "metrics.json").is_file() and json.loads((d / "config.json").read_text())["arm"]["lr"] == p["lr"]
    assert run_cli(project, "study.tune", "--write", "--params", "params.yaml").returncode == 0
    shipped = yaml.safe_load((ROOT / "conf/tuned.yaml").read_text())["tuned"]["lr"]  # the repository's arms, kept
    tuned = yaml.safe_load((project / "conf/tuned.yaml").read_text())["tuned"]["lr"]
    assert tuned == {**shipped, "base": res["lr_star"]}
    assert run_cli(project, "study.config").returncode == 0
    r = dvc("repro", "tune@base")
    assert r.returncode == 0 and "didn't change" in r.stdout, r.stdout[-2000:]
    r = dvc("dag", "--md", "compare")
    assert r.returncode == 0 and "tune@" not in r.stdout and "test_runs" in r.stdout


@pytest.mark.slow  # the test and compare stages on faked trainings (~25 s)
def test_the_verdict_alone_is_the_report(nano_project, tmp_path, monkeypatch, fake_train):
    """The report is the decided verdict: its tables, metrics/ARM.json, the test runs' curves and the verdict
    figure."""
    from study.compare import main as compare
    from study.test_runs import main as verdict

    params, data, tuned_all = tuned_params(nano_project, tmp_path, monkeypatch)
    tuned = tuned_all["lr"]
    assert verdict(["--params", str(params)]) == 0
    assert compare(["--params", str(params)]) == 0
    out = tmp_path / "reports"
    summary = json.loads((out / "summary.json").read_text())
    plan = json.loads((tmp_path / "runs/test/plan.json").read_text())
    c = summary["verdict"]["comparisons"]["nlq vs base"]
    metrics = {p.stem: json.loads(p.read_text()) for p in (out / "metrics").glob("*.json")}
    assert set(metrics) == {"today", "base", "nlq"}
    nlq = [loss("nonlinear_q", tuned["nlq"], s) for s in plan["seeds"]["nlq"]]
    assert metrics["nlq"]["val_loss"] == pytest.approx(np.mean(nlq), rel=1e-9) and metrics["nlq"]["n"] == len(nlq)
    vs = metrics["nlq"]["vs_base"]
    diffs = [loss("nonlinear_q", tuned["nlq"], s) - loss("baseline", tuned["base"], s) for s in range(1, vs["n"] + 1)]
    ref = np.mean([loss("baseline", tuned["base"], s) for s in range(1, vs["n"] + 1)])
    assert vs["pct_log_loss"] == pytest.approx(100 * np.mean(diffs) / ref, rel=1e-9)
    assert vs["ci_high"] - vs["pct_log_loss"] == pytest.approx(
        100 / ref * stats.t.ppf(0.975, vs["n"] - 1) * np.std(diffs, ddof=1) / math.sqrt(vs["n"]), rel=1e-9)
    assert vs["p"] == pytest.approx(c["p_value_bh"], rel=1e-12) and vs["n"] == c["n_pairs"]
    assert set(metrics["base"]) == {"val_loss", "n"}  # the reference
    rows = (out / "curves.csv").read_text().splitlines()
    assert rows[0] == "run,arm,seed,step,tokens,val_loss,train_loss"
    assert {r.split(",")[0] for r in rows[1:]} == {f"{a}-s{s}" for a in plan["seeds"] for s in plan["seeds"][a]}
    assert (out / "figures/verdict.png").read_bytes()[:4] == b"\x89PNG" and "verdict.png" in summary["figures"]
    assert set(summary["figures"]) == {"verdict.png", "val_loss_curves.png", "train_loss_curves.png"}  # the test runs' curves
    md = (out / "comparison.md").read_text()
    assert "## The decided verdict" in md and "![verdict](figures/verdict.png)" in md
    assert f"; seeds {summary['seeds']} (Stein's first stage: each arm's seeds are in the decided verdict)." in md
    arms = summary["verdict"]["arms"]  # a fixed-lr arm was never tuned: no tuning status of another study's table
    assert (arms["today"]["lr_from"], arms["today"]["tuning"]) == ("fixed", None)
    assert arms["base"]["lr_from"] == "tuned" and arms["base"]["tuning"] is not None
    assert summary["verdict"]["seed_roles"]["tuning"] == data["tune"]["seeds"]  # tuned arms: the tuning seeds shown
    for a in ("base", "nlq"):  # every arm at a fixed lr (the nano study's way): no tuning seed is claimed
        data["arms"][a]["lr"] = 0.01
    data["tune"]["arms"] = []
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    assert verdict(["--params", str(params)]) == 0 and compare(["--params", str(params)]) == 0
    fixed = json.loads((out / "summary.json").read_text())["verdict"]
    assert fixed["seed_roles"]["tuning"] == [] and all(a["tuning"] is None for a in fixed["arms"].values())
    assert "Seeds, each with one purpose: tuning none (conf/tuning/)" in (out / "comparison.md").read_text()


@pytest.mark.slow  # the test and compare stages on faked trainings (~25 s)
def test_study_pairs_pick_the_comparisons_and_only_their_arms_get_more_seeds(nano_project, tmp_path, monkeypatch,
                                                                            fake_train):
    """study.pairs=[[nlq, base]] with two references: one comparison, not two; the second stage adds seeds to nlq
    and base only (Stein's N by hand), the unpaired reference stays at the first stage's five."""
    from study.compare import main as compare
    from study.config import ConfigError, load_config
    from study.test_runs import main as verdict

    params, data, tuned_all = tuned_params(nano_project, tmp_path, monkeypatch)
    data["study"].update(references=["base", "today"], pairs=[["nlq", "base"]])
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    assert verdict(["--params", str(params)]) == 0
    plan = json.loads((tmp_path / "runs/test/plan.json").read_text())
    assert set(plan["stage_one"]) == {"nlq vs base"}
    ref = [loss("baseline", tuned_all["lr"]["base"], s) for s in range(1, 6)]
    s0 = np.std([loss("nonlinear_q", tuned_all["lr"]["nlq"], s) - ref[s - 1] for s in range(1, 6)], ddof=1)
    want = stein_n_by_hand(s0, 0.002 * np.mean(ref))
    assert want > 5 and plan["stage_one"]["nlq vs base"]["n_needed"] == want
    assert plan["seeds"]["nlq"] == plan["seeds"]["base"] == list(range(1, min(12, want) + 1))
    assert plan["seeds"]["today"] == [1, 2, 3, 4, 5]
    assert compare(["--params", str(params)]) == 0
    assert set(json.loads((tmp_path / "reports/summary.json").read_text())["verdict"]["comparisons"]) == {"nlq vs base"}
    # a pair naming an arm the study does not train is refused in one line, before anything runs
    data["study"]["pairs"] = [["nlq", "wild"]]
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"study.pairs entry \[nlq, wild\]: 'wild' is not in study.references=\['base', "
                                        r"'today'\]: add it there \(and define arms.wild\)"):
        load_config([], nano_project, params=str(params))


@pytest.mark.slow  # the test and compare stages on faked trainings (~8 s)
def test_an_arm_that_diverges_on_every_seed_is_named_in_its_verdict(nano_project, tmp_path, monkeypatch, fake_train):
    from study.compare import main as compare
    from study.test_runs import main as verdict

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    data = yaml.safe_load(write_params(nano_project, tmp_path).read_text())
    data["arms"]["wild"] = {"variant": "nonlinear_q", "overrides": [], "lr": 0.05, "description": ""}  # > DIVERGE
    data["study"].update(arms=["today", "wild"], references=["today"])
    data["tune"]["arms"], data["decomposition"]["rows"] = [], []
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    assert verdict(["--params", str(params)]) == 0 and compare(["--params", str(params)]) == 0
    c = json.loads((tmp_path / "reports/summary.json").read_text())["verdict"]["comparisons"]["wild vs today"]
    assert c["word"] == "undecided" and c["verdict"].endswith("; wild diverged on 5 of 5 seeds"), c["verdict"]
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "| wild | nonlinear_q | - | 0.05 | fixed | - | 0 (+5 diverged) |" in md


@pytest.mark.slow  # the test and compare stages on faked trainings (~13 s)
def test_the_report_prices_the_nonlinear_query_on_the_baseline_familys_frontier(nano_project, tmp_path, monkeypatch,
                                                                                 fake_train):
    """decomposition.family (three MLP widths of the baseline) and decomposition.worth: summary.json's frontier is the
    least-squares line through the family's log mean losses against log parameters (numpy's polyfit here), and
    nlq's worth the size on it whose loss nlq reaches, over nlq's own size; comparison.md shows both."""
    from study.compare import main as compare
    from study.config import ConfigError, load_config
    from study.test_runs import main as verdict

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    data = yaml.safe_load(write_params(nano_project, tmp_path).read_text())
    for name, ratio in (("m3", "3.5"), ("m5", "5")):
        data["arms"][name] = {"variant": f"baseline_mlp{ratio}", "overrides": [], "lr": 4e-3, "description": ""}
    data["arms"]["base"]["lr"], data["arms"]["nlq"]["lr"] = 4e-3, 1.6e-2  # each at its bowl's bottom
    data["study"].update(arms=["base", "m3", "m5", "nlq"], references=["base"], pairs=[["nlq", "base"]])
    data["tune"]["arms"] = []
    data["decomposition"].update(rows=[], family=["m3", "base", "m5"], worth=["nlq"])
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    assert verdict(["--params", str(params)]) == 0 and compare(["--params", str(params)]) == 0
    f = json.loads((tmp_path / "reports/summary.json").read_text())["verdict"]["frontier"]
    size = {"m3": 875, "base": 1000, "m5": 1250}
    mean = {a: np.mean([loss(v, 4e-3, s) for s in range(1, 6)])
            for a, v in (("m3", "baseline_mlp3.5"), ("base", "baseline"), ("m5", "baseline_mlp5"))}
    mean["nlq"] = np.mean([loss("nonlinear_q", 1.6e-2, s) for s in range(1, 6)])  # the seeds every arm has
    slope, intercept = np.polyfit(np.log(list(size.values())), np.log([mean[a] for a in size]), 1)
    assert f["fitted"] and f["slope"] == pytest.approx(slope) and f["intercept"] == pytest.approx(intercept)
    assert [(r["arm"], r["non_embedding_params"]) for r in f["family"]] == list(size.items())
    w = f["worth"]["nlq"]
    assert w["multiplier"] == pytest.approx(math.exp((math.log(mean["nlq"]) - intercept) / slope) / 1000)
    assert w["multiplier"] > 1 and w["ci95"][0] < w["multiplier"] < w["ci95"][1]
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "### The parameter frontier" in md and f"| nlq | 1,000 | {w['equivalent_params']:,.0f} |" in md
    # an arm priced but not tested, or a price without a frontier: refused in one line
    data["decomposition"].update(worth=["nlq", "today"])
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"decomposition.worth names \['today'\], which study.arms="):
        load_config([], nano_project, params=str(params))
    data["decomposition"].update(family=[], worth=["nlq"])
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"decomposition.worth=\['nlq'\] needs a frontier"):
        load_config([], nano_project, params=str(params))


@pytest.mark.slow  # the ladder's tuning stage on faked trainings (~50 s)
def test_the_ladder_transfer_check_tunes_one_size_by_the_same_rule(nano_project, tmp_path, monkeypatch, fake_train):
    """``study.tune --ladder MODEL``: scale_ladder.variants tuned at MODEL on the ladder's budget, in their own
    folders; the transferred lr (conf/tuned.yaml) against that size's lr*, with the quadratic's predicted cost."""
    from study.tune import main as tune

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    transferred = {"baseline": 8e-3, "nonlinear_q": 1.6e-2}  # baseline's bowl bottoms at 4e-3: a x2 miss
    data = yaml.safe_load(write_params(nano_project, tmp_path, transferred).read_text())
    data["arms"].update(baseline={"variant": "baseline", "overrides": [], "lr": None, "description": ""},
                        nonlinear_q={"variant": "nonlinear_q", "overrides": [], "lr": None, "description": ""})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    before = (nano_project / "conf" / "tuned.yaml").read_bytes()

    assert tune(["--ladder", "nano", "--params", str(params)]) == 0
    out = tmp_path / "tuning" / "nano"
    assert {p.name for p in out.iterdir()} == {"table.json", "table.md", "tuning.png", "transfer.json", "transfer.md"}
    after = (nano_project / "conf" / "tuned.yaml").read_text()
    # every line already there is kept, in order (the default size's lr*, recipes, other sizes, the tasks' lr*);
    # the two lines added are this size's lr* and the recipe they were tuned at, in the size and size_recipe sections
    added = list(after.splitlines())
    for line in before.decode().splitlines():
        added.remove(line)
    old, new = yaml.safe_load(before)["tuned"], yaml.safe_load(after)["tuned"]
    assert old.get("task")  # the tasks' lr* are there to be kept (conf/tuned.yaml's mlm and mqar)
    sizes, recipes = old.get("size") or {}, old.get("size_recipe") or {}
    assert [line[:11] for line in added] == ["    nano: {", "    nano: {"]
    assert after.index(added[0]) < after.index("  size_recipe:") < after.index(added[1])
    assert new["size"] == {**sizes, "nano": {"baseline": pytest.approx(4e-3, rel=1e-9), "nonlinear_q": 1.2e-2}}
    tuned_at = {v: json.loads((tmp_path / f"runs_tune/ladder/nano/{v}/tuning.json").read_text())["recipe"]
                for v in ("baseline", "nonlinear_q")}
    for r in tuned_at.values():
        r["train"]["tokens_per_param"] = 0.5  # the ladder's budget rule, which a ladder run must share
    assert new["size_recipe"] == {**recipes, "nano": tuned_at}
    assert {k: v for k, v in new.items() if k not in ("size", "size_recipe")} == \
        {k: v for k, v in old.items() if k not in ("size", "size_recipe")}
    assert not (tmp_path / "tuning" / "table.json").exists()
    base = json.loads((tmp_path / "runs_tune/ladder/nano/baseline/tuning.json").read_text())
    assert base["model"] == "nano" and base["lr_star"] == pytest.approx(4e-3, rel=1e-9)
    # the ladder's budget: tokens_per_param (0.5) x the nano baseline's non-embedding parameters, whole steps
    from study.config import load_config
    from study.modeling.accounting import describe
    cfg = load_config(["model=nano"], nano_project, params=str(params))
    n = describe(cfg.model, cfg.variant, 512)["non_embedding_params"]  # (rows do not count)
    assert base["tokens"] == max(1, int(0.5 * n) // 2048) * 2048
    t = json.loads((out / "transfer.json").read_text())["arms"]
    b = t["baseline"]
    assert b["transferred"] == 8e-3 and b["ratio"] == pytest.approx(2.0) and b["log2_ratio"] == pytest.approx(1.0)
    assert b["predicted_cost"] == pytest.approx(0.05 * math.log(2) ** 2, rel=1e-6)  # the bowl's A, a x2 miss
    # the grid 1.5e-3, 3e-3, 6e-3: 6e-3 is the point nearest 8e-3; its mean over the tuning seeds 101, 102
    assert b["nearest_lr"] == 6e-3
    assert b["nearest_mean"] == pytest.approx(np.mean([loss("baseline", 6e-3, s) for s in (101, 102)]), abs=1e-12)
    assert "| baseline | 0.008 | 0.004 | 2.000 | +1.00 | bracketed | 0.0240 |" in (out / "transfer.md").read_text()
    assert {c[1] for c in fake_train} == {"baseline", "nonlinear_q"}
    assert all(c[0].startswith(("baseline/lr", "nonlinear_q/lr")) for c in fake_train)
    # a second size keeps the first's lr*; re-tuning the default size (write_table) keeps both sizes
    assert tune(["--ladder", "nano", "--params", str(params)]) == 0
    assert (nano_project / "conf" / "tuned.yaml").read_text() == after
    sizes = {"nano": {"baseline": 4e-3}, "other": {"baseline": 2e-3}}
    from study.tuning.tuned_file import tuned_sizes, tuned_tasks, tuned_yaml
    tasks = {"mqar": {"lr": {"baseline": 0.02}, "recipe": {}}}
    tuned = nano_project / "conf" / "tuned.yaml"
    tuned.write_text(tuned_yaml({"arms": {}}, sizes, tasks))
    assert tuned_sizes(tuned) == sizes and tuned_tasks(tuned) == tasks
    assert tune(["--ladder", "nano", "--params", str(params)]) == 0
    assert set(tuned_sizes(tuned)) == {"nano", "other"}
    assert tuned_sizes(tuned)["other"] == {"baseline": 2e-3}
    assert tuned_tasks(tuned) == tasks  # the other tasks' lr* kept
    tuned.write_bytes(before)  # the shared project as it was


def test_the_ladder_needs_a_transferred_lr_for_each_variant(nano_project, tmp_path, monkeypatch, capsys):
    from study.tune import main as tune

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    data = yaml.safe_load(write_params(nano_project, tmp_path, {"baseline": 4e-3}).read_text())
    data["arms"].update(baseline={"variant": "baseline", "overrides": [], "lr": None, "description": ""},
                        nonlinear_q={"variant": "nonlinear_q", "overrides": [], "lr": None, "description": ""})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    assert tune(["--ladder", "nano", "--params", str(params)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nonlinear_q' has no lr* in conf/tuned.yaml" in err[0] and "make tune" in err[0]
    # an empty list is refused, and what a former check wrote is kept
    out = tmp_path / "tuning" / "nano"
    out.mkdir(parents=True)
    (out / "table.json").write_text("kept")
    assert tune(["--ladder", "nano", "--params", str(params), "scale_ladder.variants=[]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scale_ladder.variants is empty" in err[0] and (out / "table.json").read_text() == "kept"
    # the model missing before another option
    assert tune(["--ladder", "--params", str(params)]) == 2
    assert "--ladder needs a model size" in capsys.readouterr().err
    # another task: refused before anything is tuned or written (tuned.size holds lm's ladder only)
    tuned = (nano_project / "conf" / "tuned.yaml").read_bytes()
    assert tune(["--ladder", "nano", "--params", str(params), "task=mlm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not task=mlm" in err[0] and "drop task=mlm" in err[0]
    assert (nano_project / "conf" / "tuned.yaml").read_bytes() == tuned and (out / "table.json").read_text() == "kept"


def test_a_lost_grid_point_nearest_the_transferred_lr_is_reported_lost():
    from study.tuning.ladder import transfer_check, transfer_markdown

    pts = [{"lr": 3e-3, "mean": None, "status": "lost"}, {"lr": 6e-3, "mean": 5.2, "status": "ok"},
           {"lr": 1.2e-2, "mean": 5.0, "status": "ok"}, {"lr": 2.4e-2, "mean": 5.1, "status": "ok"}]
    r = {"points": pts, "lr_star": 1.2e-2, "fit": {"A": 0.1}, "best_loss": 5.0, "status": "bracketed"}
    t = transfer_check({"a": r}, {"a": 3.1e-3}, "m", "rule")
    a = t["arms"]["a"]
    assert a["nearest_lr"] == 3e-3 and a["nearest_mean"] is None and a["nearest_status"] == "lost"
    assert a["predicted_cost"] == pytest.approx(0.1 * math.log(3.1e-3 / 1.2e-2) ** 2)
    assert "| 0.003 | lost (diverged) | 5.0000 |" in transfer_markdown(t)
