"""Hydra composition of conf/ (study/config/compose.py): overrides, the stage CLI's --help / --cfg job / -m,
one-line errors before Lightning is imported, and DVC's Hydra mode (params.yaml)."""
from __future__ import annotations

import configparser
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, env_for

NANO = ["model=nano", "data.tokenizer=bpe", "data.vocab_size=512"]  # the nano study's data: a 512-token BPE


def test_group_and_field_overrides_compose():
    from study.config import load_config

    cfg = load_config([*NANO, "model.n_layer=3", "variant=nonlinear_q", "seed=2", "train.lr=1e-3"], ROOT)
    assert (cfg.model.name, cfg.model.n_layer, cfg.model.n_embd, cfg.model.vocab_multiple) == ("nano", 3, 32, 1)
    assert (cfg.variant.name, cfg.variant.query, cfg.variant.bottleneck) == ("nonlinear_q", "nonlinear", 0.5)
    assert (cfg.seed, cfg.train.lr, cfg.train.min_lr) == (2, 1e-3, 3e-4)  # min_lr from conf/study.yaml's train
    assert (cfg.trainer.name, cfg.trainer.precision, cfg.data.vocab_size) == ("cpu", "32-true", 512)
    # a field override wins over the group file whatever the order on the command line
    assert load_config(["model.n_layer=3", *NANO], ROOT).model.n_layer == 3
    default = load_config([], ROOT)
    assert (default.model.name, default.variant.name, default.model.n_embd, default.train.tokens) == ("cpu", "baseline", 64,
                                                                                                     2097152)
    assert (default.data.tokenizer, default.data.vocab_size, default.data.val_every) == ("bytes", None, 20)


def test_study_sections_override_the_chosen_group_file(tmp_path):
    """`_self_` last in the defaults list: conf/study.yaml's `model: {...}` beats conf/model/NAME.yaml,
    and the command line beats both; `+key` adding a key the typed schema lacks is refused (nothing would
    read it)."""
    from study.config import ConfigError, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    study = tmp_path / "conf/study.yaml"
    study.write_text(study.read_text().replace("model: {}", "model: {n_layer: 6}"))
    assert load_config(NANO, tmp_path).model.n_layer == 6
    assert load_config([*NANO, "model.n_layer=5"], tmp_path).model.n_layer == 5
    with pytest.raises(ConfigError, match=r"^\+train.note=hello: unknown key 'train.note': '\+' would add it"):
        load_config([*NANO, "+train.note=hello"], tmp_path)


@pytest.mark.parametrize("overrides, words", [
    (["variant=nonlinar_q"], ["unknown variant 'nonlinar_q'", "'nonlinear_q'", "conf/variant"]),
    (["data=nope"], ["unknown data 'nope'", "'owt'"]),
    (["train.lrr=1"], ["unknown key 'train.lrr'", "did you mean train.lr?", "fix the spelling"]),
    (["modle.n_layer=2"], ["unknown key 'modle'", "did you mean model?"]),
    (["+train.lrr=1"], ["+train.lrr=1: unknown key 'train.lrr'", "nothing reads it", "did you mean train.lr?"]),
    (["++trainer.acelerator=cpu"], ["unknown key 'trainer.acelerator'", "did you mean trainer.accelerator?"]),
    (["train.lr=abc"], ["train.lr=abc", "Float", "fix the value's type"]),
    (["foo"], ["override 'foo' has no '='"]),
    (["train.lr=[1,"], ["bad override", "override_grammar"]),
    (["seed=1,2"], ["seed=1,2", "-m (--multirun)"]),
    (["model.n_head=3"], ["model.n_embd=64 is not divisible by model.n_head=3"]),
    (["train.lr=-1"], ["train.lr=-1.0 must be > 0"]),
])
def test_config_errors_are_one_line(overrides, words):
    from study.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(overrides, ROOT)
    msg = str(e.value)
    assert "\n" not in msg and "HYDRA_FULL_ERROR" not in msg, msg
    assert all(w in msg for w in words), msg


def test_a_group_file_naming_another_file_is_refused(tmp_path):
    from study.config import ConfigError, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "conf/model/nano2.yaml").write_text((ROOT / "conf/model/nano.yaml").read_text())
    with pytest.raises(ConfigError, match=r"conf/model/nano2.yaml says name: nano: write name: nano2"):
        load_config(["model=nano2", "data.tokenizer=bpe", "data.vocab_size=512"], tmp_path)
    (tmp_path / "conf/model/nano3.yaml").write_text("n_layer: 1\nn_head: 2\nn_embd: 32\nblock_size: 64\n")
    assert load_config(["model=nano3", "data.tokenizer=bpe", "data.vocab_size=512"], tmp_path).model.name == "nano3"  # no name: the file's


@pytest.mark.parametrize("edit,words", [
    (lambda t: t.replace("  - run_config\n", ""), ["but it starts with `- model: cpu`"]),
    (lambda t: t.replace("  - run_config\n", "").replace("  - _self_\n", "  - run_config\n  - _self_\n"),
     ["but it starts with `- model: cpu`"]),
    (lambda t: t.split("defaults:")[0] + t.split("  - _self_\n", 1)[1], ["but it has no defaults list"]),
], ids=["no run_config", "run_config not first", "no defaults list"])
def test_study_yaml_without_the_schema_first_is_refused(tmp_path, edit, words):
    """conf/study.yaml's defaults list must start with the typed schema: without it the composition used to
    fail with a traceback (Missing key max_block_size); now one line, in load_config and in the CLIs."""
    from study.config import ConfigError, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    study = tmp_path / "conf/study.yaml"
    study.write_text(edit(study.read_text()))
    with pytest.raises(ConfigError) as e:
        load_config(NANO, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "conf/study.yaml's defaults list must start with `- run_config`" in msg, msg
    assert all(w in msg for w in words), msg
    r = _cli(tmp_path, "study.train", "--cfg", "job", *NANO)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"error: {msg}"], r.stderr
    assert sorted(os.listdir(tmp_path)) == ["conf"]


def test_every_group_file_states_its_own_name():
    """params.yaml (DVC's composition, which cannot fill names in) records each group's file by these."""
    for group in ("model", "variant", "trainer"):
        for path in (ROOT / "conf" / group).glob("*.yaml"):
            assert yaml.safe_load(path.read_text())["name"] == path.stem, path


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = env_for(ROOT)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_cfg_job_prints_the_composed_config_and_writes_nothing(tmp_path):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    r = _cli(tmp_path, "study.train", "--cfg", "job", *NANO, "variant=nonlinear_q", "train.lr=1e-3", "seed=3")
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert (cfg["model"]["name"], cfg["model"]["n_embd"], cfg["variant"]["query"]) == ("nano", 32, "nonlinear")
    assert (cfg["train"]["lr"], cfg["seed"], cfg["data"]["vocab_size"]) == (1e-3, 3, 512)
    assert sorted(os.listdir(tmp_path)) == ["conf"]  # no runs/, outputs/ or .hydra/


def test_help_lists_the_groups_and_their_options():
    r = _cli(ROOT, "study.train", "--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    import study.train

    assert out.splitlines()[0] == study.train.__doc__.strip().splitlines()[0]  # the stage's own docstring first
    assert ("  model: bytes-32, bytes-48, bytes-64, cpu, cpu-bpe2048, gpt3-small, ladder-128, ladder-64, ladder-96, nano, "
            "rope-32, rope-48, rope-64") in out
    assert "  trainer: cpu, ddp, fsdp, gpu" in out and "nonlinear_q_relu2" in out
    assert "--cfg job" in out and "--multirun" in out and "model.n_layer=3" in out


@pytest.mark.slow  # an interpreter started
def test_a_config_error_fails_fast_in_one_line_before_lightning_is_imported():
    """Fast means before torch and Lightning are imported (what costs seconds), not a timed bound: a loaded
    machine must not fail it."""
    code = ("import sys; sys.argv = ['train', 'variant=nonlinar_q']\n"
            "from study.train import main\nrc = main()\n"
            "print(rc, 'lightning' in sys.modules, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env_for(ROOT), capture_output=True, text=True,
                       timeout=120)
    rc, lightning, torch = r.stdout.split()
    assert (rc, lightning, torch) == ("2", "False", "False"), r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown variant 'nonlinar_q'"), r.stderr


def test_multirun_expands_the_sweep_and_runs_each_job_in_order():
    from study.config import run_stage, sweep

    assert sweep(["variant=baseline,nonlinear_q", "seed=1,2", "train.lr=1e-3"]) == [
        ["variant=baseline", "seed=1", "train.lr=0.001"], ["variant=baseline", "seed=2", "train.lr=0.001"],
        ["variant=nonlinear_q", "seed=1", "train.lr=0.001"], ["variant=nonlinear_q", "seed=2", "train.lr=0.001"]]
    runs = []

    def body(cfg, root):
        runs.append((cfg.variant.name, cfg.seed, cfg.train.lr, cfg.model.name))
        return 0

    assert run_stage(body, ["-m", "variant=baseline,nonlinear_q", "seed=1,2", "train.lr=1e-3", *NANO]) == 0
    assert runs == [("baseline", 1, 1e-3, "nano"), ("baseline", 2, 1e-3, "nano"), ("nonlinear_q", 1, 1e-3, "nano"),
                    ("nonlinear_q", 2, 1e-3, "nano")]
    runs.clear()  # every job is composed and checked before the first one runs
    assert run_stage(body, ["--multirun", "seed=1,-5", *NANO]) == 2 and runs == []


@pytest.mark.slow  # interpreters started
def test_params_yaml_is_conf_composed_as_dvc_composes_it():
    """The committed params.yaml is what DVC's Hydra mode writes for no overrides (`make params`); DVC finds
    the typed schema through hydra_plugins/ (a process that never imports study itself)."""
    from study.config import composed_params

    committed = (ROOT / "params.yaml").read_text()
    assert committed == composed_params(ROOT), "params.yaml is stale: run `make params`"
    code = ("import sys, tempfile, pathlib\nfrom dvc.utils.hydra import compose_and_dump\n"
            "out = pathlib.Path(tempfile.mkdtemp()) / 'params.yaml'\n"
            f"compose_and_dump(out, {str(ROOT / 'conf')!r}, None, 'study', {str(ROOT) + '/'!r}, sys.argv[1:])\n"
            "print(out.read_text(), end='')")
    r = subprocess.run([sys.executable, "-c", code], cwd="/", env={**env_for(ROOT), "PYTHONPATH": ""},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == committed
    r = subprocess.run([sys.executable, "-c", code, "model=ladder-64", "train.lr=6e-3"], cwd="/",
                       env={**env_for(ROOT), "PYTHONPATH": ""}, capture_output=True, text=True, timeout=120)
    composed = yaml.safe_load(r.stdout)
    assert (composed["model"]["name"], composed["model"]["n_embd"], composed["train"]["lr"]) == ("ladder-64", 64, 6e-3)
    assert composed["train"]["beta1"] == 0.9  # the schema's defaults are part of the composition


def test_dvc_runs_hydra_mode_and_every_stage_reads_params_yaml():
    dvc = configparser.ConfigParser()
    dvc.read(ROOT / ".dvc/config")
    assert dict(dvc["hydra"]) == {"enabled": "true", "config_dir": "conf", "config_name": "study"}
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "vars" not in yaml.safe_load((ROOT / "dvc.yaml").read_text())  # params.yaml's values are DVC's default vars
    assert stages.pop("check_params")["cmd"] == "python -m study.config --check"
    for name, stage in stages.items():
        assert stage["cmd"].startswith(f"python -m study.{'ladder_runs' if name == 'scale_ladder' else name} "
                                       "--params params.yaml"), (name, stage["cmd"])
        assert all(isinstance(p, str) for p in stage["params"])  # keys of params.yaml


def test_stage_under_dvc_takes_params_yaml_and_its_own_group_choice(tmp_path, monkeypatch):
    """--params params.yaml: DVC's composition (here model=ladder-96, train.lr=6e-3) is the base, the stage's
    variant=... replaces the variant section by conf/'s, field overrides apply last; under plain `dvc repro`
    (no DVC_EXP_NAME) a params.yaml that is not conf/ composed is refused in one line."""
    from study.config import ConfigError, composed_params, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "params.yaml").write_text(composed_params(tmp_path, ["model=ladder-96", "train.lr=6e-3",
                                                                      "variant.scale_factor=0.25"]))
    monkeypatch.setenv("DVC_EXP_NAME", "exp-1")
    cfg = load_config(["variant=nonlinear_q", "seed=2", "arm.lr=1e-3"], tmp_path, params="params.yaml")
    assert (cfg.model.name, cfg.model.n_embd, cfg.train.lr, cfg.seed) == ("ladder-96", 96, 6e-3, 2)
    assert (cfg.variant.name, cfg.variant.query, cfg.arm.lr) == ("nonlinear_q", "nonlinear", 1e-3)
    assert cfg.variant.scale_factor is None  # the default variant's section did not leak into the chosen one
    assert load_config(["variant=baseline"], tmp_path, params="params.yaml").variant.scale_factor is None
    monkeypatch.delenv("DVC_EXP_NAME")
    with pytest.raises(ConfigError, match=r"params.yaml is not conf/ composed \(sections \['model', 'train'\] "
                                          r"differ\): after editing conf/ run `make params`"):
        load_config(["variant=nonlinear_q"], tmp_path, params="params.yaml")
    (tmp_path / "params.yaml").write_text(composed_params(tmp_path))
    fresh = load_config(["variant=nonlinear_q", "model=nano", "data.tokenizer=bpe", "data.vocab_size=512"], tmp_path, params="params.yaml")
    assert (fresh.model.name, fresh.variant.name, fresh.train.lr) == ("nano", "nonlinear_q", 3e-3)


def test_tune_arms_is_the_one_override_params_yaml_may_carry_outside_dvc_exp_run(tmp_path, monkeypatch):
    """`make tune TUNE_ARMS='[a,b]'` composes params.yaml with tune.arms=[a,b] and runs `dvc repro tune@a tune@b`
    outside `dvc exp run`: tune.arms picks the stages and is read by none, so it passes the check; any other tune
    key (here tune.seeds, which every tune@ARM stage reads) is still refused in one line."""
    from study.config import ConfigError, composed_params, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    (tmp_path / "params.yaml").write_text(composed_params(tmp_path, ["tune.arms=[baseline_d2z]"]))
    cfg = load_config(["variant=baseline"], tmp_path, params="params.yaml")
    assert list(cfg.tune.arms) == ["baseline_d2z"]
    assert _cli(tmp_path, "study.config", "--check").returncode == 0
    (tmp_path / "params.yaml").write_text(composed_params(tmp_path, ["tune.arms=[baseline_d2z]", "tune.seeds=[103,104]"]))
    with pytest.raises(ConfigError, match=r"params.yaml is not conf/ composed \(sections \['tune'\] differ\)"):
        load_config(["variant=baseline"], tmp_path, params="params.yaml")


def test_check_params_fails_in_one_line_when_conf_was_edited(tmp_path, monkeypatch):
    """dvc.yaml's check_params stage (`python -m study.config --check`), run when conf/ changes: a study.yaml
    edited without `make params` stops `dvc repro`; `python -m study.config` recomposes params.yaml."""
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    r = _cli(tmp_path, "study.config")
    assert r.returncode == 0 and r.stdout.startswith("wrote params.yaml"), r.stderr
    assert (tmp_path / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()
    assert _cli(tmp_path, "study.config", "--check").returncode == 0
    study = tmp_path / "conf/study.yaml"
    study.write_text(study.read_text().replace("tokens: 2097152", "tokens: 1048576", 1))  # train.tokens
    r = _cli(tmp_path, "study.config", "--check")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: params.yaml is not conf/ composed (sections ['train'] differ): after editing conf/ run `make params` "
        "(or `dvc exp run`, which composes it); to drop the values of a `dvc exp run -S`, `git checkout params.yaml`"]
    assert _cli(tmp_path, "study.config").returncode == 0
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["train"]["tokens"] == 1048576
    assert _cli(tmp_path, "study.config", "--check").returncode == 0


@pytest.mark.slow
def test_dvc_exp_run_set_param_reaches_the_stages(tmp_path):
    """`dvc exp run -S model=... -S arms.baseline.lr=...` in a copy of the project (two nano arms): DVC composes conf/
    with the overrides into params.yaml and the test stage runs what it says."""
    import json

    from conftest import BIN, copy_project

    project = copy_project(tmp_path / "proj", name="exp", arms=("baseline", "nonlinear_q"), seeds=(1, 2, 3, 4, 5),
                           tokens=10240)
    (project / "conf/model/nano1.yaml").write_text((project / "conf/model/nano.yaml").read_text()
                                                   .replace("name: nano", "name: nano1").replace("n_layer: 2", "n_layer: 1"))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["add", "-A"], cwd=project, check=True)
    subprocess.run(git + ["commit", "-qm", "nano1"], cwd=project, check=True)
    r = subprocess.run([str(BIN / "dvc"), "exp", "run", "-S", "model=nano1", "-S", "arms.baseline.lr=6e-3"],
                       cwd=project, env=env_for(project), capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    config = json.loads((project / "runs/test/baseline/baseline-s1/config.json").read_text())
    assert (config["model"]["name"], config["model"]["n_layer"], config["arm"]["lr"]) == ("nano1", 1, 6e-3)
    params = yaml.safe_load((project / "params.yaml").read_text())
    assert (params["model"]["name"], params["arms"]["baseline"]["lr"]) == ("nano1", 6e-3)
    # the experiment's own verdict, as `make exps` shows it: reports/metrics is cached, so `dvc exp show` reads
    # the experiment's metrics from its commit (with cache: false, every experiment but the workspace shows '-')
    shown = json.loads(subprocess.run([str(BIN / "dvc"), "exp", "show", "--json"], cwd=project, env=env_for(project),
                                      capture_output=True, text=True, check=True).stdout)
    exps = [r for row in shown for e in (row.get("experiments") or []) for r in e["revs"]]
    assert len(exps) == 1, shown
    verdict = exps[0]["data"]["metrics"]["reports/metrics/nonlinear_q.json"]["data"]["vs_baseline"]
    written = json.loads((project / "reports/metrics/nonlinear_q.json").read_text())["vs_baseline"]
    assert verdict["pct_log_loss"] == written["pct_log_loss"] and math.isfinite(verdict["pct_log_loss"])


# -- broken conf/ files, params.yaml and command lines: one line, nothing written ----------------------
def _one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("file, text, words", [
    ("model/nano.yaml", "name: nano\nn_layer: [1\n", ["conf/model/nano.yaml: expected ',' or ']'", "(line 3)"]),
    ("model/nano.yaml", "name: nano\nn_layer: 1\nn_layer: 2\nn_head: 2\n", ["conf/model/nano.yaml: found duplicate key "
                                                                          "n_layer (line 3)"]),
    ("study.yaml", "APPEND\nseed: [1\n", ["conf/study.yaml: expected ',' or ']'"]),
    ("study.yaml", "APPEND\nmodel: {}\n", ["conf/study.yaml: found duplicate key model"]),
])
def test_a_conf_file_that_is_not_yaml_is_named_in_one_line(tmp_path, file, text, words):
    from study.config import ConfigError, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    path = tmp_path / "conf" / file
    path.write_text(text.replace("APPEND", path.read_text().rstrip("\n")))
    with pytest.raises(ConfigError) as e:
        load_config(NANO, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    if file == "study.yaml":
        line = text.replace("APPEND", (ROOT / "conf" / file).read_text().rstrip("\n")).count("\n")
        assert f"(line {line})" in msg or f"(line {line + 1})" in msg, msg  # the line of the problem
    if file == "model/nano.yaml":  # the stage CLI and `python -m study.config` say the same, in one line
        assert _one_line(_cli(tmp_path, "study.train", "--cfg", "job", *NANO)) == f"error: {msg}"
        assert _one_line(_cli(tmp_path, "study.config", *NANO)) == f"error: {msg}"
        assert not (tmp_path / "params.yaml").exists()


@pytest.mark.parametrize("file, line, words", [
    ("model/nano.yaml", "n_layerz: 3", ["unknown key 'model.n_layerz' in conf/model/nano.yaml", "fix the spelling"]),
    ("study.yaml", "  lrr: 3", ["unknown key 'train.lrr' in conf/study.yaml"]),
    ("model/nano.yaml", "dropout: lots", ["conf/model/nano.yaml: model.dropout: Value 'lots'", "fix the value's type"]),
])
def test_an_unknown_key_in_a_conf_file_names_the_key_and_the_file(tmp_path, file, line, words):
    from study.config import ConfigError, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    path = tmp_path / "conf" / file
    text = path.read_text()
    path.write_text(text.replace("train:\n", f"train:\n{line}\n", 1) if file == "study.yaml" else text + line + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(NANO, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "raised while composing" not in msg and all(w in msg for w in words), msg


def test_a_removed_key_in_a_conf_file_says_what_replaced_it(tmp_path):
    """study.variants (the shared-lr list, removed) left in conf/study.yaml: the key, the file and study.arms."""
    from study.config import ConfigError, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    path = tmp_path / "conf/study.yaml"
    path.write_text(path.read_text().replace("study:\n", "study:\n  variants: [baseline, nonlinear_q]\n", 1))
    with pytest.raises(ConfigError) as e:
        load_config(NANO, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("unknown key 'study.variants' in conf/study.yaml: it was removed: "), msg
    assert "study.arms" in msg and msg.endswith("; delete it from the file"), msg


def test_study_config_refuses_a_group_file_naming_another_file(tmp_path, monkeypatch):
    """`python -m study.config` (writing params.yaml) and `--check` refuse what the stages refuse."""
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    assert _cli(tmp_path, "study.config").returncode == 0
    committed = (tmp_path / "params.yaml").read_bytes()
    cpu = tmp_path / "conf/model/cpu.yaml"  # the default model: chosen by both
    cpu.write_text(cpu.read_text().replace("name: cpu", "name: cpu2"))
    expected = "error: conf/model/cpu.yaml says name: cpu2: write name: cpu (a group file's name is its file name)"
    assert _one_line(_cli(tmp_path, "study.config", "--check")) == expected
    assert _one_line(_cli(tmp_path, "study.config")) == expected
    assert (tmp_path / "params.yaml").read_bytes() == committed
    cpu.write_text(cpu.read_text().replace("name: cpu2", "name: cpu"))
    nano = tmp_path / "conf/model/nano.yaml"  # chosen by an override
    nano.write_text(nano.read_text().replace("name: nano", "name: pico"))
    assert "conf/model/nano.yaml says name: pico" in _one_line(_cli(tmp_path, "study.config", *NANO))
    variant = tmp_path / "conf/variant/nonlinear_q.yaml"  # the variant of an arm of study.arms: the test stage runs it
    variant.write_text(variant.read_text().replace("name: nonlinear_q", "name: nlq"))
    assert "conf/variant/nonlinear_q.yaml says name: nlq" in _one_line(_cli(tmp_path, "study.config", "--check"))
    assert (tmp_path / "params.yaml").read_bytes() == committed


@pytest.mark.parametrize("overrides, words", [
    (["train.lr=-1"], ["train.lr=-1.0 must be > 0"]),
    (["model.n_head=3"], ["not divisible by model.n_head=3"]),
    (["~model"], ["~model: the model group cannot be deleted", "model=NAME"]),
    (["~trainer"], ["~trainer: the trainer group cannot be deleted"]),
    (["train.lr=1e-3,2e-3"], ["'train.lr=1e-3,2e-3' sweeps several values: a sweep needs -m"]),
    (["--foo"], ["unknown option --foo (see --help)"]),
])
def test_study_config_writes_nothing_from_a_config_a_stage_refuses(tmp_path, overrides, words):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    err = _one_line(_cli(tmp_path, "study.config", *overrides))
    assert all(w in err for w in words), err
    assert (tmp_path / "params.yaml").read_bytes() == (ROOT / "params.yaml").read_bytes()


def test_deleting_a_group_is_refused_by_the_stages():
    from study.config import ConfigError, load_config, run_stage

    for group in ("model", "variant", "data", "trainer"):
        with pytest.raises(ConfigError, match=rf"^~{group}: the {group} group cannot be deleted"):
            load_config([f"~{group}"], ROOT)
    assert run_stage(lambda cfg, root: 0, ["-m", "~variant", "seed=1,2"]) == 2  # a multirun checks it too


@pytest.mark.parametrize("content, words", [
    ("study: [1\n", ["not valid YAML", "line 2"]),
    ("- 1\n- 2\n", ["top level is a List"]),
    ("model: {}\n", ["sections ['study', 'variant'"]),
    ("", ["missing"]),
    ("ROOT_WITH_MODEL_3", ["sections ['model'] are not mappings"]),
])
def test_check_params_says_a_malformed_params_yaml_is_malformed(tmp_path, monkeypatch, content, words):
    """`--check` and a stage's --params: one line saying params.yaml is malformed and to run `make params`."""
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    if content == "ROOT_WITH_MODEL_3":
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        content = yaml.safe_dump({**params, "model": 3})
    (tmp_path / "params.yaml").write_text(content)
    for args in (["study.config", "--check"], ["study.train", "--params", "params.yaml", "--cfg", "job"]):
        err = _one_line(_cli(tmp_path, *args))
        assert err.startswith("error: params.yaml is malformed (") and "run `make params`" in err, err
        assert all(w in err for w in words), err
    assert (tmp_path / "params.yaml").read_text() == content  # --check writes nothing


def test_a_sweep_without_multirun_and_an_unknown_option_are_one_clear_line(tmp_path):
    """With or without --params (DVC's stages), a sweep value without -m says a sweep needs -m; an option the
    CLI does not take is an unknown option, not a bad override."""
    from study.config import ConfigError, composed_params, load_config

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "params.yaml").write_text(composed_params(tmp_path))
    for sweep in ("train.lr=1e-3,2e-3", "variant=baseline,nonlinear_q"):
        messages = set()
        for params in (None, "params.yaml"):
            with pytest.raises(ConfigError) as e:
                load_config([sweep], tmp_path, params=params)
            messages.add(str(e.value))
        assert messages == {f"{sweep!r} sweeps several values: a sweep needs -m (--multirun), e.g. -m {sweep}; "
                            f"or write a list as key=[a,b]"}, messages
    err = _one_line(_cli(tmp_path, "study.train", "--params", "params.yaml", "--cfg", "job", "variant=baseline,nonlinear_q"))
    assert "a sweep needs -m" in err and "ChoiceSweep" not in err, err
    for module in ("study.train", "study.config", "study.compare"):
        err = _one_line(_cli(tmp_path, module, "--foo"))
        assert err.startswith("error: unknown option --foo (see --help)"), (module, err)
