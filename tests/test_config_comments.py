"""Config comments say what a key is and why; what was measured lives in docs, dated, where this test keeps it true.

- No comment of conf/ carries a measurement (nats, a speed-up, a share in %, minutes, tokens/s, seeds that failed):
  such numbers change with the code and the machine.  Left aside: the sections that the tuning owns and rewrites
  with its own dated numbers (conf/study.yaml's ``study``, ``tune`` and ``arms`` sections, conf/tuned.yaml,
  conf/tuning/, conf/model/).
- docs/configuration.md's "Why these defaults" table holds those measurements, each row dated; each row names a
  key and the value it was measured for, and that value is still the key's default: change the default and this
  test sends you to measure it again (or to say in the row that it is no longer measured).
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MEASURED = re.compile(r"\d[\d.,]*\s*(?:x\b|nats\b|%|tokens/s|GFLOP|min\b|minutes\b|s per run)"
                      r"|\b\d[\d.]*M\s+(?:GPT-2\s+)?tokens\b|\b\d+(?:-\d+)? of \d+ seeds\b", re.I)
#: conf/study.yaml's sections whose comments the tuning writes (measured and dated there, by `make tune`'s owner)
TUNING_SECTIONS = ("study", "tune", "arms")
SKIP = ("conf/tuned.yaml", "conf/tuning/", "conf/model/")


def comments(path: Path) -> list[tuple[int, str, str]]:
    """[(line number, top-level section, comment text)] of a YAML file (a ``#`` outside quotes); a comment at the
    margin belongs to no section ("")."""
    out, section = [], ""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if re.match(r"^[A-Za-z_]\w*:", line):
            section = line.split(":", 1)[0]
        elif line.startswith("#"):  # a comment at the margin introduces what follows: the file's own
            section = ""
        quote = None
        for j, ch in enumerate(line):
            if ch in "\"'" and quote in (None, ch):
                quote = None if quote else ch
            elif ch == "#" and quote is None:
                out.append((i, section, line[j + 1:].strip()))
                break
    return out


def measured_comments(root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / "conf").rglob("*.yaml")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(SKIP):
            continue
        for i, section, text in comments(path):
            if rel == "conf/study.yaml" and section in TUNING_SECTIONS:
                continue
            if MEASURED.search(text):
                bad.append(f"{rel}:{i}: {text}")
    return bad


def test_measurements_in_comments_are_found(tmp_path):
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "study.yaml").write_text("study:\n  jobs: 2  # 1.28x one run\ntrain:\n  lr: 1  # the peak lr\n"
                                     "  batch_tokens: 2048  # 0.23 nats below 4096\n  x: '#1'  # 1-3 of 5 seeds failed\n"
                                     "study2: 1\n# the follow-up's 88%\nstudy:\n  a: 1  # 2 min\n")
    (conf / "model/m.yaml").write_text("a: 1  # 40x slower\n")
    (conf / "d.yaml").write_text("# 5.3M GPT-2 tokens of English\nv: 2  # ~0.05% held out, in 3 min\n")
    assert measured_comments(tmp_path) == ["conf/d.yaml:1: 5.3M GPT-2 tokens of English",
                                           "conf/d.yaml:2: ~0.05% held out, in 3 min",
                                           "conf/study.yaml:5: 0.23 nats below 4096",
                                           "conf/study.yaml:6: 1-3 of 5 seeds failed",
                                           "conf/study.yaml:8: the follow-up's 88%"]


def test_config_comments_carry_no_measurements():
    bad = measured_comments()
    assert not bad, ("measurements in config comments: move each to docs/configuration.md's \"Why these defaults\" "
                     "table (dated) and let the comment say what and why:\n" + "\n".join(bad))


def why_rows(text: str) -> list[dict]:
    """The rows of docs/configuration.md's "Why these defaults" table: file, key, value, why, date."""
    part = text.split("## Why these defaults", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`conf/"):
            rows.append(dict(zip(("file", "key", "value", "why", "measured"), (c.strip("`") for c in cells))))
    return rows


def _value(file: str, key: str):
    """The default of ``key`` in ``file``: conf/study.yaml composed (the typed schema and the chosen groups) for the
    study's keys, the YAML itself for any other file."""
    if file == "conf/study.yaml":
        from study.config import load_config

        node = load_config([], ROOT)
        for part in key.split("."):
            node = node[part]
        return node
    node = yaml.safe_load((ROOT / file).read_text())
    for part in key.split("."):
        node = node[part]
    return node


def test_every_measured_default_is_dated_and_still_the_default():
    rows = why_rows((ROOT / "docs/configuration.md").read_text())
    assert {(r["file"], r["key"]) for r in rows} >= {("conf/study.yaml", "train.batch_tokens"),
                                                     ("conf/study.yaml", "train.warmup_tokens"),
                                                     ("conf/trainer/cpu.yaml", "precision"),
                                                     ("conf/levers.yaml", "lr")}
    undated = [r["key"] for r in rows if not DATE.search(r["measured"])]
    assert undated == [], f"rows without the date of their measurement: {undated}"
    moved = [f"{r['file']} {r['key']}: {_value(r['file'], r['key'])!r} now, measured at {r['value']}" for r in rows
             if str(_value(r["file"], r["key"])) != str(yaml.safe_load(r["value"]))]
    assert moved == [], ("defaults changed since they were measured: measure them again and update the row "
                         f"in docs/configuration.md: {moved}")
