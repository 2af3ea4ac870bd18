"""`python -m study.bench` runs and prints one row per variant and the ratios (figures are not asserted:
speed is measured by the script, never by a timed test)."""
from __future__ import annotations

import json
import re

import pytest
import torch


@pytest.mark.slow  # the throughput loops
def test_bench_prints_the_table(nano_project, monkeypatch, capsys, tmp_path):
    from study.bench import main

    monkeypatch.chdir(nano_project)
    path = tmp_path / "bench.json"
    assert main(["--quick", "--steps", "2", "--repeats", "2", "--variants", "baseline,nonlinear_q", "--json", str(path),
                 "model=nano"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(\S+)\s+32-true\s+eager\s+plain\s+([\d,]+) tok/s .* lightning\s+([\d,]+) tok/s .* ratio ([\d.]+)"
                      r"  MFU ([\d.]+)% / ([\d.]+)%$", out, flags=re.M)
    assert [r[0] for r in rows] == ["baseline", "nonlinear_q"], out
    for _, plain, light, ratio, _, _ in rows:
        p, li = float(plain.replace(",", "")), float(light.replace(",", ""))
        assert p > 0 and li > 0 and abs(float(ratio) - li / p) < 2e-3
    assert re.search(r"^fastest nonlinear_q .* vs baseline [\d.]+$", out, flags=re.M), out
    # the same rows in the JSON file, with MFU = tokens/s x FLOPs per token / the measured CPU peak
    saved = json.loads(path.read_text())
    assert saved["model"] == "nano" and saved["steps"] == 2 and saved["repeats"] == 2
    assert [r["variant"] for r in saved["rows"]] == ["baseline", "nonlinear_q"]
    for row, (_, plain, light, _, mfu_p, mfu_l) in zip(saved["rows"], rows):
        assert round(row["plain_tokens_per_s"]) == int(plain.replace(",", ""))
        assert row["mfu_plain"] == pytest.approx(row["plain_tokens_per_s"] * row["flops_per_token"] / row["peak_flops"])
        assert row["mfu_lightning"] * 100 == pytest.approx(float(mfu_l), abs=0.051)
        assert row["peak_memory_plain_bytes"] is None  # CPU: no GPU memory counter
        assert row["plain_range"][0] <= row["plain_tokens_per_s"] <= row["plain_range"][1]


def test_bench_refuses_unknown_modes(nano_project, monkeypatch):
    from study.bench import cli

    monkeypatch.chdir(nano_project)
    assert cli(["--modes", "fast", "model=nano"]) == 2


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989.4e12), ("NVIDIA H100 80GB HBM3", 989.4e12),
                                        ("NVIDIA A100-SXM4-80GB", 312e12)])
def test_gpu_peak_is_the_dense_datasheet_figure(monkeypatch, name, peak):
    """MFU's denominator on GPUs: Lightning's table, except the H200 that it misses (torch names it plainly
    "NVIDIA H200") and lists with sparse figures; the H200 SXM's dense bf16 peak is the H100 SXM's."""
    from lightning.fabric.utilities.throughput import get_available_flops

    from study.runner.throughput import peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    assert peak_flops(torch.device("cuda"), "bf16-mixed") == pytest.approx(peak)
    if "H200" in name:
        assert get_available_flops(torch.device("cuda"), torch.bfloat16) is None  # why study.modeling.lit_module has its own entry
