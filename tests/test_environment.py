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
