"""The cell-kind interface: a third kind, made up here, runs, resumes and is reported through the one path the
runner, the run folder and the report have for cells, without the replay's or the MPI program's code."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from fake_session import FakeSession, factory

from emulator.base.files import write_json_atomic
from emulator.runs.results import ProbeVerdict
from emulator.runs.trust import Trust
from emulator.study import experiment as xp
from emulator.study import report
from emulator.study.cell_kinds import CSV_FIELDS, DEFAULT_KINDS, Kinds, MpiKind, ReplayKind
from emulator.study.folder.results_folder import ResultsFolder
from emulator.study.live import runner

EXP = """
name: kinds
repeat: 1
warmup: 0
sizes: [64KiB]
series:
  - name: fake
    runs: [{topology: "bigraph:upper=2,lower=2,hosts_per_switch=2", routing: bigraph, algorithms: [hdrm, ring, hd]}]
  - name: real
    runs: [{topology: "bigraph:upper=2,lower=2,hosts_per_switch=2", routing: bigraph, algorithms: [hdrm]}]
"""
FAKE_IDS = ["fake.bigraph-2x2x2.bigraph.hdrm.64KiB", "fake.bigraph-2x2x2.bigraph.ring.64KiB",
            "fake.bigraph-2x2x2.bigraph.hd.64KiB"]
REAL_ID = "real.bigraph-2x2x2.bigraph.hdrm.64KiB"


@dataclass
class FakeResults:
    config: dict[str, Any]
    status: str
    value: int = 0
    error: str | None = None
    flags: list[str] = field(default_factory=list)
    probe: dict[str, Any] | None = None


@dataclass(frozen=True)
class FakeRow:
    id: str
    status: str
    value: int | None
    flags: list[str]
    error: str | None
    datapath: str | None = "fake"

    @property
    def trust(self) -> Trust | None:
        return None if self.value is None else Trust(flags=tuple(self.flags))

    def csv(self) -> dict[str, Any]:
        own = {"id": self.id, "status": self.status, "busbw_mbps": self.value, "flags": " ".join(self.flags)}
        return {name: own.get(name, "") for name in CSV_FIELDS}


class FakeKind:
    """Claims the cells of the series ``fake``; its run writes a number (or fails as ``fail`` says)."""

    name = "fake"
    predicted = False

    def __init__(self, fail: Mapping[str, str] = ()):  # cell id -> "raise" or "status"
        self.fail = dict(fail)
        self.ran: list[str] = []

    def claims(self, cell: xp.Cell) -> bool:
        return cell.series == "fake"

    def claims_entry(self, entry: Mapping[str, Any]) -> bool:
        return entry["series"] == "fake"

    def run(self, session, pc: xp.PreparedCell, out: str, *, config: dict[str, Any],
            echo: Callable[[str], None]) -> None:
        assert session.up
        self.ran.append(pc.cell.id)
        how = self.fail.get(pc.cell.id)
        if how == "raise":
            raise RuntimeError("the fake program crashed")
        doc = {"kind": "fake", "config": config, "status": "failed" if how == "status" else "ok", "value": 42}
        write_json_atomic(f"{out}/results.json", doc)

    def read(self, data: Mapping[str, Any]) -> FakeResults | None:
        if data.get("kind") != "fake":
            return None
        return FakeResults(config=data["config"], status=data["status"], value=data["value"],
                           flags=list(data.get("flags", [])), probe=data.get("probe"))

    def save(self, path: str, res: FakeResults, probe: ProbeVerdict | None) -> None:
        write_json_atomic(path, {"kind": "fake", "config": res.config, "status": res.status, "value": res.value,
                                 "flags": res.flags, "probe": probe.to_json() if probe else res.probe})

    def failure(self, res: FakeResults | None) -> str:
        return f"the fake program said {res.status}" if res else "no fake results"

    def flag(self, res: FakeResults, name: str) -> None:
        res.flags.append(name)

    def line(self, res: FakeResults) -> str:
        return f"fake value {res.value}"

    def row(self, entry: Mapping[str, Any], res: FakeResults | None, state, plan, cell_dir: str) -> FakeRow:
        status = "ok" if res and res.status == "ok" else (state.status if state else "not run")
        return FakeRow(id=entry["id"], status=status, value=res.value if res else None,
                       flags=res.flags if res else [], error=state.error if state and status != "ok" else None)


def _exp() -> xp.Experiment:
    return xp.from_dict(yaml.safe_load(EXP), where="kinds.yaml")


def _kinds(fake: FakeKind) -> Kinds:
    return Kinds([fake, ReplayKind(), MpiKind()])


def test_a_third_kind_runs_through_the_runners_one_path_and_resumes(tmp_path):
    fake = FakeKind()
    FakeSession.runs.clear()
    stream = io.StringIO()
    out = str(tmp_path / "run")
    s = runner.Runner(_exp(), out, session_factory=factory(), stream=stream, kinds=_kinds(fake)).run()
    assert s.status == "complete" and s.ran == [*FAKE_IDS, REAL_ID]
    assert fake.ran == FAKE_IDS and FakeSession.runs == [REAL_ID]  # the replay's path never saw a fake cell
    assert f"{FAKE_IDS[0]}: fake value 42" in stream.getvalue()
    doc = json.loads((tmp_path / "run" / "cells" / FAKE_IDS[0] / "results.json").read_text())
    assert doc["kind"] == "fake" and doc["probe"]["passed"] and doc["flags"] == []  # the probe noted by the kind
    folder = ResultsFolder(out, _kinds(fake))
    cell = next(c for c in xp.expand(_exp()) if c.id == FAKE_IDS[0])
    assert folder.cell_finished(cell) and isinstance(folder.results_of(cell), FakeResults)
    assert not ResultsFolder(out).cell_finished(cell)  # the default kinds read it as a replay's: not one
    again = runner.Runner(_exp(), out, session_factory=factory(), stream=io.StringIO(), kinds=_kinds(fake)).run()
    assert again.skipped == [*FAKE_IDS, REAL_ID] and fake.ran == FAKE_IDS


def test_a_third_kinds_failures_and_flags_go_through_it(tmp_path):
    fake = FakeKind(fail={FAKE_IDS[1]: "raise", FAKE_IDS[2]: "status"})
    out = str(tmp_path / "run")
    s = runner.Runner(_exp(), out, session_factory=factory(probe_slowdowns=[9.0, 9.0, 9.0]),
                      stream=io.StringIO(), kinds=_kinds(fake)).run()
    assert s.failed == {FAKE_IDS[1]: "RuntimeError: the fake program crashed",
                        FAKE_IDS[2]: "the fake program said failed"}
    doc = json.loads((tmp_path / "run" / "cells" / FAKE_IDS[0] / "results.json").read_text())
    assert doc["flags"] == ["probe_failed"] and not doc["probe"]["passed"]


def test_a_third_kind_is_reported_in_the_overview_the_failures_and_cells_csv(tmp_path):
    fake = FakeKind(fail={FAKE_IDS[1]: "raise"})
    out = str(tmp_path / "run")
    runner.Runner(_exp(), out, session_factory=factory(), stream=io.StringIO(), kinds=_kinds(fake)).run()
    built = report.build(out, _kinds(fake))
    assert [r.id for r in built.cells] == [*FAKE_IDS, REAL_ID]
    assert [r.id for r in built.rows] == [REAL_ID] and built.mpi_rows == []  # no busbw comparison sees them
    md = built.doc.markdown()
    assert "**3 of 4 cells finished**, 1 failed" in md
    assert f"`{FAKE_IDS[1]}`: failed: RuntimeError: the fake program crashed" in md
    report.write_report(out, _kinds(fake))
    with open(tmp_path / "run" / "cells.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == [*FAKE_IDS, REAL_ID] and list(rows[0]) == list(CSV_FIELDS)
    assert rows[0]["busbw_mbps"] == "42" and rows[0]["status"] == "ok" and rows[1]["busbw_mbps"] == ""


def test_every_cell_of_an_experiment_has_one_default_kind():
    kinds = [DEFAULT_KINDS.of(c).name for c in xp.expand(_exp())]
    assert kinds == ["replay"] * 4
