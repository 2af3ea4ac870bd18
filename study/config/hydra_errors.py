"""Hydra's and OmegaConf's errors as one-line :class:`ConfigError` messages that name the key or file and
the fix (the closest existing key for a typo, the line of a conf/ file that is not YAML)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from .schema import GROUPS, ConfigError, RunConfig

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def _unparsable(overrides) -> str | None:
    """The first of ``overrides`` that Hydra's override grammar cannot parse on its own, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides or []:
        try:
            parser.parse_overrides([o])
        except Exception:  # noqa: BLE001  (hydra's OverrideParseException and what it wraps)
            return o
    return None


def _first(text: object) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else ""


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or while handling (``__cause__``, ``__context__``)."""
    out: list[BaseException] = []
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _yaml_error(e: Exception, root: Path | None) -> ConfigError:
    """One line for a YAML error in a file: ``conf/model/nano.yaml: found duplicate key n_layer (line 3)``."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = str(getattr(mark, "name", "") or "a YAML file")
    if root is not None:
        try:
            where = Path(where).resolve().relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    problem = getattr(e, "problem", None) or _first(e)
    line = f" (line {mark.line + 1})" if mark is not None else ""
    return ConfigError(f"{where}: {problem}{line}: fix the file's YAML (one key per line, key: value, "
                       f"brackets closed)")


def _conf_file(text: str) -> str | None:
    """``In 'model/nano': ...`` (Hydra, composing a file of conf/) -> ``conf/model/nano.yaml``."""
    if text.startswith("In '") and "'" in text[4:]:
        return f"conf/{text[4:].split(chr(39), 1)[0]}.yaml"
    return None


def schema_keys() -> list[str]:
    """Every key of the typed schema, dotted (``train.lr``), sections included (``train``)."""
    keys: list[str] = []

    def walk(cls, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            keys.append(prefix + f.name)
            sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(sub):
                walk(sub, f"{prefix}{f.name}.")
    walk(RunConfig, "")
    return keys


#: keys the schema no longer has, and what took their place (the fix an unknown-key error names)
REMOVED_KEYS = {
    "data.bpe_vocab_size": "the vocabulary is data.tokenizer with data.vocab_size: data.tokenizer=bpe "
                           "data.vocab_size=N for a BPE, data.tokenizer=bytes for 257 (its old 257)",
    "model.vocab_size": "the model's rows follow the prepared data's vocabulary (data.tokenizer, data.vocab_size); "
                        "model.vocab_multiple pads them (gpt3-small: 64)",
    "variant.lr": "a run's peak lr is its arm's, not the variant's: arm.lr=LR (None: train.lr)",
    "variant.min_lr": "a run's final lr is its arm's, not the variant's: arm.min_lr=LR (None: train.min_lr's ratio)",
    "study.variants": "every comparison is of arms: list them in study.arms (a shared-lr comparison: arms at one fixed "
                      "arms.NAME.lr, e.g. 'study.arms=[baseline,nonlinear_q]' arms.baseline.lr=3e-3 "
                      "arms.nonlinear_q.lr=3e-3)",
}


def _key_hint(key: str) -> str:
    """The fix for an unknown key: what replaced a removed key (:data:`REMOVED_KEYS`), else the closest keys of the
    schema (difflib), else where the keys are."""
    import difflib

    if key.lstrip("+") in REMOVED_KEYS:
        return f"it was removed: {REMOVED_KEYS[key.lstrip('+')]}"

    parts = key.lstrip("+").split(".")
    if len(parts) == 2 and parts[0] == "task":
        return _task_key_hint(parts[1])
    keys = schema_keys()
    parents = {k.rsplit(".", 1)[0] if "." in k else "" for k in keys}
    parent = ".".join(parts[:-1])
    if parent and parent not in parents:  # a typo in the section: the closest section, same key
        fixed = difflib.get_close_matches(parent, [p for p in parents if p], n=1, cutoff=0.6)
        parent = fixed[0] if fixed else parent
    siblings = [k.rsplit(".", 1)[-1] for k in keys if (k.rsplit(".", 1)[0] if "." in k else "") == parent]
    close = [f"{parent}.{m}" if parent else m for m in difflib.get_close_matches(parts[-1], siblings, n=3, cutoff=0.6)]
    where = "the keys are the fields of study/config/schema.py; --cfg job prints them"
    if close:
        return f"did you mean {' or '.join(close)}? fix the spelling ({where})"
    return f"fix the spelling ({where})"


def _task_key_hint(field: str) -> str:
    """The fix for an unknown ``task.FIELD``: the task whose setting it is, else the closest settings of any task."""
    import difflib

    from .task import COMMON_FIELDS, task_fields, task_names

    owners = [t for t in task_names() if field in (task_fields(t) or ())]
    if owners:
        return (f"it is a setting of task {' and '.join(owners)} (task={owners[0]}), not of this run's task (a task's "
                f"settings are its module's Settings, study/tasks/<NAME>.py)")
    known = sorted({f for t in task_names() for f in (task_fields(t) or ())} | set(COMMON_FIELDS))
    owner = {f: t for t in task_names() for f in (task_fields(t) or ())[1:]}  # a task's own setting: which task's

    close = [f"task.{m}" + (f" (task={owner[m]})" if m in owner else "")
             for m in difflib.get_close_matches(field, known, n=3, cutoff=0.6)]
    return (f"{'did you mean ' + ' or '.join(close) + '? ' if close else ''}fix the spelling (a task's settings are "
            f"its module's Settings, study/tasks/<NAME>.py; --cfg job prints this run's)")


def _unknown_key(key, conf_file: str | None, cause) -> ConfigError:
    """An unknown key: in a file (conf/..., or params.yaml as load_config composes it under DVC) or an override."""
    if conf_file and "_params_base" in conf_file:
        conf_file = "params.yaml"
    if conf_file and str(key) in REMOVED_KEYS:
        return ConfigError(f"unknown key {key!r} in {conf_file}: {_key_hint(str(key))}; delete it from the file")
    if conf_file:
        return ConfigError(f"unknown key {key!r} in {conf_file} ({_first(cause)}): fix the spelling in the file (the "
                           f"keys are the fields of study/config/schema.py)")
    return ConfigError(f"unknown key {key!r} ({_first(cause)}): {_key_hint(str(key))}")


def _hydra_error(e: Exception, overrides: list[str], root: Path | None = None) -> ConfigError:
    """One line for one of Hydra's (or OmegaConf's) composition errors: the problem and the fix.  The
    exception's chain (``__cause__``, ``__context__``) is followed to OmegaConf's own error, which names the key."""
    import yaml
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    chain = _chain(e)
    bad_yaml = next((c for c in chain if isinstance(c, yaml.YAMLError)), None)
    if bad_yaml is not None:
        return _yaml_error(bad_yaml, root)
    cause = next((c for c in chain[1:] if isinstance(c, OmegaConfBaseException)), e.__cause__)
    if isinstance(e, MissingConfigException):
        missing = str(getattr(e, "missing_cfg_file", "") or "")
        if "/" in missing and e.options is not None:
            group, name = missing.split("/", 1)
            return ConfigError(f"unknown {group} {name!r}: choose one of {sorted(e.options)} "
                               f"(files conf/{group}/*.yaml)")
        if missing and "/" not in missing and root is not None and not (root / "conf" / f"{missing}.yaml").is_file():
            # a file conf/study.yaml's defaults list names (conf/tuned.yaml, tracked) was deleted: not a misspelt name
            tracked = "; it is tracked: `git checkout conf/tuned.yaml` restores it" if missing == "tuned" else ""
            return ConfigError(f"conf/{missing}.yaml is missing (conf/study.yaml's defaults list reads it){tracked}"
                               f"{'' if tracked else ': restore it (git checkout conf/' + missing + '.yaml)'}"
                               f"{' (or `make tune` writes it anew)' if missing == 'tuned' else ''}")
        return ConfigError(f"{_first(e)}: fix the name (groups: {', '.join(GROUPS)})")
    if isinstance(e, OverrideParseException):
        text = str(e)
        if "missing EQUAL" in text:
            bad = text.split("'")[1] if "'" in text else text
            return ConfigError(f"override {bad!r} has no '=': write key=value, e.g. variant=nonlinear_q")
        bad = _unparsable(overrides)
        where = f"bad override ({bad}): {_first(text)}" if bad else f"bad override ({_first(text)}) in {overrides}"
        return ConfigError(f"{where}: fix its syntax ({GRAMMAR})")
    if isinstance(e, ConfigCompositionException):
        text = _first(e)
        conf_file = _conf_file(text)
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
            return _unknown_key(getattr(cause, "full_key", None) or text, conf_file, cause)
        if isinstance(cause, ValidationError):
            if conf_file:
                key = getattr(cause, "full_key", None)
                return ConfigError(f"{conf_file}: {key + ': ' if key else ''}{_first(cause)}: fix the value's type "
                                   f"in the file")
            return ConfigError(f"{text.removeprefix('Error merging override ')}: {_first(cause)}: fix the value's type")
        if conf_file and cause is not None:
            key = getattr(cause, "full_key", None)
            return ConfigError(f"{conf_file}: {key + ': ' if key else ''}{_first(cause)}: fix the file")
        if text.startswith("Ambiguous value"):
            return ConfigError(f"{text}: sweep it with -m (--multirun), or write a list as key=[a,b]")
        return ConfigError(f"{text}{': ' + _first(cause) if cause else ''}: fix the override or conf/")
    if isinstance(e, OmegaConfBaseException):
        key = getattr(e, "full_key", None)
        return ConfigError(f"{'key ' + repr(key) + ': ' if key else ''}{_first(e)}: fix conf/ or the override")
    return ConfigError(f"{type(e).__name__}: {_first(e)}: fix conf/ (is every file valid YAML?)")
