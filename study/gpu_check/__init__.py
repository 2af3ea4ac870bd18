"""The GPU path measured in one command: ``python -m study.gpu_check --out DIR [--cpu]``.

Made for one GPU machine that has no network and gets only a copy of the working tree (docs/benchmarks.md
gives the exact command).  Two steps:

``python -m study.gpu_check --prepare`` (``make gpu-prep``), on a connected machine with the project's
venv, writes the git-ignored folder ``.gpu/``:

  wheels/   the wheels (Python 3.12, manylinux x86_64) of every package the run needs that the GPU
            image lacks (:data:`IMAGE_PACKAGES`): omegaconf and its antlr4 runtime, litdata (without
            its torchvision requirement) and boto3 (which litdata imports), mlflow-skinny with the
            SQLite store (sqlalchemy, alembic), each with its own dependencies, and protobuf (the
            version these were tested with here, first on the path there); never torch
  tokens/   the embedded corpus, GPT-2 tokenised (``study.prepare data=gpt2``), the first
            ``--max-docs`` documents of each corpus (default all: 4.4M train + 0.5M val tokens, 9.4 MiB;
            every 8th document held out, so the 250 training steps below stay inside one epoch)

and, where the copy to the GPU machine has a size limit, checks that the copy (the files git does not
ignore + ``.gpu/``) stays within ``--max-bytes`` (default 64 MiB; 0: no limit).

``python -m study.gpu_check --out DIR`` (on the GPU machine) installs the wheels into ``.gpu/site``
(``pip install --no-index --no-deps --target``, put first on PYTHONPATH for every phase), then runs
each phase in its own process under its own time limit, and rewrites ``DIR/results.json`` and
``DIR/results.md`` after every phase (a phase killed at its limit keeps what it wrote):

  env             versions, the GPU's name and memory
  bench_compiled  ``study.bench`` at gpt3-small (GPT-2 vocabulary 50,304, block 1024, 16 x 1024 tokens
                  per step), trainer=gpu, bf16-mixed, torch.compile'd, baseline / nonlinear_q /
                  identity_q: plain loop and Lightning tokens/s, MFU against the datasheet dense bf16
                  peak (989.4 TFLOP/s on an H100/H200 SXM), peak GPU memory
  train           a real ``study.train`` run of gpt3-small on the prepared tokens (250 steps), killed
                  with SIGKILL once a checkpoint past step 100 is on disk, then run again: it must
                  resume from that checkpoint (checked on the training windows it reads) and finish
                  with a lower loss than at its first evaluation
  eval            the final checkpoint evaluated with two validation micro-batch sizes
                  (``train.val_micro_batch_size``, the project's own validation step): the two
                  val_loss must agree
  bench_eager     the same bench without compilation

``--cpu`` runs the same phases at the nano model in fp32 with small budgets, on the running
Python's packages (no install: the wheels are for the GPU machine's Python 3.12);
``--simulate-image`` adds an import blocker that fails every import of a package that is neither on
the GPU image nor among the carried wheels (a rehearsal, here, of the GPU machine's environment).
``tests/test_gpu_check.py`` runs the CPU profile, so the script is known to work before any GPU
time is spent; ``--only`` runs some of the phases (a re-run).

The targets (baseline MFU >= 45% bf16 compiled, nonlinear_q >= 0.97x the baseline's tokens/s,
Lightning >= 0.97x the plain loop) are reported, not asserted; the exit code is 1 when a correctness
check (loss fell, resume, val_loss agreement) failed or a phase did not finish, 2 for bad arguments or
missing prepared data.
"""
from __future__ import annotations

from study.gpu_check.cli import main
from study.gpu_check.image import image_blocklist, prepare, split_wheels
from study.gpu_check.plan import CPU, GPU, PHASES, GpuCheckError
from study.gpu_check.results_md import markdown

__all__ = ["CPU", "GPU", "PHASES", "GpuCheckError", "image_blocklist", "main", "markdown", "prepare", "split_wheels"]
