"""Stage 2, ``python -m study.train variant=NAME seed=N [model=NAME] [key=value ...]``.

Trains one (variant, seed) run on the prepared token data and writes
``runs/VARIANT-sSEED/``:
  metrics.json     the DVC metric, numbers only (:data:`study.runner.run_state.METRICS`): final val_loss (nats),
                   val_perplexity, tokens seen, throughput (tokens/s); a key without a value
                   (a diverged run's loss: a lost point has none) is left out
  record.json      the rest of the run's result: variant, seed, status ("ok"/"diverged"), reason and
                   diverged_step (the optimizer step the divergence was found at, null when ok; the rule:
                   :class:`study.modeling.lm.GPTModule`), per-corpus val_loss, steps, lr, parameter and FLOP counts, wall time
                   (s, every segment of a resumed run), tokenizer, model, group, config_hash, mlflow_run_id,
                   attn_logit_max (per layer, at the last evaluation; null for a non-finite value)
  curve.csv        step, tokens, train_loss, val_loss, lr, in_context_gain, val_loss/CORPUS, attn_logit_max/L{i}
                   (one row per evaluation)
  positions.csv    position, val_loss: the per-position validation loss of the final evaluation (nats, the
                   mean over the fixed windows at positions 1..block_size; its mean is val_loss)
  config.json      the resolved config it trained with and the prepared data's digest (compare
                   pairs only runs that agree on everything but the variant)
  checkpoints/     last.ckpt (resumable) and run.json (resume key and the settings it covers,
                   MLflow run id)
  .lock            held by the one process that writes this folder (filelock)
  .replaced/       only while a start builds its Trainer: the last run's files it replaces, put back
                   if Lightning refuses the trainer settings (study.runner.run_state.Replaced)
(``runs/GROUP/VARIANT-sSEED/`` with ``study.group=GROUP``, as the test stage and
the scale ladder do, see study/runner/arms.py and study/runner/profiles.py)
and one MLflow run (experiment = study.name, run name = [GROUP/]VARIANT-sSEED) in the
project's SQLite store.

Running the same command again after a kill resumes from checkpoints/last.ckpt
(same resume key: the settings that change the numbers, the training code and the
data, on any world size) and continues the same MLflow run; otherwise it starts
afresh and prints the keys that differ.  metrics.json, record.json and curve.csv appear
only when the run has ended (finished or diverged; metrics.json last).  A run that dies ends FAILED
(exception) or KILLED (SIGTERM, Ctrl-C; a SIGKILLed run is marked KILLED by the next
start in its folder) in MLflow, with an end time.  A second process on the same run
folder, or a hand-started run whose settings differ from the finished run in its
folder, is refused in one line (``train.overwrite=true`` replaces it).

The pieces are elsewhere: the data and their checks in ``study.data``, the run folder's lock, resume
key and MLflow ending in ``study.runner.run_state``, devices and strategy in ``study.runner.launch``, the model in
``study.modeling.model`` / ``study.modeling.lm``; this module composes them into one Trainer run and reports.
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from study.config import max_steps, micro_batches, peak_lr, run_dir, run_label, run_seeds, run_stage, to_dict
from study.config import task_data_dir
from study.data import DataError
from study.data.records import data_digest as prepared_data_digest
from study.data.windows import check_train_windows
from study.runner.launch import build_trainer, check_multi_node, die_with_parent, launch_rank, make_strategy, world_size
from study.runner.run_state import (METRICS, end_status, hold_run_lock, loop_state_callback, open_run_folder,  # noqa: F401
                             read_resume_checkpoint, restore_env, settle_previous_run, split_result,
                             RUN_FOLDER_TAG, end_orphaned_runs, run_folder_tag,
                             terminate_as_exception, INTERRUPTED, Killed, ctrl_c)


def write_curve(path: Path, rows: list[dict]) -> None:
    """curve.csv: step, tokens, train_loss, val_loss, lr, in_context_gain (nats), then val_loss/CORPUS per corpus, then
    attn_logit_max/L0, /L1 ... (study.modeling.diagnostics.CURVE_DIAGNOSTICS, layers in order; empty in a row without them),
    written atomically."""
    from study.modeling.diagnostics import CURVE_DIAGNOSTICS, layer_order

    tmp = path.with_suffix(".tmp")
    extra = ["val_accuracy"] if any("val_accuracy" in r for r in rows) else []  # the mlm and mqar tasks
    extra += sorted({k for r in rows for k in r if k.startswith("val_loss/")})
    extra += sorted({k for r in rows for k in r if k.split("/")[0] in CURVE_DIAGNOSTICS}, key=layer_order)
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "tokens", "train_loss", "val_loss", "lr", "in_context_gain", *extra], restval="nan")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})
    tmp.replace(path)


def write_positions(path: Path, position_loss: list[float]) -> None:
    """positions.csv: ``position`` (1..block_size: the number of tokens of context) and ``val_loss`` (nats,
    mean over the fixed validation windows), one row per position, written atomically."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["position", "val_loss"])
        w.writerows([i, f"{v:.6f}"] for i, v in enumerate(position_loss, start=1))
    tmp.replace(path)


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as strict JSON (NaN/inf refused: ValueError), written atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False))
    tmp.replace(path)


#: the checkpoint key of a run's training time up to that checkpoint (s, every segment of a resumed run)
WALL_CLOCK_KEY = "study_wall_time_s"


def wall_clock_callback():
    """A callback that writes the run's wall time so far into every checkpoint (:data:`WALL_CLOCK_KEY`:
    ``earlier`` (the segments before this process, from the resumed checkpoint) + the time since ``t0``),
    so that record.json's wall_time_s of a killed and resumed run counts every segment."""
    from lightning.pytorch.callbacks import Callback

    class WallClock(Callback):
        earlier, t0 = 0.0, None

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if self.t0 is not None:
                checkpoint[WALL_CLOCK_KEY] = self.earlier + time.time() - self.t0
    return WallClock()


def recorded_config(cfg, data_digest: str) -> dict:
    """config.json of a run: the resolved config it trained with (without the study,
    scale_ladder and defaults sections, which say which runs exist) plus the prepared data's digest;
    compare pairs only runs whose config.json agree on everything but the variant."""
    from study.config import LAUNCH_SECTIONS, VERDICT_SECTIONS

    d = {k: v for k, v in to_dict(cfg).items()
         if k not in ("study", "scale_ladder", "defaults", *VERDICT_SECTIONS, *LAUNCH_SECTIONS)}
    return {**d, "data_digest": data_digest}


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
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar

    from study.tasks import get_task
    from study.tasks.common import val_count
    from study.modeling.lm import GPTModule, throughput_monitor, wants_throughput_monitor
    from study.modeling.diagnostics import final_diagnostics
    from study.runner.progress import progress_callback, quiet_logs
    from study.runner.tracking import (artifact_location, ensure_experiment, git_commit, log_files, log_text, logged_steps,
                                run_params,
                                step_aligned_logger, store_lock, tracking_uri)

    from study.runner.profiles import resolve

    check_multi_node(cfg.trainer)  # num_nodes > 1 without a launcher would hang in Lightning's start for ever
    resolve(cfg, root)  # profile settings: compute-matched tokens, the lr sweep's best lr
    name = run_label(cfg)
    out_dir = run_dir(root, cfg, cfg.variant.name, cfg.seed)
    ckpt_dir = out_dir / "checkpoints"
    task = get_task(cfg.task.name)  # its data, objective and metric (study/tasks/)
    data_dir = task_data_dir(cfg, root)  # lm, mlm: data.dir; mqar: its kept test set
    uri = tracking_uri(root, cfg.study)  # an unsupported MLFLOW_TRACKING_URI is refused here
    meta = task.check_data(cfg, root)  # lm: before Lightning, a loader without one step would spin forever
    steps = max_steps(cfg)
    ws = world_size(cfg.trainer)
    micro, accum = micro_batches(cfg, ws)
    # every rank runs this function; files are written by global rank 0 only (checkpoints: see ModelCheckpoint)
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    rank_zero_only.rank = rank = launch_rank(cfg.trainer)  # MLflow: one run, created by rank 0 only
    n_val = val_count(cfg)
    val_micro = min(cfg.train.val_micro_batch_size, n_val)
    while n_val % val_micro:
        val_micro -= 1
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)

    if rank == 0:  # one writer per run folder, for the run's life; SIGTERM ends it as KILLED
        stack.enter_context(hold_run_lock(out_dir))
    stack.enter_context(terminate_as_exception())

    # resume only a checkpoint of this very config, code and data that has not finished
    record, digest, state, previous_run_id, resume, replaced = open_run_folder(cfg, name, out_dir, data_dir, rank)
    stack.callback(replaced.restore)  # the last run's outputs come back unless the Trainer gets built (discard)
    # read before MLflow or the folder changes: an unreadable checkpoint stops the start in one line
    start_step, earlier = read_resume_checkpoint(resume, WALL_CLOCK_KEY) if resume is not None else (0, 0.0)
    state_path = ckpt_dir / "run.json"

    quiet_logs()
    with store_lock(root, cfg.study):  # two runs creating the store, experiment or run at once would race
        if rank == 0 and previous_run_id:
            state = settle_previous_run(uri, previous_run_id, resuming=resume is not None, state=state)
        if rank == 0:
            from mlflow import MlflowClient
            experiment_id = ensure_experiment(MlflowClient(uri), root, cfg.study)
            # runs of this folder left RUNNING by a process that died without a word, whose id run.json no
            # longer holds (its checkpoints/ deleted, as an unreadable checkpoint's error advises): KILLED
            end_orphaned_runs(MlflowClient(uri), experiment_id, out_dir,
                              keep=state.get("mlflow_run_id") if resume is not None else None)
        logger = step_aligned_logger(experiment_name=cfg.study.name, run_name=name,
                              tracking_uri=uri,
                              artifact_location=artifact_location(root, cfg.study), run_id=state.get("mlflow_run_id"),
                              tags={"variant": cfg.variant.name, "seed": str(cfg.seed), "git_commit": git_commit(root),
                                    "config_hash": digest, "model": cfg.model.name,
                                    "group": cfg.study.group or "main", RUN_FOLDER_TAG: run_folder_tag(out_dir)})
        run_id = logger.run_id
        if rank == 0 and resume is not None and state.get("mlflow_run_id") == run_id:  # each step logged once
            logger.logged_through = logged_steps(logger.experiment, run_id)
    try:  # from here on an exception ends the MLflow run FAILED (KILLED on SIGTERM), never RUNNING
        if not state.get("mlflow_run_id"):
            logger.log_hyperparams(run_params(cfg))  # what shapes the run; the whole config is config.yaml
            if rank == 0:
                from omegaconf import OmegaConf
                log_text(root, cfg.study, run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
            state = {"config_hash": digest, "mlflow_run_id": run_id, "completed": False,
                     "seconds": state.get("seconds", 0.0), "resume": record}
            if rank == 0:
                write_json(state_path, state)
        data_seed, _ = run_seeds(cfg)  # the order of the windows; the init seed goes to GPTModule
        pl.seed_everything(cfg.seed, workers=True, verbose=False)  # anything else random (dropout)
        dm = task.datamodule(cfg, root, meta, micro, data_seed, n_val, val_micro,
                             global_batch=micro * accum * ws)  # the same windows per step on any world size
        module = GPTModule(cfg, corpora=dm.corpora, vocab_size=task.model_vocab(cfg, meta))
        logger.log_metrics({"non_embedding_params": module.counts["non_embedding_params"],
                            "flops_per_token": module.counts["flops_per_token"]}, step=0)
        # saved (atomically, by Lightning) at the end of every evaluation: the curve row is in it
        checkpoint = ModelCheckpoint(dirpath=ckpt_dir, filename="last", monitor=None, save_top_k=1,
                                     enable_version_counter=False)
        progress = progress_callback(name, steps, cfg.train.batch_tokens, enabled=cfg.trainer.progress_bar)
        clock = wall_clock_callback()
        callbacks = [checkpoint, loop_state_callback(accum), clock] + ([progress] if progress is not None else [])
        if wants_throughput_monitor(cfg.trainer):  # throughput and MFU against the datasheet peak (no MFU on CPUs)
            callbacks.append(throughput_monitor(window=min(100, steps * accum // 4)))
        trainer = build_trainer(
            accelerator=cfg.trainer.accelerator, devices=cfg.trainer.devices, num_nodes=cfg.trainer.num_nodes,
            strategy=make_strategy(cfg.trainer), precision=cfg.trainer.precision,
            max_steps=steps, max_epochs=-1, accumulate_grad_batches=accum, gradient_clip_val=cfg.train.grad_clip,
            val_check_interval=cfg.train.eval_every * accum, check_val_every_n_epoch=None,
            limit_val_batches=n_val // val_micro, num_sanity_val_steps=0, log_every_n_steps=cfg.train.log_every,
            use_distributed_sampler=False,  # litdata splits the train windows; every rank evaluates all val windows
            logger=logger, callbacks=callbacks, enable_progress_bar=isinstance(progress, ProgressBar),
            enable_model_summary=False, deterministic=cfg.trainer.accelerator == "cpu",
            default_root_dir=str(out_dir))
        replaced.discard()  # the Trainer took its settings: this run replaces the folder's last one
        logger.step_of = lambda: trainer.global_step  # metric steps = optimizer steps, as in curve.csv
        t0 = time.time()
        if resume is not None:  # earlier: the earlier segments' training time
            if rank == 0:
                print(f"{name}: resuming from step {start_step} ({resume})", flush=True)
        clock.earlier, clock.t0 = earlier, t0
        trainer.fit(module, dm, ckpt_path=str(resume) if resume else None)
        if not module.diverged and (not module.curve or module.curve[-1]["step"] != trainer.global_step):
            trainer.validate(module, dm, verbose=False)
        seconds = time.time() - t0
        if not module.diverged and trainer.global_step != steps:
            raise DataError(f"the run stopped after {trainer.global_step} of {steps} steps: the training split of "
                            f"{data_dir} is too small for one batch of train.batch_tokens={cfg.train.batch_tokens}; "
                            f"prepare more data or lower batch_tokens")
        module.check_final()  # a final evaluation above the best + divergence_nats is a divergence too
    except BaseException as e:
        try:
            logger.finalize("failed")
        except Exception:  # noqa: BLE001  (the store busy: the status below is what counts)
            pass
        if rank == 0:  # FAILED (exception) or KILLED (SIGTERM, Ctrl-C), with an end time
            for attempt in range(5):  # two trainings killed at once write the one SQLite store at once: retry
                try:
                    logger.experiment.set_terminated(run_id, end_status(e))
                    break
                except Exception:  # noqa: BLE001  (never hide the run's own error)
                    time.sleep(0.5 * (attempt + 1))
        raise
    trained_tokens = (trainer.global_step - start_step) * cfg.train.batch_tokens
    state.update(completed=True, seconds=earlier + seconds)  # every segment of a resumed run
    trainer.save_checkpoint(ckpt_dir / "last.ckpt", weights_only=False)  # on every rank: it ends with a barrier
    lr, min_lr = peak_lr(cfg)
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
        "lr": lr,
        "min_lr": min_lr,
        "model": cfg.model.name,
        "group": cfg.study.group,
        "non_embedding_params": module.counts["non_embedding_params"],
        "total_params": module.counts["total_params"],
        "flops_per_token": module.counts["flops_per_token"],
        "wall_time_s": round(state["seconds"], 2),
        "tokens_per_s": round(trained_tokens / seconds, 1) if seconds > 0 else None,
        "tokenizer": meta["tokenizer"],
        "config_hash": digest,
        "mlflow_run_id": state["mlflow_run_id"],
    }
    if cfg.task.name != "lm":  # its metric beside the loss, and what chance or a count model scores
        acc = final.get("val_accuracy", float("nan")) if ok else float("nan")
        metrics.update(task=cfg.task.name, val_accuracy=acc if math.isfinite(acc) else None,
                       yardsticks=task.yardsticks(cfg, root, meta))
    if trainer.is_global_zero:
        client = logger.experiment
        if ok:
            client.log_metric(logger.run_id, "final_val_loss", val_loss)
            if metrics["in_context_gain"] is not None:
                client.log_metric(logger.run_id, "in_context_gain", metrics["in_context_gain"])
            from mlflow.entities import Metric  # the per-position curve, step = position, in one batch
            now = int(time.time() * 1000)
            rows = [Metric("val_loss_by_position", loss, now, pos) for pos, loss in enumerate(module.position_loss, 1)]
            for i in range(0, len(rows), 1000):  # MLflow takes at most 1000 metrics per batch
                client.log_batch(logger.run_id, metrics=rows[i:i + 1000])
        client.log_metric(logger.run_id, "tokens_per_s_mean", metrics["tokens_per_s"] or 0.0)
        data_digest = prepared_data_digest(data_dir)
        client.set_tag(logger.run_id, "data_digest", data_digest)
        # a diverged run is a result (a lost point), not a crash: it ends FINISHED like any run that ran to
        # its end, tagged status=diverged with the reason and the step (study.analysis.runs.load_mlflow)
        client.set_tag(logger.run_id, "status", metrics["status"])
        if module.diverged:
            client.set_tag(logger.run_id, "diverged", module.diverged)
            client.set_tag(logger.run_id, "diverged_step", str(module.diverged_step))
        write_curve(out_dir / "curve.csv", module.curve)
        if ok and module.position_loss:
            write_positions(out_dir / "positions.csv", module.position_loss)
        write_json(out_dir / "config.json", recorded_config(cfg, data_digest))
        numbers, record = split_result(metrics)
        write_json(out_dir / "record.json", record)
        write_json(out_dir / "metrics.json", numbers)  # last: a run folder with metrics.json has finished
        write_json(state_path, state)
        log_files(root, cfg.study, logger.run_id,
                  [out_dir / p for p in ("curve.csv", "positions.csv", "metrics.json", "record.json")])
    return metrics


def _report(cfg, root: Path) -> int:
    metrics = train(cfg, root)
    if launch_rank(cfg.trainer) != 0:
        return 0  # one report, from global rank 0
    name = run_label(cfg)
    if metrics["status"] != "ok":
        print(f"{name}: DIVERGED at step {metrics['diverged_step']}: {metrics['reason']}", file=sys.stderr)
        return 0  # a diverged run is a result, reported by compare
    acc = f", val_accuracy {metrics['val_accuracy']:.4f}" if metrics.get("val_accuracy") is not None else ""
    print(f"{name}: val_loss {metrics['val_loss']:.4f} nats{acc} after {metrics['tokens']:,} tokens "
          f"in {metrics['wall_time_s']:.0f} s ({metrics['tokens_per_s']:,.0f} tokens/s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # started by a stage's local launcher: end with it
    try:
        return run_stage(_report, argv)
    except KeyboardInterrupt:  # the run was marked KILLED and its lock released; as study.tune and study.test_runs do
        print(INTERRUPTED.format(stage="study.train"), file=sys.stderr)
        return 130


if __name__ == "__main__":
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    sys.exit(main())
