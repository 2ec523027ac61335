"""Chakra traces as PyTorch records them: process groups (pg_name and the pg_config metadata), one-rank traces
replicated with ``--ranks``, and the CLI's lines about what an import dropped.

:func:`write_pytorch_trace` writes real Chakra ET files, one per rank, with the official protobuf package
(``chakra.schema.protobuf.et_def_pb2``), shaped as mlcommons/chakra's PyTorch converter
(``src/converter/pytorch_converter.py``, Apache-2.0) writes a PyTorch execution trace linked with Kineto:
``GlobalMetadata`` attributes ``schema, pid, time, start_ts, finish_ts``; the thread's root node; a
``METADATA_NODE`` ``## process_group:init ##`` whose ``inputs.values`` is Python's ``str`` of the one-input list
holding ``json.dumps`` of PyTorch's ``pg_config_info`` (pytorch/pytorch ``torch/distributed/distributed_c10d.py``:
``pg_name, pg_desc, backend_config, ranks, group_size, group_count``, ``ranks`` empty for a group of every rank;
each rank lists the groups it is in); host operators as ``COMP_NODE`` with ``is_cpu_op`` true, chained by
``data_deps`` and with the root as ``ctrl_deps``; every GPU kernel after its launching host operator, and (as the
converter's sync dependencies order a stream) after the stream's kernel before it; collectives as
``c10d::<op>`` -> ``record_param_comms`` -> ``ncclDevKernel_...`` (``COMM_COLL_NODE``, ``comm_type``,
``comm_size`` the input's bytes, ``pg_name``). The converter writes no peer on ``COMM_SEND_NODE``/``COMM_RECV_NODE``;
these carry ``comm_dst``/``comm_src``/``comm_tag`` as ASTRA-sim's feeder reads them.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass, field

import pytest
from chakra.schema.protobuf import et_def_pb2 as pb
from google.protobuf.internal.encoder import _VarintBytes

from emulator.base.errors import FieldError
from emulator.cli.main import main
from emulator.model.schedule.executor import execute
from emulator.model.workloads import chakra
from emulator.model.workloads.chakra_groups import ProcessGroup, parse_pg_config

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
WORLD = 8
TP = [(0, 1), (2, 3), (4, 5), (6, 7)]
DP = [(0, 2, 4, 6), (1, 3, 5, 7)]
#: PyTorch names groups by creation order: the default group "0", then the tensor-parallel pairs, then data-parallel
PGS = ([ProcessGroup("0", (), WORLD, "default_pg")]
       + [ProcessGroup(str(1 + i), g, 2, "TENSOR_MODEL_PARALLEL_GROUP") for i, g in enumerate(TP)]
       + [ProcessGroup(str(5 + i), g, 4, "DATA_PARALLEL_GROUP") for i, g in enumerate(DP)])
KERNELS = {pb.ALL_REDUCE: "AllReduce_Sum_f32", pb.REDUCE_SCATTER: "ReduceScatter_Sum_f32",
           pb.ALL_GATHER: "AllGather", pb.BROADCAST: "Broadcast", pb.ALL_TO_ALL: "SendRecv"}
C10D = {pb.ALL_REDUCE: "allreduce_", pb.REDUCE_SCATTER: "_reduce_scatter_base_", pb.ALL_GATHER: "_allgather_base_",
        pb.BROADCAST: "broadcast_", pb.ALL_TO_ALL: "alltoall_base_"}


# ---------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------

def _attr(name: str, value: object) -> pb.AttributeProto:
    if isinstance(value, bool):
        return pb.AttributeProto(name=name, bool_val=value)
    if isinstance(value, int):
        return pb.AttributeProto(name=name, int64_val=value)
    return pb.AttributeProto(name=name, string_val=str(value))


@dataclass
class PyTorchRank:
    """One rank's Chakra nodes as the PyTorch converter writes them (module docstring)."""

    rank: int
    groups: list[ProcessGroup]
    nodes: list[pb.Node] = field(default_factory=list)
    cpu: int = 0  # the last host operator
    gpu: int = 0  # the stream's last kernel

    def __post_init__(self) -> None:
        self.root = self._add("[pytorch|profiler|execution_trace|thread]", pb.COMP_NODE, True, 0, [], [])
        config = [{"pg_name": g.name, "pg_desc": g.desc, "backend_config": "cuda:nccl", "ranks": list(g.ranks),
                   "group_size": g.size, "group_count": len(PGS)} for g in self.groups]
        meta = self._add("## process_group:init ##", pb.METADATA_NODE, True, 3, [self.root], [self.root])
        node = self.nodes[-1]
        node.inputs.values, node.inputs.shapes, node.inputs.types = str([json.dumps(config)]), "[[]]", "['String']"
        self.cpu = meta

    def _add(self, name: str, kind: int, cpu: bool, micros: int, ctrl: list[int], data: list[int],
             **attrs: object) -> int:
        node = pb.Node(id=len(self.nodes) + 1, name=name, type=kind, ctrl_deps=ctrl, data_deps=data,
                       duration_micros=micros)
        common = {"rf_id": len(self.nodes), "fw_parent": 0, "seq_id": -1, "scope": 0, "tid": 1 if cpu else 7,
                  "fw_tid": 0, "op_schema": "", "is_cpu_op": cpu}
        node.attr.extend(_attr(k, v) for k, v in {**common, **({} if cpu else {"stream": 7}), **attrs}.items())
        self.nodes.append(node)
        return node.id

    def host(self, name: str, micros: int = 5, parent: int | None = None) -> int:
        """A host operator, after the one before (a child of ``parent``, else of the thread's root)."""
        self.cpu = self._add(name, pb.COMP_NODE, True, micros, [parent or self.root], [self.cpu])
        return self.cpu

    def kernel(self, name: str, micros: int) -> int:
        launch = self.host(f"aten::{name}")
        self.gpu = self._add(f"void {name}_kernel<float>()", pb.COMP_NODE, False, micros, [launch],
                             [launch, *([self.gpu] if self.gpu else [])])
        return self.gpu

    def _launch(self, c10d: str) -> int:
        call = self.host(f"c10d::{c10d}")
        return self.host("record_param_comms", 1, parent=call)

    def collective(self, comm_type: int, size: int, pg: str) -> int:
        record = self._launch(C10D[comm_type])
        self.gpu = self._add(f"ncclDevKernel_{KERNELS[comm_type]}_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                             pb.COMM_COLL_NODE, False, 40, [record], [record, *([self.gpu] if self.gpu else [])],
                             comm_type=comm_type, comm_size=size, pg_name=pg)
        return self.gpu

    def p2p(self, send: bool, peer: int, size: int, pg: str = "0") -> int:
        record = self._launch("send" if send else "recv_")
        peer_attr = {"comm_dst": peer} if send else {"comm_src": peer}
        self.gpu = self._add("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
                             pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, False, 12, [record],
                             [record, *([self.gpu] if self.gpu else [])], comm_size=size, pg_name=pg, comm_tag=0,
                             **peer_attr)
        return self.gpu


def write_pytorch_trace(directory, prefix: str, ranks: list[PyTorchRank]) -> list[str]:
    """``<prefix>.<rank>.et`` per rank: the converter's ``GlobalMetadata``, then the rank's nodes, each preceded by
    its length as a varint."""
    paths = []
    for r in ranks:
        meta = pb.GlobalMetadata(attr=[_attr("schema", "1.1.1-chakra.0.0.4"), pb.AttributeProto(name="pid",
                                 uint64_val=4242 + r.rank), _attr("time", "2026-01-01 00:00:00"),
                                 pb.AttributeProto(name="start_ts", uint64_val=1),
                                 pb.AttributeProto(name="finish_ts", uint64_val=999)])
        paths.append(os.path.join(str(directory), f"{prefix}.{r.rank}.et"))
        with open(paths[-1], "wb") as fh:
            for msg in [meta, *r.nodes]:
                raw = msg.SerializeToString()
                fh.write(_VarintBytes(len(raw)) + raw)
    return paths


def _member_groups(rank: int) -> list[ProcessGroup]:
    return [g for g in PGS if not g.ranks or rank in g.ranks]


def _pg(rank: int, groups: list[tuple[int, ...]]) -> str:
    return next(g.name for g in PGS if g.ranks in groups and rank in g.ranks)


def hybrid_step(rank: int) -> PyTorchRank:
    """One training step of an 8-rank job, tensor-parallel pairs inside data-parallel groups of 4: two TP allreduces,
    a message from rank 0 to rank 4, a DP reduce-scatter and allreduce, and a small allreduce of every rank."""
    r = PyTorchRank(rank, _member_groups(rank))
    r.kernel("fwd_mm", 100)
    r.collective(pb.ALL_REDUCE, 4096, _pg(rank, TP))
    r.kernel("fwd_gelu", 50)
    if rank in (0, 4):
        r.p2p(rank == 0, 4 - rank, 1024)
    r.collective(pb.ALL_REDUCE, 8192, _pg(rank, TP))
    r.kernel("bwd_mm", 200)
    r.collective(pb.REDUCE_SCATTER, 65536, _pg(rank, DP))
    r.collective(pb.ALL_REDUCE, 16384, _pg(rank, DP))
    r.collective(pb.ALL_REDUCE, 256, "0")
    return r


# ---------------------------------------------------------------------------
# Process groups
# ---------------------------------------------------------------------------

def test_generated_trace_reads_like_the_converters():
    """The metadata node parses back to the groups written, as the importer and ASTRA-sim read it."""
    node = hybrid_step(3).nodes[1]
    assert node.type == pb.METADATA_NODE and node.inputs.values.startswith("['[{\"pg_name\": \"0\"")
    assert [g.name for g in parse_pg_config(node.inputs.values, "t", "n")] == ["0", "2", "6"]
    assert json.loads(node.inputs.values[2:-2])[1]["ranks"] == [2, 3]  # ASTRA-sim strips "['" and "']"


def test_hybrid_parallel_trace_imports_with_its_groups_intact(tmp_path):
    paths = write_pytorch_trace(tmp_path, "hybrid", [hybrid_step(r) for r in range(WORLD)])
    sched = chakra.load(paths)
    assert sched.meta["process_groups"] == {"0": list(range(WORLD)), **{g.name: list(g.ranks) for g in PGS[1:]}}
    colls = [(s.collective, s.groups) for s in sched.segments if s.collective != "p2p"]
    assert colls == [("allreduce", tuple(TP)), ("allreduce", tuple(TP)), ("reduce_scatter", tuple(DP)),
                     ("allreduce", tuple(DP)), ("allreduce", ())]
    assert {g for s in sched.segments for g in s.groups} == set(TP) | set(DP)
    assert [c.get("process_groups") for c in sched.meta["collectives"]] == [
        ["1", "2", "3", "4"], ["1", "2", "3", "4"], ["5", "6"], ["5", "6"], None]
    sizes = {s.name.split(" (")[0]: s.chunks * sched.chunk_bytes for s in sched.segments}
    assert [sizes[f"collective {k}"] for k in range(5)] == [4096, 8192, 65536, 16384, 256]
    assert sched.meta["messages"] == 1 and sched.meta["lanes"] == {"0->4": [0]}
    assert [len(s.members) for s in sched.shapes if s.collective != "p2p"] == [2] * 8 + [4] * 4 + [8]
    per_rank_cpu = 1 + 3 + 5 * 2  # the root, a launch per kernel, c10d + record_param_comms per collective
    assert sched.meta["cpu_ops"]["nodes"] == WORLD * per_rank_cpu + 2 * 2
    assert "dropped_dependencies" not in sched.meta
    assert execute(sched).valid


def test_real_converter_puts_groups_where_they_are_read(tmp_path):
    """mlcommons/chakra's own PyTorch converter, on a linked PyTorch trace of each of 4 ranks: pairs allreduce."""
    converter = pytest.importorskip("chakra.src.converter.pytorch_converter")
    attrs = [{"name": n, "type": "uint64", "value": 0} for n in ("rf_id", "fw_parent", "scope", "fw_tid")]
    attrs += [{"name": "seq_id", "type": "int64", "value": -1}, {"name": "tid", "type": "uint64", "value": 1},
              {"name": "op_schema", "type": "string", "value": ""}]
    empty = {"values": [], "shapes": [], "types": []}
    paths = []
    for rank in range(4):
        pair = [0, 1] if rank < 2 else [2, 3]
        config = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": [],
                   "group_size": 4, "group_count": 3},
                  {"pg_name": str(1 + rank // 2), "pg_desc": "tp", "backend_config": "cuda:nccl", "ranks": pair,
                   "group_size": 2, "group_count": 3}]

        def op(i, name, parent, dur, **extra):
            return {"id": i, "name": name, "ctrl_deps": parent, "inputs": extra.pop("inputs", empty),
                    "outputs": empty, "attrs": attrs, "exclusive_dur": dur, **extra}
        tensor = {"values": [[[10, 11, 0, 256, 4, "cuda:0"]]], "shapes": [[[256]]],
                  "types": ["GenericList[Tensor(float)]"]}
        nodes = [op(1, "[pytorch|profiler|execution_trace|thread]", 0, 0),
                 op(2, "## process_group:init ##", 1, 3, inputs={"values": [json.dumps(config)], "shapes": [[]],
                                                                 "types": ["String"]}),
                 op(3, "aten::mul", 1, 10), op(4, "c10d::allreduce_", 1, 5), op(5, "record_param_comms", 4, 1),
                 op(6, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 5, 20,
                    cat="kernel", pg_name=str(1 + rank // 2), inputs=tensor)]
        src = tmp_path / f"et.{rank}.json"
        src.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "now", "start_ts": 0,
                                   "finish_ts": 100, "nodes": nodes}))
        paths.append(str(tmp_path / f"conv.{rank}.et"))
        converter.PyTorchConverter().convert(str(src), paths[-1], False)
    sched = chakra.load(paths)
    assert [s.groups for s in sched.segments] == [((0, 1), (2, 3))]
    assert sched.meta["collectives"][0]["comm_size"] == 1024 and sched.meta["process_groups"]["2"] == [2, 3]
    assert execute(sched).valid


def test_groups_that_differ_only_in_size_keep_their_own_bytes(tmp_path):
    """The tensor-parallel pairs allreduce at the same point of the step, pair (2, 3) 64 KiB, the others 4 KiB:
    alike but for the size, so two collectives, and every op of a pair carries half its pair's bytes (a ring of
    two sends each half once in each phase)."""
    size = {rank: 65536 if rank in (2, 3) else 4096 for rank in range(WORLD)}
    ranks = []
    for rank in range(WORLD):
        r = PyTorchRank(rank, _member_groups(rank))
        r.collective(pb.ALL_REDUCE, size[rank], _pg(rank, TP))
        ranks.append(r)
    sched = chakra.load(write_pytorch_trace(tmp_path, "sizes", ranks))
    assert [(c["comm_size"], c["groups"]) for c in sched.meta["collectives"]] == [
        (4096, [[0, 1], [4, 5], [6, 7]]), (65536, [[2, 3]])]
    for program in sched.ranks:
        moves = [op for op in program.ops if op.kind in ("send", "recv", "recv_reduce")]
        assert len(moves) == 4 and {op.bytes for op in moves} == {size[program.rank] // 2}, program.rank
        segment = next(s for s in sched.segments if any(program.rank in g for g in s.groups))
        assert segment.chunks * sched.meta["chunk_bytes"] == size[program.rank]
        assert all(segment.chunk <= op.chunk < segment.chunk + segment.chunks for op in moves)
    assert execute(sched).valid


def test_a_group_late_to_its_collective_is_split_off(tmp_path):
    """Rank 2 waits for a message rank 0 sends after its pair's allreduce: the other pairs' allreduce does not wait
    for rank 2 (a segment of three groups, then one of the late pair)."""
    ranks = []
    for rank in range(WORLD):
        r = PyTorchRank(rank, _member_groups(rank))
        if rank == 2:
            r.p2p(False, 0, 64)
        r.collective(pb.ALL_REDUCE, 4096, _pg(rank, TP))
        if rank == 0:
            r.p2p(True, 2, 64)
        ranks.append(r)
    sched = chakra.load(write_pytorch_trace(tmp_path, "late", ranks))
    assert [(s.collective, s.groups) for s in sched.segments] == [
        ("allreduce", ((0, 1), (4, 5), (6, 7))), ("p2p", ()), ("allreduce", ((2, 3),))]
    assert sched.segments[2].name.endswith("groups [2, 3]")
    assert execute(sched).valid


def test_one_rank_groups_only_pass_dependencies_on(tmp_path):
    groups = [ProcessGroup("0", (), 2), ProcessGroup("1", (0,), 1), ProcessGroup("2", (1,), 1)]
    ranks = [[chakra.pg_init_node(1, [groups[0], groups[1 + r]]), chakra.comp_node(2, "a", 5),
              chakra.coll_node(3, "solo", pb.ALL_REDUCE, 64, pg_name=str(1 + r), deps=[2]),
              chakra.coll_node(4, "all", pb.ALL_REDUCE, 64, pg_name="0", deps=[3])] for r in range(2)]
    sched = chakra.load(_write(tmp_path, ranks))
    assert len(sched.segments) == 1 and sched.meta["one_rank_collectives"] == 2
    assert execute(sched).valid


def _write(tmp_path, per_rank, prefix="t"):
    paths = []
    for rank, nodes in enumerate(per_rank):
        paths.append(str(tmp_path / f"{prefix}.{rank}.et"))
        chakra.write_trace(paths[-1], nodes)
    return paths


def _ar(i, pg, size=64, deps=()):
    return chakra.coll_node(i, f"ar{i}", pb.ALL_REDUCE, size, pg_name=pg, deps=deps)


PAIRS = [ProcessGroup("0", (), 4), ProcessGroup("1", (0, 1), 2), ProcessGroup("2", (2, 3), 2)]


def _pairs(per_rank_extra=None, meta=True):
    out = []
    for r in range(4):
        nodes = [chakra.pg_init_node(1, [PAIRS[0], PAIRS[1 + r // 2]])] if meta else []
        nodes.append(_ar(2, str(1 + r // 2)))
        out.append(nodes + (per_rank_extra(r) if per_rank_extra else []))
    return out


BAD_GROUPS = {
    "no metadata": (_pairs(meta=False), r"node 2 \(ar2\)\.attr\.pg_name': expected the ranks of process group '1' in "
                    r"a '## process_group:init ##' METADATA_NODE \(the trace's lists: none\); the trace has no such "
                    r"node, so only pg_name '' or '0' \(every rank\) can be replayed, got '1'"),
    "pg not listed": (_pairs(lambda r: [_ar(3, "7")]), r"expected the ranks of process group '7' .*\(the trace's "
                      r"lists: 0, 1, 2\), got '7'"),
    "rank not in its group": (_pairs(lambda r: [_ar(3, "2")] if r < 2 else []),
                              r"t\.0\.et'.*node 3 \(ar3\)\.attr\.pg_name': expected a process group with rank 0"),
    "counts disagree in a group": (_pairs(lambda r: [_ar(3, "1")] if r == 0 else []),
                                   r"t\.1\.et'.*COMM_COLL_NODE nodes of process group '1'': expected 2, as many as "
                                   "rank 0 has, got 1"),
    "sizes disagree in a group": (_pairs(lambda r: [_ar(3, "2", 64 if r == 2 else 128)] if r >= 2 else []),
                                  r"t\.3\.et'.*attr\.comm_size': expected 64, as rank 2's collective 1 of process "
                                  r"group '2' \(node 3 \(ar3\)\) has, got 128$"),
}


@pytest.mark.parametrize("case", sorted(BAD_GROUPS))
def test_bad_groups(tmp_path, case):
    per_rank, needle = BAD_GROUPS[case]
    with pytest.raises(FieldError, match=needle) as err:
        chakra.load(_write(tmp_path, per_rank))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("groups, needle", [
    ([ProcessGroup("0", (), 8)], r"field 'FILE': expected the files of all 8 ranks .*got '4 files'"),
    ([ProcessGroup("1", (0, 5), 2)], r"process group '1'\.ranks': expected ranks of the trace \(0\.\.3"),
])
def test_metadata_that_does_not_fit_the_files(tmp_path, groups, needle):
    per_rank = [[chakra.pg_init_node(1, groups), _ar(2, "0")] for _ in range(4)]
    with pytest.raises(FieldError, match=needle):
        chakra.load(_write(tmp_path, per_rank))


def test_ranks_that_disagree_on_a_group(tmp_path):
    per_rank = [[chakra.pg_init_node(1, [ProcessGroup("1", (0, 1) if r else (1, 0), 2)]), _ar(2, "1")]
                for r in range(2)]
    with pytest.raises(FieldError, match=r"t\.1\.et'.*process group '1'\.ranks': expected \[1, 0\], as .*t\.0\.et"):
        chakra.load(_write(tmp_path, per_rank))


WORLD_PG = '{"pg_name": "0", "ranks": []}'


@pytest.mark.parametrize("text, groups", [
    ("['[{\"pg_name\": \"0\", \"ranks\": [], \"group_size\": 2}]']", [ProcessGroup("0", (), 2)]),  # the converter's
    ('[{"pg_name": "3", "ranks": [1, 0], "pg_desc": 7}]', [ProcessGroup("3", (1, 0), 0, "7")]),  # the JSON alone
    ('[[{"pg_name": "0", "ranks": [], "pg_desc": "default_pg"}, {"pg_name": 4, "ranks": [0, 1], "is_x": true}]]',
     [ProcessGroup("0", (), 0, "default_pg"), ProcessGroup("4", (0, 1))]),
    (f"[[[{WORLD_PG}]]]", [ProcessGroup("0", ())]),  # three lists deep: the deepest nesting read
    ("", []), ("[]", []), (" [] ", []),
])
def test_pg_config_forms(text, groups):
    assert list(parse_pg_config(text, "t", "n")) == groups


#: What a ``pg_config`` that is not one reads as.
NOT_PG_CONFIG = ("t: field 'n.inputs.values': expected PyTorch's pg_config: a JSON list of {pg_name, ranks, "
                 "group_size, ...} (in a list, as the Chakra converter stores it), got ")
RANKS = "expected a list of ranks (integers >= 0; empty: every rank), got"


@pytest.mark.parametrize("text, message", [
    ("not json", NOT_PG_CONFIG + "'not json'"),
    ('[{"ranks": []}]', "t: field 'n.inputs.values[0].pg_name': expected a process group name (a non-empty string), "
                        "got None"),
    ('[{"pg_name": "", "ranks": []}]', "t: field 'n.inputs.values[0].pg_name': expected a process group name (a "
                                       "non-empty string), got ''"),
    ('[{"pg_name": 2.5, "ranks": []}]', "t: field 'n.inputs.values[0].pg_name': expected a process group name (a "
                                        "non-empty string), got 2.5"),
    ('[{"pg_name": "1", "ranks": [0, 0]}]', "t: field 'n.inputs.values[0].ranks': expected distinct ranks, got [0, 0]"),
    ('[{"pg_name": "1", "ranks": "all"}]', f"t: field 'n.inputs.values[0].ranks': {RANKS} 'all'"),
    ('[{"pg_name": "1", "ranks": [0, -1]}]', f"t: field 'n.inputs.values[0].ranks': {RANKS} [0, -1]"),
    ('[{"pg_name": "1", "ranks": [true, 1]}]', f"t: field 'n.inputs.values[0].ranks': {RANKS} [True, 1]"),
    ('[{"pg_name": "1", "ranks": ["0"]}]', f"t: field 'n.inputs.values[0].ranks': {RANKS} ['0']"),
    ('[{"pg_name": "1", "ranks": [], "group_size": -1}]', "t: field 'n.inputs.values[0].group_size': expected an "
                                                          "integer >= 0, got -1"),
    ('[{"pg_name": "1", "ranks": [], "group_size": "8"}]', "t: field 'n.inputs.values[0].group_size': expected an "
                                                           "integer >= 0, got '8'"),
    ('[{"pg_name": "1", "ranks": [], "group_size": true}]', "t: field 'n.inputs.values[0].group_size': expected an "
                                                            "integer >= 0, got True"),
    ('[5]', NOT_PG_CONFIG + "'[5]'"),
    ('[{"pg_name": "1", "ranks": [], "group_size": 2}, [3]]', NOT_PG_CONFIG
     + "'[{\"pg_name\": \"1\", \"ranks\": [], \"group_size\": 2}, [3]]'"),
    (f"[[[[{WORLD_PG}]]]]", NOT_PG_CONFIG + f"'[[[[{WORLD_PG}]]]]'"),  # four lists deep
    (f"[[[{json.dumps(WORLD_PG)}]]]", NOT_PG_CONFIG + repr(f"[[[{json.dumps(WORLD_PG)}]]]")),  # a string that deep
])
def test_bad_pg_config(text, message):
    """Refused, the message naming where, the field, what was expected and what was given."""
    with pytest.raises(FieldError) as err:
        parse_pg_config(text, "t", "n")
    assert str(err.value) == message


# ---------------------------------------------------------------------------
# One-rank traces replicated
# ---------------------------------------------------------------------------

def test_one_rank_of_a_data_parallel_job_replicated(tmp_path):
    """Rank 0 of an 8-rank job, replicated to 4: its world group (ranks [] in pg_config) spans the 4."""
    nodes = [chakra.pg_init_node(1, [ProcessGroup("0", (), 8)]), chakra.comp_node(2, "fwd", 5, deps=[1]),
             _ar(3, "0", 4096, deps=[2]), chakra.coll_node(4, "bcast", pb.BROADCAST, 1024, pg_name="", deps=[3])]
    path = str(tmp_path / "dp.0.et")
    chakra.write_trace(path, nodes)
    sched = chakra.load([path], ranks=4)
    assert sched.p == 4 and [s.groups for s in sched.segments] == [(), ()]
    assert sched.meta["replicated"] == {"file": "dp.0.et", "ranks": 4} and sched.meta["trace"] == "dp"
    assert sched.meta["process_groups"] == {"0": [0, 1, 2, 3]} and sched.meta["nodes"]["COMP_NODE"] == 4
    assert execute(sched).valid


def test_replication_refusals(tmp_path):
    sub = str(tmp_path / "tp.0.et")
    chakra.write_trace(sub, [chakra.pg_init_node(1, [ProcessGroup("1", (0, 1), 2)]), _ar(2, "1")])
    with pytest.raises(FieldError, match=r"pg_name': expected a process group of every rank for a replicated "
                       r"one-rank trace.*got \"'1': ranks \[0, 1\] of 2\""):
        chakra.load([sub], ranks=8)
    p2p = str(tmp_path / "pp.0.et")
    chakra.write_trace(p2p, [chakra.comm_node(1, "s", True, 1, 64), _ar(2, "0")])
    with pytest.raises(FieldError, match=r"node 1 \(s\)': expected no point-to-point node"):
        chakra.load([p2p], ranks=2)
    with pytest.raises(FieldError, match=r"field 'ranks': expected one trace file to replicate"):
        chakra.load([sub, p2p], ranks=2)
    with pytest.raises(FieldError, match=r"field 'ranks': expected an integer in 2\.\.1024"):
        chakra.load([sub], ranks=1)
    with pytest.raises(FieldError, match=r"field 'index': expected a collective over every rank"):
        chakra.load(_write(tmp_path, _pairs()), index=0)


# ---------------------------------------------------------------------------
# The CLI
# ---------------------------------------------------------------------------

def _resnet(tmp_path) -> str:
    with tarfile.open(os.path.join(DATA, "chakra", "feeder_tests_trace.tar.gz")) as tar:
        member = tar.extractfile("tests/data/chakra.0.et")
        assert member is not None
        path = tmp_path / "chakra.0.et"
        path.write_bytes(member.read())
    return str(path)


def test_cli_replicates_and_says_what_it_dropped(tmp_path, capsys):
    out = str(tmp_path / "resnet.json")
    assert main(["schedule", "import", _resnet(tmp_path), "--ranks", "2", "-o", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"wrote {out}: chakra, 2 ranks")
    assert lines[1:] == ["warning: dropped 383 self-dependencies, 1277 dependencies on node ids not in their file "
                         "and 599 ctrl_deps closing a cycle (counted over the files read)",
                         "note: 2448 CPU-side nodes (is_cpu_op) kept as dependencies only, 52.3 ms of recorded host "
                         "time not replayed"]


def test_cli_prints_nothing_more_for_a_clean_trace(tmp_path, capsys):
    out = str(tmp_path / "h.yaml")
    paths = write_pytorch_trace(tmp_path, "hybrid", [hybrid_step(r) for r in range(WORLD)])
    assert main(["schedule", "import", *paths, "-o", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("note: ") and "warning" not in lines[1]


@pytest.mark.parametrize("args, needle", [
    (["--ranks", "4"], None),
    ([], "or one file and --ranks N to replicate it"),
    (["--ranks", "1"], "field 'ranks'"),
])
def test_cli_ranks_option(tmp_path, capsys, args, needle):
    path = str(tmp_path / "dp.0.et")
    chakra.write_trace(path, [chakra.comp_node(1, "fwd", 5), _ar(2, "0", deps=[1])])
    out = tmp_path / "o.yaml"
    status = main(["schedule", "import", path, *args, "-o", str(out)])
    captured = capsys.readouterr()
    if needle is None:
        assert status == 0 and out.exists() and "4 ranks" in captured.out
    else:
        assert status == 2 and needle in captured.err and captured.err.count("\n") == 1 and not out.exists()


def test_cli_ranks_is_for_chakra_only(tmp_path, capsys):
    out = tmp_path / "o.yaml"
    assert main(["schedule", "import", os.path.join(DATA, "msccl_ring4.xml"), "--ranks", "4", "-o", str(out)]) == 2
    assert "no --ranks for MSCCL" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("algo, topo, used", [
    ("hd", None, ["hd"] * 5),
    ("dbtree", None, ["dbtree", "dbtree", "ring", "dbtree", "dbtree"]),
    ("hier", "star:hosts=4,servers=4,accels_per_server=2,nics_per_server=1", ["hier"] * 5),  # servers of 2
    ("hdrm", "bigraph:upper=2,lower=2,hosts_per_switch=2", ["hd"] * 4 + ["hdrm"]),  # hdrm places every rank
])
def test_groups_with_other_algorithms(tmp_path, algo, topo, used):
    paths = write_pytorch_trace(tmp_path, "hybrid", [hybrid_step(r) for r in range(WORLD)])
    sched = chakra.load(paths, algo=algo, topology=topo)
    assert [c["algorithm"] for c in sched.meta["collectives"]] == used
    assert execute(sched).valid
