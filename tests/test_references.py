"""Docstrings and pages point to names that exist: every dotted reference ``study.X.Y`` (plain, in backticks or as
``:func:`study.X.Y```) in study/'s docstrings, docs/*.md and README.md resolves to a module of study/ and, past the
module, to a name that module defines or imports (a class's methods and attributes too), read with ast: nothing
imported, the suite stays fast.

A dotted name whose first part after ``study.`` is no module of study/ is a key of the ``study`` config section
(``study.arms``, ``study.seeds``) and is not a reference; nor is one written after a dot or a slash
(``cfg.study.runs_dir``, ``conf/study.yaml``).
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.test_layout import study_modules

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REF = re.compile(r"(?<![\w./-])study(?:\.[A-Za-z_]\w*)+")


modules = study_modules  # {dotted module name: file} of every module and package under study/


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _names(body: list[ast.stmt]) -> dict[str, ast.AST | None]:
    """The names a module or class body binds: defs and classes (with their node), assignments, imports."""
    out: dict[str, ast.AST | None] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out[n.id] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = None
        elif isinstance(node, (ast.If, ast.Try)):
            out.update(_names(node.body))
    return out


def _class_names(node: ast.ClassDef) -> set[str]:
    names = set(_names(node.body))
    for f in node.body:  # attributes set in methods (self.x = ...)
        if isinstance(f, ast.FunctionDef):
            for n in ast.walk(f):
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                    names.add(n.attr)
    return names


def resolves(ref: str, mods: dict[str, Path]) -> bool | None:
    """True when ``ref`` names a module of study/ or a name in one; False when not; None when it is no reference
    (its first part after ``study.`` is no module: a key of the study config section)."""
    parts = ref.split(".")
    if ".".join(parts[:2]) not in mods:
        return None
    i = max(k for k in range(2, len(parts) + 1) if ".".join(parts[:k]) in mods)
    module, rest = ".".join(parts[:i]), parts[i:]
    if not rest:
        return True
    names = _names(_parsed(mods[module]).body)
    if rest[0] not in names:
        return False
    node = names[rest[0]]
    for attr in rest[1:]:
        if not isinstance(node, ast.ClassDef) or attr not in _class_names(node):
            return False
        node = _names(node.body).get(attr)
    return True


def docstrings(path: Path) -> str:
    """The docstrings of a module, its classes and functions."""
    tree = _parsed(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    return "\n".join(out)


def broken(texts: dict[str, str], mods: dict[str, Path]) -> list[str]:
    """``where: ref`` for every reference of ``texts`` ({where: text}) that does not resolve."""
    return [f"{where}: {ref}" for where, text in texts.items() for ref in sorted(set(REF.findall(text)))
            if resolves(ref.rstrip("."), mods) is False]


def _all_texts() -> dict[str, str]:
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in PAGES}
    texts.update({p.relative_to(ROOT).as_posix(): docstrings(p) for p in sorted((ROOT / "study").rglob("*.py"))})
    return texts


def test_references_are_found_and_checked(tmp_path):
    pkg = tmp_path / "study" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "study" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .m import f as g\n")
    (pkg / "m.py").write_text("X = 1\ndef f(): ...\nclass C:\n    Y = 2\n    def __init__(self):\n        self.z = 3\n"
                              "    def h(self): ...\n")
    mods = modules(tmp_path)
    text = ("`study.sub.m.f`, :func:`study.sub.g`, study.sub.m.C.h, study.sub.m.C.z, study.sub.m.X and "
            "study.sub.m.gone, :class:`study.sub.m.C.nope`, study.other.x; study.seeds, cfg.study.sub.x, conf/study.yaml")
    assert REF.findall("cfg.study.arms, conf/study.yaml, `study.sub`.") == ["study.sub"]
    assert broken({"page": text}, mods) == ["page: study.sub.m.C.nope", "page: study.sub.m.gone"]
    assert resolves("study.seeds", mods) is None and resolves("study.sub", mods) is True


@pytest.mark.parametrize("kind", ["pages", "docstrings"])
def test_every_reference_resolves(kind):
    mods = modules()
    texts = {k: v for k, v in _all_texts().items() if k.endswith(".md") == (kind == "pages")}
    refs = [r for t in texts.values() for r in REF.findall(t) if resolves(r.rstrip("."), mods) is not None]
    assert len(refs) > 20, refs  # the pages and docstrings do name modules and functions
    bad = broken(texts, mods)
    assert not bad, "references to names that do not exist (rename them to what exists):\n" + "\n".join(bad)


def test_every_study_file_named_exists():
    """``study/X/Y.py`` or ``tests/X.py`` named in a page, a docstring, conf/, the Makefile or dvc.yaml is a file of
    the repository."""
    path = re.compile(r"(?<![\w./-])(?:study|tests)/[\w/]+\.py\b")
    texts = _all_texts()
    texts.update({p.relative_to(ROOT).as_posix(): p.read_text()
                  for p in [ROOT / "Makefile", ROOT / "dvc.yaml", ROOT / "pyproject.toml",
                            *sorted((ROOT / "conf").rglob("*.yaml")), *sorted((ROOT / "study").rglob("*.py"))]})
    named = {(where, p) for where, text in texts.items() for p in path.findall(text)}
    assert len(named) > 20
    assert sorted(f"{where}: {p}" for where, p in named if not (ROOT / p).is_file()) == []
