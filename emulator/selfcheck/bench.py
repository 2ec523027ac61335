"""``emu bench`` (``make bench``): the emulator's fidelity and performance ratios, measured in one run.

A benchmark, not a test: it prints every ratio next to its target with PASS or
MISS, writes ``results/bench-<timestamp>.json`` (atomically, after every
section, so a failure keeps what was measured) and returns 0 even on a miss.
Everything runs on one fabric profile (``--fabric``, default
:data:`emulator.model.fabric.DEFAULT_PRESET`): its emulated link rate, MTU and
latencies, with this machine's calibration at that MTU, made first (about a
minute) when there is none.

Sections, in order:

1. **agents / iperf3** on one link: :func:`emulator.selfcheck.calibration.measure_agents_vs_iperf`
   (target >= :data:`TARGET_AGENT`).
2. **replays**: every algorithm of :data:`DEFAULT_CASES` on its fabric, one
   :class:`~emulator.emulation.replay.ReplaySession` per (topology, routing, seed), at
   every size of :data:`DEFAULT_SIZES` (latency-bound to bandwidth-bound):
   measured / predicted time of each row (target: at least
   :data:`TARGET_WITHIN_SHARE` of the rows within +-:data:`TARGET_PREDICTION`,
   none beyond +-:data:`TARGET_WORST`). Each row carries replay's fidelity
   flags. From the same rows: busbw / link rate of ``hdrm`` on BiGraph 4/4/2
   at the largest size (target >= :data:`TARGET_HDRM`), and the
   **crossovers** of :data:`CROSSOVERS` (the size below which an algorithm
   beats ring), measured and predicted (target: within a factor
   :data:`TARGET_CROSSOVER_FACTOR`; the predicted one from the model alone
   over sizes 16 KiB-256 MiB, :func:`crossover`).
3. **Open MPI beside the agents** (:func:`run_mpi_pairs`): on
   :data:`MPI_TOPOLOGY` with the hdrm placement and bigraph routing, at
   :data:`MPI_SIZE`, each pair of :data:`MPI_PAIRS` -- Open MPI's allreduce
   algorithm run by ``emu mpirun`` with the bundled ``emu-allreduce-bench``,
   and our agents' replay of the matching schedule -- on the same link rate,
   both without the profile's latencies (Open MPI's messages cannot get
   them): MPI busbw / agents' busbw (target >= :data:`TARGET_MPI`), with both
   runs' fidelity.
4. **bring-up** of 32 hosts (:data:`BRINGUP_TOPOLOGY`): :class:`EmulatedNetwork`
   start and stop against plain Mininet (:func:`plain_mininet_bringup`: the
   same hosts, switches and ``TCLink`` links, ``OVSSwitch`` on the same
   datapath, no controller, none of our host set-up), alternated.

``--bw`` sets the emulated link rate instead of the profile's (the dilation
follows). Emulated figures are reported with what they stand for on the real
fabric.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from emulator.base.errors import UserError
from emulator.base.files import write_json_atomic
from emulator.base.naming import bridge_name, host_intf, switch_intf
from emulator.emulation import fidelity
from emulator.emulation.calibration_file import Calibration
from emulator.emulation.cleanup import remove_our_bridges
from emulator.emulation.mpi_run import prepare as prepare_mpirun
from emulator.emulation.mpi_run import run as run_mpirun
from emulator.emulation.network import EmulatedNetwork
from emulator.emulation.network_lock import NetworkLock
from emulator.emulation.replay import ReplayFailed, ReplaySession
from emulator.emulation.runstate import RunState, kill_recorded, proc_netns
from emulator.emulation.system import choose_datapath, load_average, run
from emulator.model import fabric, topology
from emulator.model.latency import LatencyModel
from emulator.model.schedule import generators
from emulator.model.schedule.check import check, predict
from emulator.model.schedule.format import format_size
from emulator.runs import admission
from emulator.runs.mpi_plan import MpiRunConfig
from emulator.selfcheck.calibration import ensure_calibration, machine_info, measure_agents_vs_iperf

TARGET_AGENT = 0.97
TARGET_HDRM = 0.90
TARGET_PREDICTION = 0.10
TARGET_WITHIN_SHARE = 0.90
TARGET_WORST = 0.25
TARGET_CROSSOVER_FACTOR = 2.0
BRINGUP_TOPOLOGY = "bigraph:upper=4,lower=4,hosts_per_switch=4"
TARGET_MPI = 0.90
MPI_TOPOLOGY = "bigraph:upper=2,lower=2,hosts_per_switch=2"
MPI_PLACEMENT = "hdrm"
MPI_SIZE = 4 << 20
#: (Open MPI's allreduce algorithm, our agents' algorithm doing the same): rabenseifner is halving-doubling.
MPI_PAIRS = (("ring", "ring"), ("rabenseifner", "hd"))
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Size:
    """A size per rank and its repetitions (a bandwidth-bound size takes one, without warm-up: it is long)."""

    bytes: int
    warmup: int
    repeat: int


@dataclass(frozen=True)
class Case:
    """One ReplaySession: a topology, its routing and seed, and the algorithms replayed on it.

    ``extra`` sizes are replayed for ``extra_algorithms`` only (a crossover needs them).
    """

    topology: str
    routing: str
    seed: int
    algorithms: tuple[str, ...]
    extra: tuple[Size, ...] = ()
    extra_algorithms: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        seed = f" seed {self.seed}" if self.routing == "ecmp" else ""
        return f"{self.topology} {self.routing}{seed}"


LEAFSPINE = "leafspine:leaves=4,spines=4,hosts_per_leaf=4"
BIGRAPH = "bigraph:upper=4,lower=4,hosts_per_switch=2"
DEFAULT_CASES = (
    Case(BIGRAPH, "bigraph", 0, ("hdrm", "hd", "ring")),
    # hd's crossover with ring lies between 1 and 16 MiB: 4 MiB places it within a factor of 2
    Case(LEAFSPINE, "ecmp", 1, ("ring", "hd", "dbtree", "hier"), extra=(Size(4 << 20, 1, 1),),
         extra_algorithms=("ring", "hd")),
    Case(LEAFSPINE, "dmodk", 0, ("ring", "hd", "dbtree")),
    Case("fattree:k=4", "ecmp", 1, ("ring", "hd", "dbtree", "hier")),
    Case("star:hosts=16", "shortest", 0, ("ring", "hd", "dbtree")),
)
DEFAULT_SIZES = (Size(64 << 10, 1, 2), Size(1 << 20, 1, 2), Size(16 << 20, 0, 1))


@dataclass(frozen=True)
class Crossover:
    """The size below which ``algorithm`` beats ``ring`` on one fabric (both rows of one case)."""

    label: str
    case: Case
    algorithm: str


CROSSOVERS = (
    Crossover("hdrm / ring on BiGraph 4/4/2", DEFAULT_CASES[0], "hdrm"),
    Crossover("hd / ring on leaf-spine, ECMP seed 1", DEFAULT_CASES[1], "hd"),
)
#: The sizes at which the model looks for a crossover.
MODEL_SWEEP = tuple(1 << k for k in range(14, 29))


# ------------------------------------------------------------------ pure part
def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def within(ratio: float | None, tolerance: float = TARGET_PREDICTION) -> bool | None:
    return None if ratio is None else abs(ratio - 1.0) <= tolerance


def bench_profile(fabric_spec: str | None, bw: float | None) -> fabric.FabricProfile:
    """The fabric profile of the bench; ``--bw`` changes its dilation so that links emulate at ``bw``."""
    profile = fabric.parse(fabric_spec, where="bench: fabric")
    if bw is None:
        return profile
    if isinstance(bw, bool) or not fabric.MIN_LINK_MBPS <= bw <= fabric.MAX_LINK_MBPS:
        raise UserError(f"bench: field 'bw': expected Mbit/s from {fabric.MIN_LINK_MBPS:g} to "
                        f"{fabric.MAX_LINK_MBPS:g}, got {bw!r}")
    return fabric.at_link_rate(profile, bw, where="bench: bw")


def crossover(sizes: list[int], times_x: list[float], times_ring: list[float]) -> dict[str, Any]:
    """Where ``x`` stops beating ring: the first size at which ``t_x / t_ring`` crosses 1 going up.

    Interpolated linearly in log(size) and log(ratio) between the two sizes
    around the crossing. ``size`` is None when there is none within
    ``sizes``; ``x_faster`` then says whether ``x`` was faster throughout.
    """
    ratios = [tx / tr for tx, tr in zip(times_x, times_ring, strict=True)]
    for (s0, r0), (s1, r1) in itertools.pairwise(zip(sizes, ratios, strict=True)):
        if r0 < 1 <= r1:
            f = -math.log(r0) / (math.log(r1) - math.log(r0))
            return {"size": math.exp(math.log(s0) + f * (math.log(s1) - math.log(s0))), "ratios": ratios,
                    "sizes": sizes, "x_faster": None}
    return {"size": None, "ratios": ratios, "sizes": sizes, "x_faster": all(r < 1 for r in ratios)}


def crossovers_agree(measured: dict[str, Any], predicted: dict[str, Any],
                     factor: float = TARGET_CROSSOVER_FACTOR) -> bool:
    """Both find the crossover within ``factor`` of each other, or neither finds one and they agree who wins."""
    if measured["size"] is None or predicted["size"] is None:
        return measured["size"] is None and predicted["size"] is None and measured["x_faster"] == predicted["x_faster"]
    return 1 / factor <= measured["size"] / predicted["size"] <= factor


def prediction_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How many rows' measured / predicted times are within the target, and the worst one."""
    ratios = [r["measured_over_predicted"] for r in rows if r.get("measured_over_predicted")]
    worst = max(ratios, key=lambda x: abs(x - 1), default=None)
    within = sum(1 for x in ratios if abs(x - 1) <= TARGET_PREDICTION)
    beyond = sum(1 for x in ratios if abs(x - 1) > TARGET_WORST)
    return {"rows": len(rows), "measured": len(ratios), "within": within, "beyond_worst": beyond, "worst": worst,
            "pass": bool(rows) and len(ratios) == len(rows) and within >= TARGET_WITHIN_SHARE * len(rows)
            and beyond == 0}


def with_bw(spec: str, bw: float) -> str:
    return f"{spec},bw={bw:g}"


def replay_row(case: Case, algo: str, results: dict[str, Any], link_mbps: float, size: int = 0) -> dict[str, Any]:
    """The bench's summary of one replay's results document (``results.json``, :meth:`emulator.runs.results.CellResults.to_json`)."""
    reps = results.get("repetitions", [])
    flags = sorted({f for r in reps for f in r.get("fidelity", {}).get("flags", []) if f != "uncalibrated"})
    loads = [r["fidelity"]["datapath_load_mbps"] for r in reps if "fidelity" in r]
    idles = [r["fidelity"]["cpu_idle"] for r in reps if "fidelity" in r]
    busbw = results.get("busbw_mbps_median")
    mp = results.get("measured_over_predicted_median")
    return {
        "topology": case.topology, "routing": case.routing, "seed": case.seed, "algorithm": algo, "size": size,
        "status": results.get("status"), "error": results.get("error"),
        "time_s": results.get("time_s_median"),
        "predicted_s": (results.get("prediction") or {}).get("predicted_time_s"),
        "measured_over_predicted": mp,
        "measured_over_predicted_reps": [r.get("measured_over_predicted") for r in reps],
        "busbw_mbps": busbw,
        "busbw_over_link": busbw / link_mbps if busbw else None,
        "datapath_load_mbps": max(loads, default=None),
        "cpu_idle_min": min(idles, default=None),
        "tcp_retransmits": [r["fidelity"].get("tcp_retransmits") for r in reps if "fidelity" in r],
        "flags": flags,
        "within_target": within(mp),
    }


def bringup_summary(ours: list[dict[str, float]], plain: list[dict[str, float]]) -> dict[str, Any]:
    """Medians of up / down times of both builders and their ratio (ours / plain)."""
    def med(rows: list[dict[str, float]], key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    out: dict[str, Any] = {"ours": ours, "plain": plain}
    for who, rows in (("ours", ours), ("plain", plain)):
        for key in ("up_s", "down_s", "total_s"):
            out[f"{who}_{key}"] = med(rows, key)
    if out["ours_up_s"] and out["plain_up_s"]:
        out["up_ratio"] = out["ours_up_s"] / out["plain_up_s"]
    if out["ours_total_s"] and out["plain_total_s"]:
        out["total_ratio"] = out["ours_total_s"] / out["plain_total_s"]
    return out


def format_report(data: dict[str, Any]) -> str:
    """The side-by-side table ``emu bench`` prints at the end."""
    bw = data["link_mbps"]
    profile = fabric.parse(data["fabric"])
    lines = [
        f"# emu bench {data['date']}: {data['machine']['nproc']} CPUs, {data['machine'].get('datapath', '?')} "
        f"datapath, MTU {data['mtu']}, links {bw:g} Mbit/s",
        f"# load average before {data['machine']['loadavg_before']}, after {data['machine'].get('loadavg_after')}",
        f"# fabric: {profile.describe()}",
        f"# calibration: {data.get('calibration_source')}",
        "",
        f"{'ratio':<52} {'measured':>9} {'target':>14}  verdict",
    ]
    ag = data.get("agents")
    if ag and ag.get("ratio") is not None:
        lines.append(f"{'agent / iperf3 goodput, one link':<52} {ag['ratio']:>9.3f} {'>= 0.97':>14}  "
                     f"{verdict(ag['ratio'] >= TARGET_AGENT)}   ({ag['agent_mbps']:.2f} vs {ag['iperf3_mbps']:.2f} "
                     "Mbit/s per direction)")
    else:
        lines.append(f"{'agent / iperf3 goodput, one link':<52} {'error':>9} {'>= 0.97':>14}  MISS   "
                     f"({(ag or {}).get('error')})")
    hd = data.get("hdrm") or {}
    label = f"hdrm busbw / link rate, BiGraph 4/4/2, {format_size(hd.get('size') or 0)}"
    if hd.get("busbw_over_link") is not None:
        lines.append(f"{label:<52} {hd['busbw_over_link']:>9.3f} {'>= 0.90':>14}  "
                     f"{verdict(hd['busbw_over_link'] >= TARGET_HDRM)}   ({hd['busbw_mbps']:.2f} of {bw:g} Mbit/s)")
    else:
        lines.append(f"{label:<52} {'error':>9} {'>= 0.90':>14}  MISS   ({hd.get('error')})")
    rows = data.get("replays", [])
    summary = prediction_summary(rows)
    worst = f"worst {summary['worst']:.2f}" if summary["worst"] is not None else "none measured"
    lines.append(f"{'measured / predicted time within +-10%':<52} {summary['within']:>4} of {summary['rows']:<3} "
                 f"{'>= 90%, none':>14}  {verdict(summary['pass'])}   ({summary['beyond_worst']} beyond +-25%, "
                 f"{worst})")
    for c in data.get("crossovers", []):
        lines.append(f"{'crossover ' + c['label']:<52} {_size_text(c['measured']):>9} "
                     f"{'x2 of ' + _size_text(c['predicted']):>14}  {verdict(c.get('agree'))}")
    lines += mpi_report_lines(data.get("mpi") or [], bw)
    b = data.get("bringup") or {}
    if b.get("ours_up_s") is not None and b.get("plain_up_s") is not None:
        label = f"bring-up {b.get('hosts', '?')} hosts: ours / plain Mininet"
        lines.append(f"{label:<52} {b['up_ratio']:>9.2f} {'report':>14}  "
                     f"      (up {b['ours_up_s']:.1f} s vs {b['plain_up_s']:.1f} s; up+down "
                     f"{b['ours_total_s']:.1f} s vs {b['plain_total_s']:.1f} s)")
    lines += ["", f"{'topology':<46} {'routing':<9} {'algo':<7} {'size':>6} {'time s':>8} {'pred s':>8} "
              f"{'meas/pred':>9} {'busbw/link':>10} {'real us':>9} {'dp load':>8} {'retx':>6}  verdict / flags"]
    for r in rows:
        size = format_size(r.get("size") or 0)
        if r["status"] != "ok":
            lines.append(f"{r['topology']:<46} {r['routing']:<9} {r['algorithm']:<7} {size:>6} failed: {r['error']}")
            continue
        seed = f"/{r['seed']}" if r["routing"] == "ecmp" else ""
        real = profile.real_seconds(r["time_s"]) * 1e6 if r["time_s"] is not None else None
        lines.append(f"{r['topology']:<46} {r['routing'] + seed:<9} {r['algorithm']:<7} {size:>6} "
                     f"{_num(r['time_s'], 8, 3)} {_num(r['predicted_s'], 8, 3)} "
                     f"{_num(r['measured_over_predicted'], 9, 3)} {_num(r['busbw_over_link'], 10, 3)} "
                     f"{_num(real, 9, 1)} {_num(r['datapath_load_mbps'], 8, 0)} "
                     f"{sum(x or 0 for x in r.get('tcp_retransmits', [])):>6}  "
                     f"{verdict(r['within_target'])} {' '.join(r['flags'])}")
    for c in data.get("crossovers", []):
        m, p = c["measured"], c["predicted"]
        lines.append(f"# crossover {c['label']}: measured {_size_text(m)} (ratios "
                     + ", ".join(f"{format_size(sz)} {x:.2f}" for sz, x in zip(m["sizes"], m["ratios"], strict=True))
                     + f"), model {_size_text(p)}")
    cap = data.get("calibration_capacity_mbps")
    lines.append("# retx: TCP retransmissions over the measured repetitions (all hosts); real us: the emulated time "
                 "on the real fabric")
    lines.append(f"# dp load: offered switch-hop Mbit/s (calibrated capacity {f'{cap:.0f}' if cap else 'unknown'})")
    lines.append(f"# total {data.get('duration_s', 0):.0f} s; results in {data.get('path')}")
    return "\n".join(lines)


def mpi_report_lines(rows: list[dict[str, Any]], bw: float) -> list[str]:
    """The ratio lines of the Open MPI pairs."""
    out = []
    for r in rows:
        label = (f"MPI {r['mpi_algorithm']} / agents {r['agents_algorithm']} busbw, BiGraph 2/2/2 hdrm, "
                 f"{format_size(r.get('size') or 0)}")
        if r.get("ratio") is None:
            why = r.get("mpi_error") or r.get("agents_error") or "not measured"
            out.append(f"{label:<52} {'error':>9} {'>= 0.90':>14}  MISS   ({why})")
            continue
        flags = sorted({*r.get("mpi_flags", []), *r.get("agents_flags", [])} - {"uncalibrated"})
        idle = r.get("mpi_cpu_idle")
        out.append(f"{label:<52} {r['ratio']:>9.3f} {'>= 0.90':>14}  {verdict(r['pass'])}   "
                   f"({r['mpi_busbw_mbps']:.2f} vs {r['agents_busbw_mbps']:.2f} of {bw:g} Mbit/s"
                   f"{'' if r.get('mpi_correct') else ', MPI data WRONG'}"
                   f"{f', MPI CPU idle {idle:.0%}' if idle is not None else ''}"
                   f"{'; ' + ' '.join(flags) if flags else ''})")
    return out


def _size_text(c: dict[str, Any] | None) -> str:
    if not c:
        return "-"
    if c["size"] is None:
        return "none" + (" (x ahead)" if c["x_faster"] else " (ring ahead)")
    return format_size(int(c["size"] // 1024 * 1024)) if c["size"] >= 1024 else f"{c['size']:.0f}B"


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


# ------------------------------------------------------------- the live part
def plain_mininet_bringup(topo: topology.Topology, datapath: str) -> dict[str, float]:
    """Build, start and stop ``topo`` with bare Mininet; returns ``up_s``, ``down_s``, ``total_s``.

    The same hosts (IP, MAC), switches (dpid) and shaped links as
    :class:`EmulatedNetwork`, and our names (so ``emu clean`` can remove what a
    killed run leaves); no controller, no MTU, sysctl, ARP or flow set-up.
    Holds the machine-wide network lock; host shells are recorded in a run state.
    """
    # Mininet is imported here, not at the top: it is slow to import and only a bring-up needs it.
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import OVSSwitch

    setLogLevel(os.environ.get("EF_MININET_LOG", "error"))
    with NetworkLock():
        state = RunState.create("bench-plain")
        net = None
        try:
            t0 = time.monotonic()
            net = Mininet(topo=None, switch=partial(OVSSwitch, datapath=datapath), link=TCLink, controller=None,
                          build=False, autoSetMacs=False, autoStaticArp=False, waitConnected=False)
            for h in topo.hosts:
                node = net.addHost(h.name, ip=f"{h.ip}/8", mac=h.mac)
                state.record_process("host", node.pid, node=h.name, netns=proc_netns(node.pid))
            for s in topo.switches:
                net.addSwitch(bridge_name(s.name), dpid=f"{s.dpid:016x}")
            for lk in topo.links:
                if lk.kind == "host":
                    net.addLink(lk.a, bridge_name(lk.b), port1=0, port2=lk.b_port, intfName1=host_intf(lk.a),
                                intfName2=switch_intf(lk.b, lk.b_port), bw=lk.bw_mbps)
                else:
                    net.addLink(bridge_name(lk.a), bridge_name(lk.b), port1=lk.a_port, port2=lk.b_port,
                                intfName1=switch_intf(lk.a, lk.a_port), intfName2=switch_intf(lk.b, lk.b_port),
                                bw=lk.bw_mbps)
            net.build()
            net.start()
            up = time.monotonic() - t0
            t1 = time.monotonic()
            net.stop()
            net = None
            down = time.monotonic() - t1
        finally:
            if net is not None:
                try:
                    net.stop()
                except Exception:
                    pass
            kill_recorded(state)
            remove_our_bridges(run, [bridge_name(s.name) for s in topo.switches])
            state.remove()
    return {"up_s": up, "down_s": down, "total_s": up + down}


def our_bringup(topo: topology.Topology, datapath: str, mtu: int) -> dict[str, Any]:
    """:class:`EmulatedNetwork` start (static routes) and stop; start excludes the lock wait."""
    en = EmulatedNetwork(topo, routing="bigraph" if topo.kind == "bigraph" else "shortest", datapath=datapath,
                         label="bench-bringup", mtu=mtu)
    en.start()
    t1 = time.monotonic()
    en.stop()
    down = time.monotonic() - t1
    up = en.bringup_s or 0.0
    return {"up_s": up, "down_s": down, "total_s": up + down, "datapath": en.datapath}


def measure_bringup(rounds: int, datapath: str, mtu: int, echo: Callable[[str], None],
                    spec: str = BRINGUP_TOPOLOGY) -> dict[str, Any]:
    topo = topology.build(spec)
    ours, plain = [], []
    for i in range(rounds):
        ours.append(our_bringup(topo, datapath, mtu))
        plain.append(plain_mininet_bringup(topo, ours[-1]["datapath"]))
        echo(f"  bring-up {i + 1}/{rounds} ({len(topo.hosts)} hosts, {len(topo.switches)} switches, "
             f"{len(topo.links)} links): ours {ours[-1]['up_s']:.1f} s up + {ours[-1]['down_s']:.1f} s down, "
             f"plain Mininet {plain[-1]['up_s']:.1f} s + {plain[-1]['down_s']:.1f} s")
    return {"topology": topo.spec, "hosts": len(topo.hosts), "switches": len(topo.switches),
            "links": len(topo.links), **bringup_summary(ours, plain)}


def model_crossover(c: Crossover, link_mbps: float, model: LatencyModel, mtu: int,
                    sizes: tuple[int, ...] = MODEL_SWEEP) -> dict[str, Any]:
    """The crossover the model predicts, from its times at ``sizes`` (no network)."""
    topo = topology.build(with_bw(c.case.topology, link_mbps))
    times = {algo: [check(generators.generate(algo, topo, n), topo, c.case.routing, seed=c.case.seed, latency=model,
                          mtu=mtu).predicted_time_s for n in sizes] for algo in (c.algorithm, "ring")}
    return crossover(list(sizes), times[c.algorithm], times["ring"])


def measured_crossover(c: Crossover, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The crossover the bench's rows show (None unless both algorithms ran at every size)."""
    def times(algo: str) -> dict[int, float]:
        return {r["size"]: r["time_s"] for r in rows if r["status"] == "ok" and r["time_s"]
                and (r["topology"], r["routing"], r["seed"], r["algorithm"]) ==
                (c.case.topology, c.case.routing, c.case.seed, algo)}

    x, ring = times(c.algorithm), times("ring")
    sizes = sorted(set(x) & set(ring))
    if len(sizes) < 2:
        return None
    return crossover(sizes, [x[n] for n in sizes], [ring[n] for n in sizes])


def case_runs(case: Case, sizes: tuple[Size, ...]) -> list[tuple[Size, str]]:
    """Every (size, algorithm) ``case`` replays, smallest size first."""
    runs = [(size, algo) for size in sizes for algo in case.algorithms]
    runs += [(size, algo) for size in case.extra for algo in case.extra_algorithms]
    return sorted(runs, key=lambda r: r[0].bytes)


#: Sections no model predicts, as measured here (docs/fidelity.md): agents vs iperf3 (six 4 s runs, two networks),
#: and one Open MPI run of the bundled benchmark with its network.
AGENTS_VS_IPERF_S = 60.0
MPI_RUN_S = 60.0


def admission_request(profile: fabric.FabricProfile, sizes: tuple[Size, ...], latency: LatencyModel,
                      capacity_mbps: float | None, cases: tuple[Case, ...] = DEFAULT_CASES, bringup_rounds: int = 2,
                      bringup_topology: str = BRINGUP_TOPOLOGY) -> admission.Request:
    """The whole bench as admission sees it: its largest replay's memory, every section's time, every replay's
    load (each replay is predicted, as ``schedule check`` would)."""
    link_mbps, mtu = profile.emulated_link_mbps, profile.emulated_mtu
    memory: list[admission.MemoryEstimate] = []
    loads: list[admission.Load] = []
    time_s = AGENTS_VS_IPERF_S
    for case in cases:
        topo = topology.build(with_bw(case.topology, link_mbps))
        time_s += admission.bringup_estimate_s(topo)
        for size, algo in case_runs(case, sizes):
            schedule = generators.generate(algo, topo, size.bytes)
            report = predict(schedule, topo, case.routing, seed=case.seed, latency=latency, mtu=mtu)
            memory.append(admission.replay_memory(schedule, topo))
            loads.append(admission.Load(report.peak_load_mbps(), capacity_mbps,
                                        f"{algo} {format_size(size.bytes)} on {case.label}", topo.host_bw, profile))
            time_s += admission.replay_time_s(report, size.warmup + size.repeat)
    mpi_topo = topology.build(with_bw(MPI_TOPOLOGY, link_mbps))
    memory.append(admission.mpi_memory(len(mpi_topo.hosts), 3 * MPI_SIZE, mpi_topo))
    time_s += (len(MPI_PAIRS) + 1) * admission.bringup_estimate_s(mpi_topo) + len(MPI_PAIRS) * MPI_RUN_S
    for _, algo in MPI_PAIRS:
        schedule = generators.generate(algo, mpi_topo, MPI_SIZE, placement=MPI_PLACEMENT)
        time_s += admission.replay_time_s(predict(schedule, mpi_topo, "bigraph", latency=latency, mtu=mtu), 3)
    time_s += 2 * bringup_rounds * admission.bringup_estimate_s(topology.build(bringup_topology))
    return admission.Request("bench", admission.largest(memory), time_s,
                             f"{len(loads)} replays at the model's times, bring-ups, agents vs iperf3 and "
                             f"{len(MPI_PAIRS)} Open MPI runs at {AGENTS_VS_IPERF_S:g} s and {MPI_RUN_S:g} s",
                             tuple(loads))


def run_case(case: Case, bw: float, sizes: tuple[Size, ...], out: str, datapath: str, latency: LatencyModel,
             echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Replay every algorithm of ``case`` at every size in one session; a failed replay becomes a failed row."""
    topo = topology.build(with_bw(case.topology, bw))
    rows = []
    slug = f"{topo.kind}-{case.routing}-{case.seed}"
    echo(f"  {case.label}:")
    with ReplaySession(topo, case.routing, seed=case.seed, datapath=datapath, latency=latency,
                       work_dir=os.path.join(out, slug, "session"), echo=lambda s: echo("    " + s)) as session:
        for size, algo in case_runs(case, sizes):
            schedule = generators.generate(algo, topo, size.bytes)
            echo(f"   {algo} {format_size(size.bytes)}:")
            try:
                results = session.run(schedule, os.path.join(out, slug, f"{algo}-{format_size(size.bytes)}"),
                                      repeat=size.repeat, warmup=size.warmup).to_json()
            except ReplayFailed as exc:
                results = {"status": "failed", "error": str(exc)}
            rows.append(replay_row(case, algo, results, bw, size.bytes))
    return rows


def without_latency(profile: fabric.FabricProfile) -> fabric.FabricProfile:
    """``profile`` with no per-message or per-switch latency: what an Open MPI run's messages get."""
    keys = {key: getattr(profile, key) for key in fabric.KEYS}
    return fabric.parse({**keys, "alpha_us": 0.0, "switch_latency_us": 0.0})


def mpi_pair_row(mpi_algo: str, agents_algo: str, mpi: dict[str, Any], agents: dict[str, Any]) -> dict[str, Any]:
    """One pair's row from emu mpirun's and the replay's results documents."""
    rows = mpi.get("bench") or []
    mpi_bw = rows[-1]["busbw_mbps"] if rows and mpi.get("status") == "ok" else None
    agents_bw = agents.get("busbw_mbps_median") if agents.get("status") == "ok" else None
    reps = agents.get("repetitions") or []
    agents_flags = sorted({f for r in reps for f in ((r.get("fidelity") or {}).get("flags") or [])})
    ratio = mpi_bw / agents_bw if mpi_bw and agents_bw else None
    return {"mpi_algorithm": mpi_algo, "agents_algorithm": agents_algo, "size": MPI_SIZE,
            "mpi_busbw_mbps": mpi_bw, "agents_busbw_mbps": agents_bw, "ratio": ratio,
            "pass": ratio >= TARGET_MPI if ratio is not None else None,
            "mpi_status": mpi.get("status"), "mpi_error": mpi.get("error"), "agents_status": agents.get("status"),
            "agents_error": agents.get("error"),
            "mpi_correct": bool(rows) and all(r.get("wrong") == 0 for r in rows),
            "mpi_cpu_idle": (mpi.get("fidelity") or {}).get("cpu_idle"),
            "mpi_flags": (mpi.get("fidelity") or {}).get("flags") or [], "agents_flags": agents_flags}


def run_mpi_pairs(bw: float, profile: fabric.FabricProfile, out: str, datapath: str,
                  calibration: Calibration, echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every pair of :data:`MPI_PAIRS`: the agents' replays in one session, then one emu mpirun per algorithm."""
    bare = without_latency(profile)
    topo = topology.build(with_bw(MPI_TOPOLOGY, bw))
    agents: dict[str, dict[str, Any]] = {}
    echo(f"  agents on {topo.spec} ({MPI_PLACEMENT} placement), {format_size(MPI_SIZE)}:")
    with ReplaySession(topo, "bigraph", datapath=datapath, latency=fidelity.latency_model(bare, calibration),
                       work_dir=os.path.join(out, "agents", "session"), echo=lambda s: echo("    " + s)) as session:
        for _, algo in MPI_PAIRS:
            schedule = generators.generate(algo, topo, MPI_SIZE, placement=MPI_PLACEMENT)
            echo(f"   {algo}:")
            try:
                agents[algo] = session.run(schedule, os.path.join(out, "agents", algo), repeat=2, warmup=1).to_json()
            except ReplayFailed as exc:
                agents[algo] = {"status": "failed", "error": str(exc)}
    rows = []
    for mpi_algo, agents_algo in MPI_PAIRS:
        echo(f"  Open MPI {mpi_algo}:")
        cfg = MpiRunConfig(topology=topo.spec, routing="bigraph", placement=MPI_PLACEMENT, fabric=bare.spec(),
                           datapath=datapath, out=os.path.join(out, f"mpi-{mpi_algo}"),
                           program=("emu-allreduce-bench", "--algo", mpi_algo, "--sizes", str(MPI_SIZE),
                                    "--iters", "3", "--warmup", "1"))
        try:
            mpi = run_mpirun(prepare_mpirun(cfg), echo=lambda s: echo("    " + s)).to_json()
        except UserError as exc:
            mpi = {"status": "failed", "error": str(exc)}
        rows.append(mpi_pair_row(mpi_algo, agents_algo, mpi, agents[agents_algo]))
    return rows


def bench(fabric_spec: str | None = None, bw: float | None = None, sizes: tuple[Size, ...] = DEFAULT_SIZES,
          bringup_rounds: int = 2, datapath: str = "auto", out_dir: str | None = None,
          cases: tuple[Case, ...] = DEFAULT_CASES, crossovers: tuple[Crossover, ...] = CROSSOVERS,
          bringup_topology: str = BRINGUP_TOPOLOGY, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every section; returns the results (also written to ``results/bench-<timestamp>.json``)."""
    t0 = time.monotonic()
    profile = bench_profile(fabric_spec, bw)
    link_mbps, mtu = profile.emulated_link_mbps, profile.emulated_mtu
    calibration = ensure_calibration(profile, datapath, echo)
    latency = fidelity.latency_model(profile, calibration)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or os.path.join(PROJECT_ROOT, "results")
    path = os.path.join(out_dir, f"bench-{stamp}.json")
    runs = os.path.join(out_dir, f"bench-{stamp}")
    data: dict[str, Any] = {
        "date": stamp, "machine": machine_info(datapath, mtu), "mtu": mtu, "fabric": profile.spec(),
        "fabric_profile": profile.to_json(), "latency": latency.to_json(),
        "sizes": [s.__dict__ for s in sizes], "link_mbps": link_mbps, "dilation": profile.dilation,
        "calibration_source": latency.intrinsic.source,
        "calibration_capacity_mbps": calibration.datapath_capacity_mbps,
        "targets": {"agent_over_iperf3": TARGET_AGENT, "hdrm_busbw_over_link": TARGET_HDRM,
                    "measured_over_predicted": [1 - TARGET_PREDICTION, 1 + TARGET_PREDICTION],
                    "within_share": TARGET_WITHIN_SHARE, "worst": [1 - TARGET_WORST, 1 + TARGET_WORST],
                    "crossover_factor": TARGET_CROSSOVER_FACTOR, "mpi_over_agents_busbw": TARGET_MPI},
        "replays": [], "path": path, "runs_dir": runs,
    }

    def save() -> None:
        data["duration_s"] = time.monotonic() - t0
        write_json_atomic(path, data)

    echo(f"bench: {profile.describe()}; sizes {', '.join(format_size(s.bytes) for s in sizes)}")
    echo("agents vs iperf3 on one link:")
    try:
        data["agents"] = measure_agents_vs_iperf(link_mbps, seconds=4.0, repeat=3, datapath=datapath, mtu=mtu)
        data["machine"]["datapath"] = choose_datapath(datapath)
        echo(f"  {data['agents']['agent_mbps']:.2f} vs {data['agents']['iperf3_mbps']:.2f} Mbit/s per direction")
    except Exception as exc:  # a benchmark reports and goes on
        data["agents"] = {"error": f"{type(exc).__name__}: {exc}"}
        echo(f"  failed: {exc}")
    save()
    echo("replays:")
    for case in cases:
        try:
            data["replays"] += run_case(case, link_mbps, sizes, runs, datapath, latency, echo)
        except Exception as exc:
            for size in sizes:
                for algo in case.algorithms:
                    data["replays"].append(replay_row(case, algo, {"status": "failed", "error":
                                                                   f"{type(exc).__name__}: {exc}"}, link_mbps,
                                                      size.bytes))
            echo(f"  {case.label} failed: {exc}")
        save()
    largest = max(s.bytes for s in sizes)
    data["hdrm"] = next((r for r in data["replays"] if r["algorithm"] == "hdrm" and r["topology"] == BIGRAPH
                         and r["size"] == largest), {"error": "no hdrm row on BiGraph 4/4/2", "size": largest})
    data["crossovers"] = []
    for c in crossovers:
        measured = measured_crossover(c, data["replays"])
        predicted = model_crossover(c, link_mbps, latency, mtu)
        data["crossovers"].append({"label": c.label, "measured": measured, "predicted": predicted,
                                   "agree": crossovers_agree(measured, predicted) if measured else None})
    save()
    echo("Open MPI beside the agents:")
    try:
        data["mpi"] = run_mpi_pairs(link_mbps, profile, os.path.join(runs, "mpi"), datapath, calibration, echo)
    except Exception as exc:
        data["mpi"] = [{"mpi_algorithm": m, "agents_algorithm": a, "size": MPI_SIZE, "ratio": None, "pass": None,
                        "mpi_error": f"{type(exc).__name__}: {exc}"} for m, a in MPI_PAIRS]
        echo(f"  failed: {exc}")
    save()
    echo("bring-up:")
    try:
        data["bringup"] = measure_bringup(bringup_rounds, datapath, mtu, echo, bringup_topology)
    except Exception as exc:
        data["bringup"] = {"error": f"{type(exc).__name__}: {exc}"}
        echo(f"  failed: {exc}")
    data["machine"]["loadavg_after"] = load_average()
    save()
    return data

