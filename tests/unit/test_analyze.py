"""emu analyze on small pcaps written here with scapy: flows, bins, mean and peak rates, host names."""

from __future__ import annotations

import json
import os

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import PcapWriter

from emulator.base.errors import UserError
from emulator.cli.main import main
from emulator.model import topology
from emulator.selfcheck import capture_analysis as analyze


def seg(t: float, src: str, dst: str, sport: int, dport: int, payload: int, snap: int | None = None):
    pkt = Ether() / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags="A") / Raw(b"x" * payload)
    pkt = Ether(bytes(pkt))  # fill in lengths
    if snap is not None:  # as tcpdump -s 96 does: the IP header still says the full length
        pkt = Ether(bytes(pkt)[:snap])
    pkt.time = t
    return pkt


def write_pcap(path, packets) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with PcapWriter(str(path), linktype=1, sync=True) as w:
        for p in packets:
            w.write(p)


@pytest.fixture
def replay_dir(tmp_path):
    topo = topology.build("star:hosts=2")
    (tmp_path / "topology.json").write_text(json.dumps(topo.to_json()))
    a, b = topo.host("h1").ip, topo.host("h2").ip
    pkts = []
    # h1 -> h2: 10 segments of 1000 B, 20 ms apart (0.00 .. 0.18 s): bins 0 and 1, 5000 B each.
    for i in range(10):
        pkts.append(seg(100.0 + 0.02 * i, a, b, 40002, 5000, 1000, snap=96))
        pkts.append(seg(100.0 + 0.02 * i + 0.001, b, a, 5000, 40002, 0))  # pure ACKs: no flow
    # h2 -> h1: one burst of 3 x 2000 B at 0.5 s.
    for i in range(3):
        pkts.append(seg(100.5 + 0.001 * i, b, a, 40001, 5000, 2000))
    write_pcap(tmp_path / "pcap" / "h1-s1.pcap", pkts)
    return tmp_path, topo


def test_flows_bins_and_rates(replay_dir):
    d, topo = replay_dir
    result = analyze.analyze_dir(str(d))
    flows = result["flows"]
    assert len(flows) == 2
    f1, f2 = flows
    assert (f1["src_host"], f1["dst_host"], f1["sport"], f1["dport"]) == ("h1", "h2", 40002, 5000)
    assert f1["bytes"] == 10_000 and f1["packets"] == 10
    assert f1["bytes_per_bin"] == [5000, 5000]
    assert f1["active_s"] == pytest.approx(0.18)
    assert f1["mean_mbps"] == pytest.approx(10_000 * 8 / 0.18 / 1e6)
    assert f1["peak_mbps"] == pytest.approx(5000 * 8 / 0.1 / 1e6)
    assert (f2["src_host"], f2["dst_host"], f2["bytes"]) == ("h2", "h1", 6000)
    assert f2["bin_start"] == 5 and f2["bytes_per_bin"] == [6000]
    assert result["packets_per_link"] == {"h1-s1": 23}
    on_disk = json.loads((d / "flows.json").read_text())
    assert on_disk["flows"] == json.loads(json.dumps(flows))


def test_cli_summary_and_names_without_topology(replay_dir, capsys):
    d, topo = replay_dir
    os.unlink(d / "topology.json")
    assert main(["analyze", str(d), "--bin", "50"]) == 0
    out = capsys.readouterr().out
    assert f"{topo.host('h1').ip}:40002 -> {topo.host('h2').ip}:5000" in out
    data = json.loads((d / "flows.json").read_text())
    assert data["bin_s"] == pytest.approx(0.05)
    assert data["flows"][0]["src_host"] is None


def test_bins_align_across_links():
    pk = {"a": [(10.0, "1.1.1.1", "2.2.2.2", 1, 2, 100)], "b": [(10.35, "1.1.1.1", "2.2.2.2", 1, 2, 100)]}
    flows = analyze.analyze_packets(pk)["flows"]
    assert [f["bin_start"] for f in flows] == [0, 3]


def test_missing_pcaps_and_bad_bin(tmp_path):
    with pytest.raises(UserError, match="pcap"):
        analyze.analyze_dir(str(tmp_path))
    with pytest.raises(UserError, match="field 'bin'"):
        analyze.analyze_packets({}, bin_s=0)
    assert main(["analyze", str(tmp_path)]) == 2
