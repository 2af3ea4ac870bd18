"""Set-up files agree: environment.yml lists exactly pyproject's dependencies (+ litdata, + -e .)."""
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    makefile = (ROOT / "Makefile").read_text()
    litdata = next(line.split('"')[1] for line in makefile.splitlines() if line.strip().startswith("$(PIP)") and "--no-deps" in line)
    assert set(pip) == wanted | {litdata, "-e ."}


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme.split("\n## ")[0]
    assert "make study" in readme.split("\n## ")[0]
    assert "make test" in (ROOT / ".ci/run").read_text()
    assert "analytics = false" in (ROOT / ".dvc/config").read_text()


def test_make_install_gpu_installs_the_pinned_torch_from_the_cuda_index_then_the_rest(tmp_path):
    """`make install-gpu` (what a GPU machine runs, read as make expands it on a fresh checkout): torch 2.13.0, the
    version pyproject.toml pins, reinstalled from PyTorch's CUDA wheel index (CUDA=cu130 unless named), before the
    project and litdata, so that `pip install -e .` finds its torch pin satisfied and pulls no other build."""
    import re
    import shutil
    import subprocess

    for f in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / f, tmp_path / f)

    def plan(*args):
        out = subprocess.run(["make", "-n", "--no-print-directory", "install-gpu", *args], cwd=tmp_path,
                             capture_output=True, text=True, check=True).stdout
        return [ln for ln in out.splitlines() if "pip" in ln and " install " in ln]

    lines = plan()
    assert "--force-reinstall" in lines[0] and '"torch==2.13.0"' in lines[0]
    assert lines[0].endswith("--index-url https://download.pytorch.org/whl/cu130")
    assert "-e \".[dev]\"" in lines[1] and "--index-url" not in " ".join(lines[1:])
    assert 'torch==2.13.0' in (ROOT / "pyproject.toml").read_text()  # the pin the CUDA build satisfies
    assert plan("CUDA=cu126")[0].endswith("whl/cu126")
    cpu = subprocess.run(["make", "-n", "--no-print-directory", "install"], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    first = next(ln for ln in cpu.splitlines() if "torch==2.13.0" in ln)
    assert "--index-url" not in first and "--force-reinstall" not in first and re.search(r'"torch==2\.13\.0"\s*$', first)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / ".installed").touch()  # an install there: a refused CUDA must leave it as it is
    for bad in ("", "cpu", "cu130 x", "../x"):
        out = subprocess.run(["make", "--no-print-directory", "install-gpu", f"CUDA={bad}"], cwd=tmp_path,
                             capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.startswith(f"error: CUDA={bad} is not a CUDA wheel tag"), out
        assert (tmp_path / ".venv" / ".installed").exists()
