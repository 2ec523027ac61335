"""The timing model's prediction beside an ``emu mpirun`` of ``emu-allreduce-bench``.

Open MPI's allreduce algorithms (``coll tuned``, :data:`emulator.runs.allreduce_bench.ALGORITHMS`) move
the same data between the same ranks, step by step, as these schedule generators
(:mod:`emulator.model.collectives.generators`), in Open MPI's rank order (rank ``r`` on the ``r``-th host of the
run) -- the mapping is :data:`GENERATOR_OF`:

* ``ring``: ``ring`` (``p`` blocks, reduce-scatter then all-gather to rank ``r+1``);
* ``segmented_ring``: ``ring``, when the segment size is Open MPI's default (0: it then runs the plain ring);
* ``rabenseifner``: ``hd`` (recursive halving from distance 1, recursive doubling back; for ``p`` not a
  power of two, ranks ``2i < 2x`` hand their buffer to ``2i+1`` first);
* ``recursive_doubling``: ``rd`` (the whole buffer swapped and added, distance 1 first).

Where Open MPI itself runs another algorithm (:func:`open_mpi_generator`: ring with fewer elements than
ranks runs recursive doubling; Rabenseifner with fewer elements than the largest power of two <= ranks
runs basic_linear), the prediction follows it or says why there is none. ``default`` (Open MPI chooses
by its own rules), ``basic_linear`` and ``nonoverlapping`` (a reduce to rank 0, then a broadcast) are not
predicted.

The schedule is predicted on the run's topology and routing (:func:`emulator.model.prediction.check.check`)
with the latency model the run's messages get. Under ``ecmp`` each connection's path depends on its
ports: :func:`btl_flow_function` gives the model the ports Open MPI's TCP connections had (the
controller's log of what it learned), so the prediction routes them as the switches did. Pure: no
processes, no files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from emulator.base.errors import UserError
from emulator.model import routing
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import check
from emulator.model.prediction.cost import FlowOf
from emulator.model.schedule.format import RankProgram, Schedule
from emulator.model.topology import DEFAULT_MTU, Topology
from emulator.model.topology import build as build_topology
from emulator.runs import allreduce_bench as mpi_bench
from emulator.runs.mpi_plan import BTL_PORT_MIN, BTL_PORT_RANGE

#: The MCA parameter of segmented ring's segment size (bytes; 0, Open MPI's default, runs the plain ring).
SEGMENT_SIZE_MCA = "coll_tuned_allreduce_algorithm_segmentsize"

#: Open MPI's allreduce algorithm -> the generator making its transfers.
GENERATOR_OF = {"ring": "ring", "segmented_ring": "ring", "rabenseifner": "hd", "recursive_doubling": "rd"}


def open_mpi_generator(algorithm: str, count: int, ranks: int, segment_bytes: int = 0) -> tuple[str | None, str]:
    """The generator of what Open MPI 4.1 runs for ``algorithm`` on ``count`` elements over ``ranks`` ranks,
    and a note (why none, or what Open MPI did instead); ``segment_bytes`` is segmented ring's segment size."""
    if algorithm == "ring" and count < ranks:
        return "rd", f"Open MPI runs recursive doubling for ring with fewer elements ({count}) than ranks"
    if algorithm == "segmented_ring" and segment_bytes:
        return None, f"segmented ring with {segment_bytes}-byte segments is not modelled (segment size 0 is)"
    if algorithm == "rabenseifner" and count < 1 << (ranks.bit_length() - 1):
        return None, (f"Open MPI runs basic_linear for rabenseifner with fewer elements ({count}) than the "
                      "largest power of two <= ranks")
    if algorithm not in GENERATOR_OF:
        return None, f"{algorithm} is not modelled (predicted: {', '.join(GENERATOR_OF)})"
    return GENERATOR_OF[algorithm], ""


def open_mpi_schedule(generator: str, size: int, hosts: Sequence[str]) -> Schedule:
    """The schedule of ``generator`` on ``size`` bytes per rank with rank ``r`` on ``hosts[r]``.

    Raises :class:`UserError` (a :class:`~emulator.base.errors.FieldError`) when the generator cannot split
    ``size`` over the ranks in whole elements."""
    base = generators.generate(generator, build_topology(f"star:hosts={len(hosts)}"), size)
    ranks = tuple(RankProgram(r.rank, host, r.ops) for r, host in zip(base.ranks, hosts, strict=True))
    return replace(base, ranks=ranks, topology=None, placement="mpirun")


def btl_flow_function(connections: Iterable[tuple[str, str, int, int]], topo: Topology, policy: str,
                      seed: int = 0) -> FlowOf:
    """The 5-tuple each pair of hosts' TCP-transport connection had under ``policy`` (one that hashes
    5-tuples), from the connections the controller learned (host, host, port, port): the one end of each with
    a port in the transport's range listened.

    The controller learns a connection only where its path has a choice; a pair whose path has
    none routes the same whatever its ports, and gets placeholder ports. Raises :class:`KeyError` for a pair
    with a choice on its path and no connection learned."""
    ports: dict[tuple[str, str], tuple[int, int]] = {}
    for a, b, pa, pb in connections:
        if BTL_PORT_MIN <= pa < BTL_PORT_MIN + BTL_PORT_RANGE or BTL_PORT_MIN <= pb < BTL_PORT_MIN + BTL_PORT_RANGE:
            ports.setdefault((a, b), (pa, pb))
            ports.setdefault((b, a), (pb, pa))

    def flow_of(src: str, dst: str, lane: int = 0) -> routing.Flow:
        if (src, dst) in ports:
            sport, dport = ports[(src, dst)]
            return routing.Flow(src, dst, routing.IPPROTO_TCP, sport, dport)
        placeholder = routing.Flow(src, dst, routing.IPPROTO_TCP, BTL_PORT_MIN, BTL_PORT_MIN)
        if routing.learned_entries(topo, policy, placeholder, seed=seed):
            raise KeyError((src, dst))
        return placeholder

    return flow_of


@dataclass(frozen=True)
class MpiPrediction:
    """One benchmark row beside the model: ``predicted_s`` the timing model's time of one allreduce (emulated
    seconds; None with ``note`` saying why), ``measured_s`` the benchmark's."""

    size: int
    algorithm: str
    generator: str | None
    measured_s: float
    predicted_s: float | None
    note: str = ""

    @property
    def measured_over_predicted(self) -> float | None:
        return self.measured_s / self.predicted_s if self.predicted_s else None

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "algorithm": self.algorithm, "generator": self.generator,
                "measured_s": self.measured_s, "predicted_s": self.predicted_s,
                "measured_over_predicted": self.measured_over_predicted, "note": self.note}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MpiPrediction:
        return cls(int(data["size"]), str(data["algorithm"]), data.get("generator"), float(data["measured_s"]),
                   data.get("predicted_s"), str(data.get("note") or ""))


@dataclass(frozen=True)
class PredictionInput:
    """What a prediction of a run needs besides its rows: the fabric, its routing, the ranks' hosts, the
    latency its messages get, and the connections' 5-tuples where ``ecmp`` routes by them (None: unknown)."""

    topo: Topology
    routing: str
    seed: int
    hosts: tuple[str, ...]
    latency: LatencyModel
    mtu: int = DEFAULT_MTU
    flow_of: FlowOf | None = None


def predict_row(algorithm: str, size: int, count: int, measured_s: float, given: PredictionInput,
                segment_bytes: int = 0) -> MpiPrediction:
    """One benchmark row (``count`` elements, ``size`` bytes, ``measured_s`` per allreduce) beside the model."""
    generator, note = open_mpi_generator(algorithm, count, len(given.hosts), segment_bytes)
    if generator is None:
        return MpiPrediction(size, algorithm, None, measured_s, None, note)
    if routing.hashes_five_tuples(given.routing) and given.flow_of is None:
        return MpiPrediction(size, algorithm, generator, measured_s, None,
                             f"{given.routing} routes each connection by its ports, and the run's are unknown")
    try:
        schedule = open_mpi_schedule(generator, size, given.hosts)
        report = check(schedule, given.topo, given.routing, seed=given.seed, latency=given.latency,
                       mtu=given.mtu, flow_of=given.flow_of)
    except UserError as exc:
        return MpiPrediction(size, algorithm, generator, measured_s, None, str(exc))
    except KeyError as exc:
        return MpiPrediction(size, algorithm, generator, measured_s, None,
                             f"no connection of Open MPI's TCP transport was learned between {exc}")
    if not report.valid:  # a generator's schedule always proves; this would be a bug worth seeing
        return MpiPrediction(size, algorithm, generator, measured_s, None, "the schedule did not prove")
    return MpiPrediction(size, algorithm, generator, measured_s, report.predicted_time_s, note)


def predict_bench(program: Sequence[str], mca: Mapping[str, str], rows: Sequence[Mapping[str, Any]],
                  given: PredictionInput) -> list[MpiPrediction]:
    """Every row of the bundled benchmark's results beside the model; none for another program."""
    opts = mpi_bench.program_options(program)
    if opts is None:
        return []
    try:
        segment = int(mca.get(SEGMENT_SIZE_MCA, "0"))
    except ValueError:
        segment = -1  # Open MPI refuses it too; no prediction then
    return [predict_row(opts.algo, int(r["size"]), int(r["count"]), float(r["time_s"]), given, segment)
            for r in rows]


def describe(p: MpiPrediction) -> str:
    """One line of a run's output for a prediction."""
    head = f"model: {p.size} B {p.algorithm}"
    if p.predicted_s is None:
        return f"{head}: not predicted ({p.note})"
    ratio = p.measured_over_predicted
    note = f"; {p.note}" if p.note else ""
    return (f"{head} as {p.generator}: measured {p.measured_s:.4g} s, predicted {p.predicted_s:.4g} s, "
            f"measured/predicted {ratio:.2f}{note}")
