"""Numerics: CPU kernels pinned to AVX2 in every process that imports study, so a run's losses are the same floats on
any x86-64 CPU; each run records what it ran on, and runs under different numerics never pair or resume."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

PROBE = ("import json, os, torch; print(json.dumps({'cap': torch.backends.cpu.get_cpu_capability(), "
         "'env': {k: os.environ.get(k) for k in ('ATEN_CPU_CAPABILITY', 'MKL_CBWR', 'ONEDNN_MAX_CPU_ISA')}}))")


def probe(code: str, **env) -> dict:
    """Run ``code`` + :data:`PROBE` in a fresh interpreter without any pin in its environment (but ``env``)."""
    import os

    clean = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                                                               "STUDY_NUMERICS")}
    r = subprocess.run([sys.executable, "-c", code + "; " + PROBE], cwd=ROOT, env={**clean, **env},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def has_avx512() -> bool:
    from study.config.numerics import cpu_info

    return "avx512f" in cpu_info()["flags"]


@pytest.mark.slow  # three interpreters
def test_importing_study_pins_the_kernels_before_torch_and_native_leaves_them():
    pinned = probe("import study")
    assert pinned == {"cap": "AVX2", "env": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2",
                                             "ONEDNN_MAX_CPU_ISA": "AVX2"}}
    native = probe("import study", STUDY_NUMERICS="native")
    assert native["env"] == {"ATEN_CPU_CAPABILITY": None, "MKL_CBWR": None, "ONEDNN_MAX_CPU_ISA": None}
    if has_avx512():
        assert native["cap"].startswith("AVX512")
    own = probe("import study", ATEN_CPU_CAPABILITY="default")  # a user's own setting is kept
    assert own["cap"] == "DEFAULT" and own["env"]["MKL_CBWR"] == "AVX2"


def test_a_bad_numerics_setting_is_refused_in_one_line(monkeypatch):
    from study.config import ConfigError
    from study.config.numerics import check_numerics, numerics_mode

    with pytest.raises(ConfigError) as e:
        check_numerics({"STUDY_NUMERICS": "avx512"})
    assert "\n" not in str(e.value) and "STUDY_NUMERICS='avx512' is not one of avx2, native" in str(e.value)
    assert numerics_mode({"STUDY_NUMERICS": "avx512"}) == "avx2"  # pinned until refused: the safe default
    check_numerics({"STUDY_NUMERICS": "native"})
    check_numerics({})  # this test process imported study first (conftest): pinned


@pytest.mark.slow  # one interpreter
@pytest.mark.skipif(not has_avx512(), reason="torch imported first runs AVX2 anyway on a CPU without AVX-512")
def test_a_training_process_that_imported_torch_first_is_refused():
    code = ("import torch; torch.backends.cpu.get_cpu_capability(); import study; "
            "from study.config.numerics import check_numerics\ntry:\n check_numerics()\nexcept Exception as e:\n print(e)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in __import__("os").environ.items() if k not in ("ATEN_CPU_CAPABILITY",)})
    assert r.stdout.startswith("the CPU kernels are not pinned (ATen runs AVX512"), r.stdout + r.stderr
    assert "import study first, or set STUDY_NUMERICS=native" in r.stdout


@pytest.mark.slow  # one interpreter
@pytest.mark.skipif(not has_avx512(), reason="ATEN_CPU_CAPABILITY=avx512 runs AVX2 anyway on a CPU without AVX-512")
def test_a_users_own_avx512_capability_is_refused_naming_it():
    """QA: ATEN_CPU_CAPABILITY=avx512 set by the user (kept by the pin) was refused as "torch was imported before
    study", which it was not; the line names the variable."""
    code = ("import study; from study.config.numerics import check_numerics\ntry:\n check_numerics()\n"
            "except Exception as e:\n print(e)")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("STUDY_NUMERICS",)}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**env, "ATEN_CPU_CAPABILITY": "avx512"})
    assert r.stdout.startswith("ATEN_CPU_CAPABILITY=avx512 in the environment runs AVX512"), r.stdout + r.stderr
    assert "imported before study" not in r.stdout and len(r.stdout.strip().splitlines()) == 1


def test_the_resume_key_holds_the_numerics(nano_project):
    from study.config import load_config
    from study.runner.resume_key import resume_record

    one = resume_record(load_config(["trainer.threads=1"], nano_project), nano_project / "data/tokens")
    two = resume_record(load_config(["trainer.threads=2"], nano_project), nano_project / "data/tokens")
    assert one["numerics:cpu_capability"] == "AVX2" and one["numerics:mkl_cbwr"] == "AVX2"
    from study.config.numerics import cpu_info
    assert one["numerics:vendor"] == cpu_info()["vendor"] in ("AuthenticAMD", "GenuineIntel")  # MKL's branch: its own
    assert one["numerics:threads"] == 1 and two["numerics:threads"] == 2
    assert {k for k in one if one[k] != two[k]} == {"numerics:threads"}  # threads change the sums: never resumed


def test_cpu_ddp_ranks_train_at_the_threads_the_run_records(nano_project, tmp_path, monkeypatch):
    """QA: with trainer.devices=2 trainer.strategy=ddp trainer.threads=2 on CPU, Lightning's launcher set every rank
    to cores / ranks threads (OMP_NUM_THREADS unset), after study.train had set 2: config.json's numerics and the
    resume key said threads 2, record.json's machine 1.  Each rank now trains at the recorded threads."""
    import os

    import torch
    from lightning.fabric.utilities.distributed import _set_num_threads_if_needed

    from study.config import load_config
    from study.config.numerics import run_numerics
    from study.runner.run import plan_run

    monkeypatch.chdir(nano_project)
    omp, threads = os.environ.pop("OMP_NUM_THREADS", None), torch.get_num_threads()
    try:
        cfg = load_config(["trainer.threads=2", "trainer.devices=2", "trainer.strategy=ddp",
                           f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'm.db'}"],
                          nano_project)
        plan = plan_run(cfg, nano_project)
        assert plan.world == 2
        _set_num_threads_if_needed(num_processes=plan.world)  # what Lightning's DDP launcher does in every rank
        assert torch.get_num_threads() == run_numerics(plan.cfg.trainer)["threads"] == 2
    finally:
        torch.set_num_threads(threads)
        os.environ.pop("OMP_NUM_THREADS", None)
        if omp is not None:
            os.environ["OMP_NUM_THREADS"] = omp


def test_runs_under_other_numerics_never_pair(tmp_path):
    from synthetic_runs import write_run

    from study.analysis.pairing import PairingError, check
    from study.runfolder import read_run

    for variant, seed, threads in (("baseline", 1, 1), ("nonlinear_q", 1, 1), ("baseline", 2, 1), ("nonlinear_q", 2, 2)):
        d = write_run(tmp_path / f"{variant}-s{seed}", variant, seed, 4.0 + seed / 100)
        config = json.loads((d / "config.json").read_text())
        config["numerics"] = {"device": "cpu", "cpu_capability": "AVX2", "threads": threads}
        (d / "config.json").write_text(json.dumps(config))
    runs = {}
    for d in sorted(tmp_path.iterdir()):
        run = read_run(d, tmp_path)
        runs.setdefault(run["variant"], {})[run["seed"]] = run
    with pytest.raises(PairingError) as e:
        check(runs, "the study's runs")
    msg = str(e.value)
    assert "\n" not in msg and "nonlinear_q-s2 was trained under other numerics than" in msg
    assert "numerics.threads 2 (vs 1)" in msg and "runs under different numerics never pair" in msg


#: a short fixed run (the nano study's data, a 64-wide 4-layer nonlinear_q, one thread, 40 steps of 2,048 tokens):
#: its final val_loss under the pinned kernels, the full float, by CPU vendor (MKL's AVX2 branch is Intel's alone; an
#: AMD CPU takes its AUTO branch): AMD EPYCs with AVX2 only and with AVX-512, and an Intel Xeon with AVX-512 (no AMX;
#: 2026-12-07).  Unpinned, an AVX-512 EPYC gives 5.137331008911133.
PINNED_SHORT_RUN = {"AuthenticAMD": 5.137331962585449, "GenuineIntel": 5.137335777282715}


@pytest.mark.slow  # one short training
def test_a_short_run_gives_the_pinned_float_and_records_its_machine(run_in, tmp_path, nano_project):
    from conftest import mlflow_runs

    r = run_in("variant=nonlinear_q", "seed=1", "model.n_embd=64", "model.n_layer=4", "model.n_head=4",
               "trainer.threads=1", "train.tokens=81920", "train.eval_every=20")
    from study.config.numerics import cpu_info

    vendor = cpu_info()["vendor"]
    assert r["steps"] == 40 and r["val_loss"] == PINNED_SHORT_RUN.get(vendor, PINNED_SHORT_RUN["AuthenticAMD"])
    d = tmp_path / "runs" / "nonlinear_q-s1"
    numerics = json.loads((d / "config.json").read_text())["numerics"]
    assert numerics["cpu_capability"] == "AVX2" and numerics["threads"] == 1 and numerics["mode"] == "avx2"
    machine = json.loads((d / "record.json").read_text())["machine"]
    assert machine["cpu"]["vendor"] in ("AuthenticAMD", "GenuineIntel") and "avx2" in machine["cpu"]["flags"]
    assert machine["torch"].startswith("2.13.0") and machine["env"]["MKL_CBWR"] == "AVX2" and machine["mkl"]
    (run,) = [x for x in mlflow_runs(tmp_path / "mlruns.db")[1] if x.info.run_name == "nonlinear_q-s1"]
    assert run.data.params["numerics.cpu_capability"] == "AVX2" and run.data.params["numerics.threads"] == "1"
    assert run.data.tags["cpu"] == machine["cpu"]["model"] and "avx2" in run.data.tags["cpu_flags"].split()
    from study.runfolder.digests import code_digest
    assert run.data.params["code_digest"] == code_digest() == json.loads((d / "config.json").read_text())["code_digest"]


def test_a_run_of_other_training_code_is_refused_by_compare_as_the_test_stage_replaces_it(tmp_path):
    """A run folder copied from a checkout with other training code: config.json records its code digest, and
    compare refuses it in one line (the test stage's reuse, keyed on the same code, would train it again)."""
    from synthetic_runs import write_run

    from study.analysis.pairing import PairingError, check
    from study.runfolder import read_run
    from study.runfolder.digests import code_digest

    runs = {}
    for variant in ("baseline", "nonlinear_q"):
        d = write_run(tmp_path / f"{variant}-s1", variant, 1, 4.0)
        config = json.loads((d / "config.json").read_text())
        config["code_digest"] = code_digest() if variant == "baseline" else "0000000000000000"
        (d / "config.json").write_text(json.dumps(config))
        runs[variant] = {1: read_run(d, tmp_path)}
    with pytest.raises(PairingError) as e:
        check(runs, "the study's runs")
    assert "\n" not in str(e.value)
    assert f"nonlinear_q-s1 was trained by other training code (code digest 0000000000000000, this checkout's " \
           f"{code_digest()}" in str(e.value)
    runs["nonlinear_q"][1]["settings"]["code_digest"] = code_digest()
    assert check(runs, "the study's runs")["code_digest"] == code_digest()


def test_every_stage_refuses_a_bad_numerics_setting_before_it_runs(nano_project, monkeypatch, capsys):
    """Not only a training: the stage itself (study.tune, study.test_runs ...) refuses STUDY_NUMERICS=bogus in one
    line before it composes or trains anything."""
    from study.config import run_stage

    called = []
    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("STUDY_NUMERICS", "bogus")
    assert run_stage(lambda cfg, root: called.append(cfg) or 0, []) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: STUDY_NUMERICS='bogus' is not one of avx2, native: unset it (CPU kernels pinned to AVX2, "
                   "the default) or set STUDY_NUMERICS=native") and called == []
