"""A driver stage (study.test_runs, study.ladder_runs: one stage that decides its runs and trains them through the
launcher): its command line (:func:`driver_main`) and its guard against a params.yaml that changed while it trained
(DVC writes dvc.lock from the params it reads after the command, so a stage that ended well would record new values
for runs trained at the old ones)."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from study.config import StudyError, run_stage
from study.config.stage import stage_args


def driver_main(argv: list[str] | None, run, what: str, stage: str, module: str) -> int:
    """The ``main()`` of a driver stage, ``python -m MODULE [--params params.yaml] [--dry-run] [overrides]``:
    ``run(cfg, root, params, base, dry=)`` trains (or with ``--dry-run`` prints) its runs, then the stage fails in one
    line when params.yaml changed meanwhile (:func:`check_params_unchanged`; ``what``: the stage in words, ``stage``:
    its DVC name).  Ctrl-C stops each training and marks it KILLED (study.config.run_stage).

    Returns: the exit status (0; 2 after a one-line error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-m", "--multirun") for a in argv):
        print(f"error: {module} does not sweep (-m): it decides and trains its own set of runs; run it once per "
              f"value (under DVC: one `dvc exp run -S KEY=VALUE` each)", file=sys.stderr)
        return 2
    dry = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    params, base = stage_args(argv)
    before = params_snapshot(params)  # the values the runs train at: params.yaml as the stage starts

    def body(cfg, root: Path) -> int:
        run(cfg, root, params, base, dry=dry)
        if not dry:
            check_params_unchanged(params, before, what, stage)
        return 0
    return run_stage(body, argv, interruptible=module, own=("--dry-run",))


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
