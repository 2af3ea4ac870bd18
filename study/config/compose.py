"""Hydra composition of ``conf/`` into a typed, validated :class:`RunConfig` (the stage runner that parses a
stage's command line is :mod:`study.config.stage`; Hydra's errors become one-line messages in
:mod:`study.config.hydra_errors`).

Layout (lightning-hydra-template style config groups)::

    conf/study.yaml          the primary config: the defaults list (schema, group choices) and
                             the sections that override fields of the chosen files
    conf/model/NAME.yaml     n_layer, n_head, n_embd, block_size, vocab_multiple ...
    conf/variant/NAME.yaml   which projections of q, k, v are linear/identity/nonlinear
    conf/data/NAME.yaml      corpus source and tokenizer
    conf/trainer/NAME.yaml   Lightning accelerator, devices, strategy, precision

Overrides are Hydra's (https://hydra.cc/docs/advanced/override_grammar/basic/): ``model=nano``
picks a file of a group, ``model.n_layer=3`` sets one field (after the group files and
conf/study.yaml's sections, whatever the order on the command line; a key the typed schema lacks is
refused with the closest one, ``+new.key=1`` included), ``'study.seeds=[1,2]'`` sets a list.  Every stage also takes ``--help``, ``--cfg job`` (print the
composed config as YAML and exit) and ``-m`` (``--multirun``: one run per combination of the
comma-separated values, e.g. ``-m variant=baseline,nonlinear_q seed=1,2``, run one after another).

Under DVC (``dvc.yaml``) the stages take ``--params params.yaml``: the config DVC's Hydra mode
composed (``dvc exp run -S model=ladder-64``; the committed params.yaml is conf/ composed without
overrides), on which a stage's own group choice (``variant=X``, ``model=X``) replaces that group's
section by conf/ composed with it and its field overrides apply last.

Every mistake (Hydra's own included) raises :class:`ConfigError` with a one-line message that
names the key or file and the fix; nothing heavier than Hydra is imported before the config is
composed and validated.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .group_files import check_name, ladder_position
from .hydra_errors import _first, _hydra_error, _key_hint, schema_keys
from .schema import GROUPS, SCHEMA_NAME, ConfigError, RunConfig, register
from .task import resolve_task
from .validation import check_ladder_lr, validate, validate_paths
from .verdict_checks import used_arms

NAMED_GROUPS = ("model", "variant", "trainer", "launcher", "task")  # groups whose section records its file as ``name``
PARAMS_FILE = "params.yaml"  # DVC's Hydra output (ParamsDependency.DEFAULT_PARAMS_FILE)


def project_root() -> Path:
    """The repository root: the folder holding ``conf/`` (the working directory first)."""
    here = Path.cwd()
    for p in (here, *here.parents):
        if (p / "conf" / "study.yaml").is_file():
            return p
    pkg = Path(__file__).resolve().parents[2]
    if (pkg / "conf" / "study.yaml").is_file():
        return pkg
    raise ConfigError(f"conf/study.yaml not found from {here}: run from the project root")


def available(root: Path, group: str) -> list[str]:
    """Names of the YAML files of a config group, sorted."""
    return sorted(p.stem for p in (root / "conf" / group).glob("*.yaml"))


def compose_conf(config_dir: Path, config_name: str, overrides: list[str]) -> tuple[DictConfig, dict]:
    """Hydra's compose API over ``config_dir``: (the composed config, the group choices)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    import yaml

    register()
    _check_schema_first(config_dir, config_name)
    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError, yaml.YAMLError) as e:
        raise _hydra_error(e, list(overrides), config_dir.parent) from e
    choices = {g: cfg.hydra.runtime.choices.get(g) for g in GROUPS}
    return OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"]), choices  # less Hydra's own node


def _check_schema_first(config_dir: Path, config_name: str) -> None:
    """The primary config's defaults list starts with the typed schema (``- run_config``): without it
    nothing is typed or checked (the composition fails later on a missing key), and after a group file it
    would overwrite that file's values with the schema's defaults.

    Raises:
        ConfigError: no defaults list, or one whose first entry is not ``run_config``.
    """
    import yaml

    path = config_dir / f"{config_name}.yaml"
    if not path.is_file():
        return  # a ConfigStore node (params.yaml's base), which names the schema itself
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError):
        return  # Hydra reports a bad file in one line
    defaults = data.get("defaults") if isinstance(data, dict) else None
    if not isinstance(defaults, list) or not defaults or defaults[0] != SCHEMA_NAME:
        head = defaults[0] if isinstance(defaults, list) and defaults else None
        head = ", ".join(f"{k}: {v}" for k, v in head.items()) if isinstance(head, dict) else head
        first = f"but it starts with `- {head}`" if head is not None else "but it has no defaults list"
        raise ConfigError(f"conf/{config_name}.yaml's defaults list must start with `- {SCHEMA_NAME}` (the typed "
                          f"schema, study/config/schema.py), {first}: put `defaults:` with `- {SCHEMA_NAME}` first, "
                          f"then the group choices (model, variant, data, trainer) and `- _self_` (git checkout "
                          f"conf/{config_name}.yaml restores it)")


def name_groups(cfg: DictConfig, choices: dict, config_dir: Path, groups=NAMED_GROUPS, set_names: bool = True) -> None:
    """Set ``GROUP.name`` to the chosen file's name; a file that states another name is refused."""
    for g in groups:
        choice = choices.get(g)
        if choice is None:
            continue
        check_name(config_dir, g, choice)
        if set_names:
            cfg[g].name = choice


def composed_params(root: Path, overrides: list[str] | None = None) -> str:
    """What DVC's Hydra mode writes into params.yaml for these overrides (``dvc.utils.hydra.compose_and_dump``:
    the resolved composition of conf/study.yaml as YAML), for ``make params`` and the sync test."""
    overrides = list(overrides or [])
    _check_overrides(overrides)
    cfg, choices = compose_conf(root / "conf", "study", overrides)
    name_groups(cfg, choices, root / "conf", set_names=False)  # refused, not renamed: DVC writes the files' own
    _check(copy.deepcopy(cfg), root)  # nothing written that a stage would refuse; DVC writes it unresolved
    OmegaConf.resolve(cfg)
    return OmegaConf.to_yaml(cfg)


def _check_overrides(overrides: list[str], sweeps: bool = False) -> None:
    """Refuse, in one line, what Hydra would take silently or report badly: an option the CLI does not take
    (``--foo``), the deletion of a group or section (``~model``: schema defaults, not a conf/ file) and,
    unless ``sweeps``, a sweep (``train.lr=1e-3,2e-3`` without -m)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    for o in overrides:
        if o.startswith("-"):
            raise ConfigError(f"unknown option {o.split('=', 1)[0]} (see --help)")
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except HydraException as e:
        raise _hydra_error(e, list(overrides)) from e
    sections = [f.name for f in dataclasses.fields(RunConfig)]
    keys = set(schema_keys())
    for o in parsed:
        if (o.is_add() or o.is_force_add()) and o.key_or_group not in GROUPS and o.key_or_group not in keys:
            raise ConfigError(f"{o.input_line}: unknown key {o.key_or_group!r}: '+' would add it to the typed schema, "
                              f"where nothing reads it (the run would ignore it silently): "
                              f"{_key_hint(o.key_or_group)}")
        if o.is_delete() and o.key_or_group in sections:
            kind = "group" if o.key_or_group in GROUPS else "section"
            fix = (f"choose another file with {o.key_or_group}=NAME" if kind == "group"
                   else f"set its keys with {o.key_or_group}.KEY=VALUE")
            raise ConfigError(f"{o.input_line}: the {o.key_or_group} {kind} cannot be deleted (every run needs one; "
                              f"deleting it leaves the schema's defaults): {fix}")
        if not sweeps and o.is_sweep_override():
            raise ConfigError(f"{o.input_line!r} sweeps several values: a sweep needs -m (--multirun), e.g. "
                              f"-m {o.input_line}; or write a list as key=[a,b]")


def _group_overrides(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split Hydra overrides into group choices {group: name} and the rest (field overrides)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except HydraException as e:
        raise _hydra_error(e, list(overrides)) from e
    choices, rest = {}, []
    for o in parsed:
        if o.key_or_group in GROUPS and o.package is None and not o.is_delete() and not o.is_add():
            choices[o.key_or_group] = str(o.value())
        else:
            rest.append(o.input_line)
    return choices, rest


def stale_sections(root: Path, params: DictConfig, study_file: Path | None = None) -> list[str]:
    """The sections in which ``params`` (a loaded params.yaml) is not conf/ composed without overrides;
    [] inside ``dvc exp run`` (DVC_EXP_NAME set: DVC composed it with the -S overrides).  The variant
    section is left out: every stage that trains names its own variant (conf/variant/NAME.yaml); so is
    ``tune.arms``, which only picks the tune@ARM stages to run (`make tune TUNE_ARMS=...`), no stage's input."""
    if os.environ.get("DVC_EXP_NAME"):
        return []
    study_file = study_file or root / "conf" / "study.yaml"
    fresh, choices = compose_conf(study_file.parent, study_file.stem, [])
    name_groups(fresh, choices, study_file.parent, set_names=False)
    _check(copy.deepcopy(fresh), root)  # checked, not resolved: params.yaml holds DVC's composition (model.position None)
    OmegaConf.resolve(fresh)
    params, fresh = _stage_inputs(params), _stage_inputs(fresh)
    return [k for k in sorted(set(params) | set(fresh)) if params.get(k) != fresh.get(k)]


# What params.yaml may hold that no stage reads: {section: None (all of it) or the one key of it}.
NOT_STAGE_INPUTS = {"variant": None, "tune": "arms", "launcher": None}  # launcher: where the runs train, not what


def _stage_inputs(cfg: DictConfig) -> dict:
    """``cfg`` as plain sections, less NOT_STAGE_INPUTS."""
    out = OmegaConf.to_container(cfg, resolve=True)
    for section, key in NOT_STAGE_INPUTS.items():
        if key is None:
            out.pop(section, None)
        elif isinstance(out.get(section), dict):
            out[section].pop(key, None)
    return out


def stale_message(name: str, stale: list[str]) -> str:
    return (f"{name} is not conf/ composed (sections {stale} differ): after editing conf/ run `make params` "
            f"(or `dvc exp run`, which composes it); to drop the values of a `dvc exp run -S`, `git checkout {name}`")


def load_params(params: Path) -> DictConfig:
    """A composed config (params.yaml), checked to be one: a mapping holding every section of
    :class:`RunConfig`, each section a mapping.

    Raises:
        ConfigError: missing, not YAML, or not shaped like a composition; one line saying to run `make params`.
    """
    import yaml

    ours = params.name == "params.yaml"  # the project's own composition; any other file is the user's
    fix = (f"run `make params` to recompose it from conf/ (or `git checkout {params.name}`)" if ours else
           "give a config composed from conf/ (`make params` writes params.yaml)")
    if params.is_dir() or (params.exists() and not params.is_file()):
        raise ConfigError(f"--params {params} is not a file (a folder or a device): give the composed config, "
                          f"--params params.yaml")
    if not params.is_file():
        raise ConfigError(f"{params} not found: " + ("run `make params` (conf/ composed into params.yaml)" if ours else
                                                    "give the path of a composed config, e.g. --params params.yaml"))
    try:
        base = OmegaConf.load(params)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        detail = (getattr(e, "problem", None) or _first(e)) + (f", line {mark.line + 1}" if mark is not None else "")
        raise ConfigError(f"{params if not ours else params.name} is malformed (not valid YAML: {detail}): {fix}") from e
    if not isinstance(base, DictConfig):
        raise ConfigError(f"{params.name} is malformed (its top level is a {type(base).__name__.removesuffix('Config')}"
                          f", not a mapping of sections): {fix}")
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    missing = [k for k in fields if k not in base]
    if missing:
        raise ConfigError(f"{params.name} is malformed (sections {missing} missing): {fix}")
    flat = [k for k, f in fields.items() if dataclasses.is_dataclass(f.default_factory if f.default_factory
                                                                     is not dataclasses.MISSING else None)
            and not isinstance(base.get(k), DictConfig)]
    if flat:
        raise ConfigError(f"{params.name} is malformed (sections {flat} are not mappings): {fix}")
    return base


def _check_pipeline_task(params: Path, base: DictConfig, root: Path) -> None:
    """The project's params.yaml is the DVC pipeline's input, and dvc.yaml's outputs (runs/, reports/comparison.md)
    are the lm task's: a params.yaml composed with another task (``dvc exp run -S task=T``) would train T's runs
    into runs/T/ and leave compare's outputs unwritten, so every stage refuses it before it starts.

    Raises:
        ConfigError: one line saying that a task's runs and report are made by ``make tasks TASKS=T``.
    """
    task = OmegaConf.select(base, "task.name", default="lm")
    if task == "lm" or params.name != "params.yaml" or params.resolve().parent != Path(root).resolve():
        return
    raise ConfigError(f"params.yaml composes task={task}, but the DVC pipeline (dvc.yaml, `dvc repro`, `dvc exp "
                      f"run`) trains and reports the lm task only (runs/, reports/comparison.md): a task's lr*, runs "
                      f"and report (reports/{task}/) are made by `make tasks TASKS={task}`; drop -S task={task} and "
                      f"restore params.yaml (`make params`)")


def _from_params(params: Path, overrides: list[str], root: Path, study_file: Path) -> RunConfig:
    """The config of a DVC stage: params.yaml (DVC's composition), each group chosen in ``overrides``
    replaced by conf/ composed with that choice, then the field overrides."""
    from hydra.core.config_store import ConfigStore

    base = load_params(params)
    _check_pipeline_task(params, base, root)
    config_dir, name = study_file.parent, study_file.stem
    choices, fields = _group_overrides(overrides)
    stale = stale_sections(root, base, study_file)
    if stale:
        raise ConfigError(stale_message(params.name, stale))
    if choices:
        regrouped, chosen = compose_conf(config_dir, name, [f"{g}={c}" for g, c in choices.items()])
        name_groups(regrouped, chosen, config_dir, [g for g in choices if g in NAMED_GROUPS])
        for g in choices:
            base[g] = regrouped[g]
    ConfigStore.instance().store(name="_params_base", node={"defaults": [SCHEMA_NAME, "_self_"],
                                                           **OmegaConf.to_container(base)})
    cfg, _ = compose_conf(config_dir, "_params_base", fields)
    return cfg  # type: ignore[return-value]


def load_config(overrides: list[str] | None = None, root: Path | None = None,
                study_file: str | Path = "conf/study.yaml", params: str | Path | None = None) -> RunConfig:
    """Compose the run configuration with Hydra: conf/study.yaml's defaults list, then the overrides.

    Args:
        overrides: Hydra overrides, e.g. ``["variant=nonlinear_q", "seed=2", "train.lr=1e-3"]``.
        root: project root (default: found from the working directory).
        study_file: the primary config, relative to ``root``; its folder is Hydra's config dir.
        params: a composed config to start from instead (``params.yaml`` under DVC, see the module
            docstring), relative to ``root``.

    Returns:
        A validated :class:`RunConfig` (an OmegaConf structured config), read-only: nothing assigns into a run's
        config after its composition (a run's derived settings are merged into a frozen copy once, by
        ``study.runner.spec.run_spec``; a changed setting is another composition, with an override).

    Raises:
        ConfigError: unknown group option, unknown key, wrong type, bad override syntax, or an
            inconsistent value (see :func:`validate`); always one line.
    """
    root = Path(root or project_root())
    study = root / study_file
    if not study.is_file():
        raise ConfigError(f"{study} not found: run from the project root")
    overrides = list(overrides or [])
    _check_overrides(overrides)
    if params is not None:
        cfg = _from_params(root / params, overrides, root, study)
    else:
        composed, choices = compose_conf(study.parent, study.stem, overrides)
        name_groups(composed, choices, study.parent)
        cfg = composed  # typed by the schema at the head of the defaults list
    cfg = _check(cfg, root)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _check(cfg: RunConfig, root: Path) -> RunConfig:
    """``cfg`` resolved: its interpolations (one that fails is refused in one line) and its task
    (:func:`study.config.task.resolve_task`: its own folders and lr*; ``study.tasks.typed_task``: its settings typed
    and checked by its module), then checked (:func:`validate`; every variant
    and model that the study's lists name is a file of conf/ that states its own name).  Returns the resolved copy."""
    _resolve_check(cfg)
    cfg = resolve_task(cfg)
    # the task's module types and checks its own settings: found by name (a plug-in, as Hydra's _target_ classes are)
    cfg = importlib.import_module("study.tasks").typed_task(cfg)
    validate(cfg)
    validate_paths(cfg, root)
    for key, group, names in (("scale_ladder.variants", "variant", cfg.scale_ladder.variants),
                              ("scale_ladder.models", "model", cfg.scale_ladder.models),
                              ("the arms in use (arms.NAME.variant)", "variant", [cfg.arms[a].variant for a in used_arms(cfg)])):
        unknown = [v for v in names if not (root / "conf" / group / f"{v}.yaml").is_file()]
        if unknown:
            raise ConfigError(f"{key} lists unknown {unknown}: choose from {available(root, group)}")
        for name in names:
            check_name(root / "conf", group, name)
    if cfg.scale_ladder.models:
        position = ladder_position(cfg, root / "conf")
        if cfg.scale_ladder.lr_from_tuned:
            check_ladder_lr(cfg, position)
    return cfg


def _raw_value(cfg: DictConfig, key: str) -> str | None:
    """The unresolved value of ``key`` (``a.b.c``) in ``cfg``, e.g. ``${train.nope}``; None if it cannot be read."""
    try:
        node = cfg
        for part in key.split("."):
            node = node._get_node(part)
        return str(node._value())
    except Exception:  # noqa: BLE001  (only for the message)
        return None


def _resolve_check(cfg: DictConfig) -> None:
    """Resolve every interpolation of ``cfg`` (without changing it).

    Raises:
        ConfigError: an interpolation names a key that does not exist, an unset environment variable, itself
            (recursion) or an unknown resolver; one line with the key and the fix.
    """
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raw = _raw_value(cfg, key) if key != "?" else None
        shown = f"{key}={raw}" if raw is not None else key
        problem = _first(e).replace("KeyError raised while resolving interpolation: ", "")
        raise ConfigError(f"{shown}: the interpolation cannot be resolved ({problem}): write a value instead "
                          f"(e.g. {key}=VALUE) or fix the ${{...}} reference (${{SECTION.KEY}} of an existing "
                          f"other key, or ${{oc.env:VAR}} with VAR set)") from e


def sweep(overrides: list[str]) -> list[list[str]]:
    """The runs of a multirun: Hydra's BasicSweeper expands ``key=a,b`` (and ``range``/``choice``
    sweeps) into the cartesian product, e.g. ``["variant=a,b", "seed=1,2"]`` -> 4 override lists."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    _check_overrides(overrides, sweeps=True)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
        batches = BasicSweeper.split_arguments(parsed, None)
    except HydraException as e:
        raise _hydra_error(e, list(overrides)) from e
    return [list(job) for batch in batches for job in batch]
