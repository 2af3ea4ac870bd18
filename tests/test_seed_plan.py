"""The test seeds and Stein's plan: each seed counted once, and a target half-width the margin can use."""
from __future__ import annotations

import pytest

from conftest import ROOT
from study.config import ConfigError, load_config


def test_a_duplicate_test_seed_is_refused_in_one_line(monkeypatch, capsys):
    """study.seeds=[1,1,2,3,4] would pair seed 1 twice (n0 = 5 from four seeds, wrong df): refused like duplicate
    arms, in the stage's one error line."""
    from study.analysis.verdict import all_seeds
    from study.config import run_stage

    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=r"^study.seeds=\[1, 1, 2, 3, 4\] lists \[1\] more than once: name each seed "
                                          r"once, e.g. study.seeds=\[1, 2, 3, 4\]$"):
        load_config(["study.seeds=[1,1,2,3,4]"], ROOT)
    # also while the verdict is off (the shared-lr comparison pairs by seed too)
    with pytest.raises(ConfigError, match="lists \\[2\\] more than once"):
        load_config(["study.arms=[]", "study.seeds=[2,2]"], ROOT)
    assert run_stage(lambda cfg, root: 0, ["study.seeds=[1,1,2,3,4]"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: study.seeds=[1, 1, 2, 3, 4] lists [1] more than once")
    assert all_seeds(load_config(["study.seeds=[1,2,3,4,5]"], ROOT))[:5] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("over, ok", [
    (["study.target_halfwidth=1e6"], False),
    (["study.target_halfwidth=1.01", "study.equivalence_margin=1.0"], False),
    (["study.target_halfwidth=1.0", "study.equivalence_margin=1.0"], True),
    (["study.equivalence_margin=0.5"], True),  # conf/study.yaml's documented `dvc exp run -S` example still passes
])
def test_the_target_halfwidth_is_bounded_by_the_margin(monkeypatch, over, ok):
    """Stein's d above the equivalence margin plans an interval that can never lie inside +-margin: refused."""
    monkeypatch.chdir(ROOT)
    if ok:
        load_config(over, ROOT)
        return
    with pytest.raises(ConfigError, match=r"^study.target_halfwidth=\S+ is above study.equivalence_margin=1.0 \(% "
                                          r"log-loss\): an interval that wide never lies inside \+-margin, so no "
                                          r"comparison could be decided equivalent; use at most the margin, e.g. "
                                          r"study.target_halfwidth=0.5 \(half of it, the default's ratio\)$"):
        load_config(over, ROOT)
