"""The documentation stays true: README.md and docs/*.md name only commands, files and dated counts that exist.

- every ``make TARGET`` they quote is a target of the Makefile (``make -n TARGET`` succeeds in the repository);
- every ``python -m study...`` module they quote exists and is runnable: its file (``study/X.py`` or
  ``study/X/__main__.py``) defines or imports ``main`` and runs it under ``if __name__ == "__main__"``
  (parsed with ast, nothing imported: the suite stays fast);
- every relative link and image path resolves to a file or folder of the repository;
- no page names a number of tests or of minutes without a date (YYYY-MM-DD) on the same line, in the first
  line of its paragraph, or in the heading of its section: such numbers change with the code and the machine,
  and a dated one says when it was true.
"""
import ast
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
MAKE = re.compile(r"(?<![\w.-])make\s+((?:[A-Z_]+=\S+\s+)*)([a-z][\w-]*)")
MODULE = re.compile(r"(?:^|\s)-m\s+(study(?:\.[a-z_]\w*)+)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COUNT = re.compile(r"\b\d[\d,.]*\s*(?:-\s*\d[\d,.]*\s*)?(?:min|mins|minutes?|tests|passed)\b")


def _code(text):
    """The text inside the page's code spans and fenced blocks (where commands are quoted)."""
    return "\n".join(m.group(0).strip("`") for m in CODE.finditer(text))


def _quoted(pattern, group=1):
    found = {}
    for page in PAGES:
        for m in pattern.finditer(_code(page.read_text())):
            found.setdefault(m.group(group), page.relative_to(ROOT).as_posix())
    return found


def test_the_pages_exist():
    names = {p.name for p in PAGES}
    assert {"fairness.md", "statistics.md", "profiles.md", "configuration.md", "variants.md", "failures.md",
            "scaling.md", "benchmarks.md", "history.md"} <= names


def test_the_readme_fits_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_readme_lines_fit_120_characters():
    long = [f"README.md:{i}: {len(line)} characters" for i, line in
            enumerate((ROOT / "README.md").read_text().splitlines(), 1) if len(line) > 120]
    assert not long, "README lines over 120 characters (wrap them or move the material to docs/):\n" + "\n".join(long)


def test_quoted_make_targets_exist():
    targets = _quoted(MAKE, 2)
    assert {"study", "test"} <= set(targets)
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    missing = [f"make {t} ({page})" for t, page in sorted(targets.items())
               if subprocess.run(["make", "-n", t], cwd=ROOT, capture_output=True).returncode != 0]
    assert not missing, f"quoted make targets that the Makefile lacks: {missing}"


def _module_file(module):
    parts = module.split(".")
    for path in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__main__.py")):
        if path.is_file():
            return path
    return None


def _runs_main(path):
    tree = ast.parse(path.read_text())
    has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body) or any(
        isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == "main" for a in n.names) for n in tree.body)
    guarded = path.name == "__main__.py" or any(
        isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    return has_main and guarded


def test_quoted_study_modules_exist_and_run_main():
    modules = _quoted(MODULE)
    assert "study.train" in modules
    bad = [f"python -m {m} ({page})" for m, page in sorted(modules.items())
           if (path := _module_file(m)) is None or not _runs_main(path)]
    assert not bad, f"quoted modules that do not exist or have no main() under __main__: {bad}"


def test_relative_links_and_images_resolve():
    broken = []
    for page in PAGES:
        text = CODE.sub("", page.read_text())
        for target in LINK.findall(text):
            if re.match(r"[a-z][\w+.-]*:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def undated_counts(text):
    """Lines of a markdown page that name a number of tests or minutes with no date nearby.

    A date counts on the line itself, on the first line of the line's paragraph (lines up to the previous
    blank line) or on the heading of its section.  Returns [(line number, line)].
    """
    out, heading, first = [], "", ""
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            heading, first = line, ""
            continue
        if not line.strip():
            first = ""
            continue
        first = first or line
        if COUNT.search(line) and not any(DATE.search(s) for s in (line, first, heading)):
            out.append((i, line.strip()))
    return out


def test_undated_counts_are_found():
    page = "# T\n\nThe suite has 329 tests.\n\n## Measured 2026-12-01\n\nIt took 17 min.\n\nA run: ~2 min (2026-11-30).\n"
    assert undated_counts(page) == [(3, "The suite has 329 tests.")]
    assert undated_counts("Seen 2026-11-30:\nwhole study 22 min 11 s\n\nthe min_lr ratio\n") == []


def test_counts_of_tests_and_minutes_are_dated():
    undated = [f"{p.relative_to(ROOT)}:{i}: {line}" for p in PAGES for i, line in undated_counts(p.read_text())]
    assert not undated, "numbers of tests or minutes without a date (add the date they were measured):\n" + "\n".join(undated)


def test_the_configuration_page_lists_every_key_of_the_schema():
    """docs/configuration.md's "Every key" table names every key of the typed schema (sections' fields and the
    top-level keys), so a key added to study/config/schema.py without its line there fails here."""
    import dataclasses

    from study.config import schema, task_names
    from study.config.task import COMMON_FIELDS, task_fields

    text = (ROOT / "docs" / "configuration.md").read_text()
    keys = []
    for f in dataclasses.fields(schema.RunConfig):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(sub)]
        elif f.name == "task":  # every task's common fields and each task's own (its module's Settings)
            keys += [f"task.{k}" for k in dict.fromkeys([*COMMON_FIELDS, *(x for t in task_names()
                                                                           for x in task_fields(t))])]
        else:
            keys.append(f.name)
    assert len(keys) > 80
    assert [k for k in keys if f"| `{k}` |" not in text] == []


def test_the_configuration_pages_defaults_are_params_yamls_value_by_value():
    """Every value the "Every key" table shows (backquoted, not cut with ...) is the value params.yaml composes (a
    task's own setting: its conf/task file's); the tuned.* maps say where they come from (conf/tuned.yaml).  A default
    changed in conf/ without its line fails."""
    import re

    import yaml

    from study.config import task_names
    from study.config.task import task_fields

    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text[text.index("## Every key"):]
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for t in task_names():  # the lm task is composed; the others' settings are their files' values
        own = yaml.safe_load((ROOT / "conf" / "task" / f"{t}.yaml").read_text())
        params["task"] = {**{k: own[k] for k in task_fields(t) if k != "name"}, **params["task"]}
    missing = object()

    def composed(key: str):
        node = params
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return missing
            node = node[part]
        return node

    rows = re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \|", section, re.M)
    assert len(rows) > 80
    wrong = []
    for key, shown in rows:
        if "..." in shown:
            continue
        want, got = composed(key), yaml.safe_load(shown)
        same = got == want or (isinstance(want, float) and isinstance(got, (int, float)) and math.isclose(got, want))
        if want is missing or not same:
            wrong.append(f"{key}: shown {shown!r}, params.yaml {want!r}")
    assert wrong == []


# a function or constant named beside its file, or as module.func(): `study/x/y.py` `name`, `name` in `study/x/y.py`,
# `y.name()` (y a module of study/).  Dotted `study.x.y.name` references are checked in tests/test_references.py, file
# paths in test_every_study_file_named_exists there, `make X` above.
BESIDE = re.compile(r"`(study/[\w/]+\.py)`(?:'s)? `([A-Za-z_]\w*)(?:\(\))?`")
IN_FILE = re.compile(r"`([A-Za-z_]\w*)(?:\(\))?`(?: \([^)]*\))? in `(study/[\w/]+\.py)`")
CALL = re.compile(r"`([a-z_]\w*)\.([A-Za-z_]\w*)\(\)`")


def named_functions(text: str, mods: dict) -> list[str]:
    """``study.x.y.name`` for every function or constant ``text`` names beside its file or as ``module.name()``
    (module: the last part of a module of study/, ``mods`` {dotted name: file}); other ``x.f()`` are not the study's."""
    out = [f"{f[:-3].replace('/', '.')}.{n}" for f, n in BESIDE.findall(text)]
    out += [f"{f[:-3].replace('/', '.')}.{n}" for n, f in IN_FILE.findall(text)]
    for mod, name in CALL.findall(text):
        dotted = sorted(m for m in mods if m.rsplit(".", 1)[-1] == mod)
        out += [f"{dotted[0]}.{name}"] if len(dotted) == 1 else []
    return out


def test_named_functions_are_found():
    from tests.test_references import modules

    mods = modules()
    text = ("`study/runner/tracking.py` `NOT_RUN_SHAPING`, `peak_flops` in `study/runner/throughput.py`, `browser_check.check()`,"
            " `torch.manual_seed()`, `tracking.gone()`")
    assert named_functions(text, mods) == ["study.runner.tracking.NOT_RUN_SHAPING", "study.runner.throughput.peak_flops",
                                           "study.mlflow_ui.browser_check.check", "study.runner.tracking.gone"]


def test_functions_the_pages_name_exist():
    """A page that names a function beside its file, or as module.func(), names one the module defines or imports."""
    from tests.test_references import modules, resolves

    mods = modules()
    named = {(p.relative_to(ROOT).as_posix(), ref) for p in PAGES for ref in named_functions(p.read_text(), mods)}
    assert len(named) >= 3, named
    bad = sorted(f"{page}: {ref}" for page, ref in named if resolves(ref, mods) is not True)
    assert not bad, "functions the pages name that do not exist (name what the module defines):\n" + "\n".join(bad)
