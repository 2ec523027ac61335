"""Fixtures the integration tests share across files: one quick calibration for the whole session.

``emu calibrate --quick`` takes about a hundred seconds (three networks). It is made once, into a directory of
the session's own (never the machine's calibration), and ``test_calibrate.py`` checks it. A test that needs the
machine to have a calibration (``emu cluster check``'s servers read ``/var/lib/ef-emu``) gets that one
installed as the machine's when there is none, for the session only: it is removed when the session ends (a
test session's calibration, made while tests load the machine, must not become what ``make experiment`` sizes
its rates by: on 2026-12-07 one without a datapath capacity let ``dilation: auto`` choose rates the datapath
could not carry). It is never skipped for the want of one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from emulator.emulation.machine import calibration_file
from emulator.model.topology import DEFAULT_MTU

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class QuickCalibration:
    """``emu calibrate --quick --bw 10`` as run once for the session: where it wrote and what it said."""

    state_dir: str
    done: subprocess.CompletedProcess[str]

    @property
    def path(self) -> str:
        return os.path.join(self.state_dir, f"calibration-mtu{DEFAULT_MTU}.json")


@pytest.fixture(scope="session")
def quick_calibration(tmp_path_factory) -> QuickCalibration:
    state = str(tmp_path_factory.mktemp("calibration-state"))
    done = subprocess.run([sys.executable, "-m", "emulator", "calibrate", "--quick", "--bw", "10"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "EF_STATE_DIR": state})
    return QuickCalibration(state, done)


@pytest.fixture(scope="session")
def machine_calibration(request) -> Iterator[calibration_file.Calibration]:
    """This machine's calibration at MTU 9000; when it has none, the session's quick one is installed as it until
    the session ends (then removed, if it is still the one installed)."""
    found = calibration_file.load_calibration(DEFAULT_MTU)
    if found is not None:
        yield found
        return
    quick: QuickCalibration = request.getfixturevalue("quick_calibration")
    assert quick.done.returncode == 0, quick.done.stderr[-2000:]
    target = calibration_file.calibration_path(DEFAULT_MTU)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(quick.path, target)
    with open(target, "rb") as fh:
        installed = fh.read()
    print(f"no calibration of this machine at MTU {DEFAULT_MTU}: the session's quick one installed as {target}")
    made = calibration_file.load_calibration(DEFAULT_MTU)
    assert made is not None, f"{target}: the quick calibration does not load as this machine's"
    try:
        yield made
    finally:
        try:
            with open(target, "rb") as fh:
                still = fh.read() == installed
        except FileNotFoundError:
            still = False
        if still:
            os.unlink(target)
