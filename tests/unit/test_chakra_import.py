"""Chakra trace import: the sample traces, the varint stream, and bad input."""

from __future__ import annotations

import os

import pytest
from chakra.schema.protobuf import et_def_pb2 as pb

from emulator.errors import FieldError, UserError
from emulator.schedule import chakra
from emulator.schedule.executor import execute

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
SAMPLE = [os.path.join(DATA, f"chakra_ar.{r}.et") for r in range(4)]


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 20000])
def test_varint_round_trip(n):
    raw = chakra.encode_varint(n) + b"x" * n + chakra.encode_varint(1) + b"y"
    assert chakra.decode_stream(raw, "t") == [b"x" * n, b"y"]


def test_stream_matches_googles_varint_decoder():
    from google.protobuf.internal.decoder import _DecodeVarint32

    data = open(SAMPLE[0], "rb").read()
    length, pos = _DecodeVarint32(data, 0)
    first = chakra.decode_stream(data, "t")[0]
    assert first == data[pos:pos + length]
    assert pb.GlobalMetadata.FromString(first).version == "0.0.4"


def test_sample_collectives():
    colls = chakra.read_collectives(SAMPLE[2])
    assert [(c.node_id, c.comm_type, c.comm_size) for c in colls] == [(2, 0, 65536), (4, 0, 1 << 20)]


@pytest.mark.parametrize("index, size", [(0, 65536), (1, 1 << 20)])
def test_import_expands_the_allreduce(index, size):
    sched = chakra.load(list(reversed(SAMPLE)), index=index)
    assert sched.p == 4 and sched.size == size and sched.algorithm == "ring"
    assert sched.meta["imported_from"] == "chakra" and sched.meta["allreduce_index"] == index
    assert execute(sched).valid


def test_import_with_another_generator_and_topology():
    sched = chakra.load(SAMPLE, algo="dbtree", topology="bigraph:upper=1,lower=1,hosts_per_switch=2")
    assert sched.algorithm == "dbtree" and execute(sched).valid


def test_bad_trace_sets(tmp_path):
    with pytest.raises(FieldError, match="<prefix>.<rank>.et"):
        chakra.load([str(tmp_path / "trace.et")])
    with pytest.raises(FieldError, match="ranks 0..2"):
        chakra.load(SAMPLE[:2] + SAMPLE[3:])
    with pytest.raises(FieldError, match="index"):
        chakra.load(SAMPLE, index=2)
    with pytest.raises(FieldError, match="4 hosts"):
        chakra.load(SAMPLE, topology="star:hosts=8")


def test_disagreeing_sizes_and_garbage(tmp_path):
    for r in range(2):
        chakra.write_trace(str(tmp_path / f"t.{r}.et"), [chakra.coll_node(1, "ar", pb.ALL_REDUCE, 64 * (r + 1))])
    with pytest.raises(FieldError, match="same size on every rank"):
        chakra.load([str(tmp_path / f"t.{r}.et") for r in range(2)])
    (tmp_path / "g.0.et").write_bytes(b"\x05ab")
    (tmp_path / "g.1.et").write_bytes(b"")
    with pytest.raises(UserError, match="claims 5 bytes"):
        chakra.load([str(tmp_path / "g.0.et"), str(tmp_path / "g.1.et")])
