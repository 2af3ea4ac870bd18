"""study.jobs: the tune and test_runs stages train their missing runs in study.train processes, several at once (the local
launcher, study/orchestration/launch.py),
with the numbers of one in-process training at the same trainer.threads; failures are named together, finished
runs reused."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from conftest import ROOT
from study.config import ConfigError, StudyError, load_config


def overrides(tmp, seed: int, runs: str) -> list[str]:
    return [f"study.runs_dir={tmp / runs}", f"study.tracking_db={tmp / 'mlruns.db'}",
            f"study.artifact_dir={tmp / 'mlartifacts'}", "trainer.progress_bar=false", "trainer.threads=1",
            "variant=baseline", f"seed={seed}", "arm.lr=0.003", "study.group=test/x", "train.tokens=8192"]


def val_loss(d) -> float:
    return json.loads((d / "metrics.json").read_text())["val_loss"]


@pytest.mark.slow  # training processes
def test_two_processes_give_the_numbers_of_one_and_reuse_what_finished(nano_project, tmp_path, monkeypatch):
    from study.orchestration.ensure import ensure_runs

    monkeypatch.chdir(nano_project)
    runs = [overrides(tmp_path, s, "par") for s in (1, 2)]
    got = ensure_runs(runs, nano_project, None, jobs=2)
    assert [(d.name, reused) for d, reused in got] == [("baseline-s1", False), ("baseline-s2", False)]
    assert [d.parent for d, _ in got] == [tmp_path / "par/test/x"] * 2
    threads = torch.get_num_threads()
    try:  # the same runs in this process, one after the other
        serial = ensure_runs([overrides(tmp_path, s, "ser") for s in (1, 2)], nano_project, None, jobs=1)
    finally:
        torch.set_num_threads(threads)
    assert [val_loss(d) for d, _ in got] == [val_loss(d) for d, _ in serial]
    assert val_loss(got[0][0]) != val_loss(got[1][0])  # two seeds, two runs
    assert [r for _, r in ensure_runs(runs, nano_project, None, jobs=2)] == [True, True]


@pytest.mark.slow  # training processes
def test_failed_trainings_are_named_together(nano_project, tmp_path, monkeypatch):
    from study.orchestration.ensure import ensure_runs

    monkeypatch.chdir(nano_project)
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # every training process exits 1
    with pytest.raises(StudyError, match=r"2 run\(s\) failed: .*baseline-s1 \(exit 1, log .*baseline-s1.log: empty\), "
                                         r".*baseline-s2 \(exit 1, log .*baseline-s2.log: empty\)") as e:
        ensure_runs([overrides(tmp_path, s, "bad") for s in (1, 2)], nano_project, None, jobs=2)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("over, message", [
    (["study.jobs=2"], r"study.jobs=2 runs 2 trainings at once: set trainer.threads"),
    (["study.jobs=0"], r"study.jobs=0 must be >= 1"),
])
def test_jobs_settings_are_checked(nano_project, monkeypatch, over, message):
    monkeypatch.chdir(nano_project)
    with pytest.raises(ConfigError, match=message):
        load_config(over, nano_project)
    assert load_config(["study.jobs=2", "trainer.threads=1"], nano_project).study.jobs == 2


def test_an_arm_named_twice_is_refused(monkeypatch):
    root = ROOT
    monkeypatch.chdir(root)
    with pytest.raises(ConfigError, match=r"study.arms lists \['baseline'\] more than once: name each arm once"):
        load_config(["study.arms=[baseline,baseline,nonlinear_q]"], root)


@pytest.mark.parametrize("pairs, message", [
    ("[nonlinear_q]", r"study.pairs entry 'nonlinear_q' must be \[arm, reference\], two different arm names"),
    ("[[baseline,baseline]]", r"must be \[arm, reference\], two different arm names"),
    ("[[1,2]]", r"study.pairs entry \[1, 2\] must be \[arm, reference\]"),
    ("[{a:b,c:d}]", r"study.pairs entry \{'a': 'b', 'c': 'd'\} must be \[arm, reference\]"),
    ("[{0:nonlinear_q,1:baseline}]", r"must be \[arm, reference\]"),  # a mapping, not a pair (its keys are 0, 1)
    ("[[nonlinear_q,baseline_d2z]]", r"entry \[nonlinear_q, baseline_d2z\]: 'baseline_d2z' is not in study.references="
                                     r"\['baseline', 'baseline_qknorm'\]: add it there, change the pair"),
    ("[[nope,baseline]]", r"'nope' is not in study.arms=.*: add it there \(and define arms.nope\)"),
    ("[[nonlinear_q,baseline],[nonlinear_q,baseline]]", r"lists \[nonlinear_q, baseline\] more than once"),
])
def test_study_pairs_are_checked(monkeypatch, pairs, message):
    """Each entry of study.pairs is [arm of study.arms, reference of study.references], once."""
    root = ROOT
    monkeypatch.chdir(root)
    with pytest.raises(ConfigError, match=message):
        load_config([f"study.pairs={pairs}"], root)
    if "must be" in message:  # the shape is checked even while the verdict is off (study.arms=[])
        with pytest.raises(ConfigError, match=message):
            load_config(["study.arms=[]", f"study.pairs={pairs}"], root)


def test_the_default_pairs_and_every_pair(monkeypatch):
    """The default pairs each nonlinear query with the linear one of its recipe, and [] compares every other arm
    with each reference."""
    from study.analysis.verdict import comparisons_of

    root = ROOT
    monkeypatch.chdir(root)
    assert comparisons_of(load_config([], root)) == [("nonlinear_q", "baseline"), ("nonlinear_q_ph", "baseline_qknorm")]
    assert comparisons_of(load_config(["study.pairs=[]"], root)) == [
        ("nonlinear_q", "baseline"), ("nonlinear_q", "baseline_qknorm"),
        ("nonlinear_q_ph", "baseline"), ("nonlinear_q_ph", "baseline_qknorm"),
        ("no_context", "baseline"), ("no_context", "baseline_qknorm")]  # the yardstick too: every arm of study.arms


@pytest.mark.parametrize("over, message", [
    ("study.target_halfwidth=0", r"^study.target_halfwidth=0.0 must be > 0 \(% log-loss\)$"),
    ("study.equivalence_margin=-1", r"^study.equivalence_margin=-1.0 must be > 0 \(% log-loss\)$"),
])
def test_the_verdict_margins_are_checked(monkeypatch, over, message):
    """The decided verdict's half-width and margin must be positive (% log-loss) whenever study.arms is set."""
    root = ROOT
    monkeypatch.chdir(root)
    with pytest.raises(ConfigError, match=message):
        load_config([over], root)


def test_an_unwritable_path_ends_a_stage_in_one_line(nano_project, monkeypatch, capsys):
    from study.config import run_stage

    monkeypatch.chdir(nano_project)

    def body(cfg, root):
        raise FileExistsError(17, "File exists", "runs/test/x/baseline-s3")
    assert run_stage(body, []) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: File exists: runs/test/x/baseline-s3: fix or remove that path, then run the same command "
                   "again"), err


@pytest.mark.parametrize("stage", ["test_runs", "tune"])
def test_ctrl_c_ends_the_tuning_and_test_stages_in_one_line(nano_project, monkeypatch, capsys, stage):
    import study.tune
    import study.test_runs
    from study.config.stage import INTERRUPTED

    monkeypatch.chdir(nano_project)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    import study.config.stage

    module = study.test_runs if stage == "test_runs" else study.tune
    monkeypatch.setattr(study.config.stage, "load_config", stop)  # Ctrl-C inside the stage (its runs end KILLED first)
    assert module.main([] if stage == "test_runs" else ["--write"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == INTERRUPTED.format(stage=f"study.{stage}"), err


def make_profile_stages(target: str) -> dict[str, list[str]]:
    """The overrides `make -n TARGET` hands the test stage, with and without DRY_RUN (they must agree); the report's
    too; raises AssertionError where the profile would tune again or the report read other overrides."""
    import shlex
    import subprocess

    got = {}
    for dry in ("", "1"):
        out = subprocess.run(["make", "-n", "--no-print-directory", target, f"DRY_RUN={dry}"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.replace("\\\n", " ").splitlines()
        stages = [shlex.split(ln) for ln in out if "study.test_runs" in ln or "study.compare" in ln]
        assert [w[2] for w in stages] == (["study.test_runs", "study.compare"] if not dry else ["study.test_runs"])
        got[dry] = stages[0][6 if dry else 5:]
        if not dry:  # every arm has its lr*: nothing is tuned again, and the report reads what the stage trained
            assert not [ln for ln in out if "study.tune" in ln], out
            assert stages[1][5:] == got[dry]
    assert got[""] == got["1"]
    return got[""]


def test_make_full_runs_the_papers_three_framings_at_rotary_positions_with_the_frontier(monkeypatch):
    """`make full` (as make expands it): the decomposition's seven arms, identity_q_mlp4.5 and baseline_mlp4.75 (the
    paper's other two framings) and the baseline family's MLP widths, every arm at an lr* tuned at rotary positions,
    in `make study`'s runs, the frontier pricing nonlinear_q and identity_q_mlp4.5, with a report of its own."""
    from study.runner.arms import tuned_lr

    monkeypatch.chdir(ROOT)
    cfg = load_config(make_profile_stages("full"), ROOT)
    rows = ["baseline_today", "baseline", "baseline_d2z", "baseline_qknorm", "nonlinear_q", "nonlinear_q_ph",
            "nonlinear_q_linear"]
    family = ["baseline_mlp3.5", "baseline", "baseline_mlp4.75", "baseline_mlp5"]
    assert list(cfg.study.arms) == rows + ["identity_q_mlp4.5", "baseline_mlp3.5", "baseline_mlp4.75", "baseline_mlp5"]
    assert list(cfg.decomposition.rows) == rows and list(cfg.decomposition.family) == family
    assert list(cfg.decomposition.worth) == ["nonlinear_q", "identity_q_mlp4.5"]
    assert (cfg.model.position, cfg.study.runs_dir, cfg.study.reports_dir) == ("rope", "runs", "reports/full")
    assert all(tuned_lr(cfg, a, ROOT) > 0 for a in cfg.study.arms if cfg.arms[a].lr is None)
    widths = {a: load_config([f"variant={cfg.arms[a].variant}"], ROOT).variant.mlp_ratio for a in family}
    assert widths == {"baseline_mlp3.5": 3.5, "baseline": None, "baseline_mlp4.75": 4.75, "baseline_mlp5": 5}


def test_make_projections_compares_the_map_on_each_projection_with_the_baseline(monkeypatch):
    """`make projections` (read from the Makefile, as make expands it): the baseline and the nonlinear map on Q, K, V
    and the output projection, each one parameter-matched arm compared with the baseline alone, all five in the
    decomposition table, at learned positions in `make study-learned`'s runs with a report of its own; the test
    stage, the report and the dry run get the same overrides."""
    from study.analysis.verdict import comparisons_of

    monkeypatch.chdir(ROOT)
    cfg = load_config(make_profile_stages("projections"), ROOT)
    arms = ["baseline", "nonlinear_q", "nonlinear_k", "nonlinear_v", "nonlinear_o"]
    from study.runner.arms import tuned_lr
    assert all(tuned_lr(cfg, a, ROOT) > 0 for a in arms)
    assert list(cfg.study.arms) == arms and list(cfg.decomposition.rows) == arms
    assert (cfg.model.position, cfg.study.runs_dir, cfg.study.reports_dir) == ("learned", "runs/learned",
                                                                              "reports/projections")
    assert comparisons_of(cfg) == [(a, "baseline") for a in arms[1:]]
    variant = {a: load_config([f"variant={cfg.arms[a].variant}"], ROOT).variant for a in arms}
    modes = {a: {k: str(variant[a][k]) for k in ("query", "key", "value", "output")} for a in arms}
    assert modes["baseline"] == {"query": "linear", "key": "linear", "value": "linear", "output": "linear"}
    for a, k in zip(arms[1:], ("query", "key", "value", "output")):
        assert {m for m, v in modes[a].items() if v != "linear"} == {k}, (a, modes[a])


def test_make_tasks_adds_seeds_until_decided_only_when_asked(monkeypatch):
    """`make tasks` (as make expands it) runs each task's test stage and report on Stein's first stage alone; with
    TASK_MAX_SEEDS=N both get study.max_seeds=N, the seed rule of `make decide`: the second stage adds test seeds to
    an undecided pair up to N, never a tuning or pilot seed."""
    import shlex
    import subprocess

    from study.analysis.verdict import all_seeds

    monkeypatch.chdir(ROOT)

    def stages(*extra):
        out = subprocess.run(["make", "-n", "--no-print-directory", "tasks", "TASKS=mlm", *extra], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.replace("\\\n", " ")
        lines = [ln.split("||")[0] for ln in out.split(";") if "study.test_runs" in ln or "study.compare" in ln]
        return [shlex.split(ln.replace("$t", "mlm"))[5:] for ln in lines]

    assert stages() == [["task=mlm"], ["task=mlm"]]
    assert stages("TASK_MAX_SEEDS=200") == [["task=mlm", "study.max_seeds=200"]] * 2
    cfg = load_config(["task=mlm", "study.max_seeds=200"], ROOT)
    seeds = all_seeds(cfg)
    assert len(seeds) == 200 and seeds[:5] == [1, 2, 3, 4, 5]
    assert not {101, 102, 201, 202, 203, 204, 205} & set(seeds)  # tuning and pilot seeds never test
