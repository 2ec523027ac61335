"""Schedule format: sizes, round trips, and one clear error per bad field."""

from __future__ import annotations

import json

import pytest
import yaml

from emulator.base.errors import FieldError, UserError
from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.schedule import format as fmt


@pytest.mark.parametrize("text, value", [("64KiB", 65536), ("16MiB", 16 << 20), ("1GiB", 1 << 30),
                                         ("1MB", 10**6), ("4096", 4096), (" 8 B", 8), (12, 12)])
def test_sizes(text, value):
    assert fmt.parse_size(text) == value


@pytest.mark.parametrize("text", ["64Kb", "0", "-1", "1.5MiB", "abc", "", "KiB", True, None, 0])
def test_bad_sizes(text):
    with pytest.raises(FieldError, match="field 'size'"):
        fmt.parse_size(text)


def test_chunking_must_be_whole_float32_elements():
    assert fmt.check_chunking(64, 4) == 16
    with pytest.raises(FieldError, match="multiple of 16 bytes"):
        fmt.check_chunking(36, 4)


@pytest.mark.parametrize("ext", ["yaml", "json"])
def test_round_trip(tmp_path, ext):
    sched = generate("hd", topology.build("star:hosts=6"), 4096)
    path = str(tmp_path / f"s.{ext}")
    fmt.save(sched, path)
    text = open(path).read()
    if ext == "json":
        json.loads(text)
    else:
        assert text.startswith("# eflops-emulator-schedule")
    assert fmt.load(path) == sched


def _doc() -> dict:
    return {"version": 1, "size": 16, "chunks": 2, "ranks": [
        {"rank": 0, "host": "h1", "ops": [{"id": 0, "kind": "send", "peer": 1, "chunk": 0, "step": 0},
                                          {"id": 1, "kind": "recv", "peer": 1, "chunk": 1, "step": 1, "deps": [0]}]},
        {"rank": 1, "host": "h2", "ops": [{"id": 0, "kind": "recv_reduce", "peer": 0, "chunk": 0, "step": 0},
                                          {"id": 1, "kind": "send", "peer": 0, "chunk": 1, "step": 1}]}]}


def test_minimal_document_parses_with_defaults():
    sched = fmt.from_dict(_doc())
    assert sched.p == 2 and sched.chunk_bytes == 8 and sched.steps == 2
    assert sched.ranks[0].ops[1].deps == (0,) and sched.ranks[0].ops[0].bytes == 8


def _set(doc: dict, path: list, value) -> dict:
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


BAD = [
    (["version"], 4, "version"),
    (["version"], True, "version"),
    (["collective"], "gossip", "collective"),
    (["root"], 1, "root"),  # an allreduce has no root
    (["output_chunks"], 3, "output_chunks"),
    (["ranks", 0, "ops", 1, "lane"], 64, "ranks[0].ops[1].lane"),
    (["ranks", 0, "ops", 1, "lane"], -1, "ranks[0].ops[1].lane"),
    (["size"], "12 parsecs", "size"),
    (["size"], 12, "size"),  # 2 chunks of 6 bytes: not whole float32 elements
    (["chunks"], 0, "chunks"),
    (["collective"], "allgather", "collective"),
    (["dtype"], "float16", "dtype"),
    (["bogus"], 1, "bogus"),
    (["ranks"], [], "ranks"),
    (["ranks", 1, "rank"], 5, "ranks[1].rank"),
    (["ranks", 1, "host"], "h1", "ranks[1].host"),
    (["ranks", 1, "host"], "server", "ranks[1].host"),
    (["ranks", 0, "ops", 1, "peer"], 0, "ranks[0].ops[1].peer"),
    (["ranks", 0, "ops", 1, "peer"], 7, "ranks[0].ops[1].peer"),
    (["ranks", 0, "ops", 1, "peer"], KeyError, "ranks[0].ops[1].peer"),
    (["ranks", 0, "ops", 1, "kind"], "multicast", "ranks[0].ops[1].kind"),
    (["ranks", 0, "ops", 1, "chunk"], 2, "ranks[0].ops[1].chunk"),
    (["ranks", 0, "ops", 1, "nchunks"], 2, "ranks[0].ops[1].nchunks"),
    (["ranks", 0, "ops", 1, "bytes"], 9, "ranks[0].ops[1].bytes"),
    (["ranks", 0, "ops", 1, "step"], -1, "ranks[0].ops[1].step"),
    (["ranks", 0, "ops", 1, "step"], 1.5, "ranks[0].ops[1].step"),
    (["ranks", 0, "ops", 1, "step"], 2**31, "ranks[0].ops[1].step"),  # the models keep a record per step
    (["ranks", 0, "ops", 1, "deps"], [5], "ranks[0].ops[1].deps[0]"),
    (["ranks", 0, "ops", 1, "deps"], [1], "ranks[0].ops[1].deps[0]"),
    (["ranks", 0, "ops", 1, "id"], 0, "ranks[0].ops[1].id"),
    (["ranks", 0, "ops", 1, "buffer"], "scratch", "ranks[0].ops[1].buffer"),
    (["ranks", 0, "ops", 1, "buffer"], "gpu", "ranks[0].ops[1].buffer"),
    (["ranks", 0, "ops", 1, "src"], "data", "ranks[0].ops[1].src"),
    (["ranks", 0, "ops", 1, "colour"], "red", "ranks[0].ops[1].colour"),
    (["ranks", 0, "ops", 0, "step"], 3, "ranks[0].ops[1].step"),  # dependency 0 now at a later step
]


@pytest.mark.parametrize("path, value, field", BAD)
def test_bad_fields_name_their_path(path, value, field):
    with pytest.raises(FieldError) as exc:
        fmt.from_dict(_set(_doc(), path, value))
    assert exc.value.field == field
    assert "\n" not in str(exc.value)


def test_local_op_fields():
    doc = _doc()
    doc["scratch_chunks"] = 2
    doc["ranks"][0]["ops"].append({"id": 2, "kind": "copy", "chunk": 0, "src": "data", "src_chunk": 0, "step": 1})
    with pytest.raises(FieldError, match="does not overlap"):
        fmt.from_dict(doc)
    doc["ranks"][0]["ops"][2].update(buffer="scratch")
    assert fmt.from_dict(doc).ranks[0].ops[2].src == "data"
    doc["ranks"][0]["ops"][2].pop("src")
    with pytest.raises(FieldError, match=r"ops\[2\]\.src"):
        fmt.from_dict(doc)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        fmt.load(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("ranks: [\n")
    with pytest.raises(UserError, match="not valid YAML"):
        fmt.load(str(bad))
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        fmt.load(str(bad_json))
    lst = tmp_path / "list.yaml"
    lst.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(FieldError, match="a mapping"):
        fmt.load(str(lst))


def test_hosts_must_exist_in_the_topology():
    sched = fmt.from_dict(_set(_doc(), ["ranks", 1, "host"], "h9"))
    with pytest.raises(FieldError, match=r"ranks\[1\]\.host"):
        fmt.check_hosts(sched, topology.build("star:hosts=4"))


def test_documented_example_is_a_valid_allreduce():
    import os
    import re

    from emulator.model.schedule.executor import execute

    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "schedule-format.md")
    block = re.search(r"```yaml\n(.*?)```", open(doc).read(), re.S).group(1)
    sched = fmt.loads(block)
    assert execute(sched).valid and sched.steps == 2 and sched.size == 65536


def _doc2(collective: str = "allreduce", **top) -> dict:
    doc = _doc()
    doc.update(version=2, collective=collective, **top)
    return doc


def test_version_2_compute_and_lanes_round_trip(tmp_path):
    doc = _doc2()
    doc["ranks"][0]["ops"][0]["lane"] = 3
    doc["ranks"][1]["ops"][0]["lane"] = 3
    doc["ranks"][0]["ops"].insert(0, {"id": 7, "kind": "compute", "seconds": 0.25, "step": 0})
    doc["ranks"][0]["ops"][1]["deps"] = [7]
    sched = fmt.from_dict(doc)
    first = sched.ranks[0].ops[0]
    assert first.kind == "compute" and first.seconds == 0.25 and not first.is_comm
    assert sched.ranks[0].ops[1].lane == 3 and sched.compute_ops == 1
    assert fmt.from_dict(sched.to_dict()) == sched
    assert fmt.match_transfers(sched) == [(0, 0, 1, 0), (1, 1, 0, 1)]


@pytest.mark.parametrize("op, field", [
    ({"id": 9, "kind": "compute", "seconds": -1, "step": 0}, "seconds"),
    ({"id": 9, "kind": "compute", "seconds": "1ms", "step": 0}, "seconds"),
    ({"id": 9, "kind": "compute", "seconds": float("nan"), "step": 0}, "seconds"),
    ({"id": 9, "kind": "compute", "step": 0}, "seconds"),
    ({"id": 9, "kind": "compute", "seconds": 1, "step": 0, "peer": 1}, "peer"),
    ({"id": 9, "kind": "compute", "seconds": 1, "step": 0, "deps": [42]}, "deps[0]"),
    ({"id": 9, "kind": "copy", "chunk": 0, "src": "data", "src_chunk": 1, "step": 0, "lane": 1}, "lane"),
])
def test_bad_compute_and_lane_fields(op, field):
    doc = _doc2()
    doc["ranks"][0]["ops"].append(op)
    with pytest.raises(FieldError) as exc:
        fmt.from_dict(doc)
    assert exc.value.field == f"ranks[0].ops[2].{field}"


@pytest.mark.parametrize("collective, top, field", [
    ("allreduce", {"dtype": "uint8"}, "dtype"),
    ("allgather", {"output_chunks": 3}, "output_chunks"),
    ("reduce_scatter", {"chunks": 1, "size": 4}, "chunks"),
    ("alltoall", {"chunks": 3, "size": 12}, "chunks"),
    ("broadcast", {"root": 2}, "root"),
])
def test_collective_shapes_are_checked(collective, top, field):
    with pytest.raises(FieldError) as exc:
        fmt.from_dict(_doc2(collective, **top))
    assert exc.value.field == field


def test_p2p_carries_any_byte_count():
    doc = _doc2("p2p", dtype="uint8", size=6, chunks=2)
    sched = fmt.from_dict(doc)
    assert sched.chunk_bytes == 3 and sched.collective_bytes == 6
