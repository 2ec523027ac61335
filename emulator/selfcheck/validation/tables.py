"""Published nccl-tests tables as typed objects: the setup a table states, the rows it posted.

Each file of ``tables/`` is one posted run (``tables/README.md`` lists them
and their sources). A setup detail the source leaves unstated is filled by one
rule for every table, and the table says which it filled
(:attr:`Table.assumptions`):

* GPU not named: ``unknown`` (an Ampere-generation PCIe card: Gen4, no NVLink);
* NICs per node not stated: one per GPU;
* GPUDirect RDMA not stated: on (NCCL's default where the NIC shares the GPU's
  PCIe switch, as in the HGX servers the tables come from);
* GPU-NIC path not stated: the same PCIe switch with GPUDirect RDMA, the same
  socket without it;
* CPU not stated: ``unknown`` (NCCL's 1 us network overhead per step, a 16 GB/s
  socket link).

A row's real time is the lower of its out-of-place and in-place times where
both were posted (a cold first iteration inflates one of them); where only the
bus bandwidth was posted, the bandwidth is what is compared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from emulator.base.documents import read_document
from emulator.base.errors import FieldError, printable, shorten
from emulator.model.nccl import system as nccl_system
from emulator.model.nccl.nccl_tests import OPS, Op
from emulator.model.nccl.system import System

TABLES_DIR = Path(__file__).parent / "tables"


@dataclass(frozen=True)
class Measured:
    """One posted size: its real time (us) or, where no time was posted, its bus bandwidth (GB/s)."""

    size: int
    time_us: float | None
    busbw_gbs: float | None
    note: str = ""


@dataclass(frozen=True)
class Table:
    """One published run: its setup as a :class:`System` and the sizes it posted."""

    name: str
    title: str
    url: str
    op: Op
    system: System | None  # None: the table lacks what any prediction needs (it says why in ``unusable``)
    algorithm: str
    protocol: str
    rows: tuple[Measured, ...]
    assumptions: tuple[str, ...]
    unusable: str = ""
    plateau_only: bool = False  # a table of peak bus bandwidths only
    min_channels: int | None = None  # NCCL_MIN_CTAS or NCCL_MIN_NCHANNELS of the stated setup


def _mapping(where: str, key: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise FieldError(where, key, "a mapping", value)
    return value


def _system(where: str, setup: dict, nodes: object, gpus: object, assumptions: list[str]) -> System:
    """The setup as a :class:`System`, its unstated details filled by the module's rules (each said in
    ``assumptions``)."""
    gpu_name = str(setup.get("gpu") or "unknown")
    gpu = nccl_system.GPUS.get(gpu_name)
    if gpu is None:
        assumptions.append(f"GPU {gpu_name} is not in the model: taken as 'unknown'")
        gpu = nccl_system.GPUS["unknown"]
    elif gpu_name == "unknown":
        assumptions.append("GPU not named: an Ampere PCIe card (Gen4, no NVLink)")
    pcie = setup.get("pcie_gen")
    if pcie is not None:
        if pcie not in nccl_system.PCIE_GBS or isinstance(pcie, bool):
            raise FieldError(where, "setup.pcie_gen", " or ".join(map(str, nccl_system.PCIE_GBS)), pcie)
        gpu = replace(gpu, pcie_gen=pcie)
    nics = setup.get("nics_per_node")
    if nics is None:
        nics = gpus
        assumptions.append("NICs per node not stated: one per GPU")
    gdr = setup.get("gdr")
    if gdr is None:
        gdr = True
        assumptions.append("GPUDirect RDMA not stated: on")
    elif not isinstance(gdr, bool):
        raise FieldError(where, "setup.gdr", "true, false or null", gdr)
    path = str(setup.get("gpu_nic_path") or "unknown")
    if path == "unknown":
        path = "same-pcie-switch" if gdr else "same-socket"
        assumptions.append(f"GPU-NIC path not stated: {path}")
    cpu = str(setup.get("cpu_vendor") or "unknown")
    if cpu not in nccl_system.SOCKET_GBS:
        assumptions.append(f"CPU {cpu} is not in the model: taken as 'unknown'")
        cpu = "unknown"
    try:
        return System(nodes=nodes, gpus_per_node=gpus, nics_per_node=nics,  # type: ignore[arg-type]
                      nic_gbps=setup.get("nic_gbps"), gpu=gpu,  # type: ignore[arg-type]
                      network=str(setup.get("network") or "infiniband"), cpu=cpu, gdr=gdr, gpu_nic_path=path)
    except FieldError as exc:
        raise FieldError(where, f"setup.{exc.field}", exc.expected, exc.given) from None


MIN_CHANNEL_SETTINGS = ("NCCL_MIN_CTAS", "NCCL_MIN_NCHANNELS")


def _min_channels(where: str, setup: dict) -> int | None:
    """The channels a stated ``NCCL_MIN_CTAS``/``NCCL_MIN_NCHANNELS`` asks for (the larger of both), else None."""
    env = setup.get("env") or []
    if not isinstance(env, list):
        raise FieldError(where, "setup.env", "a list of NAME=VALUE", env)
    found = []
    for item in env:
        name, _, value = str(item).partition("=")
        if name in MIN_CHANNEL_SETTINGS:
            if not value.isdigit() or not 1 <= int(value) <= 64:
                raise FieldError(where, f"setup.env {name}", "an integer in 1..64", value)
            found.append(int(value))
    return max(found) if found else None


def _number(where: str, key: str, value: object, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e18:
        raise FieldError(where, key, "a number > 0", value)
    return float(value)


def _rows(where: str, raw: object) -> tuple[Measured, ...]:
    if not isinstance(raw, list) or not raw:
        raise FieldError(where, "rows", "a list of posted sizes", raw)
    out = []
    for i, row in enumerate(raw):
        key = f"rows[{i}]"
        row = _mapping(where, key, row)
        size = _number(where, f"{key}.size", row.get("size"))
        times = [t for k in ("time_us", "in_place_us")
                 if (t := _number(where, f"{key}.{k}", row.get(k), optional=True)) is not None]
        busbw = row.get("busbw")
        if busbw is not None and (isinstance(busbw, bool) or not isinstance(busbw, int | float) or
                                  not 0 <= busbw < 1e9):
            raise FieldError(where, f"{key}.busbw", "GB/s >= 0, or null", busbw)
        # a posted 0.00 is a rounding of a tiny size's bandwidth: it compares nothing
        out.append(Measured(size=int(size or 0), time_us=min(times) if times else None,
                            busbw_gbs=float(busbw) if busbw else None, note=str(row.get("note") or "")))
    return tuple(out)


def _peak_tables(where: str, base: Table, setup: dict, peaks: object) -> list[Table]:
    """A file of peak bus bandwidths (Gbit/s, repetitions): one plateau-only table per peak, at its median, named
    ``<file's name>.<nodes>x<GPUs per node>``."""
    if not isinstance(peaks, list):
        raise FieldError(where, "peaks", "a list", peaks)
    out = []
    for i, raw in enumerate(peaks):
        peak = _mapping(where, f"peaks[{i}]", raw)
        assumptions: list[str] = []
        system = _system(where, setup, peak.get("nodes"), peak.get("gpus_per_node"), assumptions)
        reps = peak.get("busbw_gbit")
        if not isinstance(reps, list) or not reps:
            raise FieldError(where, f"peaks[{i}].busbw_gbit", "a list of Gbit/s", reps)
        median = sorted(_number(where, f"peaks[{i}].busbw_gbit", x) or 0.0 for x in reps)[len(reps) // 2]
        size = int(_number(where, f"peaks[{i}].min_size_for_peak", peak.get("min_size_for_peak")) or 0)
        out.append(replace(base, name=f"{base.name}.{system.nodes}x{system.gpus_per_node}", system=system, assumptions=tuple(assumptions),
                           rows=(Measured(size, None, median / 8.0, "peak bus bandwidth"),), plateau_only=True))
    return out


def load(path: str | os.PathLike) -> list[Table]:
    """The tables of one file (a file of peaks gives one table per peak)."""
    where = shorten(printable(str(path)))
    doc = _mapping(where, "(document)", read_document(str(path), where))
    setup = _mapping(where, "setup", doc.get("setup"))
    op = OPS.get(str(setup.get("op")))
    if op is None:
        raise FieldError(where, "setup.op", " or ".join(OPS), setup.get("op"))
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise FieldError(where, "name", "the table's name", name)
    source = _mapping(where, "source", doc.get("source"))
    base = Table(name=name, title=str(doc.get("title") or ""), url=str(source.get("url") or ""), op=op, system=None,
                 algorithm=str(setup.get("algo") or "auto").lower(), protocol=str(setup.get("proto") or "auto").lower(),
                 rows=(), assumptions=(), min_channels=_min_channels(where, setup))
    if doc.get("peaks"):
        return _peak_tables(where, base, setup, doc["peaks"])
    rows = _rows(where, doc.get("rows"))
    if setup.get("nic_gbps") is None:
        return [replace(base, rows=rows, unusable="the NIC's rate is not stated")]
    assumptions: list[str] = []
    system = _system(where, setup, setup.get("nodes"), setup.get("gpus_per_node"), assumptions)
    return [replace(base, rows=rows, system=system, assumptions=tuple(assumptions))]


def load_all(folder: str | os.PathLike = TABLES_DIR) -> list[Table]:
    """Every table of ``folder`` (its ``*.yaml``), by name."""
    tables = [t for path in sorted(Path(folder).glob("*.yaml")) for t in load(path)]
    return sorted(tables, key=lambda t: t.name)
