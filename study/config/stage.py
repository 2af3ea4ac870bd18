"""The stage runner every ``python -m study.NAME`` shares: ``--help``, ``--cfg job``, ``-m`` (multirun),
``--params FILE``, Hydra overrides, and one ``error: ...`` line for every :class:`StudyError`."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from omegaconf import OmegaConf

from . import compose
from .compose import available, load_config, project_root, sweep
from .numerics import check_numerics_setting
from .schema import GROUPS, ConfigError, RunConfig, StudyError


class StageParser(argparse.ArgumentParser):
    """argparse for a stage's own options, with its mistakes in the project's form: a :class:`ConfigError` (one line
    naming the option and the fix; the stage prints ``error: ...`` and returns 2) instead of argparse's usage block
    and exit.  Options are never abbreviated (``--tar`` is not ``--targets``)."""

    def __init__(self, prog: str):
        super().__init__(prog=prog, add_help=False, allow_abbrev=False)

    def error(self, message: str):
        raise ConfigError(f"{message} ({self.prog} --help lists the options)")


def _usage(body, root: Path | None) -> str:
    doc = (sys.modules[body.__module__].__doc__ or "").strip()
    how = (compose.__doc__ or "").split("Overrides are Hydra's")[1].split("Every mistake")[0]
    lines = [doc, "", "Overrides are Hydra's" + how.rstrip(), "", "Config groups (conf/GROUP/NAME.yaml):"]
    if root is not None:
        for g in GROUPS:
            lines.append(f"  {g}: {', '.join(available(root, g))}")
    lines += ["", "Sections: " + ", ".join(f.name for f in dataclasses.fields(RunConfig))
              + " (every key: study/config/schema.py; the composed values: --cfg job)"]
    return "\n".join(lines)


def stage_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """A stage's ``--params FILE`` and its key=value overrides, as :func:`run_stage` reads the same command line (the
    stage's own options, such as ``--dry-run``, taken out first).  A malformed line gives (None, []): run_stage then
    refuses it in one line."""
    try:
        opts, rest = _parse_argv(argv)
    except ConfigError:
        return None, []
    return opts["params"], rest


def _parse_argv(argv: list[str], own: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """({"help", "cfg", "multirun", "params"}, the overrides) of a stage's command line; ``own``: the stage's own
    options (parsed before), named beside the common ones when an option is unknown."""
    opts = {"help": False, "cfg": None, "multirun": False, "params": None}
    rest, it = [], iter(argv)
    for a in it:
        if a in ("--help", "-h"):
            opts["help"] = True
        elif a in ("-m", "--multirun"):
            opts["multirun"] = True
        elif a in ("--cfg", "-c", "--params") or a.startswith(("--cfg=", "--params=")):
            key = "params" if a.startswith("--params") else "cfg"
            value = a.split("=", 1)[1] if "=" in a else next(it, None)
            if value is None or (value.startswith("-") and "=" not in a):
                raise ConfigError(f"{a} needs a value: --cfg job, --params params.yaml")
            opts[key] = value
        elif a.startswith("-"):
            raise ConfigError(f"unknown option {a.split('=', 1)[0]} (see --help): the options are "
                              f"{', '.join(['--help', '--cfg job', '-m/--multirun', '--params FILE', *own])}; "
                              f"everything else is a key=value override")
        else:
            rest.append(a)
    if opts["cfg"] not in (None, "job", "all"):
        raise ConfigError(f"--cfg {opts['cfg']}: only --cfg job (the composed config) is printed here")
    return opts, rest


#: the one line of a stage stopped by Ctrl-C (study.train, study.tune, study.test_runs), exit status 130
INTERRUPTED = ("error: {stage} interrupted (Ctrl-C): run the same command again to go on (finished runs are reused, "
               "a started run resumes from its last checkpoint)")


def run_stage(body, argv: list[str] | None = None, interruptible: str | None = None, own: tuple[str, ...] = ()) -> int:
    """Run a stage CLI: compose the config from Hydra overrides ``argv`` (default sys.argv[1:]), call
    ``body(cfg, root)`` and return its exit code.

    ``--help`` prints the stage's docstring, how overrides work and every group's options;
    ``--cfg job`` prints the composed config as YAML and runs nothing; ``-m`` runs ``body`` once per
    combination of swept values, one after another (all composed and validated first); ``--params
    FILE`` starts from a composed config (DVC's params.yaml).  A :class:`StudyError` prints one line
    ``error: ...`` on stderr and returns 2.  With ``interruptible`` (the stage's name, e.g. "study.tune": a stage
    whose trainings end KILLED with their locks released on Ctrl-C), Ctrl-C prints :data:`INTERRUPTED` and returns
    130; without it, KeyboardInterrupt propagates.  ``own``: the stage's own options (taken out of ``argv`` before),
    which the one line of an unknown option names beside the common ones."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts, overrides = _parse_argv(argv, own)
        if opts["help"]:
            try:
                root = project_root()
            except ConfigError:
                root = None
            print(_usage(body, root))
            return 0
        root = project_root()
        check_numerics_setting()  # STUDY_NUMERICS, once, before any training starts (study/config/numerics.py)
        jobs = sweep(overrides) if opts["multirun"] else [overrides]
        cfgs = [load_config(job, root, params=opts["params"]) for job in jobs]
        if opts["cfg"]:
            print("\n---\n".join(OmegaConf.to_yaml(c, resolve=True) for c in cfgs), end="")
            return 0
        rc = 0
        for k, (job, cfg) in enumerate(zip(jobs, cfgs)):
            if opts["multirun"]:
                print(f"[multirun {k + 1}/{len(jobs)}] {' '.join(job)}", file=sys.stderr, flush=True)
            rc = body(cfg, root)
            if rc:
                break
        return rc
    except KeyboardInterrupt:
        if interruptible is None:
            raise
        print(INTERRUPTED.format(stage=interruptible), file=sys.stderr)
        return 130
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be written (a file where a run folder goes, a full disk ...)
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {e.strerror or e}{where}: fix or remove that path, then run the same command again",
              file=sys.stderr)
        return 2
    except Exception as e:  # Lightning's own refusals (accelerator, precision, strategy) in one line
        if type(e).__name__ != "MisconfigurationException":
            raise
        print(f"error: trainer settings: {str(e).splitlines()[0]}: fix conf/trainer or trainer.* overrides",
              file=sys.stderr)
        return 2
