"""The cluster file (emulator/runs/cluster_file.py) and the placement of a topology on its servers
(emulator/model/cluster_placement.py): parsing with one line per bad field, and placements whose cross-server links are
the fewest any balanced placement has (checked against every placement of small fabrics)."""

from __future__ import annotations

import base64
import copy
import itertools
import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.base.errors import FieldError, UserError
from emulator.cli.main import main
from emulator.model import cluster_placement, topology
from emulator.model.collectives import generators
from emulator.runs import admission, cluster_file

GOOD = {
    "name": "lab",
    "head": "a",
    "underlay_mtu": 9100,
    "servers": [
        {"name": "a", "ssh": "192.0.2.10", "user": "root", "key": "/root/.ssh/ef_lab", "underlay": "10.77.0.1"},
        {"name": "b", "ssh": "node-b.example", "port": 2222, "key": "/root/.ssh/ef_lab", "underlay": "10.77.0.2"},
    ],
}


def test_a_good_file_parses_and_round_trips(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    cluster = cluster_file.load(str(path))
    assert cluster.names == ["a", "b"] and cluster.head == "a" and cluster.underlay_mtu == 9100
    assert cluster.server("b").port == 2222 and cluster.server("b").user == "root"
    assert cluster_file.from_dict(cluster.to_json()) == cluster
    cluster.check_mtu(9000)
    with pytest.raises(FieldError, match="underlay_mtu.*at least 9050"):
        cluster_file.from_dict({**GOOD, "underlay_mtu": 9000}).check_mtu(9000)


def _with(path: str, value: object) -> dict:
    data = copy.deepcopy(GOOD)
    node: dict = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node["servers"][int(key[8:-1])] if key.startswith("servers[") else node[key]
    if value is None:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return data


@pytest.mark.parametrize("path, value, field", [
    ("head", "c", "head"),
    ("head", None, "head"),
    ("underlay_mtu", 1000, "underlay_mtu"),
    ("underlay_mtu", "9100", "underlay_mtu"),
    ("servers", [], "servers"),
    ("colour", "blue", "colour"),
    ("servers[0].name", "A b", "servers[0].name"),
    ("servers[0].name", "a-very-long-server-name", "servers[0].name"),
    ("servers[1].name", "a", "servers[1].name"),
    ("servers[0].ssh", "not an address!", "servers[0].ssh"),
    ("servers[0].port", 0, "servers[0].port"),
    ("servers[0].user", "Root Admin", "servers[0].user"),
    ("servers[0].key", "~/.ssh/ef_lab", "servers[0].key"),
    ("servers[0].key", "/root/.ssh/id_ed25519", "servers[0].key"),
    ("servers[0].key", None, "servers[0].key"),
    ("servers[0].underlay", "127.0.0.1", "servers[0].underlay"),
    ("servers[1].underlay", "10.77.0.1", "servers[1].underlay"),
    ("servers[0].password", "x", "servers[0].password"),
])
def test_every_bad_field_is_one_line_naming_it(path, value, field):
    with pytest.raises(FieldError) as info:
        cluster_file.from_dict(_with(path, value), where="lab.yaml")
    assert info.value.field == field and "\n" not in str(info.value)


def test_unreadable_and_unparsable_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="cannot read it"):
        cluster_file.load(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    for text in ("servers: [\n", "head: !!float x\n"):  # a parser error, and a constructor's ValueError
        bad.write_text(text)
        with pytest.raises(UserError, match="not valid YAML") as info:
            cluster_file.load(str(bad))
        assert "\n" not in str(info.value)


_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.text(max_size=12),
                    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(["name", "head", "underlay_mtu", "servers", *[f"servers[{i}].{k}" for i in (0, 1)
                                                                          for k in cluster_file.SERVER_KEYS]]),
       value=_values)
def test_any_changed_field_parses_or_is_refused_with_a_user_error(path, value):
    """Whatever one field holds, the parser returns a cluster that round-trips or raises UserError: never
    another exception."""
    data = _with(path, value) if value is not None or path != "servers" else _with(path, [])
    try:
        cluster = cluster_file.from_dict(data)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert cluster_file.from_dict(cluster.to_json()) == cluster


# ---------------------------------------------------------------- placement
def _best_balanced_cut(topo: topology.Topology, servers: list[str]) -> int:
    """The fewest cross-server links of every placement of whole groups within the same limits as place()."""
    parts = cluster_placement.groups(topo)
    sizes = [len(p) for p in parts]
    total, biggest = sum(sizes), max(sizes)
    limit = -(-total // len(servers)) + biggest - 1
    best = None
    for assignment in itertools.product(range(len(servers)), repeat=len(parts)):
        loads = [0] * len(servers)
        for g, s in enumerate(assignment):
            loads[s] += sizes[g]
        if max(loads) > limit:
            continue
        of = {n: servers[s] for g, s in enumerate(assignment) for n in parts[g]}
        c = cluster_placement.cut(topo, of)
        best = c if best is None else min(best, c)
    assert best is not None
    return best


@pytest.mark.parametrize("spec, servers", [
    ("bigraph:upper=2,lower=2,hosts_per_switch=2", ["a", "b"]),
    ("bigraph:upper=4,lower=4,hosts_per_switch=2", ["a", "b"]),
    ("bigraph:upper=4,lower=4,hosts_per_switch=2", ["a", "b", "c"]),
    ("leafspine:leaves=4,spines=2,hosts_per_leaf=2", ["a", "b"]),
    ("leafspine:leaves=4,spines=4,hosts_per_leaf=4", ["a", "b"]),
    ("leafspine:leaves=4,spines=2,hosts_per_leaf=2", ["a", "b", "c"]),
])
def test_placement_crosses_servers_as_little_as_any_balanced_placement(spec, servers):
    topo = topology.build(spec)
    placed = cluster_placement.place(topo, servers)
    assert placed.cross_links == cluster_placement.cut(topo, placed.of) == _best_balanced_cut(topo, servers)
    for host in topo.hosts:  # a host runs where its switch does
        assert placed.of[host.name] == placed.of[host.switch]
    # no server beyond its share by more than a group (groups do not split); fewer tunnels may leave one empty
    biggest = max(len(g) for g in cluster_placement.groups(topo))
    share = -(-len(placed.of) // len(servers))
    assert all(len(placed.nodes_on(s)) <= share + biggest - 1 for s in servers)
    assert set(placed.of) == {h.name for h in topo.hosts} | {s.name for s in topo.switches}


def test_one_server_has_everything_and_no_tunnel():
    topo = topology.build("fattree:k=4")
    placed = cluster_placement.place(topo, ["only"])
    assert placed.cross_links == 0 and set(placed.of.values()) == {"only"}


def test_a_server_of_accelerators_stays_whole_and_weights_share_the_nodes():
    topo = topology.build("bigraph:upper=4,lower=4,hosts_per_switch=2,servers=4,accels_per_server=4,"
                          "nics_per_server=4,nic_placement=hdrm")
    placed = cluster_placement.place(topo, ["a", "b"])
    for server_hosts in topo.servers():
        assert len({placed.of[h] for h in server_hosts}) == 1
    big = cluster_placement.place(topology.build("leafspine:leaves=4,spines=2,hosts_per_leaf=4"), ["a", "b"],
                          weights={"a": 3, "b": 1})
    assert len(big.nodes_on("a")) > len(big.nodes_on("b"))


def test_a_placement_file_overrides_and_names_what_is_wrong():
    topo = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")
    placed = cluster_placement.place(topo, ["a", "b"])
    moved = cluster_placement.overridden(placed, topo, {"b": ["h1"]})
    assert moved.of["h1"] == "b" and moved.cross_links == cluster_placement.cut(topo, moved.of)
    for data, field in [({"c": ["h1"]}, "c"), ({"a": ["h99"]}, "a[0]"), ({"a": ["h1"], "b": ["h1"]}, "b[0]"),
                        ({"a": "h1"}, "a"), (["h1"], "placement")]:
        with pytest.raises(FieldError) as info:
            cluster_placement.overridden(placed, topo, data)
        assert info.value.field == field


def test_cli_place_prints_each_servers_nodes_and_refuses_bad_files_in_one_line(tmp_path, capsys):

    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert main(["cluster", "place", str(path), "--topology", "bigraph:upper=4,lower=4,hosts_per_switch=2"]) == 0
    out = capsys.readouterr().out
    assert "8 of 32 links cross servers" in out and "a (head): 8 hosts, 4 switches" in out
    override = tmp_path / "place.yaml"
    override.write_text("b: [h1]\n")
    assert main(["cluster", "place", str(path), "--topology", "bigraph:upper=2,lower=2,hosts_per_switch=2",
                 "--placement", str(override), "--json"]) == 0
    assert "h1" in json.loads(capsys.readouterr().out)["servers"]["b"]
    override.write_text("b: !!float x\n")
    assert main(["cluster", "place", str(path), "--topology", "star:hosts=2", "--placement", str(override)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid YAML" in err
    path.write_text(yaml.safe_dump({**GOOD, "head": "z"}))
    assert main(["cluster", "place", str(path), "--topology", "star:hosts=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'head'" in err


def test_a_replays_memory_spread_over_servers_adds_up_to_the_one_machines():
    """Each server holds its hosts' agents and its nodes' share of the network; the head the session too."""
    topo = topology.build("bigraph:upper=4,lower=4,hosts_per_switch=2")
    schedule = generators.generate("hdrm", topo, 1 << 20)
    placed = cluster_placement.place(topo, ["a", "b"])
    per = admission.replay_memory_per_server(schedule, topo, placed.of, head="a")
    whole = admission.replay_memory(schedule, topo)
    assert sum(e.ranks for e in per.values()) == whole.ranks == 16
    assert sum(e.programs_bytes for e in per.values()) == whole.programs_bytes
    assert sum(e.network_bytes for e in per.values()) == whole.network_bytes
    assert sum(e.total_bytes for e in per.values()) == whole.total_bytes
    assert per["a"].session_bytes == whole.session_bytes and per["b"].session_bytes == 0
    for server, estimate in per.items():
        assert estimate.ranks == sum(1 for h in topo.hosts if placed.of[h.name] == server)


def _known_hosts_line(key_type: str = "ssh-ed25519", hosts: str = "192.0.2.10,[node-b.example]:2222") -> str:
    """A line as ssh writes it: the key is base64 of a blob that opens with its type's length and name."""
    blob = len(key_type).to_bytes(4, "big") + key_type.encode() + (32).to_bytes(4, "big") + bytes(range(32))
    return f"{hosts} {key_type} {base64.b64encode(blob).decode()}"


@pytest.mark.parametrize("name", ["../../x y", "lab/a", "lab.v2", "", "x\n", "-" * 3, "a" * 65])
def test_a_cluster_name_that_would_change_a_path_is_refused(tmp_path, name):
    with pytest.raises(FieldError) as info:
        cluster_file.from_dict({**GOOD, "name": name}, where="lab.yaml")
    assert info.value.field == "name" and "letters, digits, '-' and '_'" in str(info.value)
    path = tmp_path / "lab v2.yaml"  # a file name that is no name, and no name: in it
    path.write_text(yaml.safe_dump(GOOD | {"name": None}).replace("name: null\n", ""))
    with pytest.raises(FieldError, match="the file's name, as it sets none"):
        cluster_file.load(str(path))


def test_an_existing_known_hosts_must_be_one_and_a_new_one_needs_its_folder(tmp_path):
    path = tmp_path / "lab.yaml"
    hosts = tmp_path / "lab.known_hosts"
    hashed = f"|1|{base64.b64encode(b's' * 20).decode()}|{base64.b64encode(b'h' * 20).decode()}"
    hosts.write_text(f"# the lab\n\n{_known_hosts_line()}\n@cert-authority *.example "
                     f"{_known_hosts_line('ecdsa-sha2-nistp256', '')[1:]} lab CA\n{_known_hosts_line(hosts=hashed)}\n")
    path.write_text(yaml.safe_dump(GOOD))
    assert cluster_file.load(str(path)).known_hosts == str(hosts)
    other = tmp_path / "notes.txt"
    for bad_line in ("ssh-ed25519 AAAA", _known_hosts_line().replace("ssh-ed25519 ", "ssh-rsa "),
                     "host ssh-ed25519 not*base64", "root:x:0:0:root:/root:/bin/bash"):
        other.write_text(f"{_known_hosts_line()}\n{bad_line}\n")
        path.write_text(yaml.safe_dump({**GOOD, "known_hosts": "notes.txt"}))
        with pytest.raises(FieldError) as info:
            cluster_file.load(str(path))
        assert info.value.field == "known_hosts" and f"{other}, whose line 2 is not one" in str(info.value)
    for name, why in ((str(tmp_path), "not a regular file"), ("missing/k", "no such folder")):
        path.write_text(yaml.safe_dump({**GOOD, "known_hosts": name}))
        with pytest.raises(FieldError, match=why):
            cluster_file.load(str(path))
    path.write_text(yaml.safe_dump({**GOOD, "known_hosts": "new.known_hosts"}))  # ssh makes it on first contact
    assert cluster_file.load(str(path)).known_hosts == str(tmp_path / "new.known_hosts")


def test_a_placement_entry_that_is_no_node_name_is_refused_when_the_file_is_read(tmp_path, capsys):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "private_underlay": True}))
    override = tmp_path / "place.yaml"
    for text, field in (("a: [[h1]]\n", "a[0]"), ("a: [{h1: 1}]\n", "a[0]"), ("1: [h1]\n", "1"),
                        ("c: [h1]\n", "c"), ("a: [h1]\nb: [h1]\n", "b[0]")):
        override.write_text(text)
        with pytest.raises(FieldError) as info:
            cluster_placement.read_overrides(str(override), ["a", "b"])
        assert info.value.field == field
        assert main(["cluster", "place", str(path), "--topology", "star:hosts=2", "--placement", str(override)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"field '{field}'" in err
    override.write_text("a: [[h1]]\n")
    from emulator.cli.arguments import cluster_run

    args = type("Args", (), {"cluster": str(path), "placement": str(override)})()
    with pytest.raises(FieldError, match=r"field 'a\[0\]': expected a node name"):
        cluster_run(args)  # what emu run, replay and mpirun call before anything is proved
