"""Tuning by one rule (study/tuning/rule.py), checked against values worked out independently, and the tracked
tuned values (conf/tuned.yaml) against the tuning table they came from."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from study.tuning.rule import (BRACKETED, NOT_BRACKETED, choose, grid_status, initial_grid, quadratic, score,
                                   tune_arm)

ROOT = Path(__file__).resolve().parent.parent


def test_initial_grid_is_x2_around_the_centre():
    assert initial_grid(3e-3, 3) == [1.5e-3, 3e-3, 6e-3]
    assert initial_grid(3e-3, 4) == [1.5e-3, 3e-3, 6e-3, 1.2e-2]
    assert initial_grid(1e-3, 5) == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]


def test_a_point_with_a_diverged_seed_is_lost():
    assert score([4.0, 4.2]) == pytest.approx(4.1)
    assert score([4.0, None]) == math.inf and score([4.0, float("nan")]) == math.inf and score([]) == math.inf


def bowl(best: float, diverge_above: float = math.inf):
    """A synthetic loss curve: 4 + 0.05 (ln(lr / best))^2, diverged (inf) above ``diverge_above``."""
    return lambda lr: math.inf if lr > diverge_above else 4.0 + 0.05 * math.log(lr / best) ** 2


def test_the_grid_extends_at_the_edge_holding_the_best_until_bracketed():
    # optimum 2e-2, grid from 3e-3: by hand, the best point walks up one x2 step at a time,
    # 6e-3 -> 1.2e-2 -> 2.4e-2 (ln(1.2)^2 = 0.033 beats ln(0.6)^2 = 0.261), and 4.8e-2 (ln(2.4)^2 = 0.77) brackets it
    calls = []
    f = bowl(2e-2)
    lrs, scores, status = tune_arm(lambda lr: calls.append(lr) or f(lr), 3e-3, 3, 8)
    assert calls == [1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2]
    assert lrs == [1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2] and status == BRACKETED
    # downwards: optimum 3e-4 from the same start
    lrs, _, status = tune_arm(bowl(3e-4), 3e-3, 3, 8)
    # by hand: 1.5e-3 is best of the first three, then 7.5e-4, then 3.75e-4 ((ln 1.25)^2 = 0.050 < (ln 2.5)^2),
    # which 1.875e-4 ((ln 0.625)^2 = 0.22) brackets
    assert lrs == [1.875e-4, 3.75e-4, 7.5e-4, 1.5e-3, 3e-3, 6e-3] and status == BRACKETED
    # at the cap: reported not bracketed, never extended further
    calls.clear()
    lrs, _, status = tune_arm(lambda lr: calls.append(lr) or f(lr), 3e-3, 3, 4)
    assert lrs == [1.5e-3, 3e-3, 6e-3, 1.2e-2] and status == NOT_BRACKETED and len(calls) == 4
    assert choose(lrs, [f(x) for x in lrs], 4)["status"] == NOT_BRACKETED


def test_lost_points_are_worse_neighbours_and_every_point_lost_extends_downwards():
    f = bowl(2e-2, diverge_above=3e-2)
    lrs, scores, status = tune_arm(f, 3e-3, 3, 8)
    assert lrs[-1] == 4.8e-2 and scores[-1] == math.inf and status == BRACKETED
    r = choose(lrs, scores, 8)
    assert r["lr_star"] == 2.4e-2 and r["source"] == "best point" and "lost" in r["why"]
    # every point lost: the grid grows below its lowest lr until a point survives
    g = bowl(1e-4, diverge_above=5e-4)
    lrs, scores, status = tune_arm(g, 3e-3, 3, 12)
    assert lrs[0] < 5e-4 and status == BRACKETED
    assert grid_status([1e-3, 2e-3, 4e-3], [math.inf] * 3, 3) == (NOT_BRACKETED, None)


def test_vertex_of_the_follow_ups_gpt3_small_sweep():
    """PAPER.md: D2Z sweep 6e-4 ... 9.6e-3 in x2 steps, losses 2.9311, 2.9053, 2.8994, 2.8948, 2.9103; the quadratic in
    ln lr through the three points around the minimum gives lr* = 3.98e-3 and A = 0.0209.  By hand, with central
    differences on the ln 2 spacing h: A = (y+ + y- - 2 y0) / (2 h^2), slope g = (y+ - y-) / (2 h), vertex at
    ln(4.8e-3) - g / (2 A)."""
    lrs = [6e-4, 1.2e-3, 2.4e-3, 4.8e-3, 9.6e-3]
    ys = [2.9311, 2.9053, 2.8994, 2.8948, 2.9103]
    h = math.log(2)
    a = (2.9103 + 2.8994 - 2 * 2.8948) / (2 * h * h)
    g = (2.9103 - 2.8994) / (2 * h)
    vertex = 4.8e-3 * math.exp(-g / (2 * a))
    r = choose(lrs, ys, 8)
    assert r["status"] == BRACKETED and r["best_lr"] == 4.8e-3 and r["source"] == "vertex"
    assert r["fit"]["A"] == pytest.approx(a, rel=1e-9) and r["fit"]["A"] == pytest.approx(0.0209, abs=1e-4)
    assert r["lr_star"] == pytest.approx(vertex, rel=1e-9) and r["lr_star"] == pytest.approx(3.98e-3, abs=0.005e-3)
    assert r["fit"]["miss_cost_x2"] == pytest.approx(a * h * h) and r["fit"]["miss_cost_x2"] == pytest.approx(0.01, abs=1e-3)
    assert choose(lrs, ys, 8, rule="best")["lr_star"] == 4.8e-3


def test_vertex_of_a_known_parabola_and_when_it_is_not_taken():
    # y = 0.03 (ln lr - ln 5e-3)^2 + 3: vertex 5e-3 exactly, A = 0.03, wherever the three points are
    f = lambda lr: 0.03 * (math.log(lr) - math.log(5e-3)) ** 2 + 3.0  # noqa: E731
    q = quadratic([2e-3, 4e-3, 8e-3], [f(x) for x in (2e-3, 4e-3, 8e-3)])
    assert q["vertex"] == pytest.approx(5e-3, rel=1e-9) and q["A"] == pytest.approx(0.03, rel=1e-9)
    assert q["vertex_loss"] == pytest.approx(3.0, abs=1e-12)
    # a concave triple has no vertex (A < 0): the best point stands
    assert quadratic([1e-3, 2e-3, 4e-3], [4.0, 3.9, 4.5])["vertex"] is not None
    assert quadratic([1e-3, 2e-3, 4e-3], [4.0, 4.1, 3.9])["vertex"] is None
    with pytest.raises(ValueError):
        quadratic([1e-3, 2e-3, 4e-3], [4.0, math.inf, 3.9])


def test_tuned_file_agrees_with_its_table():
    """conf/tuned.yaml (read by the study's composition) holds exactly the lr* of conf/tuning/table.json."""
    tuned = yaml.safe_load((ROOT / "conf/tuned.yaml").read_text())["tuned"]["lr"]
    table = json.loads((ROOT / "conf/tuning/table.json").read_text())
    assert {k: a["lr_star"] for k, a in table["arms"].items() if a["lr_star"] is not None} == (tuned or {})
    md = (ROOT / "conf/tuning/table.md").read_text()
    for arm in table["arms"]:
        assert f"| {arm} |" in md


def test_a_tuned_file_that_disagrees_is_refused(tmp_path):
    from study.config import ConfigError, load_config
    from study.tuning.tuned_file import check_tuned

    cfg = load_config([f"tune.table_dir={tmp_path}"], ROOT)
    table = {a: {"lr_star": lr} for a, lr in cfg.tuned.lr.items()}  # the committed values, but one
    table["baseline"] = {"lr_star": 1.1 * cfg.tuned.lr.get("baseline", 0.004)}
    (tmp_path / "table.json").write_text(json.dumps({"arms": table}))
    with pytest.raises(ConfigError, match=r"conf/tuned.yaml .*disagrees.*\['baseline'\].*make tune"):
        check_tuned(cfg, ROOT)


def test_an_lr_tuned_at_another_recipe_is_refused():
    """Every committed lr* was tuned at the study's model, budget and schedule (conf/study.yaml, read here on its
    own); the test stage refuses one tuned at another warmup, in one line, and a fixed-lr arm is never checked."""
    from study.config import ConfigError, load_config
    from study.config.transfer import recipe_difference
    from study.runner.arms import recipe, tuned_lr

    train = yaml.safe_load((ROOT / "conf/study.yaml").read_text())["train"]
    cfg = load_config([], ROOT)
    at = recipe(cfg)
    assert at["train"]["warmup_tokens"] == train["warmup_tokens"] and at["train"]["tokens"] == train["tokens"]
    assert at["train"]["batch_tokens"] == train["batch_tokens"] and at["model"]["name"] == "cpu"
    committed = yaml.safe_load((ROOT / "conf/tuned.yaml").read_text())["tuned"]
    assert committed["lr"] and set(committed["recipe"]) == set(committed["lr"])
    assert at["model"]["position"] == "rope"
    rotary = [arm for arm in committed["lr"] if committed["recipe"][arm]["model"].get("position") == "rope"]
    assert set(cfg.study.arms) <= set(rotary)
    for arm in rotary:
        assert recipe_difference(committed["recipe"][arm], at) == [], arm
        assert tuned_lr(cfg, arm) == committed["lr"][arm]
    # the rest were tuned at learned positions (the projections' arms): refused at the rotary default
    learned = sorted(set(committed["lr"]) - set(rotary))
    assert learned and all(committed["recipe"][arm]["model"]["position"] == "learned" for arm in learned)
    with pytest.raises(ConfigError, match=r"was tuned at model.position=learned, but this study runs "
                                          r"model.position=rope: re-tune it"):
        tuned_lr(cfg, learned[0])
    assert tuned_lr(load_config(["model.position=learned"], ROOT), learned[0]) == committed["lr"][learned[0]]
    with pytest.raises(ConfigError) as e:  # a default arm at learned positions: told where those lr* are kept
        tuned_lr(load_config(["model.position=learned"], ROOT), rotary[0])
    assert str(e.value).endswith("or set those back; the lr* tuned at learned positions are in "
                                 "conf/tuning/lm-learned/ (`make study-learned` pins them)")
    other = load_config([f"train.warmup_tokens={2 * train['warmup_tokens']}"], ROOT)
    arm = rotary[0]
    with pytest.raises(ConfigError) as e:
        tuned_lr(other, arm)
    assert str(e.value) == (f"arm {arm!r}'s lr* (conf/tuned.yaml) was tuned at train.warmup_tokens={train['warmup_tokens']}, "
                            f"but this study runs train.warmup_tokens={2 * train['warmup_tokens']}: re-tune it (`make tune` "
                            f"with {arm} in tune.arms) or set those back")
    assert tuned_lr(other, "baseline_today") == 3e-3
    # mlm's lr* were tuned at its default, rotary positions: a learned-position run is told how to tune its task
    mlm = yaml.safe_load((ROOT / "conf/tuned.yaml").read_text())["tuned"]["task"]["mlm"]
    assert {r["model"]["position"] for r in mlm["recipe"].values()} == {"rope"}
    assert tuned_lr(load_config(["task=mlm"], ROOT), "baseline") == mlm["lr"]["baseline"]
    with pytest.raises(ConfigError) as e:
        tuned_lr(load_config(["task=mlm", "model.position=learned"], ROOT), "baseline")
    assert "\n" not in str(e.value) and str(e.value).endswith(
        "model.position=learned: re-tune it (`python -m study.tune --arm baseline task=mlm`, then `python -m "
        "study.tune --write task=mlm`, with the run's own overrides; `make tasks TASKS=mlm` tunes every arm) or set "
        "those back")


def test_tune_seeds_overlapping_test_seeds_is_a_one_line_error():
    from study.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(["tune.seeds=[4,101]", "study.seeds=[1,2,3,4]"], ROOT)
    msg = str(e.value)
    assert "\n" not in msg and "tune.seeds=[4, 101]" in msg and "share [4]" in msg and "tune.seeds=[101,102]" in msg
    with pytest.raises(ConfigError, match="at least 2 distinct"):
        load_config(["tune.seeds=[101]"], ROOT)


def test_the_previous_default_runs_at_the_lr_star_of_its_table():
    """`make study-bpe2048` (the BPE-2048 default until 2026-12-03) pins each of its arms' lr* on the command line:
    each equals the lr* of its tuning table, conf/tuning/cpu-bpe2048/table.json, to the last digit."""
    import re

    make = (ROOT / "Makefile").read_text()
    pinned = {a: float(v) for a, v in re.findall(r"-S arms\.(\w+)\.lr=([0-9.e-]+)", make)}
    table = json.loads((ROOT / "conf/tuning/cpu-bpe2048/table.json").read_text())["arms"]
    assert set(pinned) == {"baseline", "baseline_qknorm", "nonlinear_q", "nonlinear_q_ph"}
    assert pinned == {a: table[a]["lr_star"] for a in pinned}


def test_the_previous_default_composes():
    """`make study-bpe2048`'s -S overrides compose (Hydra's grammar) into the BPE-2048 model, its four arms at fixed
    lr, QK-norm at scale 1 (no scale_factor override), nothing tuned."""
    import re
    import shlex

    from study.config import load_config
    from study.runner.arms import tuned_lr

    make = (ROOT / "Makefile").read_text()
    lr = " ".join(re.search(r"^BPE2048_LR := (.*?)\n(?!\s)", make, re.S | re.M).group(1).split("\\\n"))
    recipe = re.search(r"^study-bpe2048:.*?\n((?:\t.*\n)+)", make, re.M).group(1).replace("\\\n", " ")
    words = shlex.split(recipe.replace("$(BPE2048_LR)", lr))
    cfg = load_config([words[i + 1] for i, w in enumerate(words) if w == "-S"], ROOT)
    assert (cfg.model.name, cfg.data.tokenizer, cfg.data.vocab_size, list(cfg.tune.arms)) == ("cpu-bpe2048", "bpe", 2048, [])
    assert list(cfg.study.arms) == ["baseline", "baseline_qknorm", "nonlinear_q", "nonlinear_q_ph"]
    assert list(cfg.arms.baseline_qknorm.overrides) == list(cfg.arms.nonlinear_q_ph.overrides) == ["train.schedule=d2z"]
    assert tuned_lr(cfg, "nonlinear_q_ph") == 0.011760976163614139  # a fixed lr: the table is not read


def test_the_learned_position_profile_runs_at_the_lr_star_of_its_table_in_folders_of_its_own():
    """`make study-learned` (the default until 2026-12-06) pins each arm's lr* at learned positions on the command
    line: each equals the lr* of its tuning table (conf/tuning/lm-learned/table.json, whose recipes record no
    model.position: learned) to the last digit, and the overrides compose into learned-position runs in their own
    runs, reports and MLflow experiment (the default's stay untouched)."""
    import re
    import shlex
    import subprocess

    from study.config import load_config
    from study.runner.arms import tuned_lr

    make = (ROOT / "Makefile").read_text()
    lr = " ".join(re.search(r"^LEARNED_LR := (.*?)\n(?!\s)", make, re.S | re.M).group(1).split("\\\n"))
    pinned = {a: float(v) for a, v in re.findall(r"arms\.(\w+)\.lr=([0-9.e-]+)", lr)}
    table = json.loads((ROOT / "conf/tuning/lm-learned/table.json").read_text())["arms"]
    assert set(pinned) == {"baseline", "baseline_qknorm", "nonlinear_q", "nonlinear_q_ph", "no_context"}
    assert pinned == {a: table[a]["lr_star"] for a in pinned}
    assert all(table[a]["recipe"]["model"].get("position", "learned") == "learned" for a in pinned)
    out = subprocess.run(["make", "-n", "--no-print-directory", "study-learned", "DRY_RUN=1"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    words = shlex.split(next(ln for ln in out.splitlines() if "study.test_runs" in ln))
    cfg = load_config(words[words.index("--dry-run") + 1:], ROOT)
    assert (cfg.model.position, cfg.study.name, cfg.study.runs_dir, cfg.study.reports_dir) == (
        "learned", "nonlinear-queries-learned", "runs/learned", "reports/learned")
    assert tuned_lr(cfg, "nonlinear_q") == pinned["nonlinear_q"]  # a fixed lr: conf/tuned.yaml is not read


def test_the_default_tests_at_rotary_positions_at_the_lr_star_of_its_table():
    """The default composes rotary positions (conf/task/lm.yaml), and each default arm's lr* comes from
    conf/tuned.yaml tuned at model.position=rope; an arm whose lr* was tuned at learned positions is refused."""
    from study.config import ConfigError, load_config
    from study.runner.arms import tuned_lr

    cfg = load_config([], ROOT)
    table = json.loads((ROOT / "conf/tuning/table.json").read_text())["arms"]
    assert cfg.model.position == "rope"
    for arm in cfg.study.arms:
        assert table[arm]["recipe"]["model"]["position"] == "rope"
        assert tuned_lr(cfg, arm) == table[arm]["lr_star"]
    with pytest.raises(ConfigError, match="model.position=learned.*model.position=rope"):
        tuned_lr(cfg, "nonlinear_k")
