"""Fuzzing the MSCCL XML and Chakra trace importers (and ``emu schedule import``).

Random bytes and structured corruptions of the valid samples in ``tests/data``
(an attribute of one element set to a wrong value or removed, an element
dropped or duplicated, a trace's bytes flipped or cut, a Chakra node of any
type with an attribute missing or of the wrong kind or range, a node
dropped, replaced or given a dependency it cannot have): the importer returns
a schedule that validates and executes, or raises a one-line
:class:`UserError`; the CLI exits 2 with one line and writes no output file.
"""

from __future__ import annotations

import copy
import os
import tempfile
import xml.etree.ElementTree as ET

import pytest
from chakra.schema.protobuf import et_def_pb2 as pb
from fuzz_support import FUZZ, ODD_STRINGS, check_cli, cli_fixture, snapshot, user_error_or
from hypothesis import given
from hypothesis import strategies as st

from emulator.model.collectives import msccl
from emulator.model.schedule import format as fmt
from emulator.model.schedule.executor import execute
from emulator.model.workloads import chakra

pytestmark = pytest.mark.usefixtures(cli_fixture.__name__)

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
RING4 = ET.parse(os.path.join(DATA, "msccl_ring4.xml")).getroot()
#: Real multi-channel files (tests/data/msccl/SOURCES.md): msccl-tools' 2-channel ring reduce_scatter and its
#: 2-instance allpairs allgather.
MULTI_CHANNEL = tuple(ET.parse(os.path.join(DATA, "msccl", name)).getroot() for name in (
    "reduce_scatter_ring_4gpus_2channels.xml", "allgather_allpairs_4gpus_2instances.xml"))
ATTRS = ("id", "s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep", "send",
         "recv", "chan", "ngpus", "nchunksperloop", "coll", "i_chunks", "o_chunks", "s_chunks", "name", "inplace",
         "nchannels", "proto", "outofplace")

attr_values = st.one_of(
    st.sampled_from(["-2", "-1", "0", "1", "2", "3", "4", "5", "7", "8", "64", "1000", "65537", "2147483648",
                     "99999999999999999999", "1e3", "0x10", " 1", "+1", "1_0", "٣", "", "nan",
                     "s", "r", "rcs", "rrc", "rrcs", "rrs", "cpy", "re", "nop", "i", "o", "allreduce", "allgather"]),
    st.sampled_from(ODD_STRINGS).filter(lambda s: "\x00" not in s),
    st.integers(-5, 2**40).map(str),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=6),
)


def _elements(root: ET.Element) -> list[tuple[ET.Element | None, ET.Element]]:
    out: list[tuple[ET.Element | None, ET.Element]] = [(None, root)]
    for parent in root.iter():
        out.extend((parent, child) for child in parent)
    return out


def mutate_xml(data: st.DataObject, root: ET.Element) -> ET.Element:
    root = copy.deepcopy(root)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        elems = _elements(root)
        parent, elem = elems[data.draw(st.integers(0, len(elems) - 1), label="element")]
        op = data.draw(st.sampled_from(["set", "set", "set", "delete_attr", "drop", "dup", "retag", "child"]),
                       label="op")
        if op == "set":
            elem.set(data.draw(st.sampled_from(ATTRS), label="attr"), data.draw(attr_values, label="value"))
        elif op == "delete_attr" and elem.attrib:
            del elem.attrib[data.draw(st.sampled_from(sorted(elem.attrib)), label="deleted")]
        elif op == "drop" and parent is not None:
            parent.remove(elem)
        elif op == "dup" and parent is not None:
            parent.append(copy.deepcopy(elem))
        elif op == "retag":
            elem.tag = data.draw(st.sampled_from(["algo", "gpu", "tb", "step", "x"]), label="tag")
        elif op == "child":
            ET.SubElement(elem, data.draw(st.sampled_from(["gpu", "tb", "step"]), label="child"),
                          {k: data.draw(attr_values, label=k) for k in data.draw(
                              st.lists(st.sampled_from(ATTRS), max_size=4, unique=True), label="child attrs")})
    return root


def _imported_ok(sched: fmt.Schedule | None) -> None:
    if sched is not None:
        assert fmt.validate(sched) == sched  # an import always yields a loadable file


@FUZZ
@given(data=st.data(), size=st.one_of(st.none(), st.sampled_from([4, 16, 64, 1 << 20, 100, 3])))
def test_msccl_mutated_samples(data, size):
    root = ET.fromstring(ET.tostring(mutate_xml(data, RING4)))  # what a file of it would read back as
    _imported_ok(user_error_or(msccl.from_xml, root, "MSCCL file 'fuzz.xml'", size))


@FUZZ
@given(data=st.data(), which=st.integers(0, len(MULTI_CHANNEL) - 1), instances=st.sampled_from([1, 2, 3, 40]))
def test_msccl_mutated_multi_channel_files(data, which, instances):
    """Channels, threadblocks sharing a connection, instances: one line of error or a loadable schedule."""
    root = ET.fromstring(ET.tostring(mutate_xml(data, MULTI_CHANNEL[which])))
    _imported_ok(user_error_or(msccl.from_xml, root, "MSCCL file 'fuzz.xml'", None, instances=instances))


xml_fragments = st.sampled_from([
    '<?xml version="1.0"?>', '<?xml version="1.0" encoding="bogus"?>', '<algo coll="allreduce" ngpus="2" '
    'nchunksperloop="2">', "</algo>", '<gpu id="0" i_chunks="2">', '<gpu id="1">', "</gpu>", '<tb id="0" send="1" '
    'recv="1">', "</tb>", '<step s="0" type="s" srcbuf="i" srcoff="0" cnt="1"/>', '<step s="0" type="r" '
    'dstbuf="o" dstoff="1"/>', "<!DOCTYPE a [<!ENTITY x 'y'>]>", "&x;", "<![CDATA[", "]]>", "<", ">", "\x00",
    "&#0;", "é", "<algo/>",
])


@FUZZ
@given(text=st.one_of(st.binary(max_size=200), st.lists(xml_fragments, max_size=12).map(lambda x: "".join(x)
                                                                                        .encode())))
def test_msccl_random_bytes(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "a.xml")
        with open(path, "wb") as fh:
            fh.write(text)
        _imported_ok(user_error_or(msccl.load, path))


# ---------------------------------------------------------------------------
# Chakra
# ---------------------------------------------------------------------------

def _attr(name: str, kind: str, value: object) -> pb.AttributeProto:
    attr = pb.AttributeProto(name=name)
    setattr(attr, kind, value)
    return attr


attr_kinds = st.sampled_from(["int64_val", "int32_val", "uint64_val", "bool_val", "string_val", "float_val"])
#: Every collective of the schema (three times the ones that import), and one it does not have.
comm_types = st.sampled_from(3 * [pb.ALL_REDUCE, pb.REDUCE, pb.ALL_GATHER, pb.BROADCAST, pb.ALL_TO_ALL,
                                  pb.REDUCE_SCATTER, pb.REDUCE_SCATTER_BLOCK, pb.BARRIER] + [pb.GATHER, pb.SCATTER, 99])
comm_sizes = st.sampled_from([65536, 65536, 4096, 96, 100, 0, 3, 1 << 40])
names = st.sampled_from(["ar", "", "é\n", "x" * 300])
#: Every node type of the schema, twice the ones that replay, and one it does not have.
node_types = st.sampled_from([pb.COMP_NODE, pb.COMP_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE, pb.COMM_COLL_NODE,
                              pb.COMM_COLL_NODE, pb.METADATA_NODE, pb.INVALID_NODE, pb.MEM_LOAD_NODE,
                              pb.MEM_STORE_NODE, 99])
BAD_VALUES = {"int64_val": 2**62, "int32_val": -1, "uint64_val": 2**64 - 1, "bool_val": True, "string_val": "64KiB",
              "float_val": 1.5}


def _spoil(draw, node: pb.Node) -> pb.Node:
    """Sometimes one attribute of ``node`` missing, of the wrong kind or negative."""
    if not node.attr or draw(st.integers(0, 2)):
        return node
    which = draw(st.sampled_from(sorted({a.name for a in node.attr})))
    keep = [a for a in node.attr if a.name != which]
    del node.attr[:]
    node.attr.extend(keep)
    how = draw(st.sampled_from(["missing", "kind", "negative"]))
    if how == "kind":
        kind = draw(attr_kinds)
        node.attr.append(_attr(which, kind, BAD_VALUES[kind]))
    elif how == "negative":
        node.attr.append(_attr(which, "int64_val", draw(st.integers(-(2**63), -1))))
    return node


@st.composite
def coll_nodes(draw) -> pb.Node:
    """A collective node of any comm_type, valid or with one attribute missing, of the wrong type or out of range."""
    node = chakra.coll_node(draw(st.integers(0, 5)), draw(names), draw(comm_types), draw(comm_sizes))
    return _spoil(draw, node)


@st.composite
def any_nodes(draw, node_id: int, peers: int = 4) -> pb.Node:
    """A node of any type (or an unknown one) with plausible attributes, sometimes one of them spoilt."""
    kind = draw(node_types)
    if kind in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        node = chakra.comm_node(node_id, draw(names), kind == pb.COMM_SEND_NODE, draw(st.integers(-1, peers)),
                                draw(comm_sizes), draw(st.sampled_from([0, 0, 1, -5, 2**31 - 1])))
    elif kind == pb.COMM_COLL_NODE:
        node = chakra.coll_node(node_id, draw(names), draw(comm_types), draw(comm_sizes))
    else:
        node = pb.Node(id=node_id, name=draw(names), type=kind,
                       duration_micros=draw(st.sampled_from([0, 5, 10**6, 2**64 - 1])))
    return _spoil(draw, node)


@st.composite
def recorded(draw) -> list[list[pb.Node]]:
    """Per rank the nodes of a plausible trace -- compute, messages (both ends), collectives on every rank and
    dependency-only nodes -- each after some earlier nodes of its rank or after the one before it (then maybe in
    another order on each rank, so that a rank may wait for what comes after), then maybe one corruption."""
    p = draw(st.integers(2, 4))
    ranks: list[list[pb.Node]] = [[] for _ in range(p)]
    for _ in range(draw(st.integers(1, 8))):
        what = draw(st.sampled_from(["comp", "message", "message", "coll", "dep"]))
        a, b = draw(st.permutations(range(p)))[:2]
        if what == "comp":
            ranks[a].append(chakra.comp_node(0, "fwd", draw(st.sampled_from([0, 7, 1000]))))
        elif what == "message":
            size, tag = draw(comm_sizes), draw(st.sampled_from([0, 1, 7]))
            ranks[a].append(chakra.comm_node(0, "s", True, b, size, tag))
            ranks[b].append(chakra.comm_node(0, "r", False, a, size, tag))
        elif what == "coll":
            comm_type, size = draw(comm_types), draw(comm_sizes)
            for r in range(p):
                ranks[r].append(chakra.coll_node(0, "c", comm_type, size))
        else:
            ranks[a].append(pb.Node(type=draw(st.sampled_from([pb.METADATA_NODE, pb.INVALID_NODE]))))
    order = draw(st.sampled_from(["random deps", "chained", "chained, shuffled"]))
    for nodes in ranks:
        if order == "chained, shuffled":
            nodes[:] = draw(st.permutations(nodes))
        for i, node in enumerate(nodes):
            node.id = i + 1
            if order != "random deps":
                node.data_deps.extend([i] if i else [])
                continue
            for key in ("data_deps", "ctrl_deps"):
                getattr(node, key).extend(draw(st.lists(st.integers(1, i), max_size=2)) if i else [])
    how = draw(st.sampled_from(["keep", "keep", "keep", "replace", "drop", "dep", "late", "late", "swap"]))
    rank = draw(st.integers(0, p - 1))
    nodes = ranks[rank]
    if how == "replace" and nodes:
        i = draw(st.integers(0, len(nodes) - 1))
        nodes[i] = draw(any_nodes(nodes[i].id, p))
    elif how == "drop" and nodes:
        del nodes[draw(st.integers(0, len(nodes) - 1))]
    elif how == "dep" and nodes:  # maybe unknown, maybe itself or a later node (a cycle)
        draw(st.sampled_from(nodes)).ctrl_deps.append(draw(st.integers(0, len(nodes) + 1)))
    elif how == "late" and len(nodes) > 1:  # waits for a later node: a cycle, or a trace that may stop short
        i, j = sorted(draw(st.permutations(range(len(nodes))))[:2])
        nodes[i].ctrl_deps.append(nodes[j].id)
    elif how == "swap" and len(ranks[0]) > 1:
        ranks[0][0], ranks[0][-1] = ranks[0][-1], ranks[0][0]
    return ranks


def _trace_bytes(nodes: list[pb.Node]) -> bytes:
    raws = [pb.GlobalMetadata(version="0.0.4").SerializeToString()] + [n.SerializeToString() for n in nodes]
    return b"".join(chakra.encode_varint(len(r)) + r for r in raws)


@st.composite
def traces(draw) -> list[bytes]:
    """Per rank the bytes of one trace: a plausible one, or the same or different collectives; maybe one file's
    bytes corrupted."""
    if draw(st.booleans()):
        per_rank = draw(recorded())
    else:
        p = draw(st.integers(1, 4))
        shared = draw(st.lists(coll_nodes(), max_size=3))
        per_rank = [shared if draw(st.integers(0, 3)) else draw(st.lists(coll_nodes(), max_size=3)) for _ in range(p)]
        per_rank = [[pb.Node(id=9, name="fwd", type=pb.COMP_NODE, duration_micros=5), *nodes] for nodes in per_rank]
    out = [_trace_bytes(nodes) for nodes in per_rank]
    rank = draw(st.integers(0, len(out) - 1))  # at most one file's bytes corrupted, so the others reach deeper
    raw = out[rank]
    how = draw(st.sampled_from(6 * ["keep"] + ["flip", "cut", "append", "random"]))
    if how == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    elif how == "cut":
        raw = raw[:draw(st.integers(0, len(raw)))]
    elif how == "append":
        raw += draw(st.binary(max_size=12))
    elif how == "random":
        raw = draw(st.binary(max_size=64))
    out[rank] = raw
    return out


@FUZZ
@given(files=traces(), algo=st.sampled_from(["ring", "ring", "hd", "dbtree", "hdrm", "direct", "hier", "bogus"]),
       index=st.sampled_from([None, None, None, 0, 1, -1, 2**40]),
       topo=st.sampled_from([None, None, "star:hosts=2", "star:hosts=4", "bigraph:upper=1,lower=1,hosts_per_switch=2",
                             "fattree:k=3", "bogus"]))
def test_chakra_traces(files, algo, index, topo):
    """A schedule that validates and (when small enough to run here quickly) executes, or one line."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for rank, raw in enumerate(files):
            paths.append(os.path.join(tmp, f"t.{rank}.et"))
            with open(paths[-1], "wb") as fh:
                fh.write(raw)
        sched = user_error_or(chakra.load, paths, algo=algo, index=index, topology=topo)
        _imported_ok(sched)
        if sched is not None and sched.chunks + sched.output_chunks <= 4096:
            assert execute(sched).valid  # an import never deadlocks and computes its collectives


@FUZZ
@given(data=st.data(), kind=st.sampled_from(["xml", "et"]),
       names=st.lists(st.sampled_from(["a.xml", "b.XML", "t.0.et", "t.1.et", "t.1.et", "u.2.et", "t.et", "x.txt",
                                       "missing.xml", "missing.0.et", "dir.xml", ""]), max_size=3),
       options=st.lists(st.sampled_from(["--size", "64", "--size", "0", "--size", "1Kb", "--algo", "hd", "--algo",
                                         "x", "--index", "-1", "--index", "1", "--topology", "star:hosts=2",
                                         "--topology", "nope"]), max_size=4),
       out=st.sampled_from(["o.yaml", "o.json", "", "dir.xml"]))
def test_schedule_import_cli(data, kind, names, options, out):
    """``emu schedule import``: a written schedule, or exit 2, one line, no output file."""
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "dir.xml"))
        if kind == "xml":
            ET.ElementTree(mutate_xml(data, RING4)).write(os.path.join(root, "a.xml"))
        for rank, raw in enumerate(data.draw(traces(), label="traces") if kind == "et" else []):
            with open(os.path.join(root, f"t.{rank}.et"), "wb") as fh:
                fh.write(raw)
        files = [os.path.join(root, n) if n else n for n in names] or [os.path.join(root, "a.xml")]
        before = snapshot(root)
        status = check_cli(["schedule", "import", *files, *options, "-o", os.path.join(root, out) if out else out],
                           root, before)
        if status == 0:
            fmt.load(os.path.join(root, out))
