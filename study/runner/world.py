"""Where a run trains: the world size, this process's global rank, the Lightning strategy.

Known before the Trainer exists (and before Lightning is imported, but for the FSDP strategy), so
that the run folder's lock and the MLflow run are taken by global rank 0 only.
"""
from __future__ import annotations

import os

from study.config import ConfigError


def multi_node_launcher(env=None) -> str | None:
    """The multi-node launcher whose environment this process runs in, or None: SLURM with more than one
    node (SLURM_NTASKS or SLURM_JOB_ID, and SLURM_NNODES > 1), torchrun (TORCHELASTIC_RUN_ID), or a
    manual launch as Lightning reads it (MASTER_ADDR with NODE_RANK or WORLD_SIZE)."""
    env = os.environ if env is None else env
    nodes = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or "1"
    if ("SLURM_NTASKS" in env or "SLURM_JOB_ID" in env) and nodes.isdigit() and int(nodes) > 1:
        return "SLURM"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "MASTER_ADDR" in env and ("NODE_RANK" in env or "WORLD_SIZE" in env):
        return "MASTER_ADDR/NODE_RANK"
    return None


def check_multi_node(trainer_cfg) -> None:
    """Refuse trainer.num_nodes > 1 outside a multi-node launcher: Lightning would wait forever for the
    other nodes to join (only SIGKILL ends it).

    Raises:
        ConfigError: num_nodes > 1 and no SLURM/torchrun/MASTER_ADDR environment.
    """
    if int(trainer_cfg.num_nodes) > 1 and multi_node_launcher() is None:
        n = int(trainer_cfg.num_nodes)
        raise ConfigError(f"trainer.num_nodes={n} but no multi-node launcher is present (no SLURM job over "
                          f"several nodes, torchrun or MASTER_ADDR/NODE_RANK): launch it on each node with torchrun "
                          f"--nnodes {n} ... -m study.train or srun under a {n}-node SLURM job, or set "
                          f"trainer.num_nodes=1")


def world_size(trainer_cfg) -> int:
    """Devices x nodes the Trainer will use (devices=-1: every visible GPU)."""
    devices = trainer_cfg.devices
    if devices in (-1, "-1", "auto"):
        import torch
        devices = torch.cuda.device_count() if trainer_cfg.accelerator in ("gpu", "cuda") else 1
        if not devices:
            raise ConfigError(f"trainer.devices={trainer_cfg.devices} (every GPU) with trainer.accelerator="
                              f"{trainer_cfg.accelerator}, but torch sees no GPU: run on a GPU machine, or use "
                              f"trainer=cpu")
    if isinstance(devices, (list, tuple)) or hasattr(devices, "__len__") and not isinstance(devices, str):
        devices = len(devices)
    return int(devices) * int(trainer_cfg.num_nodes)


def launch_rank(trainer_cfg) -> int:
    """Global rank of this process, known before the Trainer exists, from the launcher's environment:
    RANK (torchrun), else NODE_RANK x devices per node + LOCAL_RANK (Lightning's own launcher re-runs
    this command once per extra device with LOCAL_RANK set), else SLURM_PROCID (srun), else 0."""
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"])
    if "LOCAL_RANK" in env or "NODE_RANK" in env:
        per_node = world_size(trainer_cfg) // int(trainer_cfg.num_nodes)
        return int(env.get("NODE_RANK", 0)) * per_node + int(env.get("LOCAL_RANK", 0))
    return int(env.get("SLURM_PROCID", 0))


def make_strategy(trainer_cfg):
    """Lightning strategy from its name; ``fsdp`` auto-wraps each transformer Block, full state dict.

    Raises:
        ConfigError: fsdp on CPU (neither Lightning's FSDPStrategy nor torch's FSDP runs without GPUs).
    """
    if trainer_cfg.strategy == "fsdp":
        try:
            from lightning.pytorch.strategies import FSDPStrategy
        except ImportError as e:
            raise missing_package(e, "trainer.strategy=fsdp") from e

        from study.modeling.model import Block
        if trainer_cfg.accelerator == "cpu":
            raise ConfigError("trainer.strategy=fsdp needs GPUs (Lightning's and torch's FSDP refuse CPUs): "
                              "use trainer.accelerator=gpu, or trainer.strategy=ddp on CPUs")
        return FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="full")
    return trainer_cfg.strategy


def missing_package(e: ImportError, what: str) -> ConfigError:
    """One line for a setting whose package is not installed (Lightning's ``Requirement 'torch_xla>=1.13'
    not met``, or a plain ModuleNotFoundError)."""
    import re

    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    m = re.search(r"Requirement '([A-Za-z0-9_.\-]+)", text)
    package = m.group(1) if m else (getattr(e, "name", None) or "?")
    return ConfigError(f"{what} needs the package {package}, which is not installed: {text}: install it, or choose "
                       f"other trainer settings (conf/trainer, trainer.accelerator/strategy/precision)")


def die_with_parent(env=None) -> bool:
    """Arm PR_SET_PDEATHSIG (Linux) when the stage that started this training named itself in STUDY_PARENT_PID
    (study.orchestration.launch's local launcher): SIGTERM when that stage dies, even by SIGKILL, so that the run is
    marked KILLED and its lock freed instead of training on as an orphan; at once if the stage is gone already.
    Armed here, in the training, not in a preexec_fn (the stage starts its trainings from a thread pool).
    Returns whether it was armed."""
    import signal
    import sys

    env = os.environ if env is None else env
    parent = env.pop("STUDY_PARENT_PID", "")  # not inherited: a training's own processes (DDP ranks) have it as parent
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return False
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != int(parent):  # the stage died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def slurm_plugins() -> list:
    """Inside a SLURM job: Lightning's SLURM environment (ranks from srun's SLURM_PROCID/LOCALID/NODEID) without its
    auto-requeue.  submitit requeues (USR2, study.orchestration.job); Lightning's own SIGUSR1 handler would save
    ``hpc_ckpt_*.ckpt`` mid-interval and a later ``fit(ckpt_path=None)`` would resume from it, past the run's resume
    key: one requeue only.  [] outside SLURM."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    import warnings

    with warnings.catch_warnings():  # detect() repeats Lightning's srun hint; the Trainer shows it once
        warnings.simplefilter("ignore")
        under_srun = SLURMEnvironment.detect()
    return [SLURMEnvironment(auto_requeue=False)] if under_srun else []


def build_trainer(**kwargs):
    """``lightning.pytorch.Trainer(**kwargs)``; the settings Lightning refuses (an accelerator this machine
    lacks, devices or a strategy it cannot use) become one :class:`ConfigError` line.

    Raises:
        ConfigError: Lightning's ValueError, TypeError or MisconfigurationException, first line; an
            ImportError (a package the settings need is not installed) names the package.
    """
    import lightning.pytorch as pl
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    shown = ", ".join(f"{k}={kwargs.get(k)!r}" for k in ("accelerator", "devices", "num_nodes", "precision")
                      if k in kwargs)
    strategy = kwargs.get("strategy")
    shown += f"{', ' if shown else ''}strategy={strategy if isinstance(strategy, str) else type(strategy).__name__}"
    import warnings

    if "SLURM_JOB_ID" not in os.environ and "SLURM_NTASKS" not in os.environ:
        # not under SLURM: Lightning's hint that srun exists on this machine but is not used (at every start of a
        # Trainer or a fit, on a machine with SLURM installed) says nothing about this run: silent in this process
        warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system")
    try:
        with warnings.catch_warnings():
            plugins = slurm_plugins()
            if plugins and "plugins" not in kwargs:
                kwargs["plugins"] = plugins
            return pl.Trainer(**kwargs)
    except ImportError as e:  # ModuleNotFoundError: tpu/xla without torch_xla, transformer-engine precision, ...
        raise missing_package(e, f"the trainer ({shown})") from e
    except (ValueError, TypeError, MisconfigurationException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"Lightning refused the trainer settings ({shown}): {first}: fix conf/trainer or the "
                          f"trainer.* overrides") from e
