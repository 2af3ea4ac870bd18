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

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# -- what the GPU image has -----------------------------------------------------------------------------
# The Python distributions of the GPU image this check is made for (an offline H200 machine's image, its
# package list as of 2026-11-17): Python 3.12, torch 2.11 (CUDA), lightning 2.6.6, torchmetrics 1.9, ...
# A dependency whose name is here gets no wheel in .gpu/wheels.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())

# Carried at the versions of this project's venv.  NO_DEPS: the wheel alone (litdata's metadata asks for
# torchvision, which would pull a torch; omegaconf's and hydra-core's antlr4 4.9 runtime exists only as an
# sdist and is built into a wheel here).  WITH_DEPS: the wheel and its dependency tree, less IMAGE_PACKAGES.
NO_DEPS = ("omegaconf", "hydra-core", "litdata", "protobuf")
BUILD = ("antlr4-python3-runtime",)
WITH_DEPS = ("mlflow-skinny", "sqlalchemy", "alembic", "boto3")
NEVER = ("torch", "torchvision", "nvidia-", "triton")  # never carried, whatever a dependency asks
# carried although the image has them: MLflow's and OpenTelemetry's generated *_pb2 modules need a
# protobuf runtime >= 5.26; the image's version is not known here, the venv's is the one tested
ALWAYS = ("protobuf",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
MAX_BYTES = 64 * 2 ** 20  # default --max-bytes: the size limit of the copy sent to the GPU machine (0: none)


def norm(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return norm(path.name.split("-")[0])


class GpuCheckError(Exception):
    """A step of the GPU check that cannot go on; the message names the problem and the fix."""


# -- phase profiles -------------------------------------------------------------------------------------
GPU = {
    "model": ["model=gpt3-small", "data=gpt2", "model.vocab_size=50304", "trainer=gpu"],
    "bench": {"steps": 20, "repeats": 1, "batch_tokens": 16 * 1024, "precision": "bf16-mixed",
              "variants": "baseline,nonlinear_q,identity_q"},
    # 250 steps of 16 x 1024 tokens, checkpoints every 50 steps, killed past step 100
    "train": {"steps": 250, "batch_tokens": 16 * 1024, "micro": 16, "lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 20,
              "eval_every": 50, "kill_after": 100, "val_windows": 32, "val_micro": 16},
    "eval_micro": (16, 4),
    "val_tolerance": 2e-2,  # nats: bf16 autocast sums in another order at another batch size
    # seconds per phase, in the order they run; bench_eager gets what the others leave of the total
    "budgets": {"install": 60, "env": 30, "bench_compiled": 180, "train": 180, "eval": 45, "bench_eager": 120},
    "total": 470,
}
CPU = {
    "model": ["model=nano", "trainer=cpu", "data.bpe_vocab_size=512", "trainer.threads=1"],
    "bench": {"steps": 3, "repeats": 1, "batch_tokens": 2048, "precision": "32-true", "variants": "baseline,nonlinear_q"},
    "train": {"steps": 60, "batch_tokens": 2048, "micro": 32, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 4,
              "eval_every": 10, "kill_after": 10, "val_windows": 64, "val_micro": 32},
    "eval_micro": (32, 8),
    "val_tolerance": 1e-4,  # nats: fp32
    "budgets": {"install": 90, "env": 60, "bench_compiled": 0, "train": 240, "eval": 90, "bench_eager": 120},
    "total": 900,
}
PHASES = ("bench_compiled", "train", "eval", "bench_eager")  # after install and env, in this order (eval needs train)
TARGETS = {"mfu_baseline_compiled": 0.45, "nonlinear_over_baseline": 0.97, "lightning_over_plain": 0.97}


# -- prepare (on the connected machine) -----------------------------------------------------------------
def _pip(*args: str, cwd: Path | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise GpuCheckError(f"`{' '.join(cmd[2:])}` failed ({(r.stderr or r.stdout).strip().splitlines()[-1:]}): "
                            f"check the network and the package versions in the venv")


def _venv_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError as e:
        raise GpuCheckError(f"{dist} is not installed in this venv: run `make install` first") from e


def download_wheels(dest: Path, python: str = "3.12") -> list[Path]:
    """Fill ``dest`` with the wheels the GPU run needs that the image lacks (see module doc); return them.

    Raises:
        GpuCheckError: a download or build failed (the message names the pip command).
    """
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
              *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest)]
    _pip("download", "--no-deps", *target, *[f"{d}=={_venv_version(d)}" for d in NO_DEPS])
    _pip("download", *target, *[f"{d}=={_venv_version(d)}" for d in WITH_DEPS])
    _pip("wheel", "--no-deps", "-w", str(dest), *[f"{d}=={_venv_version(d)}" for d in BUILD])
    keep, drop = split_wheels(sorted(dest.glob("*.whl")))
    for whl in drop:
        whl.unlink()
    return keep


def split_wheels(wheels: list[Path]) -> tuple[list[Path], list[Path]]:
    """(wheels to carry, wheels to drop): a wheel is dropped when the GPU image has its package (unless it
    is one of :data:`ALWAYS`) or it is torch/CUDA (:data:`NEVER`).

    Raises:
        GpuCheckError: two versions of one package would be carried (pip refuses to install both).
    """
    keep, drop = [], []
    for whl in wheels:
        name = wheel_name(whl)
        carried = name in ALWAYS or not (name in IMAGE_PACKAGES or any(name.startswith(n) for n in NEVER))
        (keep if carried else drop).append(whl)
    names = [wheel_name(w) for w in keep]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise GpuCheckError(f"two versions of {twice} among the wheels: delete .gpu/wheels and run `make gpu-prep` again")
    return keep, drop


def tree_bytes(root: Path) -> int:
    """Bytes of the working tree's files that git does not ignore (tracked plus untracked): what a copy of the
    checkout sends to the GPU machine besides ``.gpu/``."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                         capture_output=True, text=True).stdout
    return sum((root / f).stat().st_size for f in out.split("\0") if f and (root / f).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def prepare(root: Path, gpu_dir: Path, max_docs: int, max_bytes: int = MAX_BYTES) -> dict:
    """``make gpu-prep``: wheels + GPT-2 tokens under ``gpu_dir`` and the size check; returns the sizes.

    Raises:
        GpuCheckError: a failed download or prepare, or a copy over ``max_bytes`` bytes when ``max_bytes`` > 0
            (the message says what to cut).
    """
    wheels = download_wheels(gpu_dir / "wheels")
    tokens = gpu_dir / "tokens"
    cmd = [sys.executable, "-m", "study.prepare", *GPU["model"][:3], f"data.dir={tokens.resolve()}",
           *([f"data.max_docs_per_corpus={max_docs}"] if max_docs else []), "data.val_every=8"]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if r.returncode:
        raise GpuCheckError(f"preparing the tokens failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    shutil.rmtree(gpu_dir / "site", ignore_errors=True)  # installed on the GPU machine, never carried from here
    sizes = {"wheels": folder_bytes(gpu_dir / "wheels"), "tokens": folder_bytes(tokens), "gpu_dir": folder_bytes(gpu_dir),
             "tree": tree_bytes(root)}
    sizes["total"] = sizes["gpu_dir"] + sizes["tree"]
    meta = json.loads((tokens / "meta.json").read_text())
    print(f"{len(wheels)} wheels ({sizes['wheels'] / 2**20:.1f} MiB): {', '.join(sorted(wheel_name(w) for w in wheels))}")
    print(f"tokens: {meta['tokens']['train']:,} train + {meta['tokens']['val']:,} val GPT-2 tokens "
          f"({sizes['tokens'] / 2**20:.1f} MiB) in {tokens}")
    limit = f" of the {max_bytes / 2**20:.1f} MiB limit (--max-bytes)" if max_bytes > 0 else ""
    print(f"copied to the GPU machine: repository {sizes['tree'] / 2**20:.1f} MiB + {gpu_dir.name} "
          f"{sizes['gpu_dir'] / 2**20:.1f} MiB = {sizes['total'] / 2**20:.1f} MiB{limit}")
    if 0 < max_bytes < sizes["total"]:
        raise GpuCheckError(f"{sizes['total'] / 2**20:.1f} MiB would be copied, over --max-bytes "
                            f"{max_bytes / 2**20:.1f} MiB: lower --max-docs, remove untracked files from the "
                            f"working tree, or raise --max-bytes (0: no limit)")
    return sizes


# -- a rehearsal of the GPU image on this machine ----------------------------------------------------------
def image_blocklist(carried: set[str]) -> set[str]:
    """Top-level import names that only distributions of this environment which are neither on the GPU
    image (:data:`IMAGE_PACKAGES`) nor carried (``carried``: wheel names) provide."""
    from importlib.metadata import distributions

    allowed, other = set(), set()
    for dist in distributions():
        name = norm(dist.metadata["Name"] or "")
        tops = set((dist.read_text("top_level.txt") or "").split())
        for f in dist.files or []:
            head = f.parts[0] if f.parts else ""
            if head and not head.endswith((".dist-info", ".egg-info", ".pth")) and head not in ("..", "__pycache__"):
                tops.add(head.removesuffix(".py"))
        keep = name in IMAGE_PACKAGES or name in carried or name == "nonlinear-queries-study"
        (allowed if keep else other).update(t for t in tops if t.isidentifier())
    return other - allowed - {"study"}


SITECUSTOMIZE = """\
# written by study.gpu_check --simulate-image: imports that the GPU machine could not do fail here too
import sys
BLOCKED = frozenset({blocked!r})
class _GpuImage:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError("No module named %r (not on the GPU image, not among .gpu/wheels)" % name,
                                      name=name)
        return None
sys.meta_path.insert(0, _GpuImage())
"""


# -- running phases ----------------------------------------------------------------------------------------
class Runner:
    """Runs each phase as a subprocess under its own time limit and a global deadline; keeps the results
    and rewrites ``out/results.json`` + ``out/results.md`` after every phase."""

    def __init__(self, args, profile: dict, root: Path, out: Path, work: Path):
        self.args, self.p, self.root, self.out, self.work = args, profile, root, out, work
        self.t0 = time.monotonic()
        self.deadline = self.t0 + (args.budget or profile["total"])
        self.log = out / "log.txt"
        self.env = dict(os.environ)
        self.env.update(PYTHONUNBUFFERED="1", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
        self.env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [self.env.get("PYTHONPATH")])])
        self.results: dict = {"profile": "cpu" if args.cpu else "gpu", "date": time.strftime("%Y-%m-%d"),
                              "phases": {}, "checks": {}, "targets": {}}

    # phase bookkeeping
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, phase: str) -> float:
        return max(0.0, min(float(self.p["budgets"][phase]), self.left()))

    def run(self, phase: str, cmd: list[str], limit: float, env: dict | None = None) -> tuple[int | None, float]:
        """Run ``cmd`` (cwd = project root) with output appended to log.txt; kill its process group at
        ``limit`` seconds.  Returns (exit code or None when killed, seconds)."""
        t = time.monotonic()
        with open(self.log, "a") as log:
            log.write(f"\n=== {phase}: {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.root, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
                log.write(f"=== {phase}: killed at its limit of {limit:.0f} s\n")
        return rc, time.monotonic() - t

    def phase(self, name: str, status: str, seconds: float, **extra) -> None:
        self.results["phases"][name] = {"status": status, "seconds": round(seconds, 1), **extra}
        self.write()

    def write(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.out / "results.json")
        (self.out / "results.md").write_text(markdown(self.results))

    # -- the phases -------------------------------------------------------------------------------------
    def install(self) -> bool:
        wheels = sorted((self.args.gpu_dir / "wheels").glob("*.whl"))
        site = self.args.gpu_dir / "site"
        if self.args.simulate_image:  # this Python's packages, less what the GPU machine would lack
            if not wheels:
                raise GpuCheckError(f"--simulate-image needs the wheels in {self.args.gpu_dir / 'wheels'}: run "
                                    f"`make gpu-prep` first")
            blocked = image_blocklist({wheel_name(w) for w in wheels})
            sim = self.work / "image-sim"
            sim.mkdir(parents=True, exist_ok=True)
            (sim / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=sorted(blocked)))
            self.env["PYTHONPATH"] = os.pathsep.join([str(sim), self.env["PYTHONPATH"]])
            self.phase("install", "skipped (--simulate-image: this Python's packages less those the image lacks "
                                  "and .gpu/wheels does not carry)", 0.0, blocked=sorted(blocked))
            return True
        if self.args.cpu or not wheels:  # the wheels are for the GPU machine's Python 3.12
            self.phase("install", "skipped (the running Python's own packages are used)", 0.0)
            return True
        shutil.rmtree(site, ignore_errors=True)
        rc, s = self.run("install", [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                     "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--target", str(site),
                                     *map(str, wheels)], self.limit("install"))
        ok = rc == 0
        if ok:
            self.env["PYTHONPATH"] = os.pathsep.join([str(site.resolve()), self.env["PYTHONPATH"]])
        self.phase("install", "ok" if ok else f"failed (exit {rc}, see log.txt)", s, wheels=len(wheels))
        return ok

    def environment(self) -> bool:
        """Versions, the GPU, and whether each package the phases import imports (each one alone, so that
        one failure names itself); False only when the GPU profile finds no GPU (nothing else can run)."""
        probe = self.work / "env.json"
        code = ("import importlib, json, platform, sys\n"
                "d = {'python': sys.version.split()[0], 'machine': platform.machine(), 'import_errors': {}}\n"
                "for name in ('torch', 'lightning', 'torchmetrics', 'omegaconf', 'litdata', 'mlflow', 'sqlalchemy',"
                " 'alembic', 'boto3'):\n"
                "    try:\n"
                "        d[name] = getattr(importlib.import_module(name), '__version__', '?')\n"
                "    except Exception as e:\n"
                "        d['import_errors'][name] = '%s: %s' % (type(e).__name__, str(e).splitlines()[0] if str(e) else '')\n"
                "import torch\n"
                "d['cuda'] = torch.cuda.is_available()\n"
                "if d['cuda']:\n"
                "    p = torch.cuda.get_device_properties(0)\n"
                "    d.update(device=torch.cuda.get_device_name(0), capability='%d.%d' % (p.major, p.minor),"
                " memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,"
                " cuda_version=torch.version.cuda)\n"
                f"open({str(probe)!r}, 'w').write(json.dumps(d))\n")
        rc, s = self.run("env", [sys.executable, "-c", code], self.limit("env"))
        env = json.loads(probe.read_text()) if rc == 0 and probe.is_file() else {}
        self.results["environment"] = env
        ok = bool(env) and not env["import_errors"]
        status = "ok" if ok else ("failed (see log.txt)" if not env else
                                  f"import errors: {', '.join(env['import_errors'])} (see results.json)")
        self.phase("env", status, s)
        return bool(env) and (self.args.cpu or env["cuda"])

    def bench(self, mode: str) -> None:
        phase = f"bench_{mode}"
        limit = self.limit(phase)
        if limit < 5:
            self.phase(phase, "skipped (no time left)" if self.p["budgets"][phase] else "skipped (not in this profile)", 0.0)
            return
        b = self.p["bench"]
        path = self.work / f"{phase}.json"
        cmd = [sys.executable, "-m", "study.bench", "--steps", str(b["steps"]), "--repeats", str(b["repeats"]),
               "--variants", b["variants"], "--precisions", b["precision"], "--modes", mode, "--json", str(path),
               *self.p["model"], f"train.batch_tokens={b['batch_tokens']}"]
        rc, s = self.run(phase, cmd, limit)
        rows = json.loads(path.read_text())["rows"] if path.is_file() else []
        self.results.setdefault("bench", []).extend(rows)
        if path.is_file():
            self.results["bench_setup"] = {k: v for k, v in json.loads(path.read_text()).items() if k != "rows"}
        status = "ok" if rc == 0 else ("killed at its time limit" if rc is None else f"failed (exit {rc})")
        self.phase(phase, status, s, rows=len(rows))
        self.targets()

    def train_overrides(self) -> list[str]:
        t, w = self.p["train"], self.work
        from study.data.records import prepared_overrides  # the data.* settings the tokens were prepared with

        return [*self.p["model"], *prepared_overrides(self.args.tokens), "variant=baseline", "seed=1",
                f"data.dir={self.args.tokens.resolve()}",
                f"study.runs_dir={w / 'runs'}", f"study.tracking_db={w / 'mlruns.db'}",
                f"study.artifact_dir={w / 'mlartifacts'}", "study.name=gpu-check",
                f"train.tokens={t['steps'] * t['batch_tokens']}", f"train.batch_tokens={t['batch_tokens']}",
                f"train.micro_batch_size={t['micro']}", f"train.lr={t['lr']}", f"train.min_lr={t['min_lr']}",
                f"train.warmup_tokens={t['warmup_steps'] * t['batch_tokens']}", f"train.eval_every={t['eval_every']}",
                f"train.val_tokens={t['val_windows'] * self.block_size()}", f"train.val_micro_batch_size={t['val_micro']}",
                f"train.log_every={min(10, t['eval_every'])}", "trainer.progress_bar=false"]

    def block_size(self) -> int:
        return 1024 if not self.args.cpu else 64

    def train(self) -> bool:
        """Train, SIGKILL once a checkpoint past ``kill_after`` steps is on disk, train again (resume)."""
        import torch  # noqa: F401 (imported now, not when the first checkpoint appears: seconds the watch may not have)

        t = self.p["train"]
        limit = self.limit("train")
        t_start = time.monotonic()
        run = self.work / "runs" / "baseline-s1"
        ckpt = run / "checkpoints" / "last.ckpt"
        rec1, rec2 = self.work / "windows-first", self.work / "windows-resumed"
        cmd = [sys.executable, "-m", "study.train", *self.train_overrides()]
        out: dict = {"steps": t["steps"], "batch_tokens": t["batch_tokens"], "kill_after": t["kill_after"],
                     "log_every": min(10, t["eval_every"])}
        with open(self.log, "a") as log:
            log.write(f"\n=== train (first, to be killed): {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.root, env={**self.env, "STUDY_RECORD_WINDOWS": str(rec1)},
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            killed_at, seen = None, None
            while time.monotonic() - t_start < limit and proc.poll() is None:
                stamp = ckpt.stat().st_mtime_ns if ckpt.is_file() else None
                step = checkpoint_step(ckpt) if stamp is not None and stamp != seen else None
                if step is not None:
                    seen = stamp  # read each checkpoint once (Lightning replaces last.ckpt atomically)
                    if step >= t["kill_after"]:
                        os.killpg(proc.pid, signal.SIGKILL)
                        killed_at = step
                        break
                time.sleep(0.05)
            if proc.poll() is None and killed_at is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.write(f"=== train (first): exit {proc.returncode}, checkpoint step seen at the kill: {killed_at}\n")
        out["first_exit"] = proc.returncode
        out["first_seconds"] = round(time.monotonic() - t_start, 1)
        if killed_at is None:
            out["error"] = ("the first run ended or ran out of time before a checkpoint past step "
                            f"{t['kill_after']} was written")
            self.results["train"] = out
            self.phase("train", "failed (see log.txt)", time.monotonic() - t_start)
            return False
        out["checkpoint_step"] = resume_step = checkpoint_step(ckpt)  # what the second run resumes from
        state = run / "checkpoints" / "run.json"
        first_mlflow_run = json.loads(state.read_text()).get("mlflow_run_id") if state.is_file() else None
        rc, _ = self.run("train (resumed)", cmd, max(1.0, limit - (time.monotonic() - t_start)),
                         env={**self.env, "STUDY_RECORD_WINDOWS": str(rec2)})
        out["resumed_exit"] = rc
        metrics_path = run / "metrics.json"
        if rc != 0 or not metrics_path.is_file():
            out["error"] = "the resumed run did not finish (see log.txt)"
            self.results["train"] = out
            self.phase("train", "killed at its time limit" if rc is None else f"failed (exit {rc})",
                       time.monotonic() - t_start)
            return False
        # the run's result: record.json (status, steps, ids) beside metrics.json (the numbers DVC shows)
        metrics = {**json.loads((run / "record.json").read_text()), **json.loads(metrics_path.read_text())}
        curve = read_curve(run / "curve.csv")
        first = _windows(rec1)
        resumed = _windows(rec2)
        per_step = t["batch_tokens"] // self.block_size()
        done = resume_step * per_step
        overlap = max(0, min(len(first) - done, len(resumed)))
        out.update(
            final_steps=metrics["steps"], val_loss=metrics["val_loss"], tokens_per_s_resumed=metrics["tokens_per_s"],
            wall_time_s=metrics["wall_time_s"], curve=curve, first_windows_read=len(first),
            resumed_windows_read=len(resumed), windows_per_step=per_step, windows_compared=overlap,
            # every step after the checkpoint, plus at most what Lightning fetches ahead and a partial batch
            # dropped at an epoch's end
            resumed_reads_expected=[(t["steps"] - resume_step) * per_step, (t["steps"] - resume_step + 2) * per_step],
        )
        logged = logged_metrics(self.work / "mlruns.db", metrics["mlflow_run_id"], ("tokens_per_s", "train/device/mfu"))
        out["logged_median"] = {k: median(v) for k, v in logged.items()}  # MLflow, every log_every steps
        first_row, last_row = curve[0], curve[-1]
        checks = self.results["checks"]
        checks["mlflow_run_continued"] = first_mlflow_run is not None and first_mlflow_run == metrics["mlflow_run_id"]
        checks["train_finished"] = metrics["status"] == "ok" and metrics["steps"] == t["steps"]
        checks["loss_fell"] = bool(last_row["val_loss"] < first_row["val_loss"] and
                                   last_row["train_loss"] < first_row["train_loss"] and
                                   last_row["val_loss"] < math.log(50257 if not self.args.cpu else 512))
        # the resumed process read the windows of the steps after the checkpoint (no more: a restart from
        # step 0 would read all of them), in the order the killed process had read them from that step on
        checks["resumed_from_checkpoint"] = bool(
            0 < resume_step < t["steps"]
            and out["resumed_reads_expected"][0] <= len(resumed) <= out["resumed_reads_expected"][1]
            and first[done:done + overlap] == resumed[:overlap])
        checks["curve_spans_the_kill"] = bool(any(r["step"] <= resume_step for r in curve)
                                              and any(r["step"] > resume_step for r in curve))
        self.results["train"] = out
        self.phase("train", "ok", time.monotonic() - t_start)
        return True

    def evaluate(self) -> None:
        limit = self.limit("eval")
        ckpt = self.work / "runs" / "baseline-s1" / "checkpoints" / "last.ckpt"
        if limit < 5 or not ckpt.is_file():
            self.phase("eval", "skipped (no time left or no checkpoint)", 0.0)
            return
        path = self.work / "eval.json"
        a, b = self.p["eval_micro"]
        cmd = [sys.executable, "-m", "study.gpu_check", "--eval-checkpoint", str(ckpt), "--eval-micro", f"{a},{b}",
               "--eval-json", str(path), "--", *self.train_overrides()]
        rc, s = self.run("eval", cmd, limit)
        if rc != 0 or not path.is_file():
            self.phase("eval", "killed at its time limit" if rc is None else f"failed (exit {rc})", s)
            return
        ev = json.loads(path.read_text())
        losses = [ev["val_loss"][str(m)] for m in (a, b)]
        ev["abs_difference"] = abs(losses[0] - losses[1])
        ev["tolerance"] = self.p["val_tolerance"]
        trained = self.results.get("train", {}).get("val_loss")
        if trained is not None:
            ev["training_run_val_loss"] = trained
            ev["abs_difference_to_training_run"] = abs(losses[0] - trained)
        self.results["eval"] = ev
        self.results["checks"]["val_loss_agrees_across_batch_sizes"] = ev["abs_difference"] <= ev["tolerance"]
        self.phase("eval", "ok", s)

    def targets(self) -> None:
        rows = self.results.get("bench", [])
        best = {(r["variant"], r["mode"]): r for r in rows}
        tg = self.results["targets"]
        base = best.get(("baseline", "compiled")) or best.get(("baseline", "eager"))
        if base:
            tg["mfu_baseline"] = {"mode": base["mode"], "value": base["mfu_plain"], "lightning": base["mfu_lightning"],
                                  "target": TARGETS["mfu_baseline_compiled"],
                                  "met": base["mfu_lightning"] is not None
                                  and base["mfu_lightning"] >= TARGETS["mfu_baseline_compiled"]}
            nl = best.get(("nonlinear_q", base["mode"]))
            if nl:
                v = nl["lightning_tokens_per_s"] / base["lightning_tokens_per_s"]
                tg["nonlinear_over_baseline"] = {"mode": base["mode"], "value": v,
                                                 "target": TARGETS["nonlinear_over_baseline"],
                                                 "met": v >= TARGETS["nonlinear_over_baseline"]}
            ratios = [r["lightning_over_plain"] for r in rows if r["mode"] == base["mode"]]
            tg["lightning_over_plain"] = {"mode": base["mode"], "min": min(ratios), "max": max(ratios),
                                          "target": TARGETS["lightning_over_plain"],
                                          "met": min(ratios) >= TARGETS["lightning_over_plain"]}


def checkpoint_step(path: Path) -> int | None:
    """global_step of a Lightning checkpoint (memory-mapped: the tensors are not read), or None while
    there is none or it cannot be read yet."""
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"])
    except Exception:  # not there yet, or being replaced
        return None


def logged_metrics(db: Path, run_id: str, keys: tuple[str, ...]) -> dict[str, list[float]]:
    """The values of ``keys`` an MLflow run logged in the SQLite store ``db``, in step order."""
    import sqlite3

    if not db.is_file():
        return {}
    with sqlite3.connect(db) as con:
        rows = con.execute(f"SELECT key, value FROM metrics WHERE run_uuid = ? AND key IN ({','.join('?' * len(keys))})"
                           " ORDER BY step, timestamp", (run_id, *keys)).fetchall()
    out: dict[str, list[float]] = {}
    for key, value in rows:
        out.setdefault(key, []).append(float(value))
    return out


def median(values: list[float]) -> float | None:
    v = sorted(values)
    return None if not v else (v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2)


def _windows(folder: Path) -> list[int]:
    """Training windows a run read, in order (study.data's STUDY_RECORD_WINDOWS files, one rank)."""
    f = folder / "train-windows-rank0.txt"
    return [int(x) for x in f.read_text().split()] if f.is_file() else []


def read_curve(path: Path) -> list[dict]:
    import csv

    with open(path) as f:
        return [{k: (int(v) if k in ("step", "tokens") else float(v)) for k, v in row.items()} for row in csv.DictReader(f)]


# -- the eval subprocess --------------------------------------------------------------------------------
def evaluate_checkpoint(ckpt: Path, micros: list[int], overrides: list[str], out: Path) -> dict:
    """val_loss (nats) of a training checkpoint with the project's validation step (GPTModule +
    TokenDataModule's fixed validation windows, Lightning's ``validate``) at each validation micro-batch
    size of ``micros``; eager (not compiled), the run's precision.  Written to ``out`` as JSON."""
    import lightning.pytorch as pl
    import torch

    from study.config import load_config, project_root, run_seeds
    from study.data.datamodule import TokenDataModule
    from study.lm import GPTModule

    root = project_root()
    cfg = load_config(overrides, root)
    cfg.trainer.compile = False
    n_val = cfg.train.val_tokens // cfg.model.block_size
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    result = {"checkpoint_step": int(state["global_step"]), "windows": n_val, "val_loss": {},
              "precision": cfg.trainer.precision}
    for m in micros:
        if n_val % m:
            raise GpuCheckError(f"validation micro-batch {m} does not divide the {n_val} validation windows")
        dm = TokenDataModule(root / cfg.data.dir, cfg.model.block_size, cfg.train.micro_batch_size, run_seeds(cfg)[0],
                             n_val, m)
        module = GPTModule(cfg, corpora=dm.corpora)
        module.load_state_dict(state["state_dict"])
        trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             limit_val_batches=n_val // m, enable_checkpointing=False)
        trainer.validate(module, datamodule=dm, verbose=False)
        result["val_loss"][str(m)] = float(trainer.callback_metrics["val_loss"])
    out.write_text(json.dumps(result, indent=1))
    return result


# -- report -----------------------------------------------------------------------------------------------
def _fmt(x, spec=",.0f", none="-"):
    return none if x is None else format(x, spec)


def markdown(res: dict) -> str:
    """results.md: the environment, the bench table, the targets, the training run and the checks."""
    env = res.get("environment", {})
    lines = [f"# GPU check ({res['profile']} profile), {res['date']}", ""]
    if env:
        lines.append(", ".join(f"{k} {v}" for k, v in env.items() if k != "import_errors"))
        for k, v in env.get("import_errors", {}).items():
            lines.append(f"\nimport {k} FAILED: {v}")
        lines.append("")
    setup = res.get("bench_setup")
    if res.get("bench"):
        if setup:
            lines.append(f"`study.bench` at `{setup['model']}` ({setup['n_layer']} layers, n_embd {setup['n_embd']}, "
                         f"block {setup['block_size']}, vocab {setup['vocab_size']}), {setup['batch_tokens']:,} tokens "
                         f"per step, trainer `{setup['trainer']}`, {setup['steps']} timed steps x {setup['repeats']} "
                         f"(median), on {setup['device']}, torch {setup['torch']}.")
            lines.append("")
        lines += ["| variant | precision | mode | plain tokens/s | Lightning tokens/s | Lightning / plain | MFU plain | "
                  "MFU Lightning | peak memory (GiB) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in res["bench"]:
            mem = max(filter(None, [r.get("peak_memory_plain_bytes"), r.get("peak_memory_lightning_bytes")]), default=None)
            lines.append(f"| {r['variant']} | {r['precision']} | {r['mode']} | {_fmt(r['plain_tokens_per_s'])} | "
                         f"{_fmt(r['lightning_tokens_per_s'])} | {r['lightning_over_plain']:.3f} | "
                         f"{_fmt(r['mfu_plain'], '.1%')} | {_fmt(r['mfu_lightning'], '.1%')} | "
                         f"{_fmt(mem / 2**30 if mem else None, '.1f')} |")
        peak = res["bench"][0].get("peak_flops")
        if peak:
            lines.append(f"\nMFU against {peak / 1e12:.4g} TFLOP/s ({res['bench'][0]['peak_flops_source']}), "
                         f"{res['bench'][0]['flops_per_token'] / 1e9:.4g} GFLOP per token (baseline).")
        lines.append("")
    if res.get("targets"):
        lines += ["| target | measured | wanted | met |", "|---|---|---|---|"]
        tg = res["targets"]
        if "mfu_baseline" in tg:
            t = tg["mfu_baseline"]
            lines.append(f"| baseline MFU, {t['mode']} (Lightning; plain) | {_fmt(t['lightning'], '.1%')}; "
                         f"{_fmt(t['value'], '.1%')} | >= {t['target']:.0%} | {'yes' if t['met'] else 'no'} |")
        if "nonlinear_over_baseline" in tg:
            t = tg["nonlinear_over_baseline"]
            lines.append(f"| nonlinear_q / baseline tokens/s, {t['mode']} | {t['value']:.3f} | >= {t['target']} | "
                         f"{'yes' if t['met'] else 'no'} |")
        if "lightning_over_plain" in tg:
            t = tg["lightning_over_plain"]
            lines.append(f"| Lightning / plain loop, {t['mode']} | {t['min']:.3f}-{t['max']:.3f} | >= {t['target']} | "
                         f"{'yes' if t['met'] else 'no'} |")
        lines.append("")
    tr = res.get("train")
    if tr:
        lines.append(f"Training run: {tr['steps']} steps of {tr['batch_tokens']:,} tokens; killed (SIGKILL) with the "
                     f"checkpoint of step {tr.get('checkpoint_step')} on disk, then resumed.")
        if "curve" in tr:
            lines += ["", "| step | train_loss | val_loss |", "|---|---|---|"]
            lines += [f"| {r['step']} | {r['train_loss']:.4f} | {r['val_loss']:.4f} |" for r in tr["curve"]]
            lines.append(f"\nResumed process read {tr['resumed_windows_read']} training windows "
                         f"(expected {tr['resumed_reads_expected'][0]}-{tr['resumed_reads_expected'][1]}); "
                         f"{tr['windows_compared']} compared with the killed process's reads from the checkpoint on. "
                         f"Final val_loss {tr['val_loss']:.4f}; {_fmt(tr['tokens_per_s_resumed'])} tokens/s over the "
                         f"resumed part (evaluations and checkpoints included).")
            lm = tr.get("logged_median", {})
            if lm:
                lines.append(f"Logged to MLflow every {tr['log_every']} steps (median): "
                             f"{_fmt(lm.get('tokens_per_s'))} tokens/s, MFU {_fmt(lm.get('train/device/mfu'), '.1%')}.")
        if tr.get("error"):
            lines.append(f"\nError: {tr['error']}")
        lines.append("")
    ev = res.get("eval")
    if ev:
        vals = ", ".join(f"{v:.5f} (micro-batch {k})" for k, v in ev["val_loss"].items())
        lines.append(f"Validation of the final checkpoint (step {ev['checkpoint_step']}, {ev['windows']} windows, "
                     f"{ev['precision']}, eager): {vals}; difference {ev['abs_difference']:.2e} nats "
                     f"(tolerance {ev['tolerance']:.0e})"
                     + (f"; the training run's own final val_loss {ev['training_run_val_loss']:.5f}."
                        if "training_run_val_loss" in ev else "."))
        lines.append("")
    if res.get("checks"):
        lines += ["| check | passed |", "|---|---|"]
        lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in res["checks"].items()]
        lines.append("")
    lines += ["| phase | status | seconds |", "|---|---|---|"]
    lines += [f"| {k} | {v['status']} | {v['seconds']} |" for k, v in res["phases"].items()]
    lines.append(f"\nTotal {res.get('elapsed_s')} s.")
    return "\n".join(lines) + "\n"


# -- command line -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.gpu_check", description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    sys.exit(main())
