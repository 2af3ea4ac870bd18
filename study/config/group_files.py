"""What the files of conf/'s groups state before a composition reads them: a file's own ``name`` (a group file's
name is its file name) and a scale ladder size's ``position`` (rope-N: rope, bytes-N: learned, else the task's)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .hydra_errors import _yaml_error
from .schema import ConfigError, RunConfig


def stated(config_dir: Path, group: str, choice: str, key: str):
    """The value conf/GROUP/CHOICE.yaml states for ``key`` (None where the file or the key is missing)."""
    import yaml

    path = config_dir / group / f"{choice}.yaml"
    if not path.is_file():
        return None
    try:
        data = OmegaConf.load(path)
    except yaml.YAMLError as e:
        raise _yaml_error(e, config_dir.parent) from e
    if not isinstance(data, DictConfig) or key not in data:
        return None
    return OmegaConf.to_container(data, resolve=False)[key]  # as written: an interpolation is not resolved here


def check_name(config_dir: Path, group: str, choice: str) -> None:
    """A group file that states another name than its own (``name:`` in conf/GROUP/CHOICE.yaml) is refused."""
    said = stated(config_dir, group, choice, "name")
    if said is not None and said != choice:
        raise ConfigError(f"conf/{group}/{choice}.yaml says name: {said}: write name: {choice} "
                          f"(a group file's name is its file name)")


def ladder_position(cfg: RunConfig, config_dir: Path) -> str:
    """The positions every size of the scale ladder trains at: each model file's own ``position`` (rope-N: rope,
    bytes-N: learned), else the task's.

    Raises:
        ConfigError: a size's file states a position that is not a plain ``learned`` or ``rope``, or the sizes train
            at different positions (the ladder compares sizes, not positions); one line.
    """
    own = {m: stated(config_dir, "model", m, "position") for m in cfg.scale_ladder.models}
    bad = {m: p for m, p in own.items() if p not in (None, "learned", "rope")}
    if bad:
        m, p = next(iter(bad.items()))
        raise ConfigError(f"conf/model/{m}.yaml states position: {p}: a scale ladder size names learned or rope, or "
                          f"leaves it out to take the task's (task.position)")
    at = {m: p or cfg.task.position for m, p in own.items()}
    if len(set(at.values())) > 1:
        each = ", ".join(f"{m} {p}" for m, p in at.items())
        raise ConfigError(f"scale_ladder.models={list(at)} train at different positions ({each}): choose sizes of one "
                          f"kind (rope-N: rotary, bytes-N: learned)")
    return next(iter(at.values()))
