"""MSCCL XML import: real files (``tests/data/msccl``, see its SOURCES.md), the hand-written 4-rank ring
sample, instances, channels and bad input."""

from __future__ import annotations

import collections
import functools
import gzip
import os
import xml.etree.ElementTree as ET

import pytest

from emulator.base.errors import FieldError, UserError
from emulator.model.collectives import msccl
from emulator.model.prediction.check import check
from emulator.model.schedule.executor import execute
from emulator.model.schedule.format import RECV, RECV_REDUCE, SEND, Schedule, validate
from emulator.model.topology import build

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
REAL = os.path.join(DATA, "msccl")
SAMPLE = os.path.join(DATA, "msccl_ring4.xml")

# file, collective, ranks, data chunks, output chunks, channels, protocol
FILES = [
    ("r48ll.xml", "allreduce", 8, 64, 0, 32, "LL"),
    ("ap4ll.xml.gz", "allreduce", 8, 256, 0, 4, "LL"),
    ("ar_tree_12_LL.xml", "allreduce", 4, 24, 0, 24, "LL"),
    ("ar_hier_12_Simple.xml", "allreduce", 4, 24, 0, 24, "Simple"),
    ("ag-32m-1g.xml.gz", "allgather", 8, 256, 0, 32, "Simple"),
    ("ag_hier_4_LL.xml", "allgather", 4, 4, 16, 4, "LL"),
    ("a2a2ll.xml", "alltoall", 8, 16, 16, 2, "LL"),
    ("all-reduce-ring-simple.xml.gz", "allreduce", 16, 384, 0, 24, "Simple"),
    ("allreduce-allpairs-8n-ll-32tb-op.xml.gz", "allreduce", 8, 256, 256, 4, "LL"),
    ("allreduce_ring_8gpus_4channels_1instance.xml", "allreduce", 8, 8, 0, 4, "LL"),
    ("allgather_allpairs_4gpus_2instances.xml", "allgather", 4, 8, 0, 2, "LL128"),
    ("reduce_scatter_ring_4gpus_2channels.xml", "reduce_scatter", 4, 4, 1, 2, "Simple"),
    ("reduce_scatter_ring_4gpus_2channels_inplace.xml", "reduce_scatter", 4, 4, 0, 2, "Simple"),
]


def _root(name: str) -> ET.Element:
    path = os.path.join(REAL, name)
    if name.endswith(".gz"):
        with gzip.open(path) as fh:
            return ET.fromstring(fh.read())
    return ET.parse(path).getroot()


@functools.cache
def _schedule(name: str, instances: int = 1) -> Schedule:
    if name.endswith(".gz"):
        return msccl.from_xml(_root(name), f"MSCCL file {name!r}", instances=instances, source=name)
    return msccl.load(os.path.join(REAL, name), instances=instances)


def _connections(sched: Schedule) -> collections.Counter:
    """(rank, peer, sends, lane, chunks) of every send and receive."""
    return collections.Counter((r.rank, op.partner, op.kind == SEND, op.lane, op.nchunks)
                               for r in sched.ranks for op in r.ops if op.is_comm)


def _file_messages(root: ET.Element) -> collections.Counter:
    """The same, from the file: one message per sending and per receiving step."""
    out: collections.Counter = collections.Counter()
    for gpu in root.findall("gpu"):
        rank = int(gpu.get("id", ""))
        for tb in gpu.findall("tb"):
            send, recv, chan = (int(tb.get(name, "")) for name in ("send", "recv", "chan"))
            for step in tb.findall("step"):
                kind, cnt = step.get("type"), int(step.get("cnt", "1"))
                if kind in msccl.SENDING:
                    out[(rank, send, True, chan, cnt)] += 1
                if kind in msccl.RECEIVING:
                    out[(rank, recv, False, chan, cnt)] += 1
    return out


@pytest.mark.parametrize("name, collective, p, chunks, output_chunks, channels, proto", FILES)
def test_real_files_import_and_compute_their_collective(name, collective, p, chunks, output_chunks, channels, proto):
    sched = _schedule(name)
    assert (sched.collective, sched.p, sched.chunks, sched.output_chunks) == (collective, p, chunks, output_chunks)
    assert sched.shape.problem() is None
    assert sched.size == msccl.default_size(chunks) and sched.chunk_bytes * chunks == sched.size
    result = execute(sched)
    assert result.valid, result.errors
    assert validate(sched) == sched
    assert {op.lane for r in sched.ranks for op in r.ops if op.is_comm} == set(range(channels))
    meta = sched.meta["msccl"]
    assert (meta["proto"], meta["nchannels"], meta["instances"], meta["source"]) == (proto, channels, 1, name)


@pytest.mark.parametrize("name", [f[0] for f in FILES])
def test_every_step_is_one_message_on_its_channel(name):
    """A message per sending or receiving step, of its cnt chunks, to the threadblock's peer, on lane = chan."""
    assert _connections(_schedule(name)) == _file_messages(_root(name))


def test_r48ll_uses_32_lanes_between_ring_neighbours():
    sched = _schedule("r48ll.xml")
    for r in range(8):
        right = (r + 1) % 8
        lanes = {op.lane for op in sched.ranks[r].ops if op.kind == SEND and op.peer == right}
        assert lanes == set(range(32))
        assert not any(op.kind == SEND and op.peer not in (right,) for op in sched.ranks[r].ops)
    assert sched.meta["msccl"]["min_bytes"] == 266240 and sched.meta["msccl"]["max_bytes"] == 2078719


def test_ring_order_differs_per_channel():
    """RCCL's 16-gpu file runs different rings on its channels: every lane keeps its own peers."""
    sched = _schedule("all-reduce-ring-simple.xml.gz")
    right = collections.defaultdict(set)
    for op in sched.ranks[1].ops:
        if op.kind == SEND:
            right[op.lane].add(op.peer)
    assert all(len(peers) == 1 for peers in right.values())
    assert len({next(iter(peers)) for peers in right.values()}) > 1


def _lane_sequences(sched: Schedule) -> dict:
    """Per (rank, peer, direction, lane): the messages in program order (scratch offsets left out)."""
    out = collections.defaultdict(list)
    for r in sched.ranks:
        for op in r.ops:
            if op.is_comm:
                where = (op.buffer, op.chunk) if op.buffer != "scratch" else ("scratch", None)
                out[(r.rank, op.partner, op.kind == SEND, op.lane)].append((op.kind, *where, op.nchunks))
    return dict(out)


def test_instances_replicate_as_msccl_tools_does():
    """msccl-tools' 8 instances of the 4-channel ring (r48ll.xml) are our 8 instances of its 1-instance file."""
    ours = _schedule("allreduce_ring_8gpus_4channels_1instance.xml", 8)
    theirs = _schedule("r48ll.xml")
    assert (ours.chunks, ours.scratch_chunks) == (theirs.chunks, theirs.scratch_chunks)
    assert _lane_sequences(ours) == _lane_sequences(theirs)
    assert execute(ours).valid
    meta = ours.meta["msccl"]
    assert (meta["instances"], meta["nchannels"], meta["lanes"]) == (8, 4, 32)


@pytest.mark.parametrize("name, instances", [
    ("ag_hier_4_LL.xml", 3), ("a2a2ll.xml", 2), ("ar_tree_12_LL.xml", 2), ("ar_hier_12_Simple.xml", 2),
    ("reduce_scatter_ring_4gpus_2channels.xml", 3), ("reduce_scatter_ring_4gpus_2channels_inplace.xml", 2),
    ("allgather_allpairs_4gpus_2instances.xml", 4), ("allreduce-allpairs-8n-ll-32tb-op.xml.gz", 2),
])
def test_instances_give_each_instance_its_channels_and_a_slice_of_every_chunk(name, instances):
    one, many = _schedule(name), _schedule(name, instances)
    result = execute(many)
    assert result.valid, result.errors
    assert (many.chunks, many.output_chunks) == (one.chunks * instances, one.output_chunks * instances)
    lanes = {op.lane for r in one.ranks for op in r.ops if op.is_comm}
    assert {op.lane for r in many.ranks for op in r.ops if op.is_comm} == set(range(len(lanes) * instances))
    # steps of cnt > 1 become one-chunk steps: as many chunks move, in one-chunk messages
    moved = sum(op.nchunks for r in one.ranks for op in r.ops if op.kind == SEND)
    assert sum(op.nchunks for r in many.ranks for op in r.ops if op.kind == SEND) == moved * instances
    assert all(op.nchunks == 1 for r in many.ranks for op in r.ops if op.is_comm)


def test_too_many_instances_for_the_lanes():
    with pytest.raises(FieldError) as exc:
        _schedule("r48ll.xml", 3)
    assert exc.value.field == "instances"
    with pytest.raises(FieldError):
        msccl.load(SAMPLE, instances=0)


@pytest.mark.parametrize("name", ["r48ll.xml", "ag_hier_4_LL.xml", "a2a2ll.xml", "ar_hier_12_Simple.xml",
                                  "reduce_scatter_ring_4gpus_2channels.xml"])
def test_check_analyses_imported_schedules(name):
    sched = _schedule(name)
    report = check(sched, build(f"star:hosts={sched.p}"), "shortest")
    assert report.valid and report.predicted_time_s > 0


# ---------------------------------------------------------------------------
# The hand-written sample
# ---------------------------------------------------------------------------

def test_ring_sample_is_a_valid_allreduce():
    sched = msccl.load(SAMPLE, size=4096)
    assert sched.p == 4 and sched.chunks == 4 and sched.chunk_bytes == 1024
    assert sched.steps == 6  # 2(p-1)
    assert validate(sched) == sched
    result = execute(sched)
    assert result.valid, result.errors
    kinds = {op.kind for r in sched.ranks for op in r.ops}
    assert kinds == {"send", "recv", "recv_reduce", "copy"}
    assert sched.meta["msccl"]["proto"] == "Simple" and sched.meta["msccl"]["source"] == "msccl_ring4.xml"


def test_default_size_fits_the_chunks():
    assert msccl.default_size(4) == 1 << 20
    assert msccl.default_size(24) % (24 * 4) == 0


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "algo.xml"
    path.write_text(text)
    return str(path)


def _variant(old: str, new: str, tmp_path, source: str = SAMPLE) -> str:
    with open(source) as fh:
        text = fh.read()
    assert old in text
    return _write(tmp_path, text.replace(old, new, 1))


STEP1 = '<step s="1" type="rrs" srcbuf="i" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>'


@pytest.mark.parametrize("old, new, field", [
    ('coll="allreduce"', 'coll="gather"', "algo@coll"),
    ('coll="allreduce"', 'coll="allgather"', "gpu[0]@i_chunks"),  # allgather's input is 1 chunk of 4
    (' coll="allreduce"', "", "algo@coll"),
    (' proto="Simple"', "", "algo@proto"),
    ('proto="Simple"', 'proto="LL64"', "algo@proto"),
    ('nchunksperloop="4"', 'nchunksperloop="x"', "algo@nchunksperloop"),
    ('nchunksperloop="4"', 'nchunksperloop="1_0"', "algo@nchunksperloop"),
    ('type="rrs"', 'type="zz"', "gpu[0].tb[0].step[1]@type"),
    ('srcbuf="i" srcoff="3"', 'srcbuf="q" srcoff="3"', "gpu[0].tb[0].step[1]@srcbuf"),
    ('srcbuf="i" srcoff="3"', 'srcbuf="i" srcoff="9"', "gpu[0].tb[0].step[1]@srcoff"),
    ('srcbuf="i" srcoff="3"', 'srcbuf="s" srcoff="0"', "gpu[0].tb[0].step[1]@srcoff"),  # s_chunks is 0
    (' cnt="1" depid="-1" deps="-1" hasdep="0"/>', ' depid="-1" deps="-1" hasdep="0"/>', "gpu[0].tb[0].step[0]@cnt"),
    ('<gpu id="3"', '<gpu id="7"', "gpu[3]@id"),
    ('<gpu id="3"', '<gpu id="2"', "gpu[3]@id"),
    ('<gpu id="3" i_chunks="4"', '<gpu id="3"', "gpu[3]@i_chunks"),
    ('send="1" recv="3"', 'send="0" recv="3"', "gpu[0].tb[0]@send"),
    ('send="1" recv="3"', 'send="9" recv="3"', "gpu[0].tb[0]@send"),
    ('send="1" recv="3" chan="0"', 'send="1" recv="3"', "gpu[0].tb[0]@chan"),
    ('send="1" recv="3" chan="0"', 'send="1" recv="3" chan="1"', "gpu[0].tb[0]@chan"),  # nchannels is 1
    ('<tb id="0" send="1"', '<tb id="1" send="1"', "gpu[0].tb[0]@id"),
    ('step s="1"', 'step s="5"', "gpu[0].tb[0].step[1]@s"),
    (STEP1, STEP1.replace('depid="-1" deps="-1"', 'depid="4" deps="0"'), "gpu[0].tb[0].step[1]@depid"),
    (STEP1, STEP1.replace('depid="-1" deps="-1"', 'depid="0" deps="9"'), "gpu[0].tb[0].step[1]@deps"),
    # step 0 has hasdep="0": a dependency on it would wait forever in the runtime
    (STEP1, STEP1.replace('depid="-1" deps="-1"', 'depid="0" deps="0"'), "gpu[0].tb[0].step[1]@deps"),
    # rank 0 sends rank 1 one message fewer than rank 1 receives
    ('<step s="0" type="s"', '<step s="0" type="nop"', "gpu[0].tb[0]@send"),
])
def test_bad_xml_fields(tmp_path, old, new, field):
    with pytest.raises(FieldError) as exc:
        msccl.load(_variant(old, new, tmp_path))
    assert exc.value.field == field


def test_a_dependency_cycle_names_a_step_on_it(tmp_path):
    text = open(SAMPLE).read()
    text = text.replace(STEP1, STEP1.replace('depid="-1" deps="-1"', 'depid="0" deps="3"'), 1)
    text = text.replace('<step s="3" type="rrcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" '
                        'deps="-1" hasdep="0"/>', '<step s="3" type="rrcs" srcbuf="i" srcoff="1" dstbuf="i" '
                        'dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>', 1)
    with pytest.raises(FieldError) as exc:
        msccl.load(_write(tmp_path, text))
    assert exc.value.field == "gpu[0].tb[0].step[1]@deps"
    assert all(f"tb 0 step {k} ->" in str(exc.value) for k in (1, 2, 3))


def test_unreadable_xml(tmp_path):
    with pytest.raises(UserError, match="not valid XML"):
        msccl.load(_write(tmp_path, "<algo"))
    with pytest.raises(UserError, match="cannot read"):
        msccl.load(str(tmp_path / "none.xml"))


def test_a_broken_algorithm_imports_and_fails_the_proof(tmp_path):
    # Rank 0's last receive stores its chunk in the wrong place: rank 0 ends without chunk 2.
    path = _variant('<step s="6" type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2"',
                    '<step s="6" type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="0"', tmp_path)
    result = execute(msccl.load(path))
    assert not result.valid


def test_an_empty_threadblock_on_a_shared_channel_imports(tmp_path):
    text = open(SAMPLE).read().replace(
        '<tb id="0" send="1" recv="3" chan="0">',
        '<tb id="1" send="1" recv="-1" chan="0"></tb>\n    <tb id="0" send="1" recv="3" chan="0">', 1)
    assert execute(msccl.load(_write(tmp_path, text))).valid


# ---------------------------------------------------------------------------
# Hand-written algorithms for the rules the real files do not exercise
# ---------------------------------------------------------------------------

def _algo(coll: str, ngpus: int, nchunks: int, gpus: list[str], inplace: int = 0, nchannels: int = 1) -> str:
    return (f'<algo name="t" proto="LL" nchannels="{nchannels}" nchunksperloop="{nchunks}" ngpus="{ngpus}" '
            f'coll="{coll}" inplace="{inplace}">' + "".join(gpus) + "</algo>")


def _gpu(rank: int, i: int, o: int, tbs: list[str], s: int = 0) -> str:
    return f'<gpu id="{rank}" i_chunks="{i}" o_chunks="{o}" s_chunks="{s}">' + "".join(tbs) + "</gpu>"


def _tb(tid: int, send: int, recv: int, chan: int, steps: list[str]) -> str:
    body = "".join(f'<step s="{k}" {step}/>' for k, step in enumerate(steps))
    return f'<tb id="{tid}" send="{send}" recv="{recv}" chan="{chan}">{body}</tb>'


def _st(kind: str, src: str = "i -1", dst: str = "o -1", cnt: int = 1, dep: str = "-1 -1", hasdep: int = 0) -> str:
    (sb, so), (db, do), (di, ds) = src.split(), dst.split(), dep.split()
    return (f'type="{kind}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" cnt="{cnt}" depid="{di}" '
            f'deps="{ds}" hasdep="{hasdep}"')


def test_threadblocks_sharing_a_connection_are_one_lane_in_step_order(tmp_path):
    # alltoall over 2 gpus, blocks of 2 chunks: each gpu sends the peer's block from two threadblocks on channel 0
    # (step 0 of tb 0, then step 0 of tb 1, in step order) and receives the peer's in one threadblock.
    gpus = []
    for r in (0, 1):
        q = 1 - r
        gpus.append(_gpu(r, 4, 4, [
            _tb(0, q, q, 0, [_st("s", f"i {2 * q}"), _st("r", dst=f"o {2 * q}"), _st("r", dst=f"o {2 * q + 1}")]),
            _tb(1, q, -1, 0, [_st("s", f"i {2 * q + 1}")]),
            _tb(2, -1, -1, 0, [_st("cpy", f"i {2 * r}", f"o {2 * r}", cnt=2)]),
        ]))
    sched = msccl.load(_write(tmp_path, _algo("alltoall", 2, 4, gpus)))
    assert [(op.chunk, op.lane) for op in sched.ranks[0].ops if op.kind == SEND] == [(2, 0), (3, 0)]
    assert [op.chunk for op in sched.ranks[1].ops if op.kind == RECV] == [0, 1]
    result = execute(sched)
    assert result.valid, result.errors


def test_a_nop_keeps_its_dependency(tmp_path):
    # In-place allreduce over 2 gpus: chunk 0 is reduced on gpu 0 over channel 0, chunk 1 on gpu 1 over channel 1.
    # On gpu 0, tb 1 waits through a nop for tb 0's receive before it sends chunk 1: no data hazard orders them.
    gpu0 = _gpu(0, 2, 0, [_tb(0, 1, 1, 0, [_st("rrc", "i 0", "i 0", hasdep=1), _st("s", "i 0")]),
                          _tb(1, 1, 1, 1, [_st("nop", cnt=0, dep="0 0"), _st("s", "i 1"), _st("r", dst="i 1")])])
    gpu1 = _gpu(1, 2, 0, [_tb(0, 0, 0, 0, [_st("s", "i 0"), _st("r", dst="i 0")]),
                          _tb(1, 0, 0, 1, [_st("rrc", "i 1", "i 1"), _st("s", "i 1")])])
    sched = msccl.load(_write(tmp_path, _algo("allreduce", 2, 2, [gpu0, gpu1], inplace=1, nchannels=2)))
    ops = sched.ranks[0].ops
    recv = next(op for op in ops if op.kind == RECV_REDUCE and op.chunk == 0)
    send1 = next(op for op in ops if op.kind == SEND and op.chunk == 1)
    assert recv.id in send1.deps
    result = execute(sched)
    assert result.valid, result.errors


def test_in_place_allgather_reads_its_input_from_its_block(tmp_path):
    # 2 gpus, 1 chunk each: i[0] of rank r is data chunk r; the copy i -> o of the same chunk is dropped.
    gpus = [_gpu(r, 1, 2, [_tb(0, 1 - r, 1 - r, 0, [_st("cpy", "i 0", f"o {r}"), _st("s", "i 0"),
                                                    _st("r", dst=f"o {1 - r}")])]) for r in (0, 1)]
    sched = msccl.load(_write(tmp_path, _algo("allgather", 2, 2, gpus, inplace=1)))
    assert [(op.kind, op.chunk) for op in sched.ranks[1].ops] == [("send", 1), ("recv", 0)]
    assert execute(sched).valid


@pytest.mark.parametrize("coll, root", [("broadcast", 0), ("reduce", 2)])
def test_rooted_collectives_find_their_root(tmp_path, coll, root):
    if coll == "broadcast":  # 0 -> 1 -> 2
        gpus = [_gpu(0, 1, 0, [_tb(0, 1, -1, 0, [_st("s", "i 0")])]),
                _gpu(1, 1, 0, [_tb(0, 2, 0, 0, [_st("rcs", dst="i 0")])]),
                _gpu(2, 1, 0, [_tb(0, -1, 1, 0, [_st("r", dst="i 0")])])]
    else:  # 0 -> 1 -> 2, adding
        gpus = [_gpu(0, 1, 0, [_tb(0, 1, -1, 0, [_st("s", "i 0")])]),
                _gpu(1, 1, 0, [_tb(0, 2, 0, 0, [_st("rrcs", "i 0", "i 0")])]),
                _gpu(2, 1, 0, [_tb(0, -1, 1, 0, [_st("rrc", "i 0", "i 0")])])]
    sched = msccl.load(_write(tmp_path, _algo(coll, 3, 1, gpus, inplace=1)))
    assert (sched.collective, sched.root) == ({"reduce": "reduce"}.get(coll, coll), root)
    result = execute(sched)
    assert result.valid, result.errors


def test_partly_overlapping_copy_is_refused(tmp_path):
    gpus = [_gpu(r, 3, 0, [_tb(0, -1, -1, 0, [_st("cpy", "i 0", "i 1", cnt=2)])]) for r in (0, 1)]
    with pytest.raises(FieldError) as exc:
        msccl.load(_write(tmp_path, _algo("allreduce", 2, 3, gpus, inplace=1)))
    assert exc.value.field == "gpu[0].tb[0].step[0]@srcoff"


def test_message_kinds_are_counted_per_connection():
    sched = _schedule("ar_tree_12_LL.xml")
    sends = sum(op.kind == SEND for r in sched.ranks for op in r.ops)
    recvs = sum(op.kind in (RECV, RECV_REDUCE) for r in sched.ranks for op in r.ops)
    assert sends == recvs == len(execute(sched).matches)
