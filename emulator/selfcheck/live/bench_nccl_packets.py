"""``emu bench``'s NCCL section (live): NCCL's all-reduce on the bench's clusters of H100 servers, at NCCL's own
choice per size, replayed as packets beside NCCL's model (:mod:`emulator.emulation.session.nccl_packets`, as
``emu nccl-tests --packets`` runs it), one row per cluster and size."""

from __future__ import annotations

import os
from collections.abc import Callable

from emulator.base.errors import UserError
from emulator.emulation.session import nccl_packets as packets
from emulator.model import fabric
from emulator.model.nccl import cost
from emulator.model.nccl.system import System, system_on
from emulator.runs.nccl_packets import NotRun
from emulator.selfcheck.bench.cases import (
    NCCL_PACKET_CLUSTERS,
    NCCL_PACKET_FABRIC,
    NCCL_PACKET_GPU,
    NCCL_PACKET_NOT_RUN,
    NCCL_PACKET_REPEAT,
    NCCL_PACKET_SIZES,
)
from emulator.selfcheck.bench.rows import NcclPacketRow, SectionError

COLLECTIVE = "allreduce"


def run_nccl_packets(out_dir: str, gate: packets.Gate, echo: Callable[[str], None],
                     clusters: tuple[tuple[int, int], ...] = NCCL_PACKET_CLUSTERS,
                     sizes: tuple[int, ...] = NCCL_PACKET_SIZES,
                     on_rows: Callable[[list[NcclPacketRow]], None] = lambda rows: None) -> list[NcclPacketRow]:
    """Every cluster's sizes planned, admitted and replayed in turn (the emulated rate auto per size), but those of
    an algorithm in :data:`~emulator.selfcheck.bench.cases.NCCL_PACKET_NOT_RUN` (unchecked rows saying why). A
    cluster whose cells are refused, or whose run fails, gets failed rows saying why, and the others still run;
    ``on_rows`` gets the rows so far after every cluster (the bench saves them)."""
    profile = fabric.parse(NCCL_PACKET_FABRIC, where="bench: nccl packets")
    rows: list[NcclPacketRow] = []
    for nodes, gpus in clusters:
        rows += _cluster_rows(system_on(profile, nodes, gpus, NCCL_PACKET_GPU), out_dir, gate, echo, sizes)
        on_rows(list(rows))
    return rows


def _cluster_rows(system: System, out_dir: str, gate: packets.Gate, echo: Callable[[str], None],
                  sizes: tuple[int, ...]) -> list[NcclPacketRow]:
    nodes, gpus = system.nodes, system.gpus_per_node
    label = f"{nodes} x {gpus}"
    predictions = [cost.predict(system, COLLECTIVE, size) for size in sizes]
    held = [NotRun(p, NCCL_PACKET_NOT_RUN[p.algorithm]) for p in predictions if p.algorithm in NCCL_PACKET_NOT_RUN]
    predictions = [p for p in predictions if p.algorithm not in NCCL_PACKET_NOT_RUN]
    options = packets.Options(os.path.join(out_dir, f"nccl-{nodes}x{gpus}"), None, NCCL_PACKET_REPEAT)
    try:
        planned, skipped = packets.plan(system, COLLECTIVE, predictions, options, gate)
        measured = packets.run(planned, echo=lambda line: None)
    except UserError as exc:
        echo(f"  {label}: refused: {exc}")
        return _by_size([NcclPacketRow.failed(label, p, str(exc)) for p in predictions] +
                        [NcclPacketRow.not_run(label, s) for s in held])
    except Exception as exc:  # one cluster's failure is its rows', not the section's
        error = SectionError.of(exc).error
        echo(f"  {label}: failed: {error}")
        return _by_size([NcclPacketRow.failed(label, p, error) for p in predictions] +
                        [NcclPacketRow.not_run(label, s) for s in held])
    found = _by_size([NcclPacketRow.measured(label, m) for m in measured] +
                     [NcclPacketRow.not_run(label, s) for s in [*skipped, *held]])
    for row in found:
        ratio = f"{row.ratio:.3f} of the model" if row.ratio is not None else row.why_not_run or "-"
        echo(f"  {label} {row.size} B {row.choice}: {ratio} ({row.verdict})")
    return found


def _by_size(rows: list[NcclPacketRow]) -> list[NcclPacketRow]:
    return sorted(rows, key=lambda r: r.size)
