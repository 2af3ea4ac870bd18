"""The package's house rules, read from the source with ast (nothing imported): no import cycle among study's
modules, function-level imports included, and no module much over 400 lines."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 440  # "no module over ~400 lines" (model.py, the whole model in one file, is the largest): split a module by concern before it grows past this


def study_modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted module name: file} of every module under ``root/study`` (a package by its ``__init__``)."""
    out = {}
    for path in sorted((root / "study").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The study modules that ``module`` imports anywhere in its file (top level or inside a function).

    ``from P import name`` counts as importing ``P.name`` when that is a module, else ``P``; a module's
    import of its own package's ``__init__`` counts like any other.  Returns names of ``modules``.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            target = known(name) if name == "study" or name.startswith("study.") else None
            if target and target != module:
                found.add(target)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each is a cycle."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_import_cycles_are_found():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_imports_are_read_like_python(tmp_path):
    pkg = tmp_path / "study" / "data"
    pkg.mkdir(parents=True)
    (tmp_path / "study" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("class DataError(Exception): ...\n")
    (pkg / "a.py").write_text("from study.data import DataError\ndef f():\n    from .b import g\n")
    (pkg / "b.py").write_text("import study.data.a as a\nimport numpy\n")
    modules = study_modules(tmp_path)
    graph = {m: imports_of(m, p, modules) for m, p in modules.items()}
    assert graph["study.data.a"] == {"study.data", "study.data.b"}
    assert graph["study.data.b"] == {"study.data.a"}
    assert import_cycles(graph) == [["study.data.a", "study.data.b"]]


def test_no_import_cycle_in_study():
    modules = study_modules()
    graph = {m: imports_of(m, p, modules) for m, p in modules.items()}
    cycles = import_cycles(graph)
    detail = [" <-> ".join(f"{m} (imports {', '.join(sorted(graph[m] & set(c)))})" for m in c) for c in cycles]
    assert not cycles, f"import cycles among study's modules: {detail}"


def test_no_module_is_too_long():
    long = {p.relative_to(ROOT).as_posix(): n for p in study_modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def _has_main(path: Path) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(path.read_text()).body)


def test_the_stages_are_the_top_level_modules_and_the_machinery_packages_hold_none():
    """A stage is told at a glance: every module at the top of study/ has a main() (``python -m study.NAME``);
    the machinery packages (modeling, runner, data, analysis, runfolder, orchestration, tuning, mlflow_ui) hold no main().  The two packaged stages,
    config and gpu_check, run as ``python -m study.config`` / ``study.gpu_check`` through their __main__."""
    top = [p for p in sorted((ROOT / "study").glob("*.py")) if p.name != "__init__.py"]
    assert len(top) >= 8, top
    assert [p.name for p in top if not _has_main(p)] == []
    machinery = [p for pkg in ("modeling", "runner", "data", "analysis", "runfolder", "orchestration", "tuning", "mlflow_ui") for p in sorted((ROOT / "study" / pkg).glob("*.py"))]
    assert len(machinery) > 30 and [str(p.relative_to(ROOT)) for p in machinery if _has_main(p)] == []
    for pkg in ("config", "gpu_check"):
        assert (ROOT / "study" / pkg / "__main__.py").is_file()


#: the layers, lowest first: a module imports its own layer and the ones below it only; a stage (a top-level module
#: with a main()) is imported by nothing; runfolder is the run folder's contract (its files, writers and readers),
#: below both the runner that writes run folders and the analysis that reads them
LAYERS = {"config": 0, "data": 1, "tasks": 1, "modeling": 1, "runfolder": 2, "runner": 3, "orchestration": 4,
          "analysis": 3, "mlflow_ui": 4, "tuning": 5, "gpu_check": 5, "stage": 6}


def layer_of(module: str, path: Path) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "config"  # study/__init__.py
    return "stage" if len(parts) == 2 and path.name != "__init__.py" else parts[1]


def layer_breaches(root: Path = ROOT) -> set[str]:
    """``"a -> b"`` for every import of a module by one of a lower layer, or of a stage by anything, or between
    analysis and runner/orchestration (analysis reads folders, it never runs anything)."""
    modules = study_modules(root)
    out = set()
    for m, path in modules.items():
        for t in imports_of(m, path, modules):
            a, b = layer_of(m, path), layer_of(t, modules[t])
            upward = LAYERS[b] > LAYERS[a] and b != a
            sideways = {a, b} in ({"analysis", "runner"}, {"analysis", "orchestration"})
            if b == "stage" or upward or sideways:
                out.add(f"{m} -> {t}")
    return out


def test_imports_flow_one_way_through_the_layers():
    """config -> data, tasks, modeling -> runfolder -> runner -> orchestration -> stages; analysis beside runner, reading run
    folders through runfolder; no package imports a stage."""
    found = layer_breaches()
    assert found == set(), f"imports against the layers: {sorted(found)}"


#: the imports by name in study/ (``importlib.import_module``), each a plug-in lookup the layers allow: the composition
#: hands a config to the tasks package to type and check the task's own settings (as Hydra instantiates a ``_target_``),
#: and the tasks package finds a task's module by its name.  tests/test_dvc_deps.py counts both as imports.
PLUGIN_LOOKUPS = {"study.config.compose": "'study.tasks'", "study.tasks": "f'study.tasks.{name}'"}


def test_the_only_imports_by_name_are_the_task_plugins():
    found = {}
    for m, path in study_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                                                         "__import__"):
                found[m] = ast.unparse(node.args[0])
    assert found == PLUGIN_LOOKUPS


def test_a_layer_breach_is_found(tmp_path):
    pkg = tmp_path / "study"
    for sub in ("config", "runner"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("def main():\n    pass\n")
    (pkg / "config" / "a.py").write_text("from study.runner import b\n")  # config reaches up
    (pkg / "runner" / "b.py").write_text("def f():\n    from study import train\n")  # a package calls a stage
    assert layer_breaches(tmp_path) == {"study.config.a -> study.runner.b", "study.runner.b -> study.train"}


def test_one_home_per_module_name():
    """No two modules of the same file name in sibling packages of study/ (a package's __init__ and __main__ aside):
    `arms`, `launch`, `runs` ... each name says one job."""
    from collections import defaultdict

    homes = defaultdict(list)
    for p in (ROOT / "study").rglob("*.py"):
        if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts:
            homes[p.name].append(p.relative_to(ROOT).as_posix())
    assert {n: h for n, h in homes.items() if len(h) > 1} == {}


def test_no_private_name_is_imported_across_packages():
    """`from study.PKG.MOD import _name` only inside PKG: a private name is its package's own."""
    import ast

    crossed = []
    for p in (ROOT / "study").rglob("*.py"):
        pkg = ".".join(p.relative_to(ROOT).parent.parts)
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("study."):
                home = node.module.rsplit(".", 1)[0]
                crossed += [f"{p.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__") and home != pkg]
    assert crossed == []
