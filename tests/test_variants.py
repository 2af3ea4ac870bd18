"""Every registered variant trains through study.train; the compare stage's frontier on real files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
VARIANTS = sorted(p.stem for p in (ROOT / "conf/variant").glob("*.yaml"))


def test_registry_has_the_paper_and_the_ablations():
    assert {"baseline", "identity_q", "nonlinear_q", "baseline_mlp4.75", "residual_linear_q", "nonlinear_q_nores",
            "nonlinear_q_r4", "nonlinear_q_r1", "nonlinear_q_relu2", "nonlinear_q_silu", "nonlinear_k",
            "nonlinear_v", "nonlinear_o", "no_context", "identity_q_mlp4.5", "baseline_mlp3.5", "baseline_mlp4.5", "baseline_mlp5"} <= set(VARIANTS)


@pytest.mark.slow  # one nano training per variant
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains(run_in, variant, tmp_path):
    m = run_in(f"variant={variant}", "seed=1", "train.tokens=6144", "train.eval_every=3")
    assert m["status"] == "ok" and m["steps"] == 3 and m["tokens"] == 6144
    assert 3.0 < m["val_loss"] < 7.0
    if "nonlinear" in variant:
        from mlflow import MlflowClient

        run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}").get_run(m["mlflow_run_id"])
        proj = {"nonlinear_k": "k", "nonlinear_v": "v", "nonlinear_o": None}.get(variant, "q")
        assert 0 < run.data.metrics["diag/L1/attn_entropy"]
        # the branch diagnostics are of the maps of x (q, k, v); the output map reads the merged heads instead
        assert (f"diag/L0/f_ratio_{proj}" in run.data.metrics) if proj else not any(
            "f_ratio" in k for k in run.data.metrics)


def test_compare_reports_the_frontier(nano_project, tmp_path, monkeypatch):
    """Three baseline sizes on an exact power law and an arm worth twice its size: compare writes the multiplier."""
    from study.compare import main
    from tests.synthetic_runs import arms_overrides, write_arms

    law = {"baseline_mlp4.75": 1.0e5, "baseline": 1.2e5, "baseline_mlp5": 1.6e5}
    offs = {1: -0.01, 2: 0.0, 3: 0.01, 4: 0.005, 5: -0.005}
    write_arms(tmp_path / "runs", {a: {s: {"loss": 10 * (2.0e5 if a == "nonlinear_q" else n) ** -0.1 + off,
                                           "params": int(n), "fpt": 6 * int(n)} for s, off in offs.items()}
                                   for a, n in {**law, "nonlinear_q": 1.0e5}.items()})
    monkeypatch.chdir(nano_project)
    rc = main([*arms_overrides(tmp_path, (*law, "nonlinear_q")), "decomposition.family=[baseline_mlp4.75,baseline,baseline_mlp5]",
               "decomposition.worth=[nonlinear_q]"])
    assert rc == 0
    f = json.loads((tmp_path / "reports/summary.json").read_text())["verdict"]["frontier"]
    assert [r["arm"] for r in f["family"]] == ["baseline_mlp4.75", "baseline", "baseline_mlp5"]
    assert f["slope"] == pytest.approx(-0.1, abs=0.01)
    assert f["worth"]["nonlinear_q"]["multiplier"] == pytest.approx(2.0, rel=0.05)
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "### The parameter frontier" in md and "| nonlinear_q | 100,000 | " in md


@pytest.mark.slow  # torch.compile and a training
def test_compiled_model_trains_and_its_checkpoint_loads_uncompiled(run_in, tmp_path, nano_project):
    """trainer.compile compiles the inner model; checkpoints hold plain weights either way."""
    import torch

    from study.config import load_config
    from study.modeling.lit_module import GPTModule

    m = run_in("variant=nonlinear_q", "seed=1", "train.tokens=4096", "train.eval_every=2", "trainer.compile=true")
    assert m["status"] == "ok" and m["steps"] == 2
    ckpt = torch.load(tmp_path / "runs/nonlinear_q-s1/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert not any("_orig_mod" in k for k in ckpt["state_dict"])
    module = GPTModule(load_config(["variant=nonlinear_q", "trainer.compile=false"], nano_project))
    module.load_state_dict(ckpt["state_dict"])  # strict: same keys, compiled or not


def test_params_names_the_variant_an_override_breaks(capsys, monkeypatch):
    """An override every variant takes (python -m study.params variant.qk_norm=rms_gain) breaks only the one with
    k_norm: the one-line error names its file."""
    from study.params import main

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    assert main(["variant.qk_norm=rms_gain"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: conf/variant/nonlinear_q_ph.yaml with "
                                                         "variant.qk_norm=rms_gain: variant.k_norm=true"), err
