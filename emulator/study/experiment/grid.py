"""Grid expansion: every series' runs become :class:`~emulator.study.experiment.cells.Cell` objects.

One cell per topology x routing x ECMP seed x algorithm x placement x size,
each with a stable, readable id such as
``compare.leafspine-4x4x4.ecmp-s1.hd.512KiB`` (the id names the cell's
directory, so a cell keeps its id across runs of the same file); an MPI run
gives one cell per topology x routing x ECMP seed x placement, e.g.
``mpi.bigraph-2x2x2.bigraph.mpi-emu-allreduce-bench-ring-hdrm.np8``.
:func:`groups` orders cells so a network comes up once per (topology,
routing, seed, fabric).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.base.errors import FieldError
from emulator.model import fabric, routing, topology
from emulator.model.collectives import registry
from emulator.model.fabric import FabricProfile
from emulator.model.schedule.format import format_size
from emulator.model.schedule.semantics import qualified
from emulator.study.experiment.cells import Cell, Experiment, Run, Series

#: A network's cells share it: (topology, routing, seed, fabric profile's spec).
GroupKey = tuple[str, str, int, str]


def topology_slug(spec: str, link_mbps: float) -> str:
    """``leafspine:leaves=4,spines=4,hosts_per_leaf=4,...`` -> ``leafspine-4x4x4`` (+ rates if not the default)."""
    kind, params = topology.parse_spec(spec)
    dims = "x".join(str(params[k]) for k in topology.fabric_keys(kind))
    slug = f"{kind}-{dims}"
    if params["host_bw"] != link_mbps or params["switch_bw"] != link_mbps:
        slug += f"-h{params['host_bw']:g}-s{params['switch_bw']:g}"
    if "servers" in params:
        # servers x accelerators, NICs each, their placement; PCIe rate when not the NIC's
        slug += (f"-srv{params['servers']}x{params['accels_per_server']}n{params['nics_per_server']}"
                 f"{params['nic_placement'][0]}")
        if params["pcie_bw"] != params["host_bw"]:
            slug += f"-p{params['pcie_bw']:g}"
    return slug


@dataclass(frozen=True)
class _RunSite:
    """What every cell of one run shares: where it is in the file, its topology and its fabric."""

    exp: Experiment
    series: Series
    run: Run
    field: str  # e.g. series[0].runs[2]
    kind: str
    hosts: int
    slug: str
    profile: FabricProfile

    def cell(self, cid: str, policy: str, seed: int, algorithm: str, placement: str, size: int) -> Cell:
        run, exp = self.run, self.exp
        timeout = run.mpi.timeout_s if run.mpi is not None else exp.timeout_s
        return Cell(id=cid, series=self.series.name, field=self.field, topology=run.topology, kind=self.kind,
                    hosts=self.hosts, routing=policy, seed=seed, algorithm=algorithm, placement=placement, size=size,
                    repeat=exp.repeat, warmup=exp.warmup, timeout_s=timeout, faults=run.faults, fabric=self.profile,
                    collective=run.collective, workload=run.workload, mpi=run.mpi)


def _site(exp: Experiment, ser: Series, run: Run, where_field: str) -> _RunSite:
    kind, _ = topology.parse_spec(run.topology)
    profile = exp.profile_of(ser, run)
    if run.workload is not None:
        profile = fabric.for_workload_scale(profile, run.workload.scale)
    return _RunSite(exp, ser, run, where_field, kind, len(topology.build(run.topology).hosts),
                    topology_slug(run.topology, profile.emulated_link_mbps), profile)


def expand(exp: Experiment) -> list[Cell]:
    """Every cell of the experiment in file order; :class:`FieldError` if two cells would be the same."""
    cells: list[Cell] = []
    ids: dict[str, str] = {}
    for si, ser in enumerate(exp.series):
        for ri, run in enumerate(ser.runs):
            site = _site(exp, ser, run, f"series[{si}].runs[{ri}]")
            for policy in run.routing:
                for seed in routing.seeds_of(policy, run.seeds or exp.ecmp_seeds):
                    rname = routing.label(policy, seed)
                    made = (_mpi_cells(site, rname, policy, seed) if run.mpi is not None
                            else _replay_cells(site, rname, policy, seed))
                    for cell in made:
                        _claim(ids, site, cell.id)
                        cells.append(cell)
    return cells


def _replay_cells(site: _RunSite, rname: str, policy: str, seed: int) -> list[Cell]:
    """A run's cells on one routing and seed: ``<series>.<topology>.<routing>.[<collective>-]<algo>[-<placement>]
    .<size or workload>``."""
    run, out = site.run, []
    for algo in run.algorithms:
        own = registry.required_placement(run.collective, algo)
        default = registry.own_placement(run.collective, algo)
        for placement in (own,) if own is not None else run.placements:
            aname = qualified(run.collective, algo if placement == default else f"{algo}-{placement}")
            for size in (0,) if run.workload is not None else run.sizes or site.series.sizes or site.exp.sizes:
                what = run.workload.slug if run.workload is not None else format_size(size)
                out.append(site.cell(f"{site.series.name}.{site.slug}.{rname}.{aname}.{what}", policy, seed, algo,
                                     placement, size))
    return out


def _mpi_cells(site: _RunSite, rname: str, policy: str, seed: int) -> list[Cell]:
    """An MPI run's cells: ``<series>.<topology>.<routing>.mpi-<program>[-<algo>][-<placement>].np<ranks>``."""
    program = site.run.mpi
    assert program is not None
    out = []
    for placement in site.run.placements:
        aname = program.slug if placement == "identity" else f"{program.slug}-{placement}"
        cid = f"{site.series.name}.{site.slug}.{rname}.{aname}.np{program.ranks(site.hosts)}"
        out.append(site.cell(cid, policy, seed, program.slug, placement, 0))
    return out


def _claim(ids: dict[str, str], site: _RunSite, cid: str) -> None:
    """Note that ``site``'s run makes cell ``cid``; :class:`FieldError` if an earlier run made it already."""
    if cid in ids:
        why = ("(MPI cells are named by program, --algo, placement and ranks: put runs that differ otherwise in "
               "series of their own)") if site.run.mpi is not None else ""
        raise FieldError(site.exp.source, site.field, f"runs that add new cells, not one that {ids[cid]} already "
                         f"has{' ' + why if why else ''}", cid)
    ids[cid] = site.field


def groups(cells: list[Cell]) -> list[tuple[GroupKey, list[Cell]]]:
    """Cells by (topology, routing, seed, fabric), groups in order of their first cell, cells in file order."""
    out: dict[GroupKey, list[Cell]] = {}
    for cell in cells:
        out.setdefault(cell.group, []).append(cell)
    return list(out.items())


def profiles(exp: Experiment) -> list[FabricProfile]:
    """Every distinct fabric profile the experiment's cells emulate, in file order."""
    return list(dict.fromkeys(c.fabric for c in expand(exp)))
