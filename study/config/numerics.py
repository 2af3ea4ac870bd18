"""The numerics a run computes under: CPU kernels pinned to one vector ISA, and what a run records of its machine.

Unpinned, PyTorch's CPU kernels follow the machine: ATen picks its AVX-512 kernels where the CPU has them, MKL and
oneDNN pick theirs by CPU kind (AMX on recent Intel Xeons), and each sums in another order, so the same run ends
up to 0.017 nats apart on two x86 CPUs.  Pinned (the default), every process that imports ``study`` sets, before
torch is imported:

    ATEN_CPU_CAPABILITY=avx2   ATen's vectorised kernels (torch/csrc: at::get_cpu_capability)
    MKL_CBWR=AVX2              MKL's conditional numerical reproducibility (CNR) at its AVX2 branch
    ONEDNN_MAX_CPU_ISA=AVX2    oneDNN's kernels at most AVX2 (no AVX-512, no AMX)

and a run's losses are the same floats on CPUs of one vendor with AVX2 at the same thread count (measured on AMD
EPYCs with AVX2 only and with AVX-512; docs/benchmarks.md: what it costs).  Not across vendors: MKL's AVX2 branch is
Intel's alone, any other CPU takes its AUTO branch (MKL's developer guide, "Specifying Code Branches"), and the two sum
in other orders; measured 2026-12-07 (docs/history.md), an Intel Xeon's arm means end up to 0.003 nats from an AMD
EPYC's after 1,024 steps (0.004 in MKL's strict mode, ``AVX2,STRICT``).  So the key holds the CPU's vendor.  ``STUDY_NUMERICS=native`` (set before the process
starts) leaves the kernels to the machine.  Settings already in the environment are kept (a user's own pin).

A run records :func:`numerics_key` (what must agree for two runs to pair or a checkpoint to resume: device,
CPU vendor, kernels, torch version, threads; the CPU model only when unpinned) and :func:`machine_record` (what it ran on:
CPU model, vendor, vector flags, MKL and oneDNN versions).
"""
from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

#: the environment variable that turns the pin off (``native``) or on (``avx2``, the default)
NUMERICS_ENV = "STUDY_NUMERICS"
NUMERICS_MODES = ("avx2", "native")
#: what the pin sets (each only where the environment does not set it already)
PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
#: the vector-ISA flags of /proc/cpuinfo a run records (the rest say nothing about the numerics)
VECTOR_FLAGS = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512\w*|amx\w*|avx_vnni\w*)$")
#: ATen's capabilities above AVX2: a pinned process that reports one was not pinned (torch imported first)
ABOVE_AVX2 = ("AVX512", "AVX512_BF16", "AMX")


def numerics_mode(environ=None) -> str:
    """``avx2`` (pinned, the default) or ``native``, from :data:`NUMERICS_ENV`; an unknown value counts as
    ``avx2`` here (the safe default) and is refused by :func:`check_numerics`."""
    mode = (os.environ if environ is None else environ).get(NUMERICS_ENV, "avx2").strip().lower()
    return mode if mode in NUMERICS_MODES else "avx2"


def x86() -> bool:
    """Whether this is an x86-64 machine (the pin applies to x86 only: ARM has other kernels)."""
    return platform.machine().lower() in ("x86_64", "amd64", "x64")


def pin_cpu_numerics(environ=None) -> dict:
    """Set :data:`PINS` in ``environ`` (os.environ) where unset, unless ``STUDY_NUMERICS=native`` or the machine is not
    x86-64; return what was set.  Must run before torch is imported to take effect (``study/__init__.py`` calls it)."""
    env = os.environ if environ is None else environ
    if numerics_mode(env) == "native" or not x86():
        return {}
    added = {k: v for k, v in PINS.items() if k not in env}
    env.update(added)
    return added


def check_numerics(environ=None) -> None:
    """Refuse numerics that are not what the run asks for, in one line.

    Raises:
        ConfigError: ``STUDY_NUMERICS`` is neither ``avx2`` nor ``native``; or the kernels are not pinned although the
            pin is on (torch was imported before ``study``, so ATen chose its kernels first).
    """
    from study.config.schema import ConfigError

    env = os.environ if environ is None else environ
    check_numerics_setting(env)
    if numerics_mode(env) == "avx2" and x86() and cpu_capability() in ABOVE_AVX2:
        own = env.get("ATEN_CPU_CAPABILITY")
        if own is not None and own.strip().upper() != "AVX2":  # the environment asked for them, not torch's import
            raise ConfigError(f"ATEN_CPU_CAPABILITY={own} in the environment runs {cpu_capability()} kernels, not the "
                              f"pinned AVX2: unset it, or set {NUMERICS_ENV}=native to train unpinned")
        raise ConfigError(f"the CPU kernels are not pinned (ATen runs {cpu_capability()}, not AVX2): torch was imported "
                          f"before study; import study first, or set {NUMERICS_ENV}=native to train unpinned")


def check_numerics_setting(environ=None) -> None:
    """Refuse a ``STUDY_NUMERICS`` that is neither ``avx2`` nor ``native``, in one line (every stage checks it before
    anything runs: study.config.stage.run_stage; a training again, study.runner.run.plan_run).

    Raises:
        ConfigError: naming the value and the two that work.
    """
    from study.config.schema import ConfigError

    env = os.environ if environ is None else environ
    raw = env.get(NUMERICS_ENV, "avx2").strip().lower()
    if raw not in NUMERICS_MODES:
        raise ConfigError(f"{NUMERICS_ENV}={env.get(NUMERICS_ENV)!r} is not one of {', '.join(NUMERICS_MODES)}: unset "
                          f"it (CPU kernels pinned to AVX2, the default) or set {NUMERICS_ENV}=native")


def cpu_capability() -> str:
    """ATen's vector ISA in this process (``AVX2``, ``AVX512``, ``DEFAULT`` ...; imports torch)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def run_numerics(trainer) -> dict:
    """:func:`numerics_key` of a run trained with the trainer config ``trainer`` (its accelerator, precision and
    threads: ``trainer.threads``, or torch's default where unset)."""
    import torch

    return numerics_key(trainer.accelerator, trainer.threads or torch.get_num_threads(), trainer.precision)


def numerics_key(accelerator: str, threads: int, precision: str) -> dict:
    """What must agree for two runs to pair and for a checkpoint to resume (imports torch).

    CPU: device, machine (x86_64, arm64), the CPU's vendor (MKL's AVX2 branch is Intel's, AMD takes its AUTO
    branch), ATen's capability, the MKL and oneDNN pins, torch's version and the intra-op threads (a reduction over 2
    threads sums in another order than over 1); unpinned, the CPU model too (native kernels differ between CPU kinds).  GPU: device, torch and CUDA versions, precision (the GPU's name is
    in :func:`machine_record`: a stage on a login node without a GPU computes the same key as its jobs).
    """
    import torch

    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return {"device": "cuda", "torch": torch.__version__, "cuda": torch.version.cuda, "precision": precision}
    key = {"device": "cpu", "machine": platform.machine(), "vendor": cpu_info()["vendor"], "mode": numerics_mode(),
           "cpu_capability": cpu_capability(),
           "mkl_cbwr": os.environ.get("MKL_CBWR"), "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
           "torch": torch.__version__, "threads": int(threads), "precision": precision}
    if key["mode"] == "native":
        key["cpu"] = cpu_info()["model"]
    return key


def cpu_info() -> dict:
    """The CPU this process runs on: ``{"model", "vendor", "flags" (vector ISA flags, sorted), "cores"}`` from
    /proc/cpuinfo (Linux), or what :mod:`platform` says elsewhere."""
    model, vendor, flags = platform.processor() or platform.machine(), "", []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    model = fields.get("model name", model)
    vendor = fields.get("vendor_id", vendor)
    flags = sorted(f for f in fields.get("flags", "").split() if VECTOR_FLAGS.match(f))
    return {"model": model, "vendor": vendor, "flags": flags, "cores": os.cpu_count()}


def machine_record() -> dict:
    """What a run ran on, for its record (imports torch): :func:`cpu_info`, the platform, Python, torch, MKL and
    oneDNN versions, the GPU's name, torch's threads, the pin's environment variables as set."""
    import torch

    shown = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.\-]+)", shown)
    dnn = re.search(r"MKL-DNN v([\w.]+)", shown)
    return {"cpu": cpu_info(), "platform": platform.platform(), "python": sys.version.split()[0],
            "torch": torch.__version__, "mkl": mkl.group(1) if mkl else None, "onednn": dnn.group(1) if dnn else None,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads(), "env": {k: os.environ.get(k) for k in (NUMERICS_ENV, *PINS)}}


def machine_tags() -> dict:
    """MLflow tags of what a run ran on: ``cpu``, ``cpu_vendor``, ``cpu_flags`` (vector ISA), ``gpu``, ``torch``."""
    m = machine_record()
    return {"cpu": m["cpu"]["model"], "cpu_vendor": m["cpu"]["vendor"], "cpu_flags": " ".join(m["cpu"]["flags"]),
            "gpu": m["gpu"] or "none", "torch": m["torch"]}
