"""The code part of a run's resume key: the digest of what each training file computes (its syntax tree without
docstrings), over the files a run of a task computes with (:func:`code_files`)."""
from __future__ import annotations

import ast
import functools
import hashlib
import json
from pathlib import Path

from study.config import StudyError

STUDY = Path(__file__).resolve().parent.parent  # the study package


def code_files(task: str = "lm") -> list[str]:
    """The training code the numbers of a run of ``task`` depend on, relative to study/: modeling/model.py,
    modeling/accounting.py (the parameter and FLOP counts a run records), modeling/lit_module.py,
    modeling/lr_schedule.py, modeling/diagnostics.py (what curve.csv's diagnostics mean), every module of the data
    package, and of the tasks package its own module, the modules of the package it imports (mlm: lm's) and the
    package's shared ones (``__init__.py``, ``common.py``), sorted, so that the digests are the same on every machine
    and a task added, or another task's module edited, leaves the run's key as it is."""
    own = {f"{n}.py" for n in _task_modules(task)} | {"__init__.py", "common.py"}
    tasks = STUDY / "tasks"
    return ["modeling/model.py", "modeling/accounting.py", "modeling/lit_module.py", "modeling/lr_schedule.py",
            "modeling/diagnostics.py", *sorted(p.relative_to(STUDY).as_posix() for p in (STUDY / "data").glob("*.py")),
            *sorted(f"tasks/{n}" for n in own if (tasks / n).is_file())]


def _task_modules(task: str) -> set[str]:
    """``task`` and the modules of study/tasks/ its module imports, in any form (``from study.tasks import <x>``,
    ``from study.tasks.<x> import <y>``, ``import study.tasks.<x>``, relative), transitively."""
    tasks, seen, todo = STUDY / "tasks", set(), [task]
    while todo:
        name = todo.pop()
        if name in seen or not (tasks / f"{name}.py").is_file():
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((tasks / f"{name}.py").read_bytes())):
            if isinstance(node, ast.ImportFrom):
                base = ("study.tasks" + (f".{node.module}" if node.module else "")) if node.level else node.module or ""
                parts = base.split(".")
                if base == "study.tasks":
                    todo += [a.name for a in node.names]
                elif parts[:2] == ["study", "tasks"]:
                    todo.append(parts[2])
            elif isinstance(node, ast.Import):
                todo += [a.name.split(".")[2] for a in node.names if a.name.startswith("study.tasks.")]
    return seen


def source_digest(path: Path) -> str:
    """sha256 (16 hex digits) of the code a Python file computes: its syntax tree without docstrings (the first
    statement of a module, class or function body when it is a string constant), dumped by ``ast.dump`` without
    line and column numbers.  Comments and formatting are not in the tree, so an edit of a docstring, a comment or
    the layout leaves the digest equal; a changed constant, operator or name changes it.  ``ast.dump`` rather than
    ``ast.unparse``: it is the tree itself, field by field, with no regenerated source (quotes, parentheses) between
    the tree and the digest.  The tree's form is Python's own, so the digest is tied to the Python minor version
    (the environment pins 3.11): another minor version may give other digests for the same file.

    Raises:
        OSError: ``path`` cannot be read.
        StudyError: ``path`` is not valid Python (one line naming the file and the line), as Python reads it: bytes,
            with their encoding declaration or UTF-8 (a byte-order mark included).
    """
    st = path.stat()  # each file parsed once per process while it stays as it is (a run's resume key, every reuse)
    return _tree_digest(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _tree_digest(name: str, mtime_ns: int, size: int) -> str:
    """:func:`source_digest` of the file ``name`` as it is at (``mtime_ns``, ``size``)."""
    path = Path(name)
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes; UnicodeDecodeError is a ValueError
        where = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise StudyError(f"{path}{where} is not valid Python ({getattr(e, 'msg', None) or e}): the resume key digests "
                         f"every module of study/data and study/tasks; fix or remove that file") from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:]
    dumped = ast.dump(tree, annotate_fields=True, include_attributes=False)
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]


def code_digests(task: str = "lm") -> dict[str, str]:
    """{file of :func:`code_files` (``task``'s): :func:`source_digest` of it}: the code part of the resume key, which
    changes when the code that computes changes and not when a docstring, a comment or the layout does.

    Raises:
        OSError: a file cannot be read.
        StudyError: a file is not valid Python (:func:`source_digest`).
    """
    return {n: source_digest(STUDY / n) for n in code_files(task)}


def code_digest(task: str = "lm") -> str:
    """One sha256 (16 hex digits) over :func:`code_digests` (the code the files compute, not their docstrings,
    comments or layout): config.json's ``code_digest``, which compare checks against this checkout's as the test
    stage's reuse does (a run trained by other code counts for neither)."""
    return hashlib.sha256(json.dumps(code_digests(task), sort_keys=True).encode()).hexdigest()[:16]
