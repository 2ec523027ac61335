"""Chakra trace import: real traces (ASTRA-sim, MLCommons), hand-written ones, the varint stream, and bad input.

The real files are under ``tests/data/chakra`` (``SOURCES.md`` there names
their repositories, commits and licences).
"""

from __future__ import annotations

import glob
import os
import tarfile
from collections import Counter

import pytest
from chakra.schema.protobuf import et_def_pb2 as pb

from emulator.base.errors import FieldError
from emulator.model.schedule import format as fmt
from emulator.model.schedule.executor import execute
from emulator.model.workloads import chakra
from emulator.model.workloads.training import workload_scale

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
REAL = os.path.join(DATA, "chakra")
SAMPLE = [os.path.join(DATA, f"chakra_ar.{r}.et") for r in range(4)]
MSCCL_RING = sorted(glob.glob(os.path.join(REAL, "custom_ring_allreduce_8npus_1MB", "*.et")))
MIB = 1 << 20


def _micro(name: str, npus: int) -> list[str]:
    return sorted(glob.glob(os.path.join(REAL, "microbenchmarks", name, f"{npus}npus_1MB", "*.et")))


def _write(tmp_path, per_rank: list[list[object]], prefix: str = "t") -> list[str]:
    paths = []
    for rank, nodes in enumerate(per_rank):
        paths.append(str(tmp_path / f"{prefix}.{rank}.et"))
        chakra.write_trace(paths[-1], nodes)
    return paths


def _send(i, peer, size, tag=0, deps=(), ctrl=()):
    return chakra.comm_node(i, f"send{i}", True, peer, size, tag, deps, ctrl)


def _recv(i, peer, size, tag=0, deps=(), ctrl=()):
    return chakra.comm_node(i, f"recv{i}", False, peer, size, tag, deps, ctrl)


def _ops(sched, rank, kind):
    return [op for op in sched.ranks[rank].ops if op.kind == kind]


# ---------------------------------------------------------------------------
# The stream
# ---------------------------------------------------------------------------

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


def test_sample_trace_in_dependency_order():
    trace = chakra.read_trace(SAMPLE[2], 2, 4)
    assert [(n.node_id, n.kind, n.size, n.seconds) for n in trace.nodes] == [
        (1, chakra.COMP, 0, 1e-4), (2, chakra.COLL, 65536, 0.0), (3, chakra.COMP, 0, 2e-4), (4, chakra.COLL, MIB, 0.0)]


# ---------------------------------------------------------------------------
# Real traces
# ---------------------------------------------------------------------------

COMM_SIZE_IS_INPUT = {"all_reduce": ("allreduce", 1), "reduce_scatter": ("reduce_scatter", 1),
                      "all_gather": ("allgather", None), "all_to_all": ("alltoall", 1)}


@pytest.mark.parametrize("npus", [4, 8])
@pytest.mark.parametrize("name", sorted(COMM_SIZE_IS_INPUT))
def test_astra_sim_microbenchmarks(name, npus):
    """One COMM_COLL_NODE of 1 MB per rank; comm_size is each rank's input (allgather's data is p times it)."""
    files = _micro(name, npus)
    assert len(files) == npus
    sched = chakra.load(files)
    collective, factor = COMM_SIZE_IS_INPUT[name]
    assert sched.p == npus and sched.collective == collective and len(sched.segments) == 1
    assert sched.segments[0].chunks * sched.chunk_bytes == MIB * (factor or npus)
    assert sched.meta["collectives"] == [{"collective": collective, "comm_size": MIB, "algorithm": sched.meta[
        "collectives"][0]["algorithm"], "node": 0, "name": f"{name}_{npus}npus_1MB"}]
    assert sched.meta["version"] == "0.0.4" and sched.meta["nodes"] == {"COMM_COLL_NODE": npus}
    assert "padded" not in sched.meta
    assert execute(sched).valid


@pytest.mark.parametrize("name, algo, used", [
    ("all_reduce", "hd", "hd"), ("all_reduce", "dbtree", "dbtree"), ("all_reduce", "direct", "ring"),
    ("all_gather", "direct", "direct"), ("all_gather", "dbtree", "ring"), ("reduce_scatter", "hd", "hd"),
    ("all_to_all", "ring", "direct"), ("all_to_all", "hd", "direct")])
def test_microbenchmarks_with_other_algorithms_or_their_fallback(name, algo, used):
    sched = chakra.load(_micro(name, 8), algo=algo)
    assert sched.meta["collectives"][0]["algorithm"] == used
    assert execute(sched).valid


def _recorded_messages(paths):
    """Every send and receive of the MSCCL ring's files, read with the protobuf alone."""
    sends: Counter[tuple[int, int, int, int]] = Counter()
    recvs: Counter[tuple[int, int, int, int]] = Counter()
    comps: Counter[tuple[int, int]] = Counter()
    for rank, path in enumerate(paths):
        for raw in chakra.decode_stream(open(path, "rb").read(), path)[1:]:
            node = pb.Node.FromString(raw)
            attrs = {a.name: a for a in node.attr}
            if node.type == pb.COMM_SEND_NODE:
                sends[(rank, attrs["comm_dst"].int32_val, attrs["comm_size"].int64_val, attrs["comm_tag"].int32_val)] += 1
            elif node.type == pb.COMM_RECV_NODE:
                recvs[(rank, attrs["comm_src"].int32_val, attrs["comm_size"].int64_val, attrs["comm_tag"].int32_val)] += 1
            elif node.type == pb.COMP_NODE:
                comps[(rank, node.duration_micros)] += 1
    return sends, recvs, comps


def test_msccl_ring_point_to_point_trace_replays_as_recorded():
    """ASTRA-sim's custom ring allreduce (MSCCL XML converted to COMM_SEND/COMM_RECV/COMP nodes)."""
    assert len(MSCCL_RING) == 8
    sched = chakra.load(MSCCL_RING)
    sends, recvs, comps = _recorded_messages(MSCCL_RING)
    assert sum(sends.values()) == sum(recvs.values()) == 112 and sched.meta["messages"] == 112
    lane_of_tag = {0: 0}  # one tag per pair, no collectives: lane 0
    got_sends = Counter((r, op.peer, op.bytes, op.lane) for r in range(8) for op in _ops(sched, r, "send"))
    got_recvs = Counter((r, op.peer, op.bytes, op.lane) for r in range(8) for op in _ops(sched, r, "recv"))
    assert got_sends == Counter({(r, d, s, lane_of_tag[t]): n for (r, d, s, t), n in sends.items()})
    assert got_recvs == Counter({(r, src, s, lane_of_tag[t]): n for (r, src, s, t), n in recvs.items()})
    assert all(d == (r + 1) % 8 for r, d, _, _ in sends)
    assert Counter((r, round(op.seconds * 1e6)) for r in range(8) for op in _ops(sched, r, "compute")) == comps
    assert sched.collective == "p2p" and sched.dtype == "uint8" and sched.chunk_bytes == 131072
    assert sched.meta["lanes"] == {f"{r}->{(r + 1) % 8}": [0] for r in range(8)}
    assert sched.meta["version"] == "1.0.2-chakra.0.0.4"
    first_recv = _ops(sched, 0, "recv")[0]
    assert first_recv.deps == ()  # it depends on the rank's first send, which is posted, not awaited
    assert execute(sched).valid  # no deadlock, sizes match


def _resnet(tmp_path) -> str:
    """chakra's feeder-test trace (one rank of a PyTorch ResNet-50 DDP job), unpacked as ``resnet.0.et``."""
    with tarfile.open(os.path.join(REAL, "feeder_tests_trace.tar.gz")) as tar:
        member = tar.extractfile("tests/data/chakra.0.et")
        assert member is not None
        data = member.read()
    path = str(tmp_path / "resnet.0.et")
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def test_mlcommons_resnet_trace_read_as_recorded(tmp_path):
    """What the PyTorch converter (schema 1.0.1) left in it: CPU-side nodes, self- and dangling dependencies, and
    ctrl_deps that point both ways."""
    trace = chakra.read_trace(_resnet(tmp_path), 0, 8)
    assert trace.version == "1.0.1" and len(trace.nodes) == 3664 and trace.groups == ()
    assert (trace.self_deps, trace.dangling_deps, trace.cyclic_ctrl_deps) == (383, 1277, 599)
    cpu = [n for n in trace.nodes if n.cpu]
    assert Counter(n.type_name for n in cpu) == {"COMP_NODE": 2434, "COMM_COLL_NODE": 14}
    assert all(n.kind == chakra.DEP for n in cpu) and round(sum(n.seconds for n in cpu) * 1e6) == 52252
    gpu = Counter(n.collective for n in trace.nodes if n.kind == chakra.COLL)
    assert gpu == {"broadcast": 2, "allreduce": 5} and all(n.pg_name == "" for n in trace.nodes)
    assert sum(n.kind == chakra.COMP for n in trace.nodes) == 1209


@pytest.mark.slow
def test_mlcommons_resnet_trace_replicated_to_four_ranks_proves(tmp_path):
    """One rank of a data-parallel job replicated to 4: its 7 GPU collectives over all 4 ranks, its 1209 GPU
    kernels as compute, its host operators as dependencies only; the schedule proves. (Replication is the same
    for any number of ranks; 8 ranks took 60 s of `make test`'s 2 cores, 4 take about a third of it.)"""
    sched = chakra.load([_resnet(tmp_path)], ranks=4)
    assert sched.p == 4 and sched.meta["replicated"] == {"file": "resnet.0.et", "ranks": 4}
    assert sched.meta["dropped_dependencies"] == {"self": 383, "dangling": 1277, "cyclic_ctrl": 599}
    assert sched.meta["cpu_ops"] == {"nodes": 2448, "micros": 52252}
    assert [c["collective"] for c in sched.meta["collectives"]] == ["broadcast"] * 2 + ["allreduce"] * 5
    assert sum(c["comm_size"] for c in sched.meta["collectives"][2:]) == 102228128  # ResNet-50's gradients
    assert all(not seg.groups for seg in sched.segments) and len(sched.segments) == 7
    assert all(len(_ops(sched, r, "compute")) == 1209 for r in range(4))
    assert len(chakra.notes(sched.meta)) == 2
    assert execute(sched).valid


def test_mlcommons_resnet_trace_as_two_files_is_refused(tmp_path):
    """Without --ranks a one-rank trace is refused, in one line naming the option."""
    with pytest.raises(FieldError, match=r"trace files of 2 to 1024 ranks \(or one file and --ranks N"):
        chakra.load([_resnet(tmp_path)])


# ---------------------------------------------------------------------------
# The sample and index
# ---------------------------------------------------------------------------

def test_whole_sample_trace_with_compute():
    sched = chakra.load(SAMPLE)
    assert sched.collective == "allreduce" and [s.chunks * sched.chunk_bytes for s in sched.segments] == [65536, MIB]
    for r in range(4):
        first, second = _ops(sched, r, "compute")
        assert (first.seconds, second.seconds, first.deps) == (1e-4, 2e-4, ())
        assert second.deps and all(sched.ranks[r].ops[d].kind != "compute" for d in second.deps)
        entry = [op for op in sched.ranks[r].ops if op.kind != "compute" and op.chunk < 4 and not
                 any(sched.ranks[r].ops[d].kind != "compute" for d in op.deps)]
        assert entry and all(op.deps == (first.id,) for op in entry)
    assert sched.meta["nodes"] == {"COMM_COLL_NODE": 8, "COMP_NODE": 8} and sched.meta["trace"] == "chakra_ar"
    assert execute(sched).valid and fmt.from_dict(sched.to_dict()) == sched


@pytest.mark.parametrize("index, size", [(0, 65536), (1, MIB)])
def test_index_imports_one_collective(index, size):
    sched = chakra.load(list(reversed(SAMPLE)), index=index)
    assert sched.p == 4 and sched.size == size and sched.algorithm == "ring" and not sched.segments
    assert sched.meta["imported_from"] == "chakra" and sched.meta["collective_index"] == index
    assert execute(sched).valid


def test_import_with_another_generator_and_topology():
    sched = chakra.load(SAMPLE, algo="dbtree", topology="bigraph:upper=1,lower=1,hosts_per_switch=2")
    assert [c["algorithm"] for c in sched.meta["collectives"]] == ["dbtree", "dbtree"]
    assert sched.topology == "bigraph:upper=1,lower=1,hosts_per_switch=2" and execute(sched).valid


# ---------------------------------------------------------------------------
# Hand-written traces: dependencies, lanes, collectives, padding
# ---------------------------------------------------------------------------

def test_ctrl_and_data_deps_are_honoured_and_sends_are_posted(tmp_path):
    paths = _write(tmp_path, [
        [chakra.comp_node(1, "a", 10), chakra.comp_node(2, "b", 20, ctrl_deps=[1]), _send(3, 1, 64, deps=[2]),
         chakra.comp_node(4, "after send", 5, deps=[3])],
        [_recv(7, 0, 64), chakra.comp_node(8, "c", 30, ctrl_deps=[7])],
    ])
    sched = chakra.load(paths)
    a, b, after = _ops(sched, 0, "compute")
    (send,) = _ops(sched, 0, "send")
    assert (a.seconds, b.seconds, after.seconds) == (1e-5, 2e-5, 5e-6)
    assert b.deps == (a.id,) and send.deps == (b.id,) and after.deps == (b.id,)
    (recv,) = _ops(sched, 1, "recv")
    (c,) = _ops(sched, 1, "compute")
    assert c.deps == (recv.id,) and c.seconds == 3e-5 and send.bytes == recv.bytes == 64
    assert sched.meta["nodes"] == {"COMM_RECV_NODE": 1, "COMM_SEND_NODE": 1, "COMP_NODE": 4}
    assert execute(sched).valid


def test_dependency_only_nodes_pass_their_dependencies_on(tmp_path):
    meta = pb.Node(id=2, name="pg", type=pb.METADATA_NODE, data_deps=[1])
    invalid = pb.Node(id=3, name="", type=pb.INVALID_NODE, ctrl_deps=[2])
    paths = _write(tmp_path, [[chakra.comp_node(1, "a", 10), meta, invalid, _send(4, 1, 8, deps=[3])],
                              [_recv(1, 0, 8)]])
    sched = chakra.load(paths)
    assert _ops(sched, 0, "send")[0].deps == (_ops(sched, 0, "compute")[0].id,)
    assert sched.meta["nodes"]["METADATA_NODE"] == 1 and sched.meta["nodes"]["INVALID_NODE"] == 1


def _cpu(node):
    return _with(_without(node, "is_cpu_op"), is_cpu_op=True)


def test_cpu_side_nodes_are_dependencies_only(tmp_path):
    """A host operator (COMP_NODE) and a host-side collective call (COMM_COLL_NODE) with is_cpu_op true: no time,
    no collective; what waits for them waits for what they waited for."""
    ranks = [[chakra.comp_node(1, "kernel", 10), _cpu(chakra.comp_node(2, "aten::mm", 500, deps=[1])),
              _cpu(_coll(i=3, deps=[2])), _coll(i=4, deps=[3]), _with(chakra.comp_node(5, "gpu", 7, deps=[4]),
                                                                      is_cpu_op=False)] for _ in range(2)]
    sched = chakra.load(_write(tmp_path, ranks))
    for r in range(2):
        kernel, gpu = _ops(sched, r, "compute")
        assert (kernel.seconds, gpu.seconds) == (1e-5, 7e-6)
        entry = [op for op in sched.ranks[r].ops if op.is_comm and op.deps == (kernel.id,)]
        assert entry  # the collective waits for the kernel through the two host nodes
    assert len(sched.segments) == 1 and sched.meta["cpu_ops"] == {"nodes": 4, "micros": 1000}
    assert sched.meta["nodes"] == {"COMM_COLL_NODE": 4, "COMP_NODE": 6}
    assert chakra.notes(sched.meta) == ["note: 4 CPU-side nodes (is_cpu_op) kept as dependencies only, 1.0 ms of "
                                        "recorded host time not replayed"]
    assert execute(sched).valid


def test_self_dangling_and_cyclic_ctrl_dependencies_are_dropped_and_counted(tmp_path):
    """As the PyTorch converter leaves them: a node after itself, after ids not in the file, and ctrl_deps that
    point back (here node 3's ctrl_deps name its own launch's successor); a data cycle stays an error."""
    rank0 = [chakra.comp_node(1, "a", 10, ctrl_deps=[1, 77]), chakra.comp_node(2, "b", 20, deps=[1, 99]),
             chakra.comp_node(3, "c", 30, deps=[2], ctrl_deps=[4, 1]), _coll(i=4, deps=[3], ctrl_deps=[4])]
    sched = chakra.load(_write(tmp_path, [rank0, [_coll()]]))
    assert sched.meta["dropped_dependencies"] == {"self": 2, "dangling": 2, "cyclic_ctrl": 1}
    a, b, c = _ops(sched, 0, "compute")
    assert (b.deps, c.deps) == ((a.id,), (b.id,))
    assert chakra.notes(sched.meta) == ["warning: dropped 2 self-dependencies, 2 dependencies on node ids not in "
                                        "their file and 1 ctrl_deps closing a cycle (counted over the files read)"]
    assert execute(sched).valid
    trace = chakra.read_trace(_write(tmp_path, [rank0, [_coll()]], "u")[0], 0, 2)
    assert [n.node_id for n in trace.nodes] == [1, 2, 3, 4] and trace.nodes[2].ctrl_deps == (1,)
    assert "dropped_dependencies" not in chakra.load(SAMPLE).meta


def _tagged(collective: bool):
    extra = [chakra.coll_node(9, "ar", pb.ALL_REDUCE, 64)] if collective else []
    return [[_send(1, 1, 8, tag=7), _send(2, 1, 12, tag=3), _send(3, 1, 16, tag=7), *extra],
            [_recv(1, 0, 12, tag=3), _recv(2, 0, 8, tag=7), _recv(3, 0, 16, tag=7), *extra]]


@pytest.mark.parametrize("collective, lanes", [(False, {7: 0, 3: 1}), (True, {7: 1, 3: 2})])
def test_tags_become_lanes_in_order_of_first_appearance(tmp_path, collective, lanes):
    sched = chakra.load(_write(tmp_path, _tagged(collective)))
    tag_of_size = {8: 7, 12: 3, 16: 7}
    expected = {n: lanes[t] for n, t in tag_of_size.items()}
    assert {op.bytes: op.lane for op in _ops(sched, 0, "send") if op.bytes in tag_of_size} == expected
    assert {op.bytes: op.lane for op in _ops(sched, 1, "recv") if op.bytes in tag_of_size} == expected
    assert {op.lane for r in range(2) for op in sched.ranks[r].ops if op.is_comm and op.bytes not in tag_of_size} \
        <= {0}  # the allreduce's
    assert sched.meta["lanes"] == {"0->1": [7, 3]}
    assert sched.dtype == ("float32" if collective else "uint8") and sched.chunk_bytes == 4
    assert execute(sched).valid


def test_more_tags_than_lanes(tmp_path):
    n = fmt.MAX_LANES + 1
    paths = _write(tmp_path, [[_send(i, 1, 4, tag=i) for i in range(n)], [_recv(i, 0, 4, tag=i) for i in range(n)]])
    with pytest.raises(FieldError, match=f"at most {fmt.MAX_LANES} tags per pair"):
        chakra.load(paths)


ALL_TYPES = [(pb.BROADCAST, 4096), (pb.REDUCE, 2048), (pb.REDUCE_SCATTER_BLOCK, 4096), (pb.ALL_TO_ALL, 8192),
             (pb.ALL_GATHER, 1024), (pb.ALL_REDUCE, 65536), (pb.REDUCE_SCATTER, 1024)]


@pytest.mark.parametrize("algo", ["ring", "hd", "hdrm", "dbtree", "direct", "hier"])
def test_every_collective_type_in_one_trace(tmp_path, algo):
    p = 4
    nodes = [chakra.coll_node(k + 1, f"c{k}", t, s, deps=[k] if k else []) for k, (t, s) in enumerate(ALL_TYPES)]
    topo = {"hdrm": "bigraph:upper=2,lower=2,hosts_per_switch=1",
            "hier": "leafspine:leaves=2,spines=1,hosts_per_leaf=2"}.get(algo)  # hier's groups: two switches of two
    sched = chakra.load(_write(tmp_path, [nodes] * p), algo=algo, topology=topo)
    assert sched.collective == "mixed"
    assert [s.collective for s in sched.segments] == ["broadcast", "reduce", "reduce_scatter", "alltoall",
                                                      "allgather", "allreduce", "reduce_scatter"]
    data = [s.chunks * sched.chunk_bytes for s in sched.segments]
    assert data == [4096, 2048, 4096, 8192, 1024 * p, 65536, 1024]
    assert sched.segments[3].output_chunks == sched.segments[3].chunks
    assert execute(sched).valid


def test_trace_of_messages_collectives_and_compute(tmp_path):
    """Rank 0 computes, sends to rank 1, everyone allreduces, then ranks 1 and 2 exchange."""
    size = 3 * 32768
    ranks = [
        [chakra.comp_node(1, "fwd", 50), _send(2, 1, 4096, deps=[1]), chakra.coll_node(3, "ar", 0, size, deps=[1])],
        [_recv(1, 0, 4096), chakra.coll_node(2, "ar", 0, size, deps=[1]), _send(3, 2, 100, tag=5, deps=[2]),
         _recv(4, 2, 100, tag=5, deps=[2])],
        [chakra.coll_node(1, "ar", 0, size), _recv(2, 1, 100, tag=5, deps=[1]), _send(3, 1, 100, tag=5, deps=[1])],
    ]
    sched = chakra.load(_write(tmp_path, ranks))
    assert sched.collective == "mixed" and [s.collective for s in sched.segments] == ["p2p", "allreduce", "p2p", "p2p"]
    assert sched.chunk_bytes == 4 and "padded" not in sched.meta  # gcd of 32768, 4096 and 100
    assert {op.lane for r in range(3) for op in sched.ranks[r].ops if op.is_comm and op.bytes in (100, 4096)} == {1}
    assert sched.meta["lanes"] == {"0->1": [0], "1->2": [5], "2->1": [5]}
    assert execute(sched).valid


def test_barrier_is_a_dissemination_of_one_chunk_messages(tmp_path):
    p = 3
    ranks = [[chakra.comp_node(1, "a", 10), chakra.coll_node(2, "barrier", pb.BARRIER, 0, deps=[1]),
              chakra.comp_node(3, "b", 10, deps=[2])] for _ in range(p)]
    sched = chakra.load(_write(tmp_path, ranks))
    assert sched.collective == "p2p" and sched.chunk_bytes == 1 and len(sched.segments) == p * 2
    assert sorted((r, op.peer) for r in range(p) for op in _ops(sched, r, "send")) == [
        (0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    for r in range(p):
        last_recv = _ops(sched, r, "recv")[-1]
        assert _ops(sched, r, "compute")[1].deps == (last_recv.id,)
    assert sched.meta["collectives"][0]["algorithm"] == "dissemination"
    assert execute(sched).valid


def test_sizes_that_do_not_split_are_padded_and_recorded(tmp_path):
    sched = chakra.load(_write(tmp_path, [[chakra.coll_node(1, "ar", pb.ALL_REDUCE, 1000)]] * 3))
    name = "collective 0 (allreduce, node 1 ar)"
    assert sched.meta["padded"] == {name: [1000, 1008]} and sched.meta["quantum"] == 4  # 3 chunks of 336 bytes
    assert execute(sched).valid


def test_too_many_chunks_round_up_to_a_quantum(tmp_path):
    sizes = [(1 << 20) + 1, (1 << 20) + 3]  # gcd 1: two million one-byte chunks
    paths = _write(tmp_path, [[_send(i, 1, s) for i, s in enumerate(sizes)],
                              [_recv(i, 0, s) for i, s in enumerate(sizes)]])
    sched = chakra.load(paths)
    q = sched.meta["quantum"]
    assert sched.chunks <= fmt.MAX_CHUNKS and q > 1 and sched.chunk_bytes % q == 0
    assert [r for r, _ in sched.meta["padded"].values()] == sizes
    assert all(0 < replayed - rec < q for rec, replayed in sched.meta["padded"].values())
    assert execute(sched).valid


# ---------------------------------------------------------------------------
# Bad input: one FieldError each
# ---------------------------------------------------------------------------

def _coll(t=pb.ALL_REDUCE, s=64, i=1, **kw):
    return chakra.coll_node(i, "c", t, s, **kw)


def _without(node, key):
    keep = [a for a in node.attr if a.name != key]
    del node.attr[:]
    node.attr.extend(keep)
    return node


def _with(node, **attrs):
    for key, value in attrs.items():
        attr = pb.AttributeProto(name=key)
        setattr(attr, "bool_val" if isinstance(value, bool) else "int64_val", value)
        node.attr.append(attr)
    return node


BAD = {
    "unknown node type": ([[pb.Node(id=1, type=99)], [_coll()]], r"node 1 \(unnamed\)\.type': expected one of"),
    "remote memory": ([[pb.Node(id=1, type=pb.MEM_LOAD_NODE)], [_coll()]], "MEM_LOAD_NODE"),
    "missing comm_size": ([[_without(_send(1, 1, 8), "comm_size")], [_recv(1, 0, 8)]],
                          r"node 1 \(send1\)\.attr\.comm_size': expected an integer >= 0, got nothing"),
    "missing peer": ([[_without(_send(1, 1, 8), "comm_dst")], [_recv(1, 0, 8)]], "attr.comm_dst"),
    "peer out of range": ([[_send(1, 5, 8)], [_recv(1, 0, 8)]], r"comm_dst': expected an integer in 0\.\.1"),
    "peer is itself": ([[_send(1, 0, 8)], [_recv(1, 0, 8)]], "a rank other than the file's own"),
    "sender is not the rank": ([[_with(_send(1, 1, 8), comm_src=1)], [_recv(1, 0, 8)]], "attr.comm_src"),
    "unmatched send": ([[_send(1, 1, 8), _send(2, 1, 8)], [_recv(1, 0, 8)]],
                       r"t\.0\.et'.*node 2 \(send2\)': expected a COMM_RECV_NODE on rank 1 from rank 0 with tag 0"),
    "unmatched receive": ([[_send(1, 1, 8)], [_recv(1, 0, 8), _recv(2, 0, 8, tag=4)]],
                          r"t\.1\.et'.*node 2 \(recv2\)': expected a COMM_SEND_NODE on rank 0 to rank 1 with tag 4"),
    "sizes disagree": ([[_send(1, 1, 8)], [_recv(5, 0, 16)]],
                       r"node 1 \(send1\)\.attr\.comm_size': expected 16 bytes, as its receive \(rank 1 node 5"),
    "cycle": ([[_coll(deps=[3]), chakra.comp_node(3, "x", 1, deps=[1])], [_coll()]],
              r"dependencies without a cycle, got 'node 1 -> node 3 -> node 1"),
    "duplicate id": ([[_coll(), chakra.comp_node(1, "x", 1)], [_coll()]], "a node id no other node of the file has"),
    "collective types disagree": ([[_coll()], [_coll(pb.ALL_GATHER)]], "attr.comm_type': expected 'allreduce'"),
    "collective sizes disagree": ([[_coll()], [_coll(s=128)]], r"attr\.comm_size': expected 64, as rank 0's"),
    "collective counts disagree": ([[_coll(), _coll(i=2)], [_coll()]], "COMM_COLL_NODE nodes': expected 2"),
    "gather": ([[_coll(pb.GATHER)], [_coll(pb.GATHER)]], "GATHER and SCATTER have no collective"),
    "unknown collective": ([[_coll(99)], [_coll(99)]], "attr.comm_type': expected one of ALL_REDUCE"),
    "missing comm_type": ([[_without(_coll(), "comm_type")], [_coll()]], "attr.comm_type': expected an integer"),
    "collective only on the CPU": ([[_with(_without(_coll(), "is_cpu_op"), is_cpu_op=True)], [_coll()]],
                                   "COMM_COLL_NODE nodes': expected 0, as many as rank 0 has, got 1"),
    "compute too long": ([[chakra.comp_node(1, "x", 10**10), _coll(i=2)], [_coll()]], "duration_micros"),
    "no communication": ([[chakra.comp_node(1, "x", 1)], [chakra.comp_node(1, "x", 1)]], "field 'trace'"),
    "receive after the collective": (
        [[_coll(), _send(2, 1, 8, deps=[1])], [_recv(5, 0, 8), _coll(i=6, deps=[5])]],
        r"t\.1\.et'.*node 6 \(c\)'.*got 'rank 1 node 6 \(collective 0\) waits for rank 1 node 5 \(receive from rank 0, "
        r"tag 0\) waits for its send rank 0 node 2 \(send to rank 1, tag 0\) waits for rank 0 node 1 \(collective 0\), "
        "which waits for every rank to reach it'"),
    "both receive first": (
        [[_recv(1, 1, 8), _send(2, 1, 8, deps=[1])], [_recv(1, 0, 8), _send(2, 0, 8, deps=[1])]],
        r"got 'rank 0 node 1 \(receive from rank 1, tag 0\) waits for its send rank 1 node 2 \(send to rank 0, tag 0\) "
        r"waits for rank 1 node 1 \(receive from rank 0, tag 0\) waits for its send rank 0 node 2 \(send to rank 1, "
        r"tag 0\) waits for rank 0 node 1 \(receive from rank 1, tag 0\) again \(a cycle\)'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_traces(tmp_path, case):
    per_rank, needle = BAD[case]
    with pytest.raises(FieldError, match=needle) as err:
        chakra.load(_write(tmp_path, per_rank))
    assert "\n" not in str(err.value)


def test_bad_trace_sets(tmp_path):
    with pytest.raises(FieldError, match="<prefix>.<rank>.et"):
        chakra.load([str(tmp_path / "trace.et")])
    with pytest.raises(FieldError, match="ranks 0..2"):
        chakra.load(SAMPLE[:2] + SAMPLE[3:])
    with pytest.raises(FieldError, match="index"):
        chakra.load(SAMPLE, index=2)
    with pytest.raises(FieldError, match="4 hosts"):
        chakra.load(SAMPLE, topology="star:hosts=8")
    with pytest.raises(FieldError, match="field 'algo'"):
        chakra.load(SAMPLE, algo="bogus")
    barrier = _write(tmp_path, [[_coll(pb.BARRIER)]] * 2, "b")
    with pytest.raises(FieldError, match="other than a BARRIER"):
        chakra.load(barrier, index=0)


def test_truncated_and_garbage_files(tmp_path):
    paths = _write(tmp_path, [[_coll()], [_coll()]])
    data = open(paths[1], "rb").read()
    with open(paths[1], "wb") as fh:
        fh.write(data[:-3])
    with pytest.raises(FieldError, match=r"t\.1\.et'.*field 'message 1'.*claims"):
        chakra.load(paths)
    (tmp_path / "g.0.et").write_bytes(b"\x05ab")
    (tmp_path / "g.1.et").write_bytes(b"")
    with pytest.raises(FieldError, match="claims 5 bytes"):
        chakra.load([str(tmp_path / "g.0.et"), str(tmp_path / "g.1.et")])
    (tmp_path / "h.0.et").write_bytes(b"\x00\x02\xff\xff")
    (tmp_path / "h.1.et").write_bytes(b"\x00")
    with pytest.raises(FieldError, match="message 1': expected a Chakra Node"):
        chakra.load([str(tmp_path / "h.0.et"), str(tmp_path / "h.1.et")])


def test_a_scaled_import_divides_sizes_and_times_and_replays_read_its_scale(tmp_path):
    sched = chakra.load([_resnet(tmp_path)], ranks=8, scale=100)
    assert sched.meta["scale"] == 100 and workload_scale(sched) == 100
    sizes = [c["comm_size"] for c in sched.meta["collectives"]]
    assert sizes[2:] and all(n % 4 == 0 for n in sizes)
    assert sum(sizes[2:]) == pytest.approx(102228128 / 100, rel=1e-3)
    compute = sum(op.seconds for op in sched.ranks[0].ops if op.kind == "compute")
    assert compute == pytest.approx(0.2928 / 100, rel=0.01)
    with pytest.raises(FieldError, match="field 'scale'"):
        chakra.load([_resnet(tmp_path)], ranks=8, scale=0.5)
