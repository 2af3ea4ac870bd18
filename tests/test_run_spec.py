"""A run's specification: composed once, read-only from then on, its derived settings in a frozen copy, and its lr
the arm's (study.runner.spec, study.config.compose.load_config)."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf.errors import ReadonlyConfigError

from study.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_the_composed_config_is_read_only():
    cfg = load_config(["model=nano"], ROOT)
    for assign in (lambda: setattr(cfg.train, "tokens", 1), lambda: setattr(cfg, "seed", 9),
                   lambda: cfg.arm.__setattr__("lr", 1e-3), lambda: cfg.tuned.lr.__setitem__("x", 1.0)):
        with pytest.raises(ReadonlyConfigError):
            assign()
    assert cfg.train.tokens == load_config(["model=nano"], ROOT).train.tokens  # unchanged


def test_a_plain_run_takes_train_lr_and_an_arm_run_its_arm_lr():
    from study.runner.spec import run_spec

    spec = run_spec(load_config(["model=nano", "train.lr=0.004"], ROOT), ROOT)
    assert (spec.lr, spec.lr_source, spec.arm, spec.variant, spec.seed) == (0.004, "train.lr", "baseline", "baseline", 1)
    assert spec.min_lr == pytest.approx(0.004 * spec.cfg.train.min_lr / 0.004)  # the cosine schedule's own ratio
    arm = run_spec(load_config(["model=nano", "variant=nonlinear_q", "seed=3", "arm.lr=0.0125",
                                "train.schedule=d2z", "study.group=test/nlq"], ROOT), ROOT)
    assert (arm.lr, arm.min_lr, arm.lr_source, arm.arm, arm.variant, arm.seed) == (
        0.0125, 0.0, "arm.lr", "nlq", "nonlinear_q", 3)  # d2z ends at zero
    assert arm.out_dir == ROOT / "runs/test/nlq/nonlinear_q-s3" and arm.name == "test/nlq/nonlinear_q-s3"
    assert arm.record() == {"name": "test/nlq/nonlinear_q-s3", "arm": "nlq", "variant": "nonlinear_q", "seed": 3,
                            "task": "lm", "position": "rope", "schedule": "d2z", "tokens": arm.cfg.train.tokens,
                            "lr": 0.0125, "min_lr": 0.0, "lr_source": "arm.lr"}
    with pytest.raises(ReadonlyConfigError):
        arm.cfg.arm.lr = 1.0
    with pytest.raises(Exception):  # the dataclass itself is frozen
        arm.lr = 1.0


def test_the_lr_is_the_arms_so_it_does_not_change_the_variants_section():
    a = load_config(["model=nano", "variant=nonlinear_q", "arm.lr=0.01"], ROOT)
    b = load_config(["model=nano", "variant=nonlinear_q", "arm.lr=0.02"], ROOT)
    assert a.variant == b.variant and (a.arm.lr, b.arm.lr) == (0.01, 0.02)


@pytest.mark.parametrize("key, words", [("variant.lr=0.01", "arm.lr=LR"), ("variant.min_lr=0.001", "arm.min_lr=LR")])
def test_the_variants_old_lr_keys_are_refused_naming_the_arms(key, words):
    with pytest.raises(ConfigError) as e:
        load_config([key], ROOT)
    msg = str(e.value)
    assert "\n" not in msg and "it was removed" in msg and words in msg


def test_runs_that_differ_only_in_their_arms_lr_pair_and_in_train_lr_do_not():
    from study.analysis.pairing import PairingError, check

    def run(name, **settings):
        base = {"model.n_layer": 2, "train.lr": 3e-3, "arm.lr": None, "variant.name": name.split("-")[0],
                "seed": 1, "numerics.torch": "2.13.0"}
        return {"name": name, "settings": {**base, **settings}}

    ok = {"baseline": {1: run("baseline-s1", **{"arm.lr": 0.01, "spec.lr": "0.01", "spec.arm": "baseline"})},
          "nonlinear_q": {1: run("nonlinear_q-s1", **{"arm.lr": 0.02, "spec.lr": "0.02", "spec.arm": "nonlinear_q"})}}
    assert check(ok, "the runs")["train.lr"] == 3e-3
    bad = {"baseline": {1: run("baseline-s1")}, "nonlinear_q": {1: run("nonlinear_q-s1", **{"train.lr": 0.02})}}
    with pytest.raises(PairingError, match=r"differs in train.lr"):
        check(bad, "the runs")
