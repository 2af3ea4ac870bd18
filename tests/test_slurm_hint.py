"""Lightning's "srun is available on your system but is not used" hint: silent for a run not under SLURM (it
printed on every run of a machine with SLURM installed), shown under a SLURM job."""
from __future__ import annotations

import os
import warnings

import pytest


@pytest.mark.parametrize("under_slurm", [False, True])
def test_the_srun_hint_only_under_slurm(tmp_path, monkeypatch, under_slurm):
    from study.runner.world import build_trainer

    srun = tmp_path / "bin" / "srun"  # SLURM installed: an srun on PATH
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{srun.parent}{os.pathsep}{os.environ['PATH']}")
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    if under_slurm:
        monkeypatch.setenv("SLURM_JOB_ID", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False)
    hints = [w for w in caught if "`srun` command is available" in str(w.message)]
    assert len(hints) == (1 if under_slurm else 0), [str(w.message) for w in caught]


def test_study_skip_slurm_skips_the_slurm_tests_and_installs_nothing(monkeypatch, capsys):
    """The README's way out: STUDY_SKIP_SLURM=1 gives the skip reason before anything is checked, and `make test`'s
    install step (python -m tests.slurm_cluster --install) exits at once saying so."""
    import runpy

    import slurm_cluster

    monkeypatch.setenv("STUDY_SKIP_SLURM", "1")
    assert slurm_cluster.why_not() == "STUDY_SKIP_SLURM is set: the SLURM tests are skipped and nothing is installed for them"
    monkeypatch.setattr("sys.argv", ["slurm_cluster", "--install"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(slurm_cluster.__file__, run_name="__main__")
    assert e.value.code == 0 and "not installed (STUDY_SKIP_SLURM is set" in capsys.readouterr().out
    monkeypatch.setenv("STUDY_SKIP_SLURM", "0")
    assert slurm_cluster.why_not() != "STUDY_SKIP_SLURM is set: the SLURM tests are skipped and nothing is installed for them"
