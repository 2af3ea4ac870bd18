"""What the GPU image has and what goes with the checkout: the wheels it lacks, ``.gpu/`` prepared on a
connected machine (``make gpu-prep``), its size, and a rehearsal of the image's imports on this machine."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from study.gpu_check.plan import GPU, GpuCheckError


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
    cmd = [sys.executable, "-m", "study.prepare", *GPU["model"][:2], f"data.dir={tokens.resolve()}",
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
