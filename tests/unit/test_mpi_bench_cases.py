"""The premise of ``make bench``'s MPI pairs on ECMP: the agents' paths are ones Open MPI's connections draw.

Under ECMP a run's time depends on how its connections hash. Open MPI opens one connection per pair of ranks
from a random port; the agents open one per direction from ports fixed by the seed. The pair compares the two
transports only if the agents' draw at the bench's seed is Open MPI's typical one: the timing model's time of
the agents' hd equals the median over random draws of Open MPI's connections.
"""

from __future__ import annotations

import random
import statistics

import pytest

from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import check
from emulator.runs import mpi_prediction
from emulator.runs.mpi_plan import BTL_PORT_MIN, message_profile
from emulator.selfcheck.bench.cases import MPI_FABRICS, MPI_SIZE

ECMP_FABRICS = [net for net in MPI_FABRICS if net.routing == "ecmp"]


def open_mpi_draw(hosts: list[str], rng: random.Random) -> list[tuple[str, str, int, int]]:
    """One draw of Open MPI's connections for hd/Rabenseifner: rank ``r`` and ``r ^ d`` for every distance
    ``d``, the lower rank connecting from an ephemeral port to the other's listening port."""
    p = len(hosts)
    pairs = {(min(r, r ^ d), max(r, r ^ d)) for r in range(p) for d in (1 << k for k in range(p.bit_length() - 1))}
    return [(hosts[a], hosts[b], rng.randint(32768, 60999), BTL_PORT_MIN) for a, b in sorted(pairs)]


@pytest.mark.parametrize("net", ECMP_FABRICS, ids=lambda n: n.label)
def test_the_agents_draw_on_ecmp_is_open_mpis_typical_one(net):
    topo = topology.build(net.topology, fabric.default().emulated_link_mbps)
    latency = LatencyModel(message_profile(fabric.default(), latency=False))
    agents = generators.generate("hd", topo, MPI_SIZE, placement=net.placement, seed=net.seed)
    agents_s = check(agents, topo, net.routing, seed=net.seed, latency=latency).predicted_time_s
    hosts = [h.name for h in topo.hosts]
    rng = random.Random(7)
    mpi_s = [check(mpi_prediction.open_mpi_schedule("hd", MPI_SIZE, hosts), topo, net.routing, seed=net.seed,
                   latency=latency,
                   flow_of=mpi_prediction.btl_flow_function(open_mpi_draw(hosts, rng), topo, net.routing, net.seed)
                   ).predicted_time_s for _ in range(15)]
    assert agents_s == pytest.approx(statistics.median(mpi_s), rel=0.02), (agents_s, sorted(mpi_s))
