"""A real Slurm cluster on loopback, for tests and for trying `--slurm` by hand: Debian's
`slurm-wlm` and `munge`, with munged, slurmctld and two slurmd (nodes n1 and n2, on one
host, each with 2 CPUs and 4 fake GRES GPUs) as plain processes, and a generated
`slurm.conf` that needs neither systemd nor cgroup delegation (proctrack/linuxproc,
task/none, select/cons_tres). Without accounting by default (`sacct` is off, `squeue` is
the truth); with `accounting=True` also a private MariaDB (its own data dir, loopback
only) and slurmdbd, so that `sacct` answers (Debian's `slurmdbd` and `mariadb-server`;
a few seconds more).

By hand (as root, as slurmd must be):

    python -m tests.support.slurm up /tmp/slurm     # prints: export SLURM_CONF=...
    python -m tests.support.slurm up /tmp/slurm --accounting
    export SLURM_CONF=/tmp/slurm/slurm.conf; sinfo; sbatch ...
    python -m tests.support.slurm down /tmp/slurm
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.daemons import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
ACCOUNTING_BINARIES = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db")
NODES = ("n1", "n2")
GPUS_PER_NODE = 4
CPUS_PER_NODE = 2
START_TIMEOUT_S = 30.0
#: slurmctld's prolog: every job stays CONFIGURING while a test holds the file it names.
PROLOG = """#!/bin/sh
while [ -e {hold} ]; do sleep 0.2; done
exit 0
"""


def missing(accounting: bool = False) -> str | None:
    """Why a local cluster cannot start here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing; Debian: slurm-wlm munge)"
    absent = [b for b in ACCOUNTING_BINARIES if accounting and shutil.which(b) is None]
    if absent:
        return (
            f"Slurm accounting is not installed ({', '.join(absent)} missing;"
            " Debian: slurmdbd mariadb-server)"
        )
    if os.geteuid() != 0:
        return "a local Slurm needs root: slurmd launches jobs as their user"
    return None


def _conf(root: Path, ports: dict[str, int], accounting: bool, min_job_age_s: int) -> str:
    user = pwd.getpwuid(os.geteuid()).pw_name
    host = socket.gethostname()
    storage = (
        f"accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
        f"AccountingStoragePort={ports['dbd']}\n"
        f"AccountingStoragePass={root}/munge/munge.sock"  # slurmdbd's munge, not a password
        if accounting
        else "accounting_storage/none"
    )
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} "
        f"CPUs={CPUS_PER_NODE} RealMemory=2000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for n in NODES
    )
    return f"""\
ClusterName=gpudtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports["ctld"]}
SlurmdPort={ports[NODES[0]]}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType={storage}
JobCompType=jobcomp/none
GresTypes=gpu
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge={min_job_age_s}
PrologSlurmctld={root}/prolog-slurmctld
MessageTimeout=10
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _dbd_conf(root: Path, ports: dict[str, int]) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
DbdHost={socket.gethostname().split(".")[0]}
DbdAddr=127.0.0.1
DbdPort={ports["dbd"]}
SlurmUser={pwd.getpwuid(os.geteuid()).pw_name}
PidFile={root}/slurmdbd.pid
LogFile={root}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports["db"]}
StorageUser=slurm
StorageLoc=slurm_acct_db
"""


@dataclass
class LocalSlurm:
    root: Path
    accounting: bool = False
    #: How long slurmctld remembers a job that ended (squeue shows it); then only sacct.
    min_job_age_s: int = 600
    env: dict[str, str] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **self.env},
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def start(self) -> LocalSlurm:
        root = self.root
        for sub in ("munge", "state", "log", "dev", *(f"spool/{n}" for n in NODES)):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o700)
        key = root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        for i in range(GPUS_PER_NODE):
            (root / "dev" / f"nvidia{i}").touch()
        ports = {"ctld": free_port(), **{n: free_port() for n in NODES}}
        if self.accounting:
            ports.update(db=free_port(), dbd=free_port())
        self.conf.write_text(_conf(root, ports, self.accounting, self.min_job_age_s))
        prolog = root / "prolog-slurmctld"
        prolog.write_text(PROLOG.format(hold=root / "hold-in-prolog"))
        prolog.chmod(0o755)
        (root / "gres.conf").write_text(
            f"NodeName={','.join(NODES)} Name=gpu File={root}/dev/nvidia[0-{GPUS_PER_NODE - 1}]\n"
        )
        self.env = {"SLURM_CONF": str(self.conf)}
        m = root / "munge"
        self.run("munged", "--force", f"--socket={m}/munge.sock", f"--key-file={key}",
                 f"--log-file={m}/munged.log", f"--pid-file={m}/munged.pid",
                 f"--seed-file={m}/munged.seed")  # fmt: skip
        if self.accounting:
            self._start_accounting(ports)
        self.run("slurmctld", "-f", str(self.conf), "-i")
        for node in NODES:
            self.run("slurmd", "-f", str(self.conf), "-N", node)
        deadline = time.monotonic() + START_TIMEOUT_S
        states = ""
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            if sorted(line.split()[1] for line in states.splitlines()) == ["idle"] * len(NODES):
                return self
            time.sleep(0.2)
        logs = (root / "log" / "slurmctld.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"the local Slurm did not come up: {states!r}\n{logs}")

    def _start_accounting(self, ports: dict[str, int]) -> None:
        """A private MariaDB on loopback and slurmdbd on it, the cluster registered, and
        this user in an account (so that every job has an association)."""
        db = self.root / "db"
        if not (db / "mysql").exists():
            self.run("mariadb-install-db", "--no-defaults", f"--datadir={db}", "--user=root",
                     "--auth-root-authentication-method=normal", "--skip-test-db")  # fmt: skip
        init = self.root / "db-init.sql"
        init.write_text(
            "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1';\n"
            "GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';\n"
        )
        subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={db}", f"--socket={self.root}/db.sock",
             f"--port={ports['db']}", "--bind-address=127.0.0.1", "--skip-name-resolve",
             "--user=root", f"--pid-file={self.root}/db.pid", f"--init-file={init}",
             f"--log-error={self.root}/log/mariadb.log", "--innodb-buffer-pool-size=32M"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        dbd = self.root / "slurmdbd.conf"  # found beside slurm.conf; its owner's alone
        dbd.write_text(_dbd_conf(self.root, ports))
        dbd.chmod(0o600)
        self._until(lambda: _listening(ports["db"]), "MariaDB", "log/mariadb.log")
        self.run("slurmdbd")

        def registered() -> bool:  # slurmdbd takes a moment to create its tables
            self.run("sacctmgr", "-i", "add", "cluster", "gpudtest", check=False)
            listed = "sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"
            return "gpudtest" in self.run(*listed, check=False).split()

        self._until(registered, "slurmdbd", "log/slurmdbd.log")
        user = pwd.getpwuid(os.geteuid()).pw_name
        self.run("sacctmgr", "-i", "add", "account", "gpudtest")
        self.run("sacctmgr", "-i", "add", "user", user, "account=gpudtest")

    def _until(self, ready: Callable[[], bool], what: str, log: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        try:
            text = (self.root / log).read_text(errors="replace")[-2000:]
        except OSError:
            text = ""
        self.stop()
        raise RuntimeError(f"{what} did not come up in {START_TIMEOUT_S:.0f} s\n{text}")

    def release_requeued(self, job: str, **update: str) -> None:
        """Start a requeued job now rather than after Slurm's 2-minute hold (with `update`'s
        other fields, e.g. TimeLimit). The hold is what keeps a new run of the job from
        starting in the second its nodes revoked the old run's credential: slurmd refuses a
        credential made no later than its job's revocation (whole seconds), and the job
        fails. So wait until the old run has left its nodes (PENDING, not REQUEUED while
        completing) and start it 2 s on."""
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            state = self.run("squeue", "-h", "-j", job, "-O", "State:", check=False).strip()
            if state == "PENDING":
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"Slurm job {job} never got back to PENDING: {state!r}")
        fields = [f"{k}={v}" for k, v in update.items()]
        self.run("scontrol", "update", f"JobId={job}", *fields, "StartTime=now+2")

    def stop(self) -> None:
        """Cancel every job, stop the daemons (by their pid files), and wait for them."""
        self.run("scancel", "--full", "--user", pwd.getpwuid(os.geteuid()).pw_name, check=False)
        pids = []
        for name in ("slurmctld.pid", *(f"slurmd.{n}.pid" for n in NODES), "slurmdbd.pid",
                     "db.pid", "munge/munged.pid"):  # fmt: skip
            try:
                pids.append(int((self.root / name).read_text().strip()))
            except (OSError, ValueError):
                continue
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 15
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    os.waitpid(pid, os.WNOHANG)  # MariaDB is our child: not left a zombie
                except ChildProcessError:
                    pass
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid in self._stepds():  # still there with its slurmd gone: nothing ends it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _stepds(self) -> list[int]:
        """This cluster's slurmstepd processes (they carry its SLURM_CONF): one of a node
        set DOWN outlives its slurmd."""
        found = []
        mark = f"SLURM_CONF={self.conf}".encode()
        for proc in Path("/proc").iterdir():
            try:
                if (proc / "comm").read_text().strip() != "slurmstepd":
                    continue
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except (OSError, ValueError):
                continue
        return found

    def hold_in_prolog(self, hold: bool) -> None:
        """Keep jobs that start from now on CONFIGURING (slurmctld's prolog waits), or
        let them go on."""
        marker = self.root / "hold-in-prolog"
        if hold:
            marker.touch()
        else:
            marker.unlink(missing_ok=True)

    def state_of(self, job_id: str) -> tuple[str, str]:
        """(state, reason) from squeue; ("", "") once the job has left it."""
        out = self.run("squeue", "-h", "-j", job_id, "-o", "%T|%r", check=False).strip()
        state, _, reason = out.partition("|")
        return state, reason


def main(argv: list[str]) -> int:
    accounting = "--accounting" in argv
    argv = [a for a in argv if a != "--accounting"]
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print("usage: python -m tests.support.slurm up|down DIR [--accounting]", file=sys.stderr)
        return 2
    why = missing(accounting)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    cluster = LocalSlurm(Path(argv[1]).resolve(), accounting=accounting)
    if argv[0] == "up":
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.env = {"SLURM_CONF": str(cluster.conf)}
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
