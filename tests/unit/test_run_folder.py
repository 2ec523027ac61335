"""The results folder of ``emu run``: which cells are finished, its run files, and which folder a run resumes."""

from __future__ import annotations

import datetime
import io
import json
import os

import pytest
import yaml
from fake_session import FakeSession, factory

from emulator.runs.results import CellResults, Fidelity, ProbeVerdict, Repetition
from emulator.study import experiment as xp
from emulator.study.folder.cell_state import CellState
from emulator.study.folder.results_folder import ResultsFolder, find_unfinished, new_out_dir, point_latest
from emulator.study.live import runner

TINY = """
name: t
repeat: 1
warmup: 0
sizes: [16KiB]
series:
  - name: s
    runs:
      - topology: "star:hosts=4"
        routing: shortest
        algorithms: [ring, hd]
"""


@pytest.fixture
def exp() -> xp.Experiment:
    return xp.from_dict(yaml.safe_load(TINY), where="t.yaml")


def _results(cell: xp.Cell, status: str = "ok") -> CellResults:
    rep = Repetition(rep=0, time_s=1.0, algbw_mbps=2.0, busbw_mbps=3.0,
                     fidelity=Fidelity(cpu_idle=1.0, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0))
    return CellResults(config={"cell": cell.to_json(), "experiment": "t"}, prediction={"predicted_time_s": 1.0},
                       repetitions=[rep], status=status, outcome=status)


def _write(folder: ResultsFolder, cell: xp.Cell, text: str) -> None:
    os.makedirs(folder.cell_dir(cell), exist_ok=True)
    with open(folder.results_path(cell), "w", encoding="utf-8") as fh:
        fh.write(text)


# ------------------------------------------------------------------ cells
def test_a_cell_is_finished_only_with_ok_results_of_exactly_that_cell(tmp_path, exp):
    folder = ResultsFolder(str(tmp_path))
    ring, hd = xp.expand(exp)
    assert folder.cell_dir(ring) == os.path.join(str(tmp_path), "cells", ring.id) == folder.cell_dir(ring.id)
    assert not folder.cell_finished(ring) and folder.results_of(ring) is None  # never ran
    os.makedirs(folder.cell_dir(ring))
    folder.save_results(ring, _results(ring))
    assert folder.cell_finished(ring) and not folder.cell_finished(hd)
    assert folder.finished_results(ring).summary().busbw_mbps == 3.0
    for status in ("failed", "interrupted", "running"):
        folder.save_results(ring, _results(ring, status))
        assert not folder.cell_finished(ring), status
        assert folder.results_of(ring).status == status


def test_results_of_another_cell_or_of_a_changed_cell_do_not_count(tmp_path, exp):
    folder = ResultsFolder(str(tmp_path))
    ring, hd = xp.expand(exp)
    os.makedirs(folder.cell_dir(ring))
    folder.save_results(ring, _results(hd))  # hd's results in ring's directory
    assert not folder.cell_finished(ring)
    changed = xp.expand(xp.from_dict(yaml.safe_load(TINY.replace("repeat: 1", "repeat: 2")), where="t.yaml"))[0]
    assert changed.id == ring.id
    folder.save_results(ring, _results(ring))
    assert folder.cell_finished(ring) and not folder.cell_finished(changed)


@pytest.mark.parametrize("text", ["", "{not json", "[]", '"ok"', '{"schema": 99, "status": "ok"}',
                                  '{"status": "ok", "repetitions": [{"rep": 0}]}', "\x00\xff"])
def test_a_corrupt_results_json_is_not_finished(tmp_path, exp, text):
    folder = ResultsFolder(str(tmp_path))
    ring = xp.expand(exp)[0]
    _write(folder, ring, text)
    assert folder.results_of(ring) is None and not folder.cell_finished(ring)


def test_a_schema_1_results_json_of_an_older_run_is_finished(tmp_path, exp):
    """results.json as runs before the schema version wrote it: no ``schema`` key, plain dicts."""
    folder = ResultsFolder(str(tmp_path))
    ring = xp.expand(exp)[0]
    old = {"config": {"cell": ring.to_json(), "experiment": "t"}, "status": "ok", "error": None,
           "prediction": {"predicted_time_s": 0.5, "busbw_mbps": 1.0},
           "repetitions": [{"rep": 0, "time_s": 0.6, "busbw_mbps": 0.9, "correct": True,
                            "fidelity": {"flags": ["uncalibrated"], "trusted": True}}],
           "warmup": [], "busbw_mbps_median": 0.9, "trusted": True}
    _write(folder, ring, json.dumps(old))
    assert folder.cell_finished(ring)
    # judged by today's rule: 1.2 times its model is outside the replay's band
    assert folder.finished_results(ring).flags() == ["model_disagrees", "uncalibrated"]


def test_empty_cell_dir_removes_what_an_earlier_attempt_left(tmp_path, exp):
    folder = ResultsFolder(str(tmp_path))
    ring = xp.expand(exp)[0]
    _write(folder, ring, "{}")
    where = folder.empty_cell_dir(ring)
    assert where == folder.cell_dir(ring) and os.listdir(where) == []


# ------------------------------------------------------------ run files
def test_run_json_keeps_its_creation_time_and_reads_any_object(tmp_path, exp):
    folder = ResultsFolder(str(tmp_path))
    assert folder.read_run() is None
    first = folder.write_run(exp, "running", 2, 1.23456)
    assert folder.read_run() == first and first.wall_s == 1.235 and first.fingerprint == exp.fingerprint()
    with open(tmp_path / "run.json") as fh:
        doc = json.load(fh)
    doc["created"] = "2000-01-01T00:00:00"
    (tmp_path / "run.json").write_text(json.dumps(doc))
    second = folder.write_run(exp, "complete", 2, 5.0)
    assert second.created == "2000-01-01T00:00:00" and second.status == "complete"
    (tmp_path / "run.json").write_text(json.dumps({"fingerprint": 7, "wall_s": "x", "status": "running"}))
    odd = folder.read_run()
    assert odd.fingerprint is None and odd.wall_s is None and odd.status == "running"
    for text in ("{}", "[1]", "nope"):
        (tmp_path / "run.json").write_text(text)
        assert folder.read_run() is None, text


def test_state_json_round_trip_leaves_out_unreadable_entries(tmp_path):
    folder = ResultsFolder(str(tmp_path))
    assert folder.read_states() == {}
    states = {"a.b": CellState.recorded("failed", 1.23456, "boom"), "c.d": CellState("ok")}
    folder.write_states(states)
    with open(tmp_path / "state.json") as fh:
        doc = json.load(fh)
    assert doc["cells"]["c.d"] == {"status": "ok"}
    assert set(doc["cells"]["a.b"]) == {"status", "wall_s", "error", "at"} and doc["cells"]["a.b"]["wall_s"] == 1.235
    assert folder.read_states() == states
    doc["cells"]["e.f"] = {"wall_s": 3}
    doc["cells"]["g.h"] = "ok"
    (tmp_path / "state.json").write_text(json.dumps(doc))
    assert folder.read_states() == states
    (tmp_path / "state.json").write_text('{"cells": []}')
    assert folder.read_states() == {}


def test_plan_and_probe_files(tmp_path, exp):
    folder = ResultsFolder(str(tmp_path))
    assert not folder.has_plan()
    folder.write_plan(exp, xp.prepare(exp), "name: t\n")
    assert folder.has_plan()
    assert (tmp_path / "experiment.yaml").read_text() == "name: t\n" and (tmp_path / "cells").is_dir()
    plan = json.loads((tmp_path / "experiment.json").read_text())
    assert [c["id"] for c in plan["cells"]] == [c.id for c in xp.expand(exp)]
    assert plan["fingerprint"] == exp.fingerprint() and all(c["predicted_time_s"] > 0 for c in plan["cells"])
    work = folder.session_dir("star:hosts=4,bw=20", "shortest", 0, 20.0)
    assert work == os.path.join(str(tmp_path), "sessions", "star-4.shortest-s0")
    probe_dir = ResultsFolder.empty_probe_dir(work, 1)
    assert probe_dir == os.path.join(work, "probe-1") and os.path.isdir(probe_dir)
    verdict = ProbeVerdict(passed=True, pair=("h1", "h4"), measured_s=1.0, predicted_s=1.0, ratio=1.0, reason="ok")
    ResultsFolder.write_probes(work, [verdict])
    assert json.loads(open(os.path.join(work, "probe.json")).read()) == {"attempts": [verdict.to_json()]}
    (tmp_path / "experiment.json").write_text('{"experiment": {}, "cells": [{"id": "nodot"}]}')
    assert not folder.has_plan()


# ---------------------------------------------------------- results roots
def _run_json(root, name: str, exp: xp.Experiment, status: str, created: str, fingerprint: str | None = None):
    path = os.path.join(str(root), name)
    os.makedirs(path)
    with open(os.path.join(path, "run.json"), "w", encoding="utf-8") as fh:
        json.dump({"fingerprint": fingerprint or exp.fingerprint(), "status": status, "created": created}, fh)
    return path


def test_resume_picks_the_newest_unfinished_run_of_the_same_experiment(tmp_path, exp):
    assert find_unfinished(str(tmp_path / "missing"), exp) is None
    assert find_unfinished(str(tmp_path), exp) is None
    _run_json(tmp_path, "t-1", exp, "interrupted", "2024-01-01T00:00:00")
    newer = _run_json(tmp_path, "t-2", exp, "incomplete", "2024-01-02T00:00:00")
    _run_json(tmp_path, "t-3", exp, "complete", "2024-01-03T00:00:00")  # finished: nothing to resume
    _run_json(tmp_path, "t-4", exp, "running", "2024-01-04T00:00:00", fingerprint="other")  # another grid
    _run_json(tmp_path, "u-5", exp, "running", "2024-01-05T00:00:00")  # another experiment's name
    os.makedirs(tmp_path / "t-6")  # no run.json
    os.symlink("t-1", tmp_path / "t-link")
    assert find_unfinished(str(tmp_path), exp) == newer
    tie = _run_json(tmp_path, "t-7", exp, "running", "2024-01-02T00:00:00")  # same creation time: the later name
    assert find_unfinished(str(tmp_path), exp) == tie


def test_new_out_dir_never_reuses_a_folder(tmp_path):
    now = datetime.datetime(2024, 5, 6, 7, 8, 9)
    first = new_out_dir(str(tmp_path), "t", now)
    assert first == os.path.join(str(tmp_path), "t-20240506-070809") and not os.path.exists(first)
    os.makedirs(first)
    second = new_out_dir(str(tmp_path), "t", now)
    assert second == first + "-2"


def test_point_latest_is_a_relative_link_under_the_root_only(tmp_path):
    root = tmp_path / "results"
    a, b = root / "t-1", root / "t-2"
    a.mkdir(parents=True)
    b.mkdir()
    point_latest(str(root), str(a))
    point_latest(str(root), str(b))
    assert os.readlink(root / "latest") == "t-2"
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    point_latest(str(root), str(elsewhere))
    assert os.readlink(root / "latest") == "t-2"


def test_an_interrupted_run_is_found_and_resumed_from_its_folder(tmp_path, exp):
    """The folder functions and the runner together: interrupted, found again, finished, no longer found."""
    out = new_out_dir(str(tmp_path), exp.name)
    os.makedirs(out)

    def interrupt(cell_id, outcome):
        raise KeyboardInterrupt

    first = runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO(), after_cell=interrupt).run()
    assert first.interrupted and ResultsFolder(out).read_run().status == "interrupted"
    assert find_unfinished(str(tmp_path), exp) == out
    FakeSession.runs.clear()
    second = runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO()).run()
    assert second.skipped == first.ran and FakeSession.runs == second.ran and second.status == "complete"
    assert find_unfinished(str(tmp_path), exp) is None
    states = ResultsFolder(out).read_states()
    assert {s.status for s in states.values()} == {"ok"}
