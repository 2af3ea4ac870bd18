"""The MLflow UI checked in a real browser (``python -m study.ui --check``, ``make ui-check``): the study's runs table
loaded in Debian's headless Chromium through Playwright and compared with the store (every test run listed with its
val_loss, no other run, the arm, seed, group and status columns shown), a screenshot saved."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from study.runfolder.store import tracking_uri
from study.mlflow_ui.server import (HOST, VIEW_FILTER, VIEW_TAGS, experiment_id, free_port, runs_url, start, stop,
                                    study_runs)

CHROMIUM = "chromium-headless-shell"  # Debian's package and command (Playwright's own download is not used)


def chromium(install: bool = False) -> str | None:
    """Path of Debian's headless Chromium, or None.  With ``install``, a missing one is installed with
    ``apt-get install chromium-headless-shell`` (as root, else through ``sudo -n``)."""
    import shutil

    path = shutil.which(CHROMIUM)
    if path or not install or not shutil.which("apt-get"):
        return path
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None:
        return None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"installing {CHROMIUM} (apt-get) ...", file=sys.stderr, flush=True)
    for cmd in (["apt-get", "install", "-y", "-qq", "--no-install-recommends", CHROMIUM],
                ["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", CHROMIUM]):
        subprocess.run(prefix + cmd, env=env, stdout=subprocess.DEVNULL, check=False)
        if shutil.which(CHROMIUM):
            break
    return shutil.which(CHROMIUM)


def row_problems(page, run: dict) -> list[str]:
    """What the loaded runs table (a Playwright page) gets wrong about one test run of :func:`study_runs`: not listed,
    no run name, or a val_loss other than the store's (1e-6 relative; "-" for a run without one)."""
    row = page.locator(f'.ag-row[row-id="{run["run_id"]}"]')
    if row.count() == 0:
        return [f"{run['name']}: not listed"]
    out = []
    if run["name"] not in " ".join(row.all_inner_texts()):  # pinned name column + the rest
        out.append(f"{run['name']}: row {run['run_id']} does not show the run name")
    cell = page.locator(f'.ag-row[row-id="{run["run_id"]}"] [col-id="metrics.`val_loss`"]')
    shown = cell.first.inner_text().strip() if cell.count() else None
    if run["val_loss"] is None:
        return out + ([f"{run['name']}: val_loss shown as {shown!r}, none in the store"] if shown not in ("-", "")
                      else [])
    try:
        ok = abs(float(shown) - run["val_loss"]) <= 1e-6 * abs(run["val_loss"])
    except (TypeError, ValueError):
        ok = False
    return out + ([] if ok else [f"{run['name']}: val_loss shown as {shown!r}, {run['val_loss']!r} in the store"])


def page_problems(page, runs: list[dict]) -> list[str]:
    """What the loaded runs table gets wrong: a test run wrong (:func:`row_problems`), another run listed (the
    default view shows the test runs alone), or a column of :data:`VIEW_TAGS` not shown."""
    out = [p for r in runs if r["role"] == "test" for p in row_problems(page, r)]
    out += [f"{r['name']}: listed, but the default view shows the test runs alone ({VIEW_FILTER})"
            for r in runs if r["role"] != "test" and page.locator(f'.ag-row[row-id="{r["run_id"]}"]').count()]
    out += [f"column {t!r} not shown" for t in VIEW_TAGS
            if page.locator(f'.ag-header-cell[col-id="tags.`{t}`"]').count() == 0]
    return out


def load_page(browser: str, url: str, first: str, shot: Path, timeout: float, runs: list[dict]) -> list[str]:
    """Open ``url`` in headless Chromium (``browser``: its executable), wait for the row of run id ``first``, check
    the table (:func:`page_problems`) and save a full-page screenshot to ``shot``; the problems found."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=browser)
        try:
            page = b.new_page(viewport={"width": 2400, "height": max(720, 400 + 44 * len(runs))})
            page.goto(url)
            page.locator(f'.ag-row[row-id="{first}"]').first.wait_for(timeout=timeout * 1000)
            close = page.get_by_role("button", name="Close")  # the MLflow Assistant side panel
            if close.count() == 1:
                close.click()
            page.wait_for_timeout(1000)
            problems = page_problems(page, runs)
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            return problems
        finally:
            b.close()


def check(root: Path, study, screenshot: Path, browser: str, timeout: float = 120.0, base_url: str | None = None
          ) -> list[str]:
    """Load the study's runs table in headless Chromium (``browser``: its executable) through Playwright
    and compare it with the store: by default it lists the test runs alone (tag ``role=test``), each (found by run
    id) with its name and its last val_loss, and shows the arm, seed, group and status columns
    (:func:`page_problems`).  Saves a full-page screenshot to ``screenshot``.  Starts its own server unless
    ``base_url`` names a running one.  Returns the problems found (empty: the check holds).

    Raises:
        RuntimeError: no test runs in the store, or the server does not start.
    """
    runs = study_runs(root, study)
    tests = [r for r in runs if r["role"] == "test"]
    if not tests:
        raise RuntimeError(f"no test runs of experiment {study.name!r} in {tracking_uri(root, study)}: "
                           f"run the study first (make study)")
    proc = None
    if base_url is None:
        port = free_port()
        proc = start(port, root, study, timeout=timeout)
        base_url = f"http://{HOST}:{port}"
    try:
        url = runs_url(base_url, experiment_id(root, study))
        return load_page(browser, url, tests[0]["run_id"], screenshot, timeout, runs)
    finally:
        if proc is not None:
            stop(proc)
