"""Fabric profiles: presets and keys, the mapping onto the emulator, and bad input."""

from __future__ import annotations

import pytest
from fuzz_support import FUZZ, WEIRD, user_error_or
from hypothesis import given
from hypothesis import strategies as st

from emulator.base.errors import FieldError
from emulator.cli.main import main
from emulator.model import fabric, topology
from emulator.model.collectives.generators import generate
from emulator.model.schedule import format as sformat


def test_presets_and_the_default():
    assert fabric.parse(None) == fabric.default() == fabric.PRESETS[fabric.DEFAULT_PRESET]
    for name, preset in fabric.PRESETS.items():
        assert fabric.parse(name) == preset
        assert fabric.MIN_LINK_MBPS <= preset.emulated_link_mbps <= fabric.MAX_LINK_MBPS
    # the default profile's MTU is the MTU of networks built without one
    assert fabric.default().emulated_mtu == topology.DEFAULT_MTU


def test_keys_not_given_take_the_base_presets_values():
    base = fabric.default()
    p = fabric.parse("alpha_us=10")
    assert p.alpha_us == 10 and (p.link_gbps, p.mtu, p.switch_latency_us, p.dilation) == \
        (base.link_gbps, base.mtu, base.switch_latency_us, base.dilation)
    ib = fabric.parse("preset=ib200,alpha_us=3")
    assert ib.alpha_us == 3 and ib.mtu == fabric.PRESETS["ib200"].mtu
    assert fabric.parse({"preset": "ib200", "mtu": 2048}).mtu == 2048  # a YAML mapping


@pytest.mark.parametrize("name", sorted(fabric.PRESETS))
def test_the_canonical_spec_reads_back(name):
    p = fabric.parse(f"preset={name},alpha_us=12.5,dilation=7000")
    assert fabric.parse(p.spec()) == p


def test_the_same_fabric_at_another_emulated_rate():
    p = fabric.at_link_rate(fabric.parse("preset=ib200,alpha_us=3"), 40.0)
    assert p.emulated_link_mbps == pytest.approx(40.0) and p.dilation == pytest.approx(5000)
    assert (p.preset, p.link_gbps, p.alpha_us, p.mtu) == ("ib200", 200.0, 3.0, 4096)
    with pytest.raises(FieldError, match="field 'dilation'"):
        fabric.at_link_rate(fabric.default(), 5000.0)


def test_the_mapping_onto_the_emulator():
    p = fabric.parse("link_gbps=100,mtu=9000,switch_latency_us=1,alpha_us=8,dilation=10000")
    assert p.emulated_link_mbps == pytest.approx(10.0)
    assert p.alpha_s == pytest.approx(0.08) and p.switch_latency_s == pytest.approx(0.01)
    # a 9000-byte frame at 10 Mbit/s takes 10^4 times what it takes at 100 Gbit/s: the MTU is kept
    assert p.emulated_mtu == 9000 and p.frame_time_error == 0
    assert 9000 * 8 / (p.emulated_link_mbps * 1e6) == pytest.approx(p.dilation * 9000 * 8 / 100e9)
    assert fabric.message_latency_s(p, 3) == pytest.approx(0.08 + 3 * 0.01)
    assert fabric.rendezvous_latency_s(p, 3) == pytest.approx(3 * 0.01)
    assert p.real_seconds(1.0) == pytest.approx(1e-4) and p.real_mbps(9.5) == pytest.approx(95_000)
    assert "10 Mbit/s emulated links stand for 100 Gbit/s" in p.describe()


def test_an_mtu_the_emulator_cannot_carry_is_replaced_by_the_closest_and_the_error_stated():
    big = fabric.parse("mtu=65000")
    assert big.emulated_mtu == fabric.MAX_MTU and big.frame_time_error == pytest.approx(fabric.MAX_MTU / 65000 - 1)
    assert "frame times" in big.describe() and "-51%" in big.describe()
    small = fabric.parse("mtu=200")
    assert small.emulated_mtu == fabric.MIN_MTU and small.frame_time_error > 0


@pytest.mark.parametrize("spec, key", [
    ("alpha_us=-1", "alpha_us"), ("switch_latency_us=-0.5", "switch_latency_us"), ("alpha_us=nan", "alpha_us"),
    ("roce9000", "preset"), ("preset=nope", "preset"), ("dilation=10", "dilation"), ("dilation=1e7", "dilation"),
    ("link_gbps=0", "link_gbps"), ("link_gbps=inf", "link_gbps"), ("mtu=9000.5", "mtu"), ("mtu=40", "mtu"),
    ("speed=9", "speed"), ("alpha_us", "preset"), ("alpha_us=1,alpha_us=2", "alpha_us"), ("=3", "(spec)"),
])
def test_bad_profiles_name_the_key(spec, key):
    with pytest.raises(FieldError) as err:
        fabric.parse(spec, where="replay: fabric")
    assert err.value.field == key and "\n" not in str(err.value)


def test_a_dilation_outside_the_shapers_range_says_which_dilations_fit():
    with pytest.raises(FieldError, match="a dilation from 100 to 1e"):
        fabric.parse("dilation=50")


@FUZZ
@given(items=st.dictionaries(st.sampled_from([*fabric.KEYS, "other"]),
                             st.one_of(WEIRD, st.floats(allow_nan=True), st.integers(-10, 10**9),
                                       st.sampled_from(list(fabric.PRESETS)))))
def test_any_mapping_is_a_profile_or_one_line(items):
    p = user_error_or(fabric.parse, items)
    if p is not None:
        assert fabric.MIN_LINK_MBPS <= p.emulated_link_mbps <= fabric.MAX_LINK_MBPS
        assert p.alpha_s >= 0 and p.switch_latency_s >= 0 and fabric.MIN_MTU <= p.emulated_mtu <= fabric.MAX_MTU
        assert fabric.parse(p.spec()) == p
        assert fabric.parse(p.short_spec()) == p


@pytest.mark.parametrize("argv", [
    ["replay", "{s}", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "{out}", "--fabric", "dilation=1"],
    ["replay", "{s}", "--topology", "star:hosts=2", "--routing", "shortest", "--out", "{out}", "--fabric", "nope"],
    ["schedule", "check", "{s}", "--fabric", "switch_latency_us=-3"],
    ["calibrate", "--fabric", "mtu=12"],
    ["bench", "--fabric", "preset=ib200,link_gbps=0"],
])
def test_every_command_refuses_a_bad_profile_in_one_line_and_starts_nothing(tmp_path, capsys, argv):
    schedule = tmp_path / "s.yaml"
    sformat.save(generate("ring", topology.build("star:hosts=2"), 64), str(schedule))
    out = tmp_path / "out"
    argv = [a.format(s=schedule, out=out) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fabric" in err and "field '" in err
    assert not out.exists()


def test_each_derived_figure_has_one_function():
    p = fabric.parse("bandwidth-only")
    assert p.emulated_link_mbps == 25 and p.dilation_for(25) == p.dilation == 4000
    assert fabric.at_link_rate(p, 20) == p.changed(dilation=5000) and p.changed(dilation=5000).preset == "bandwidth-only"
    assert fabric.dilation_of(p) == 4000 and fabric.dilation_of(None) == 1.0
    with pytest.raises(FieldError, match="dilation"):
        p.changed(dilation=1)  # 100 Gbit/s at 100000 Mbit/s: beyond what the emulator shapes


def test_the_short_spec_names_only_what_differs_from_the_preset():
    assert fabric.default().short_spec() == fabric.DEFAULT_PRESET
    assert fabric.default().changed(dilation=4195).short_spec() == "dilation=4195"
    assert fabric.parse("bandwidth-only").changed(dilation=4195).short_spec() == "preset=bandwidth-only,dilation=4195"
    odd = fabric.parse("preset=eth25,mtu=4000,alpha_us=1.5")
    assert odd.short_spec() == "preset=eth25,mtu=4000,alpha_us=1.5" and fabric.parse(odd.short_spec()) == odd

