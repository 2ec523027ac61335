"""MSCCL XML import: the hand-written 4-rank ring sample, and bad input."""

from __future__ import annotations

import os

import pytest

from emulator.errors import FieldError, UserError
from emulator.schedule import msccl
from emulator.schedule.executor import execute
from emulator.schedule.format import validate

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
SAMPLE = os.path.join(DATA, "msccl_ring4.xml")


def test_ring_sample_is_a_valid_allreduce():
    sched = msccl.load(SAMPLE, size=4096)
    assert sched.p == 4 and sched.chunks == 4 and sched.chunk_bytes == 1024
    assert sched.steps == 6  # 2(p-1)
    assert validate(sched) == sched
    result = execute(sched)
    assert result.valid, result.errors
    kinds = {op.kind for r in sched.ranks for op in r.ops}
    assert kinds == {"send", "recv", "recv_reduce", "copy"}


def test_default_size_fits_the_chunks():
    assert msccl.default_size(4) == 1 << 20
    assert msccl.default_size(24) % (24 * 4) == 0


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "algo.xml"
    path.write_text(text)
    return str(path)


def _variant(old: str, new: str, tmp_path) -> str:
    text = open(SAMPLE).read()
    assert old in text
    return _write(tmp_path, text.replace(old, new, 1))


@pytest.mark.parametrize("old, new, field", [
    ('coll="allreduce"', 'coll="allgather"', "algo@coll"),
    ('nchunksperloop="4"', 'nchunksperloop="x"', "algo@nchunksperloop"),
    ('type="rrs"', 'type="zz"', "gpu[0].tb[0].step[1]@type"),
    ('srcbuf="i" srcoff="3"', 'srcbuf="q" srcoff="3"', "gpu[0].tb[0].step[1]@srcbuf"),
    ('srcbuf="i" srcoff="3"', 'srcbuf="i" srcoff="9"', "gpu[0].tb[0].step[1]@srcoff"),
    ('<gpu id="3"', '<gpu id="7"', "gpu@id"),
    ('send="1" recv="3"', 'send="0" recv="3"', "gpu[0].tb[0]@send"),
    ('step s="1"', 'step s="5"', "gpu[0].tb[0].step[1]@s"),
])
def test_bad_xml_fields(tmp_path, old, new, field):
    with pytest.raises(FieldError) as exc:
        msccl.load(_variant(old, new, tmp_path))
    assert exc.value.field == field


def test_two_threadblocks_to_one_peer_are_refused(tmp_path):
    text = open(SAMPLE).read().replace(
        '<tb id="0" send="1" recv="3" chan="0">',
        '<tb id="1" send="1" recv="-1" chan="1"></tb>\n    <tb id="0" send="1" recv="3" chan="0">', 1)
    with pytest.raises(FieldError, match="several channels"):
        msccl.load(_write(tmp_path, text))


def test_unreadable_xml(tmp_path):
    with pytest.raises(UserError, match="not valid XML"):
        msccl.load(_write(tmp_path, "<algo"))
    with pytest.raises(UserError, match="cannot read"):
        msccl.load(str(tmp_path / "none.xml"))


def test_a_broken_algorithm_imports_and_fails_the_proof(tmp_path):
    # Rank 0's last receive no longer stores its chunk: rank 0 ends without it.
    path = _variant('<step s="6" type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2"',
                    '<step s="6" type="nop" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2"', tmp_path)
    result = execute(msccl.load(path))
    assert not result.valid
