"""Fuzzing experiment files and ``emu run`` / ``emu run --check`` / ``emu report``.

Structured corruptions of ``experiments/tiny.yaml``, of a richer file using
every key, of training iterations and of MPI runs: :func:`emulator.study.experiment.from_dict` /
``prepare`` (what ``--check`` validates) return, or raise a one-line
:class:`UserError`. Random and hand-edited experiment *files* (bytes, text
corruptions, duplicate keys, aliases) are in ``test_hostile_inputs.py``'s
table of readers. Through the CLI, with every process-starting
edge replaced by a raiser (:func:`fuzz_support.forbid_starting`): bad input
exits 2 with one line before anything starts and creates no results folder.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import yaml
from fuzz_support import FUZZ, check_cli, cli_fixture, mutate, snapshot, user_error_or
from hypothesis import given
from hypothesis import strategies as st

from emulator.study import experiment as xp

pytestmark = pytest.mark.usefixtures(cli_fixture.__name__)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
with open(os.path.join(ROOT, "experiments", "tiny.yaml"), encoding="utf-8") as _fh:
    TINY = yaml.safe_load(_fh)
RICH = yaml.safe_load("""
name: rich
description: every key once
link_mbps: 10
repeat: 1
warmup: 0
ecmp_seeds: [0, 1]
sizes: [64KiB]
timeout_s: 30
reference: {algorithm: hdrm, routing: bigraph}
series:
  - name: a
    description: two runs
    sizes: [1KiB]
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: [bigraph, ecmp]
        algorithms: [hdrm, ring]
        placements: [random]
        seeds: [3]
      - topology: {kind: star, hosts: 4}
        routing: shortest
        algorithms: hd
        sizes: 1KiB
""")
TRAINING = yaml.safe_load("""
name: training
repeat: 1
warmup: 0
series:
  - name: t
    runs:
      - {topology: "star:hosts=4", routing: shortest, algorithms: [ring], model: resnet50, batch: 8, scale: 1000}
      - {topology: "star:hosts=4", routing: shortest, algorithms: [direct, ring], collective: allgather,
         sizes: [1KiB]}
""")
MPI = yaml.safe_load("""
name: mpi
series:
  - name: m
    runs:
      - {topology: "bigraph:upper=2,lower=2,hosts_per_switch=1", routing: [bigraph, ecmp], placements: [hdrm, random],
         seeds: [1], mpi: {program: [emu-allreduce-bench, --algo, ring, --sizes, "64KiB,1MiB"], np: 4,
                           mca: {btl_tcp_links: 2}, nice: 10, timeout_s: 60}}
      - {topology: "star:hosts=4", routing: shortest, mpi: {program: "python3 -c pass"}}
      - {topology: "star:hosts=4", routing: shortest, algorithms: [ring], sizes: [1KiB]}
""")
BASES = (TINY, RICH, TRAINING, MPI)
KEYS = tuple(sorted(set(xp.TOP_KEYS + xp.SERIES_KEYS + xp.RUN_KEYS + xp.REFERENCE_KEYS + xp.MPI_KEYS
                        + ("kind", "hosts"))))
#: ``prepare`` generates and predicts every cell (~5 ms each): only for grids this small.
PREPARE_CELLS = 4


def _check_parsed(exp: xp.Experiment | None) -> None:
    if exp is None:
        return
    cells = xp.expand(exp)
    assert cells and len({c.id for c in cells}) == len(cells)
    if len(cells) <= PREPARE_CELLS and all(c.workload is None for c in cells):  # an iteration takes ~0.5 s
        user_error_or(xp.prepare, exp)


@FUZZ
@given(data=st.data(), which=st.integers(0, len(BASES) - 1))
def test_from_dict_mutated_experiments(data, which):
    """One corrupted field of a valid experiment: an Experiment whose cells prepare, or one line of error."""
    bad = mutate(data, BASES[which], KEYS)
    _check_parsed(user_error_or(xp.from_dict, bad, "experiments/fuzz.yaml", "fuzz"))


@FUZZ
@given(data=st.data(), which=st.integers(0, len(BASES) - 1),
       flags=st.lists(st.sampled_from(["--check", "--check", "--new", "--out", "out", "--out", "", "--out", "e.yaml",
                                       "--out", "sub/dir"]), max_size=3),
       garbage=st.booleans())
def test_run_cli(data, which, flags, garbage):
    """``emu run FILE ...``: bad input exits 2 with one line, starts nothing, creates no results folder."""
    doc = data.draw(st.text(max_size=40), label="text") if garbage else mutate(data, BASES[which], KEYS)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as root:
        os.chdir(root)  # results/ (the default output) is relative to the working directory
        try:
            with open("e.yaml", "w", encoding="utf-8", errors="surrogatepass") as fh:
                fh.write(doc if isinstance(doc, str) else yaml.dump(doc, Dumper=yaml.CSafeDumper))
            before = snapshot(root)
            check_cli(["run", "e.yaml", *flags], root, before)
        finally:
            os.chdir(cwd)


@FUZZ
@given(contents=st.sampled_from(["", "{}", "[]", "x", '{"name": 1}', '{"series": []}', '{"experiment": {}, "cells": []}',
                                 '{"experiment": {}, "cells": [{"id": "a.b"}]}', '{"experiment": 1, "cells": [1]}']),
       where=st.sampled_from(["r", "r/experiment.json", "missing", ""]))
def test_report_cli(contents, where):
    """``emu report DIR`` on folders that are not results of ``emu run``: exit 2, one line."""
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "r"))
        with open(os.path.join(root, "r", "experiment.json"), "w", encoding="utf-8") as fh:
            fh.write(contents)
        check_cli(["report", os.path.join(root, where) if where else where])
