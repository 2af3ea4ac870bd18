"""The launcher section resolved in one place: what one job of a stage's trainings asks of the machine or the
cluster (nodes, tasks, GPUs, CPUs, memory, time), checked against the trainer it will run.  Pure: no submitit,
no SLURM, no torch; study/orchestration/launch.py turns the result into submitit's parameters."""
from __future__ import annotations

from .schema import EXECUTORS, ConfigError

#: strategies that run one process per device (under SLURM: one task per device, ranks from SLURM_PROCID)
MULTI_PROCESS = ("ddp", "fsdp", "deepspeed")


def _devices(trainer, gpus_per_node: int) -> int | None:
    """Devices per node the trainer uses: an int, a list's length, or for -1/"auto" the job's GPUs (None: unknown)."""
    d = trainer.devices
    if isinstance(d, str) and d.strip().lstrip("-").isdigit():
        d = int(d)
    if d in (-1, "auto"):
        return int(gpus_per_node) if trainer.accelerator in ("gpu", "cuda") and gpus_per_node > 0 else None
    if hasattr(d, "__len__") and not isinstance(d, str):
        return len(d)
    return int(d)


def check_launcher_values(la) -> None:
    """The launcher's values in range (executor, limits, counts, the MFU share, memory, setup lines); raises
    ConfigError in one line naming the key."""
    if la.executor not in EXECUTORS:
        raise ConfigError(f"launcher.executor={la.executor!r}: choose one of {list(EXECUTORS)} (conf/launcher/)")
    for key, low in (("timeout_min", 1), ("cpus_per_task", 1), ("array_parallelism", 1), ("max_requeues", 0),
                     ("gpus_per_node", 0)):
        if int(la[key]) < low:
            raise ConfigError(f"launcher.{key}={la[key]} must be >= {low}")
    for key in ("poll_s", "peak_tflops"):
        if not float(la[key]) > 0:
            raise ConfigError(f"launcher.{key}={la[key]} must be > 0")
    if not 0 < float(la.mfu) <= 1:
        raise ConfigError(f"launcher.mfu={la.mfu} must be in (0, 1]: the assumed share of the GPU's peak, e.g. 0.4")
    if la.mem_gb is not None and not float(la.mem_gb) > 0:
        raise ConfigError(f"launcher.mem_gb={la.mem_gb} must be > 0 (or null: the partition's default)")
    if la.setup is not None and not all(isinstance(x, str) for x in la.setup):
        raise ConfigError(f"launcher.setup={list(la.setup)} must be a list of shell lines, e.g. ['module load cuda']")


def slurm_tasks(la, tr, devices: int | None) -> int:
    """Tasks per node of one SLURM job: the trainer's devices under a multi-process strategy, else 1; raises
    ConfigError where the launcher and the trainer disagree (GPUs, tasks, devices, threads)."""
    gpus, tasks = int(la.gpus_per_node), la.tasks_per_node
    strategy = tr.strategy if isinstance(tr.strategy, str) else ""
    multi = strategy.startswith(MULTI_PROCESS)
    if devices is None:
        raise ConfigError(f"trainer.devices={tr.devices} (every GPU) under launcher=slurm needs the GPUs of one "
                          f"job: set launcher.gpus_per_node (e.g. launcher.gpus_per_node=8)")
    if tr.accelerator in ("gpu", "cuda") and gpus < devices:
        raise ConfigError(f"trainer.accelerator={tr.accelerator} with trainer.devices={devices} needs "
                          f"launcher.gpus_per_node >= {devices}, got {gpus}: set launcher.gpus_per_node={devices}")
    if tr.accelerator in ("gpu", "cuda") and gpus > devices:
        raise ConfigError(f"launcher.gpus_per_node={gpus} disagrees with trainer.devices={tr.devices}: "
                          f"{gpus - devices} GPU(s) per job would idle: set launcher.gpus_per_node={devices}, or "
                          f"trainer.devices={gpus} under a multi-GPU trainer (trainer=ddp)")
    want = devices if multi else 1
    if tasks is not None and int(tasks) != want:
        raise ConfigError(f"launcher.tasks_per_node={tasks} disagrees with trainer.devices={tr.devices} "
                          f"(strategy {strategy or tr.strategy}): Lightning's SLURM environment runs one task per "
                          f"device{' under ' + strategy if multi else ', and one task without a multi-process strategy'}"
                          f": set launcher.tasks_per_node={want} (or null)")
    if not multi and devices > 1:
        raise ConfigError(f"trainer.devices={devices} with strategy {tr.strategy!r} under launcher=slurm: "
                          f"several devices need one task each: use trainer=ddp (or trainer.strategy=ddp)")
    if tr.threads is not None and int(tr.threads) > int(la.cpus_per_task):
        raise ConfigError(f"trainer.threads={tr.threads} is more than launcher.cpus_per_task={la.cpus_per_task}: "
                          f"raise launcher.cpus_per_task or lower trainer.threads")
    return want


def resolve_launcher(cfg) -> dict:
    """The launcher of ``cfg`` resolved: ``{"executor", "nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task",
    "mem_gb", "timeout_min", "array_parallelism", "max_requeues", "partition", "account", "qos", "constraint",
    "setup", "additional", "log_dir", "poll_s", "mfu", "peak_tflops"}`` (minutes, GB, TFLOP/s).

    Under ``slurm`` one job runs one training: tasks_per_node = the trainer's devices under a multi-process strategy
    (ddp, fsdp: Lightning's SLURM environment reads the ranks from srun), else 1; nodes = trainer.num_nodes.

    Raises:
        ConfigError: an unknown executor, a value out of range, or a launcher that disagrees with the trainer
            (tasks_per_node against devices, GPUs per node against devices, nodes against num_nodes); one line.
    """
    la, tr = cfg.launcher, cfg.trainer
    check_launcher_values(la)
    gpus, nodes = int(la.gpus_per_node), int(tr.num_nodes)
    if la.nodes is not None and int(la.nodes) != nodes:
        raise ConfigError(f"launcher.nodes={la.nodes} disagrees with trainer.num_nodes={nodes}: one training per job "
                          f"spans trainer.num_nodes nodes; set launcher.nodes=null (or equal to trainer.num_nodes)")
    devices = _devices(tr, gpus)
    tasks = slurm_tasks(la, tr, devices) if la.executor == "slurm" else la.tasks_per_node
    out = {k: la[k] for k in ("executor", "cpus_per_task", "timeout_min", "array_parallelism", "max_requeues",
                              "partition", "account", "qos", "constraint", "log_dir", "poll_s", "mfu", "peak_tflops")}
    from omegaconf import OmegaConf

    extra = la.additional
    extra = OmegaConf.to_container(extra) if OmegaConf.is_config(extra) else dict(extra or {})
    out.update(nodes=nodes, tasks_per_node=int(tasks or 1), gpus_per_node=gpus, devices=devices,
               mem_gb=None if la.mem_gb is None else float(la.mem_gb), setup=[str(x) for x in la.setup or []],
               additional=extra, executor=str(la.executor))
    return out


def gpu_slots(cfg, visible: list[str]) -> list[str] | None:
    """The local launcher's job slots on a GPU machine: one ``CUDA_VISIBLE_DEVICES`` value per training that runs at
    once (None for a CPU trainer: study.jobs trainings, no GPU).  Each training gets its own ``trainer.devices`` GPUs
    of ``visible`` (the machine's GPU ids, in order), and ``launcher.jobs_per_gpu`` trainings share each group; the
    slots go round the groups first, so that a batch smaller than the slots spreads over every GPU.

    Raises:
        ConfigError: a GPU trainer and no visible GPU, fewer GPUs than one training's devices, or jobs_per_gpu < 1.
    """
    tr, la = cfg.trainer, cfg.launcher
    if tr.accelerator not in ("gpu", "cuda"):
        return None
    per_gpu = int(la.jobs_per_gpu)
    if per_gpu < 1:
        raise ConfigError(f"launcher.jobs_per_gpu={per_gpu} must be >= 1 (trainings at once on each GPU)")
    if not visible:
        raise ConfigError(f"trainer.accelerator={tr.accelerator} but this machine shows no GPU (CUDA_VISIBLE_DEVICES, "
                          f"torch.cuda): run on a GPU machine, or use trainer=cpu")
    per_run = _devices(tr, len(visible)) or 1
    groups = [",".join(visible[i:i + per_run]) for i in range(0, len(visible) - per_run + 1, per_run)]
    if not groups:
        raise ConfigError(f"one training asks for trainer.devices={per_run} GPUs but this machine shows {len(visible)} "
                          f"({','.join(visible)}): lower trainer.devices")
    return [g for _ in range(per_gpu) for g in groups]
