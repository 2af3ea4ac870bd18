"""``python -m study.ui [--port 5000] [--no-open] [key=value ...]`` (or ``make ui``): the MLflow UI on the project's own
store (or the one ``study.tracking_db=PATH study.artifact_dir=PATH`` name; ``MLFLOW_TRACKING_URI`` wins over both).

Serves ``sqlite:///<root>/mlruns.db`` on 127.0.0.1 with one worker, with the runs' artifacts
proxied from ``<root>/mlartifacts`` (``mlflow-artifacts:/`` locations, see study/runner/tracking.py, so a
moved project folder still serves them), waits until it answers, then prints and opens (where a
browser is available) the URL of the study's runs table: a shared view of the MLflow UI (experiment
tag ``mlflow.sharedViewState.runs``, URL ``?viewStateShareKey=runs``) that lists the verdict's test runs
(search filter ``tags.role = 'test'``; clear it to see every run) sorted by ``val_loss`` with the val_loss,
val_perplexity, status, arm, seed, group, variant, model and lr columns shown.  Stop it with Ctrl-C (or by its
process id).

``python -m study.ui --check [--screenshot reports/ui_runs.png]`` (``make ui-check``): the same UI
in a real headless browser (Debian's chromium-headless-shell driven by Playwright): loads the runs
page and checks that it lists every test run of the study with its val_loss and no other run, and shows the
arm, seed, group and status columns, then saves a screenshot.  Exit 0 when it holds, 1 when not, 2 when the browser or the runs are missing.

The server and the view are ``study.mlflow_ui.server``, the check ``study.mlflow_ui.browser_check``; this module parses, calls and reports.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from study.config import ConfigError, load_config, project_root
from study.config.stage import StageParser
from study.mlflow_ui.browser_check import CHROMIUM, check, chromium
from study.mlflow_ui.server import HOST, experiment_id, runs_url, start, stop, study_runs
from study.runfolder.store import tracking_uri
from study.runner.tracking import artifact_root


def _port(text: str) -> int:
    """argparse type: a TCP port the server can bind (1-65535)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give one in 1-65535 (--port or UI_PORT)") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a TCP port: give one in 1-65535, e.g. --port 5000 (or UI_PORT)")
    return n


def _check(args, root: Path, study) -> int:
    browser = chromium(install=args.install)
    if browser is None:
        print(f"error: {CHROMIUM} not found: `apt-get install {CHROMIUM}` (Debian), or `make ui-check`, "
              f"which installs it", file=sys.stderr)
        return 2
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("error: playwright is not installed: `pip install playwright==1.65.2` (the dev extra; "
              "its own browser download is not needed)", file=sys.stderr)
        return 2
    screenshot = Path(args.screenshot) if args.screenshot else root / study.reports_dir / "ui_runs.png"
    try:
        problems = check(root, study, screenshot, browser)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = sum(r["role"] == "test" for r in study_runs(root, study))
    for p in problems:
        print(f"ui-check: {p}", file=sys.stderr)
    print(f"ui-check: {'problems above' if problems else 'the test runs alone listed'}: {n} test runs of "
          f"{study.name!r}, their val_loss, arm, seed, group and status in the MLflow UI (headless {CHROMIUM}); "
          f"screenshot {screenshot}")
    return 1 if problems else 0


def _args(argv: list[str] | None):
    """(options, key=value overrides) of the command line.  Raises: ConfigError (one line) on a bad one."""
    parser = StageParser("python -m study.ui")
    parser.add_argument("--port", type=_port, default=os.environ.get("UI_PORT", "5000"))  # a str default is typed too
    parser.add_argument("--no-open", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--screenshot")
    args, overrides = parser.parse_known_args(argv)
    odd = [a for a in overrides if "=" not in a or a.startswith("-")]
    if odd:  # key=value overrides (study.tracking_db=..., study.artifact_dir=...) go to the config; nothing else
        parser.error(f"unrecognized arguments: {' '.join(odd)} (the options, or key=value overrides such as "
                     f"study.tracking_db=PATH study.artifact_dir=PATH)")
    lone = [o for o, v in (("--screenshot", args.screenshot), ("--install", args.install)) if v and not args.check]
    if lone:
        parser.error(f"{' and '.join(lone)} go{'es' if len(lone) == 1 else ''} with --check (the browser check); "
                     f"add --check, or drop {' '.join(lone)} to serve the UI")
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    try:
        args, overrides = _args(argv)
        root = project_root()
        study = load_config(overrides, root).study
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        return _check(args, root, study)
    import signal

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)  # `kill PID` of this process stops the server too
    try:
        proc = start(args.port, root, study)
    except RuntimeError as e:
        print(f"error: {e}: is port {args.port} in use? (UI_PORT=... or --port to change)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    try:
        return _serve(proc, args, root, study)
    except KeyboardInterrupt:
        return 0
    finally:
        stop(proc)


def _serve(proc: subprocess.Popen, args, root: Path, study) -> int:
    url = runs_url(f"http://{HOST}:{args.port}", experiment_id(root, study))
    print(f"MLflow UI: {url}\n  (store {tracking_uri(root, study)}, artifacts {artifact_root(root, study)}; "
          f"Ctrl-C stops it)", flush=True)
    if not args.no_open and (sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY")
                             or os.environ.get("WAYLAND_DISPLAY")):  # a desktop: never a console browser
        import webbrowser
        webbrowser.open(url)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
