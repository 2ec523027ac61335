"""The experiment file (``experiments/*.yaml``, documented in ``experiments/README.md``): reading it, its top
level and its series.

:func:`load` / :func:`from_dict` parse and validate it into a frozen
:class:`~emulator.study.experiment.cells.Experiment`; unknown keys and bad
values raise :class:`~emulator.base.errors.FieldError` naming the file and
the field, e.g. ``experiments/default.yaml: field 'series[1].sizes[0]':
...``. A run's keys are read by :mod:`~emulator.study.experiment.run_keys`,
the fabric keys by :mod:`~emulator.study.experiment.fabric_keys`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from emulator.base.documents import parse_text
from emulator.base.errors import MISSING, FieldError, printable
from emulator.base.files import read_text
from emulator.model import fabric, routing
from emulator.model.collectives.registry import algorithms
from emulator.model.fabric import FabricChoice
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.study.experiment.cells import (
    DEFAULT_REFERENCE,
    DEFAULT_REPEAT,
    DEFAULT_SEEDS,
    DEFAULT_SIZES,
    DEFAULT_WARMUP,
    Experiment,
    Series,
)
from emulator.study.experiment.fabric_keys import auto_dilation_field, fabric_field, has_fabric_keys, level_choice
from emulator.study.experiment.fields import (
    choices_field,
    list_field,
    mapping_field,
    max_time_field,
    name_field,
    reject_unknown,
    repeat_field,
    seeds_field,
    sizes_field,
    string_field,
    timeout_field,
    warmup_field,
)
from emulator.study.experiment.grid import expand
from emulator.study.experiment.run_keys import run_entry

TOP_KEYS = ("name", "description", "fabric", "link_mbps", "dilation", "repeat", "warmup", "ecmp_seeds", "sizes", "timeout_s",
            "max_time", "reference", "series")
SERIES_KEYS = ("name", "description", "fabric", "link_mbps", "dilation", "sizes", "runs")
REFERENCE_KEYS = ("algorithm", "routing")


def load(path: str) -> Experiment:
    """Read and validate an experiment file; :class:`UserError` for anything wrong."""
    data = parse_text(read_text(path, f"experiment file {path!r}"), printable(path))
    default_name = os.path.splitext(os.path.basename(path))[0]
    return from_dict(data, where=path, default_name=default_name)


def from_dict(data: object, where: str = "experiment", default_name: str = "experiment") -> Experiment:
    """Validate a parsed experiment file (see ``experiments/README.md``).

    Fields are checked in file order (top level, then each series and its
    runs), so the first mistake is the one reported; the grid is expanded
    once at the end because duplicate cells are an error of the file.
    """
    top = mapping_field(where, "(top level)", data)
    reject_unknown(where, "", top, TOP_KEYS)
    name = name_field(where, "name", top.get("name", default_name))
    description = string_field(where, "description", top.get("description", ""))
    auto = auto_dilation_field(where, top, "")
    profile = fabric_field(where, top, "", fabric.default())
    choice = level_choice(auto, profile, FabricChoice(fabric.default()))
    repeat = repeat_field(where, top.get("repeat", DEFAULT_REPEAT))
    warmup = warmup_field(where, top.get("warmup", DEFAULT_WARMUP))
    seeds = seeds_field(where, "ecmp_seeds", top["ecmp_seeds"]) if "ecmp_seeds" in top else DEFAULT_SEEDS
    sizes = sizes_field(where, "sizes", top["sizes"]) if "sizes" in top else DEFAULT_SIZES
    timeout = timeout_field(where, top.get("timeout_s"))
    max_time = max_time_field(where, top.get("max_time"))
    ref = _reference(where, top)
    if "series" not in top:
        raise FieldError(where, "series", "a non-empty list of series (name, runs)", MISSING)
    series_list: list[Series] = []
    for si, raw_series in enumerate(list_field(where, "series", top["series"])):
        series_list.append(_series(where, f"series[{si}]", raw_series, choice, repeat,
                                   {s.name for s in series_list}))
    exp = Experiment(name=name, series=tuple(series_list), description=description, fabric=profile,
                     link_mbps=profile.emulated_link_mbps, repeat=repeat, warmup=warmup, ecmp_seeds=seeds,
                     sizes=sizes, timeout_s=timeout, reference=ref, source=where, dilation_auto=auto is not False,
                     max_time_s=max_time)
    expand(exp)  # duplicate cells are an error of the file
    return exp


def _reference(where: str, top: Mapping[str, Any]) -> dict[str, str]:
    """The reference the report compares against: :data:`DEFAULT_REFERENCE` with the file's ``reference`` keys."""
    ref = dict(DEFAULT_REFERENCE)
    if "reference" not in top:
        return ref
    raw = mapping_field(where, "reference", top["reference"])
    reject_unknown(where, "reference.", raw, REFERENCE_KEYS)
    if "algorithm" in raw:
        ref["algorithm"] = choices_field(where, "reference.algorithm", raw["algorithm"], algorithms(ALLREDUCE))[0]
    if "routing" in raw:
        ref["routing"] = choices_field(where, "reference.routing", raw["routing"], tuple(routing.POLICIES))[0]
    return ref


def _series(where: str, sp: str, raw: object, enclosing: FabricChoice, repeat: int, taken: set[str]) -> Series:
    """One entry of ``series`` at field ``sp``; ``enclosing``: the experiment's fabric (and whether it names its
    dilation); ``taken``: the names of the series before it."""
    ser = mapping_field(where, sp, raw)
    reject_unknown(where, f"{sp}.", ser, SERIES_KEYS)
    if "name" not in ser:
        raise FieldError(where, f"{sp}.name", "a name for the series", MISSING)
    sname = name_field(where, f"{sp}.name", ser["name"])
    if sname in taken:
        raise FieldError(where, f"{sp}.name", "a name no other series has", sname)
    sdesc = string_field(where, f"{sp}.description", ser.get("description", ""))
    sauto = auto_dilation_field(where, ser, f"{sp}.")
    sprofile = fabric_field(where, ser, f"{sp}.", enclosing.profile) if has_fabric_keys(ser) else None
    choice = level_choice(sauto, sprofile, enclosing)
    ssizes = sizes_field(where, f"{sp}.sizes", ser["sizes"]) if "sizes" in ser else None
    if "runs" not in ser:
        raise FieldError(where, f"{sp}.runs", "a non-empty list of runs (topology, routing, algorithms)", MISSING)
    runs = tuple(run_entry(where, f"{sp}.runs[{ri}]", raw_run, choice, repeat)
                 for ri, raw_run in enumerate(list_field(where, f"{sp}.runs", ser["runs"])))
    return Series(name=sname, runs=runs, sizes=ssizes, description=sdesc, fabric=sprofile, dilation_auto=sauto)
