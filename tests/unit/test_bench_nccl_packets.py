"""``emu bench``'s NCCL section without a network: every cluster's sizes planned for real (schedules written,
admitted), the replays faked; its rows, their verdicts (a size not run is unchecked, never a pass) and the
report's lines."""

from __future__ import annotations

import dataclasses
import json

import bench_scenario as sc
import pytest
from test_bench_golden import run_bench

from emulator.base.errors import UserError
from emulator.emulation.session import nccl_packets as packets
from emulator.model import fabric
from emulator.model.nccl import cost
from emulator.model.nccl.system import system_on
from emulator.runs.dilation import DEFAULT_AGENT_COSTS, Envelope
from emulator.runs.nccl_packets import Measured, NotRun
from emulator.selfcheck.bench.cases import DEFAULT_CASES, Size
from emulator.selfcheck.bench.report import nccl_packet_line, nccl_packets_line
from emulator.selfcheck.bench.rows import NcclPacketRow, SectionError
from emulator.selfcheck.live import bench_nccl_packets, bench_run

ENVELOPE = Envelope(None, DEFAULT_AGENT_COSTS, 2)


def _fake_run(over_model: float, verdict: str = "trusted"):
    def run(planned, echo=print):
        return [Measured(p.cell.prediction, p.cell.prediction.time_us * over_model, verdict, p.config.out,
                         p.prep.profile.emulated_link_mbps) for p in planned]
    return run


def _rows(monkeypatch, tmp_path, admit=lambda request: None, over_model=1.05, verdict="trusted"):
    monkeypatch.setattr(bench_nccl_packets.packets, "run", _fake_run(over_model, verdict))
    gate = packets.Gate(lambda mtu: ENVELOPE, admit)
    return bench_nccl_packets.run_nccl_packets(str(tmp_path), gate, lambda line: None, clusters=((2, 1), (2, 8)),
                                               sizes=(8 << 10, 64 << 20))


def test_every_cluster_and_size_has_a_row_and_nvls_tree_is_unchecked(monkeypatch, tmp_path):
    rows = _rows(monkeypatch, tmp_path)
    assert [(r.cluster, r.size) for r in rows] == [("2 x 1", 8 << 10), ("2 x 1", 64 << 20), ("2 x 8", 8 << 10),
                                                   ("2 x 8", 64 << 20)]
    assert [r.passed for r in rows] == [True, True, True, None]
    assert [r.choice for r in rows] == ["ring/ll, 1 channels", "ring/simple, 4 channels", "tree/ll, 2 channels",
                                        "nvlstree/simple, 16 channels"]
    assert rows[3].verdict == "not run" and "not trusted yet" in (rows[3].why_not_run or "")
    assert all(r.link_mbps is not None for r in rows[:3])
    assert (tmp_path / "nccl-2x8" / "8192B" / "schedule.json").exists()
    line = nccl_packets_line(rows)
    assert line is not None and line.verdict == "PASS" and "3 of 3" in line.measured
    assert line.notes == "1 unchecked (not run as packets)"


def test_a_size_not_run_is_unchecked_not_passed():
    system = system_on(fabric.parse("h100-ndr400"), 2, 8, "h100-sxm")
    big = cost.predict(system, "allreduce", 64 << 20)
    done = NcclPacketRow.measured("2 x 8", Measured(big, big.time_us, "trusted", "/x", 2.0))
    skipped = NcclPacketRow.not_run("2 x 8", NotRun(big, "no packet schedule"))
    assert (done.passed, skipped.passed) == (True, None)
    line = nccl_packets_line([done, skipped])
    assert line is not None and line.verdict == "PASS" and "1 of 1" in line.measured
    assert line.notes == "1 unchecked (not run as packets)"
    only = nccl_packets_line([skipped])
    assert only is not None and only.verdict is None  # nothing checked: neither a pass nor a miss


@pytest.mark.parametrize(("over_model", "verdict"), [(1.12, "trusted"), (0.88, "trusted"), (1.0, "flagged")])
def test_a_row_outside_the_band_or_not_trusted_misses(monkeypatch, tmp_path, over_model, verdict):
    rows = _rows(monkeypatch, tmp_path, over_model=over_model, verdict=verdict)
    assert [r.passed for r in rows] == [False, False, False, None]
    line = nccl_packets_line(rows)
    assert line is not None and line.verdict == "MISS" and "0 of 3" in line.measured


def test_a_refused_cluster_fails_its_rows_and_the_others_still_run(monkeypatch, tmp_path):
    def admit(request):
        if request.memory.ranks > 2:
            raise UserError("nccl-tests: field 'max-time': expected a shorter run, got too long")
    rows = _rows(monkeypatch, tmp_path, admit=admit)
    assert [(r.cluster, r.verdict) for r in rows] == [("2 x 1", "trusted"), ("2 x 1", "trusted"),
                                                      ("2 x 8", "failed"), ("2 x 8", "not run")]
    assert rows[2].passed is False and "max-time" in (rows[2].why_not_run or "") and rows[3].passed is None
    assert not (tmp_path / "nccl-2x8").exists()


def test_a_cluster_whose_run_fails_fails_its_rows_and_every_cluster_is_handed_on(monkeypatch, tmp_path):
    def run(planned, echo=print):
        if len(planned[0].prep.topo.hosts) > 2:
            raise RuntimeError("agents gone")
        return _fake_run(1.0, "trusted")(planned)
    monkeypatch.setattr(bench_nccl_packets.packets, "run", run)
    handed: list[int] = []
    rows = bench_nccl_packets.run_nccl_packets(str(tmp_path), packets.Gate(lambda mtu: ENVELOPE, lambda r: None),
                                               lambda line: None, clusters=((2, 8), (2, 1)),
                                               sizes=(8 << 10, 64 << 20), on_rows=lambda so_far: handed.append(
                                                   len(so_far)))
    assert [(r.cluster, r.verdict) for r in rows] == [("2 x 8", "failed"), ("2 x 8", "not run"),
                                                      ("2 x 1", "trusted"), ("2 x 1", "trusted")]
    assert "RuntimeError: agents gone" in (rows[0].why_not_run or "") and handed == [2, 4]


def test_the_rows_print_and_write_what_they_hold():
    system = system_on(fabric.parse("h100-ndr400"), 2, 8, "h100-sxm")
    prediction = cost.predict(system, "allreduce", 1 << 20)
    row = NcclPacketRow.measured("2 x 8", Measured(prediction, prediction.time_us * 0.94, "trusted", "/x", 1.2))
    assert row.ratio == pytest.approx(0.94)
    text = nccl_packet_line(row)
    assert text.startswith("2 x 8") and "1MiB" in text.replace(" ", "") and "0.940" in text and "1.2 Mbit/s" in text
    assert row.to_json()["passed"] is True and row.to_json()["ratio"] == pytest.approx(0.94)
    assert dataclasses.replace(row, verdict="flagged").passed is False
    error = nccl_packets_line(SectionError("RuntimeError: boom"))
    assert error is not None and error.verdict == "MISS" and nccl_packets_line(None) is None


def test_bench_runs_the_section_only_with_a_gate_and_writes_and_prints_its_rows(monkeypatch):
    system = system_on(fabric.parse("h100-ndr400"), 2, 8, "h100-sxm")
    big = cost.predict(system, "allreduce", 64 << 20)
    rows = [NcclPacketRow.not_run("2 x 8", NotRun(big, "no packet schedule yet"))]
    monkeypatch.setattr(bench_run, "run_nccl_packets", lambda out, gate, echo, on_rows: rows)
    small = {"cases": (DEFAULT_CASES[0],), "sizes": (Size(64 << 10, 1, 2),), "crossovers": (), "bringup_rounds": 1,
             "scale_bringups": ()}
    echo, saves, report = run_bench(monkeypatch, sc.fake_agents_vs_iperf, (), (), **small,
                                    nccl_gate=packets.Gate(lambda mtu: ENVELOPE, lambda request: None))
    assert "NCCL's all-reduce as packets:" in echo
    assert json.loads(saves[-1])["nccl_packets"][0]["verdict"] == "not run"
    assert "NCCL packets / model within +-10%, trusted" in report and "not run: no packet schedule yet" in report
    _, saves, report = run_bench(monkeypatch, sc.fake_agents_vs_iperf, (), (), **small)
    assert "nccl_packets" not in json.loads(saves[-1]) and "NCCL packets" not in report
