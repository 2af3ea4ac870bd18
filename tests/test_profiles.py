"""The scale-ladder profile: run resolution, its report on synthetic runs, and a real DVC run."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import NANO_STUDY
from tests.synthetic_runs import write_run
from study.runfolder import read_result  # metrics.json and record.json of a run folder


def _write_run(d: Path, variant: str, seed: int, loss: float, **kw):
    return write_run(d, variant, seed, loss, **kw)


def test_scale_ladder_report(nano_project, tmp_path, monkeypatch):
    """An exact power law in compute: nonlinear_q reaches the loss of 1.5x the baseline's compute at every size."""
    from study.compare import main

    runs, seeds = tmp_path / "runs", [1, 2, 3]
    sizes = {"ladder-64": (197_000, 200_000), "ladder-96": (442_000, 440_000), "ladder-128": (786_000, 780_000)}
    law = lambda c: 20.0 * c ** -0.05  # noqa: E731
    for model, (params, tokens) in sizes.items():
        fpt = 6 * params
        for s, off in zip(seeds, (-0.01, 0.0, 0.01)):
            shape = {"name": model, "n_layer": 4, "n_head": 4, "n_embd": int(model.split("-")[1])}
            _write_run(runs / f"scale_ladder/{model}/baseline-s{s}", "baseline", s, law(fpt * tokens) + off,
                       tokens=tokens, params=params, fpt=fpt, model=shape)
            _write_run(runs / f"scale_ladder/{model}/nonlinear_q-s{s}", "nonlinear_q", s,
                       law(1.5 * fpt * tokens) + off, tokens=tokens, params=params, fpt=fpt, model=shape)
    monkeypatch.chdir(nano_project)
    assert main([f"study.runs_dir={runs}", f"study.reports_dir={tmp_path / 'reports'}", "study.seeds=[1,2,3]",
                 f"study.tracking_db={tmp_path / 'm.db'}", f"study.artifact_dir={tmp_path / 'art'}",
                 f"scale_ladder.models={list(sizes)}", "scale_ladder.lr_from_tuned=false"]) == 0
    la = json.loads((tmp_path / "reports/summary.json").read_text())["scale_ladder"]
    assert la["fits"]["baseline"]["slope"] == pytest.approx(-0.05, abs=2e-3)
    for size in la["sizes"]:
        m = size["compute_multiplier"]["nonlinear_q"]
        assert m["multiplier"] == pytest.approx(1.5, rel=0.03)
        assert m["ci95"][0] <= m["multiplier"] <= m["ci95"][1]
        params, tokens = sizes[size["model"]]
        b = [law(6 * params * tokens) + o for o in (-0.01, 0.0, 0.01)]
        v = [law(1.5 * 6 * params * tokens) + o for o in (-0.01, 0.0, 0.01)]
        assert size["vs_baseline"]["nonlinear_q"]["pct_log_loss"] == pytest.approx(
            100 * (np.mean(v) - np.mean(b)) / np.mean(b), rel=1e-9)
        assert size["variants"]["baseline"]["train_flops"] == 6 * params * tokens
        # an exact power law: the fit passes through the baseline's mean at every size
        assert size["baseline_fit"]["fitted"] == pytest.approx(np.mean(b), rel=1e-3)
        assert abs(size["baseline_fit"]["residual"]) < 5e-3
    t = la["trend"]["nonlinear_q"]
    assert t["n_points"] == 9 and t["ci95"][0] <= t["slope_pct_per_decade"] <= t["ci95"][1]
    # the line at the paper's size: its value is the fit's, and its interval widens with the distance
    at = t["at"]
    assert at["x"] == pytest.approx(np.log10(84_953_856)) and at["decades_beyond"] == pytest.approx(
        np.log10(84_953_856 / 786_000))
    xs, ys = [], []  # the per-seed effects, by hand
    for model, (params, tokens) in sizes.items():
        for o in (-0.01, 0.0, 0.01):
            b, v = law(6 * params * tokens) + o, law(1.5 * 6 * params * tokens) + o
            xs.append(np.log10(params))
            ys.append(100 * (v - b) / b)
    slope, intercept = np.polyfit(xs, ys, 1)
    assert t["slope_pct_per_decade"] == pytest.approx(slope)
    assert at["effect_pct"] == pytest.approx(intercept + slope * np.log10(84_953_856))
    assert at["ci95"][0] < at["effect_pct"] < at["ci95"][1]
    md = (tmp_path / "reports/comparison.md").read_text()
    assert (f"The line at the paper's size (84.95M non-embedding parameters, GPT-3 small, "
            f"{at['decades_beyond']:.1f} decades beyond the largest size): nonlinear_q {at['effect_pct']:+.2f}% "
            f"[{at['ci95'][0]:+.2f}, {at['ci95'][1]:+.2f}] (the paper: -2.40%)") in md
    assert "## Scale ladder: the effect against model size" in md and "| ladder-128 | 4 x 128 |" in md
    fit = la["sizes"][0]["baseline_fit"]
    assert (f"ladder-64 {fit['fitted']:.4f} / {fit['fitted'] + fit['residual']:.4f} (residual "
            f"{fit['residual']:+.4f})") in md
    assert (tmp_path / "reports/figures/scale_ladder.png").read_bytes()[:4] == b"\x89PNG"


def test_resolve_tokens_per_param_and_tuned_lr(nano_project, tmp_path, monkeypatch):
    """tokens_per_param counts the baseline's non-embedding parameters; lr_from_tuned takes the arm's lr*."""
    from study.config import load_config, peak_lr
    from study.modeling.model import GPT
    from study.runner.spec import run_spec

    composed = load_config(["variant=nonlinear_q", "model=ladder-96", "train.tokens_per_param=1.0"], nano_project)
    spec = run_spec(composed, nano_project)
    cfg = spec.cfg
    assert composed.train.tokens != cfg.train.tokens == spec.tokens  # derived into a frozen copy, the composition kept
    with pytest.raises(Exception, match="read-only"):
        cfg.train.tokens = 1
    base = GPT(load_config(["variant=baseline", "model=ladder-96"], nano_project).model,
               load_config(["variant=baseline"], nano_project).variant, 512)
    n = sum(p.numel() for name, p in base.named_parameters() if name not in ("transformer.wte.weight",
                                                                             "transformer.wpe.weight"))
    assert cfg.train.tokens == (n // 2048) * 2048 and cfg.train.tokens > 0

    # lr_from_tuned: the variant's arm's lr* of conf/tuned.yaml, at any size (the scale ladder's transfer rule)
    import yaml

    from study.config import composed_params

    data = yaml.safe_load(composed_params(nano_project))
    data["tuned"] = {"lr": {"nonlinear_q": 0.0071, "nonlinear_q_ph": 0.005}}
    data["arms"] = {"nonlinear_q": {"variant": "nonlinear_q", "overrides": [], "lr": None, "description": ""},
                    "nonlinear_q_ph": {"variant": "nonlinear_q_ph", "overrides": ["train.schedule=d2z"], "lr": None,
                                       "description": ""}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("DVC_EXP_NAME", "test")  # params.yaml with a tuned section, as `dvc exp run` composes it
    spec = run_spec(load_config(["variant=nonlinear_q", "model=ladder-96", "train.lr_from_tuned=true"], nano_project,
                                params=str(params)), nano_project)
    cfg = spec.cfg
    lr, min_lr = peak_lr(cfg)
    assert cfg.arm.lr == 0.0071 and lr == 0.0071 and min_lr == pytest.approx(0.0071 * 3e-4 / 3e-3)
    assert (spec.lr, spec.min_lr, spec.lr_source) == (lr, min_lr, "tuned.lr.nonlinear_q")
    # an lr* tuned with a recipe override (d2z) the plain variant's run would not apply is refused, in one line
    from study.config import ConfigError
    with pytest.raises(ConfigError, match=r"tuned as arms.nonlinear_q_ph = variant 'nonlinear_q_ph' with overrides "
                                          r"\['train.schedule=d2z'\]"):
        load_config(["variant=nonlinear_q_ph", "train.lr_from_tuned=true"], nano_project, params=str(params))
    # an lr* tuned at learned positions: a rotary run may not take it
    data["tuned"]["recipe"] = {"nonlinear_q": {"model": {"name": "nano", "position": "learned"}}}
    params.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"tuned at model.position=learned, but this run trains at model.position=rope"):
        load_config(["variant=nonlinear_q", "train.lr_from_tuned=true", "model.position=rope"], nano_project,
                    params=str(params))
    assert run_spec(load_config(["variant=nonlinear_q", "train.lr_from_tuned=true"], nano_project, params=str(params)),
                    nano_project).lr == 0.0071  # learned, as tuned
    del data["tuned"]["recipe"]

    # lr_per_size: the lr* tuned at this size (tuned.size, `make ladder-tune`), not the default size's
    data["tuned"]["size"] = {"ladder-96": {"nonlinear_q": 0.0123, "baseline": 0.011}, "ladder-64": {"baseline": 0.02}}
    data["arms"]["baseline"] = {"variant": "baseline", "overrides": [], "lr": None, "description": ""}
    data["tuned"]["lr"]["baseline"] = 0.004
    params.write_text(yaml.safe_dump(data))
    cfg = run_spec(load_config(["variant=nonlinear_q", "model=ladder-96", "train.lr_from_tuned=true",
                                "train.lr_per_size=true"], nano_project, params=str(params)), nano_project).cfg
    assert cfg.arm.lr == 0.0123 and peak_lr(cfg)[0] == 0.0123
    with pytest.raises(ConfigError) as e:
        load_config(["variant=nonlinear_q", "model=ladder-64", "train.lr_from_tuned=true", "train.lr_per_size=true"],
                    nano_project, params=str(params))
    assert "\n" not in str(e.value) and "'nonlinear_q' has no lr* tuned at size ladder-64" in str(e.value)
    assert "(tuned.size.ladder-64 in conf/tuned.yaml has ['baseline'])" in str(e.value) and "make ladder-tune" in str(e.value)
    with pytest.raises(ConfigError, match=r"the lr\* of tuned.size were tuned on the lm task, not on task=mlm"):
        load_config(["variant=nonlinear_q", "model=ladder-96", "train.lr_from_tuned=true", "train.lr_per_size=true",
                     "task=mlm"], nano_project, params=str(params))
    # the ladder checks every size x variant before a run trains; lr_per_size=false transfers the default size's
    ladder = ["scale_ladder.models=[ladder-64,ladder-96]", "scale_ladder.variants=[baseline,nonlinear_q]"]
    with pytest.raises(ConfigError, match=r"scale_ladder.variants: 'nonlinear_q' has no lr\* tuned at size ladder-64.*"
                                          r"scale_ladder.lr_per_size=false"):
        load_config(ladder, nano_project, params=str(params))
    assert load_config([*ladder, "scale_ladder.lr_per_size=false"], nano_project, params=str(params)).scale_ladder.models


@pytest.mark.parametrize("override, words", [
    (["scale_ladder.models=[ladder-64]"], ["at least 2 distinct"]),
    (["scale_ladder.models=[ladder-64,ladder-999]", "scale_ladder.lr_from_tuned=false"], ["unknown", "ladder-999"]),
    (["scale_ladder.models=[ladder-64,ladder-96]", "scale_ladder.variants=[nonlinear_q]"], ["must include"]),
    (["scale_ladder.models=[ladder-64,ladder-96]"],
     ["scale_ladder.variants: 'baseline' has no lr* tuned at size ladder-64", "scale_ladder.lr_from_tuned=false"]),
    (["variant=nonlinear_q_ph", "train.lr_from_tuned=true"], ["variant 'nonlinear_q_ph' has no arm of its name",
                                                              "make tune"]),
])
def test_profile_config_errors(nano_project, override, words):
    from study.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(override, nano_project)
    assert all(w in str(e.value) for w in words), str(e.value)


PROFILES_STUDY = NANO_STUDY.replace(
    "scale_ladder:\n  models: []", "scale_ladder:\n  models: [nano, nano-64]") + (
    "tuned:\n  lr: {{baseline: 0.004, nonlinear_q: 0.006}}\n"
    "  size: {{nano: {{baseline: 0.004, nonlinear_q: 0.006}}, nano-64: {{baseline: 0.002, nonlinear_q: 0.003}}}}\n"
)
#: the ladder's arms: each variant's lr* from the tuned section
PROFILES_ARMS = "arms:\n  baseline: {variant: baseline}\n  nonlinear_q: {variant: nonlinear_q}\n"


@pytest.mark.slow
def test_the_scale_ladder_through_dvc(tmp_path):
    """`dvc repro` with the scale ladder on: every size's runs at the lr* tuned at its size, one report."""
    import subprocess

    from tests.conftest import copy_project, env_for, write_params

    project = copy_project(tmp_path / "proj", seeds=(1, 2), tokens=10240)
    for d in (64,):
        (project / f"conf/model/nano-{d}.yaml").write_text(
            f"n_layer: 2\nn_head: 2\nn_embd: {d}\nblock_size: 64\nmlp_ratio: 4.0\n")
    (project / "conf/study.yaml").write_text(PROFILES_STUDY.format(
        name="profiles", seeds=[1, 2], tokens=10240, verdict="", arms_section=PROFILES_ARMS))
    write_params(project)
    env = env_for(project)
    res = subprocess.run(["dvc", "repro"], cwd=project, env=env, capture_output=True, text=True, timeout=3000)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((project / "reports/summary.json").read_text())
    la = summary["scale_ladder"]
    assert "lr_sweep" not in summary and not (project / "runs/lr_sweep").exists()
    assert [s["model"] for s in la["sizes"]] == ["nano", "nano-64"]
    toks = [s["tokens"] for s in la["sizes"]]
    assert toks[0] < toks[1]  # compute-matched budgets grow with the model
    for s in la["sizes"]:
        assert s["variants"]["nonlinear_q"]["tokens"] == s["variants"]["baseline"]["tokens"] == s["tokens"]
        assert s["tokens"] == (int(0.5 * s["non_embedding_params"]) // 2048) * 2048
        size_lr = {"nano": (0.004, 0.006), "nano-64": (0.002, 0.003)}[s["model"]]
        for v, lr in zip(("baseline", "nonlinear_q"), size_lr):  # each variant at the lr* tuned at its size
            assert {read_result(project / f"runs/scale_ladder/{s['model']}/{v}-s{k}")["lr"] for k in (1, 2)} == {lr}
    md = (project / "reports/comparison.md").read_text()
    assert "Scale ladder" in md and "Learning-rate sweep" not in md
    assert "| nonlinear_q (lr 0.006) |" in md and "| nonlinear_q (lr 0.003) |" in md  # the lr each variant trained at
    assert "the lr* tuned at its size" in md
    # nothing to do on a second repro
    again = subprocess.run(["dvc", "status"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert "up to date" in again.stdout, again.stdout


@pytest.mark.slow  # a stage end to end on faked trainings (8 compositions, twice)
def test_the_ladder_stage_trains_every_size_through_the_launcher_and_reuses_them(nano_project, tmp_path, monkeypatch,
                                                                                  capsys):
    """study.ladder_runs: each variant x seed at each size, at the size's compute-matched tokens, in
    runs/scale_ladder/MODEL/; a second start trains nothing (every run reused), and an empty ladder writes its plan."""
    import study.runner.arms
    from study.config import run_dir
    from study.ladder_runs import main
    from study.runfolder import recorded_config
    from study.runner.resume_key import run_digest
    from study.runner.spec import run_spec

    trained = []

    def train(cfg, root):  # what study.train writes, from the run's frozen specification
        spec = run_spec(cfg, root)
        c = spec.cfg
        d = run_dir(root, c, c.variant.name, c.seed)
        trained.append((c.study.group, c.variant.name, c.seed, c.train.tokens))
        _write_run(d, c.variant.name, c.seed, 3.0, tokens=c.train.tokens, lr=spec.lr)
        rec = json.loads((d / "record.json").read_text())
        (d / "record.json").write_text(json.dumps({**rec, "config_hash": run_digest(c, spec.data_dir)}))
        (d / "config.json").write_text(json.dumps(recorded_config(c, "0123456789abcdef")))
    monkeypatch.setattr(study.runner.arms, "TRAIN", train)
    monkeypatch.chdir(nano_project)
    runs = tmp_path / "runs"
    args = [f"study.runs_dir={runs}", "study.seeds=[1,2]", "study.jobs=1", "scale_ladder.models=[ladder-64,ladder-96]",
            "scale_ladder.lr_from_tuned=false"]
    assert main(args) == 0
    assert [t[:3] for t in trained] == [(f"scale_ladder/{m}", v, s) for m in ("ladder-64", "ladder-96")
                                        for v in ("baseline", "nonlinear_q") for s in (1, 2)]
    tokens = {g: {t[3] for t in trained if t[0] == g} for g, *_ in trained}
    assert all(len(t) == 1 for t in tokens.values())  # every variant of a size on the same tokens
    assert min(tokens["scale_ladder/ladder-64"]) < min(tokens["scale_ladder/ladder-96"])  # compute-matched: grows
    assert read_result(runs / "scale_ladder/ladder-96/nonlinear_q-s2")["tokens"] == min(tokens["scale_ladder/ladder-96"])
    plan = json.loads((runs / "scale_ladder/plan.json").read_text())
    assert plan == {"models": ["ladder-64", "ladder-96"], "variants": ["baseline", "nonlinear_q"], "seeds": [1, 2]}
    assert main(args) == 0 and len(trained) == 8  # a second start: every run reused
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    assert "scale_ladder: would train 0 run(s) on this machine, 1 at once (8 finished, reused)" in capsys.readouterr().out
    assert main([f"study.runs_dir={tmp_path / 'off'}"]) == 0 and len(trained) == 8  # the ladder off: no run
    assert json.loads((tmp_path / "off/scale_ladder/plan.json").read_text())["models"] == []


@pytest.mark.slow  # a stage on faked trainings: a few compositions
def test_the_ladder_stage_refuses_before_any_run_trains(nano_project, tmp_path, monkeypatch, capsys):
    """What the ladder sets for each run is refused as a stage override, a size listed twice is refused, -m is refused,
    and a size the budget rule refuses (its warmup longer than its compute-matched tokens) stops the stage before
    the sizes before it train: one line each, exit 2, nothing trained."""
    import study.runner.arms
    from study.ladder_runs import main

    trained = []
    monkeypatch.setattr(study.runner.arms, "TRAIN", lambda cfg, root: trained.append(cfg.model.name))
    monkeypatch.chdir(nano_project)
    args = [f"study.runs_dir={tmp_path / 'runs'}", "study.seeds=[1,2]", "study.arms=[]",
            "scale_ladder.models=[ladder-64,ladder-96]", "scale_ladder.lr_from_tuned=false"]
    cases = [([*args, "model=nano"], "model=nano: the scale ladder sets model for each of its runs, so this override "
                                     "would be ignored: set scale_ladder.models instead"),
             ([*args, "train.warmup_tokens=0"], "set scale_ladder.warmup_tokens instead"),
             ([*args, "scale_ladder.models=[ladder-64,ladder-96,ladder-96]"], "names ['ladder-96'] more than once"),
             (["-m", *args], "does not sweep (-m)"),
             ([*args, "scale_ladder.warmup_tokens=2000000"], "train.warmup_tokens=2000000 is more than the run's ")]
    for argv, words in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], (argv, err)
    assert trained == [] and not (tmp_path / "runs/scale_ladder").exists()
