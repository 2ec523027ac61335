"""The fabric's latency on a real MPI program's messages (root): ``emu mpirun`` preloads the latency library.

Two ranks of an mpi4py ping-pong over BiGraph 2/2/2, once on hosts under one
switch and once on hosts three switches apart. Half the median round trip of
an 8-byte message is its one-way latency, which must be the profile's
``D·(alpha + s·switch)`` within 20%; with ``--latency off`` it is this
machine's own, a small fraction of that.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from emulator.model import fabric, topology
from emulator.model.fabric import message_latency_s

pytestmark = pytest.mark.integration

EMU = [sys.executable, "-m", "emulator"]
TOPOLOGY = "bigraph:upper=2,lower=2,hosts_per_switch=2"

PING_PONG = '''
import json, statistics, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
buf = bytearray(8)
rtts = []
for i in range(13):
    comm.Barrier()
    start = MPI.Wtime()
    if comm.rank == 0:
        comm.Send(buf, dest=1)
        comm.Recv(buf, source=1)
    else:
        comm.Recv(buf, source=0)
        comm.Send(buf, dest=0)
    if i >= 3:
        rtts.append(MPI.Wtime() - start)
if comm.rank == 0:
    print(json.dumps({"oneway_s": statistics.median(rtts) / 2}))
'''


def _pair(switches: int) -> list[str]:
    topo = topology.build(TOPOLOGY, 20.0)
    names = [h.name for h in topo.hosts]
    return next([a, b] for a in names for b in names if a != b and topo.switch_hops(a, b) == switches)


def _one_way(tmp_path, name: str, hosts: list[str], *args: str) -> float:
    program = tmp_path / "ping_pong.py"
    program.write_text(PING_PONG, encoding="utf-8")
    placement = tmp_path / f"{name}.hosts"
    placement.write_text("\n".join(hosts) + "\n", encoding="utf-8")
    out = tmp_path / name
    cmd = [*EMU, "mpirun", "--topology", TOPOLOGY, "--routing", "bigraph", "--placement", str(placement),
           "--out", str(out), "--timeout", "120", *args, "--", "python3", str(program)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=200, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    line = (out / "ranks" / "rank-0.stdout").read_text(encoding="utf-8").strip().splitlines()[-1]
    return float(json.loads(line)["oneway_s"])


@pytest.mark.parametrize("switches", [1, 3])
def test_an_mpi_message_takes_the_profiles_latency_over_its_switches(tmp_path, switches):
    want = message_latency_s(fabric.default(), switches)
    got = _one_way(tmp_path, f"s{switches}", _pair(switches))
    assert got == pytest.approx(want, rel=0.2), (got, want)


def test_without_the_library_the_latency_is_this_machines_own(tmp_path):
    got = _one_way(tmp_path, "off", _pair(1), "--latency", "off")
    assert got < 0.2 * message_latency_s(fabric.default(), 1), got
