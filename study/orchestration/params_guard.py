"""The guard of a driver stage (study.test_runs, study.ladder_runs) against a params.yaml that changed while it trained:
DVC writes dvc.lock from the params it reads after the command, so a stage that ended well would record new values for
runs trained at the old ones."""
from __future__ import annotations

from pathlib import Path

import yaml

from study.config import StudyError


def params_snapshot(params: str | None) -> dict | None:
    """The content of ``params`` (params.yaml, parsed) as the stage starts; None without --params or when unreadable."""
    if params is None:
        return None
    try:
        return yaml.safe_load(Path(params).read_text())
    except (OSError, yaml.YAMLError):
        return None


def check_params_unchanged(params: str | None, before: dict | None, what: str, stage: str) -> None:
    """Refuse to end well when ``params`` (params.yaml) no longer holds what it held when the stage started
    (``before``, :func:`params_snapshot`): conf/ edited and `make params` run while the stage trained.  ``what``: the
    stage in words (``"test"``); ``stage``: its DVC name (``"test_runs"``).  DVC writes
    dvc.lock from the params it reads after the command, so a stage that ended well would record the new values for
    runs trained at the old ones, and every later `dvc repro` would skip it.

    Raises:
        StudyError: one line naming the sections that changed and the command that trains at the new values.
    """
    if params is None or before is None:
        return
    after = params_snapshot(params)
    if after == before:
        return
    keys = sorted(set(before) | set(after or {}), key=str)
    changed = [k for k in keys if (after or {}).get(k) != before.get(k)] or ["its content"]
    raise StudyError(f"{params} changed while the {what} stage ran ({', '.join(map(str, changed))}: conf/ edited and "
                     f"`make params` run?): the {what} runs were trained at the values it held when the stage started, "
                     f"so the stage fails rather than let dvc.lock record the new values for them; run `dvc repro -f "
                     f"{stage}` (or `dvc repro`): it trains what the new values ask for, reusing every finished "
                     f"run that still matches")
