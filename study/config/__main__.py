"""``python -m study.config [OVERRIDE ...]``: compose conf/ as DVC's Hydra mode does (``dvc exp run``) and
write it to params.yaml, the file dvc.yaml's stages read (``make params``; ``make study`` runs it first).

Run it after editing conf/ when you then call ``dvc repro`` yourself; ``dvc exp run`` composes params.yaml
on its own.  ``python -m study.config --check`` (dvc.yaml's ``check_params`` stage, run whenever conf/
changes) writes nothing and fails when params.yaml is not conf/ composed (or is malformed).  A bad
override or conf/ file, or a config a stage would refuse (checked as the stages check it), stops with one
line ``error: ...`` (exit 2) and writes nothing.
"""
from __future__ import annotations

import sys

from .compose import PARAMS_FILE, composed_params, load_params, project_root, stale_message, stale_sections
from .schema import ConfigError, StudyError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    try:
        root = project_root()
        if "--check" in argv and argv != ["--check"]:
            raise ConfigError(f"--check takes nothing else (it checks params.yaml against conf/ composed as it is); "
                              f"got {[a for a in argv if a != '--check']}: run `python -m study.config --check` alone")
        if argv == ["--check"]:
            path = root / PARAMS_FILE
            if not path.is_file():
                raise ConfigError(f"{PARAMS_FILE} not found: run `make params`")
            stale = stale_sections(root, load_params(path))  # a malformed params.yaml is refused in one line
            if stale:
                raise ConfigError(stale_message(PARAMS_FILE, stale))
            print(f"{PARAMS_FILE} is conf/ composed")
            return 0
        text = composed_params(root, argv)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = root / PARAMS_FILE
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
        print(f"wrote {PARAMS_FILE} (conf/ composed{' with ' + ' '.join(argv) if argv else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
