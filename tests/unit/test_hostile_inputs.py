"""The hostile-input suite (issue 49): every file reader and command-line value, fed what a careless or hostile
user could give it.

One table of readers (:data:`READERS`): schedules (YAML and JSON), experiments, cluster files, the three placement
files (a cluster's ``--placement``, a language model's ``--placement-file``, ``emu mpirun``'s host list), calibration
files, recorded fabric profiles, topology exports, MSCCL XML and Chakra traces. Each gets

* raw bytes and text (:func:`test_raw_bytes`),
* a valid document of it with one structured corruption -- a value of the wrong type, a huge, negative, NaN or
  infinite number, a long or unicode string, a list where a mapping was, a key dropped or added
  (:func:`test_mutated_documents`),
* a valid file of it with one corruption of its text -- a line given twice (duplicate keys), an anchor and an alias,
  deep nesting, a number swapped for a hostile one, bytes cut or flipped (:func:`test_mutated_text`),
* the hand-written hostile cases of :data:`HOSTILE` (an alias bomb, 100,000 levels of nesting, a 5000-digit integer,
  a 1 MB line, a byte-order mark, invalid UTF-8, several documents, Python tags, ...) and hostile paths
  (:func:`test_hand_written_cases`);

and through the command line (:func:`test_cli_hostile_files`, :func:`test_cli_mutated_files`,
:func:`test_cli_values`: ``emu replay``, ``schedule gen``, ``run``, ``cluster place``, ``topo show`` with one value
spoilt) with every edge that would start something replaced by a raiser.

The contract, held by :func:`fuzz_support.user_error_or` and :func:`fuzz_support.run_cli` for every fuzz test:
a reader returns or raises :class:`UserError`, within :data:`fuzz_support.MAX_SECONDS` and
:data:`fuzz_support.MAX_EXTRA_BYTES` (:func:`fuzz_support.bounded`); its message is one line of at most
:data:`fuzz_support.MAX_ERROR_CHARS` characters; the command line exits 2 with one stderr line. ``make test`` runs
:data:`fuzz_support.EXAMPLES` examples per test (three generated tests per reader, a third as many through each
command), ``make soak`` 1000 or more (``EF_HOSTILE_EXAMPLES``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml
from fuzz_support import (
    EXAMPLES,
    FUZZ,
    MAX_SECONDS,
    WEIRD,
    TookTooLong,
    check_cli,
    cli_fixture,
    mutate,
    run_cli,
    snapshot,
    user_error_or,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_calibration_file import FULL, ME, MINIMAL

from emulator.base.errors import UserError
from emulator.base.files import read_text
from emulator.emulation.machine import calibration_file
from emulator.model import cluster_placement, fabric, topology
from emulator.model.collectives import msccl
from emulator.model.collectives.generators import generate
from emulator.model.schedule import format as fmt
from emulator.model.workloads import chakra, llm_placement
from emulator.runs import cluster_file, mpi_plan
from emulator.selfcheck.validation import check, tables
from emulator.study import experiment as xp

pytestmark = pytest.mark.usefixtures(cli_fixture.__name__)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DATA = os.path.join(ROOT, "tests", "data")
TOPO = topology.build("star:hosts=4")
CLUSTER = {
    "name": "lab", "head": "a", "underlay_mtu": 9100, "private_underlay": True,
    "servers": [
        {"name": "a", "ssh": "192.0.2.10", "user": "root", "key": "/root/.ssh/ef_lab", "underlay": "10.77.0.1"},
        {"name": "b", "ssh": "node-b.example", "port": 2222, "key": "/root/.ssh/ef_lab", "underlay": "10.77.0.2"},
    ],
}


# ---------------------------------------------------------------------------
# The readers
# ---------------------------------------------------------------------------

def _read_experiment(path: str) -> object:
    return xp.expand(xp.load(path))


def _read_cluster_placement(path: str) -> object:
    """As ``emu cluster place`` and ``--cluster --placement`` read a placement file (on top of the computed one)."""
    data = fmt.parse_text(read_text(path, f"placement file {path!r}"), "placement file")
    placed = cluster_placement.place(TOPO, ["a", "b"])
    return cluster_placement.overridden(placed, TOPO, data, where="placement file")


def _read_calibration(path: str) -> object:
    """As ``emu run`` and ``emu cluster calibration`` read this machine's calibration: None when it does not
    count, and a document that counts must read as a whole (its problem and its fields are checked alike)."""
    os.environ["EF_STATE_DIR"] = os.path.dirname(path)
    try:
        found = calibration_file.load_calibration(9000, identity=ME)
    finally:
        del os.environ["EF_STATE_DIR"]
    if found is not None:
        found.intrinsic()
        calibration_file.envelope(found, 2)
    return found


def _read_fabric_record(path: str) -> object:
    """A recorded profile as a results folder gives it back (:meth:`FabricProfile.from_spec`)."""
    return fabric.FabricProfile.from_spec(fmt.parse_text(read_text(path, "record"), "record", "json"))


@dataclass(frozen=True)
class Reader:
    """One file reader: ``read(path)`` returns or raises UserError; ``bases`` are valid documents of it (data for
    the YAML/JSON readers, text for the rest), ``suffix`` its files' ending."""

    name: str
    suffix: str
    read: Callable[[str], object]
    bases: tuple[object, ...]
    data: bool = True  # bases are JSON-like data (else text, or bytes for a binary format)

    def texts(self) -> list[bytes]:
        """The valid files of the reader, as bytes."""
        return [_dump(b, self.suffix).encode() if self.data else b if isinstance(b, bytes) else str(b).encode()
                for b in self.bases]


def _dump(doc: object, suffix: str) -> str:
    if suffix == ".json":
        return json.dumps(doc, allow_nan=True)
    return yaml.dump(doc, Dumper=yaml.CSafeDumper, allow_unicode=True)


@functools.cache
def _schedule_docs() -> tuple[object, ...]:
    return tuple(generate(a, topology.build(s), n).to_dict() for a, s, n in (
        ("ring", "star:hosts=3", 96), ("hdrm", "bigraph:upper=2,lower=2,hosts_per_switch=1", 64),
        ("hier", "leafspine:leaves=2,spines=1,hosts_per_leaf=2", 64)))


def _experiment_docs() -> tuple[object, ...]:
    """Every shipped experiment file that expands quickly (their cells are what users start from)."""
    docs = []
    for name in ("tiny.yaml", "mpi.yaml", "default.yaml", "server.yaml", "clusters.yaml"):
        with open(os.path.join(ROOT, "experiments", name), encoding="utf-8") as fh:
            docs.append(yaml.safe_load(fh))
    return tuple(docs)


def _file(*parts: str) -> bytes:
    with open(os.path.join(DATA, *parts), "rb") as fh:
        return fh.read()


def _chakra_one(path: str) -> object:
    """One rank's trace, replicated to two (``emu schedule import F.0.et --ranks 2``)."""
    return chakra.load([path], topology="star:hosts=2", ranks=2)


READERS = {r.name: r for r in (
    Reader("schedule-yaml", ".yaml", fmt.load, _schedule_docs()),
    Reader("schedule-json", ".json", fmt.load, _schedule_docs()),
    Reader("experiment", ".yaml", _read_experiment, _experiment_docs()),
    Reader("cluster", ".yaml", cluster_file.load, (CLUSTER, {k: v for k, v in CLUSTER.items() if k != "name"})),
    Reader("cluster-placement", ".yaml", _read_cluster_placement, ({"a": ["h1", "h2", "s1"], "b": ["h3", "h4"]},
                                                                  {"b": ["s1"]})),
    Reader("llm-placement", ".yaml", lambda p: llm_placement.read_placement_file(p, TOPO, 4),
           (["h1", "h2", "h3", "h4"], ["h4", "h3", "h2", "h1"])),
    Reader("mpi-placement", ".txt", lambda p: mpi_plan.rank_hosts(TOPO, p, 2),
           ("h1\nh2\n", "# ranks\nh3  # rank 0\nh1\nh4\n"), data=False),
    Reader("calibration", ".json", _read_calibration, (MINIMAL, FULL)),
    Reader("fabric-record", ".json", _read_fabric_record, ("ib200", "preset=roce100,link_gbps=400,mtu=4000",
                                                           {"preset": "ib200", "dilation": 2000, "alpha_us": 3})),
    Reader("topology-export", ".json", topology.load, (topology.build("star:hosts=3").to_json(),
                                                       topology.build("fattree:k=2").to_json())),
    Reader("msccl", ".xml", msccl.load, (_file("msccl_ring4.xml"),
                                         _file("msccl", "reduce_scatter_ring_4gpus_2channels.xml")), data=False),
    Reader("chakra", ".0.et", _chakra_one, (_file("chakra_ar.0.et"),
                                            _file("chakra_ar.1.et")),
           data=False),
    Reader("validation-table", ".yaml", lambda p: [check.check(t) for t in tables.load(p)],
           tuple(yaml.safe_load(open(os.path.join(tables.TABLES_DIR, name), encoding="utf-8"))
                 for name in ("a100-2x1-hdr-ib-nccl-tests-150.yaml", "h100-2x8-ndr400-nccl-tests-309.yaml",
                              "tcp-32g-gcp-nccl-209.yaml"))),
)}
DATA_READERS = sorted(n for n, r in READERS.items() if r.data)


def _read(reader: Reader, raw: bytes) -> object:
    """Write ``raw`` as the reader's file in a fresh folder and read it under the contract."""
    with tempfile.TemporaryDirectory() as tmp:
        name = "calibration-mtu9000.json" if reader.name == "calibration" else "f" + reader.suffix
        path = os.path.join(tmp, name)
        with open(path, "wb") as fh:
            fh.write(raw)
        return user_error_or(reader.read, path)


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------

HOSTILE_NUMBERS = ("1e400", "-1e400", ".nan", "NaN", ".inf", "-.inf", "-1", "0", "-0", "0x7fffffffffffffff",
                   "18446744073709551617", "9" * 400, "1_000", "0o17", "1e-400", "4.9e-324", "2**64", "٣")
HOSTILE_SCALARS = HOSTILE_NUMBERS + ("~", "null", "", "''", "yes", "on", "[]", "{}", "é", "日本", "\U0001f600",
                                     "\\x00", "'\\u202e'", "x" * 3000, "!!binary AAAA", "!!float x", "2001-13-45",
                                     "!!timestamp 2001-12-14", "*undefined", "&a x")

raw_bytes = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from(["{", "}", "[", "]", ": ", "- ", "&a ", "*a", "<<: *a\n", "? ", "\n", "  ", "\t",
                              "---\n", "...\n", "%YAML 1.1\n", "!!python/object/apply:os.system ['true']", "'", '"',
                              "<algo", ">", "</algo>", "&x;", "\x00", "\ufeff", "1" * 4400, "a: 1\n", "a: 2\n"]),
             max_size=14).map(lambda parts: "".join(parts).encode("utf-8", "surrogatepass")),
)


def _lines(raw: bytes) -> list[bytes]:
    return raw.split(b"\n")


@st.composite
def text_mutations(draw, raw: bytes) -> bytes:
    """One corruption of a valid file's text: what a hand-edited file can look like."""
    lines = _lines(raw)
    i = draw(st.integers(0, max(len(lines) - 1, 0)), label="line")
    op = draw(st.sampled_from(["dup_line", "dup_line", "drop_line", "number", "scalar", "anchor", "nest", "indent",
                               "cut", "flip", "insert", "swap_lines", "long_line", "bom"]), label="text op")
    if op == "dup_line":  # a YAML key given twice at its depth; an XML element or attribute twice
        lines.insert(i, lines[i])
    elif op == "drop_line" and len(lines) > 1:
        del lines[i]
    elif op in ("number", "scalar"):
        numbers = list(re.finditer(rb"-?\d+(\.\d+)?([eE][-+]?\d+)?", raw))
        pool = HOSTILE_NUMBERS if op == "number" else HOSTILE_SCALARS
        value = draw(st.sampled_from(pool), label="value").encode()
        if numbers:
            m = numbers[draw(st.integers(0, len(numbers) - 1), label="which number")]
            return raw[:m.start()] + value + raw[m.end():]
        lines[i] += b" " + value
    elif op == "anchor":  # an anchor on one value, an alias to it elsewhere (maybe inside itself)
        j = draw(st.integers(0, max(len(lines) - 1, 0)), label="alias line")
        lines[i] = re.sub(rb": ", b": &a ", lines[i], count=1) if b": " in lines[i] else lines[i] + b" &a"
        lines[j] = re.sub(rb": .*", b": *a", lines[j], count=1) if b": " in lines[j] else lines[j] + b" *a"
    elif op == "nest":
        depth = draw(st.sampled_from([50, 1000, 3000]), label="depth")
        lines[i] += b" " + b"[" * depth + b"1" + b"]" * draw(st.sampled_from([0, depth]), label="closed")
    elif op == "indent":
        lines[i] = draw(st.sampled_from([b"\t", b"   ", b""]), label="indent") + lines[i].lstrip()
    elif op == "cut":
        return raw[:draw(st.integers(0, len(raw)), label="cut")]
    elif op == "flip" and raw:
        k = draw(st.integers(0, len(raw) - 1), label="byte")
        return raw[:k] + bytes([raw[k] ^ draw(st.integers(1, 255), label="xor")]) + raw[k + 1:]
    elif op == "insert":
        k = draw(st.integers(0, len(raw)), label="at")
        return raw[:k] + draw(st.binary(min_size=1, max_size=8), label="bytes") + raw[k:]
    elif op == "swap_lines" and len(lines) > 1:
        j = draw(st.integers(0, len(lines) - 1), label="other line")
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "long_line":
        lines[i] += b"x" * draw(st.sampled_from([3000, 100_000]), label="length")
    elif op == "bom":
        return b"\xef\xbb\xbf" + raw
    return b"\n".join(lines)


# ---------------------------------------------------------------------------
# The harness itself: it must catch what it is there to catch
# ---------------------------------------------------------------------------

def test_the_harness_stops_a_reader_that_hangs(monkeypatch):
    import fuzz_support

    monkeypatch.setattr(fuzz_support, "MAX_SECONDS", 0.2)
    with pytest.raises(TookTooLong):
        user_error_or(lambda: [None for _ in iter(int, 1)])
    assert MAX_SECONDS == 10.0


def test_the_harness_stops_a_reader_that_eats_memory():
    with pytest.raises(MemoryError):
        user_error_or(lambda: bytearray(2 << 30))
    bytearray(1 << 20)  # and the limit is gone after it


@pytest.mark.parametrize("message, why", [("a\nb", "not one line"), ("x" * 20001, "characters"),
                                          ("Traceback (most recent call last): x", "Traceback")])
def test_the_harness_refuses_a_bad_error_line(message, why):
    def bad() -> None:
        raise UserError(message)

    with pytest.raises(AssertionError, match=why):
        user_error_or(bad)


def test_every_valid_base_reads():
    """The mutations start from files the readers accept (else they would test only the first check)."""
    for reader in READERS.values():
        for raw in reader.texts():
            assert _read(reader, raw) is not None, reader.name


# ---------------------------------------------------------------------------
# Generated inputs, per reader
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(READERS))
@FUZZ
@given(raw=raw_bytes)
def test_raw_bytes(name, raw):
    _read(READERS[name], raw)


@pytest.mark.parametrize("name", DATA_READERS)
@FUZZ
@given(data=st.data())
def test_mutated_documents(name, data):
    """A valid document with one structured corruption (:func:`fuzz_support.mutate`), written as YAML or JSON."""
    reader = READERS[name]
    doc = mutate(data, data.draw(st.sampled_from(reader.bases), label="base"))
    _read(reader, _dump(doc, reader.suffix).encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("name", sorted(READERS))
@FUZZ
@given(data=st.data())
def test_mutated_text(name, data):
    """A valid file with one corruption of its text (:func:`text_mutations`)."""
    reader = READERS[name]
    raw = data.draw(st.sampled_from(reader.texts()), label="base")
    _read(reader, data.draw(text_mutations(raw), label="mutated"))


# ---------------------------------------------------------------------------
# Hand-written cases, every text reader
# ---------------------------------------------------------------------------

def _alias_bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


#: Whole files, each hostile in one way (the names say which); every reader and command gets each.
HOSTILE = {
    "alias bomb": _alias_bomb().encode(),
    "alias bomb in a list": ("- " + _alias_bomb().replace("\n", "\n  ")).encode(),
    "merge key loop": b"a: &a\n  <<: *a\n",
    "recursive alias": b"&a [*a]\n",
    "5000-digit integer": b"9" * 5000,
    "1e400": b"1e400",
    "byte-order mark": b"\xef\xbb\xbfname: x\n",
    "invalid UTF-8": b"name: \xff\xfe\n",
    "NUL bytes": b"name: a\x00b\n",
    "several documents": b"name: a\n---\nname: b\n",
    "empty": b"",
    "null": b"~\n",
    "python tag": b"!!python/object/apply:os.system ['true']\n",
    "binary tag": b"!!binary AAAA\n",
    "bad timestamp": b"2001-13-45\n",
    "duplicate keys": b"a: 1\na: 2\n",
    "tabs": b"a:\n\t- 1\n",
    "XML billion laughs": (b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
                           + b"".join(b'<!ENTITY %s "%s">' % (bytes([98 + i]), (b"&%s;" % bytes([97 + i])) * 10)
                                      for i in range(8))
                           + b']><algo name="&i;"/>'),
    "XML external entity": b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">]><algo>&x;</algo>',
}
#: Hostile by their size: each costs a parser seconds, so they go to one reader of each parser (the strict YAML/JSON
#: reader every document reader shares, the topology export's and calibration's JSON, expat, protobuf).
HEAVY = {
    "deep flow nesting": b"[" * 25_000 + b"]" * 25_000,
    "deep mapping nesting": b"{a: " * 5000 + b"1" + b"}" * 5000,
    "deep block nesting": "".join(f"{' ' * i}a:\n" for i in range(2000)).encode(),
    "a 1 MB line": b"x" * (1 << 20),
    "a 1 MB key": b"x" * (1 << 20) + b": 1\n",
    "200,000 list entries": b"[" + b"1," * 200_000 + b"1]",
    "XML deep nesting": b"<a>" * 20000 + b"</a>" * 20000,
}
ONE_PER_PARSER = ("schedule-yaml", "schedule-json", "topology-export", "calibration", "msccl", "chakra")


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("name", sorted(READERS))
def test_hand_written_cases(name, case):
    _read(READERS[name], HOSTILE[case])


@pytest.mark.parametrize("case", sorted(HEAVY))
@pytest.mark.parametrize("name", ONE_PER_PARSER)
def test_hand_written_heavy_cases(name, case):
    _read(READERS[name], HEAVY[case])


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("case", ["duplicate first key", "alias to the first value", "every number hostile"])
def test_hand_written_cases_of_a_valid_file(name, case):
    """Hostile in one place, valid in every other: the readers' checks, not only the parser, see it."""
    reader = READERS[name]
    raw = reader.texts()[0]
    lines = _lines(raw)
    if case == "duplicate first key":
        raw = b"\n".join([lines[0], *lines])
    elif case == "alias to the first value":
        raw = b"\n".join([re.sub(rb": ", b": &a ", lines[0], count=1),
                          *(re.sub(rb": .*", b": *a", line, count=1) for line in lines[1:])])
    else:
        raw = re.sub(rb"\d+", b"1e400", raw)
    _read(reader, raw)


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("path", ["missing", "dir", "/dev/null", "a\nb", "x" * 5000, "\u00e9\u65e5"])
def test_hostile_paths(name, path, tmp_path):
    os.mkdir(tmp_path / "dir")
    where = path if os.path.isabs(path) else str(tmp_path / path)
    user_error_or(READERS[name].read, where)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

#: Commands that read a file ``F`` (written under the reader's name), from a working folder with ``cluster.yaml``
#: (a valid cluster) and ``s.yaml`` (a valid schedule).
CLI_COMMANDS = {
    "schedule-yaml": ["schedule", "check", "F", "--topology", "star:hosts=3"],
    "schedule-json": ["replay", "F", "--topology", "star:hosts=3", "--routing", "shortest", "--out", "out"],
    "experiment": ["run", "F", "--check"],
    "cluster": ["cluster", "place", "F", "--topology", "star:hosts=4"],
    "cluster-placement": ["cluster", "place", "cluster.yaml", "--topology", "star:hosts=4", "--placement", "F"],
    "llm-placement": ["schedule", "gen", "--model", "llama2-7b", "--topology", "star:hosts=4", "--tp", "2", "--pp",
                      "1", "--dp", "2", "--scale", "1000", "--layers-per-collective", "32", "--placement-file", "F",
                      "-o", "o.yaml"],
    "calibration": ["cluster", "calibration", "--fabric", "preset=roce100,mtu=9000"],
    "topology-export": ["topo", "show", "F"],
    "msccl": ["schedule", "import", "F", "-o", "o.yaml"],
    "chakra": ["schedule", "import", "F", "--ranks", "2", "--topology", "star:hosts=2", "-o", "o.yaml"],
    "validation-table": ["validate", "F"],
}


def _cli_workdir(root: str) -> None:
    with open(os.path.join(root, "cluster.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(CLUSTER, fh)
    with open(os.path.join(root, "s.yaml"), "w", encoding="utf-8") as fh:
        fh.write(fmt.dumps(generate("ring", topology.build("star:hosts=3"), 96)))


def _cli_on(name: str, raw: bytes) -> int | None:
    """Run ``name``'s command on ``raw`` as its file: exit 0/1, or 2 with one stderr line and nothing written."""
    reader = READERS[name]
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as root:
        _cli_workdir(root)
        fname = "calibration-mtu9000.json" if name == "calibration" else "F" + reader.suffix
        with open(os.path.join(root, fname), "wb") as fh:
            fh.write(raw)
        argv = [fname if a == "F" else a for a in CLI_COMMANDS[name]]
        os.chdir(root)
        os.environ["EF_STATE_DIR"] = root
        try:
            return check_cli(argv, root, snapshot(root))
        finally:
            os.chdir(cwd)
            del os.environ["EF_STATE_DIR"]


def test_every_cli_command_takes_its_valid_file():
    for name in CLI_COMMANDS:
        if name != "calibration":  # a calibration of another machine is "none", exit 0 all the same
            assert _cli_on(name, READERS[name].texts()[0]) in (0, None), name


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("name", sorted(CLI_COMMANDS))
def test_cli_hostile_files(name, case):
    _cli_on(name, HOSTILE[case])


#: The command line costs ten times a reader per input; the readers' own tests carry the count per reader.
CLI_FUZZ = settings(FUZZ, max_examples=max(EXAMPLES // 3, 10))


@pytest.mark.parametrize("name", sorted(CLI_COMMANDS))
@CLI_FUZZ
@given(data=st.data())
def test_cli_mutated_files(name, data):
    # `emu run --check` proves every cell: default.yaml's take seconds when valid, so the command gets the two
    # small experiments (the reader gets them all)
    bases = READERS[name].texts()[:2] if name == "experiment" else READERS[name].texts()
    raw = data.draw(st.sampled_from(bases), label="base")
    _cli_on(name, data.draw(st.one_of(text_mutations(raw), raw_bytes), label="file"))


#: Valid command lines whose values :func:`test_cli_values` spoils one at a time.
CLI_VALUES = {
    "replay": ["replay", "s.yaml", "--topology", "star:hosts=3", "--routing", "shortest", "--fabric", "roce100",
               "--repeat", "1", "--warmup", "0", "--timeout", "30", "--out", "out"],
    "schedule gen": ["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=3", "--size", "96", "--chunks",
                     "3", "--placement", "random", "--seed", "1", "-o", "o.yaml"],
    "schedule gen --model": ["schedule", "gen", "--model", "llama2-7b", "--topology", "star:hosts=4", "--tp", "2",
                             "--pp", "2", "--dp", "1", "--microbatches", "2", "--micro-batch", "1", "--scale",
                             "1000", "--layers-per-collective", "16", "-o", "o.yaml"],
    "schedule gen resnet50": ["schedule", "gen", "--model", "resnet50", "--topology", "star:hosts=2", "--batch",
                              "8", "--scale", "1000", "-o", "o.yaml"],
    "run": ["run", "e.yaml", "--check", "--out", "out"],
    "schedule check": ["schedule", "check", "s.yaml", "--topology", "star:hosts=3", "--routing", "ecmp", "--seed",
                       "3", "--gamma", "0.5", "--fabric", "alpha_us=2,link_gbps=100"],
    "topo show": ["topo", "show", "fattree:k=4", "--fabric", "ib200"],
}
ARG_VALUES = st.one_of(
    st.sampled_from(HOSTILE_SCALARS + ("--", "-", "-h", "--out", "a b", "a\nb", "x" * 100_000, "/dev/null", "/",
                                       "s.yaml", "e.yaml", "star:hosts=1025", "fattree:k=1000",
                                       "preset=ib200,dilation=1e-300", "link_gbps=nan", "mtu=65536",
                                       "1e308", "99999999999", "-99999999999", "3.5", "1KiB", "1e3")),
    WEIRD.map(str),
    st.text(max_size=12).filter(lambda t: "\x00" not in t),
)


@pytest.mark.parametrize("command", sorted(CLI_VALUES))
@CLI_FUZZ
@given(data=st.data())
def test_cli_values(command, data):
    """One value of a valid command line spoilt, dropped, given twice or followed by junk."""
    argv = list(CLI_VALUES[command])
    i = data.draw(st.integers(1, len(argv) - 1), label="position")
    op = data.draw(st.sampled_from(["replace", "replace", "replace", "drop", "twice", "append"]), label="op")
    if op == "replace":
        argv[i] = data.draw(ARG_VALUES, label="value")
    elif op == "drop":
        del argv[i]
    elif op == "twice":
        argv.insert(i, argv[i])
    else:
        argv.append(data.draw(ARG_VALUES, label="junk"))
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as root:
        _cli_workdir(root)
        shutil.copy(os.path.join(ROOT, "experiments", "tiny.yaml"), os.path.join(root, "e.yaml"))
        os.chdir(root)
        try:
            check_cli(argv, root, snapshot(root))
        finally:
            os.chdir(cwd)


def test_a_topology_spec_of_a_million_characters_is_one_short_line():
    """Found by this suite: the spec's errors named it in full (``topology spec 'xxx...'``, a million characters);
    now it is echoed cut, as every value is (:func:`emulator.base.errors.shown`)."""
    user_error_or(topology.build, "x" * 1_000_000)
    status, _out, err = run_cli(["schedule", "gen", "--algo", "ring", "--topology", "x" * 1_000_000, "--size", "96",
                                 "-o", os.devnull])
    assert status == 2 and err.count("\n") == 1 and len(err) < 1000, err[:300]


@pytest.mark.parametrize("key, value", [("latency", 1), ("measurements", [1]), ("datapath_capacity_mbps", 10**400),
                                        ("latency.per_switches.1", 5), ("machine.nproc", math.inf),
                                        ("machine.loadavg_before", [10**400])])
def test_calibration_documents_found_by_the_suite(key, value):
    """Found by this suite: each raised TypeError, ValueError or OverflowError from the calibration reader (a
    calibration file is the user's too: ``EF_STATE_DIR`` may point anywhere); now one FieldError naming the field."""
    doc = json.loads(json.dumps(MINIMAL))
    *parents, last = key.split(".")
    node = doc
    for part in parents:
        node = node[part]
    node[last] = value
    assert user_error_or(calibration_file.Calibration.from_json, doc) is None


@pytest.mark.parametrize("key", ["bw", "host_bw", "switch_bw"])
def test_a_topology_exports_rate_past_a_floats_range_is_refused(key, tmp_path):
    """Found by ``make soak`` (1000 inputs per reader): a 400-digit integer as a topology export's link rate raised
    OverflowError; now one FieldError naming the rate."""
    doc = json.loads(json.dumps(topology.build("star:hosts=3").to_json()))
    doc["graph"]["params"][key] = 10**400
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=f"field '{key}'"):
        topology.load(str(path))


def test_an_mpi_program_of_100000_characters_is_one_short_line():
    """An experiment's ``mpi.program`` with a 100,000-character argument was echoed whole by the bundled
    benchmark's argument check (found by this suite and, at the same time, fixed in the experiment reader)."""
    doc = {"name": "m", "series": [{"name": "s", "runs": [{"topology": "star:hosts=2", "routing": "shortest", "mpi": {
        "program": ["emu-allreduce-bench", "--algo" + "x" * 100_000]}}]}]}
    assert user_error_or(xp.from_dict, doc, "e.yaml", "m") is None


def test_fabric_values_and_records():
    """``--fabric`` text, experiment ``fabric:`` mappings and recorded profiles: every hostile value is refused in
    one line naming its key (the profile parser has no file of its own; its callers are in the tables above)."""
    for value in (*HOSTILE_SCALARS, "preset=", "=1", "dilation=0", "dilation=1e-320", "mtu=67", "link_gbps=1e308",
                  "alpha_us=-0", "alpha_us=1e400", "mtu=9000,mtu=9000", "preset=ib200,,mtu=9000", "x" * 100_000,
                  {"mtu": math.nan}, {"dilation": [1]}, {"preset": {"a": 1}}, {1: 2}, {"link_gbps": 10**300}):
        profile = user_error_or(fabric.parse, value)
        if profile is not None:
            assert fabric.FabricProfile.from_spec(profile.spec()) == profile
        user_error_or(fabric.FabricProfile.from_spec, value)
