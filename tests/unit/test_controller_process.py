"""Building a controller child process without importing :mod:`controllers` (nothing is started)."""

from __future__ import annotations

import pytest

from emulator.base.errors import UserError
from emulator.emulation.controller_process import ControllerProcess, proc_net_address


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
