"""What the machine holds that a leak would grow: a census for the soak and crash-consistency tests.

:func:`take` counts, at one moment: open file descriptors (of the test
process, of ovs-vswitchd, of a controller), processes (on the machine, the
test process's descendants, zombies among them, and every process carrying
this test's environment tag, wherever it was re-parented to), Open vSwitch
bridges and root-namespace interfaces (all, veths, and ours by the patterns
of :mod:`emulator.base.naming`), distinct network namespaces (``/proc/*/ns/net``
inodes), and the resident memory of ovs-vswitchd, the test process and a
controller.

Other people run networks on this machine too. :func:`quiet` holds the
machine-wide network lock (:class:`emulator.emulation.machine.network_lock.NetworkLock`) while
a census is taken between networks, so no one else's bridges, veths or host
namespaces are up at that moment. Processes are attributed to a test by an
environment variable (:data:`TAG_VAR`) that every process it starts inherits
(controller, Mininet host shells, agent launcher and agents, ``emu`` CLI
subprocesses), not by name. The machine-wide process count is recorded but
cannot be held exact while others work here.

:func:`compare` says what grew: counts must be back exactly at the baseline,
resident memory may grow by at most :func:`rss_allowance`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from emulator.base.naming import BRIDGE_RE as BRIDGE_RE
from emulator.base.naming import INTERFACE_RE
from emulator.emulation.machine.network_lock import NetworkLock
from emulator.emulation.network.ovs_sockets import vswitchd_pid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EMU = os.path.join(ROOT, ".venv", "bin", "emu")
#: Every process a test starts inherits this variable; its value is the test's own tag.
TAG_VAR = "EF_TEST_TAG"
MIB = 1 << 20
#: Resident memory may grow by this fraction of its baseline, or by :data:`RSS_FLOOR` if that is more.
RSS_FRACTION = 0.10
#: ovs-vswitchd's heap is kept (glibc trim threshold 256 MiB, the Makefile's GLIBC_TUNABLES): bursts of packet
#: buffers stay resident for a while, so a floor below a few MiB would flag the allocator, not a leak.
RSS_FLOOR = 16 * MIB

#: Fields that must be back exactly at the baseline.
EXACT = ("test_fds", "test_descendants", "test_zombies", "tagged_processes", "bridges", "our_bridges",
         "root_interfaces", "veths", "our_interfaces", "netns", "ovs_fds", "controller_fds")
#: Fields allowed :func:`rss_allowance` of growth.
RSS = ("ovs_rss", "controller_rss", "test_rss")


def new_tag() -> str:
    return f"soak-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Census:
    """One moment's counts (see the module docstring); None where there was nothing to measure."""

    round: int
    at: float
    test_fds: int
    test_descendants: int
    test_zombies: int
    tagged_processes: int
    machine_processes: int
    machine_zombies: int
    bridges: int
    our_bridges: int
    root_interfaces: int
    veths: int
    our_interfaces: int
    netns: int
    ovs_pid: int | None
    ovs_fds: int | None
    ovs_rss: int | None
    test_rss: int
    controller_pid: int | None = None
    controller_fds: int | None = None
    controller_rss: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fds(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def _tagged(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in fh.read().split(b"\0")
    except OSError:
        return False


def _processes(tag: str) -> tuple[int, int, int]:
    """(user processes on the machine, zombies on the machine, live processes carrying ``tag``)."""
    marker = f"{TAG_VAR}={tag}".encode()
    machine = zombies = tagged = 0
    me = os.getpid()
    for proc in psutil.process_iter(["ppid", "status"]):
        info = proc.info
        if proc.pid == 2 or info.get("ppid") == 2:  # kernel threads come and go by themselves
            continue
        machine += 1
        if info.get("status") == psutil.STATUS_ZOMBIE:
            zombies += 1
        elif proc.pid != me and _tagged(proc.pid, marker):
            tagged += 1
    return machine, zombies, tagged


def _netns() -> int:
    inodes = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                inodes.add(os.stat(f"/proc/{name}/ns/net").st_ino)
            except OSError:
                pass
    return len(inodes)


def _links(kind: str | None = None) -> list[str]:
    cmd = ["ip", "-j", "link", "show"] + (["type", kind] if kind else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [link["ifname"] for link in json.loads(out or "[]")]


def _bridges() -> list[str]:
    res = subprocess.run(["ovs-vsctl", "--timeout=10", "list-br"], capture_output=True, text=True, check=True)
    return res.stdout.split()


def take(tag: str, round_no: int, controller_pid: int | None = None) -> Census:
    """The census now; ``controller_pid`` adds that controller's fds and memory."""
    # a socket in a reference cycle closes whenever the collector next runs: collect now, so that this process's
    # descriptors are what it holds (a baseline taken before such a collection was one above every later count)
    gc.collect()
    bridges = _bridges()
    links = _links()
    veths = _links("veth")
    me = psutil.Process()
    descendants = me.children(recursive=True)
    zombies = 0
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            zombies += child.status() == psutil.STATUS_ZOMBIE
    machine, machine_zombies, tagged = _processes(tag)
    vswitchd = vswitchd_pid()
    return Census(round=round_no, at=time.time(), test_fds=_fds(os.getpid()) or 0,
                  test_descendants=len(descendants), test_zombies=zombies, tagged_processes=tagged,
                  machine_processes=machine, machine_zombies=machine_zombies, bridges=len(bridges),
                  our_bridges=sum(bool(BRIDGE_RE.match(b)) for b in bridges), root_interfaces=len(links),
                  veths=len(veths), our_interfaces=sum(bool(INTERFACE_RE.match(n)) for n in links),
                  netns=_netns(), ovs_pid=vswitchd, ovs_fds=_fds(vswitchd), ovs_rss=_rss(vswitchd),
                  test_rss=_rss(os.getpid()) or 0, controller_pid=controller_pid,
                  controller_fds=_fds(controller_pid), controller_rss=_rss(controller_pid))


def rss_allowance(baseline: int) -> int:
    """How much resident memory may grow over ``baseline``: :data:`RSS_FRACTION` of it or :data:`RSS_FLOOR`."""
    return max(int(RSS_FRACTION * baseline), RSS_FLOOR)


def compare(baseline: Census, now: Census) -> list[str]:
    """What grew (or shrank: a count below the baseline means the baseline held something it should not)."""
    problems = []
    for name in EXACT:
        was, is_ = getattr(baseline, name), getattr(now, name)
        if was is not None and is_ != was:
            problems.append(f"{name}: {was} at the baseline, {is_} after round {now.round}")
    for name in RSS:
        was, is_ = getattr(baseline, name), getattr(now, name)
        if was is not None and is_ is not None and is_ - was > rss_allowance(was):
            problems.append(f"{name}: {was / MIB:.1f} MiB at the baseline, {is_ / MIB:.1f} MiB after round "
                            f"{now.round} (at most +{rss_allowance(was) / MIB:.1f} MiB)")
    if now.ovs_pid != baseline.ovs_pid:
        problems.append(f"ovs-vswitchd changed from pid {baseline.ovs_pid} to {now.ovs_pid} (restarted?)")
    return problems


def settled(tag: str, round_no: int, baseline: Census | None, controller_pid: int | None = None,
            timeout_s: float = 10.0) -> Census:
    """The census once its counts agree with ``baseline`` (teardown is partly asynchronous: ovs-vswitchd closes
    a deleted port's sockets in its next loop, the kernel frees a namespace after its last process is reaped),
    or the last one after ``timeout_s``. Without a baseline, the first one."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = take(tag, round_no, controller_pid)
        if baseline is None or not compare(baseline, now) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Hold the machine-wide network lock: no network (ours or anyone's) is up meanwhile."""
    with NetworkLock():
        yield


class CensusLog:
    """Every census of one test, one JSON line each, in ``results/soak/`` (``EF_SOAK_DIR`` overrides it)."""

    def __init__(self, name: str):
        folder = os.environ.get("EF_SOAK_DIR", os.path.join(ROOT, "results", "soak"))
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        print(f"census log: {self.path}")

    def write(self, record: Census | dict[str, Any]) -> None:
        data = record.to_json() if isinstance(record, Census) else record
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(data, sort_keys=True) + "\n")


def clean_removals(env: dict[str, str] | None = None) -> list[str]:
    """What ``emu clean`` removed: its lines but those saying there was nothing, or that a live run (someone
    else's, whose owner is alive) was left alone."""
    res = subprocess.run([EMU, "clean"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return [line for line in res.stdout.splitlines()
            if line.strip() and not line.startswith(("nothing of ours", "left run "))]
