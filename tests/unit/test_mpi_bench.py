"""The pure parts of ``emu-allreduce-bench``: arguments, the algorithm table, the data, the arithmetic, rows, JSON.

Nothing here starts MPI: ``main`` is called only with arguments it refuses
before ``MPI_Init``, and a subprocess checks that importing the benchmark
does not import mpi4py.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.base.errors import FieldError, UserError
from emulator.base.files import write_json_atomic
from emulator.emulation.mpi.allreduce_bench_program import main
from emulator.runs import allreduce_bench as mb

PROG = "emu-allreduce-bench"


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------

def test_the_arguments_and_their_defaults():
    opts = mb.parse_args(["--algo", "ring", "--sizes", "64KiB,1MiB,4MiB"])
    assert opts == mb.Options(algo="ring", sizes=(65536, 2**20, 4 * 2**20), iters=20, warmup=5, dtype="float32",
                              op="sum", check=True, json_path=None)
    assert opts.algorithm_id == 4 and opts.itemsize == 4
    opts = mb.parse_args(["--algo", "halving_doubling", "--sizes", "8", "--iters", "3", "--warmup", "0",
                          "--dtype", "float64", "--no-check", "--json", "out.json"])
    assert (opts.algo, opts.algorithm_id, opts.sizes, opts.iters, opts.warmup, opts.dtype, opts.check,
            opts.json_path) == ("rabenseifner", 6, (8,), 3, 0, "float64", False, "out.json")
    assert mb.parse_args(["--algo", "default", "--sizes", "4"]).algorithm_id is None


def test_the_timed_iterations_start_in_shared_windows_unless_told_otherwise():
    opts = mb.parse_args(["--algo", "ring", "--sizes", "4", "--warmup", "0"])
    assert opts.start == "window" and opts.sizing_iterations == 1  # one untimed iteration sizes the window
    barrier = mb.parse_args(["--algo", "ring", "--sizes", "4", "--warmup", "0", "--start", "barrier"])
    assert barrier.start == "barrier" and barrier.sizing_iterations == 0
    assert mb.parse_args(["--algo", "ring", "--sizes", "4", "--warmup", "3"]).sizing_iterations == 3


def test_windows_arithmetic():
    assert mb.window_seconds(2.0) == pytest.approx(mb.WINDOW_FACTOR * 2.0)
    with pytest.raises(ValueError):
        mb.window_seconds(0.0)
    assert mb.window_starts(10.0, 3.0, 3) == [10.0, 13.0, 16.0]
    assert not mb.is_late(mb.LATE_SHARE * 3.0 * 0.9, 3.0) and mb.is_late(mb.LATE_SHARE * 3.0 * 1.1, 3.0)
    assert not mb.is_late(mb.LATE_FLOOR_S * 0.9, 0.001)  # a short window: a sleep's overshoot is not late
    assert mb.windowed_time([1.0, 2.0, 3.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        mb.windowed_time([])
    line = mb.late_line(65536, 2, 20, 0.0123)
    assert line.startswith("# WARNING: size 65536: 2 of 20 iteration starts were late (by up to 12.3 ms)")


def test_nccl_tests_style_size_ranges():
    assert mb.parse_args(["--algo", "ring", "-b", "4KiB", "-e", "64KiB", "-f", "4"]).sizes == (4096, 16384, 65536)
    assert mb.parse_args(["--algo", "ring", "-b", "4KiB", "-e", "40KiB"]).sizes == (4096, 8192, 16384, 32768)
    assert mb.parse_args(["--algo", "ring", "-b", "1MiB"]).sizes == (2**20,)


@pytest.mark.parametrize("argv, line", [
    (["--algo", "foo", "--sizes", "4"],
     "field 'algo': expected one of default, basic_linear, nonoverlapping, recursive_doubling, ring, "
     "segmented_ring, rabenseifner, halving_doubling, got 'foo'"),
    (["--sizes", "4"],
     "field 'algo': expected one of default, basic_linear, nonoverlapping, recursive_doubling, ring, "
     "segmented_ring, rabenseifner, halving_doubling, got nothing"),
    (["--algo", "ring"], "field 'sizes': expected a comma list of sizes such as 64KiB,1MiB (or -b MIN -e MAX), "
     "got nothing"),
    (["--algo", "ring", "--sizes", "1Kb"],
     "field 'sizes': expected a positive size such as 65536, 64KiB, 16MiB, 1GiB or 1MB, got '1Kb'"),
    (["--algo", "ring", "--sizes", "4KiB,,8KiB"],
     "field 'sizes': expected a positive size such as 65536, 64KiB, 16MiB, 1GiB or 1MB, got ''"),
    (["--algo", "ring", "--sizes", "0"],
     "field 'sizes': expected a positive size such as 65536, 64KiB, 16MiB, 1GiB or 1MB, got '0'"),
    (["--algo", "ring", "--sizes", "4KiB,6"], "field 'sizes': expected multiples of 4 bytes (whole float32 "
     "elements), got 6"),
    (["--algo", "ring", "--sizes", "12", "--dtype", "float64"],
     "field 'sizes': expected multiples of 8 bytes (whole float64 elements), got 12"),
    (["--algo", "ring", "--sizes", "2GiB"], "field 'sizes': expected sizes <= 1GiB, got '2GiB'"),
    (["--algo", "ring", "--sizes", "4", "--iters", "0"], "field 'iters': expected an integer in 1..1000000, got '0'"),
    (["--algo", "ring", "--sizes", "4", "--iters", "x"], "field 'iters': expected an integer in 1..1000000, got 'x'"),
    (["--algo", "ring", "--sizes", "4", "--warmup", "-1"],
     "field 'warmup': expected an integer in 0..1000000, got '-1'"),
    (["--algo", "ring", "--sizes", "4", "--dtype", "float16"],
     "field 'dtype': expected one of float32, float64, int32, got 'float16'"),
    (["--algo", "ring", "--sizes", "4", "--op", "max"], "field 'op': expected one of sum, got 'max'"),
    (["--algo", "ring", "--sizes", "4", "--start", "now"], "field 'start': expected one of window, barrier, got 'now'"),
    (["--algo", "ring", "--sizes", "4", "-b", "4"], "field 'sizes': expected either --sizes or -b/-e/-f, not both, "
     "got '4'"),
    (["--algo", "ring", "-e", "4"], "field 'minbytes': expected a size with -e/-f, got nothing"),
    (["--algo", "ring", "-b", "8", "-e", "4"], "field 'maxbytes': expected a size >= -b (8 bytes), got '4'"),
    (["--algo", "ring", "-b", "8", "-e", "1000TiB"], "field 'maxbytes': expected a size <= 1GiB, got '1000TiB'"),
    (["--algo", "ring", "-b", "8", "-f", "1"], "field 'stepfactor': expected an integer in 2..1024, got '1'"),
    (["--algo", "ring", "--sizes"], "field 'sizes': expected one argument (see emu-allreduce-bench --help)"),
    (["--algo", "ring", "--sizes", "4", "--bogus"],
     "unrecognized arguments: --bogus (see emu-allreduce-bench --help)"),
    (["--algo", "ring\n", "--sizes", "4"],
     "field 'algo': expected one of default, basic_linear, nonoverlapping, recursive_doubling, ring, "
     "segmented_ring, rabenseifner, halving_doubling, got 'ring\\n'"),
])
def test_a_bad_argument_is_one_line_and_status_2_before_mpi(argv, line, capsys, monkeypatch):
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"{PROG}: {line}\n")


def test_only_rank_0_says_what_is_wrong_with_the_arguments(capsys, monkeypatch):
    for rank, lines in (("1", 0), ("3", 0), ("0", 1)):
        monkeypatch.setenv("OMPI_COMM_WORLD_RANK", rank)
        assert main(["--algo", "foo", "--sizes", "4"]) == 2
        assert len(capsys.readouterr().err.splitlines()) == lines
    assert mb.rank_before_init({}) is None
    assert mb.rank_before_init({"PMIX_RANK": "2"}) == 2 and mb.rank_before_init({"PMI_RANK": "x"}) is None


def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    assert main(["--algo", "ring", "--sizes", "4", "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"{PROG}: field 'json': expected a file path in a directory this program can "
                                       f"write (not a directory), got {str(tmp_path)!r}\n")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(FieldError, match="field 'json'"):
        mb.check_json_path(str(blocker / "out.json"))  # its "directory" is a file
    mb.check_json_path(str(tmp_path / "new" / "dir" / "out.json"))  # write_json_atomic makes the directories


def test_importing_the_benchmark_imports_no_mpi():
    code = ("import sys, emulator.runs.allreduce_bench, emulator.emulation.mpi.allreduce_bench_program; "
            "sys.exit('mpi4py' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_help_needs_no_mpi():
    proc = subprocess.run([sys.executable, "-m", "emulator.emulation.mpi.allreduce_bench_program", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: {PROG}") and "--algo NAME" in proc.stdout


# ---------------------------------------------------------------------------
# The algorithm table and its check
# ---------------------------------------------------------------------------

def test_the_algorithm_environment():
    assert mb.algorithm_environment("default") == {}
    assert mb.algorithm_environment("rabenseifner") == {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                                                        "OMPI_MCA_coll_tuned_allreduce_algorithm": "6"}
    assert [mb.ALGORITHMS[a] for a in mb.ALGORITHMS] == [None, 1, 2, 3, 4, 5, 6]


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="Open MPI is not installed")
def test_the_algorithm_table_is_the_installed_open_mpis():
    proc = subprocess.run(["ompi_info", "--param", "coll", "tuned", "--level", "9", "--parsable"],
                          capture_output=True, text=True, timeout=60)
    prefix = "mca:coll:tuned:param:coll_tuned_allreduce_algorithm:enumerator:value:"
    table = {}
    for line in proc.stdout.splitlines():
        if line.startswith(prefix):
            number, name = line[len(prefix):].split(":", 1)
            table[name] = int(number)
    assert table.pop("ignore") == 0
    assert table == {name: number for name, number in mb.ALGORITHMS.items() if number is not None}


def test_the_algorithm_check_reads_what_was_set():
    read = {mb.CVAR_ALGORITHM: 4, mb.CVAR_DYNAMIC_RULES: 1, mb.CVAR_SEGMENT_SIZE: 0}
    assert mb.algorithm_check("ring", read) == (
        True, "MPI_T reads coll_tuned_allreduce_algorithm=4, coll_tuned_use_dynamic_rules=1")
    verified, note = mb.algorithm_check("recursive_doubling", read)
    assert verified is False and note.endswith("not 3 and 1: the rows may not be recursive_doubling")
    verified, note = mb.algorithm_check("ring", {**read, mb.CVAR_DYNAMIC_RULES: 0})
    assert verified is False
    verified, note = mb.algorithm_check("segmented_ring", {**read, mb.CVAR_ALGORITHM: 5})
    assert verified is True and note.endswith("coll_tuned_allreduce_algorithm_segmentsize=0, so Open MPI runs it "
                                              "as ring")
    assert mb.algorithm_check("default", {mb.CVAR_ALGORITHM: 0, mb.CVAR_DYNAMIC_RULES: 0})[0] is None
    verified, note = mb.algorithm_check("ring", {mb.CVAR_ALGORITHM: None, mb.CVAR_DYNAMIC_RULES: None})
    assert verified is None and "not checked" in note


# ---------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------

def test_the_pattern():
    assert mb.pattern(0, 15, "int32").tolist() == [*range(1, 14), 1, 2]
    assert mb.pattern(2, 4, "float32").tolist() == [3.0, 6.0, 9.0, 12.0]
    assert mb.pattern(1, 3, "float64").dtype == np.float64
    assert mb.expected(4, 14, "float32").tolist() == [10.0 * (j + 1) for j in range(13)] + [10.0]


@given(dtype=st.sampled_from(sorted(mb.DTYPES)), p=st.integers(1, 64), count=st.integers(1, 40),
       order=st.randoms(use_true_random=False))
def test_the_sum_over_ranks_in_any_order_is_exact(dtype, p, count, order):
    ranks = list(range(p))
    order.shuffle(ranks)
    total = mb.pattern(ranks[0], count, dtype)
    for rank in ranks[1:]:
        total = total + mb.pattern(rank, count, dtype)  # stays in dtype: each partial sum is rounded as MPI's is
    assert total.dtype == np.dtype(mb.DTYPES[dtype][0])
    assert not mb.wrong_mask(total, mb.expected(p, count, dtype)).any()


@pytest.mark.parametrize("dtype", sorted(mb.DTYPES))
def test_max_ranks_is_the_last_count_whose_sum_is_exact(dtype):
    p, limit = mb.max_ranks(dtype), mb.DTYPES[dtype][1]
    assert mb.PERIOD * p * (p + 1) // 2 <= limit < mb.PERIOD * (p + 1) * (p + 2) // 2
    mb.check_ranks(p, dtype)
    with pytest.raises(FieldError, match=f"field 'ranks': expected at most {p} ranks with {dtype}"):
        mb.check_ranks(p + 1, dtype)
    if dtype == "float32":  # at the limit, the largest element's sum is still exact, added rank by rank
        total = np.float32(0)
        for rank in range(p):
            total = np.float32(total + mb.pattern(rank, mb.PERIOD, dtype)[-1])
        assert total == mb.expected(p, mb.PERIOD, dtype)[-1] == mb.PERIOD * p * (p + 1) // 2


def test_wrong_elements_are_counted_and_nan_is_wrong():
    want = mb.expected(3, 100, "float32")
    got = want.copy()
    assert mb.wrong_mask(got, want).sum() == 0
    got[[0, 17, 99]] = [0.0, np.nan, want[99] + 1]
    assert mb.wrong_mask(got, want).sum() == 3
    got.fill(mb.SENTINEL)  # what an untouched receive buffer holds
    assert mb.wrong_mask(got, want).all()


# ---------------------------------------------------------------------------
# Timing, bandwidth and rows
# ---------------------------------------------------------------------------

def test_bandwidths_in_mbit_per_second():
    assert mb.algbw_mbps(2**20, 1.0) == pytest.approx(8.388608)
    assert mb.busbw_mbps(100.0, 4) == pytest.approx(150.0)  # 2 (p - 1) / p
    assert mb.busbw_mbps(100.0, 1) == 0.0
    assert mb.time_per_iteration(0.3, 3) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        mb.algbw_mbps(4, 0.0)


@given(size=st.integers(1, 2**30), time_s=st.floats(1e-7, 1e4), p=st.integers(1, 1024))
def test_a_rows_bandwidths(size, time_s, p):
    row = mb.BenchRow.measured(size, size // 4, time_s, p, 0)
    assert row.algbw_mbps * time_s * 1e6 == pytest.approx(size * 8)
    assert row.busbw_mbps == pytest.approx(row.algbw_mbps * 2 * (p - 1) / p)


def test_time_precision_as_nccl_tests():
    assert [mb.format_time_us(t) for t in (12.3456e-6, 123.46e-6, 12345.6e-6, 12.3456)] == [
        "12.35", "123.5", "12346", "12345600"]


def test_rows_line_up_under_the_header():
    rows = [mb.BenchRow.measured(4096, 1024, 517.1e-6, 4, 0), mb.BenchRow.measured(2**30, 2**28, 95.3, 4, None),
            mb.BenchRow.measured(4, 1, 1e-6, 4, 12)]
    header = mb.column_header()
    assert all(line.startswith("#") for line in header)
    lines = [mb.format_row(row, "float32", "sum") for row in rows]
    assert lines[0] == ("          4096         1024  float32    sum      517.1      63.37      95.05      0")

    def right_edges(line):
        return [i + 1 for i, c in enumerate(line) if c != " " and (i + 1 == len(line) or line[i + 1] == " ")]

    columns = right_edges(" " + header[0][1:])  # the leading "#" is no column
    assert len(columns) == 8 and all(right_edges(line) == columns for line in lines)
    assert mb.parse_row(lines[1])[7] is None and mb.parse_row(lines[2])[7] == 12
    size, count, dtype, op, time_us, algbw, busbw, wrong = mb.parse_row(lines[0])
    assert (size, count, dtype, op, time_us, wrong) == (4096, 1024, "float32", "sum", 517.1, 0)
    assert (algbw, busbw) == (pytest.approx(63.37, abs=0.01), pytest.approx(95.05, abs=0.01))
    with pytest.raises(ValueError):
        mb.parse_row(header[0])


def test_exit_status():
    ok, unchecked, bad = (mb.BenchRow.measured(4, 1, 1e-3, 2, w) for w in (0, None, 5))
    assert mb.exit_status([ok, unchecked]) == 0 and mb.exit_status([ok, bad]) == 1 and mb.exit_status([]) == 0


def test_the_header():
    opts = mb.parse_args(["--algo", "ring", "--sizes", "4"])
    hosts = [{"rank": 0, "processor_name": "h1", "addresses": ["10.0.0.1"]},
             {"rank": 1, "processor_name": "h2", "addresses": []}]
    library = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4\x00"
    lines = mb.header_lines(opts, 2, library, "MPI_T reads ...", False, hosts)
    assert all(line.startswith("#") for line in lines)
    text = "\n".join(lines)
    assert "\x00" not in text and "# MPI library: Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4\n" in text
    assert "# algorithm: ring (coll_tuned_allreduce_algorithm=4, coll_tuned_use_dynamic_rules=1" in text
    assert "# WARNING: MPI_T reads ..." in text and "Mbit/s" in text
    assert "start window" in text and "the iteration's shared start" in text
    barrier = "\n".join(mb.header_lines(mb.parse_args(["--algo", "ring", "--sizes", "4", "--start", "barrier"]),
                                        2, library, "n", True, hosts))
    assert "start barrier" in barrier and "the maximum over ranks" in barrier
    assert "rank    0 on h1 (10.0.0.1)" in text and "rank    1 on h2 (no address but loopback)" in text
    default = mb.header_lines(mb.parse_args(["--algo", "default", "--sizes", "4"]), 2, "", "n", None, [])
    assert "# algorithm: default (Open MPI's own decision; this program set nothing)" in default
    assert "# MPI library: unknown" in default and "# n" in default


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------

rows_strategy = st.builds(
    mb.BenchRow, size=st.integers(1, 2**30), count=st.integers(1, 2**28),
    time_s=st.floats(0, 1e6, allow_nan=False), algbw_mbps=st.floats(0, 1e9, allow_nan=False),
    busbw_mbps=st.floats(0, 1e9, allow_nan=False), wrong=st.none() | st.integers(0, 2**40),
    late_starts=st.integers(0, 10**6))


@given(row=rows_strategy)
def test_a_row_round_trips_through_json(row):
    assert mb.BenchRow.from_json(json.loads(json.dumps(row.to_json()))) == row


@pytest.mark.parametrize("change, field", [
    ({"size": 0}, "size"), ({"count": True}, "count"), ({"time_s": "1"}, "time_s"),
    ({"busbw_mbps": -1.0}, "busbw_mbps"), ({"algbw_mbps": 10**400}, "algbw_mbps"), ({"wrong": -1}, "wrong"), ({"wrong": 1.5}, "wrong"),
    ({"late_starts": -1}, "late_starts"), ({"extra": 1}, "extra"),
])
def test_a_bad_row_names_its_field(change, field):
    data = {**mb.BenchRow.measured(4, 1, 1e-3, 2, 0).to_json(), **change}
    with pytest.raises(FieldError) as err:
        mb.BenchRow.from_json(data, "r.json: rows[0]")
    assert err.value.field == field and str(err.value).startswith(f"r.json: rows[0]: field '{field}'")
    del data[field]
    if field not in ("extra", "late_starts"):
        with pytest.raises(FieldError, match="got nothing"):
            mb.BenchRow.from_json(data)


def test_a_row_written_before_windows_reads_with_no_late_start():
    data = mb.BenchRow.measured(4, 1, 1e-3, 2, 0).to_json()
    del data["late_starts"]
    assert mb.BenchRow.from_json(data).late_starts == 0


def test_the_document_and_load_rows(tmp_path):
    opts = mb.parse_args(["--algo", "rabenseifner", "--sizes", "4KiB,256KiB", "--iters", "3", "--warmup", "1"])
    rows = [mb.BenchRow.measured(4096, 1024, 5e-4, 4, 0), mb.BenchRow.measured(262144, 65536, 2e-3, 4, 0)]
    cvars = {mb.CVAR_ALGORITHM: 6, mb.CVAR_DYNAMIC_RULES: 1, mb.CVAR_SEGMENT_SIZE: 0}
    hosts = [{"rank": r, "processor_name": "vm", "pid": 100 + r, "addresses": ["192.0.2.2"]} for r in range(4)]
    doc = mb.document(opts, 4, "Open MPI v4.1.4\x00", cvars, True, hosts, rows)
    path = str(tmp_path / "out.json")
    write_json_atomic(path, doc)
    assert mb.load_rows(path) == rows
    back = json.loads(open(path).read())
    assert {k: back[k] for k in ("program", "format_version", "algorithm", "ompi_algorithm_id", "ranks", "dtype",
                                 "op", "iters", "warmup", "check", "algorithm_verified", "mpi_library")} == {
        "program": PROG, "format_version": 1, "algorithm": "rabenseifner", "ompi_algorithm_id": 6, "ranks": 4,
        "dtype": "float32", "op": "sum", "iters": 3, "warmup": 1, "check": True, "algorithm_verified": True,
        "mpi_library": "Open MPI v4.1.4"}
    assert back["environment"] == {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                                   "OMPI_MCA_coll_tuned_allreduce_algorithm": "6"}
    assert back["hosts"] == hosts and back["mpi_t"] == cvars
    assert back["start"] == "window" and back["time"] == mb.TIME_MEANING["window"]
    assert all(math.isfinite(row["busbw_mbps"]) for row in back["rows"])


def test_load_rows_refuses_what_is_not_a_benchmark_result(tmp_path):
    with pytest.raises(UserError, match="cannot read it as JSON"):
        mb.load_rows(str(tmp_path / "missing.json"))
    for data, field in (([], "document"), ({"program": "emu"}, "program"),
                        ({"program": PROG, "format_version": 2}, "format_version"),
                        ({"program": PROG, "format_version": 1}, "rows"),
                        ({"program": PROG, "format_version": 1, "rows": [1]}, "row")):
        path = str(tmp_path / "r.json")
        write_json_atomic(path, data)
        with pytest.raises(FieldError) as err:
            mb.load_rows(path)
        assert err.value.field == field and str(err.value).startswith(path)
    assert os.path.exists(path)
