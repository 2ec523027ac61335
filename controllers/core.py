"""The controller's state and decisions, in pure Python (no os-ken import).

:class:`ControllerCore` knows the topology model and the routing policy and
answers every question the app has: which entries a switch gets when it
connects (:meth:`~ControllerCore.connect`), which entries change when a port
goes down or up (:meth:`~ControllerCore.port_state`, returning an
:class:`Update`), which host pairs are cut off, where a TCP packet that
reached it through a miss entry goes and which entries its connection gets
(:meth:`~ControllerCore.tcp_packet_in`, returning :class:`Learned`), and what
a port-statistics reply means as per-link JSON records
(:meth:`~ControllerCore.stats_records`).

Under ``ecmp`` the switches get the reactive table
(``routing.flow_table(..., reactive=True)``): TCP packets of a connection
not yet learned reach the controller at the first choice point of their
path; the core answers with the 5-tuple entries of both directions
(:func:`emulator.model.routing.learned_entries`, each direction hashed on its own)
so that every TCP connection takes exactly its :func:`emulator.model.routing.route`.
Learned entries are not part of the desired table: on a reroute the app
deletes them all by :data:`emulator.model.routing.LEARNED_COOKIE` and the core
forgets them (:attr:`Update.clear_learned`); packets then re-learn along the
new paths.
The app (:mod:`controllers.eflops_controller`) only translates datapath ids,
sends messages and writes files.

Settings reach the app either from :func:`configure`-style calls by the
``emu controller`` launcher or, under ``ryu-manager``/other launchers, from
environment variables (:meth:`Settings.from_env`):

``EF_TOPOLOGY`` (spec or JSON path, required), ``EF_ROUTING`` (default
``shortest``), ``EF_ECMP_SEED`` (default 0), ``EF_STATS_FILE`` (JSON lines,
default none), ``EF_STATS_INTERVAL`` (seconds, default 1), ``EF_STATE_FILE``
(JSON status for waiting scripts, default none).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from emulator.base.errors import FieldError
from emulator.model import routing, topology
from emulator.model.routing import Flow, FlowEntry
from emulator.model.topology import Topology, node_sort_key
from emulator.runs.admission import MAX_SEED

DEFAULT_LISTEN = ("127.0.0.1", 6653)
DEFAULT_STATS_INTERVAL = 1.0


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv4 address) -> ``(host, port)``; :class:`FieldError` otherwise."""
    expected = "HOST:PORT with an IPv4 address and a port in 1..65535 (e.g. 127.0.0.1:6653)"
    host, sep, port = str(text).rpartition(":")
    try:
        ipaddress.IPv4Address(host)
        number = int(port)
    except ValueError:
        raise FieldError("controller", "listen", expected, text) from None
    if not sep or not 1 <= number <= 65535:
        raise FieldError("controller", "listen", expected, text)
    return host, number


@dataclass(frozen=True)
class Settings:
    """Everything the controller app needs; validated by :meth:`check`."""

    topology: str
    routing: str = "shortest"
    seed: int = 0
    stats_file: str | None = None
    stats_interval: float = DEFAULT_STATS_INTERVAL
    state_file: str | None = None
    listen: tuple[str, int] = DEFAULT_LISTEN
    lanes: int = 1  # agent connections per ordered host pair (ecmp installs an exact entry for each)

    def check(self) -> Topology:
        """Validate every field; return the loaded topology. Raises :class:`UserError`."""
        topo = topology.load(self.topology)
        routing.check_policy(topo, self.routing)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise FieldError("controller", "ecmp-seed", f"an integer in 0..{MAX_SEED}", self.seed)
        if not isinstance(self.stats_interval, (int, float)) or not 0.05 <= self.stats_interval <= 3600:
            raise FieldError("controller", "stats-interval", "seconds in [0.05, 3600]", self.stats_interval)
        if isinstance(self.lanes, bool) or not isinstance(self.lanes, int) or not 1 <= self.lanes <= routing.max_lanes(topo):
            raise FieldError("controller", "lanes", f"an integer in 1..{routing.max_lanes(topo)} for "
                             f"{len(topo.hosts)} hosts", self.lanes)
        parse_listen(f"{self.listen[0]}:{self.listen[1]}")
        return topo

    def to_env(self) -> dict[str, str]:
        env = {"EF_TOPOLOGY": self.topology, "EF_ROUTING": self.routing, "EF_ECMP_SEED": str(self.seed),
               "EF_STATS_INTERVAL": repr(float(self.stats_interval)), "EF_LANES": str(self.lanes)}
        if self.stats_file:
            env["EF_STATS_FILE"] = self.stats_file
        if self.state_file:
            env["EF_STATE_FILE"] = self.state_file
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        if not env.get("EF_TOPOLOGY"):
            raise FieldError("controller environment", "EF_TOPOLOGY", "a topology spec or JSON file", "nothing")
        try:
            seed = int(env.get("EF_ECMP_SEED", "0"))
        except ValueError:
            raise FieldError("controller environment", "EF_ECMP_SEED", "an integer >= 0",
                             env.get("EF_ECMP_SEED")) from None
        try:
            interval = float(env.get("EF_STATS_INTERVAL", str(DEFAULT_STATS_INTERVAL)))
        except ValueError:
            raise FieldError("controller environment", "EF_STATS_INTERVAL", "seconds",
                             env.get("EF_STATS_INTERVAL")) from None
        try:
            lanes = int(env.get("EF_LANES", "1"))
        except ValueError:
            raise FieldError("controller environment", "EF_LANES", "an integer >= 1", env.get("EF_LANES")) from None
        return cls(topology=env["EF_TOPOLOGY"], routing=env.get("EF_ROUTING", "shortest"), seed=seed,
                   stats_file=env.get("EF_STATS_FILE") or None, stats_interval=interval,
                   state_file=env.get("EF_STATE_FILE") or None, lanes=lanes)


@dataclass
class Update:
    """What a port event changes: entries to add (or overwrite) and to delete, per switch."""

    adds: dict[str, list[FlowEntry]] = field(default_factory=dict)
    deletes: dict[str, list[FlowEntry]] = field(default_factory=dict)
    failed_links: list[tuple[str, str]] = field(default_factory=list)
    newly_cut: list[tuple[str, str]] = field(default_factory=list)
    restored: list[tuple[str, str]] = field(default_factory=list)
    #: Connected switches whose learned entries (cookie ``LEARNED_COOKIE``) must go, before the adds.
    clear_learned: list[str] = field(default_factory=list)

    def size(self) -> int:
        return sum(map(len, self.adds.values())) + sum(map(len, self.deletes.values()))


@dataclass
class Learned:
    """What a TCP packet-in decides: entries to add per switch (in sending order) and where the packet goes."""

    #: Switch -> learned entries of both directions of the connection; the forward direction's
    #: switches come first, the one farthest downstream first.
    entries: dict[str, list[FlowEntry]]
    #: The port the packet leaves the switch it came from by (a packet-out).
    out_port: int
    #: True the first time this connection is learned since the last reroute.
    new: bool = False
    #: The connection: its lower-sorted direction's (src host, dst host, sport, dport).
    connection: tuple[str, str, int, int] | None = None


def connections_log(state_file: str) -> str:
    """Where the app appends each connection it learns (:attr:`Learned.connection`, one JSON list per line),
    beside its state file: who reads it after a run can route what ran as the controller did (the state file
    keeps only counts, and is rewritten at every change)."""
    return state_file + ".connections.jsonl"


#: Port-statistics fields the app passes in (OpenFlow 1.3 ``ofp_port_stats``).
COUNTER_FIELDS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped",
                  "rx_errors", "tx_errors")


def _link_name(link: frozenset[str]) -> tuple[str, str]:
    a, b = sorted(link, key=node_sort_key)
    return (a, b)


class ControllerCore:
    """Desired and installed flow entries of every switch, and the links that are down."""

    def __init__(self, topo: Topology, policy: str, seed: int = 0, lanes: int = 1):
        routing.check_policy(topo, policy)
        self.topo = topo
        self.policy = policy
        self.seed = seed
        self.lanes = lanes
        self.by_dpid = {s.dpid: s.name for s in topo.switches}
        self.down_ports: set[tuple[str, int]] = set()
        self.failed: frozenset[frozenset[str]] = frozenset()
        self.cut: set[tuple[str, str]] = set()
        self.desired = self._compute()
        self.installed: dict[str, dict[tuple, FlowEntry]] = {}
        self.confirmed: set[str] = set()
        self.reroutes = 0
        self.host_by_ip = {h.ip: h.name for h in topo.hosts}
        self.learner = routing.Learner(topo, policy, seed=seed, failed=self.failed)
        #: Connections learned since the last reroute (each as its lower-sorted direction's 5-tuple).
        self.learned: set[tuple[str, str, int, int]] = set()
        self.learned_total = 0

    # ----------------------------------------------------------- switches
    def switch_name(self, dpid: int) -> str | None:
        return self.by_dpid.get(dpid)

    def _compute(self) -> dict[str, dict[tuple, FlowEntry]]:
        table = routing.flow_table(self.topo, self.policy, seed=self.seed, failed=self.failed, lanes=self.lanes,
                                   reactive=True)
        return {sw: {e.key(): e for e in entries} for sw, entries in table.items()}

    def connect(self, switch: str) -> list[FlowEntry]:
        """``switch`` (re)connected and was wiped: every entry it must get."""
        self.installed[switch] = dict(self.desired[switch])
        self.confirmed.discard(switch)
        return list(self.desired[switch].values())

    def confirm(self, switch: str) -> None:
        """The switch acknowledged (barrier) everything sent so far."""
        if switch in self.installed:
            self.confirmed.add(switch)

    def unconfirm(self, switch: str) -> None:
        """Changes were sent to ``switch``; not confirmed until its next barrier reply."""
        self.confirmed.discard(switch)

    def disconnect(self, switch: str) -> None:
        self.installed.pop(switch, None)
        self.confirmed.discard(switch)

    # -------------------------------------------------------------- ports
    def port_state(self, switch: str, port: int, up: bool) -> Update | None:
        """A port went up or down; the changes to send, or None if routing is unchanged."""
        return self.port_states(switch, {port: up})

    def port_states(self, switch: str, states: Mapping[int, bool]) -> Update | None:
        for port, up in states.items():
            if self.topo.link_at(switch, port) is None:
                continue
            if up:
                self.down_ports.discard((switch, port))
            else:
                self.down_ports.add((switch, port))
        failed = frozenset(frozenset((lk.a, lk.b)) for sw, p in self.down_ports
                           if (lk := self.topo.link_at(sw, p)) is not None)
        if failed == self.failed:
            return None
        self.failed = failed
        self.desired = self._compute()
        cut = set(routing.cut_pairs(self.topo, failed))
        update = Update(failed_links=sorted((_link_name(x) for x in failed),
                                            key=lambda p: (node_sort_key(p[0]), node_sort_key(p[1]))),
                        newly_cut=sorted(cut - self.cut, key=_pair_key),
                        restored=sorted(self.cut - cut, key=_pair_key))
        self.cut = cut
        self.learner = routing.Learner(self.topo, self.policy, seed=self.seed, failed=failed)
        if routing.hashes_five_tuples(self.policy):
            update.clear_learned = sorted(self.installed, key=node_sort_key)
        self.learned.clear()
        for sw, have in self.installed.items():
            want = self.desired[sw]
            adds = [e for k, e in want.items() if have.get(k) != e]
            deletes = [e for k, e in have.items() if k not in want]
            if adds:
                update.adds[sw] = adds
            if deletes:
                update.deletes[sw] = deletes
            self.installed[sw] = dict(want)
        self.reroutes += 1
        return update

    # ---------------------------------------------------------- packet-in
    def tcp_packet_in(self, switch: str, src_ip: str, dst_ip: str, sport: int, dport: int) -> Learned | None:
        """A TCP packet ``src_ip:sport -> dst_ip:dport`` missed at ``switch``: what to install and send.

        The learned entries of the connection in both directions (the forward
        5-tuple and the reversed one, each hashed on its own) for every switch
        concerned, leaving out entries the desired table already holds (agent
        flows), and the port the packet leaves ``switch`` by. None (drop the
        packet): an address that is no host, a pair cut off by failed links,
        or a policy that learns nothing. Idempotent: the same packet-in again
        (a race with the flow-mods, an expired entry) gives the same answer.
        """
        src, dst = self.host_by_ip.get(src_ip), self.host_by_ip.get(dst_ip)
        if not routing.hashes_five_tuples(self.policy) or src is None or dst is None or src == dst:
            return None
        forward = Flow(src, dst, routing.IPPROTO_TCP, sport, dport)
        backward = Flow(dst, src, routing.IPPROTO_TCP, dport, sport)
        out_port = self.learner.out_port(switch, forward)
        if out_port is None:
            return None
        entries: dict[str, list[FlowEntry]] = {}
        for flow, downstream_first in ((forward, True), (backward, False)):
            learned = self.learner.entries(flow)
            for entry in reversed(learned) if downstream_first else learned:
                if entry.key() not in self.desired.get(entry.switch, {}):
                    entries.setdefault(entry.switch, []).append(entry)
        key = min((src, dst, sport, dport), (dst, src, dport, sport))
        new = key not in self.learned
        if new:
            self.learned.add(key)
            self.learned_total += 1
        return Learned(entries, out_port, new, key)

    # -------------------------------------------------------------- stats
    def stats_records(self, switch: str, counters: Iterable[Mapping[str, int]], now: float) -> list[dict]:
        """Per-link JSON records from one port-statistics reply.

        One record per port that carries a link: the directed link out of
        the port (``from`` -> ``to``) with its ``bytes``, ``packets`` and
        ``drops`` (the port's transmit counters), plus the receive counters
        of the opposite direction as seen by this port (``rx_*``).
        """
        out = []
        for c in counters:
            port = int(c["port_no"])
            link = self.topo.link_at(switch, port)
            if link is None:
                continue
            peer = link.other(switch)
            out.append({"time": round(now, 3), "switch": switch, "port": port, "from": switch, "to": peer,
                        "link": f"{switch}->{peer}", "kind": link.kind,
                        "bytes": int(c["tx_bytes"]), "packets": int(c["tx_packets"]), "drops": int(c["tx_dropped"]),
                        "rx_bytes": int(c["rx_bytes"]), "rx_packets": int(c["rx_packets"]),
                        "rx_drops": int(c["rx_dropped"]),
                        "errors": int(c.get("tx_errors", 0)) + int(c.get("rx_errors", 0)),
                        "up": (switch, port) not in self.down_ports})
        return out

    # ------------------------------------------------------------- report
    def sharing_report(self) -> list[str]:
        """For ``ecmp``: one line per directed switch link that two or more agent flows share."""
        shared = routing.link_sharing(self.topo, self.policy, routing.all_agent_flows(self.topo),
                                      seed=self.seed, failed=self.failed)
        return [f"link {a}->{b} shared by {len(flows)} agent flows: "
                + " ".join(f"{f.src}->{f.dst}" for f in flows) for (a, b), flows in shared.items()]

    def status(self, **extra: object) -> dict:
        return {"topology": self.topo.spec, "policy": self.policy, "seed": self.seed,
                "switches": len(self.topo.switches),
                "connected": sorted(self.installed, key=node_sort_key),
                "installed": sorted(self.confirmed, key=node_sort_key),
                "failed_links": [list(_link_name(x)) for x in sorted(self.failed, key=sorted)],
                "cut_pairs": [list(p) for p in sorted(self.cut, key=_pair_key)],
                "reroutes": self.reroutes, "learned_connections": len(self.learned),
                "learned_total": self.learned_total, **extra}


def _pair_key(p: tuple[str, str]) -> tuple:
    return (node_sort_key(p[0]), node_sort_key(p[1]))

