"""Per-message latency: intrinsic curves, the agents' compensation, floors, and the fidelity flag."""

from __future__ import annotations

import pytest

from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.calibration_file import Calibration, Machine
from emulator.emulation.session import fidelity
from emulator.model import fabric
from emulator.model.latency import Curve, Intrinsic, LatencyModel, PathLatency
from emulator.model.topology import last_segment_bytes

PROFILE = fabric.parse("alpha_us=8,switch_latency_us=1,dilation=10000")  # 80 ms per message, 10 ms per switch


def test_curves_interpolate_between_measured_path_lengths_and_continue_beyond():
    c = Curve(((1, 0.4e-3), (3, 0.6e-3), (5, 2.6e-3)))
    assert c.at(1) == pytest.approx(0.4e-3) and c.at(2) == pytest.approx(0.5e-3)
    assert c.at(4) == pytest.approx(1.6e-3) and c.at(7) == pytest.approx(4.6e-3)
    assert c.at(0) == pytest.approx(0.3e-3)
    assert Curve(((1, -1.0), (2, -2.0))).at(3) == 0.0  # never below zero
    assert Curve(((2, 1e-3),)).at(9) == 1e-3 and Curve().at(4) == 0.0
    assert Curve.from_json(c.to_json()) == c


def test_compensation_is_target_minus_intrinsic_never_negative():
    intrinsic = Intrinsic(data=Curve(((1, 0.5e-3), (3, 1.5e-3))), rendezvous=Curve(((1, 1e-3),)),
                          ack=Curve(((1, 0.4e-3),)), source="test")
    model = LatencyModel(PROFILE, intrinsic)
    p = model.path(3)
    assert p.message_target_s == pytest.approx(0.08 + 0.03) and p.rendezvous_target_s == pytest.approx(0.03)
    assert p.sleep_s == pytest.approx(0.11 - 1.5e-3)  # the agents add what the machine does not
    assert p.message_s == pytest.approx(0.11) and not p.floor
    assert model.floors([1, 2, 3, 5]) == []


def test_an_intrinsic_latency_above_the_target_is_a_floor():
    slow = Intrinsic(data=Curve(((1, 0.2),)), source="test")
    p = LatencyModel(PROFILE, slow).path(1)
    assert p.sleep_s == 0.0 and p.message_s == pytest.approx(0.2) and p.floor
    late_cts = Intrinsic(rendezvous=Curve(((1, 0.5),)), source="test")
    assert LatencyModel(PROFILE, late_cts).path(1).floor  # the clear to send alone is too slow
    zero = LatencyModel(fabric.parse("bandwidth-only"), Intrinsic(data=Curve(((1, 1e-4),)), source="test"))
    assert zero.floors([1, 3]) == [1, 3]  # a profile of no latency cannot be met by any machine
    assert not LatencyModel(fabric.parse("bandwidth-only")).path(1).floor  # ... unless it adds nothing


def test_netem_puts_the_switch_latency_on_the_links_and_the_agents_add_only_the_rest():
    intrinsic = Intrinsic(data=Curve(((1, 1e-3),)), source="test")
    p = LatencyModel(PROFILE, intrinsic, netem=True).path(2)
    assert p.link_s == pytest.approx(0.02) and p.sleep_s == pytest.approx(0.08 + 0.02 - 0.02 - 1e-3)
    assert p.message_s == pytest.approx(0.1)
    assert LatencyModel(PROFILE, netem=True).link_delay_per_switch_s == pytest.approx(0.01)


def test_the_serialisation_the_shapers_do_not_charge():
    p = PathLatency(2, 0.1, 0.02, 0.0, 0.0, 0.0, 0.0, byte_s=3 / 2.5e6, mss=8948, burst_bytes=100)
    assert p.unshaped_s(4000) == pytest.approx((4000 + 100) * 3 / 2.5e6)
    assert p.unshaped_s(1 << 20) == pytest.approx((last_segment_bytes(1 << 20, 8948) + 100) * 3 / 2.5e6)
    assert PathLatency(1, 0, 0, 0, 0, 0, 0).unshaped_s(4000) == 0.0  # no link details: nothing added
    assert PathLatency.from_json(p.to_json()) == p


def test_last_segments():
    assert [last_segment_bytes(n, 100) for n in (1, 99, 100, 101, 250, 300)] == [1, 99, 100, 1, 50, 100]
    assert last_segment_bytes(0, 100) == 0


def test_lateness_and_the_latency_floor_flag():
    assert fidelity.lateness([0.001, 0.002, 0.02], [0.1, 0.1, 0.1]) == pytest.approx(0.02)
    assert fidelity.lateness([0.5], [0.0]) is None
    snap = fidelity.Snapshot(time=0.0)
    after = fidelity.Snapshot(time=1.0, cpu_idle=50.0, cpu_total=100.0)
    cal = Calibration(version=calibration_file.CALIBRATION_VERSION, machine=Machine(kernel=None, ovs_version=None, nproc=None),
                      datapath_capacity_mbps=1000.0, recommended_link_mbps=None, latency=None)
    ok = fidelity.assess(snap, after, 1.0, 0, cal, floors=[], late_fraction=0.01)
    assert "latency_floor" not in ok.flags and ok.trusted
    late = fidelity.assess(snap, after, 1.0, 0, cal, floors=[], late_fraction=0.2)
    floor = fidelity.assess(snap, after, 1.0, 0, cal, floors=[5], late_fraction=None)
    for fid in (late, floor):
        assert "latency_floor" in fid.flags and not fid.trusted
    assert floor.latency_floor_switches == [5]
