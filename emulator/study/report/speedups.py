"""The report's speedups: the reference against every baseline family, and one NIC per accelerator against a
shared NIC, each with its 95% bootstrap interval.

Pure: numbers from replay rows (:mod:`emulator.study.report.rows`), nothing
read or drawn. It owns the speedup of the reference over every baseline
family of a series, host count and collective (:func:`speedup_tables`),
ECMP seeds folded by their median; one NIC per accelerator against a shared
NIC (:func:`server_speedup_tables`); each with its 95% hierarchical bootstrap
interval (:func:`speedup_interval`, :mod:`emulator.base.stats`). Cells at
different link rates compare efficiencies (busbw / link goodput), never
busbw (:func:`by_efficiency`). Only rows that busbw describes take part
(:func:`~emulator.study.report.rows.busbw_rows`).

Labels: a family is ``<topology slug> <routing> <algorithm>``
(:meth:`~emulator.study.cell_kinds.replay.CellRow.family`); a collective other
than allreduce prefixes the algorithm (``leafspine-4x4x4 ecmp
allgather-ring``), so allreduce labels read as they always did.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from emulator.base import stats
from emulator.model import routing
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.study.report.rows import CellRow, Reference, busbw_rows

RESAMPLES = stats.DEFAULT_RESAMPLES  # bootstrap resamples behind every speedup's interval


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None when there is none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def by_efficiency(rows: Iterable[CellRow]) -> bool:
    """Whether a comparison of these rows must divide efficiencies: their cells ran at different link rates."""
    return len({r.link_mbps for r in rows}) > 1


def speedup_interval(num: list[CellRow], den: list[CellRow], efficiency: bool = False) -> stats.Interval | None:
    """The bootstrap interval of median(num) / median(den) over the repetitions of the cells, a group per cell.

    Per-repetition busbw, or busbw / link goodput when ``efficiency``. None when a side has no measured
    repetition.
    """
    def groups(rows: list[CellRow]) -> list[list[float]]:
        return [[v / (r.capacity_mbps if efficiency else 1.0) for v in r.rep_busbw] for r in rows if r.rep_busbw]

    n, d = groups(num), groups(den)
    if not n or not d:
        return None
    return stats.ratio_interval(n, d, resamples=RESAMPLES)


@dataclass(frozen=True)
class Speedup:
    """A measured and a model speedup, with the measured one's 95% bootstrap interval.

    ``significant``: the interval excludes 1 (None without an interval). ``by_efficiency``: the cells ran at
    different link rates, so the ratio is of busbw / link goodput.
    """

    speedup: float | None
    model_speedup: float | None
    interval: tuple[float, float] | None
    significant: bool | None
    by_efficiency: bool


def _interval_of(iv: stats.Interval | None) -> tuple[tuple[float, float] | None, bool | None]:
    return ((iv.low, iv.high), stats.significant(iv)) if iv else (None, None)


@dataclass(frozen=True)
class BaselineEntry(Speedup):
    """The reference against one baseline family at one size (ECMP: one cell per seed).

    ``speedup`` is the reference's busbw over the median of the family's, ``range`` the lowest and highest
    over seeds (None for one seed); ``busbw`` and ``model_busbw`` the family's medians.
    """

    busbw: float | None
    model_busbw: float | None
    seeds: int
    cells: list[CellRow]
    range: tuple[float, float] | None


@dataclass(frozen=True)
class SpeedupTable:
    """One (series, hosts) that has reference cells: per size, the reference and every baseline family."""

    series: str
    hosts: int
    sizes: list[int]
    reference: dict[int, CellRow]  # size -> the reference's cell
    baselines: dict[str, dict[int, BaselineEntry]]  # family -> size -> entry
    collective: str = ALLREDUCE


def _baseline_entry(rr: CellRow | None, cells: list[CellRow]) -> BaselineEntry:
    """The reference ``rr`` against one baseline family's cells (one per ECMP seed) at one size."""
    eff = by_efficiency([rr, *cells]) if rr else False

    def values(rows: list[CellRow], value: Callable[[CellRow], float | None]) -> list[float]:
        """busbw, or busbw / link goodput when the link rates differ, of the rows that have one."""
        return [v / (r.capacity_mbps if eff else 1.0) for r in rows if (v := value(r))]

    speedup = spread = model_speedup = None
    iv = None
    if rr is not None:
        ok, ref_v = values(cells, lambda r: r.busbw_mbps), values([rr], lambda r: r.busbw_mbps)
        if ref_v and ok:
            speedup = ref_v[0] / statistics.median(ok)
            if len(ok) > 1:
                spread = (ref_v[0] / max(ok), ref_v[0] / min(ok))
        model = values(cells, lambda r: r.predicted_busbw_mbps)
        ref_m = values([rr], lambda r: r.predicted_busbw_mbps)
        if ref_m and model:
            model_speedup = ref_m[0] / statistics.median(model)
        iv = speedup_interval([rr], cells, eff)
    interval, significant = _interval_of(iv)
    return BaselineEntry(speedup=speedup, model_speedup=model_speedup, interval=interval, significant=significant,
                         by_efficiency=eff, busbw=median(c.busbw_mbps for c in cells),
                         model_busbw=median(c.predicted_busbw_mbps for c in cells), seeds=len(cells), cells=cells,
                         range=spread)


def speedup_tables(rows: list[CellRow], ref: Reference) -> list[SpeedupTable]:
    """Per (series, hosts, collective) that has reference cells: the reference's busbw over every other
    family's, per size (training rows are left out: :func:`busbw_rows`).

    Families are :meth:`CellRow.family` labels; ECMP seeds fold into one family (see :class:`BaselineEntry`).
    Sorted by series and hosts, allreduce before the other collectives.
    """
    rows = busbw_rows(rows)
    out = []
    keys = sorted({(r.series, r.hosts, r.collective != ALLREDUCE, r.collective) for r in rows if ref.matches(r)})
    for series, hosts, _, collective in keys:
        group = [r for r in rows if r.series == series and r.hosts == hosts and r.collective == collective]
        refs = {r.size: r for r in group if ref.matches(r)}
        fams: dict[str, dict[int, list[CellRow]]] = {}
        for r in group:
            if not ref.matches(r):
                fams.setdefault(r.family(), {}).setdefault(r.size, []).append(r)
        base = {fam: {size: _baseline_entry(refs.get(size), cells) for size, cells in by_size.items()}
                for fam, by_size in fams.items()}
        out.append(SpeedupTable(series=series, hosts=hosts, sizes=sorted({r.size for r in group}), reference=refs,
                                baselines=base, collective=collective))
    return out


@dataclass(frozen=True)
class ServerComparison(Speedup):
    """One NIC per accelerator (``own``) against a shared NIC (``shared``): speedup = own busbw / shared busbw."""

    family: str  # ``bigraph-2x2x2 2x4 bigraph hier``: fabric, servers x accelerators, routing, algorithm
    size: int
    own: CellRow
    shared: CellRow


def _server_comparison(o: CellRow, sh: CellRow, family: str) -> ServerComparison:
    eff = by_efficiency([o, sh])

    def per(r: CellRow, value: float | None) -> float | None:
        return value / r.capacity_mbps if value and eff else value

    interval, significant = _interval_of(speedup_interval([o], [sh], eff))
    return ServerComparison(
        speedup=ratio(per(o, o.busbw_mbps), per(sh, sh.busbw_mbps)),
        model_speedup=ratio(per(o, o.predicted_busbw_mbps), per(sh, sh.predicted_busbw_mbps)),
        interval=interval, significant=significant, by_efficiency=eff, family=family, size=o.size, own=o, shared=sh)


#: fabric (the topology slug without its servers), servers, accelerators per server, routing, seed, algorithm,
#: placement, size, collective
ServerKey = tuple[str, int | None, int | None, str, int, str, str, int, str]


def server_speedup_tables(rows: list[CellRow]) -> list[ServerComparison]:
    """One NIC per accelerator against a shared NIC, for every (fabric, servers, routing, algorithm, size,
    collective); training rows are left out (:func:`busbw_rows`).

    Cells match when everything but ``nics_per_server`` and the NIC placement is the same; sorted by that key.
    """
    def key(r: CellRow) -> ServerKey:
        return (r.topology_slug.split("-srv")[0], r.servers, r.accels_per_server, r.routing, r.seed, r.algorithm,
                r.placement, r.size, r.collective)

    own: dict[ServerKey, CellRow] = {}
    shared: dict[ServerKey, CellRow] = {}
    for r in busbw_rows(rows):
        if r.servers is None or r.nics_per_server is None:
            continue
        if r.nics_per_server == r.accels_per_server and r.nics_per_server > 1:
            own[key(r)] = r
        elif r.nics_per_server == 1:
            shared[key(r)] = r
    out = []
    for k in sorted(set(own) & set(shared)):
        fabric, servers, accels, policy, seed, algo, _, _, collective = k
        routing_label = routing.label(policy, seed)
        if collective != ALLREDUCE:
            algo = f"{collective}-{algo}"
        out.append(_server_comparison(own[k], shared[k], f"{fabric} {servers}x{accels} {routing_label} {algo}"))
    return out
