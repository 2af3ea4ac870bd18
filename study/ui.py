"""``python -m study.ui [--port 5000]`` (or ``make ui``): the MLflow UI on the project's own store.

Serves ``sqlite:///<root>/mlruns.db`` with artifacts in ``<root>/mlartifacts`` on
127.0.0.1 with one worker, and prints the address.  Stop it with Ctrl-C (or by
its process id).
"""
from __future__ import annotations

import argparse
import os
import sys

from study.config import ConfigError, load_config, project_root
from study.tracking import artifact_location, tracking_uri


def command(port: int) -> list[str]:
    """The mlflow server command line for this project."""
    root = project_root()
    cfg = load_config([], root)
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri(root, cfg.study),
            "--default-artifact-root", artifact_location(root, cfg.study), "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("UI_PORT", 5000)))
    args = parser.parse_args(argv)
    try:
        cmd = command(args.port)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"MLflow UI: http://127.0.0.1:{args.port}  (store {cmd[cmd.index('--backend-store-uri') + 1]})", flush=True)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.execv(sys.executable, cmd)


if __name__ == "__main__":
    sys.exit(main())
