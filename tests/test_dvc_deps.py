"""dvc.yaml's code dependencies cannot go stale: every module a stage's command imports (its import closure,
function-level imports and the packages' __init__ files included, read with ast as tests/test_layout.py does)
is a dependency of that stage, so a change to any of them re-runs it."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.test_layout import imports_of, study_modules

ROOT = Path(__file__).resolve().parent.parent


def closure(module: str, graph: dict[str, set[str]]) -> set[str]:
    """``module`` and every study module it imports, transitively; a submodule's import runs its packages'
    __init__ files too."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += graph.get(m, ())
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
    return seen


def stage_code(root: Path = ROOT) -> dict[str, tuple[list[str], list[str]]]:
    """{stage: (the files of its command's import closure, its study/ dependencies in dvc.yaml)}."""
    mods = study_modules(root)
    graph = {m: imports_of(m, p, mods) for m, p in mods.items()}
    # the task plug-ins (tests/test_layout.py PLUGIN_LOOKUPS): every composition hands its config to study.tasks, which
    # imports a task's module by its name, so every stage reaches every task module at run time
    graph["study.config.compose"] |= {"study.tasks"}
    graph["study.tasks"] |= {m for m in mods if m.startswith("study.tasks.")}
    out = {}
    for name, stage in yaml.safe_load((root / "dvc.yaml").read_text())["stages"].items():
        module = stage["cmd"].split("python -m ", 1)[1].split()[0]
        need = sorted(str(mods[m].relative_to(root)) for m in closure(module, graph) if m in mods)
        out[name] = (need, [d for d in stage.get("deps", []) if d.startswith("study")])
    return out


def test_every_stage_depends_on_the_code_it_imports():
    missing = {name: [f for f in need if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps)]
               for name, (need, deps) in stage_code().items()}
    assert {k: v for k, v in missing.items() if v} == {}, "add these files to the stages' deps in dvc.yaml"


def test_no_stage_depends_on_code_it_does_not_import():
    """Exactly the stages a change affects: a listed study/ file is in the closure, and a listed folder holds
    modules of the closure only."""
    def covered(d: str, need: list[str]) -> bool:
        if d.endswith(".py"):
            return d in need
        files = [str(p.relative_to(ROOT)) for p in (ROOT / d).rglob("*.py")]
        return bool(files) and all(f in need for f in files)
    extra = {name: [d for d in deps if not covered(d, need)] for name, (need, deps) in stage_code().items()}
    assert {k: v for k, v in extra.items() if v} == {}


def test_the_closure_follows_function_level_imports(tmp_path):
    """A toy package: a imports b inside a function, b imports c at the top; c's package __init__ counts."""
    pkg = tmp_path / "study"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub/__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from study import b\n")
    (pkg / "b.py").write_text("from study.sub import c\n")
    (pkg / "sub/c.py").write_text("X = 1\n")
    (pkg / "d.py").write_text("")
    mods = study_modules(tmp_path)
    graph = {m: imports_of(m, p, mods) for m, p in mods.items()}
    assert closure("study.a", graph) == {"study", "study.a", "study.b", "study.sub", "study.sub.c"}


def test_dvc_lock_is_not_git_ignored():
    """`dvc repro` refuses to write a git-ignored dvc.lock ("'dvc.lock' is git-ignored"), so .gitignore must leave
    it alone; git decides, reading every ignore rule of this checkout."""
    import subprocess

    r = subprocess.run(["git", "check-ignore", "-v", "dvc.lock"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1, f"dvc.lock is git-ignored by {r.stdout.strip()}: remove that rule"
