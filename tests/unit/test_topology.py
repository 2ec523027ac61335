"""Topology models: counts, degrees, ports, hops, bisection, JSON, bad specs."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest

from emulator.base.errors import FieldError, UserError
from emulator.model import topology
from emulator.model.topology import build

SPECS = [
    "bigraph:upper=2,lower=2,hosts_per_switch=2",
    "bigraph:upper=4,lower=4,hosts_per_switch=2",
    "bigraph:upper=4,lower=4,hosts_per_switch=4",
    "bigraph:upper=3,lower=2,hosts_per_switch=1",
    "fattree:k=2",
    "fattree:k=4",
    "fattree:k=8",
    "leafspine:leaves=4,spines=2,hosts_per_leaf=4",
    "leafspine:leaves=8,spines=4,hosts_per_leaf=4",
    "leafspine:leaves=3,spines=2,hosts_per_leaf=3",
    "star:hosts=8",
    "star:hosts=1",
]


@pytest.mark.parametrize("spec", SPECS)
def test_ports_are_unique_and_consistent(spec):
    topo = build(spec)
    seen = set()
    for link in topo.links:
        for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
            assert (node, port) not in seen, f"{node} port {port} used twice"
            seen.add((node, port))
            assert topo.link_at(node, port) is link
    for sw in topo.switches:
        ports = sorted(p for (n, p) in seen if n == sw.name)
        assert ports == list(range(1, len(ports) + 1)), "switch ports are numbered 1..degree"
    for h in topo.hosts:
        assert topo.port_to(h.switch, h.name) == h.switch_port
        assert topo.graph.degree(h.name) == 1


@pytest.mark.parametrize("spec", SPECS)
def test_addresses_and_dpids_are_unique(spec):
    topo = build(spec)
    assert len({h.ip for h in topo.hosts}) == len(topo.hosts)
    assert len({h.mac for h in topo.hosts}) == len(topo.hosts)
    assert len({s.dpid for s in topo.switches}) == len(topo.switches)
    assert [h.name for h in topo.hosts] == [f"h{i}" for i in range(1, len(topo.hosts) + 1)]


def test_addressing_plan():
    assert topology.host_ip(1) == "10.0.0.1"
    assert topology.host_ip(300) == "10.0.1.44"
    assert topology.host_mac(300) == "02:00:00:00:01:2c"


def test_bigraph_counts_and_links():
    topo = build("bigraph:upper=4,lower=3,hosts_per_switch=2")
    upper = [s.name for s in topo.switches if s.role == "upper"]
    lower = [s.name for s in topo.switches if s.role == "lower"]
    assert len(upper) == 4 and len(lower) == 3
    assert len(topo.hosts) == 14
    pairs = Counter(frozenset((lk.a, lk.b)) for lk in topo.switch_links())
    assert len(pairs) == 12 and set(pairs.values()) == {1}, "exactly one link per upper-lower pair"
    for lk in topo.switch_links():
        assert {topo.switch(lk.a).role, topo.switch(lk.b).role} == {"upper", "lower"}, "no link inside a group"
    for s in upper:
        assert topo.graph.degree(s) == 2 + 3
    for s in lower:
        assert topo.graph.degree(s) == 2 + 4


def test_bigraph_switch_hops():
    topo = build("bigraph:upper=4,lower=4,hosts_per_switch=2")
    group = {s.name: s.role for s in topo.switches}
    for a, b in itertools.permutations(topo.hosts, 2):
        hops = topo.switch_hops(a.name, b.name)
        if a.switch == b.switch:
            assert hops == 1
        elif group[a.switch] != group[b.switch]:
            assert hops == 2
        else:
            assert hops == 3
    assert topo.diameter_hops() == 3


def test_fattree_structure():
    k = 4
    topo = build(f"fattree:k={k}")
    roles = Counter(s.role for s in topo.switches)
    assert roles == {"edge": 8, "agg": 8, "core": 4}
    assert len(topo.hosts) == k**3 // 4
    for s in topo.switches:
        assert topo.graph.degree(s.name) == k, "every switch uses all k ports"
    # every core reaches every pod exactly once
    for core in (s for s in topo.switches if s.role == "core"):
        pods = [topo.switch(n).pod for n in topo.neighbors(core.name)]
        assert sorted(pods) == list(range(k))
    assert topo.diameter_hops() == 5
    hops = Counter(topo.switch_hops("h1", h.name) for h in topo.hosts if h.name != "h1")
    assert hops == {1: 1, 3: 2, 5: 12}


def test_leafspine_structure():
    topo = build("leafspine:leaves=4,spines=2,hosts_per_leaf=4")
    roles = Counter(s.role for s in topo.switches)
    assert roles == {"leaf": 4, "spine": 2}
    for s in topo.switches:
        assert topo.graph.degree(s.name) == (4 + 2 if s.role == "leaf" else 4)
    assert topo.diameter_hops() == 3


def test_star():
    topo = build("star:hosts=5")
    assert len(topo.switches) == 1 and len(topo.hosts) == 5
    assert topo.diameter_hops() == 1
    assert topo.bisection_bw_mbps() == 2 * 10


def test_rates():
    topo = build("leafspine:leaves=2,spines=1,hosts_per_leaf=2,bw=20,switch_bw=40")
    assert {lk.bw_mbps for lk in topo.links if lk.kind == "host"} == {20}
    assert {lk.bw_mbps for lk in topo.links if lk.kind == "switch"} == {40}
    assert build("star:hosts=2").host_bw == topology.DEFAULT_LINK_MBPS
    assert build("star:hosts=2,host_bw=1000").host_bw == 1000


def brute_force_bisection(topo):
    """Minimum over all switch side assignments of switch links cut + host links needed for balance."""
    switches = [s.name for s in topo.switches]
    index = {name: i for i, name in enumerate(switches)}
    n = len(topo.hosts)
    hosts_on = np.zeros(len(switches), dtype=np.int64)
    for h in topo.hosts:
        hosts_on[index[h.switch]] += 1
    assignments = np.arange(2 ** len(switches), dtype=np.int64)
    bits = (assignments[:, None] >> np.arange(len(switches))) & 1
    side_hosts = bits @ hosts_on
    balance = np.minimum(np.abs(side_hosts - n // 2), np.abs(side_hosts - (n + 1) // 2))
    cut = np.zeros(len(assignments))
    for lk in topo.switch_links():
        cut += (bits[:, index[lk.a]] != bits[:, index[lk.b]]) * lk.bw_mbps
    return float(np.min(cut + balance * topo.host_bw))


@pytest.mark.parametrize("spec", [
    "bigraph:upper=2,lower=2,hosts_per_switch=2",
    "bigraph:upper=4,lower=4,hosts_per_switch=2",
    "bigraph:upper=3,lower=2,hosts_per_switch=3,switch_bw=5",
    "bigraph:upper=2,lower=2,hosts_per_switch=4,host_bw=3",
    "fattree:k=2",
    "fattree:k=4",
    "fattree:k=4,switch_bw=4",
    "leafspine:leaves=4,spines=2,hosts_per_leaf=4",
    "leafspine:leaves=3,spines=2,hosts_per_leaf=3",
    "leafspine:leaves=4,spines=4,hosts_per_leaf=2,host_bw=1",
    "star:hosts=7",
])
def test_bisection_matches_exhaustive_search(spec):
    topo = build(spec)
    assert topo.bisection_bw_mbps() == pytest.approx(brute_force_bisection(topo))


def test_bisection_values_people_quote():
    # fat-tree: full bisection; BiGraph k=8: half of the hosts' rate (32 hosts, 8 cut links of 16)
    assert build("fattree:k=4").bisection_bw_mbps() == 8 * 10
    assert build("bigraph:upper=4,lower=4,hosts_per_switch=4").bisection_bw_mbps() == 8 * 10
    assert build("leafspine:leaves=8,spines=4,hosts_per_leaf=4").bisection_bw_mbps() == 16 * 10


@pytest.mark.parametrize("spec", SPECS[:8])
def test_json_round_trip(spec, tmp_path):
    topo = build(spec)
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topo.to_json()))
    again = topology.load(str(path))
    assert again == topo
    assert again.to_json() == topo.to_json()


def test_json_round_trip_of_a_rate_given_as_an_integer(tmp_path):
    """A default rate passed as an int (20, not 20.0) exports as the rebuild does: the file loads again."""
    topo = build("star:hosts=16", 20)
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topo.to_json()))
    assert topology.load(str(path)) == topo


def test_json_edited_into_inconsistency_is_rejected(tmp_path):
    data = build("star:hosts=3").to_json()
    data["links"][0]["b_port"] = 9
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FieldError, match="field 'links'"):
        topology.load(str(path))


def test_missing_and_broken_topology_files(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        topology.load(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        topology.load(str(bad))
    bad.write_text("[]")
    with pytest.raises(UserError, match="field 'topology'"):
        topology.load(str(bad))


def test_mapping_spec_from_yaml():
    topo = build({"kind": "bigraph", "upper": 2, "lower": 2, "hosts_per_switch": 1, "bw": 20})
    assert topo.spec == "bigraph:upper=2,lower=2,hosts_per_switch=1,bw=20"
    assert build(topo.spec) == topo


BAD_SPECS = [
    ("mesh:n=3", "kind"),
    ("", "kind"),
    (":k=4", "kind"),
    ("fattree:k=3", "k"),
    ("fattree:k=0", "k"),
    ("fattree:k=four", "k"),
    ("fattree:k=4,color=red", "color"),
    ("fattree:", "k"),
    ("fattree", "k"),
    ("bigraph:upper=2,lower=2", "hosts_per_switch"),
    ("bigraph:upper=0,lower=2,hosts_per_switch=1", "upper"),
    ("bigraph:upper=-1,lower=2,hosts_per_switch=1", "upper"),
    ("leafspine:leaves=2,spines=1,hosts_per_leaf=2,bw=0", "bw"),
    ("leafspine:leaves=2,spines=1,hosts_per_leaf=2,bw=1001", "bw"),
    ("leafspine:leaves=2,spines=1,hosts_per_leaf=2,host_bw=2000", "host_bw"),
    ("leafspine:leaves=2,spines=1,hosts_per_leaf=2,switch_bw=nan", "switch_bw"),
    ("leafspine:leaves=2,spines=1,hosts_per_leaf=2,bw=fast", "bw"),
    ("star:hosts=4,hosts=5", "hosts"),
    ("star:hosts", "parameters"),
    ("star:hosts=4,,", "parameters"),
    ("star:hosts=5000", "hosts"),
    ("fattree:k=40", "hosts"),
    ("bigraph:upper=1,lower=1,hosts_per_switch=1,", "parameters"),
    ("leafspine:leaves=1,spines=1,hosts_per_leaf=1", "hosts"),
]


@pytest.mark.parametrize("spec,field", BAD_SPECS)
def test_bad_specs_name_the_field(spec, field):
    with pytest.raises(FieldError) as info:
        build(spec)
    assert info.value.field == field
    assert "\n" not in str(info.value)
    assert "expected" in str(info.value) and "got" in str(info.value)


@pytest.mark.parametrize("spec", [
    {"upper": 1}, {"kind": 3}, {"kind": "star", "hosts": True}, {"kind": "star", "hosts": 2.5}, 42,
])
def test_bad_mapping_specs(spec):
    with pytest.raises(FieldError):
        build(spec)


def test_missing_key_says_nothing_was_given():
    with pytest.raises(FieldError, match=r"got nothing$"):
        build("bigraph:upper=4")


def test_a_topology_path_that_cannot_be_opened_is_one_user_error():
    """Found by the schedule gen fuzzer: a NUL byte in the path raised ValueError from open()."""
    for path in ("/\x00", "/no/such/file.json"):
        with pytest.raises(UserError, match="cannot read it"):
            topology.load(path)


#: What each module of the package may import of the others (see the package docstring): no cycle.
PACKAGE_LAYERS = {
    "kinds": set(),
    "spec": {"kinds"},
    "bisection": {"kinds"},
    "model": {"kinds", "spec", "bisection"},
    "builders": {"kinds", "model", "spec"},
}


@pytest.mark.parametrize("module", sorted(PACKAGE_LAYERS))
def test_topology_package_modules_import_only_the_layers_below(module):
    import ast
    import importlib

    path = importlib.import_module(f"emulator.model.topology.{module}").__file__
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    imported = set()
    for node in ast.walk(tree):  # function-level imports count too
        if isinstance(node, ast.ImportFrom) and node.level:  # from .spec import ...; from . import spec
            imported.update([node.module] if node.module else [a.name for a in node.names])
            continue
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            if name == "emulator.model.topology" or name.startswith("emulator.model.topology."):
                imported.add(name.removeprefix("emulator.model.topology").lstrip(".") or "__init__")
    assert imported <= PACKAGE_LAYERS[module], f"{module} imports {sorted(imported - PACKAGE_LAYERS[module])}"


def test_topology_package_exports_every_public_name():
    for name in topology.__all__:
        assert getattr(topology, name) is not None
    for module in ("kinds", "spec", "bisection", "model", "builders"):
        sub = getattr(topology, module)
        public = {n for n, v in vars(sub).items() if not n.startswith("_") and getattr(v, "__module__", None) == sub.__name__}
        assert public - {"bisection_mbps"} <= set(topology.__all__), module
