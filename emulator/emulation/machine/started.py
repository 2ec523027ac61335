"""What a run has started, recorded on disk so that ``emu clean`` can undo it.

Every run that builds a network gets a directory ``$EF_RUN_DIR/<run-id>/``
(default ``/run/ef-emu``, a tmpfs cleared on reboot, as are namespaces) with:

* ``owner`` -- the pid and start time of the process that owns the run;
* ``processes.jsonl`` -- one line per process we started (Mininet host
  shells, controllers, agents, tcpdump): pid, start time, and for host
  shells the inode of their network namespace.

Processes are identified by (pid, start time), so a recycled pid is never
killed. Bridges and root-namespace interfaces need no record: their names
carry the project prefix and match the patterns of :mod:`emulator.base.naming`.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

from emulator.base.files import append_jsonl, read_json_object, read_jsonl, write_json_atomic
from emulator.base.naming import HOST_INTERFACE_RE
from emulator.base.waiting import wait_until

#: The folder of the state root that holds shared ssh connections' sockets
#: (:mod:`emulator.emulation.cluster.remote_shell`),
#: not a run: each connection ends by itself when idle.
SSH_FOLDER = "ssh"


#: Seconds an ssh master is given to remove its socket once told to exit.
SOCKET_GONE_S = 5.0


def state_root() -> str:
    return os.environ.get("EF_RUN_DIR", "/run/ef-emu")


def ssh_folder() -> str:
    """Where the shared ssh connections' sockets are (:data:`SSH_FOLDER` of the state root)."""
    return os.path.join(state_root(), SSH_FOLDER)


def _listening(path: str) -> bool:
    """True when a process still accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def remove_ssh_folder(timeout_s: float = SOCKET_GONE_S) -> None:
    """Remove :data:`SSH_FOLDER` once no ssh master listens in it any more.

    ``ssh -O exit`` returns when the master has the request; the master unlinks its socket only as it ends, a
    moment later, so the folder is not empty yet. Sockets nobody listens on are removed; a live one (a
    connection another command still uses) keeps the folder after ``timeout_s``.
    """
    folder = ssh_folder()

    def sockets() -> list[str]:
        try:
            return [os.path.join(folder, name) for name in os.listdir(folder)]
        except FileNotFoundError:
            return []

    wait_until(lambda: not any(_listening(path) for path in sockets()), timeout_s, 0.05)
    for path in sockets():
        if not _listening(path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    try:
        os.rmdir(folder)
    except OSError:  # missing, or a live connection is still in it
        pass


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone (or a zombie).

    Read from ``/proc/PID/stat`` (field 22) rather than psutil's
    ``create_time``: that one is seconds since the epoch, moves when the
    system clock is set, and so cannot be compared with a recorded value
    later. (psutil identifies processes by this same tick count internally.)
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields resume after the last ')'.
    fields = data.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_netns(pid: int) -> int | None:
    """The inode of the network namespace of ``pid`` (what ``/proc/PID/ns/net`` points to), None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def alive(pid: int, start_time: int | None) -> bool:
    """True when ``pid`` is still the very process that was recorded."""
    now = proc_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


@dataclass
class StartedRecord:
    """The on-disk record of what one run started (see the module docstring)."""

    path: str

    @classmethod
    def create(cls, label: str) -> StartedRecord:
        root = state_root()
        os.makedirs(root, exist_ok=True)
        run_id = f"{label}-{os.getpid()}-{int(time.time() * 1000)}"
        path = os.path.join(root, run_id)
        os.makedirs(path)
        me = os.getpid()
        write_json_atomic(os.path.join(path, "owner"), {"pid": me, "start_time": proc_start_time(me),
                                                        "label": label, "created": time.time()})
        return cls(path)

    @property
    def run_id(self) -> str:
        return os.path.basename(self.path)

    def record_process(self, role: str, pid: int, **extra: object) -> None:
        append_jsonl(os.path.join(self.path, "processes.jsonl"),
                     {"role": role, "pid": pid, "start_time": proc_start_time(pid), **extra})

    def processes(self) -> list[dict]:
        return read_jsonl(os.path.join(self.path, "processes.jsonl"))

    def owner(self) -> dict | None:
        return read_json_object(os.path.join(self.path, "owner"))

    def owner_alive(self) -> bool:
        owner = self.owner()
        return owner is not None and alive(int(owner["pid"]), owner.get("start_time"))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def all_runs() -> Iterator[StartedRecord]:
    root = state_root()
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path) and name != SSH_FOLDER:
            yield StartedRecord(path)


def has_our_interface(pid: int, proc: str = "/proc") -> bool:
    """True when the network namespace of ``pid`` holds an interface named like one of our hosts'.

    Read from ``/proc/PID/net/dev`` (``proc`` is the proc file system's mount point).
    """
    try:
        with open(os.path.join(proc, str(pid), "net", "dev"), encoding="ascii", errors="replace") as fh:
            names = [line.split(":", 1)[0].strip() for line in fh.readlines()[2:]]
    except OSError:
        return False
    return any(HOST_INTERFACE_RE.match(name) for name in names)


def pids_in_netns(inodes: set[int]) -> list[int]:
    """Every live process (but init and this one) whose network namespace is one of ``inodes``."""
    me = os.getpid()
    return [pid for pid in psutil.pids() if pid not in (1, me) and proc_netns(pid) in inodes]


def _all_gone(pids: list[int]) -> bool:
    return all(proc_start_time(p) is None for p in pids)


def kill_recorded(state: StartedRecord, grace_s: float = 1.0) -> list[int]:
    """Kill every process ``state`` recorded, and every process inside a recorded host namespace.

    Returns the pids signalled. A process counts as inside a recorded host
    namespace when its namespace has the recorded inode and holds one of our
    host interfaces (``efhN-eth0``), so a recycled inode cannot match.
    """
    targets: set[int] = set()
    inodes: set[int] = set()
    for rec in state.processes():
        pid = int(rec["pid"])
        if alive(pid, rec.get("start_time")):
            targets.add(pid)
        if rec.get("netns") is not None:
            inodes.add(int(rec["netns"]))
    if inodes:
        targets.update(p for p in pids_in_netns(inodes) if has_our_interface(p))
    targets.discard(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in targets if proc_start_time(p) is not None]
        for pid in live:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        wait_until(functools.partial(_all_gone, live), grace_s)
    return sorted(targets)
