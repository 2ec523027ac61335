"""``emu pingall`` end to end (root): a network, the controller, every pair pinged, everything torn down."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def emu(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_pingall_json_reports_no_loss():
    res = emu("pingall", "leafspine:leaves=2,spines=2,hosts_per_leaf=2", "--routing", "ecmp", "--ecmp-seed", "3",
              "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["pairs"] == 12 and out["loss"] == 0.0 and out["lost"] == 0


@pytest.mark.parametrize("args", [
    ("pingall", "fattree:k=4", "--routing", "bigraph"),
    ("pingall", "/nonexistent/topology.json", "--routing", "ecmp"),
    ("controller", "--topology", "leafspine:leaves=2", "--routing", "ecmp"),
    ("controller", "--topology", "fattree:k=4", "--routing", "random"),
])
def test_bad_input_one_line_exit_2_nothing_started(args):
    res = emu(*args, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("emu: "), res.stderr
