"""``study.tune --write``: every tuning.json checked before anything is written; the table, its figure and
conf/tuned.yaml replaced together or not at all; another table_dir never drops the other arms' lr*."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import ROOT
from study.config import StudyError, load_config

RECIPE = {"model": {"name": "nano"}, "train": {"tokens": 20480}}


def tuning_json(runs: Path, arm: str, variant: str, best: float) -> dict:
    """One arm's tuning.json as ``study.tune --arm`` writes it: a bracketed x2 grid (the rule's own choose())."""
    from study.tuning.rule import choose

    lrs = [best / 2, best, best * 2]
    scores = [4.0 + 0.05 * math.log(x / best) ** 2 + (0.01 if x > best else 0.0) for x in lrs]
    res = choose(lrs, scores, 8, "vertex")
    out = {"arm": arm, "variant": variant, "overrides": [], "model": "nano", "seeds": [101, 102], "tokens": 20480,
           "rule": "vertex", "recipe": RECIPE, "centre": best, "max_points": 8,
           "points": [{"lr": x, "losses": {"101": s, "102": s}, "mean": s, "status": "ok"} for x, s in zip(lrs, scores)],
           **{k: res[k] for k in ("status", "best_lr", "lr_star", "source", "why", "fit")}, "best_loss": res["best_loss"]}
    (runs / arm).mkdir(parents=True, exist_ok=True)
    (runs / arm / "tuning.json").write_text(json.dumps(out))
    return out


def config(tmp: Path, arms=("baseline", "nonlinear_q"), table="tuning"):
    return load_config([f"tune.runs_dir={tmp / 'runs_tune'}", f"tune.table_dir={tmp / table}",
                        f"tune.arms=[{','.join(arms)}]"], ROOT)


def outputs(tmp: Path, table="tuning") -> dict[str, bytes]:
    files = [tmp / table / n for n in ("table.json", "table.md", "tuning.png")] + [tmp / "tuned.yaml"]
    return {p.name: p.read_bytes() for p in files if p.is_file()}


def test_a_tuning_json_lacking_a_key_writes_nothing(tmp_path, monkeypatch, capsys):
    from study.config import run_stage
    from study.tuning.tuned_file import check_tuned
    from study.tuning.table import write_table

    monkeypatch.chdir(ROOT)
    tuned = tmp_path / "tuned.yaml"
    tuning_json(tmp_path / "runs_tune", "baseline", "baseline", 4e-3)
    good = tuning_json(tmp_path / "runs_tune", "nonlinear_q", "nonlinear_q", 1.6e-2)
    write_table(config(tmp_path), ROOT, tuned)
    before = outputs(tmp_path)
    assert set(before) == {"table.json", "table.md", "tuning.png", "tuned.yaml"}
    # a new round of tuning: baseline re-tuned, nonlinear_q's file damaged (its status lost)
    tuning_json(tmp_path / "runs_tune", "baseline", "baseline", 8e-3)
    broken = {k: v for k, v in good.items() if k != "status"}
    path = tmp_path / "runs_tune" / "nonlinear_q" / "tuning.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(StudyError, match=rf"^{path}: 'status' is missing or not a str: re-tune the arm \(`python -m "
                                         rf"study.tune --arm nonlinear_q --params params.yaml`, or `make tune`\), or "
                                         rf"restore the file$"):
        write_table(config(tmp_path), ROOT, tuned)
    assert outputs(tmp_path) == before  # table, figure and conf/tuned.yaml as they were: they still agree
    assert sorted(p.name for p in (tmp_path / "tuning").iterdir()) == ["table.json", "table.md", "tuning.png"]
    # the stage's one line
    assert run_stage(lambda cfg, root: write_table(config(tmp_path), root, tuned) and 0, []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: 'status' is missing")
    # a bad value, not only a missing key
    path.write_text(json.dumps({**good, "points": [{"lr": "big"}]}))
    with pytest.raises(StudyError, match=r"'points'\[0\] is missing or not an object"):
        write_table(config(tmp_path), ROOT, tuned)
    assert outputs(tmp_path) == before
    path.write_text(json.dumps(good))
    write_table(config(tmp_path), ROOT, tuned)
    assert outputs(tmp_path) != before
    check_tuned(_with_tuned(tmp_path, tuned), ROOT)  # the table and conf/tuned.yaml agree


@pytest.mark.parametrize("text", ["tuned: [unclosed\n", "- a list, not a mapping\n"])
def test_an_unreadable_tuned_file_is_never_overwritten(tmp_path, monkeypatch, text):
    """A tuned file that is not a YAML mapping reads as empty; rewriting it would drop every lr* it held, so the
    write is refused and the file, the table and the figure stay as they were."""
    from study.tuning.table import check_tuned_file, write_table

    monkeypatch.chdir(ROOT)
    tuned = tmp_path / "tuned.yaml"
    tuning_json(tmp_path / "runs_tune", "baseline", "baseline", 4e-3)
    tuning_json(tmp_path / "runs_tune", "nonlinear_q", "nonlinear_q", 1.6e-2)
    write_table(config(tmp_path), ROOT, tuned)
    tuned.write_text(text)
    before = outputs(tmp_path)
    with pytest.raises(StudyError, match=rf"^{tuned} is not .*nothing written; restore it \(`git checkout "
                                         rf"conf/tuned.yaml`\) and run again$"):
        write_table(config(tmp_path), ROOT, tuned)
    assert outputs(tmp_path) == before and tuned.read_text() == text
    check_tuned_file(tmp_path / "absent.yaml")  # a missing file is written afresh, not refused


def _with_tuned(tmp: Path, tuned: Path):
    """The study's config with the tuned section of ``tuned`` (as conf/tuned.yaml would give it)."""
    import yaml
    from omegaconf import OmegaConf

    cfg = config(tmp)
    OmegaConf.set_readonly(cfg, False)  # a composition is read-only: here the tuned section is replaced by hand
    t = yaml.safe_load(tuned.read_text())["tuned"]
    cfg.tuned.lr = OmegaConf.create(t["lr"])
    cfg.tuned.recipe = OmegaConf.create(t.get("recipe", {}))
    return cfg


def test_a_new_table_dir_never_drops_the_other_arms_lr(tmp_path, monkeypatch):
    from study.tuning.tuned_file import read_tuned
    from study.tuning.table import write_table

    monkeypatch.chdir(ROOT)
    tuned = tmp_path / "tuned.yaml"
    tuning_json(tmp_path / "runs_tune", "baseline", "baseline", 4e-3)
    tuning_json(tmp_path / "runs_tune", "nonlinear_q", "nonlinear_q", 1.6e-2)
    write_table(config(tmp_path), ROOT, tuned)
    before = tuned.read_bytes()
    with pytest.raises(StudyError, match=rf"^{tuned} holds the lr\* of \['nonlinear_q'\], which "
                                         rf"{tmp_path / 'other' / 'table.json'} does not \(they were tuned into another "
                                         rf"tune.table_dir\): writing this table would drop them from tuned.yaml; write "
                                         rf"into the tune.table_dir they came from \(default conf/tuning\), or add them "
                                         rf"to tune.arms$"):
        write_table(config(tmp_path, arms=("baseline",), table="other"), ROOT, tuned)
    assert tuned.read_bytes() == before and not (tmp_path / "other").exists()
    # the same table_dir keeps a row that records its recipe, and its lr*
    write_table(config(tmp_path, arms=("baseline",)), ROOT, tuned)
    assert set(read_tuned(tuned)) == {"baseline", "nonlinear_q"}
