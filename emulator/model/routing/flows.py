"""Transport flows between hosts, and the agents' connections, whose 5-tuples are known in advance.

Agent flows have fixed 5-tuples (:func:`agent_flow`), so a policy that hashes
5-tuples predicts exactly the path the emulated TCP connection takes; any
other TCP connection's path is predicted from its 5-tuple once its ports are
known.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model.topology import Topology

#: Every host agent listens here.
AGENT_LISTEN_PORT = 7000
#: An agent connecting to host ``hJ`` on lane ``L`` binds source port ``AGENT_SOURCE_PORT_BASE + L·n + J``
#: (``n`` hosts in the topology; lane 0 is ``BASE + J``).
AGENT_SOURCE_PORT_BASE = 20000
#: Agents' source ports stay below Linux's ephemeral range (32768..), which no other connection may then take.
MAX_AGENT_SOURCE_PORT = 32767

IPPROTO_ICMP = 1
IPPROTO_TCP = 6


@dataclass(frozen=True)
class Flow:
    """A transport flow between two hosts (ports 0 = any)."""

    src: str
    dst: str
    proto: int = IPPROTO_TCP
    sport: int = 0
    dport: int = 0


def max_lanes(topo: Topology) -> int:
    """How many lanes (connections per ordered host pair) the agents' source ports leave room for."""
    return (MAX_AGENT_SOURCE_PORT - AGENT_SOURCE_PORT_BASE) // len(topo.hosts)


def agent_flow(topo: Topology, src: str, dst: str, lane: int = 0) -> Flow:
    """The 5-tuple of the TCP connection the agent on ``src`` opens to ``dst``'s agent on ``lane``."""
    if not 0 <= lane < max_lanes(topo):
        raise ValueError(f"lane {lane} outside 0..{max_lanes(topo) - 1} for {len(topo.hosts)} hosts")
    sport = AGENT_SOURCE_PORT_BASE + lane * len(topo.hosts) + topo.host(dst).index
    return Flow(src, dst, IPPROTO_TCP, sport, AGENT_LISTEN_PORT)


def agent_lane(topo: Topology, src: str, dst: str, sport: int) -> int | None:
    """The lane of the agent connection ``src`` opens to ``dst`` from ``sport`` (None: not an agent's port)."""
    offset = sport - AGENT_SOURCE_PORT_BASE - topo.host(dst).index
    lane, rest = divmod(offset, len(topo.hosts))
    return lane if rest == 0 and 0 <= lane < max_lanes(topo) else None


def exact_flows(topo: Topology, src: str, dst: str, lanes: int = 1) -> list[Flow]:
    """The agent flows from ``src`` to ``dst`` whose 5-tuple entries a policy that hashes 5-tuples installs
    proactively.

    Per lane below ``lanes``: the agent connection ``src`` opens to ``dst``,
    and the return direction of the one ``dst`` opens to ``src``. (Such a
    policy hashes every TCP flow by its 5-tuple; these are the ones known in
    advance.)
    """
    out = []
    for lane in range(lanes):
        back = agent_flow(topo, dst, src, lane)
        out += [agent_flow(topo, src, dst, lane), Flow(src, dst, back.proto, back.dport, back.sport)]
    return out


def all_agent_flows(topo: Topology) -> list[Flow]:
    """The agent connection of every ordered host pair."""
    return [agent_flow(topo, s.name, d.name) for s in topo.hosts for d in topo.hosts if s.name != d.name]
