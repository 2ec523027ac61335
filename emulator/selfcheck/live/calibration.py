"""``emu calibrate``: what this machine's emulation can be trusted to do.

Five measurements (``docs/domain.md`` §4, Mininet-HiFi's lesson) at one MTU, written
to that MTU's calibration file (:func:`emulator.emulation.machine.calibration_file.calibration_path`),
which replay's fidelity check and the timing model read:

1. **datapath capacity** -- on a multi-hop fabric (:data:`CAPACITY_TOPOLOGY`,
   ``dmodk`` static routes) 16 concurrent iperf3 flows, leaf ``l`` to leaf
   ``l+1``, each crossing 3 switches and no two sharing a directed link, so
   every flow could reach its link's rate. The per-link rate goes up a ladder
   (links reshaped in place with ``tc class change``) until a flow falls below
   :data:`FLOW_OK_RATIO` of the rate or the CPU saturates; then the rate is
   bisected between the last rung that passed and the first that failed
   (:func:`next_bisection_rate`, to within :data:`BISECTION_RESOLUTION`, at
   most :data:`BISECTIONS` rungs more: a minimal ladder's 16 and 32 Mbit/s
   left a factor of two between them). The capacity is
   the highest aggregate *switch-hop* rate (Σ flow goodput × switches crossed,
   Mbit/s, the unit of :func:`emulator.emulation.session.fidelity.assess`) at which every flow
   still got ≥ 90 % of its rate (a failing rung is measured twice and the
   better run counts: other processes' load disturbs it). From it,
   :func:`recommended_link_mbps` picks a link rate that keeps a 16-host
   fabric with 3-switch paths inside it.
2. **one link** -- ``star:hosts=2``, static routes, one iperf3 TCP flow:
   goodput / configured rate, and against the model's
   :func:`emulator.model.topology.tcp_goodput_factor`.
3. **agents vs iperf3** -- on the same kind of link, a 2-rank ring allreduce
   replayed by the host agents (both directions at once; per-direction
   goodput = busbw) against ``iperf3 --bidir``'s per-direction goodput.
4. **agents' costs** (:func:`measure_agent_costs`): the CPU seconds the host
   agents spend per message and per byte, which ``dilation: auto``
   (:mod:`emulator.runs.dilation`) sizes the dilation by;
5. **intrinsic latency** per path length (:mod:`emulator.selfcheck.live.intrinsic_latency`): what
   this machine adds to every message by itself, which the agents subtract
   from the fabric profile's latency and the model takes as a floor.

``emu run`` and ``emu bench`` make a *minimal* calibration (capacity on a
short ladder, the agents' costs and latency; about a minute) when none exists for this
machine at their MTU (:func:`ensure_calibration`).

Pure parts (:func:`parse_iperf3`, :class:`CapacityPoint`,
:func:`capacity_from_points`, :func:`rate_ladder`, :func:`next_bisection_rate`,
:func:`capacity_pairs`, :func:`reshape_commands`) are unit-tested without root.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from emulator.base.errors import UserError
from emulator.base.naming import host_intf, switch_intf
from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.calibration_file import Calibration, save_calibration
from emulator.emulation.machine.system import cpu_times, load_average, machine_identity, run
from emulator.emulation.network.emulated_network import EmulatedNetwork
from emulator.emulation.network.ovs_sockets import vswitchd_pid
from emulator.emulation.network.tc_commands import class_show_command, parse_htb_rates, shaping_class_command
from emulator.emulation.session import fidelity
from emulator.emulation.session.replay import ReplaySession
from emulator.model import fabric, routing, topology
from emulator.model.collectives import generators
from emulator.model.fabric import FabricProfile
from emulator.model.topology import Topology
from emulator.runs.dilation import LOAD_FRACTION, CostSample, fit_agent_costs, readable_rate, traffic
from emulator.selfcheck.live import intrinsic_latency as latency_probe

#: 16 hosts, 4 leaves with 4 uplinks each: non-blocking, leaf-to-leaf paths cross 3 switches.
CAPACITY_TOPOLOGY = "leafspine:leaves=4,spines=4,hosts_per_leaf=4"
CAPACITY_ROUTING = "dmodk"
#: One shaped link between two hosts: the goodput and agents-vs-iperf3 measurements.
ONE_LINK_TOPOLOGY = "star:hosts=2"
#: A flow below this fraction of its link rate means the datapath no longer keeps up.
FLOW_OK_RATIO = 0.90
#: Per-link rates (Mbit/s) tried, in order.
LADDER_MBPS = (2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 125, 150, 200, 250, 300, 400, 500,
               700, 1000)
QUICK_LADDER_MBPS = (2, 4, 8, 16, 32, 64)
#: The automatic (minimal) calibration's ladder: rates below 16 Mbit/s carry a 16-host fabric easily, and the
#: default fabric profile's links (20 Mbit/s) need the capacity known between 32 and 64.
MINIMAL_LADDER_MBPS = (16, 32, 40, 48, 64, 96)
#: After the ladder, the capacity is bisected between the last rate that passed and the first that failed until
#: they are this close (a ratio), at most BISECTIONS rungs more (each measured like a ladder rung).
BISECTION_RESOLUTION = 0.10
BISECTIONS = {"minimal": 3, "quick": 0, "full": 2}
#: The agents' cost measurement: ring allreduces on one switch, at a rate the datapath carries easily, of a
#: small size (latency-bound: the messages' own cost) and a large one (the same messages, 256 times the bytes).
AGENT_COST_RANKS = 8
AGENT_COST_LINK_MBPS = 20.0
AGENT_COST_SIZES = (8 << 10, 2 << 20)
#: Agents against iperf3 with every flow at once: a ring of this many hosts on one switch (one flow per host,
#: each crossing one switch), the links together at the share of the calibrated capacity that `dilation: auto`
#: lets a run's busiest step offer (LOAD_FRACTION: full fidelity by the emulator's own rule), at most 1000
#: Mbit/s each; without a calibrated capacity, AGGREGATE_DEFAULT_MBPS.
AGGREGATE_HOSTS = 16
AGGREGATE_DEFAULT_MBPS = 50.0
#: How often the rate is halved looking for one at which iperf3 keeps up on every flow.
AGGREGATE_HALVINGS = 3
#: Fraction of the capacity a recommended default link rate may use.
HEADROOM = 0.8
IPERF_BASE_PORT = 5201


# ------------------------------------------------------------------ pure part
def parse_iperf3(text: str, where: str = "iperf3") -> dict[str, Any]:
    """An iperf3 ``-J`` client report -> Mbit/s received (and sent) per direction.

    Returns ``received_mbps``, ``sent_mbps``, ``retransmits``, ``seconds``,
    and with ``--bidir`` also ``reverse_received_mbps``/``reverse_sent_mbps``.
    Raises :class:`RuntimeError` naming ``where`` on an error report or bad JSON.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise RuntimeError(f"{where}: not an iperf3 JSON report: {text.strip()[:200]!r}") from None
    if data.get("error"):
        raise RuntimeError(f"{where}: {data['error']}")
    end = data.get("end") or {}
    if "sum_received" not in end:
        raise RuntimeError(f"{where}: iperf3 report has no end.sum_received")
    out = {
        "received_mbps": end["sum_received"]["bits_per_second"] / 1e6,
        "sent_mbps": end.get("sum_sent", {}).get("bits_per_second", 0.0) / 1e6,
        "retransmits": int(end.get("sum_sent", {}).get("retransmits", 0) or 0),
        "seconds": float(end["sum_received"].get("seconds", 0.0)),
    }
    if "sum_received_bidir_reverse" in end:
        out["reverse_received_mbps"] = end["sum_received_bidir_reverse"]["bits_per_second"] / 1e6
        out["reverse_sent_mbps"] = end.get("sum_sent_bidir_reverse", {}).get("bits_per_second", 0.0) / 1e6
    return out


@dataclass
class CapacityPoint:
    """One rung of the capacity ladder: every flow's goodput at one per-link rate."""

    link_mbps: float
    flow_mbps: list[float]
    switch_hops: list[int]
    cpu_idle: float
    vswitchd_cpu: float | None = None  # ovs-vswitchd CPU, in cores

    @property
    def ratios(self) -> list[float]:
        return [m / self.link_mbps for m in self.flow_mbps]

    @property
    def min_ratio(self) -> float:
        return min(self.ratios, default=0.0)

    @property
    def aggregate_mbps(self) -> float:
        return sum(self.flow_mbps)

    @property
    def switch_hop_mbps(self) -> float:
        """Σ goodput × switches crossed: the datapath work actually done, in Mbit/s."""
        return sum(m * h for m, h in zip(self.flow_mbps, self.switch_hops, strict=True))

    def ok(self, min_ratio: float = FLOW_OK_RATIO, idle_min: float = fidelity.CPU_SATURATED_IDLE) -> bool:
        return self.min_ratio >= min_ratio and self.cpu_idle >= idle_min

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "min_ratio": self.min_ratio, "aggregate_mbps": self.aggregate_mbps,
                "switch_hop_mbps": self.switch_hop_mbps, "ok": self.ok()}


def capacity_from_points(points: Sequence[CapacityPoint], min_ratio: float = FLOW_OK_RATIO,
                         idle_min: float = fidelity.CPU_SATURATED_IDLE) -> dict[str, Any]:
    """The capacity the measured ``points`` show.

    ``capacity_mbps`` is the highest switch-hop Mbit/s of a point where every
    flow got at least ``min_ratio`` of its rate and the CPU kept ``idle_min``
    idle (None when no point passed); ``at_link_mbps`` its per-link rate;
    ``limited_by`` says why the next rung failed (``flows``, ``cpu``, or
    ``ladder`` when every rung passed); ``peak_switch_hop_mbps`` is the most
    any point pushed through, passing or not.
    """
    good = [p for p in points if p.ok(min_ratio, idle_min)]
    best = max(good, key=lambda p: p.switch_hop_mbps, default=None)
    failed = [p for p in points if not p.ok(min_ratio, idle_min)
              and (best is None or p.link_mbps > best.link_mbps)]
    limited_by = "ladder"
    if failed:
        first = min(failed, key=lambda p: p.link_mbps)
        limited_by = "cpu" if first.cpu_idle < idle_min else "flows"
    return {
        "capacity_mbps": best.switch_hop_mbps if best else None,
        "at_link_mbps": best.link_mbps if best else None,
        "limited_by": limited_by,
        "peak_switch_hop_mbps": max((p.switch_hop_mbps for p in points), default=0.0),
    }


def rate_ladder(start_mbps: float, quick: bool = False, max_mbps: float = 1000.0,
                minimal: bool = False) -> list[float]:
    """The per-link rates to try, from ``start_mbps`` up (Mininet shapes at most 1000 Mbit/s)."""
    ladder = MINIMAL_LADDER_MBPS if minimal else QUICK_LADDER_MBPS if quick else LADDER_MBPS
    return [float(r) for r in ladder if start_mbps <= r <= max_mbps]


def next_bisection_rate(points: Sequence[CapacityPoint], resolution: float = BISECTION_RESOLUTION) -> float | None:
    """The rate between the highest that passed and the lowest above it that failed (their geometric middle,
    to 0.1 Mbit/s); None when either is missing or they are within ``resolution`` of each other."""
    passed = [p.link_mbps for p in points if p.ok()]
    if not passed:
        return None
    low = max(passed)
    above = [p.link_mbps for p in points if not p.ok() and p.link_mbps > low]
    if not above or min(above) <= low * (1 + resolution):
        return None
    middle = round(math.sqrt(low * min(above)), 1)
    return middle if low < middle < min(above) else None


def should_continue(points: Sequence[CapacityPoint]) -> bool:
    """Keep climbing while the last rung passed (stop at the first failure)."""
    return not points or points[-1].ok()


def recommended_link_mbps(capacity_mbps: float | None, hosts: int = 16, hops: float = 3.0,
                          headroom: float = HEADROOM) -> float:
    """A link rate keeping ``hosts`` flows of ``hops`` switches each inside ``headroom`` x capacity.

    Rounded down to a rate of :data:`LADDER_MBPS` (its lowest rung when even that is too much).
    """
    if not capacity_mbps:
        return float(LADDER_MBPS[0])
    limit = capacity_mbps * headroom / (hosts * hops)
    fitting = [r for r in LADDER_MBPS if r <= limit]
    return float(max(fitting)) if fitting else float(LADDER_MBPS[0])


def capacity_pairs(topo: Topology) -> list[tuple[str, str]]:
    """Leaf-spine flows for the capacity test: host ``m`` of leaf ``l`` -> host ``m`` of leaf ``l+1``.

    Under ``dmodk`` the destinations of one leaf's flows differ mod the spine
    count (when hosts per leaf = spines), so no two flows share a directed link.
    """
    leaves = topo.host_switches()
    out = []
    for i, leaf in enumerate(leaves):
        nxt = leaves[(i + 1) % len(leaves)]
        for src, dst in zip(topo.hosts_of(leaf.name), topo.hosts_of(nxt.name), strict=True):
            out.append((src.name, dst.name))
    return out


def flow_paths(topo: Topology, policy: str, pairs: Sequence[tuple[str, str]], seed: int = 0) -> list[list[str]]:
    """The routed node path of each iperf3 flow (not an agent 5-tuple: destination-based entries)."""
    return [routing.route(topo, policy, routing.Flow(s, d, dport=IPERF_BASE_PORT + i), seed=seed)
            for i, (s, d) in enumerate(pairs)]


def reshape_commands(topo: Topology, rate_mbps: float, host_pids: dict[str, int]) -> list[list[str]]:
    """``tc`` commands setting every link's shaping class
    (:func:`emulator.emulation.network.tc_commands.shaping_class_command`) to ``rate_mbps``.

    Host ends run inside the host's namespace (``mnexec -a PID``).
    """
    cmds = []
    for lk in topo.links:
        if lk.kind == "host":
            cmds.append(["mnexec", "-a", str(host_pids[lk.a]), *shaping_class_command(host_intf(lk.a), rate_mbps)])
            cmds.append(shaping_class_command(switch_intf(lk.b, lk.b_port), rate_mbps))
        else:
            cmds.append(shaping_class_command(switch_intf(lk.a, lk.a_port), rate_mbps))
            cmds.append(shaping_class_command(switch_intf(lk.b, lk.b_port), rate_mbps))
    return cmds


def machine_info(datapath: str, mtu: int) -> dict[str, Any]:
    """The machine a calibration describes: :func:`emulator.emulation.machine.system.machine_identity` and the
    conditions."""
    return {**machine_identity(), "datapath": datapath, "mtu": mtu,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "loadavg_before": load_average()}


# ------------------------------------------------------------- the live part
def vswitchd_cpu_seconds() -> float | None:
    """User+system CPU seconds of ovs-vswitchd so far, or None when it cannot be read."""
    pid = vswitchd_pid()
    if pid is None:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


@dataclass
class FlowRun:
    """What :func:`run_iperf_flows` measured."""

    reports: list[dict[str, Any]]
    cpu_idle: float
    vswitchd_cpu: float | None
    seconds: float
    raw: list[str] = field(default_factory=list, repr=False)

    @property
    def flows_mbps(self) -> list[float]:
        """Each flow's received Mbit/s, in the order of the pairs."""
        return [r["received_mbps"] for r in self.reports]


def run_iperf_flows(en: Any, topo: Topology, pairs: Sequence[tuple[str, str]], seconds: float, *,
                    omit: int = 1, bidir: bool = False, base_port: int = IPERF_BASE_PORT) -> FlowRun:
    """One iperf3 TCP flow per ``(src, dst)`` pair, all at once, for ``seconds`` (+ ``omit`` unmeasured).

    CPU idle and ovs-vswitchd CPU are sampled over the measured part.
    Raises :class:`RuntimeError` when a client fails.
    """
    servers, clients = [], []
    try:
        for i, (_src, dst) in enumerate(pairs):
            proc = en.host(dst).popen(["iperf3", "-s", "-1", "-p", str(base_port + i)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append(proc)
            en.state.record_process("iperf3", proc.pid, role_detail="server")
        time.sleep(0.5 + 0.02 * len(pairs))
        for i, (src, dst) in enumerate(pairs):
            cmd = ["iperf3", "-c", topo.host(dst).ip, "-p", str(base_port + i), "-t", f"{seconds:g}",
                   "-O", str(omit), "-J"]
            if bidir:
                cmd.append("--bidir")
            proc = en.host(src).popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            clients.append(proc)
            en.state.record_process("iperf3", proc.pid, role_detail="client")
        time.sleep(omit + 0.3)
        idle0, total0 = cpu_times()
        vs0 = vswitchd_cpu_seconds()
        t0 = time.monotonic()
        time.sleep(max(seconds - 0.6, 0.2))
        idle1, total1 = cpu_times()
        vs1 = vswitchd_cpu_seconds()
        span = time.monotonic() - t0
        outputs = []
        for (src, dst), proc in zip(pairs, clients, strict=True):
            out, err = proc.communicate(timeout=seconds + omit + 30)
            outputs.append(out.decode(errors="replace") if isinstance(out, bytes) else out)
            if proc.returncode != 0 and not outputs[-1].strip():
                raise RuntimeError(f"iperf3 {src} -> {dst} failed: {err!r:.200}")
        reports = [parse_iperf3(text, f"iperf3 {s} -> {d}") for text, (s, d) in zip(outputs, pairs, strict=True)]
    finally:
        for proc in [*clients, *servers]:
            if proc.poll() is None:
                proc.kill()
                try:
                    proc.wait(2)
                except subprocess.TimeoutExpired:
                    pass
    d_total = total1 - total0
    idle = (idle1 - idle0) / d_total if d_total > 0 else 1.0
    vs = (vs1 - vs0) / span if vs0 is not None and vs1 is not None and span > 0 else None
    return FlowRun(reports, idle, vs, seconds, outputs)


def reshape(en: Any, topo: Topology, rate_mbps: float) -> None:
    """Set every link of the live network to ``rate_mbps`` (see :func:`reshape_commands`)."""
    pids = {h.name: en.host(h.name).pid for h in topo.hosts}
    for cmd in reshape_commands(topo, rate_mbps, pids):
        res = run(cmd)
        if res.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {res.stderr.strip()[:200]}")
    h = topo.hosts[0].name
    got = parse_htb_rates(run(class_show_command(host_intf(h), pids[h])).stdout)
    if not got or abs(got[0] - rate_mbps) > 0.01 * rate_mbps:
        raise RuntimeError(f"reshape to {rate_mbps:g} Mbit/s: {host_intf(h)} reads back {got}")


def measure_capacity(quick: bool = False, start_mbps: float = 2.0, datapath: str = "auto",
                     mtu: int = topology.DEFAULT_MTU, echo: Callable[[str], None] = print,
                     minimal: bool = False) -> dict[str, Any]:
    """Climb the rate ladder on :data:`CAPACITY_TOPOLOGY` (flows of 5 s, 3 s quick, 2 s minimal) to the first
    rate that fails, then bisect between it and the last that passed (:func:`next_bisection_rate`);
    returns points and :func:`capacity_from_points`."""
    kind = "minimal" if minimal else "quick" if quick else "full"
    ladder = rate_ladder(start_mbps, quick, minimal=minimal)
    topo = topology.build(CAPACITY_TOPOLOGY, ladder[0])
    pairs = capacity_pairs(topo)
    hops = [len(p) - 2 for p in flow_paths(topo, CAPACITY_ROUTING, pairs)]
    seconds = 2.0 if minimal else 3.0 if quick else 5.0
    points: list[CapacityPoint] = []
    retried: list[dict[str, Any]] = []
    with EmulatedNetwork(topo, routing=CAPACITY_ROUTING, datapath=datapath, mtu=mtu, label="calibrate") as en:
        dp = en.datapath

        def rung(rate: float) -> None:
            point = _measure_rung(en, topo, pairs, hops, rate, seconds, retried, echo)
            points.append(point)
            echo(f"  capacity: {len(pairs)} flows at {rate:g} Mbit/s: min {point.min_ratio:.2f} of rate, "
                 f"{point.switch_hop_mbps:.0f} switch-hop Mbit/s, CPU idle {point.cpu_idle:.0%}"
                 + (f", ovs-vswitchd {point.vswitchd_cpu:.2f} cores" if point.vswitchd_cpu is not None else "")
                 + ("" if point.ok() else "  <- below 90% or CPU saturated"))

        for rate in ladder:
            if not should_continue(points):
                break
            rung(rate)
        for _ in range(BISECTIONS[kind]):
            middle = next_bisection_rate(points)
            if middle is None:
                break
            rung(middle)
    result = capacity_from_points(points)
    return {"topology": CAPACITY_TOPOLOGY, "routing": CAPACITY_ROUTING, "flows": len(pairs), "switch_hops": hops,
            "seconds": seconds, "datapath": dp, "points": [p.to_json() for p in points], "discarded": retried,
            **result}


def _measure_rung(en: Any, topo: Topology, pairs: Sequence[tuple[str, str]], hops: list[int], rate: float,
                  seconds: float, retried: list[dict[str, Any]], echo: Callable[[str], None]) -> CapacityPoint:
    """Every link at ``rate``, the flows for ``seconds``; a failing rung is measured twice (others' load
    disturbs it) and the better one counts, the other going to ``retried``."""
    reshape(en, topo, rate)
    point = None
    for attempt in range(2):
        fr = run_iperf_flows(en, topo, pairs, seconds)
        p = CapacityPoint(rate, fr.flows_mbps, hops, fr.cpu_idle, fr.vswitchd_cpu)
        if point is not None:
            retried.append(point.to_json() if p.min_ratio >= point.min_ratio else p.to_json())
        point = p if point is None or p.min_ratio >= point.min_ratio else point
        if point.ok() or attempt == 1:
            break
        echo(f"  capacity: {rate:g} Mbit/s: min {point.min_ratio:.2f} of rate, CPU idle "
             f"{point.cpu_idle:.0%}; measuring again")
    assert point is not None
    return point


def measure_one_link(bw_mbps: float, seconds: float = 5.0, datapath: str = "auto", mtu: int = topology.DEFAULT_MTU,
                     extra_rates: Sequence[float] = ()) -> dict[str, Any]:
    """iperf3 over one shaped link (``star:hosts=2``, static routes): goodput / rate at ``bw_mbps``.

    ``extra_rates`` are measured too on the same network (links reshaped) and
    returned under ``sweep``.
    """
    topo = topology.build(ONE_LINK_TOPOLOGY, bw_mbps)
    factor = topology.tcp_goodput_factor(mtu)
    sweep: list[dict[str, Any]] = []
    with EmulatedNetwork(topo, routing="shortest", datapath=datapath, mtu=mtu, label="calibrate") as en:
        for rate in [bw_mbps, *extra_rates]:
            if rate != bw_mbps or sweep:
                reshape(en, topo, rate)
            rep = run_iperf_flows(en, topo, [("h1", "h2")], seconds).reports[0]
            sweep.append({"link_mbps": rate, "goodput_mbps": rep["received_mbps"],
                          "ratio": rep["received_mbps"] / rate,
                          "ratio_to_model": rep["received_mbps"] / (rate * factor),
                          "retransmits": rep["retransmits"]})
    first = sweep[0]
    return {"topology": topo.spec, "link_mbps": bw_mbps, "seconds": seconds, "goodput_mbps": first["goodput_mbps"],
            "ratio": first["ratio"], "model_goodput_factor": factor, "ratio_to_model": first["ratio_to_model"],
            "retransmits": first["retransmits"], "sweep": sweep[1:]}


def agent_size_bytes(bw_mbps: float, seconds: float) -> int:
    """A ring-allreduce size (power-of-two MiB) that keeps a 2-rank ring busy about ``seconds``."""
    target = bw_mbps * 1e6 / 8 * seconds
    mib = 1
    while mib * 2 * (1 << 20) <= target:
        mib *= 2
    return mib << 20


def measure_agents_vs_iperf(bw_mbps: float, seconds: float = 5.0, repeat: int = 3, datapath: str = "auto",
                            mtu: int = topology.DEFAULT_MTU, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """A 2-rank ring allreduce by the agents vs ``iperf3 --bidir`` on the same ``star:hosts=2`` network.

    Per direction, the agents' goodput is the allreduce's busbw (each rank sends
    ``size`` bytes in ``time_s``); iperf3's is the mean of its two directions.
    """
    topo = topology.build(ONE_LINK_TOPOLOGY, bw_mbps)
    size = agent_size_bytes(bw_mbps, seconds)
    schedule = generators.generate("ring", topo, size)
    with tempfile.TemporaryDirectory(prefix="ef-calibrate-") as tmp:
        with ReplaySession(topo, "shortest", datapath=datapath, mtu=mtu, work_dir=os.path.join(tmp, "session"),
                           echo=lambda s: None) as session:
            results = session.run(schedule, os.path.join(tmp, "agents"), repeat=repeat, warmup=1)
            ip = run_iperf_flows(session.en, topo, [("h1", "h2")], seconds, bidir=True).reports[0]
    agent = statistics.median(r.busbw_mbps for r in results.repetitions)
    iperf = (ip["received_mbps"] + ip["reverse_received_mbps"]) / 2
    return {"topology": topo.spec, "link_mbps": bw_mbps, "size": size, "repeat": repeat,
            "agent_mbps": agent, "agent_reps_mbps": [r.busbw_mbps for r in results.repetitions],
            "iperf3_mbps": iperf, "iperf3": ip, "ratio": agent / iperf if iperf else None,
            "agent_over_link": agent / bw_mbps, "iperf3_over_link": iperf / bw_mbps}


def aggregate_link_mbps(capacity_mbps: float | None, flows: int = AGGREGATE_HOSTS) -> float:
    """Each link's first rate when ``flows`` one-switch flows share :data:`LOAD_FRACTION` of the datapath's
    capacity (two significant digits, rounded down; at most 1000 Mbit/s)."""
    if capacity_mbps is None:
        return AGGREGATE_DEFAULT_MBPS
    return readable_rate(min(capacity_mbps * LOAD_FRACTION / flows, 1000.0))


def iperf_keeps_up(flows: FlowRun, link_mbps: float) -> bool:
    """Whether every iperf3 flow got :data:`FLOW_OK_RATIO` of its link (the calibration's test of a rung)."""
    return min(flows.flows_mbps) >= FLOW_OK_RATIO * link_mbps


def faithful_aggregate_rate(topo: Topology, pairs: Sequence[tuple[str, str]], start_mbps: float, seconds: float,
                            datapath: str, mtu: int) -> tuple[float, list[dict[str, Any]]]:
    """The first rate, from ``start_mbps`` halving at most :data:`AGGREGATE_HALVINGS` times, at which iperf3
    on every one of ``pairs`` at once keeps up (:func:`iperf_keeps_up`); and what each try measured."""
    rate, tried = start_mbps, []
    with EmulatedNetwork(topo, routing="shortest", datapath=datapath, mtu=mtu, label="calibrate") as en:
        for attempt in range(AGGREGATE_HALVINGS + 1):
            if attempt:
                rate = readable_rate(rate / 2)
                reshape(en, topo, rate)
            flows = run_iperf_flows(en, topo, pairs, seconds)
            tried.append({"link_mbps": rate, "iperf3_mbps": sum(flows.flows_mbps),
                          "worst_flow_mbps": min(flows.flows_mbps),
                          "cpu_idle": flows.cpu_idle})
            if iperf_keeps_up(flows, rate):
                break
    return rate, tried


def measure_agents_aggregate(capacity_mbps: float | None, seconds: float = 4.0, repeat: int = 2,
                             datapath: str = "auto", mtu: int = topology.DEFAULT_MTU) -> dict[str, Any]:
    """The agents' aggregate goodput at full fidelity with every flow at once, against iperf3's on the same flows.

    The flows are a ring's hops on one switch (:data:`AGGREGATE_HOSTS` hosts,
    each sending to the next). Their rate is the first, from
    :func:`aggregate_link_mbps` down, at which iperf3 keeps up on all of them
    (:func:`faithful_aggregate_rate`): what this machine carries faithfully.
    At that rate a ring allreduce by the agents, sized to last about
    ``seconds``, then iperf3 again on the same network. The agents' aggregate
    is their busbw (each flow's goodput) times the flows; iperf3's the sum of
    its flows.
    """
    p = AGGREGATE_HOSTS
    hops = [(f"h{i + 1}", f"h{(i + 1) % p + 1}") for i in range(p)]
    first = aggregate_link_mbps(capacity_mbps)
    link, tried = faithful_aggregate_rate(topology.build(f"star:hosts={p}", first), hops, first, seconds,
                                          datapath, mtu)
    topo = topology.build(f"star:hosts={p}", link)
    size = 1 << 20
    while size * 2 * (p - 1) / p < link * 1e6 / 8 * seconds:  # each rank sends 2(p-1)/p of the size
        size *= 2
    schedule = generators.generate("ring", topo, size)
    with tempfile.TemporaryDirectory(prefix="ef-calibrate-") as tmp:
        with ReplaySession(topo, "shortest", datapath=datapath, mtu=mtu, work_dir=os.path.join(tmp, "session"),
                           echo=lambda s: None) as session:
            results = session.run(schedule, os.path.join(tmp, "agents"), repeat=repeat, warmup=1)
            flows = run_iperf_flows(session.en, topo, hops, seconds)
    agent = statistics.median(r.busbw_mbps for r in results.repetitions) * p
    iperf = sum(flows.flows_mbps)
    return {"topology": topo.spec, "link_mbps": link, "flows": p, "size": size, "repeat": repeat,
            "capacity_mbps": capacity_mbps, "rates_tried": tried, "agent_mbps": agent,
            "agent_reps_mbps": [r.busbw_mbps * p for r in results.repetitions],
            "agent_measured_over_predicted": [r.measured_over_predicted for r in results.repetitions],
            "agent_flags": sorted({f for r in results.repetitions for f in (r.fidelity.flags if r.fidelity else ())}),
            "iperf3_mbps": iperf, "iperf3_flows_mbps": flows.flows_mbps,
            "iperf3_cpu_idle": flows.cpu_idle, "ratio": agent / iperf if iperf else None,
            "agent_over_offered": agent / (link * p), "iperf3_over_offered": iperf / (link * p)}


def measure_agent_costs(datapath: str = "auto", mtu: int = topology.DEFAULT_MTU, repeat: int = 2,
                        echo: Callable[[str], None] = print) -> dict[str, Any]:
    """The agents' CPU per message and per byte (:func:`emulator.runs.dilation.fit_agent_costs`): ring allreduces
    by :data:`AGENT_COST_RANKS` agents on one switch, one with small messages and one with large ones (the
    same messages), each repetition's summed agent CPU seconds against its messages and bytes."""
    topo = topology.build(f"star:hosts={AGENT_COST_RANKS}", AGENT_COST_LINK_MBPS)
    samples: list[CostSample] = []
    with tempfile.TemporaryDirectory(prefix="ef-calibrate-") as tmp:
        with ReplaySession(topo, "shortest", datapath=datapath, mtu=mtu, work_dir=os.path.join(tmp, "session"),
                           echo=lambda s: None) as session:
            for size in AGENT_COST_SIZES:
                schedule = generators.generate("ring", topo, size)
                messages, nbytes = traffic(schedule)
                results = session.run(schedule, os.path.join(tmp, f"agents-{size}"), repeat=repeat, warmup=1)
                samples += [CostSample(messages, nbytes, r.agents_cpu_s) for r in results.repetitions
                            if r.agents_cpu_s is not None]
    costs = fit_agent_costs(samples, source=f"emu calibrate of {datetime.date.today().isoformat()}")
    echo(f"  agents' CPU: {costs.per_message_s * 1e3:.3f} ms per message, {costs.per_byte_s * 1e9:.3f} ns per byte "
         f"({len(samples)} repetitions of {AGENT_COST_RANKS}-rank rings)")
    return {"topology": topo.spec, "link_mbps": AGENT_COST_LINK_MBPS, "sizes": list(AGENT_COST_SIZES),
            "samples": [asdict(s) for s in samples], **costs.to_json()}


def calibrate(bw_mbps: float | None = None, quick: bool = False, datapath: str = "auto", mtu: int = topology.DEFAULT_MTU,
              echo: Callable[[str], None] = print, write: bool = True, latency_mbps: float | None = None,
              minimal: bool = False) -> Calibration:
    """Every measurement at ``mtu``; writes the calibration file of that MTU atomically (unless ``write`` is false).

    ``latency_mbps`` is the link rate of the latency probes (default: the
    recommended rate); ``minimal`` (the automatic calibration of ``emu run``
    and ``emu bench``, about a minute) measures only the capacity, on a short
    ladder, and the latency.
    """
    if bw_mbps is not None and not 0 < bw_mbps <= 1000:
        raise UserError(f"calibrate: field 'bw': expected Mbit/s in (0, 1000], got {bw_mbps!r}")
    t0 = time.monotonic()
    info = machine_info(datapath, mtu)
    kind = "minimal" if minimal else ("quick" if quick else "full")
    echo(f"calibrating at MTU {mtu} ({kind}; {info['nproc']} CPUs, load {info['loadavg_before']})")
    capacity = measure_capacity(quick=quick, datapath=datapath, mtu=mtu, echo=echo, minimal=minimal)
    info["datapath"] = capacity["datapath"]
    recommended = recommended_link_mbps(capacity["capacity_mbps"])
    bw = bw_mbps or recommended
    measurements: dict[str, Any] = {"capacity": capacity}
    data: dict[str, Any] = {
        "version": calibration_file.CALIBRATION_VERSION, "quick": quick or minimal, "minimal": minimal,
        "datapath_capacity_mbps": capacity["capacity_mbps"],
        "datapath_capacity_unit": "switch-hop Mbit/s: sum of bytes x switches traversed x 8 / seconds / 1e6",
        "recommended_link_mbps": recommended, "measurements": measurements,
    }
    if not minimal:
        seconds = 3.0 if quick else 5.0
        one = measure_one_link(bw, seconds, datapath, mtu, extra_rates=() if quick else (10.0, 50.0, 100.0, 200.0))
        echo(f"  one link at {bw:g} Mbit/s: {one['goodput_mbps']:.2f} Mbit/s = {one['ratio']:.3f} of the rate, "
             f"{one['ratio_to_model']:.3f} of the model")
        agents = measure_agents_vs_iperf(bw, seconds, repeat=2 if quick else 3, datapath=datapath, mtu=mtu, echo=echo)
        echo(f"  agents vs iperf3 --bidir at {bw:g} Mbit/s: {agents['agent_mbps']:.2f} / "
             f"{agents['iperf3_mbps']:.2f} Mbit/s per direction = {agents['ratio']:.3f}")
        measurements.update(one_link=one, agents_vs_iperf3=agents)
        data.update(one_link_ratio=one["ratio"], agent_over_iperf3=agents["ratio"])
    agent_costs = measure_agent_costs(datapath, mtu, repeat=2 if quick or minimal else 3, echo=echo)
    measurements["agent_costs"] = agent_costs
    data["agent_costs"] = {k: agent_costs[k] for k in ("per_message_s", "per_byte_s", "source")}
    data["latency"] = latency_probe.measure(latency_mbps or bw, mtu, datapath, echo=echo)
    data["machine"] = {**info, "loadavg_after": load_average()}
    data["duration_s"] = time.monotonic() - t0
    calibration = Calibration.from_json(data)  # the document as calibration_file reads it, or FieldError
    if write:
        save_calibration(calibration, mtu)
    return calibration


def ensure_calibration(profile: FabricProfile, datapath: str = "auto",
                       echo: Callable[[str], None] = print) -> Calibration:
    """This machine's calibration at the profile's MTU; when there is none, make a minimal one (about a minute)."""
    found = calibration_file.load_calibration(profile.emulated_mtu)
    if found is not None:
        return found
    echo(f"no calibration of this machine at MTU {profile.emulated_mtu}: measuring one now (about a minute; "
         f"`emu calibrate` makes a full one), written to {calibration_file.calibration_path(profile.emulated_mtu)}")
    return calibrate(minimal=True, datapath=datapath, mtu=profile.emulated_mtu,
                     latency_mbps=profile.emulated_link_mbps, echo=lambda line: None)


def summary_table(data: dict[str, Any]) -> str:
    """The short table ``emu calibrate`` prints."""
    m = data["measurements"]
    cap = m["capacity"]
    mi = data["machine"]
    cap_text = f"{cap['capacity_mbps']:.0f}" if cap["capacity_mbps"] else "none (even the first rung failed)"
    real = fabric.default()  # the fabric the recommended rate is said to stand for
    lines = [
        f"machine: {mi['nproc']} CPUs, {mi['datapath']} datapath, MTU {mi['mtu']}, OVS {mi['ovs_version']}, "
        f"kernel {mi.get('kernel')}, load {mi['loadavg_before']}",
        f"{'measurement':<34} {'value':>12}  detail",
        f"{'datapath capacity (switch-hop Mb/s)':<34} {cap_text:>12}  {cap['flows']} flows x "
        f"{max(cap['switch_hops'])} switches on {cap['topology']}, "
        + (f"at {cap['at_link_mbps']:g} Mbit/s per link; " if cap["at_link_mbps"] else "")
        + f"limited by {cap['limited_by']}",
        f"{'recommended link rate (Mbit/s)':<34} {data['recommended_link_mbps']:>12g}  16 hosts x 3 switches "
        f"within {HEADROOM:.0%} of capacity; time dilation to {real.link_gbps:g} Gbit/s links: "
        f"x{real.dilation_for(data['recommended_link_mbps']):g}",
    ]
    costs = m.get("agent_costs")
    if costs:
        lines.append(f"{'agents CPU per message (ms)':<34} {costs['per_message_s'] * 1e3:>12.3f}  and "
                     f"{costs['per_byte_s'] * 1e9:.2f} ns per byte, {AGENT_COST_RANKS}-rank rings on "
                     f"{costs['topology']} (dilation: auto sizes the dilation by them)")
    one, ag = m.get("one_link"), m.get("agents_vs_iperf3")
    if one:
        lines.append(f"{'one link goodput / rate':<34} {one['ratio']:>12.3f}  {one['goodput_mbps']:.2f} of "
                     f"{one['link_mbps']:g} Mbit/s; model factor {one['model_goodput_factor']:.4f} -> "
                     f"{one['ratio_to_model']:.3f} of the model")
        for s in one.get("sweep", []):
            lines.append(f"{'  one link at ' + format(s['link_mbps'], 'g') + ' Mbit/s':<34} {s['ratio']:>12.3f}  "
                         f"{s['goodput_mbps']:.2f} Mbit/s")
    if ag:
        lines.append(f"{'agents / iperf3 (per direction)':<34} {ag['ratio']:>12.3f}  {ag['agent_mbps']:.2f} vs "
                     f"{ag['iperf3_mbps']:.2f} Mbit/s, 2-rank ring of {ag['size'] >> 20} MiB vs iperf3 --bidir")
    lat = data.get("latency")
    if lat:
        lines.append(f"intrinsic latency per message (ms) at {lat['link_mbps']:g} Mbit/s, MTU {lat['mtu']}, "
                     f"{lat['bytes']}-byte messages:")
        lines.append(f"{'  switches':<12} {'ping one-way':>13} {'sendall->recv':>14} {'agents':>8} "
                     f"{'rendezvous':>11} {'ack':>7}")
        for sw, v in sorted(lat["per_switches"].items(), key=lambda kv: int(kv[0])):
            lines.append(f"  {sw:<10} {v['oneway_s'] * 1e3:>13.3f} {v['data_s'] * 1e3:>14.3f} "
                         f"{v['agent_overhead_s'] * 1e3:>8.3f} {v['rendezvous_s'] * 1e3:>11.3f} "
                         f"{v['ack_s'] * 1e3:>7.3f}")
        lines.append("  (other path lengths: straight lines between these; the agents subtract sendall->recv from "
                     "the profile's message latency)")
    return "\n".join(lines)
