"""Agents starved of CPU on purpose: the repetition is flagged ``emulator_lag`` while the CPU still shows idle time.

The agents of a replay are moved, as soon as they exist, into a CPU cgroup of
this test's own (``ef-emu-test-starve-<pid>``) that allows them a fifth of
one core between them. Open vSwitch and everything else keep the machine:
``cpu_saturated`` cannot see this, the agents' lag (the kernel's receive
stamps and the sends' deadlines against when the agents acted) does.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest

from emulator.emulation.machine.started import all_runs
from emulator.emulation.session.replay import ReplayConfig, replay
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.schedule import format as sformat
from emulator.runs.metrics import LAG_SHARE

pytestmark = pytest.mark.integration

BIGRAPH = "bigraph:upper=2,lower=2,hosts_per_switch=2,bw=10"
SIZE = 1 << 20  # 8 ranks at 10 Mbit/s: about 1.5 s per repetition when the agents have the CPU
QUOTA_US, PERIOD_US = 3_000, 100_000  # 3 % of one core for all the agents together
V1_ROOT, V2_ROOT = "/sys/fs/cgroup/cpu", "/sys/fs/cgroup"


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


@contextlib.contextmanager
def starving_cgroup() -> Iterator[str]:
    """A CPU cgroup capped at :data:`QUOTA_US` per :data:`PERIOD_US` (cgroup v1 or v2); its ``cgroup.procs``."""
    name = f"ef-emu-test-starve-{os.getpid()}"
    if os.path.exists(os.path.join(V1_ROOT, "cpu.cfs_quota_us")):
        root = V1_ROOT
        path = os.path.join(root, name)
        os.mkdir(path)
        _write(os.path.join(path, "cpu.cfs_period_us"), str(PERIOD_US))
        _write(os.path.join(path, "cpu.cfs_quota_us"), str(QUOTA_US))
    elif "cpu" in open(os.path.join(V2_ROOT, "cgroup.subtree_control"), encoding="ascii").read().split():
        root = V2_ROOT
        path = os.path.join(root, name)
        os.mkdir(path)
        _write(os.path.join(path, "cpu.max"), f"{QUOTA_US} {PERIOD_US}")
    else:
        pytest.skip("no CPU cgroup controller to starve the agents with")
    try:
        yield os.path.join(path, "cgroup.procs")
    finally:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as fh:
            left = fh.read().split()
        for pid in left:  # agents that outlived the run (none should) go back before the group goes
            with contextlib.suppress(OSError):
                _write(os.path.join(root, "cgroup.procs"), pid)
        os.rmdir(path)


def _our_agent_pids() -> list[int]:
    """The agents of the run this process owns (its run state records them)."""
    me = os.getpid()
    return [int(p["pid"]) for r in all_runs() if (r.owner() or {}).get("pid") == me
            for p in r.processes() if p.get("role") == "agent"]


def _confine_agents(procs: str, ranks: int, stop: threading.Event) -> None:
    """Move every agent of our run into the cgroup as soon as all ``ranks`` of them exist."""
    while not stop.is_set():
        pids = _our_agent_pids()
        if len(pids) >= ranks:
            for pid in pids:
                _write(procs, str(pid))
            return
        time.sleep(0.05)


def test_starved_agents_are_flagged_emulator_lag_while_the_cpu_is_idle(tmp_path):
    topo = topology.build(BIGRAPH)
    path = str(tmp_path / "hdrm.json")
    sformat.save(generators.generate("hdrm", topo, SIZE), path)
    stop = threading.Event()
    with starving_cgroup() as procs:
        mover = threading.Thread(target=_confine_agents, args=(procs, len(topo.hosts), stop), daemon=True)
        mover.start()
        try:
            res = replay(ReplayConfig(schedule=path, network=fabric.rebuild(BIGRAPH), routing="bigraph",
                                      out=str(tmp_path / "out"), repeat=1, warmup=1, timeout_s=120))
        finally:
            stop.set()
            mover.join(5)
    assert res.status == "ok" and all(rep.correct for rep in res.repetitions)
    for rep in res.repetitions:
        fid = rep.fidelity
        assert fid is not None
        print(f"starved: idle {fid.cpu_idle:.2f}, lag share {fid.lag_share}, rank {fid.lag_rank}, "
              f"flags {fid.flags}, time {rep.time_s:.2f} s")
        assert "cpu_saturated" not in fid.flags  # the machine had CPU to spare; the agents did not
        assert fid.lag_share is not None and fid.lag_share > LAG_SHARE
        assert "emulator_lag" in fid.flags and not fid.trusted
