"""What ``emu run`` prints: durations, the progress bar, the time left and the lines of a run."""

from __future__ import annotations

import io

import pytest
import yaml

from emulator.runs.results import CellResults, Fidelity, Repetition
from emulator.study import experiment as xp
from emulator.study import progress as pg
from emulator.study.cell_kinds.replay import cell_line
from emulator.study.progress import Eta, Progress, format_duration, progress_bar

TINY = """
name: t
repeat: 1
warmup: 0
sizes: [16KiB]
series:
  - name: s
    runs:
      - topology: "leafspine:leaves=2,spines=2,hosts_per_leaf=2"
        routing: [ecmp, dmodk]
        algorithms: [ring, hd]
"""


@pytest.fixture(scope="module")
def prepared() -> dict[str, xp.PreparedCell]:
    exp = xp.from_dict(yaml.safe_load(TINY), where="t.yaml")
    return {pc.cell.id: pc for pc in xp.prepare(exp)}


def _results(busbw: float, time_s: float, flags: list[str]) -> CellResults:
    fid = Fidelity(cpu_idle=1.0, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0, flags=flags)
    return CellResults(prediction={"predicted_time_s": 2.0, "busbw_mbps": 4.0}, status="ok",
                       repetitions=[Repetition(rep=0, time_s=time_s, algbw_mbps=busbw, busbw_mbps=busbw,
                                               fidelity=fid)])


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (-3, "0s"), (59.4, "59s"), (59.6, "1m00s"), (61, "1m01s"),
                                           (3599, "59m59s"), (3600, "1h00m"), (3725, "1h02m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_progress_bar():
    assert progress_bar(1, 4, width=8) == "[##------]"
    assert progress_bar(0, 4, width=4) == "[----]" and progress_bar(4, 4, width=4) == "[####]"
    assert progress_bar(0, 0, width=4) == "[####]"  # nothing to do is done


def test_eta_starts_from_the_model_and_follows_what_was_measured(prepared):
    eta = Eta(prepared)
    ids = list(prepared)
    predicted = sum(xp.estimate_s(prepared[c], 0.0) for c in ids)
    before = eta.remaining_s(ids, 2)
    assert before == pytest.approx(len(ids) * pg.DEFAULT_CELL_OVERHEAD_S + 1.5 * predicted + 2 * pg.DEFAULT_BRINGUP_S)
    eta.observe_bringup(4.0)
    eta.observe_cell(ids[0], 100.0)  # much slower than predicted
    slow = eta.remaining_s(ids[1:], 1)
    assert slow > 3 * 50 and eta.remaining_s(ids[1:], 0) == pytest.approx(slow - 4.0)
    fast = Eta(prepared)
    fast.observe_cell(ids[0], 0.0)  # faster than the model: never scaled below half of it
    assert fast.remaining_s(ids[1:], 0) == pytest.approx(0.5 * sum(xp.estimate_s(prepared[c], 0.0) for c in ids[1:]))
    assert eta.remaining_s([], 0) == 0


def test_cell_line_leaves_out_uncalibrated_only():
    assert cell_line(_results(2.0, 2.1, ["uncalibrated"])) == \
        "busbw 2.00 Mbit/s (model 4.00), measured/predicted 1.05"
    assert cell_line(_results(2.0, 2.1, ["uncalibrated", "probe_failed", "cpu_saturated"])) == \
        "busbw 2.00 Mbit/s (model 4.00), measured/predicted 1.05 [fidelity: cpu_saturated, probe_failed]"
    # 1.5 times the model is outside the replay's band: flagged whatever the fidelity says
    assert cell_line(_results(2.0, 3.0, ["uncalibrated"])) == \
        "busbw 2.00 Mbit/s (model 4.00), measured/predicted 1.50 [fidelity: model_disagrees]"
    assert cell_line(CellResults(status="ok")) == "busbw 0.00 Mbit/s (model 0.00), measured/predicted 0.00"


def test_the_lines_of_a_resumed_run(prepared):
    ids = list(prepared)
    stream = io.StringIO()
    progress = Progress(stream, Eta(prepared), total=len(ids))
    progress.begin("results/t-1", 1, ids[1:], 2)
    progress.network("leafspine:leaves=2", "ecmp", 3, 1)
    progress.cell_ok(ids[1], cell_line(_results(2.0, 2.1, [])))
    progress.rebuilding("too slow")
    progress.probe_failed_again("still slow", "probe_failed")
    progress.network("leafspine:leaves=2", "dmodk", 0, 2)
    progress.cell_failed(ids[2], "RuntimeError: hung")
    progress.interrupted("results/t-1")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "resuming results/t-1: 1 of 4 cells finished before, skipped"
    assert lines[1].startswith(f"{progress_bar(1, 4)} 1/4 cells, 2 networks to bring up, ETA ")
    assert lines[2] == "network 1/2: leafspine:leaves=2 (ecmp seed 3), 1 cells"
    assert lines[3].startswith(f"{progress_bar(2, 4)} 2/4 ETA ") and lines[3].endswith(
        f"  {ids[1]}: busbw 2.00 Mbit/s (model 4.00), measured/predicted 1.05")
    assert lines[4] == "  network failed its probe (too slow): rebuilding it"
    assert lines[5] == ("  network failed its probe again (still slow): its cells are flagged probe_failed and "
                        "not trusted")
    assert lines[6] == "network 2/2: leafspine:leaves=2 (dmodk), 2 cells"  # no seed but for ECMP
    assert lines[7].endswith(f"  {ids[2]}: FAILED (RuntimeError: hung)") and " 3/4 ETA " in lines[7]
    assert lines[8] == ("interrupted: 3 of 4 cells finished and kept in results/t-1; run the same command again to "
                        "finish the rest")
    assert progress.remaining == [ids[3]]


def test_the_time_left_shrinks_as_cells_finish(prepared):
    ids = list(prepared)
    stream = io.StringIO()
    progress = Progress(stream, Eta(prepared), total=len(ids))
    progress.begin("o", 0, ids, 1)
    assert "resuming" not in stream.getvalue()
    progress.network("s", "dmodk", 0, len(ids))
    left = [progress.eta.remaining_s(progress.remaining, 0)]
    for cid in ids:
        progress.cell_ok(cid, cell_line(_results(1.0, 1.0, [])))
        left.append(progress.eta.remaining_s(progress.remaining, 0))
    assert left == sorted(left, reverse=True) and left[-1] == 0 and progress.done == len(ids)
    assert stream.getvalue().splitlines()[-1].startswith(f"{progress_bar(4, 4)} 4/4 ETA 0s  {ids[-1]}: ")
