"""The latency part of ``emu calibrate``: what this machine adds by itself to every message.

The fabric profile's latency is added by the agents (:mod:`emulator.model.latency`);
they subtract what the machine adds anyway, and the timing model takes it as
a floor. This module measures it, per path length (1, 2, 3 and 5 switches,
:data:`PROBES`), at a network's MTU and link rate:

* ``oneway_s`` -- half a ping's round trip, less serialisation: the kernel
  and the datapath alone;
* ``data_s`` -- a small message from the sender's ``sendall`` to the
  receiver's agent holding it, less serialisation (:class:`~emulator.model.latency.Intrinsic`'s
  ``data``);
* ``rendezvous_s`` -- a receive being posted to its clear to send in the
  sender's hand (``rendezvous``);
* ``ack_s`` -- a received message to its sender seeing its last byte
  acknowledged (``ack``);
* ``agent_overhead_s`` -- ``data_s - oneway_s``: the agents' own work per message.

Each comes from 2-rank halving-doubling exchanges of :data:`PROBE_BYTES`
bytes between a pair of hosts that far apart, replayed by the real agents
with no latency added, :data:`PROBE_REPS` repetitions; medians per path
length, read at other lengths by straight lines between them
(:class:`emulator.model.latency.Curve`).

:func:`summarise` is pure and unit-tested; :func:`measure` needs root.
"""

from __future__ import annotations

import os
import shlex
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from emulator.base.files import read_jsonl
from emulator.emulation.machine.calibration_file import LatencyCalibration, PathMeasurement
from emulator.emulation.session.replay import ReplaySession
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.latency import Curve, Intrinsic

#: (topology spec without rates, routing, {switches crossed: (host, host)}): the bigraph gives paths of 1, 2 and
#: 3 switches (same switch, opposite groups, same group), the fat-tree's cross-pod path 5.
PROBES: tuple[tuple[str, str, dict[int, tuple[str, str]]], ...] = (
    ("bigraph:upper=2,lower=2,hosts_per_switch=2", "bigraph", {1: ("h1", "h2"), 2: ("h1", "h5"), 3: ("h1", "h3")}),
    ("fattree:k=4", "shortest", {5: ("h1", "h16")}),
)
PROBE_BYTES = 64
PROBE_REPS = 25
PING_COUNT = 20


def serialisation_s(nbytes: int, links: int, rate_mbps: float, mtu: int) -> float:
    """What the timing model charges a message of ``nbytes`` for its links: one pass per link (one frame)."""
    return links * nbytes / (rate_mbps * 1e6 / 8 * topology.tcp_goodput_factor(mtu))


def ping_oneway_s(rtts_ms: Sequence[float], links: int, rate_mbps: float, mtu: int, icmp_bytes: int = 98) -> float:
    """Half the median round trip of ``ping``, less the serialisation of its frames in both directions."""
    wire = (icmp_bytes + 14) * 8 / (rate_mbps * 1e6)
    return max(0.0, statistics.median(rtts_ms) / 1e3 / 2 - links * wire)


def parse_ping(text: str) -> list[float]:
    """Round-trip times (ms) from ``ping`` output lines ``... time=0.123 ms``."""
    out = []
    for line in text.splitlines():
        if "time=" in line:
            try:
                out.append(float(line.split("time=", 1)[1].split()[0]))
            except (ValueError, IndexError):
                continue
    return out


def summarise(records: Mapping[int, Sequence[Mapping[str, Any]]], oneway: Mapping[int, float], rate_mbps: float,
              mtu: int, nbytes: int = PROBE_BYTES) -> LatencyCalibration:
    """Medians per path length and the fitted lines, from the probes' timeline records.

    ``records[switches]`` are timeline records (:func:`emulator.runs.metrics.timeline_records`
    with the agents' send details) of exchanges over that many switches;
    ``oneway[switches]`` the ping estimate.
    """
    per: dict[int, PathMeasurement] = {}
    for s, recs in sorted(records.items()):
        ser = serialisation_s(nbytes, s + 1, rate_mbps, mtu)
        data = [r["end"] - r["sent"] - ser for r in recs]
        rend = [r["cts_at"] - r["posted"] for r in recs]
        acks = [r["send_end"] - r["end"] for r in recs if r["send_end"] > r["end"]]
        data_s = max(0.0, statistics.median(data))
        one = oneway.get(s, 0.0)
        per[s] = PathMeasurement(data_s=data_s, rendezvous_s=max(0.0, statistics.median(rend)),
                                 ack_s=max(0.0, statistics.median(acks)) if acks else 0.0, oneway_s=one,
                                 agent_overhead_s=max(0.0, data_s - one),
                                 data_p90_s=sorted(data)[int(0.9 * (len(data) - 1))], messages=len(recs))

    def curve(key: str) -> Curve:
        return Curve(tuple((s, getattr(m, key)) for s, m in per.items()))

    intrinsic = Intrinsic(data=curve("data_s"), rendezvous=curve("rendezvous_s"), ack=curve("ack_s"),
                          source="emu calibrate")
    return LatencyCalibration(link_mbps=rate_mbps, mtu=mtu, bytes=nbytes, per_switches=per, intrinsic=intrinsic)


# ------------------------------------------------------------- the live part
def _records(out: str) -> list[dict[str, Any]]:
    """The transfers of a probe's ``timeline.jsonl`` that carry the agents' send details."""
    return [rec for rec in read_jsonl(os.path.join(out, "timeline.jsonl")) if "sent" in rec]


def _ping(session: Any, topo: topology.Topology, a: str, b: str) -> list[float]:
    """Round trips (ms) from ``a`` to ``b``, after as many pings again to warm the path up."""
    node = session.en.host(a)
    argv = ["ping", "-n", "-c", str(PING_COUNT), "-i", "0.01", "-W", "1", topo.host(b).ip]
    node.cmd(shlex.join(argv))  # warm-up: ARP is static, but the datapath's flow caches are not
    return parse_ping(node.cmd(shlex.join(argv)))


def measure(rate_mbps: float, mtu: int, datapath: str = "auto", reps: int = PROBE_REPS,
            echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the probes (two networks, one after the other); returns :func:`summarise`'s result as the
    ``latency`` document of the calibration file (:meth:`LatencyCalibration.to_json`)."""
    records: dict[int, list[dict[str, Any]]] = {}
    oneway: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="ef-latency-") as tmp:
        for spec, policy, pairs in PROBES:
            topo = topology.build(spec, rate_mbps)
            with ReplaySession(topo, policy, datapath=datapath, mtu=mtu, work_dir=os.path.join(tmp, "session"),
                               echo=lambda s: None) as session:
                for s, (a, b) in sorted(pairs.items()):
                    out = os.path.join(tmp, f"probe-{s}")
                    session.run(generators.pair_exchange(a, b, PROBE_BYTES), out, repeat=reps, warmup=2)
                    records[s] = [r for r in _records(out) if r["rep"] >= 2]
                    rtts = _ping(session, topo, a, b)
                    oneway[s] = ping_oneway_s(rtts, s + 1, rate_mbps, mtu) if rtts else 0.0
                    med = statistics.median(r["end"] - r["sent"] for r in records[s])
                    echo(f"  latency over {s} switch{'es' if s > 1 else ''} ({a}-{b}): message {med * 1e3:.2f} ms "
                         f"sendall to receiver, ping one-way {oneway[s] * 1e3:.2f} ms")
    return summarise(records, oneway, rate_mbps, mtu).to_json()
