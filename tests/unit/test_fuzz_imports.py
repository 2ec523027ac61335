"""Fuzzing the MSCCL XML and Chakra trace importers (and ``emu schedule import``).

Random bytes and structured corruptions of the valid samples in ``tests/data``
(an attribute of one element set to a wrong value or removed, an element
dropped or duplicated, a trace's bytes flipped or cut, a collective's
attributes of the wrong type or size): the importer returns a schedule that
validates and executes, or raises a one-line :class:`UserError`; the CLI
exits 2 with one line and writes no output file.
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

from emulator.schedule import chakra, msccl
from emulator.schedule import format as fmt

pytestmark = pytest.mark.usefixtures(cli_fixture.__name__)

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
RING4 = ET.parse(os.path.join(DATA, "msccl_ring4.xml")).getroot()
ATTRS = ("id", "s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep", "send",
         "recv", "chan", "ngpus", "nchunksperloop", "coll", "i_chunks", "o_chunks", "s_chunks", "name", "inplace")

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


@st.composite
def coll_nodes(draw) -> pb.Node:
    """A collective node, valid or with one attribute missing, of the wrong type or out of range."""
    comm_type = draw(st.sampled_from([pb.ALL_REDUCE, pb.ALL_REDUCE, pb.ALL_GATHER, 99]))
    comm_size = draw(st.sampled_from([65536, 65536, 96, 0, 3, 1 << 40]))
    node = chakra.coll_node(draw(st.integers(0, 5)), draw(st.sampled_from(["ar", "", "é\n"])), comm_type,
                            comm_size)
    if draw(st.integers(0, 2)) == 0:
        which = draw(st.sampled_from(["comm_type", "comm_size"]))
        keep = [a for a in node.attr if a.name != which]
        del node.attr[:]
        node.attr.extend(keep)
        how = draw(st.sampled_from(["missing", "kind", "negative"]))
        if how == "kind":
            kind = draw(attr_kinds)
            value = {"int64_val": 2**62, "int32_val": -1, "uint64_val": 2**64 - 1, "bool_val": True,
                     "string_val": "64KiB", "float_val": 1.5}[kind]
            node.attr.append(_attr(which, kind, value))
        elif how == "negative":
            node.attr.append(_attr(which, "int64_val", draw(st.integers(-(2**63), -1))))
    return node


def _trace_bytes(nodes: list[pb.Node]) -> bytes:
    raws = [pb.GlobalMetadata(version="0.0.4").SerializeToString()] + [n.SerializeToString() for n in nodes]
    return b"".join(chakra.encode_varint(len(r)) + r for r in raws)


@st.composite
def traces(draw) -> list[bytes]:
    """Per rank the bytes of one trace: same or different collectives, maybe corrupted bytes."""
    p = draw(st.integers(1, 4))
    shared = draw(st.lists(coll_nodes(), max_size=3))
    out = []
    for _ in range(p):
        nodes = shared if draw(st.integers(0, 3)) else draw(st.lists(coll_nodes(), max_size=3))
        nodes = [pb.Node(id=9, name="fwd", type=pb.COMP_NODE, duration_micros=5), *nodes]
        raw = _trace_bytes(nodes)
        how = draw(st.sampled_from(["keep", "keep", "flip", "cut", "append", "random"]))
        if how == "flip" and raw:
            i = draw(st.integers(0, len(raw) - 1))
            raw = raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
        elif how == "cut":
            raw = raw[:draw(st.integers(0, len(raw)))]
        elif how == "append":
            raw += draw(st.binary(max_size=12))
        elif how == "random":
            raw = draw(st.binary(max_size=64))
        out.append(raw)
    return out


@FUZZ
@given(files=traces(), algo=st.sampled_from(["ring", "ring", "hd", "dbtree", "hdrm", "bogus"]),
       index=st.sampled_from([0, 0, 1, -1, 2**40]),
       topo=st.sampled_from([None, None, "star:hosts=2", "star:hosts=4", "bigraph:upper=1,lower=1,hosts_per_switch=2",
                             "fattree:k=3", "bogus"]))
def test_chakra_traces(files, algo, index, topo):
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for rank, raw in enumerate(files):
            paths.append(os.path.join(tmp, f"t.{rank}.et"))
            with open(paths[-1], "wb") as fh:
                fh.write(raw)
        _imported_ok(user_error_or(chakra.load, paths, algo=algo, index=index, topology=topo))


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
