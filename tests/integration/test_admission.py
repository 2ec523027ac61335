"""Admission on this machine (root): runs that cannot fit are refused before anything starts.

Each command is run as a user would, against this machine's real memory and
calibration, with sizes that do not fit its memory (the 8 GiB ring on 16
hosts that once woke the kernel's out-of-memory killer), predictions over
``--max-time``, and a load beyond the calibrated datapath capacity. Every
refusal is one line on stderr naming the numbers, exit status 2, within
seconds, and leaves nothing: no output folder, no network, no process of ours.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.system import memory_available
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.schedule.format import save

pytestmark = pytest.mark.integration

EMU = [sys.executable, "-m", "emulator"]


def refused(*args: str) -> str:
    """Run ``emu ARGS``; assert a one-line refusal (status 2) within 60 s that started nothing; return the line.

    The command gets a run-state root of its own (``EF_RUN_DIR``): any network, controller or agent it started
    would be recorded there, and the network lock taken there, so it must stay empty (other networks on the
    machine cannot disturb this).
    """
    state = tempfile.mkdtemp(prefix="ef-admission-")
    t0 = time.monotonic()
    res = subprocess.run([*EMU, *args], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "EF_RUN_DIR": state})
    assert res.returncode == 2, res.stdout + res.stderr
    assert time.monotonic() - t0 < 60
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("emu: "), res.stderr
    assert os.listdir(state) == []
    os.rmdir(state)
    return res.stderr


def test_a_replay_bigger_than_memory_is_refused_with_both_numbers(tmp_path):
    path = tmp_path / "ring-8GiB.json"
    save(generators.generate("ring", topology.build("star:hosts=16"), 8 << 30), str(path))
    line = refused("replay", str(path), "--topology", "star:hosts=16", "--routing", "shortest",
                   "--out", str(tmp_path / "out"))
    said = re.search(r"\(([0-9.]+) GiB available, less a reserve\)", line)
    assert said is not None and "field 'memory'" in line and "16 agents" in line, line
    assert abs(float(said.group(1)) - memory_available()[0] / (1 << 30)) < 1.0  # this machine's, as it moves
    assert "field 'max-time'" in line  # 8 GiB at 20 Mbit/s takes hours too
    assert not (tmp_path / "out").exists()


def test_a_replay_over_max_time_is_refused_and_a_larger_max_time_admits_it(tmp_path):
    path = tmp_path / "ring-16MiB.json"
    save(generators.generate("ring", topology.build("star:hosts=4"), 16 << 20), str(path))
    line = refused("replay", str(path), "--topology", "star:hosts=4", "--routing", "shortest",
                   "--out", str(tmp_path / "out"), "--max-time", "20s")
    assert "--max-time 20 s" in line and "field 'memory'" not in line
    # --check-like: the same run with room is admitted (stopped before root work by a bad --pcap link)
    res = subprocess.run([*EMU, "replay", str(path), "--topology", "star:hosts=4", "--routing", "shortest",
                          "--out", str(tmp_path / "out2"), "--max-time", "2h", "--pcap", "s9-s9"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "pcap" in res.stderr and "max-time" not in res.stderr


def test_a_load_beyond_the_calibrated_capacity_and_agents_beyond_the_cores_are_refused(tmp_path):
    path = tmp_path / "hd-ft8.json"
    save(generators.generate("hd", topology.build("fattree:k=8"), 16 << 20), str(path))
    line = refused("replay", str(path), "--topology", "fattree:k=8", "--routing", "ecmp",
                   "--out", str(tmp_path / "out"))
    assert "field 'agents'" in line and "the agents' busiest step takes" in line
    assert "--allow-untrusted" in line
    calibration = calibration_file.load_calibration(9000)
    if calibration is not None and calibration.datapath_capacity_mbps is not None:  # else the load is only warned about
        assert "field 'load'" in line and "calibrated capacity" in line and "--fabric dilation=" in line


def test_an_experiment_that_does_not_fit_is_refused_and_no_results_folder_is_made(tmp_path):
    exp = tmp_path / "huge.yaml"
    exp.write_text("name: huge\nrepeat: 1\nwarmup: 0\nsizes: [4GiB]\nseries:\n  - name: s\n    runs:\n"
                   "      - topology: star:hosts=16\n        routing: shortest\n        algorithms: [ring]\n")
    out = tmp_path / "results"
    line = refused("run", str(exp), "--out", str(out))
    assert "run: field 'memory'" in line
    assert not out.exists()
    assert "run: field 'memory'" in refused("run", str(exp), "--check")


def test_mpirun_and_bench_refuse_sizes_that_do_not_fit(tmp_path):
    line = refused("mpirun", "--topology", "star:hosts=16", "--routing", "shortest", "--out", str(tmp_path / "m"),
                   "--", "emu-allreduce-bench", "--algo", "ring", "--sizes", "1GiB")
    assert "mpirun: field 'memory'" in line and "16 MPI ranks" in line
    line = refused("bench", "--sizes", "64KiB,1GiB", "--out", str(tmp_path / "b"))
    assert "bench: field 'memory'" in line and "bench: field 'max-time'" in line
    assert not (tmp_path / "m").exists() and not (tmp_path / "b").exists()
    json.dumps(line)  # one printable line
