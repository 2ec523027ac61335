"""Bring-up on real Mininet and Open vSwitch: shaping, TCP at line rate, cleanup after SIGKILL."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import time

import pytest
from scapy.all import rdpcap

from emulator.base.naming import BRIDGE_RE, host_intf, switch_intf
from emulator.emulation.machine.started import alive, all_runs
from emulator.emulation.machine.system import run
from emulator.emulation.network.emulated_network import EmulatedNetwork
from emulator.emulation.network.tc_commands import parse_htb_rates
from emulator.model import topology
from emulator.runs.mpi_plan import BTL_PORT_MIN

pytestmark = pytest.mark.integration

BIGRAPH = "bigraph:upper=4,lower=4,hosts_per_switch=2"


def iperf3_mbps(client, server, server_ip: str, seconds: int = 5) -> float:
    server.cmd("iperf3 -s -1 -D -p 5301")
    time.sleep(0.3)
    out = client.cmd(f"iperf3 -c {server_ip} -p 5301 -t {seconds} -O 1 -J")
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


def test_bigraph_links_shaped_and_tcp_reaches_link_rate():
    topo = topology.build(BIGRAPH)
    with EmulatedNetwork(topo, routing="shortest", label="test-bringup") as en:
        assert en.datapath in ("user", "kernel")
        for link in topo.links:
            if link.kind == "host":
                host = en.host(link.a)
                ends = [(host_intf(link.a), host.pid), (switch_intf(link.b, link.b_port), None)]
            else:
                ends = [(switch_intf(link.a, link.a_port), None), (switch_intf(link.b, link.b_port), None)]
            for intf, pid in ends:
                cmd = ["tc", "class", "show", "dev", intf]
                if pid is not None:
                    cmd = ["mnexec", "-a", str(pid), *cmd]
                rates = parse_htb_rates(run(cmd).stdout)
                assert rates and all(r == pytest.approx(link.bw_mbps) for r in rates), (intf, rates)
        # h1 and h2 share switch s1
        assert topo.host("h1").switch == topo.host("h2").switch
        mbps = iperf3_mbps(en.host("h1"), en.host("h2"), topo.host("h2").ip)
        print(f"one link: TCP goodput {mbps / topo.host_bw:.3f} of the rate")
        # the bench's target for one link is 0.97 (measured 0.991-0.994); 0.981-0.991 over 3 runs here
        assert mbps >= 0.96 * topo.host_bw, f"TCP goodput {mbps:.2f} Mbit/s on a {topo.host_bw} Mbit/s link"
        # Host NICs: the sender's data frames went through the data class, the receiver's ACKs the control class.
        sent = {h: class_packets(en.host(h)) for h in ("h1", "h2")}
        assert sent["h1"]["10:2"] > 100 and sent["h2"]["10:1"] > 100, sent
        assert sent["h2"]["10:2"] < 0.1 * sent["h2"]["10:1"], sent


def class_packets(host) -> dict[str, int]:
    """Packets sent per HTB class on a host's interface (``tc -s class show``; a segmentation-offload packet
    counts as its frames)."""
    out = run(["mnexec", "-a", str(host.pid), "tc", "-s", "class", "show", "dev", host_intf(host.name)]).stdout
    counts, current = {}, None
    for line in out.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            current = words[2]
        elif words[:1] == ["Sent"] and current is not None:
            counts[current] = int(words[3])
    return counts


#: Reads every connection to port 5302 to its end (run inside the receiving host).
SINK = ("import socket\ns = socket.create_server(('', 5302), backlog=8)\nwhile True:\n"
        "    c, _ = s.accept()\n    while c.recv(1 << 20):\n        pass\n    c.close()\n")
#: Ten fresh connections, 128 KiB each: a new connection's first flight is where Linux's TCP built
#: segmentation-offload packets of seven jumbo frames.
BURSTS = ("import socket, sys\nfor _ in range(10):\n    c = socket.create_connection((sys.argv[1], 5302))\n"
          "    c.sendall(bytes(128 << 10))\n    c.shutdown(socket.SHUT_WR)\n    c.recv(1)\n    c.close()\n")


def test_a_host_sends_its_frames_at_the_link_pace(tmp_path):
    """A host's shaper hands the wire one frame at a time: no two data frames leave closer than a frame's time
    at the link rate. Before ``gso_max_segs 1`` a packet of several frames left them back to back, and the
    ACKs queued behind it waited its whole time (docs/fidelity.md)."""
    topo = topology.build("star:hosts=2")
    pcap = tmp_path / "h1.pcap"
    with EmulatedNetwork(topo, routing="shortest", label="test-pace") as en:
        h1, h2 = en.host("h1"), en.host("h2")
        (tmp_path / "sink.py").write_text(SINK)
        (tmp_path / "bursts.py").write_text(BURSTS)
        h2.cmd(f"python3 {tmp_path / 'sink.py'} >/dev/null 2>&1 &")
        h1.cmd(f"tcpdump -U -i {host_intf('h1')} -s 96 -w {pcap} 'tcp and src host {topo.host('h1').ip} "
               f"and greater 1000' >/dev/null 2>&1 &")
        time.sleep(1.0)
        h1.cmd(f"python3 {tmp_path / 'bursts.py'} {topo.host('h2').ip}")
        time.sleep(0.5)
        h1.cmd("kill %1")
        h2.cmd("kill %1")
        time.sleep(0.5)
    times = [float(p.time) for p in rdpcap(str(pcap))]
    frame_s = en.mtu * 8 / (topo.host_bw * 1e6)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) > 100, f"captured {len(times)} data frames of 10 x 128 KiB"
    assert min(gaps) > 0.5 * frame_s, f"{sum(g < 0.5 * frame_s for g in gaps)} frames left back to back"


#: A sink on Open MPI's transport's first port and on one outside it.
TWO_SINKS = ("import socket, threading\n"
             "def serve(port):\n    s = socket.create_server(('', port), backlog=4)\n    while True:\n"
             "        c, _ = s.accept()\n        while c.recv(1 << 16):\n            pass\n        c.close()\n"
             f"for p in ({BTL_PORT_MIN}, 5303):\n    threading.Thread(target=serve, args=(p,)).start()\n")
#: Fifty 100-byte messages to a port, a packet each.
SHORT_PACKETS = ("import socket, sys, time\nc = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
                 "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\nfor _ in range(50):\n"
                 "    c.sendall(bytes(100))\n    time.sleep(0.002)\nc.close()\n")


def host_class_packets(host) -> dict[str, int]:
    """Packets sent so far through the host queue's control (10:1) and data (10:2) classes."""
    out = host.cmd(f"tc -s class show dev {host_intf(host.name)}")
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"class htb (10:[12]) [^\n]*\n\s*Sent \d+ bytes (\d+) pkt", out)}


def test_open_mpis_connections_keep_their_packets_in_order_in_a_host(tmp_path):
    """Short packets of Open MPI's transport's connections go through the host's data FIFO, not ahead of it:
    one connection carries both directions' messages, and its ACKs overtaking its own data made the peer drop
    data as a blind injection (RFC 5961, docs/fidelity.md 2026-12-05). Other connections' short packets keep
    the control band."""
    topo = topology.build("star:hosts=2")
    with EmulatedNetwork(topo, routing="shortest", label="test-order") as en:
        h1, h2 = en.host("h1"), en.host("h2")
        (tmp_path / "sinks.py").write_text(TWO_SINKS)
        (tmp_path / "short.py").write_text(SHORT_PACKETS)
        h2.cmd(f"python3 {tmp_path / 'sinks.py'} >/dev/null 2>&1 &")
        time.sleep(1.0)
        sent = {}
        for port in (BTL_PORT_MIN, 5303):
            before = host_class_packets(h1)
            h1.cmd(f"python3 {tmp_path / 'short.py'} {topo.host('h2').ip} {port}")
            after = host_class_packets(h1)
            sent[port] = {klass: after[klass] - before[klass] for klass in after}
        h2.cmd("kill %1")
    assert sent[BTL_PORT_MIN]["10:2"] >= 50 and sent[BTL_PORT_MIN]["10:1"] < 5, sent
    assert sent[5303]["10:1"] >= 50, sent


def ovs_bridges() -> list[str]:
    return run(["ovs-vsctl", "list-br"]).stdout.split()


def our_interfaces() -> list[str]:
    out = run(["ip", "-o", "link", "show"]).stdout
    names = [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith("efs") or n.startswith("efh")]


def test_clean_after_sigkill_leaves_nothing(tmp_path):
    emu = [sys.executable, "-m", "emulator"]
    proc = subprocess.Popen([*emu, "up", "leafspine:leaves=2,spines=2,hosts_per_leaf=2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    banner = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("***") and "hosts" in line:
            banner = line
            break
    assert banner, "emu up did not report the network as up"
    # start a long-lived process inside a host, as an agent would
    runs = [r for r in all_runs() if r.owner() and r.owner()["pid"] == proc.pid]
    assert len(runs) == 1
    hosts = [p for p in runs[0].processes() if p["role"] == "host"]
    assert len(hosts) == 4
    sleeper = subprocess.Popen(["mnexec", "-a", str(hosts[0]["pid"]), "sleep", "600"])
    assert any(BRIDGE_RE.match(b) for b in ovs_bridges())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    result = subprocess.run([*emu, "clean"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sleeper.wait(timeout=10) is not None, "a process inside a host namespace survived"
    assert not [b for b in ovs_bridges() if BRIDGE_RE.match(b)]
    assert our_interfaces() == []
    assert not any(alive(p["pid"], p["start_time"]) for p in hosts)
    assert not [r for r in all_runs() if r.path == runs[0].path]
    # a second clean finds nothing
    again = subprocess.run([*emu, "clean"], capture_output=True, text=True, timeout=60)
    assert "nothing of ours" in again.stdout


def test_up_tears_down_on_exit():
    proc = subprocess.run([sys.executable, "-m", "emulator", "up", "star:hosts=2"], input="h1 ping -c1 h2\nexit\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 received" in proc.stdout + proc.stderr
    assert not [b for b in ovs_bridges() if BRIDGE_RE.match(b)]
