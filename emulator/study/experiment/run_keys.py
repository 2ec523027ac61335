"""One entry of a series' ``runs``: its topology, routings, algorithms, placements, sizes, faults, fabric and
workload (a training iteration), or an MPI program (:mod:`~emulator.study.experiment.mpi_keys`).

Every check is against the run's own topology, built here: links the spec
leaves unset run at the fabric profile's emulated rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from emulator.base.errors import MAX_LINE, MISSING, FieldError, UserError, int_field, printable, shorten
from emulator.model import fabric, routing, topology
from emulator.model.collectives import registry
from emulator.model.collectives.placements import PLACEMENTS, placement_hosts
from emulator.model.fabric import FabricChoice
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.model.workloads import llm, llm_models, training
from emulator.runs import fault_plan as faults
from emulator.study.experiment.cells import Run, Workload
from emulator.study.experiment.fabric_keys import auto_dilation_field, fabric_field, has_fabric_keys, level_choice
from emulator.study.experiment.fields import (
    choices_field,
    list_field,
    mapping_field,
    reject_unknown,
    seeds_field,
    sizes_field,
)
from emulator.study.experiment.mpi_keys import mpi_run, reject_beside_mpi

RUN_KEYS = ("topology", "routing", "algorithms", "placements", "seeds", "sizes", "faults", "fabric", "link_mbps",
            "dilation",
            "collective", "model", "batch", "scale", "llm", "mpi")
#: A language model's split (``llm:``), beside ``model``, ``batch`` (sequences per microbatch) and ``scale``.
LLM_KEYS = ("tp", "pp", "ep", "microbatches", "sequence_parallel", "layers_per_collective", "accelerator")


def run_entry(where: str, rp: str, raw: object, enclosing: FabricChoice, repeat: int) -> Run:
    """One entry of a series' ``runs`` at field ``rp``; ``enclosing``: the series' fabric, else the experiment's
    (and whether a level names its dilation)."""
    run = mapping_field(where, rp, raw)
    reject_unknown(where, f"{rp}.", run, RUN_KEYS)
    if "mpi" in run:
        reject_beside_mpi(where, rp, run)
    for key in ("topology", "routing") if "mpi" in run else ("topology", "routing", "algorithms"):
        if key not in run:
            raise FieldError(where, f"{rp}.{key}", "a value (see experiments/README.md)", MISSING)
    own = auto_dilation_field(where, run, f"{rp}.")
    auto = _run_auto(where, rp, run, own)
    rprofile = fabric_field(where, run, f"{rp}.", enclosing.profile) if has_fabric_keys(run) else None
    choice = level_choice(own, rprofile, enclosing)
    # an MPI program's ranks of one server talk through its switch: no interconnect
    # (emulator.emulation.agents.interconnect)
    network = _network(where, f"{rp}.topology", run["topology"], choice, interconnect="mpi" not in run)
    topo = network.topology
    if network.profile != choice.profile:  # the topology's own rate set the dilation: the run has a fabric of its own
        rprofile = network.profile
    policies = _routings(where, f"{rp}.routing", run["routing"], topo)
    if "mpi" in run:
        return mpi_run(where, rp, run, topo, policies, rprofile)
    collective, workload = _collective(where, rp, run, topo)
    llm_run = workload is not None and workload.is_llm
    algos = choices_field(where, f"{rp}.algorithms", run["algorithms"],
                          llm.DP_ALGOS if llm_run else registry.algorithms(collective))
    if llm_run and "placements" in run:
        raise FieldError(where, f"{rp}.placements", "nothing for a language model (its ranks are placed in "
                         "Megatron-LM's order: docs/schedule-format.md)", run["placements"])
    placements = ("megatron",) if llm_run else _placements(where, rp, run, topo, collective, algos)
    return Run(topology=topo.spec, routing=policies, algorithms=algos, placements=placements,
               seeds=seeds_field(where, f"{rp}.seeds", run["seeds"]) if "seeds" in run else None,
               sizes=sizes_field(where, f"{rp}.sizes", run["sizes"]) if "sizes" in run else None,
               faults=_faults(where, f"{rp}.faults", run["faults"], topo, repeat) if "faults" in run else (),
               fabric=rprofile, collective=collective, workload=workload, dilation_auto=auto)


def _run_auto(where: str, rp: str, run: Mapping[str, Any], auto: bool | None) -> bool | None:
    """The run's ``dilation`` setting (``auto``: :func:`auto_dilation_field`'s of its keys); a topology spec that
    sets a link rate (or a server's PCIe rate) is explicit too."""
    spec = run.get("topology")
    try:
        rated = isinstance(spec, str | Mapping) and (topology.sets_link_rate(spec) or "pcie_bw" in spec)
    except FieldError:  # a malformed spec: the topology field says so
        rated = False
    if rated and auto:
        raise FieldError(where, f"{rp}.dilation", "auto with a topology spec that sets no link rate "
                         "(or leave dilation out)", run.get("dilation"))
    return False if rated else auto


def _network(where: str, name: str, value: object, choice: FabricChoice, interconnect: bool) -> fabric.Resolved:
    """The run's topology on its fabric, by :func:`emulator.model.fabric.resolve`'s rule: a topology whose host
    links have a rate of their own sets the dilation unless a level names it; the links it leaves unset run at
    the fabric's emulated rate; its servers' interconnect, where the fabric has one (and ``interconnect``), at
    the fabric's ratio to its host links."""
    if not isinstance(value, str | Mapping):
        raise FieldError(where, name, "a topology spec such as 'fattree:k=4' or a mapping with kind:", value)
    try:
        return fabric.resolve(value, choice, interconnect=interconnect, where=f"{where}: {name}")
    except FieldError as exc:
        raise FieldError(where, f"{name}.{exc.field}", exc.expected, exc.given) from None
    except UserError as exc:
        raise UserError(f"{printable(where)}: field '{name}': {shorten(printable(exc), MAX_LINE)}") from None


def _routings(where: str, name: str, value: object, topo: topology.Topology) -> tuple[str, ...]:
    """Routing policies, each one that ``topo`` supports."""
    policies = choices_field(where, name, value, tuple(routing.POLICIES))
    for i, policy in enumerate(policies):
        try:
            routing.check_policy(topo, policy)
        except FieldError as exc:
            raise FieldError(where, f"{name}[{i}]", exc.expected, exc.given) from None
    return policies


def _collective(where: str, rp: str, run: Mapping[str, Any], topo: topology.Topology
                ) -> tuple[str, Workload | None]:
    """The run's collective and its training iteration, if any (which allreduces, and has its own sizes)."""
    collective = run.get("collective", ALLREDUCE)
    if collective not in registry.GENERATED:
        raise FieldError(where, f"{rp}.collective", f"one of {', '.join(registry.GENERATED)} (one per run)",
                         collective)
    workload = _workload(where, rp, run, topo)
    if workload is not None and collective != ALLREDUCE:
        raise FieldError(where, f"{rp}.collective", f"allreduce for a {workload.model} iteration (DDP allreduces "
                         "its gradients)", collective)
    if workload is not None and "sizes" in run:
        raise FieldError(where, f"{rp}.sizes", f"nothing: a {workload.model} iteration has its own sizes",
                         run["sizes"])
    return collective, workload


def _workload(where: str, rp: str, run: Mapping[str, Any], topo: topology.Topology) -> Workload | None:
    """A run's ``model`` (with ``batch``, ``scale`` and a language model's ``llm``), or None for a collective
    per size."""
    if "model" not in run:
        for key in ("batch", "scale", "llm"):
            if key in run:
                raise FieldError(where, f"{rp}.{key}", "a model to go with it (model: resnet50)", run[key])
        return None
    name = choices_field(where, f"{rp}.model", run["model"], (*training.MODELS, *llm_models.MODELS))[0]
    batch = int_field(where, f"{rp}.batch", run["batch"], 1, 1 << 16) if "batch" in run else None
    scale = training.check_scale(run.get("scale", 1), where, f"{rp}.scale")
    if name not in llm_models.MODELS:
        if "llm" in run:
            raise FieldError(where, f"{rp}.llm", f"nothing for {name} (a data-parallel model)", run["llm"])
        return Workload(name, batch, scale)
    return _llm_workload(where, rp, run, topo, Workload(name, batch, scale))


def _llm_workload(where: str, rp: str, run: Mapping[str, Any], topo: topology.Topology,
                  base: Workload) -> Workload:
    """A language model's split from the run's ``llm`` mapping, checked against the topology's hosts."""
    if "llm" not in run:
        raise FieldError(where, f"{rp}.llm", "a mapping with tp and pp (and ep, microbatches, ...) for "
                         f"{base.model}", MISSING)
    raw = mapping_field(where, f"{rp}.llm", run["llm"])
    reject_unknown(where, f"{rp}.llm.", raw, LLM_KEYS)
    ints = {key: int_field(where, f"{rp}.llm.{key}", raw.get(key, default), 1, 1 << 16)
            for key, default in (("tp", 1), ("pp", 1), ("ep", 1), ("microbatches", llm.DEFAULT_MICROBATCHES),
                                 ("layers_per_collective", 1))}
    sp = raw.get("sequence_parallel", False)
    if not isinstance(sp, bool):
        raise FieldError(where, f"{rp}.llm.sequence_parallel", "true or false", sp)
    acc = raw.get("accelerator", "a100")
    if acc not in llm_models.ACCELERATORS:
        raise FieldError(where, f"{rp}.llm.accelerator", f"one of {', '.join(llm_models.ACCELERATORS)}", acc)
    w = replace(base, tp=ints["tp"], pp=ints["pp"], ep=ints["ep"], microbatches=ints["microbatches"],
                layers_per_collective=ints["layers_per_collective"], sequence_parallel=sp, accelerator=acc)
    hosts = len(topo.hosts)
    if hosts % (w.tp * w.pp):
        raise FieldError(where, f"{rp}.llm.pp", f"tp x pp dividing the {hosts} hosts of {topo.spec}", w.pp)
    try:
        w.llm_config(hosts).check(hosts)
    except FieldError as exc:
        raise FieldError(where, f"{rp}.llm.{exc.field}", exc.expected, exc.given) from None
    return w


def _placements(where: str, rp: str, run: Mapping[str, Any], topo: topology.Topology, collective: str,
                algos: tuple[str, ...]) -> tuple[str, ...]:
    """The run's placements (default ``identity``), each fitting ``topo``; and the placement an algorithm of
    ``algos`` is defined on (hdrm's), if any."""
    placements = (choices_field(where, f"{rp}.placements", run["placements"], PLACEMENTS)
                  if "placements" in run else ("identity",))
    for i, placement in enumerate(placements):
        _check_placement(where, f"{rp}.placements[{i}]", topo, placement)
    for i, algo in enumerate(algos):
        registry.check_topology_groups(collective, algo, topo, where, f"{rp}.algorithms[{i}]")
        own = registry.required_placement(collective, algo)
        if own is not None:
            _check_placement(where, f"{rp}.algorithms[{i}]", topo, own)
    return placements


def _faults(where: str, name: str, value: object, topo: topology.Topology, repeat: int) -> tuple[str, ...]:
    """Fault specs checked against the topology (steps are checked per cell in
    :func:`~emulator.study.experiment.prediction.prepare`)."""
    plan = faults.parse_faults(list_field(where, name, value), topo, len(topo.hosts), 1 << 30, repeat,
                               where=f"{where}: {name}")
    return tuple(f.describe() for f in plan)


def _check_placement(where: str, name: str, topo: topology.Topology, placement: str) -> None:
    try:
        placement_hosts(topo, placement)
    except FieldError as exc:
        raise FieldError(where, name, f"a placement that fits {topo.spec}: {exc.expected}", placement) from None
