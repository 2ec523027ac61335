"""``emu-allreduce-bench`` under real Open MPI, 4 ranks on this machine over loopback only (no emulated network).

Each run takes a second or two: small sizes, few iterations.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from emulator import __version__
from emulator.base.files import read_json
from emulator.runs import allreduce_bench as mb

pytestmark = pytest.mark.integration

BENCH = os.path.join(os.path.dirname(sys.executable), "emu-allreduce-bench")
#: Loopback only: the byte transfer layer and mpirun's own channel both on lo.
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
ARGS = ["--sizes", "4KiB,256KiB", "--iters", "3", "--warmup", "1"]


@pytest.fixture(autouse=True)
def _needs_open_mpi():
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed")
    if not os.path.exists(BENCH):
        pytest.skip("emu-allreduce-bench is not installed in the venv (pip install -e .)")
    proc = subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("mpi4py is not importable")


def _mpirun(*groups: list[str]) -> subprocess.CompletedProcess[str]:
    """One job of the ``groups`` (mpirun's MPMD ``:``), each ``[-np, N, args...]`` for the benchmark."""
    argv = list(MPIRUN)
    for i, group in enumerate(groups):
        argv += ([":"] if i else []) + group[:2] + [BENCH] + group[2:]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _printed_rows(stdout: str) -> list[tuple[int, int, str, str, float, float, float, int | None]]:
    return [mb.parse_row(line) for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("algo, number", [("ring", 4), ("rabenseifner", 6), ("recursive_doubling", 3)])
def test_four_ranks_on_loopback_compute_the_sum_with_the_chosen_algorithm(tmp_path, algo, number):
    path = str(tmp_path / f"{algo}.json")
    proc = _mpirun(["-np", "4", "--algo", algo, *ARGS, "--json", path])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("#")]
    assert header[0] == f"# {mb.PROG} {__version__}: MPI_Allreduce, out of place, 4 ranks"
    assert header[1].startswith("# MPI library: Open MPI v")
    assert header[2].startswith(f"# algorithm: {algo} (coll_tuned_allreduce_algorithm={number}, ")
    # Open MPI's MPI_T reads back what the program set before MPI_Init
    assert header[3] == f"# MPI_T reads coll_tuned_allreduce_algorithm={number}, coll_tuned_use_dynamic_rules=1"
    printed = _printed_rows(proc.stdout)
    rows = mb.load_rows(path)
    assert [(r.size, r.count) for r in rows] == [(4096, 1024), (262144, 65536)]
    assert [(p[0], p[1], p[2], p[3], p[7]) for p in printed] == [
        (4096, 1024, "float32", "sum", 0), (262144, 65536, "float32", "sum", 0)]
    for row in rows:
        assert row.wrong == 0 and row.time_s > 0 and row.busbw_mbps > 0
        assert row.busbw_mbps == pytest.approx(row.algbw_mbps * 1.5)  # 2 (p - 1) / p on 4 ranks
    doc = read_json(path)
    assert doc is not None and doc["ranks"] == 4 and doc["algorithm"] == algo
    assert doc["ompi_algorithm_id"] == number and doc["algorithm_verified"] is True
    assert [host["rank"] for host in doc["hosts"]] == [0, 1, 2, 3]


def test_ranks_that_disagree_on_the_data_type_get_wrong_data_and_status_1(tmp_path):
    # Erroneous MPI, honestly: two ranks add float32 bits, two int32 bits (4 bytes each, so the same messages).
    path = str(tmp_path / "mixed.json")
    proc = _mpirun(["-np", "2", "--algo", "ring", *ARGS, "--dtype", "float32", "--json", path],
                   ["-np", "2", "--algo", "ring", *ARGS, "--dtype", "int32"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = mb.load_rows(path)
    assert [row.wrong for row in rows] == [1024 * 4, 65536 * 4]  # every element on every rank
    assert [p[7] for p in _printed_rows(proc.stdout)] == [4096, 262144]


def test_a_bad_argument_under_mpirun_is_one_line_from_rank_0():
    proc = _mpirun(["-np", "4", "--algo", "rin", *ARGS])
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith(mb.PROG)]
    assert lines == [f"{mb.PROG}: field 'algo': expected one of default, basic_linear, nonoverlapping, "
                     "recursive_doubling, ring, segmented_ring, rabenseifner, halving_doubling, got 'rin'"]
