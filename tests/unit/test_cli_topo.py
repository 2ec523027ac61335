"""``emu topo`` and the CLI's error discipline (one line, exit status 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from emulator.cli.main import main


def test_topo_show_json(capsys):
    assert main(["topo", "show", "bigraph:upper=4,lower=4,hosts_per_switch=2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hosts"] == 16 and data["switches"] == 8 and data["links"] == 32
    assert data["diameter_hops"] == 3
    assert data["bisection_bw_mbps"] == 80


def test_topo_show_text(capsys):
    assert main(["topo", "show", "fattree:k=4"]) == 0
    out = capsys.readouterr().out
    assert "hosts      16" in out and "diameter   5 switch hops" in out and "8 edge, 8 agg, 4 core" in out


def test_topo_export_then_show(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["topo", "export", "leafspine:leaves=2,spines=2,hosts_per_leaf=2", "-o", str(path)]) == 0
    assert main(["topo", "show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hosts"] == 4


@pytest.mark.parametrize("argv", [
    ["topo", "show", "fattree:k=3"],
    ["topo", "show", "bigraph:upper=4"],
    ["topo", "show", "star:hosts=4,bw=5000"],
    ["topo", "show", "/nonexistent/topo.json"],
    ["topo", "export", "nope:x=1", "-o", "{tmp}/never-written.json"],
    ["up", "fattree:k=5"],
])
def test_bad_input_is_one_line_and_status_2(argv, capsys, tmp_path):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("emu: ")
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_exit_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "emulator", "topo", "show"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "SPEC" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "emulator", "up", "star:hosts=2", "--controller", "nowhere"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "controller" in proc.stderr
