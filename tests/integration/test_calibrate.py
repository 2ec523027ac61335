"""emu calibrate --quick and emu replay --pcap + emu analyze on real Mininet and Open vSwitch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from emulator.emulation.machine import calibration_file
from emulator.model import routing, topology
from emulator.model.collectives import generators
from emulator.model.schedule import format as sformat
from emulator.model.topology import DEFAULT_MTU
from emulator.selfcheck.live import calibration

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def emu(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_calibrate_quick_writes_a_calibration_file(quick_calibration, monkeypatch):
    # the session's one quick calibration (conftest.py), in a directory of its own: never the machine's
    res, state = quick_calibration.done, quick_calibration.state_dir
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(open(quick_calibration.path, encoding="utf-8").read())
    # the bench's targets (docs/fidelity.md: one link 0.991-0.998, agents / iperf3 0.994-0.995, target 0.97 each)
    # less the noise of the quick calibration's short flows (docs/testing-accuracy.md)
    assert data["one_link_ratio"] >= 0.95, data["measurements"]["one_link"]
    assert data["machine"]["mtu"] == DEFAULT_MTU and data["machine"]["nproc"] >= 1
    assert data["machine"]["kernel"] and data["machine"]["ovs_version"] and data["machine"]["date"]
    assert data["measurements"]["capacity"]["points"], "no capacity point measured"
    assert data["datapath_capacity_mbps"] is None or data["datapath_capacity_mbps"] > 0
    print(f"calibrate --quick: one link {data['one_link_ratio']:.3f}, agents/iperf3 {data['agent_over_iperf3']:.3f}")
    assert data["agent_over_iperf3"] >= 0.95, data["measurements"]["agents_vs_iperf3"]
    assert "one link goodput / rate" in res.stdout
    # the intrinsic latency over 1, 2, 3 and 5 switches: a fraction of a millisecond to a few, never negative
    per = data["latency"]["per_switches"]
    assert sorted(per, key=int) == ["1", "2", "3", "5"]
    for v in per.values():
        assert 0 < v["data_s"] < 0.05 and 0 < v["rendezvous_s"] < 0.05 and v["messages"] > 0
    assert "intrinsic latency per message" in res.stdout
    monkeypatch.setenv("EF_STATE_DIR", state)
    calibration = calibration_file.load_calibration(DEFAULT_MTU)  # made on this machine: it counts here
    assert calibration is not None and calibration.to_json() == data


def test_agents_against_iperf3_with_every_flow_at_once():
    """The bench's aggregate row on a small share (20 Mbit/s links, or the first slower rate at which iperf3 keeps
    up, as the row chooses on a loaded machine: 10 in a clean-clone run on 2026-12-07): both carry about what is
    offered."""
    row = calibration.measure_agents_aggregate(640.0, seconds=1.5, repeat=1)
    assert 0 < row["link_mbps"] <= 20.0 and row["flows"] == calibration.AGGREGATE_HOSTS
    assert len(row["iperf3_flows_mbps"]) == row["flows"] and len(row["agent_reps_mbps"]) == 1
    print(f"aggregate: iperf3/offered {row['iperf3_over_offered']:.3f}, agents/offered {row['agent_over_offered']:.3f}, "
          f"agents/iperf3 {row['ratio']:.3f}")
    # `make bench`'s target for agents / iperf3 with every flow at once is 0.90 (measured there 0.938-0.977); this
    # 1.5 s, one-repetition version measured 0.898-0.911 (agents / offered 0.880-0.896): the target less that
    # shortfall and the spread (docs/testing-accuracy.md, 2026-12-06). Before: 0.7, which agents at 3/4 of
    # iperf3's goodput passed.
    assert 0.85 <= row["iperf3_over_offered"] <= 1.02, row
    assert 0.85 <= row["agent_over_offered"] <= 1.02 and 0.85 <= row["ratio"] <= 1.05, row


def test_replay_pcap_then_analyze_finds_the_agent_flows(tmp_path):
    topo = topology.build("star:hosts=2,bw=20")
    size = 1 << 20
    sched = tmp_path / "ring.json"
    sformat.save(generators.generate("ring", topo, size), str(sched))
    out = tmp_path / "run"
    res = emu("replay", str(sched), "--topology", topo.spec, "--routing", "shortest", "--out", str(out),
              "--repeat", "1", "--warmup", "0", "--pcap", "h1-s1")
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-2000:]
    assert (out / "pcap" / "h1-s1.pcap").stat().st_size > 0
    res = emu("analyze", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    flows = json.loads((out / "flows.json").read_text())["flows"]
    by_pair = {(f["src_host"], f["dst_host"], f["sport"], f["dport"]): f for f in flows}
    for src, dst in (("h1", "h2"), ("h2", "h1")):
        flow = routing.agent_flow(topo, src, dst)
        f = by_pair.get((src, dst, flow.sport, flow.dport))
        assert f is not None, f"agent flow {src} -> {dst} not found in {sorted(by_pair)}"
        assert f["bytes"] >= size  # ring on 2 ranks: each rank sends the whole buffer, half per step
        assert 0 < f["mean_mbps"] <= 20 * 1.05 and f["peak_mbps"] <= 20 * 1.3
    assert "h1:" in res.stdout
