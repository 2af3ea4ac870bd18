"""`python -m study.bench` runs and prints one row per variant and the ratios (figures are not asserted:
speed is measured by the script, never by a timed test)."""
from __future__ import annotations

import re


def test_bench_prints_the_table(nano_project, monkeypatch, capsys):
    from study.bench import main

    monkeypatch.chdir(nano_project)
    assert main(["--quick", "--steps", "2", "--repeats", "2", "--variants", "baseline,nonlinear_q", "model=nano"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(\S+)\s+32-true\s+eager\s+plain\s+([\d,]+) tok/s .* lightning\s+([\d,]+) tok/s .* ratio ([\d.]+)$",
                      out, flags=re.M)
    assert [r[0] for r in rows] == ["baseline", "nonlinear_q"], out
    for _, plain, light, ratio in rows:
        p, li = float(plain.replace(",", "")), float(light.replace(",", ""))
        assert p > 0 and li > 0 and abs(float(ratio) - li / p) < 2e-3
    assert re.search(r"^fastest nonlinear_q .* vs baseline [\d.]+$", out, flags=re.M), out
