"""A long job's progress (``emulator.base.progress.Meter``): periodic lines off a terminal, a bar on one, driven
by a clock of the test's own; and ``emu run --check`` showing it while it proves and predicts."""

from __future__ import annotations

import io
import time

from emulator.base.progress import Meter
from emulator.cli import main as cli_main


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_one_line_every_ten_seconds_says_what_how_many_and_how_long_then_a_last_line():
    clock, out = Clock(), io.StringIO()
    meter = Meter("proving and predicting", 8, "cells", stream=out, clock=clock)
    assert not meter.tty
    meter.advance(2)
    clock.now += 9.9
    meter.poll()
    assert out.getvalue() == ""  # not yet due
    clock.now += 0.2
    meter.poll()
    meter.advance()
    clock.now += 5
    meter.poll()  # 5 s after the last line: nothing
    clock.now += 5
    meter.poll()
    meter.phase("predicting again at the chosen dilations", 2, "cells")
    meter.advance(2)
    clock.now += 61
    meter.poll()
    meter.close()
    assert out.getvalue().splitlines() == [
        "proving and predicting: 2/8 cells, 10s",
        "proving and predicting: 3/8 cells, 20s",
        "predicting again at the chosen dilations: 2/2 cells, 1m21s",
        "predicting again at the chosen dilations: 2/2 cells done in 1m21s",
    ]


def test_off_a_terminal_a_short_job_says_nothing_and_one_of_unknown_length_gives_its_time():
    clock, out = Clock(), io.StringIO()
    quick = Meter("importing", 3, "files", stream=out, clock=clock)
    quick.advance(3)
    clock.now += 4
    quick.poll()
    quick.close()
    assert out.getvalue() == ""
    unknown = Meter("importing 1 Chakra trace file", stream=out, clock=clock)
    clock.now += 12
    unknown.poll()
    unknown.close()
    assert out.getvalue().splitlines() == ["importing 1 Chakra trace file: 12s",
                                           "importing 1 Chakra trace file: done in 12s"]


def test_on_a_terminal_a_bar_is_redrawn_in_place_after_two_seconds_and_cleared_at_the_end():
    clock, out = Clock(), Terminal()
    meter = Meter("proving and predicting", 4, "cells", stream=out, clock=clock)
    assert meter.tty
    clock.now += 1
    meter.poll()
    assert out.getvalue() == ""  # a job shorter than QUIET_S shows nothing
    meter.advance()
    clock.now += 2
    meter.poll()
    first = "proving and predicting [######------------------] 1/4 cells, 3s"
    assert out.getvalue() == "\r" + first
    meter.advance(3)
    clock.now += 70
    meter.poll()
    second = "proving and predicting [########################] 4/4 cells, 1m13s"
    assert out.getvalue() == "\r" + first + "\r" + second
    meter.close()
    assert out.getvalue().endswith("\r" + " " * len(second) + "\r")
    assert "\n" not in out.getvalue()


def test_the_meters_thread_writes_while_the_job_gives_no_sign_and_stops_with_the_job():
    out = Terminal()
    with Meter("a long step", 1, stream=out, quiet_s=0.0) as meter:
        assert meter._thread is not None and meter._thread.is_alive()
        for _ in range(200):  # its own thread redraws every REDRAW_S, with nothing advanced
            if "a long step [" in out.getvalue():
                break
            time.sleep(0.01)
        thread = meter._thread
    assert "a long step [------------------------] 0/1, 0s" in out.getvalue()
    assert thread is not None and not thread.is_alive() and out.getvalue().endswith("\r")


def test_emu_run_check_shows_its_progress_on_stderr_and_its_output_on_stdout_is_unchanged(monkeypatch, capsys,
                                                                                        tmp_path):
    made: list[Meter] = []
    real_init = Meter.__init__

    def recording(self, *args, **kwargs):
        kwargs.update(every_s=0.0)  # every poll writes: the periodic line without waiting ten seconds
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Meter, "__init__", recording)
    monkeypatch.setattr(Meter, "advance", lambda self, n=1: (setattr(self, "done", self.done + n), self.poll()))
    monkeypatch.setenv("EF_STATE_DIR", str(tmp_path))  # no calibration: the same output on every machine
    assert cli_main.main(["run", "--check", "experiments/tiny.yaml"]) == 0
    captured = capsys.readouterr()
    assert made and made[0].what == "proving and predicting"
    assert "proving and predicting: 3/3 cells, " in captured.err
    assert "proving and predicting" not in captured.out.split("\n", 1)[1]  # stdout: the first line, then results
    assert "experiments/tiny.yaml: ok" in captured.out


class PollOnce(Meter):
    """A meter whose lines are due at once, polled once on entering instead of from a thread."""

    def __init__(self, what: str, total: int = 0, unit: str = "", **kwargs):
        super().__init__(what, total, unit, every_s=0.0, **kwargs)

    def __enter__(self) -> Meter:
        self.poll()
        return self


def test_emu_schedule_import_shows_what_it_imports_and_writes_on_stderr(monkeypatch, capsys, tmp_path):
    from emulator.cli.commands import schedule

    monkeypatch.setattr(schedule, "Meter", PollOnce)
    out = tmp_path / "ar.json"
    traces = [f"tests/data/chakra_ar.{rank}.et" for rank in range(4)]
    assert cli_main.main(["schedule", "import", *traces, "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err] == ["importing 4 Chakra trace files"] * 2 + [f"writing {out}"] * 2
    assert err[1].startswith("importing 4 Chakra trace files: done in ")


def test_writing_the_report_with_its_projections_shows_it_is_going_on(monkeypatch, capsys, tmp_path):
    from emulator.cli.commands import experiment
    from emulator.study import report

    monkeypatch.setattr(experiment, "Meter", PollOnce)
    monkeypatch.setattr(report, "write_report", lambda out: f"{out}/report.md")
    assert experiment._write_report(str(tmp_path)) == f"{tmp_path}/report.md"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[1].startswith("writing the report, with the model's projections to 1024 "
                                               "accelerators: done in ")
