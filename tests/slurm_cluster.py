"""A real one-node SLURM on this machine for the tests (Debian's slurm-wlm and munge): configured in a scratch
folder, started (munge, then slurmctld, then slurmd) and stopped by their pid files afterwards.

:func:`why_not` says in one line why it cannot run here (not Linux, not root, no apt-get / packages): the tests that
need it are skipped with that line.  :func:`install` runs ``apt-get update`` once and installs the packages when
missing (root on Debian only: `make test` calls it through ``python -m tests.slurm_cluster --install``).
No cgroups (proctrack/linuxproc, task/none): it runs in a container; the job completion log (jobcomp/filetxt) records
every job that ended, with its id, state and exit code.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")


def _debian() -> bool:
    try:
        return "debian" in Path("/etc/os-release").read_text().lower()
    except OSError:
        return False


def installed() -> bool:
    return all(shutil.which(x) for x in ("sbatch", "squeue", "scontrol", "slurmctld", "slurmd", "munged", "mungekey"))


def why_not() -> str | None:
    """None when a one-node SLURM can be installed and started here; else the one-line reason (``STUDY_SKIP_SLURM=1``:
    skipped on purpose, nothing installed)."""
    if os.environ.get("STUDY_SKIP_SLURM", "") not in ("", "0"):
        return "STUDY_SKIP_SLURM is set: the SLURM tests are skipped and nothing is installed for them"
    if not sys.platform.startswith("linux"):
        return f"a one-node SLURM needs Linux (this is {sys.platform})"
    if installed() and os.geteuid() == 0:
        return None
    if os.geteuid() != 0:
        return "a one-node SLURM needs root (slurmd and munged run as root here): run the suite as root on Debian"
    if not (_debian() and shutil.which("apt-get")):
        return "slurm-wlm and munge are not installed and this is not Debian with apt-get: install them to run these"
    return None


def install(log=print) -> None:
    """apt-get update (once) and install slurm-wlm and munge when missing (root on Debian).

    Raises:
        RuntimeError: apt-get failed (its last line).
    """
    if installed():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]):
        log(f"slurm test cluster: {' '.join(cmd)}")
        got = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if got.returncode:
            last = (got.stderr.strip() or got.stdout.strip()).splitlines()[-1:] or ["?"]
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {got.returncode}): {last[0]}")


CONF = """\
ClusterName=studytest
SlurmctldHost={host}
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=30
MinJobAge=600
SchedulerParameters=defer_batch=0
NodeName={host} CPUs={cpus} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class Cluster:
    """A started one-node SLURM: ``jobcomp`` (the completion log), ``stop()``."""

    def __init__(self, folder: Path):
        self.dir = Path(folder)
        self.host = socket.gethostname().split(".")[0]
        self.jobcomp = self.dir / "jobcomp.log"
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 120) -> "Cluster":
        """munge first (a key, /run/munge), then slurmctld, then slurmd; returns once the node is idle.

        Raises:
            RuntimeError: a daemon did not start, or the node is not idle within ``timeout`` s (the logs' tails)."""
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._munge()
        self.conf.write_text(CONF.format(host=self.host, d=self.dir, cpus=os.cpu_count() or 1,
                                         ctld_port=_free_port(), d_port=_free_port()))
        os.environ["SLURM_CONF"] = str(self.conf)  # sbatch, squeue, scontrol (and submitit's calls) read this cluster
        for cmd in (["slurmctld", "-c", "-f", str(self.conf)], ["slurmd", "-c", "-f", str(self.conf)]):
            got = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
            if got.returncode:
                raise RuntimeError(f"{cmd[0]} did not start: {(got.stderr or got.stdout).strip()[-300:]}")
            time.sleep(1)
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True).stdout
            if state.strip() in ("idle", "mixed", "allocated"):
                return self
            time.sleep(1)
        raise RuntimeError(f"the node is not idle after {timeout:.0f} s (sinfo: {state.strip()!r}): "
                           f"{self._tail('slurmctld.log')} | {self._tail('slurmd.log')}")

    def _munge(self) -> None:
        key = Path("/etc/munge/munge.key")
        if not key.is_file():
            key.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mungekey", "-c", "-f", "-k", str(key)], check=True, capture_output=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        run = Path("/run/munge")
        run.mkdir(parents=True, exist_ok=True)
        shutil.chown(run, "munge", "munge")
        if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return  # already running
        subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, capture_output=True)
        self.started_munge = True

    def _tail(self, name: str) -> str:
        try:
            return " / ".join((self.dir / name).read_text().strip().splitlines()[-3:])
        except OSError:
            return f"({name}: none)"

    def stop(self) -> None:
        """Cancel every job, stop slurmd and slurmctld (pid files), and munged if this cluster started it."""
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True)
        for name in ("slurmd", "slurmctld"):
            _kill_pidfile(self.dir / f"{name}.pid")
        if getattr(self, "started_munge", False):
            _kill_pidfile(Path("/run/munge/munged.pid"))
        os.environ.pop("SLURM_CONF", None)

    def jobcomp_lines(self) -> list[str]:
        try:
            return self.jobcomp.read_text().splitlines()
        except OSError:
            return []


def started_cluster(tmp_path_factory):
    """A pytest fixture body (module scope in the SLURM test modules): a one-node SLURM started for the module and
    stopped after it, or the module's tests skipped with the one-line reason it cannot start here."""
    import pytest

    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    try:
        install()
        cluster = Cluster(tmp_path_factory.mktemp("slurm")).start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"a one-node SLURM did not start here: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    yield cluster
    cluster.stop()


def _kill_pidfile(path: Path, timeout: float = 30) -> None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":  # `make test`: python -m tests.slurm_cluster --install
    reason = why_not()
    if reason is not None:
        print(f"slurm test cluster: not installed ({reason}): the SLURM tests will be skipped")
        sys.exit(0)
    if "--install" in sys.argv:
        try:
            install()
        except RuntimeError as e:
            print(f"slurm test cluster: {e}: the SLURM tests will be skipped")
    sys.exit(0)
