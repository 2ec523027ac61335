"""Building a controller child process without importing :mod:`controllers` (nothing is started)."""

from __future__ import annotations

import pytest

from emulator.base.errors import UserError
from emulator.emulation.machine.system import Result
from emulator.emulation.network.controller_process import (
    ControllerProcess,
    bridges_looking_for,
    proc_net_address,
    reconnect_switches,
)


def test_for_network_builds_checked_settings_on_a_free_loopback_port(tmp_path):
    stats = str(tmp_path / "ports.jsonl")
    ctl = ControllerProcess.for_network("star:hosts=2", "shortest", seed=3, stats_file=stats, stats_interval_s=0.5,
                                        log_file=str(tmp_path / "controller.log"))
    host, port = ctl.address
    assert host == "127.0.0.1" and 0 < port < 65536
    assert (ctl.settings.routing, ctl.settings.seed, ctl.settings.stats_file) == ("shortest", 3, stats)
    assert ctl.settings.stats_interval == 0.5 and ctl.log_path() == str(tmp_path / "controller.log")
    assert not ctl.running() and len(ctl.topo.switches) == 1


def test_for_network_rejects_a_policy_the_topology_cannot_use():
    with pytest.raises(UserError):
        ControllerProcess.for_network("star:hosts=2", "bigraph")


def test_addresses_are_written_as_proc_net_tcp_does():
    assert proc_net_address("127.0.0.1") == "0100007F"


BRIDGES = "efs1,aaa\nefs2,bbb\nefs3,\"aaa ccc\"\nbr-other,aaa\nefs4,ddd\n"
CONTROLLERS = "aaa,\"tcp:127.0.0.1:6653\"\nbbb,\"tcp:127.0.0.1:7000\"\nccc,\"tcp:127.0.0.1:7000\"\nddd,\n"


def test_only_our_bridges_that_look_for_the_target_are_found():
    assert bridges_looking_for("tcp:127.0.0.1:6653", BRIDGES, CONTROLLERS) == ["efs1", "efs3"]
    assert bridges_looking_for("tcp:127.0.0.1:7000", BRIDGES, CONTROLLERS) == ["efs2", "efs3"]
    assert bridges_looking_for("tcp:127.0.0.1:9", BRIDGES, CONTROLLERS) == []


def test_reconnect_removes_then_gives_back_the_controller_in_separate_transactions():
    calls: list[list[str]] = []

    def runner(cmd):
        calls.append(list(cmd))
        out = BRIDGES if "Bridge" in cmd else CONTROLLERS if "Controller" in cmd and "list" in cmd else ""
        return Result(0, out, "")

    assert reconnect_switches("tcp:127.0.0.1:6653", runner) == ["efs1", "efs3"]
    changes = [c for c in calls if "list" not in c]
    assert [c.count("del-controller") for c in changes] == [2, 0, 0]
    assert changes[1].count("set-controller") == 2 and "tcp:127.0.0.1:6653" in changes[1]
    assert "max_backoff=1000" in changes[2]
    assert all("br-other" not in c and "efs2" not in c for c in changes)


def test_reconnect_with_no_bridge_or_no_listing_changes_nothing():
    calls: list[list[str]] = []

    def runner(cmd):
        calls.append(list(cmd))
        return Result(1, "", "database connection failed")

    assert reconnect_switches("tcp:127.0.0.1:6653", runner) == []
    assert all("list" in c for c in calls)
