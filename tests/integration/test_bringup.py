"""Bring-up on real Mininet and Open vSwitch: shaping, TCP at line rate, cleanup after SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from emulator.base.naming import BRIDGE_RE, host_intf, switch_intf
from emulator.emulation.network import EmulatedNetwork
from emulator.emulation.runstate import alive, all_runs
from emulator.emulation.system import run
from emulator.emulation.tc_commands import parse_htb_rates
from emulator.model import topology

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
    """Packets sent per HTB class on a host's interface (``tc -s class show``)."""
    out = run(["mnexec", "-a", str(host.pid), "tc", "-s", "class", "show", "dev", host_intf(host.name)]).stdout
    counts, current = {}, None
    for line in out.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            current = words[2]
        elif words[:1] == ["Sent"] and current is not None:
            counts[current] = int(words[3])
    return counts


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
