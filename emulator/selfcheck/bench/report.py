"""The table ``emu bench`` prints at the end (:func:`format_report`): one :class:`RatioLine` per figure next to
its target and verdict, then one line per replay, then the crossovers' curves (pure: text from typed results)."""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model import routing
from emulator.model.fabric import FabricProfile
from emulator.model.schedule.format import format_size
from emulator.selfcheck.bench.cases import TARGET_AGENT, TARGET_AGENT_AGGREGATE, TARGET_HDRM, TARGET_NCCL_PACKETS
from emulator.selfcheck.bench.crossovers import CrossoverCurve, CrossoverRow
from emulator.selfcheck.bench.results import BenchResults
from emulator.selfcheck.bench.rows import (
    AgentsVsIperf,
    BringupSummary,
    MpiPairRow,
    NcclPacketRow,
    PredictionSummary,
    ReplayRow,
    SectionError,
    verdict,
)

REPLAY_HEADER = (f"{'topology':<46} {'routing':<9} {'algo':<7} {'size':>6} {'time s':>8} {'pred s':>8} "
                 f"{'meas/pred':>9} {'busbw/link':>10} {'real us':>9} {'dp load':>8} {'retx':>6}  verdict / flags")


@dataclass(frozen=True)
class RatioLine:
    """One figure of the table: what it is, as measured, its target, PASS / MISS / n/a (None: reported, no
    target) and notes."""

    name: str
    measured: str
    target: str
    verdict: str | None
    notes: str | None = None

    def text(self) -> str:
        line = f"{self.name:<52} {self.measured:>9} {self.target:>14}  {self.verdict or '':<3}"
        return line if self.notes is None else f"{line}   ({self.notes})"


def agents_line(ag: AgentsVsIperf | SectionError | None) -> RatioLine:
    name = "agent / iperf3 goodput, one link"
    if isinstance(ag, AgentsVsIperf) and ag.ratio is not None:
        return RatioLine(name, f"{ag.ratio:.3f}", ">= 0.97", verdict(ag.ratio >= TARGET_AGENT),
                         f"{ag.agent_mbps:.2f} vs {ag.iperf3_mbps:.2f} Mbit/s per direction")
    return RatioLine(name, "error", ">= 0.97", "MISS", f"{ag.error if isinstance(ag, SectionError) else None}")


def aggregate_line(ag: AgentsVsIperf | SectionError | None) -> RatioLine:
    flows = ag.document.get("flows") if isinstance(ag, AgentsVsIperf) else None
    name = f"agent / iperf3 goodput, {flows or 'all'} flows at once"
    target = f">= {TARGET_AGENT_AGGREGATE:.2f}"
    if isinstance(ag, AgentsVsIperf) and ag.ratio is not None:
        return RatioLine(name, f"{ag.ratio:.3f}", target, verdict(ag.ratio >= TARGET_AGENT_AGGREGATE),
                         f"{ag.agent_mbps:.0f} vs {ag.iperf3_mbps:.0f} Mbit/s in all, "
                         f"{ag.document.get('link_mbps'):g} Mbit/s links")
    return RatioLine(name, "error", target, "MISS", f"{ag.error if isinstance(ag, SectionError) else None}")


def hdrm_line(results: BenchResults) -> RatioLine:
    hd = results.hdrm
    name = f"hdrm busbw / link rate, BiGraph 4/4/2, {format_size(hd.size if hd else 0)}"
    if isinstance(hd, ReplayRow) and hd.busbw_over_link is not None:
        return RatioLine(name, f"{hd.busbw_over_link:.3f}", ">= 0.90", verdict(hd.busbw_over_link >= TARGET_HDRM),
                         f"{hd.busbw_mbps:.2f} of {results.link_mbps:g} Mbit/s")
    return RatioLine(name, "error", ">= 0.90", "MISS", f"{hd.error if hd else None}")


def prediction_line(summary: PredictionSummary) -> RatioLine:
    worst = f"worst {summary.worst:.2f}" if summary.worst is not None else "none measured"
    return RatioLine("measured / predicted time within +-10%", f"{summary.within:>4} of {summary.rows:<3}",
                     ">= 90%, none", verdict(summary.passed), f"{summary.beyond_worst} beyond +-25%, {worst}")


def crossover_line(c: CrossoverRow) -> RatioLine:
    return RatioLine("crossover " + c.label, size_text(c.measured), "x2 of " + size_text(c.predicted),
                     verdict(c.agree))


def mpi_line(r: MpiPairRow, bw: float) -> RatioLine:
    """The ratio line of one Open MPI pair."""
    name = f"MPI {r.mpi_algorithm} / agents {r.agents_algorithm} busbw, {r.fabric}, {format_size(r.size)}"
    if r.ratio is None:
        return RatioLine(name, "error", ">= 0.90", "MISS", r.mpi_error or r.agents_error or "not measured")
    flags = sorted({*r.mpi_flags, *r.agents_flags} - {"uncalibrated"})
    idle = r.mpi_cpu_idle
    return RatioLine(name, f"{r.ratio:.3f}", ">= 0.90", verdict(r.passed),
                     f"{r.mpi_busbw_mbps:.2f} vs {r.agents_busbw_mbps:.2f} of {bw:g} Mbit/s"
                     f"{'' if r.mpi_correct else ', MPI data WRONG'}"
                     f"{f', MPI CPU idle {idle:.0%}' if idle is not None else ''}"
                     f"{_over_model(r)}"
                     f"{'; ' + ' '.join(flags) if flags else ''}")


def _over_model(r: MpiPairRow) -> str:
    """``, over the model: MPI x, agents y`` (what is known of each run's time over its prediction)."""
    known = [f"{who} {ratio:.2f}" for who, ratio in (("MPI", r.mpi_over_model), ("agents", r.agents_over_model))
             if ratio is not None]
    return f", over the model: {', '.join(known)}" if known else ""


def nccl_packets_line(rows: list[NcclPacketRow] | SectionError | None) -> RatioLine | None:
    """NCCL's all-reduce as packets: the run rows within the target and trusted (a row not run is unchecked)."""
    name = f"NCCL packets / model within +-{TARGET_NCCL_PACKETS:.0%}, trusted"
    if rows is None:
        return None
    if isinstance(rows, SectionError):
        return RatioLine(name, "error", "all run", "MISS", rows.error)
    checked = [r for r in rows if r.passed is not None]
    passed = sum(1 for r in checked if r.passed)
    unchecked = len(rows) - len(checked)
    return RatioLine(name, f"{passed:>4} of {len(checked):<3}", "all run", verdict(passed == len(checked))
                     if checked else None, f"{unchecked} unchecked (not run as packets)" if unchecked else None)


def nccl_packet_line(r: NcclPacketRow) -> str:
    rate = f"{r.link_mbps:g} Mbit/s" if r.link_mbps is not None else "-"
    tail = f"{r.verdict}: {r.why_not_run}" if r.why_not_run else f"{verdict(r.passed)} {r.verdict}"
    return (f"{r.cluster:<7} {format_size(r.size):>6} {r.choice:<28} {_num(r.model_us, 9, 1)} "
            f"{_num(r.packets_us, 10, 1)} {_num(r.ratio, 9, 3)} {rate:>13}  {tail}")


NCCL_PACKET_HEADER = (f"{'NCCL':<7} {'size':>6} {'choice':<28} {'model us':>9} {'packets us':>10} {'pkt/model':>9} "
                      f"{'emulated NIC':>13}  verdict")


def bringup_line(b: BringupSummary) -> RatioLine:
    return RatioLine(f"bring-up {b.hosts} hosts: ours / plain Mininet", f"{b.up_ratio:.2f}", "report", None,
                     f"up {b.median('ours', 'up_s'):.1f} s vs {b.median('plain', 'up_s'):.1f} s, "
                     f"{b.per_host('ours', 'up_s'):.3f} vs {b.per_host('plain', 'up_s'):.3f} s per host; up+down "
                     f"{b.median('ours', 'total_s'):.1f} s vs {b.median('plain', 'total_s'):.1f} s")


def ratio_lines(results: BenchResults) -> list[RatioLine]:
    """Every figure of the run, in the table's order."""
    lines = [agents_line(results.agents), aggregate_line(results.agents_aggregate), hdrm_line(results),
             prediction_line(PredictionSummary.of(results.replays))]
    lines += [crossover_line(c) for c in results.crossovers or []]
    lines += [mpi_line(r, results.link_mbps) for r in results.mpi or []]
    nccl = nccl_packets_line(results.nccl_packets)
    lines += [nccl] if nccl is not None else []
    bringups = [results.bringup, *(results.bringup_at_scale or [])]
    lines += [bringup_line(b) for b in bringups if isinstance(b, BringupSummary) and b.up_ratio is not None]
    return lines


def replay_line(r: ReplayRow, profile: FabricProfile) -> str:
    size = format_size(r.size)
    if r.status != "ok":
        return f"{r.topology:<46} {r.routing:<9} {r.algorithm:<7} {size:>6} failed: {r.error}"
    seed = f"/{r.seed}" if routing.hashes_five_tuples(r.routing) else ""
    real = profile.real_seconds(r.time_s) * 1e6 if r.time_s is not None else None
    return (f"{r.topology:<46} {r.routing + seed:<9} {r.algorithm:<7} {size:>6} "
            f"{_num(r.time_s, 8, 3)} {_num(r.predicted_s, 8, 3)} "
            f"{_num(r.measured_over_predicted, 9, 3)} {_num(r.busbw_over_link, 10, 3)} "
            f"{_num(real, 9, 1)} {_num(r.datapath_load_mbps, 8, 0)} "
            f"{sum(x or 0 for x in r.tcp_retransmits):>6}  "
            f"{verdict(r.within_target)} {' '.join(r.flags)}")


def curve_line(c: CrossoverRow) -> str:
    """A crossover's measured curve and the model's crossover (a crossover the rows do not show: ``-``)."""
    m, p = c.measured, c.predicted
    if m is None:
        return f"# crossover {c.label}: measured -, model {size_text(p)}"
    ratios = ", ".join(f"{format_size(sz)} {x:.2f}" for sz, x in zip(m.sizes, m.ratios, strict=True))
    return f"# crossover {c.label}: measured {size_text(m)} (ratios {ratios}), model {size_text(p)}"


def header(results: BenchResults) -> list[str]:
    machine = results.machine
    return [
        f"# emu bench {results.date}: {machine['nproc']} CPUs, {machine.get('datapath', '?')} "
        f"datapath, MTU {results.mtu}, links {results.link_mbps:g} Mbit/s",
        f"# load average before {machine['loadavg_before']}, after {machine.get('loadavg_after')}",
        f"# fabric: {results.profile.describe()}",
        f"# calibration: {results.latency.intrinsic.source}",
        "",
        f"{'ratio':<52} {'measured':>9} {'target':>14}  verdict",
    ]


def footer(results: BenchResults) -> list[str]:
    cap = results.calibration_capacity_mbps
    return ["# retx: TCP retransmissions over the measured repetitions (all hosts); real us: the emulated time "
            "on the real fabric",
            f"# dp load: offered switch-hop Mbit/s (calibrated capacity {f'{cap:.0f}' if cap else 'unknown'})",
            f"# total {results.duration_s or 0:.0f} s; results in {results.path}"]


def format_report(results: BenchResults) -> str:
    """The side-by-side table ``emu bench`` prints at the end."""
    lines = header(results) + [line.text() for line in ratio_lines(results)]
    lines += ["", REPLAY_HEADER] + [replay_line(r, results.profile) for r in results.replays]
    lines += [curve_line(c) for c in results.crossovers or []]
    if isinstance(results.nccl_packets, list):
        lines += ["", NCCL_PACKET_HEADER] + [nccl_packet_line(r) for r in results.nccl_packets]
    return "\n".join(lines + footer(results))


def size_text(c: CrossoverCurve | None) -> str:
    if not c:
        return "-"
    if c.size is None:
        return "none" + (" (x ahead)" if c.x_faster else " (ring ahead)")
    return format_size(int(c.size // 1024 * 1024)) if c.size >= 1024 else f"{c.size:.0f}B"


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

