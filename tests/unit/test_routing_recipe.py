"""docs/architecture.md's recipe for a new routing policy, followed with a toy one: one registered subclass of
``RoutingPolicy`` and nothing else, and every place that takes a policy takes it (the router and the flow table,
the controller, the schedule check, experiment files, the report's words)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from test_routing import FakeFlowTable

from controllers.core import ControllerCore
from emulator.base.errors import UserError
from emulator.model import routing, topology
from emulator.model.collectives.generators import generate
from emulator.model.prediction.check import check
from emulator.model.topology import TopologyKind
from emulator.study import experiment as xp
from emulator.study.report import answers

LEAFSPINE = "leafspine:leaves=3,spines=3,hosts_per_leaf=2"


class LastCandidate(routing.RoutingPolicy):
    """The toy: at a choice, the highest-numbered candidate (``shortest`` takes the lowest); made for the Clos
    fabrics only."""

    name = "last"
    title = "last-candidate"

    @classmethod
    def applies_to(cls, kind: TopologyKind) -> bool:
        return kind.clos is not None

    def by_destination(self, node: str, cands: Sequence[str], dst: str) -> str:
        return cands[-1]


@pytest.fixture
def last() -> Iterator[str]:
    routing.register(LastCandidate)
    try:
        yield LastCandidate.name
    finally:
        routing.unregister(LastCandidate.name)


def test_the_router_and_the_flow_table_take_it(last):
    topo = topology.build(LEAFSPINE)
    assert routing.check_policy(topo, last) is LastCandidate
    assert routing.route(topo, last, routing.Flow("h1", "h3")) == ["h1", "s1", "s6", "s2", "h3"]  # the last spine
    fake = FakeFlowTable(topo, routing.flow_table(topo, last))
    for src in topo.hosts:
        for dst in topo.hosts:
            if src.name != dst.name:
                flow = routing.agent_flow(topo, src.name, dst.name)
                assert fake.trace(flow) == routing.route(topo, last, flow)
    assert routing.policy_kinds(last) == ("fattree", "leafspine", "rail")
    with pytest.raises(UserError, match=r"routing for bigraph: field 'policy': expected one of .* \(last applies "
                                        r"to fattree and leafspine and rail only\), got 'last'"):
        routing.check_policy(topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2"), last)


def test_the_controller_and_the_schedule_check_take_it(last):
    topo = topology.build(LEAFSPINE)
    core = ControllerCore(topo, last)
    assert core.tcp_packet_in("s1", "10.0.0.1", "10.0.0.3", 40000, 7000) is None  # it hashes no 5-tuple: no learning
    report = check(generate("ring", topo, 6 << 16), topo, last)
    assert report.valid and report.costs.routing == last
    assert routing.label(last, 3) == last and routing.seeds_of(last, (0, 1)) == (0,)  # a seed changes nothing


def test_an_experiment_file_and_the_report_take_it(last):
    exp = xp.from_dict({"series": [{"name": "s", "runs": [
        {"topology": LEAFSPINE, "routing": ["last", "shortest"], "algorithms": ["ring"], "sizes": ["64KiB"]}]}]})
    assert [c.id for c in xp.expand(exp)] == ["s.leafspine-3x3x2.last.ring.64KiB",
                                              "s.leafspine-3x3x2.shortest.ring.64KiB"]
    assert routing.title(last) == "last-candidate"
    row = type("Row", (), {"kind": "leafspine", "routing": last, "algorithm": "ring", "placement": "identity",
                           "collective": "allreduce"})()
    assert answers.describe(row) == "leaf-spine + last-candidate + ring"
