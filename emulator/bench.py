"""``emu bench`` (``make bench``): the emulator's fidelity and performance ratios, measured in one run.

A benchmark, not a test: it prints every ratio next to its target with PASS or
MISS, writes ``results/bench-<timestamp>.json`` (atomically, after every
section, so a failure keeps what was measured) and returns 0 even on a miss.

Sections, in order:

1. **agents / iperf3** on one link: :func:`emulator.calibrate.measure_agents_vs_iperf`
   (target ≥ :data:`TARGET_AGENT`).
2. **replays** of the default experiment's algorithm × topology grid
   (:data:`DEFAULT_CASES`), one :class:`~emulator.replay.ReplaySession` per
   (topology, routing, seed): measured / predicted time of each (target within
   ±:data:`TARGET_PREDICTION`). Each row carries replay's fidelity flags.
   Then busbw / link rate of ``hdrm`` on BiGraph 4/4/2 (target ≥
   :data:`TARGET_HDRM`) at a bandwidth-bound size (:func:`bandwidth_bound_size`,
   16 MiB per rank at 10 Mbit/s): at the grid's size every halving-doubling
   round also pays the ranks' lateness (tens of ms on 2 cores), which is a
   latency term, not the fabric's bandwidth.
3. **bring-up** of 32 hosts (:data:`BRINGUP_TOPOLOGY`): :class:`EmulatedNetwork`
   start and stop against plain Mininet (:func:`plain_mininet_bringup`: the
   same hosts, switches and ``TCLink`` links, ``OVSSwitch`` on the same
   datapath, no controller, none of our host set-up), alternated.

The link rate is ``--bw``, else the calibration's ``recommended_link_mbps``
(``emu calibrate``), else 10 Mbit/s; the size per rank ``--size``, else
1 MiB halved until a 16-rank ring ideally takes at most 3.5 s at that rate. Emulated figures are reported with the
dilation factor to a real fabric of :data:`REAL_FABRIC_MBPS` links.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulator import fidelity, topology
from emulator.errors import UserError
from emulator.results import write_json_atomic

TARGET_AGENT = 0.97
TARGET_HDRM = 0.90
TARGET_PREDICTION = 0.10
REAL_FABRIC_MBPS = 100_000.0
BRINGUP_TOPOLOGY = "bigraph:upper=4,lower=4,hosts_per_switch=4"
DEFAULT_SIZE = 1 << 20
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Case:
    """One ReplaySession: a topology, its routing and seed, and the algorithms replayed on it."""

    topology: str
    routing: str
    seed: int
    algorithms: tuple[str, ...]

    @property
    def label(self) -> str:
        seed = f" seed {self.seed}" if self.routing == "ecmp" else ""
        return f"{self.topology} {self.routing}{seed}"


LEAFSPINE = "leafspine:leaves=4,spines=4,hosts_per_leaf=4"
BIGRAPH = "bigraph:upper=4,lower=4,hosts_per_switch=2"
DEFAULT_CASES = (
    Case(BIGRAPH, "bigraph", 0, ("hdrm", "hd")),
    Case(LEAFSPINE, "ecmp", 1, ("ring", "hd", "dbtree")),
    Case(LEAFSPINE, "dmodk", 0, ("ring", "hd", "dbtree")),
    Case("fattree:k=4", "ecmp", 1, ("ring", "hd", "dbtree")),
    Case("star:hosts=16", "shortest", 0, ("ring", "hd", "dbtree")),
)


# ------------------------------------------------------------------ pure part
def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def within(ratio: float | None, tolerance: float = TARGET_PREDICTION) -> bool | None:
    return None if ratio is None else abs(ratio - 1.0) <= tolerance


def link_rate(bw: float | None, calibration: dict[str, Any] | None) -> tuple[float, str]:
    """The bench's link rate and where it came from."""
    if bw is not None:
        if not 0 < bw <= 1000:
            raise UserError(f"bench: field 'bw': expected Mbit/s in (0, 1000], got {bw!r}")
        return float(bw), "--bw"
    rec = (calibration or {}).get("recommended_link_mbps")
    if rec:
        return float(rec), f"recommended by the calibration of {(calibration or {}).get('machine', {}).get('date')}"
    return 10.0, "default (no calibration: run `emu calibrate`)"


def default_size(link_mbps: float, p: int = 16, budget_s: float = 3.5) -> int:
    """The largest power-of-two size <= :data:`DEFAULT_SIZE` whose ideal ``p``-rank ring takes <= ``budget_s``.

    Keeps the whole bench near 8 minutes at the low link rates a small machine
    calibrates to (at least 64 KiB).
    """
    size = DEFAULT_SIZE
    while size > 64 << 10 and 2 * (p - 1) / p * size * 8 / (link_mbps * 1e6) > budget_s:
        size //= 2
    return size


def bandwidth_bound_size(link_mbps: float, p: int = 16, budget_s: float = 30.0) -> int:
    """The largest power-of-two size <= 16 MiB whose ideal ``p``-rank allreduce takes <= ``budget_s`` (>= 1 MiB)."""
    size = 16 << 20
    while size > DEFAULT_SIZE and 2 * (p - 1) / p * size * 8 / (link_mbps * 1e6) > budget_s:
        size //= 2
    return size


def with_bw(spec: str, bw: float) -> str:
    return f"{spec},bw={bw:g}"


def replay_row(case: Case, algo: str, results: dict[str, Any], link_mbps: float) -> dict[str, Any]:
    """The bench's summary of one replay's ``results`` dict."""
    reps = results.get("repetitions", [])
    flags = sorted({f for r in reps for f in r.get("fidelity", {}).get("flags", []) if f != "uncalibrated"})
    loads = [r["fidelity"]["datapath_load_mbps"] for r in reps if "fidelity" in r]
    idles = [r["fidelity"]["cpu_idle"] for r in reps if "fidelity" in r]
    busbw = results.get("busbw_mbps_median")
    mp = results.get("measured_over_predicted_median")
    return {
        "topology": case.topology, "routing": case.routing, "seed": case.seed, "algorithm": algo,
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
    dil = data["dilation"]
    lines = [
        f"# emu bench {data['date']}: {data['machine']['nproc']} CPUs, {data['machine'].get('datapath', '?')} "
        f"datapath, MTU {data['mtu']}, links {bw:g} Mbit/s ({data['link_source']})",
        f"# load average before {data['machine']['loadavg_before']}, after {data['machine'].get('loadavg_after')}",
        f"# dilation: {bw:g} Mbit/s links stand for {REAL_FABRIC_MBPS / 1000:g} Gbit/s ones, factor {dil:g}; "
        "bandwidth-bound times scale by 1/factor, per-message latency does not",
        "",
        f"{'ratio':<44} {'measured':>9} {'target':>10}  verdict",
    ]
    ag = data.get("agents")
    if ag and ag.get("ratio") is not None:
        lines.append(f"{'agent / iperf3 goodput, one link':<44} {ag['ratio']:>9.3f} {'>= 0.97':>10}  "
                     f"{verdict(ag['ratio'] >= TARGET_AGENT)}   ({ag['agent_mbps']:.2f} vs {ag['iperf3_mbps']:.2f} "
                     "Mbit/s per direction)")
    else:
        lines.append(f"{'agent / iperf3 goodput, one link':<44} {'error':>9} {'>= 0.97':>10}  MISS   "
                     f"({(ag or {}).get('error')})")
    hd = data.get("hdrm")
    label = f"hdrm busbw / link rate, BiGraph 4/4/2, {(hd or {}).get('size', 0) >> 20} MiB"
    if hd and hd.get("busbw_over_link") is not None:
        lines.append(f"{label:<44} {hd['busbw_over_link']:>9.3f} {'>= 0.90':>10}  "
                     f"{verdict(hd['busbw_over_link'] >= TARGET_HDRM)}   ({hd['busbw_mbps']:.2f} of {bw:g} Mbit/s)")
    else:
        lines.append(f"{label:<44} {'error':>9} {'>= 0.90':>10}  MISS   ({(hd or {}).get('error')})")
    rows = data.get("replays", [])
    ok = [r for r in rows if r["within_target"]]
    lines.append(f"{'measured / predicted time within +-10%':<44} {len(ok):>4} of {len(rows):<3} {'all':>10}  "
                 f"{verdict(bool(rows) and len(ok) == len(rows))}")
    b = data.get("bringup") or {}
    if b.get("ours_up_s") is not None and b.get("plain_up_s") is not None:
        label = f"bring-up {b.get('hosts', '?')} hosts: ours / plain Mininet"
        lines.append(f"{label:<44} {b['up_ratio']:>9.2f} {'report':>10}  "
                     f"      (up {b['ours_up_s']:.1f} s vs {b['plain_up_s']:.1f} s; up+down "
                     f"{b['ours_total_s']:.1f} s vs {b['plain_total_s']:.1f} s)")
    lines += ["", f"{'topology':<46} {'routing':<9} {'algo':<7} {'time s':>8} {'pred s':>8} {'meas/pred':>9} "
              f"{'busbw/link':>10} {'@100G us':>9} {'dp load':>8} {'retx':>6}  verdict / flags"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['topology']:<46} {r['routing']:<9} {r['algorithm']:<7} failed: {r['error']}")
            continue
        seed = f"/{r['seed']}" if r["routing"] == "ecmp" else ""
        scaled = r["time_s"] / dil * 1e6 if r["time_s"] is not None else None
        lines.append(f"{r['topology']:<46} {r['routing'] + seed:<9} {r['algorithm']:<7} {_num(r['time_s'], 8, 3)} "
                     f"{_num(r['predicted_s'], 8, 3)} {_num(r['measured_over_predicted'], 9, 3)} "
                     f"{_num(r['busbw_over_link'], 10, 3)} {_num(scaled, 9, 1)} {_num(r['datapath_load_mbps'], 8, 0)} "
                     f"{sum(x or 0 for x in r.get('tcp_retransmits', [])):>6}  "
                     f"{verdict(r['within_target'])} {' '.join(r['flags'])}")
    cap = data.get("calibration_capacity_mbps")
    lines.append("# retx: TCP retransmissions over the measured repetitions (all hosts)")
    lines.append(f"# dp load: offered switch-hop Mbit/s (calibrated capacity "
                 f"{f'{cap:.0f}' if cap else 'unknown'}); @100G: emulated time / dilation")
    lines.append(f"# total {data.get('duration_s', 0):.0f} s; results in {data.get('path')}")
    return "\n".join(lines)


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
    from functools import partial

    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import OVSSwitch

    from emulator.network import NetworkLock, bridge_name, host_intf, remove_our_bridges, switch_intf
    from emulator.runstate import RunState, kill_recorded, proc_netns
    from emulator.system import run

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
    from emulator.network import EmulatedNetwork

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


def run_case(case: Case, bw: float, size: int, repeat: int, out: str, datapath: str, mtu: int,
             echo: Callable[[str], None], warmup: int = 1) -> list[dict[str, Any]]:
    """Replay every algorithm of ``case`` in one session; a failed replay becomes a failed row."""
    from emulator.replay import ReplayFailed, ReplaySession
    from emulator.schedule import generators

    topo = topology.build(with_bw(case.topology, bw))
    rows = []
    slug = f"{topo.kind}-{case.routing}-{case.seed}"
    echo(f"  {case.label}:")
    with ReplaySession(topo, case.routing, seed=case.seed, datapath=datapath, mtu=mtu,
                       work_dir=os.path.join(out, slug, "session"), echo=lambda s: echo("    " + s)) as session:
        for algo in case.algorithms:
            schedule = generators.generate(algo, topo, size)
            echo(f"   {algo}:")
            try:
                results = session.run(schedule, os.path.join(out, slug, algo), repeat=repeat, warmup=warmup)
            except ReplayFailed as exc:
                results = {"status": "failed", "error": str(exc)}
            rows.append(replay_row(case, algo, results, bw))
    return rows


def bench(bw: float | None = None, size: int | None = None, repeat: int = 2, bringup_rounds: int = 2,
          datapath: str = "auto", mtu: int = topology.DEFAULT_MTU, out_dir: str | None = None,
          cases: tuple[Case, ...] = DEFAULT_CASES, bringup_topology: str = BRINGUP_TOPOLOGY,
          echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every section; returns the results (also written to ``results/bench-<timestamp>.json``)."""
    from emulator.calibrate import _loadavg, machine_info, measure_agents_vs_iperf

    t0 = time.monotonic()
    calibration = fidelity.load_calibration()
    link_mbps, source = link_rate(bw, calibration)
    size = size or default_size(link_mbps)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or os.path.join(PROJECT_ROOT, "results")
    path = os.path.join(out_dir, f"bench-{stamp}.json")
    runs = os.path.join(out_dir, f"bench-{stamp}")
    data: dict[str, Any] = {
        "date": stamp, "machine": machine_info(datapath, mtu), "mtu": mtu, "size": size, "repeat": repeat,
        "link_mbps": link_mbps, "link_source": source, "dilation": REAL_FABRIC_MBPS / link_mbps,
        "real_fabric_mbps": REAL_FABRIC_MBPS,
        "calibration_capacity_mbps": (calibration or {}).get("datapath_capacity_mbps"),
        "targets": {"agent_over_iperf3": TARGET_AGENT, "hdrm_busbw_over_link": TARGET_HDRM,
                    "measured_over_predicted": [1 - TARGET_PREDICTION, 1 + TARGET_PREDICTION]},
        "replays": [], "path": path, "runs_dir": runs,
    }

    def save() -> None:
        data["duration_s"] = time.monotonic() - t0
        write_json_atomic(path, data)

    echo(f"bench: links {link_mbps:g} Mbit/s ({source}), {size} B per rank, {repeat} repetitions + 1 warm-up")
    echo("agents vs iperf3 on one link:")
    try:
        data["agents"] = measure_agents_vs_iperf(link_mbps, seconds=4.0, repeat=3, datapath=datapath, mtu=mtu)
        data["machine"]["datapath"] = _datapath_used(datapath)
        echo(f"  {data['agents']['agent_mbps']:.2f} vs {data['agents']['iperf3_mbps']:.2f} Mbit/s per direction")
    except Exception as exc:  # a benchmark reports and goes on
        data["agents"] = {"error": f"{type(exc).__name__}: {exc}"}
        echo(f"  failed: {exc}")
    save()
    echo("replays:")
    for case in cases:
        try:
            data["replays"] += run_case(case, link_mbps, size, repeat, runs, datapath, mtu, echo)
        except Exception as exc:
            for algo in case.algorithms:
                data["replays"].append(replay_row(case, algo, {"status": "failed",
                                                               "error": f"{type(exc).__name__}: {exc}"}, link_mbps))
            echo(f"  {case.label} failed: {exc}")
        save()
    hdrm_size = bandwidth_bound_size(link_mbps)
    echo(f"hdrm at a bandwidth-bound size ({hdrm_size} B per rank):")
    case = Case(BIGRAPH, "bigraph", 0, ("hdrm",))
    try:
        (data["hdrm"],) = run_case(case, link_mbps, hdrm_size, 1, os.path.join(runs, "bandwidth-bound"), datapath,
                                   mtu, echo, warmup=0)
    except Exception as exc:
        data["hdrm"] = replay_row(case, "hdrm", {"status": "failed", "error": f"{type(exc).__name__}: {exc}"},
                                  link_mbps)
        echo(f"  failed: {exc}")
    data["hdrm"]["size"] = hdrm_size
    save()
    echo("bring-up:")
    try:
        data["bringup"] = measure_bringup(bringup_rounds, datapath, mtu, echo, bringup_topology)
    except Exception as exc:
        data["bringup"] = {"error": f"{type(exc).__name__}: {exc}"}
        echo(f"  failed: {exc}")
    data["machine"]["loadavg_after"] = _loadavg()
    save()
    return data


def _datapath_used(requested: str) -> str:
    from emulator.system import choose_datapath

    return choose_datapath(requested)
