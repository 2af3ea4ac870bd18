"""The LightningModule: one class for every variant, configured by ``cfg.variant``.

Loss is the mean next-token cross-entropy in nats; ``val_loss`` is its mean over
the fixed validation windows and ``val_perplexity = exp(val_loss)``.  Every evaluation also keeps the
per-position validation loss (:attr:`GPTModule.position_loss`: the mean over the windows at each position
1..block_size, position t predicting token t+1 from t tokens of context; its mean is ``val_loss``) and
``in_context_gain`` (:func:`in_context_gain`), how much of the loss the context takes away.  AdamW
(beta1, beta2) with weight decay on 2-D weights only, linear warmup then ``train.schedule`` (cosine
decay to min_lr, linear decay to zero, or warmup-stable-decay; per optimizer step), an optional z-loss
on the training objective (``train.z_loss``, logged as ``z_loss``), gradient clipping by the Trainer (by the root FSDP module's
``clip_grad_norm_`` under FSDP).

Multi-device: the train loss of an optimizer step is the mean over its micro-batches on all ranks
(one host sync and one all-reduce per optimizer step, never per micro-batch); every rank evaluates
all validation windows, so ``val_loss`` is the same on every rank and world size.
"""
from __future__ import annotations

import math
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torchmetrics.aggregation import MeanMetric

from study.config import RunConfig, peak_lr, run_seeds
from study.modeling.diagnostics import curve_diagnostics, diagnostics
from study.modeling.accounting import flops_per_token, param_counts
from study.modeling.lr_schedule import schedule_of
from study.modeling.model import GPT
from study.tasks import configured_rows, get_task
from study.tasks.common import scored


#: positions (1-based) whose mean loss is the start of :func:`in_context_gain`: 1-4 tokens of context
EARLY_POSITIONS = 4


def in_context_gain(position_loss: list[float]) -> float:
    """Mean loss (nats) at positions 1-4 minus the mean over the last quarter of the window.

    ``position_loss``: the per-position validation loss, (block_size,) in nats, position 1 first
    (the prediction of the 2nd token from one token of context).  How much a model's loss falls as its
    context grows: ~0 for a model that ignores its context, ~0.4 nats for a GPT with induction heads
    (arXiv 2209.11895 measure loss at token 50 minus token 500; this is its analogue for short windows).

    Raises:
        ValueError: fewer than 8 positions (the two ranges would overlap).
    """
    n = len(position_loss)
    if n < 2 * EARLY_POSITIONS:
        raise ValueError(f"in_context_gain needs a window of at least {2 * EARLY_POSITIONS} positions, got {n}")
    late = position_loss[n - n // 4:]
    return sum(position_loss[:EARLY_POSITIONS]) / EARLY_POSITIONS - sum(late) / len(late)


class GPTModule(pl.LightningModule):
    """Trains :class:`study.modeling.model.GPT` on batches of (B, block_size + 1) token ids.

    Keeps the learning curve (one row per evaluation: step, tokens, train_loss,
    val_loss, lr) in the checkpoint, so a resumed run writes the whole curve.

    Divergence (the rule of the guard of the public follow-up "Retuning the Linear Baseline at GPT-3 Large" (GitHub fork 25simsa1/1beyond_query_linearity, 2026):
    a non-finite loss, or two
    consecutive evaluations above the best + ``train.divergence_nats``) stops the run, with
    ``self.diverged`` set to the reason and ``self.diverged_step`` to the optimizer step:
      - the train loss of an optimizer step is NaN/inf (all-reduced: every rank stops at that step);
      - a validation loss is NaN/inf (validation averages keep NaN: ``MeanMetric(nan_strategy="disable")``;
        torchmetrics' default would drop the NaN windows and average the finite rest);
      - two consecutive evaluations each exceed the best validation loss so far by more than
        ``train.divergence_nats``.  The best starts at ln(vocab_size), the loss of the uniform
        prediction that the untrained model (weights N(0, 0.02): near-zero logits) makes to within a few
        hundredths of a nat, so a run that is worse than untrained from its first evaluation on diverges
        too; every rank evaluates all windows, so all ranks decide alike.
    :meth:`check_final` (called by study.train after the last evaluation) adds the end of the run: a run
    whose final evaluation exceeds the best by more than ``divergence_nats`` (no later evaluation could
    confirm or clear it) has no result to report and is diverged as well.
    """

    def __init__(self, cfg: RunConfig, corpora: list[str] | None = None, vocab_size: int | None = None):
        """``vocab_size``: the embedding's rows (the task's ``model_vocab`` of the prepared data; None: the rows
        the config names, :func:`study.tasks.configured_rows`)."""
        super().__init__()
        vocab_size = configured_rows(cfg) if vocab_size is None else vocab_size
        self.cfg = cfg
        self.corpora = list(corpora or [])  # names of the validation batches' corpus indices
        self.task = get_task(cfg.task.name)  # its objective (split), mask (CAUSAL) and scored positions (LABELLED)
        self.model = GPT(cfg.model, cfg.variant, vocab_size, init_seed=run_seeds(cfg)[1], causal=self.task.CAUSAL)
        counts = param_counts(self.model)  # counted on the model just built, not a second copy
        self.counts = {"total_params": counts["total"], "non_embedding_params": counts["non_embedding"],
                       "flops_per_token": flops_per_token(self.model)}
        self.lr, self.min_lr = peak_lr(cfg)
        self._lr_of = schedule_of(cfg, self.lr, self.min_lr)  # the lr per optimizer step, the config read once
        # read every step: plain numbers (an OmegaConf read costs ~1 us x its depth on a CPU, every step)
        self._z_loss, self._log_every = cfg.train.z_loss, cfg.train.log_every
        self._step_tokens = cfg.train.batch_tokens
        self.val_loss = MeanMetric(nan_strategy="disable")  # a NaN window makes val_loss NaN: a divergence
        self.val_accuracy = MeanMetric(nan_strategy="disable")  # LABELLED tasks: argmax = target, scored positions
        # per-corpus validation loss of the current evaluation: summed window losses and window counts,
        # (n_corpora,) each; every rank evaluates all windows, so no reduction across ranks is needed
        self._corpus_sum: torch.Tensor | None = None
        self._corpus_n: torch.Tensor | None = None
        # per-position validation loss of the current evaluation: summed (block_size,) and window count
        self._position_sum: torch.Tensor | None = None
        self._position_n = 0
        self.position_loss: list[float] = []  # (block_size,) nats, of the latest evaluation (kept in checkpoints)
        self.curve: list[dict] = []
        self.diverged: str | None = None
        self.diverged_step: int | None = None
        self._train_losses: list[float] = []  # per optimizer step since the last evaluation (nats)
        self._step_loss: torch.Tensor | None = None  # sum of this optimizer step's micro-batch losses, on device
        self._step_micro = 0
        self._last_step: int | None = None
        self._best_val = math.log(vocab_size)  # nats: the untrained model's loss (see the class docstring)
        self._above: list[tuple[int, float]] = []  # (step, val_loss) of the evaluations since the last one within bounds
        self._t_last: float | None = None
        self._tokens_since = 0
        self._compiled = None
        self._batch_tokens = 0  # tokens (B x block_size) of the latest micro-batch, for flops_per_batch
        if cfg.trainer.compile:  # compile the inner model, not the LightningModule (self.log breaks it);
            # kept out of the module tree so checkpoints hold plain weights and load compiled or not
            object.__setattr__(self, "_compiled", torch.compile(self.model))

    # -- steps -----------------------------------------------------------------------------------
    def _loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(mean next-token cross-entropy (nats), the z-loss term or None) of ``batch`` (B, block_size + 1).

        The z-loss term is ``train.z_loss`` x mean over tokens of logsumexp(logits)^2 (the softmax's
        log-normaliser; PaLM, arXiv 2204.02311, section 5; arXiv 2309.14322, section 3.2), None while
        ``train.z_loss`` is 0; the training objective is their sum (:meth:`training_step`)."""
        inputs, targets = self.task.split(batch)  # lm: (B, block_size + 1) -> its first and last block_size
        model = self._compiled if self._compiled is not None else self.model
        logits, loss = model(inputs, targets)  # (B, T, V), scalar: the mean over the scored positions
        z = self._z_loss
        if not z:
            return loss, None
        return loss, z * torch.logsumexp(logits.float(), dim=-1).square().mean()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss, z_term = self._loss(batch)
        if z_term is not None:  # logged apart; train_loss (and val_loss) stay the plain cross-entropy
            self.log("z_loss", z_term.detach(), on_step=True, on_epoch=False)
        # kept on the device: read once per optimizer step (on_train_batch_end), not per micro-batch
        self._step_loss = loss.detach() if self._step_loss is None else self._step_loss + loss.detach()
        self._step_micro += 1
        self._batch_tokens = self.task.tokens(batch)
        self._tokens_since += self._batch_tokens * self.trainer.world_size
        return loss if z_term is None else loss + z_term

    @property
    def flops_per_batch(self) -> int:
        """Model FLOPs of the latest micro-batch on one device (read by Lightning's ThroughputMonitor):
        training ``flops_per_token`` (6N + 12 L C T, forward + backward) x its tokens; a validation batch
        runs the forward only, 1/3 of it (PaLM, arXiv 2204.02311, Appendix B)."""
        fpt = self.counts["flops_per_token"]
        return fpt * self._batch_tokens if self.training else fpt * self._batch_tokens // 3

    def _step_train_loss(self) -> float:
        """Mean train loss (nats) of the optimizer step just taken: its micro-batch losses (each the mean
        over its B x block_size tokens, all of equal size) averaged over accumulation and ranks.  One
        all-reduce of 2 numbers and one host sync per optimizer step."""
        loss_sum = self._step_loss.float()
        stats = torch.stack([loss_sum, torch.full_like(loss_sum, self._step_micro)])  # (2,): sum, micro-batches
        total, count = self.trainer.strategy.reduce(stats, reduce_op="sum").tolist()
        self._step_loss, self._step_micro = None, 0
        return total / count

    def _logger_flushes(self) -> bool:
        """Whether Lightning sends this optimizer step's logged values to the logger (every ``log_every_n_steps``
        = ``train.log_every`` steps, its logger connector's own test, read so that the MLflow history keeps exactly
        the steps it had when every step was logged); True where the trainer has no such connector."""
        connector = getattr(self.trainer, "_logger_connector", None)
        return True if connector is None else bool(connector.should_update_logs)

    def on_train_start(self) -> None:
        self._last_step, self._step_loss, self._step_micro = self.trainer.global_step, None, 0

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step = self.trainer.global_step
        if step == self._last_step:  # a micro-batch inside gradient accumulation: no optimizer step yet
            return
        self._last_step = step
        loss = self._step_train_loss()
        self._train_losses.append(loss)
        if self._logger_flushes():  # self.log costs ~1 ms a call on a CPU: only at the steps the logger receives
            self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        if not math.isfinite(loss):
            self._diverge(step, f"non-finite train loss ({loss}) at step {step}")
            return
        now = time.perf_counter()
        if self._t_last is None:
            self._t_last, self._tokens_since = now, 0
        elif step % self._log_every == 0 and (now - self._t_last) > 0:
            tokens_per_s = self._tokens_since / (now - self._t_last)
            logs = {"tokens_per_s": tokens_per_s, "tokens": float(step * self._step_tokens),
                    "lr": self.lr_schedulers().get_last_lr()[0]}
            for logger in self.loggers:  # straight to the logger at this step (self.log costs ~1 ms a value on a CPU)
                logger.log_metrics(logs, step=step)
            self._t_last, self._tokens_since = now, 0

    def _token_losses(self, batch: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy (nats) of every position of ``batch`` (B, block_size + 1): (B, T)."""
        batch = batch.long()
        model = self._compiled if self._compiled is not None else self.model
        logits, _ = model(batch[:, :-1])  # (B, T, V)
        # (B, T, V) -> (B, V, T) against (B, T): per-token losses
        return F.cross_entropy(logits.float().transpose(1, 2), batch[:, 1:], reduction="none")

    def validation_step(self, batch, batch_idx: int) -> None:
        """``batch`` = (tokens (B, block_size + 1), corpus index (B,)), or tokens alone; a LABELLED task's
        [inputs (B, T), targets (B, T), ...]: val_loss and val_accuracy are means over its scored positions."""
        if self.task.LABELLED:
            inputs, targets = self.task.split(batch)
            model = self._compiled if self._compiled is not None else self.model
            losses, mask, correct = scored(model(inputs)[0], targets)  # (B, T) each
            n = mask.sum()
            self.val_loss.update(losses.sum() / n, weight=n)
            self.val_accuracy.update(correct.sum() / n, weight=n)
            if batch_idx == 0 and not self.trainer.sanity_checking:
                self._diag_batch = inputs  # (B, T): the diagnostics of on_validation_epoch_end
            return
        tokens, corpus = batch if isinstance(batch, (list, tuple)) else (batch, None)
        self._batch_tokens = tokens.shape[0] * (tokens.shape[1] - 1)  # for flops_per_batch
        token_losses = self._token_losses(tokens)  # (B, T)
        losses = token_losses.mean(dim=1)  # (B,): each window's mean
        self.val_loss.update(losses.mean(), weight=tokens.shape[0])
        sums = token_losses.detach().sum(dim=0)  # (T,): summed over the windows
        self._position_sum = sums if self._position_sum is None else self._position_sum + sums
        self._position_n += tokens.shape[0]
        if corpus is not None and self.corpora:
            k = len(self.corpora)
            onehot = F.one_hot(corpus.long(), k).to(losses.dtype)  # (B, n_corpora)
            sums, counts = (losses.detach() @ onehot), onehot.sum(0)
            self._corpus_sum = sums if self._corpus_sum is None else self._corpus_sum + sums
            self._corpus_n = counts if self._corpus_n is None else self._corpus_n + counts
        batch = tokens
        if batch_idx == 0 and not self.trainer.sanity_checking:
            # projection diagnostics (||f(x)||/||x||, attention entropy) on the first fixed validation
            # batch (B, block_size), computed at the epoch's end where FSDP can gather the full weights
            self._diag_batch = batch[:, :-1].long()

    def _diagnostics(self) -> dict[str, float] | None:
        """:func:`study.modeling.diagnostics.diagnostics` on the stored batch; None where it is not logged.

        Under FSDP the Blocks' weights are shards outside their own forward, so the full weights are
        gathered (``summon_full_params``, a collective: every rank takes part); otherwise rank 0 only.
        """
        idx, self._diag_batch = getattr(self, "_diag_batch", None), None
        if idx is None:
            return None
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(self.trainer.strategy, FSDPStrategy):
            from torch.distributed.fsdp import FullyShardedDataParallel

            with FullyShardedDataParallel.summon_full_params(self.trainer.strategy.model, writeback=False):
                diag = diagnostics(self.model, idx)
            return diag if self.trainer.is_global_zero else None
        return diagnostics(self.model, idx) if self.trainer.is_global_zero else None

    def on_validation_epoch_end(self) -> None:
        val_loss = self.val_loss.compute().item()
        self.val_loss.reset()
        accuracy = {"val_accuracy": self.val_accuracy.compute().item()} if self.task.LABELLED else {}
        self.val_accuracy.reset()
        per_corpus = {}
        if self._corpus_sum is not None:
            sums, counts = self._corpus_sum.tolist(), self._corpus_n.tolist()
            per_corpus = {f"val_loss/{c}": s / n for c, s, n in zip(self.corpora, sums, counts) if n > 0}
        self._corpus_sum = self._corpus_n = None
        if self._position_sum is not None:  # (T,) mean over windows; its mean over positions is val_loss
            self.position_loss = (self._position_sum.double() / self._position_n).tolist()
        self._position_sum, self._position_n = None, 0
        self.log_dict({"val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 50.0)), **per_corpus, **accuracy},
                      sync_dist=False)
        diag = self._diagnostics()
        if diag and self.logger is not None:
            self.logger.log_metrics({f"diag/{k}": v for k, v in diag.items()}, step=self.trainer.global_step)
        if self.trainer.sanity_checking:
            return
        step = self.trainer.global_step
        train = self._train_losses
        self.curve = [r for r in self.curve if r["step"] != step] + [{
            "step": step,
            "tokens": step * self.cfg.train.batch_tokens,
            "train_loss": sum(train) / len(train) if train else float("nan"),
            "val_loss": val_loss,
            **accuracy,
            "lr": self.lr_at(step),
            **({"in_context_gain": in_context_gain(self.position_loss)}
               if len(self.position_loss) >= 2 * EARLY_POSITIONS else {}),
            **per_corpus,
            **curve_diagnostics(diag),
        }]
        self._train_losses = []
        self._check_divergence(step, val_loss)

    # -- divergence --------------------------------------------------------------------------------
    def _diverge(self, step: int, reason: str) -> None:
        """Record the first divergence (reason, optimizer step) and stop the fit loop."""
        if self.diverged is None:
            self.diverged, self.diverged_step = reason, step
        self.trainer.should_stop = True

    def _check_divergence(self, step: int, val_loss: float) -> None:
        """The evaluation rule of the class docstring, after the evaluation at optimizer ``step``."""
        nats = self.cfg.train.divergence_nats
        if not math.isfinite(val_loss):
            self._diverge(step, f"non-finite validation loss ({val_loss}) at step {step}")
            return
        if val_loss > self._best_val + nats:
            self._above = [*self._above[-1:], (step, val_loss)]
            if len(self._above) >= 2:
                (s0, l0), (s1, l1) = self._above[-2:]
                self._diverge(step, f"validation loss {l0:.4g} and {l1:.4g} at steps {s0} and {s1}: two consecutive "
                                    f"evaluations more than train.divergence_nats={nats:g} above the best "
                                    f"{self._best_val:.4f}")
            return
        self._above = []
        self._best_val = min(self._best_val, val_loss)

    def check_final(self) -> None:
        """After the run's last evaluation: a final evaluation above the best + ``train.divergence_nats``
        (one the evaluation rule could not yet confirm) makes the run diverged at that step."""
        if self.diverged is None and self._above:
            step, loss = self._above[-1]
            nats = self.cfg.train.divergence_nats
            self.diverged, self.diverged_step = (f"final validation loss {loss:.4g} at step {step} is more than "
                                                 f"train.divergence_nats={nats:g} above the best "
                                                 f"{self._best_val:.4f}"), step

    # -- optimisation ------------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """Learning rate used at optimizer step ``step``: warmup, then ``train.schedule`` (cosine to
        min_lr, d2z, wsd; :func:`study.modeling.lr_schedule.schedule_of`), in steps."""
        return self._lr_of(step)

    def configure_optimizers(self):
        decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() < 2]
        t = self.cfg.train
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=self.lr, betas=(t.beta1, t.beta2))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: self.lr_at(step) / self.lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip the global gradient norm to ``train.grad_clip`` (the Trainer's gradient_clip_val).

        Under FSDP each rank holds a shard of the gradients, so ``torch.nn.utils.clip_grad_norm_``
        would clip by a per-shard norm, and Lightning's FSDP precision plugin refuses
        ``gradient_clip_algorithm="norm"``; the root FSDP module's ``clip_grad_norm_`` computes the norm
        over all shards (an all-reduce; called on every rank).  Every other strategy: Lightning's own.
        """
        if not gradient_clip_val:
            return
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(self.trainer.strategy, FSDPStrategy):
            if gradient_clip_algorithm not in (None, "norm"):  # Lightning's GradClipAlgorithmType is a str enum
                raise ValueError(f"gradient_clip_algorithm={gradient_clip_algorithm!r} under FSDP: only 'norm' "
                                 f"(train.grad_clip) is supported")
            self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    # -- checkpoint ------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["study"] = {"curve": self.curve, "train_losses": self._train_losses, "best_val": self._best_val,
                               "above": self._above, "position_loss": self.position_loss}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        s = checkpoint.get("study", {})
        self.curve = s.get("curve", [])
        self._train_losses = s.get("train_losses", [])
        self._best_val = s.get("best_val", self._best_val)
        self._above = [tuple(x) for x in s.get("above", [])]
        self.position_loss = list(s.get("position_loss", []))
