"""What a study says about conf/tuned.yaml when an lr* cannot be had: the file deleted, or an arm whose every
tuning point diverged."""
from __future__ import annotations

import json
import shutil

import pytest

from omegaconf import OmegaConf
from conftest import ROOT
from study.config import ConfigError, load_config


def test_a_deleted_tuned_file_says_it_is_missing_and_how_to_restore_it(tmp_path):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "conf" / "tuned.yaml").unlink()
    msg = (r"conf/tuned.yaml is missing (conf/study.yaml's defaults list reads it); it is tracked: `git checkout "
           r"conf/tuned.yaml` restores it (or `make tune` writes it anew)")
    with pytest.raises(ConfigError) as e:
        load_config([], tmp_path)
    assert str(e.value) == msg


def test_an_arm_whose_every_lr_diverged_is_said_to_be_so(tmp_path, monkeypatch):
    from study.runner.arms import tuned_lr

    monkeypatch.chdir(ROOT)
    cfg = load_config([f"tune.table_dir={tmp_path / 'tuning'}", "tune.arms=[baseline,nonlinear_q]"], ROOT)
    OmegaConf.set_readonly(cfg, False)  # a composition is read-only: this one drops an lr* by hand
    cfg.tuned.lr.pop("baseline")
    points = [{"lr": x, "losses": {"101": None, "102": 4.1}, "mean": None, "status": "lost"} for x in (4e-3, 8e-3, 1.6e-2)]
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "table.json").write_text(json.dumps({"arms": {"baseline": {
        "points": points, "lr_star": None, "status": "optimum not bracketed", "why": "every point is lost"}}}))
    with pytest.raises(ConfigError) as e:
        tuned_lr(cfg, "baseline", ROOT)
    assert str(e.value) == (f"arm 'baseline' has no lr*: every lr of its tuning grid (0.004, 0.008, 0.016) diverged on "
                            f"a tuning seed ({tmp_path / 'tuning'}/table.json): tune it lower (e.g. tune.centre=0.001 "
                            f"and `make tune`), or give it a fixed arms.baseline.lr")
    (tmp_path / "tuning" / "table.json").unlink()  # in tune.arms, never tuned: say so, not "add it to tune.arms"
    with pytest.raises(ConfigError, match=r"^arm 'baseline' \(in tune.arms\) has no lr\* in conf/tuned.yaml yet: run "
                                          r"`make tune`"):
        tuned_lr(cfg, "baseline", ROOT)
