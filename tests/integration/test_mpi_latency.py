"""The fabric's latency on a real MPI program's messages (root): ``emu mpirun`` preloads the latency library.

An mpi4py ping-pong over BiGraph 2/2/2, in one ``emu mpirun`` of four ranks: ranks 0 and 1 on hosts under one
switch, then ranks 2 and 3 on hosts three switches apart. Half the median round trip of an 8-byte message is
its one-way latency, which must be the profile's ``D·(alpha + s·switch)`` within the band of
docs/testing-accuracy.md; the three-switch pair's less the one-switch pair's must be the two switches'
``2·D·switch`` (10 ms of 45 and 55: a library that dropped the per-switch term would pass a band on each alone).
With ``--latency off`` it is this machine's own, a small fraction of that.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from emulator.model import fabric, topology
from emulator.model.fabric import message_latency_s

from .measured import band

pytestmark = pytest.mark.integration

EMU = [sys.executable, "-m", "emulator"]
TOPOLOGY = "bigraph:upper=2,lower=2,hosts_per_switch=2"
#: The one-way latency over its profile's: the documented accuracy of a latency (±10 %, docs/fidelity.md:
#: 45.31 and 55.24 ms measured for 45 and 55) widened by the spread measured here (1.004-1.022 over both paths,
#: docs/testing-accuracy.md). Before: ±20 %, which a library without the per-switch term passed on one switch.
LATENCY_BAND = band(noise=0.02)
#: The two more switches' share, measured over the profile's 2·D·switch (10 ms): the same ±10 % taken on the
#: 55 ms it is read from (5.5 ms either way; measured 1.04-1.06). Without the per-switch term it is 0, doubled 2.
SWITCHES_BAND = (0.45, 1.55)

#: Each pair of ranks in turn (the other pair waits at the barrier) sends an 8-byte message back and forth
#: 13 times; the first 3 round trips warm the path up. The first rank of each pair prints its one-way latency.
PING_PONG = '''
import json, statistics
from mpi4py import MPI
comm = MPI.COMM_WORLD
buf = bytearray(8)
for first in range(0, comm.size, 2):
    comm.Barrier()
    rtts = []
    for i in range(13):
        start = MPI.Wtime()
        if comm.rank == first:
            comm.Send(buf, dest=first + 1)
            comm.Recv(buf, source=first + 1)
        elif comm.rank == first + 1:
            comm.Recv(buf, source=first)
            comm.Send(buf, dest=first)
        if i >= 3:
            rtts.append(MPI.Wtime() - start)
    if comm.rank == first:
        print(json.dumps({"oneway_s": statistics.median(rtts) / 2}), flush=True)
'''


def _pairs(*switches: int) -> list[str]:
    """Hosts for the ranks, two by two: one pair ``switches[i]`` switches apart each, no host used twice."""
    topo = topology.build(TOPOLOGY, 20.0)
    names = [h.name for h in topo.hosts]
    hosts: list[str] = []
    for s in switches:
        hosts += next([a, b] for a in names for b in names
                      if a != b and not {a, b} & set(hosts) and topo.switch_hops(a, b) == s)
    return hosts


def _one_way(tmp_path, name: str, hosts: list[str], *args: str) -> list[float]:
    """The one-way latency of each pair of ranks, in rank order."""
    program = tmp_path / "ping_pong.py"
    program.write_text(PING_PONG, encoding="utf-8")
    placement = tmp_path / f"{name}.hosts"
    placement.write_text("\n".join(hosts) + "\n", encoding="utf-8")
    out = tmp_path / name
    cmd = [*EMU, "mpirun", "--topology", TOPOLOGY, "--routing", "bigraph", "--placement", str(placement),
           "--out", str(out), "--timeout", "120", *args, "--", "python3", str(program)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=200, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [(out / "ranks" / f"rank-{r}.stdout").read_text(encoding="utf-8").strip().splitlines()[-1]
             for r in range(0, len(hosts), 2)]
    return [float(json.loads(line)["oneway_s"]) for line in lines]


def test_an_mpi_message_takes_the_profiles_latency_over_its_switches(tmp_path):
    profile = fabric.default()
    want = {s: message_latency_s(profile, s) for s in (1, 3)}
    got = dict(zip((1, 3), _one_way(tmp_path, "on", _pairs(1, 3)), strict=True))
    ratios = {s: got[s] / want[s] for s in got}
    two_switches = (got[3] - got[1]) / (want[3] - want[1])
    print(f"MPI one-way latency: 1 switch {got[1] * 1e3:.2f} ms ({ratios[1]:.3f} of the profile's), 3 switches "
          f"{got[3] * 1e3:.2f} ms ({ratios[3]:.3f}); the two switches between {two_switches:.3f} of the profile's")
    assert all(LATENCY_BAND[0] <= r <= LATENCY_BAND[1] for r in ratios.values()), (got, want)
    assert SWITCHES_BAND[0] <= two_switches <= SWITCHES_BAND[1], (got, want)


def test_without_the_library_the_latency_is_this_machines_own(tmp_path):
    (got,) = _one_way(tmp_path, "off", _pairs(1), "--latency", "off")
    assert got < 0.2 * message_latency_s(fabric.default(), 1), got
