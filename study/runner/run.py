"""One training run, in the steps a reader follows: :func:`plan_run` (what the config asks for: folder, task, data,
steps and batches), :func:`open_run` (the folder's lock, resume or start afresh, the MLflow run), :func:`build_run`
(data, model, callbacks, Trainer), :func:`fit_run` (train to the step budget, evaluate last), :func:`result_of` and
:func:`record_run` (the run's result, written to the run folder through study.runfolder and to MLflow).  :func:`train`
composes them; ``python -m study.train`` (study/train.py) is its command line.

Elsewhere: the data in ``study.data``; the run folder's files and lock in ``study.runfolder``; its state at a start, its
resume key and its loop state in ``study.runner`` (run_state, resume_key, loop_state); devices in ``study.runner.world``;
the model in ``study.modeling``."""
from __future__ import annotations

import math
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from study.config import max_steps, micro_batches, run_seeds
from study.runner.signals import Killed, terminate_as_exception
from study.data import DataError
from study.data.records import data_digest as prepared_data_digest
from study.runfolder import (CHECKPOINTS, CONFIG_FILE, CURVE_FILE, LAST_CKPT, LOGGED_FILES, METRICS_FILE,
                             POSITIONS_FILE, RECORD_FILE, RUN_JSON, read_result, recorded_config, split_result,
                             write_curve, write_json, write_positions)
from study.runfolder.lock import hold_run_lock
from study.runner.loop_state import WALL_CLOCK_KEY, loop_state_callback, read_resume_checkpoint, wall_clock_callback
from study.runner.run_state import ctrl_c, end_status, finished_here, open_run_folder
from study.runner.tracking import RUN_FOLDER_TAG, end_orphaned_runs, restore_env, run_folder_tag, settle_previous_run
from study.runner.world import build_trainer, check_multi_node, launch_rank, make_strategy, world_size


def train(cfg, root: Path) -> dict:
    """Train one run; return its result: the content of its metrics.json and record.json in one dict.

    Global rank 0 holds the run folder's lock for the run's life; SIGTERM ends the run as KILLED.

    Raises:
        ConfigError, DataError: bad config or data (the MLflow run, if started, is marked FAILED).
        RunBusy: another process writes the same run folder.
        Killed: SIGTERM (the MLflow run is marked KILLED).
    """
    try:
        with ExitStack() as stack:
            stack.enter_context(restore_env("MLFLOW_TRACKING_URI"))  # MLflow's set_tracking_uri exports it
            return _train(cfg, root, stack)
    except SystemExit as e:  # Lightning's exit(1) after Ctrl-C during fit: Ctrl-C again, whoever called train
        if ctrl_c(e) and not isinstance(e, Killed):
            raise KeyboardInterrupt from None
        raise


def _train(cfg, root: Path, stack: ExitStack) -> dict:
    plan = plan_run(cfg, root)
    run = open_run(plan, stack)
    if run is None:  # started again by hand: the finished run is the result
        print(f"{plan.name}: {plan.out_dir} holds this run finished (same settings, code, data and numerics): "
              f"reused; train.overwrite=true trains it again", flush=True)
        return read_result(plan.out_dir)
    try:  # from here on an exception ends the MLflow run FAILED (KILLED on SIGTERM), never RUNNING
        start_tracking(plan, run)
        module, dm, trainer, clock = build_run(plan, run)
        seconds = fit_run(plan, run, module, dm, trainer, clock)
    except BaseException as e:
        end_failed(plan, run, e)
        raise
    result = result_of(plan, run, module, trainer, seconds)
    record_run(plan, run, module, trainer, result)
    return result


@dataclass
class Plan:
    """What one run's config asks for, before anything is written: its name and folder, task and data, the step
    budget, micro-batches and accumulation on this world size, this process's global rank, the validation batches
    (``cfg``: ``spec.cfg``, read-only)."""
    spec: object
    cfg: object
    root: Path
    name: str
    out_dir: Path
    task: object
    data_dir: Path
    uri: str
    meta: dict
    steps: int
    world: int
    micro: int
    accum: int
    rank: int
    n_val: int
    val_micro: int

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / CHECKPOINTS


def plan_run(cfg, root: Path) -> Plan:
    """The :class:`Plan` of ``cfg`` (its frozen specification, study.runner.spec.run_spec); checks the
    trainer's nodes, the tracking store and the task's data, sets this process's rank and torch threads.

    Raises:
        ConfigError, DataError: in one line, before Lightning or MLflow start.
    """
    import torch
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from study.config.numerics import check_numerics
    from study.runner.spec import run_spec
    from study.runfolder.store import tracking_uri
    from study.tasks import get_task

    check_multi_node(cfg.trainer)  # num_nodes > 1 without a launcher would hang in Lightning's start for ever
    spec = run_spec(cfg, root)  # derived settings (compute-matched tokens, a transferred lr*) resolved, frozen
    cfg, name, out_dir, data_dir = spec.cfg, spec.name, spec.out_dir, spec.data_dir  # data: mqar's kept test set
    task = get_task(cfg.task.name)  # its data, objective and metric (study/tasks/)
    uri = tracking_uri(root, cfg.study)  # an unsupported MLFLOW_TRACKING_URI is refused here
    meta = task.check_data(cfg, root)  # lm: before Lightning, a loader without one step would spin forever
    steps = max_steps(cfg)
    ws = world_size(cfg.trainer)
    micro, accum = micro_batches(cfg, ws)
    # every rank runs a run; files are written by global rank 0 only (checkpoints: see ModelCheckpoint)
    rank_zero_only.rank = rank = launch_rank(cfg.trainer)  # MLflow: one run, created by rank 0 only
    n_val = task.val_examples(cfg)
    val_micro = min(cfg.train.val_micro_batch_size, n_val)
    while n_val % val_micro:
        val_micro -= 1
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
        if ws > 1:  # Lightning's DDP launchers set every rank to cores / ranks threads unless OMP_NUM_THREADS is set:
            # each rank trains at the threads the run records (config.json's numerics, the resume key)
            os.environ["OMP_NUM_THREADS"] = str(cfg.trainer.threads)
    check_numerics()  # CPU kernels pinned (study/config/numerics.py) unless STUDY_NUMERICS=native
    return Plan(spec, cfg, root, name, out_dir, task, data_dir, uri, meta, steps, ws, micro, accum, rank, n_val, val_micro)


@dataclass
class OpenRun:
    """A run folder opened by :func:`open_run`: the resume record and key (computed once, here), run.json's state,
    the checkpoint resumed (None: afresh) at ``start_step`` after ``earlier`` seconds of earlier segments, what the
    start set aside (study.runner.run_state.Replaced), and the MLflow logger and run id."""
    record: dict
    digest: str
    state: dict
    resume: Path | None
    replaced: object
    start_step: int
    earlier: float
    logger: object = None
    run_id: str = ""


def open_run(plan: Plan, stack: ExitStack) -> OpenRun | None:
    """Lock the run folder (rank 0, for the stack's life), turn SIGTERM into Killed; None when the folder holds this
    very run finished and a hand start reuses it (study.runner.run_state.finished_here); else decide resume or afresh
    (study.runner.run_state.open_run_folder), settle the folder's earlier MLflow runs and open this run's logger.

    Raises:
        RunBusy: another process writes the folder.  StudyError: an unreadable checkpoint to resume.
    """
    from study.config.naming import run_arm, run_role
    from study.config.numerics import machine_tags
    from study.runner.logs import quiet_logs
    from study.runner.tracking import (artifact_location, ensure_experiment, git_commit, logged_steps,
                                       step_aligned_logger, store_lock)

    cfg, root, rank, out_dir = plan.cfg, plan.root, plan.rank, plan.out_dir
    if rank == 0:  # one writer per run folder, for the run's life; SIGTERM ends it as KILLED
        stack.enter_context(hold_run_lock(out_dir))
    stack.enter_context(terminate_as_exception())
    if plan.world == 1 and finished_here(cfg, out_dir, plan.data_dir):  # one process: nothing to agree on
        end_dead_runs(plan)
        return None

    # resume only a checkpoint of this very config, code and data that has not finished
    record, digest, state, previous_run_id, resume, replaced = open_run_folder(cfg, plan.name, out_dir, plan.data_dir,
                                                                               rank)
    stack.callback(replaced.restore)  # the last run's outputs come back unless the Trainer gets built (discard)
    # read before MLflow or the folder changes: an unreadable checkpoint stops the start in one line
    start_step, earlier = read_resume_checkpoint(resume, WALL_CLOCK_KEY) if resume is not None else (0, 0.0)
    run = OpenRun(record, digest, state, resume, replaced, start_step, earlier)

    quiet_logs()
    with store_lock(root, cfg.study):  # two runs creating the store, experiment or run at once would race
        if rank == 0 and previous_run_id:
            run.state = settle_previous_run(plan.uri, previous_run_id, resuming=resume is not None, state=run.state)
        if rank == 0:
            from mlflow import MlflowClient
            experiment_id = ensure_experiment(MlflowClient(plan.uri), root, cfg.study)
            # runs of this folder left RUNNING by a process that died without a word, whose id run.json no
            # longer holds (its checkpoints/ deleted, as an unreadable checkpoint's error advises): KILLED
            end_orphaned_runs(MlflowClient(plan.uri), experiment_id, out_dir,
                              keep=run.state.get("mlflow_run_id") if resume is not None else None)
        run.logger = step_aligned_logger(
            experiment_name=cfg.study.name, run_name=plan.name, tracking_uri=plan.uri,
            artifact_location=artifact_location(root, cfg.study), run_id=run.state.get("mlflow_run_id"),
            tags={"variant": cfg.variant.name, "seed": str(cfg.seed), "git_commit": git_commit(root), "config_hash": digest,
                  "model": cfg.model.name, "group": cfg.study.group or "main", "role": run_role(cfg.study.group),
                  "arm": run_arm(cfg.study.group, cfg.variant.name), RUN_FOLDER_TAG: run_folder_tag(out_dir),
                  **machine_tags()})
        run.run_id = run.logger.run_id
        if rank == 0 and resume is not None and run.state.get("mlflow_run_id") == run.run_id:  # each step logged once
            run.logger.logged_through = logged_steps(run.logger.experiment, run.run_id)
    return run


def end_dead_runs(plan: Plan) -> None:
    """A finished run reused by hand: an MLflow run of its folder that a killed re-run left RUNNING is marked KILLED
    (study.runner.tracking.end_orphaned_runs), as a start that trains would; nothing when the store has no such
    experiment."""
    from mlflow import MlflowClient

    from study.runner.tracking import store_lock

    with store_lock(plan.root, plan.cfg.study):
        client = MlflowClient(plan.uri)
        experiment = client.get_experiment_by_name(plan.cfg.study.name)
        if experiment is not None:
            end_orphaned_runs(client, experiment.experiment_id, plan.out_dir)


def start_tracking(plan: Plan, run: OpenRun) -> None:
    """A new MLflow run (not a resumed one): log its params and config.yaml, and write run.json (the resume key,
    the record it covers, the MLflow run id)."""
    from study.runner.tracking import log_text, run_params

    if run.state.get("mlflow_run_id"):
        return
    from study.config.numerics import run_numerics
    from study.runfolder.digests import code_digest

    cfg = plan.cfg
    # the numerics are params (they pair runs); what the run ran on is tags (open_run: machine_tags)
    run.logger.log_hyperparams({**run_params(cfg), **{f"numerics.{k}": v for k, v in run_numerics(cfg.trainer).items()},
                                **{f"spec.{k}": v for k, v in plan.spec.record().items()},
                                "code_digest": code_digest(cfg.task.name)})  # the MLflow reader pairs on both
    if plan.rank == 0:
        from omegaconf import OmegaConf
        log_text(plan.root, cfg.study, run.run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
    run.state = {"config_hash": run.digest, "mlflow_run_id": run.run_id, "completed": False,
                 "seconds": run.state.get("seconds", 0.0), "resume": run.record}
    if plan.rank == 0:
        write_json(plan.ckpt_dir / RUN_JSON, run.state)


def build_run(plan: Plan, run: OpenRun) -> tuple:
    """(module, datamodule, Trainer, wall clock) of the run: seeded (the data order by the data seed, the init by
    the init seed, anything else by ``seed``), the same windows per step on any world size; the folder's last run is
    replaced once the Trainer has taken its settings."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar

    from study.modeling.lit_module import GPTModule
    from study.runner.throughput import throughput_monitor, wants_throughput_monitor
    from study.runner.logs import progress_callback

    cfg, steps, accum = plan.cfg, plan.steps, plan.accum
    data_seed, _ = run_seeds(cfg)  # the order of the windows; the init seed goes to GPTModule
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # anything else random (dropout)
    dm = plan.task.datamodule(cfg, plan.root, plan.meta, plan.micro, data_seed, plan.n_val, plan.val_micro,
                              global_batch=plan.micro * accum * plan.world)  # the same windows per step on any world size
    module = GPTModule(cfg, corpora=dm.corpora, vocab_size=plan.task.model_vocab(cfg, plan.meta))
    run.logger.log_metrics({"non_embedding_params": module.counts["non_embedding_params"],
                            "flops_per_token": module.counts["flops_per_token"]}, step=0)
    # saved (atomically, by Lightning) at the end of every evaluation: the curve row is in it
    checkpoint = ModelCheckpoint(dirpath=plan.ckpt_dir, filename="last", monitor=None, save_top_k=1,
                                 enable_version_counter=False)
    progress = progress_callback(plan.name, steps, cfg.train.batch_tokens, enabled=cfg.trainer.progress_bar)
    clock = wall_clock_callback()
    callbacks = [checkpoint, loop_state_callback(accum), clock] + ([progress] if progress is not None else [])
    if wants_throughput_monitor(cfg.trainer):  # throughput and MFU against the datasheet peak (no MFU on CPUs)
        # the rolling window spans at most a quarter of an evaluation interval: a checkpoint save (seconds at
        # gpt3-small) is counted as training time, so a window holding one under-reads MFU (2.5x on an H200)
        callbacks.append(throughput_monitor(window=min(100, steps * accum // 4, cfg.train.eval_every * accum // 4)))
    trainer = build_trainer(
        accelerator=cfg.trainer.accelerator, devices=cfg.trainer.devices, num_nodes=cfg.trainer.num_nodes,
        strategy=make_strategy(cfg.trainer), precision=cfg.trainer.precision,
        max_steps=steps, max_epochs=-1, accumulate_grad_batches=accum, gradient_clip_val=cfg.train.grad_clip,
        val_check_interval=cfg.train.eval_every * accum, check_val_every_n_epoch=None,
        limit_val_batches=plan.n_val // plan.val_micro, num_sanity_val_steps=0, log_every_n_steps=cfg.train.log_every,
        use_distributed_sampler=False,  # litdata splits the train windows; every rank evaluates all val windows
        logger=run.logger, callbacks=callbacks, enable_progress_bar=isinstance(progress, ProgressBar),
        enable_model_summary=False, deterministic=cfg.trainer.accelerator == "cpu",
        default_root_dir=str(plan.out_dir))
    run.replaced.drop_checkpoints()  # the Trainer took its settings; the last run's outputs stay aside until the end
    run.logger.step_of = lambda: trainer.global_step  # metric steps = optimizer steps, as in curve.csv
    return module, dm, trainer, clock


def fit_run(plan: Plan, run: OpenRun, module, dm, trainer, clock) -> float:
    """Fit to the step budget (from the resumed checkpoint, if any) and evaluate the last step; return the seconds
    of this segment.

    Raises:
        DataError: the run stopped short of its steps (the training split too small for one batch).
    """
    t0 = time.time()
    if run.resume is not None and plan.rank == 0:  # earlier: the earlier segments' training time
        print(f"{plan.name}: resuming from step {run.start_step} ({run.resume})", flush=True)
    clock.earlier, clock.t0 = run.earlier, t0
    trainer.fit(module, dm, ckpt_path=str(run.resume) if run.resume else None)
    if not module.diverged and (not module.curve or module.curve[-1]["step"] != trainer.global_step):
        trainer.validate(module, dm, verbose=False)
    seconds = time.time() - t0
    if not module.diverged and trainer.global_step != plan.steps:
        raise DataError(f"the run stopped after {trainer.global_step} of {plan.steps} steps: the training split of "
                        f"{plan.data_dir} is too small for one batch of train.batch_tokens={plan.cfg.train.batch_tokens}; "
                        f"prepare more data or lower batch_tokens")
    module.check_final()  # a final evaluation above the best + divergence_nats is a divergence too
    return seconds


def end_failed(plan: Plan, run: OpenRun, exc: BaseException) -> None:
    """End the run's MLflow run FAILED (exception) or KILLED (SIGTERM, Ctrl-C), with an end time.  Under the store's
    lock: trainings stopped together (their stage killed, Ctrl-C at study.jobs=2) would otherwise end their runs in
    the one SQLite store at the same instant, each reading then writing, and wait on each other's locks for minutes."""
    from study.runner.tracking import store_lock

    if plan.rank != 0 or run.logger is None:  # rank 0 alone tracks (no logger yet: nothing to end)
        return
    with store_lock(plan.root, plan.cfg.study):
        try:
            run.logger.finalize("failed")
        except Exception:  # noqa: BLE001  (the store busy: the status below is what counts)
            pass
        for attempt in range(5):  # another writer (a training still running) may hold the store: retry
            try:
                run.logger.experiment.set_terminated(run.run_id, end_status(exc))
                break
            except Exception:  # noqa: BLE001  (never hide the run's own error)
                time.sleep(0.5 * (attempt + 1))


def result_of(plan: Plan, run: OpenRun, module, trainer, seconds: float) -> dict:
    """The run's result (metrics.json and record.json in one dict, study.runfolder.split_result); marks run.json's
    state completed and saves the final checkpoint (on every rank: it ends with a barrier)."""
    from study.config.numerics import machine_record
    from study.modeling.diagnostics import final_diagnostics

    cfg = plan.cfg
    trained_tokens = (trainer.global_step - run.start_step) * cfg.train.batch_tokens
    run.state.update(completed=True, seconds=run.earlier + seconds)  # every segment of a resumed run
    trainer.save_checkpoint(plan.ckpt_dir / LAST_CKPT, weights_only=False)  # on every rank: it ends with a barrier
    final = module.curve[-1] if module.curve else {}
    # a diverged run is a lost point: no final loss (its evaluations are in curve.csv)
    val_loss = float("nan") if module.diverged else final.get("val_loss", float("nan"))
    ok = math.isfinite(val_loss)
    gain = final.get("in_context_gain", float("nan")) if ok else float("nan")
    metrics = {
        "variant": cfg.variant.name,
        "seed": cfg.seed,
        "status": "diverged" if module.diverged else "ok",
        "reason": module.diverged,
        "diverged_step": module.diverged_step if module.diverged else None,
        "val_loss": val_loss if ok else None,
        "val_perplexity": math.exp(val_loss) if ok and val_loss < 50 else None,
        "in_context_gain": gain if math.isfinite(gain) else None,
        "val_loss_per_corpus": {k.split("/", 1)[1]: v for k, v in final.items() if k.startswith("val_loss/")
                                and math.isfinite(v)} if ok else None,
        **final_diagnostics(final),  # attn_logit_max: [layer 0, 1, ...] of the last evaluation
        "data_seed": run_seeds(cfg)[0],
        "init_seed": run_seeds(cfg)[1],
        "steps": trainer.global_step,
        "tokens": trainer.global_step * cfg.train.batch_tokens,
        # the peak and final lr, where the peak came from (train.lr, arm.lr, tuned.lr.V, tuned.size.MODEL.V), the arm
        **{k: getattr(plan.spec, k) for k in ("lr", "min_lr", "lr_source", "arm")},
        "model": cfg.model.name,
        "group": cfg.study.group,
        "non_embedding_params": module.counts["non_embedding_params"],
        "total_params": module.counts["total_params"],
        "flops_per_token": module.counts["flops_per_token"],
        "wall_time_s": round(run.state["seconds"], 2),
        "tokens_per_s": round(trained_tokens / seconds, 1) if seconds > 0 else None,
        "tokenizer": plan.meta["tokenizer"],
        "vocab_size": module.model.vocab_size,  # the embedding's rows, from the prepared data (the task's model_vocab)
        "machine": machine_record(),  # CPU model, vendor, vector flags, torch/MKL/oneDNN versions, threads, pins
        "config_hash": run.digest,
        "mlflow_run_id": run.state["mlflow_run_id"],
    }
    if "val_accuracy" in plan.task.METRICS:  # its metric beside the loss, and what chance or a count model scores
        acc = final.get("val_accuracy", float("nan")) if ok else float("nan")
        metrics.update(task=cfg.task.name, val_accuracy=acc if math.isfinite(acc) else None,
                       yardsticks=plan.task.yardsticks(cfg, plan.root, plan.meta))
    return metrics


def record_run(plan: Plan, run: OpenRun, module, trainer, metrics: dict) -> None:
    """Global rank 0: the final numbers and tags to MLflow, then the run folder's files (study.runfolder), metrics.json
    last (a folder with metrics.json holds a finished run), run.json's completed state, and the files as artifacts."""
    if not trainer.is_global_zero:
        return
    from study.modeling.diagnostics import CURVE_DIAGNOSTICS, layer_order
    from study.runner.tracking import log_files

    client, run_id, out_dir = run.logger.experiment, run.logger.run_id, plan.out_dir
    run.replaced.discard()  # this run's outputs replace the last run's (kept aside until now: study.runner.run_state)
    if metrics["val_loss"] is not None:
        client.log_metric(run_id, "final_val_loss", metrics["val_loss"])
        if metrics["in_context_gain"] is not None:
            client.log_metric(run_id, "in_context_gain", metrics["in_context_gain"])
        from mlflow.entities import Metric  # the per-position curve, step = position, in one batch
        now = int(time.time() * 1000)
        rows = [Metric("val_loss_by_position", loss, now, pos) for pos, loss in enumerate(module.position_loss, 1)]
        for i in range(0, len(rows), 1000):  # MLflow takes at most 1000 metrics per batch
            client.log_batch(run_id, metrics=rows[i:i + 1000])
    client.log_metric(run_id, "tokens_per_s_mean", metrics["tokens_per_s"] or 0.0)
    data_digest = prepared_data_digest(plan.data_dir)
    client.set_tag(run_id, "data_digest", data_digest)
    # a diverged run is a result (a lost point), not a crash: it ends FINISHED like any run that ran to
    # its end, tagged status=diverged with the reason and the step (study.analysis.runs.load_mlflow)
    client.set_tag(run_id, "status", metrics["status"])
    if module.diverged:
        client.set_tag(run_id, "diverged", module.diverged)
        client.set_tag(run_id, "diverged_step", str(module.diverged_step))
    write_curve(out_dir / CURVE_FILE, module.curve, CURVE_DIAGNOSTICS, layer_order)
    if metrics["val_loss"] is not None and module.position_loss:
        write_positions(out_dir / POSITIONS_FILE, module.position_loss)
    write_json(out_dir / CONFIG_FILE, recorded_config(plan.cfg, data_digest))
    numbers, record = split_result(metrics)
    write_json(out_dir / RECORD_FILE, record)
    write_json(out_dir / METRICS_FILE, numbers)  # last: a run folder with metrics.json has finished
    write_json(plan.ckpt_dir / RUN_JSON, run.state)
    log_files(plan.root, plan.cfg.study, run_id, [out_dir / p for p in LOGGED_FILES])
