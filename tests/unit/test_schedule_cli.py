"""``emu schedule gen|check|import`` through emulator.cli.main.main: exit status, one-line errors, nothing written."""

from __future__ import annotations

import json
import os

import pytest

from emulator.cli.main import main

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
BIG = "bigraph:upper=4,lower=4,hosts_per_switch=4"


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_gen_then_check_json(tmp_path, capsys):
    out = str(tmp_path / "hdrm.yaml")
    assert main(["schedule", "gen", "--algo", "hdrm", "--topology", BIG, "--size", "1MiB", "-o", out]) == 0
    assert "hdrm, 32 ranks" in capsys.readouterr().out
    assert main(["schedule", "check", out, "--topology", BIG, "--routing", "bigraph", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True and data["steps"] == 10
    assert data["max_flows_per_link"] == [1] * 10
    assert isinstance(data["predicted_time_s"], float) and data["predicted_time_s"] > 0


def test_check_text_and_default_topology(tmp_path, capsys):
    out = str(tmp_path / "ring.json")
    assert main(["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "64KiB",
                 "-o", out]) == 0
    capsys.readouterr()
    assert main(["schedule", "check", out]) == 0
    text = capsys.readouterr().out
    assert "valid allreduce" in text and "max-min fair" in text


def test_check_reports_a_broken_schedule_with_status_1(tmp_path, capsys):
    path = tmp_path / "dead.yaml"
    path.write_text("""
version: 1
size: 8
chunks: 2
ranks:
- {rank: 0, host: h1, ops: [{id: 0, kind: recv_reduce, peer: 1, chunk: 1, step: 0},
                            {id: 1, kind: send, peer: 1, chunk: 0, step: 0, deps: [0]}]}
- {rank: 1, host: h2, ops: [{id: 0, kind: recv_reduce, peer: 0, chunk: 0, step: 0},
                            {id: 1, kind: send, peer: 0, chunk: 1, step: 0, deps: [0]}]}
""")
    assert main(["schedule", "check", str(path), "--topology", "star:hosts=2", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is False
    assert data["deadlock"]["ranks"] == [0, 1]
    assert main(["schedule", "check", str(path), "--topology", "star:hosts=2"]) == 1
    assert "deadlock" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (["gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "64Kb"], "field 'size'"),
    (["gen", "--algo", "ring", "--topology", "star:hosts=3", "--size", "8B"], "at least 12 bytes"),
    (["gen", "--algo", "ring", "--topology", "star:hosts=3", "--size", "10B"], "multiple of 4 bytes"),
    (["gen", "--algo", "bogus", "--topology", "star:hosts=4", "--size", "64KiB"], "field 'algo'"),
    (["gen", "--algo", "hdrm", "--topology", "bigraph:upper=2,lower=2,hosts_per_switch=4", "--size", "1MiB"],
     "at most 2 hosts per switch"),
    (["gen", "--algo", "hd", "--topology", "star:hosts=4", "--size", "1MiB", "--placement", "hdrm"], "bigraph"),
    (["gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "1MiB", "--placement", "x"],
     "field 'placement'"),
    (["gen", "--algo", "ring", "--topology", "nope:x=1", "--size", "1MiB"], "field 'kind'"),
    (["gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "1MiB", "--chunks", "3"], "field 'chunks'"),
])
def test_gen_errors_are_one_line_and_write_nothing(tmp_path, capsys, args, needle):
    out = tmp_path / "out.yaml"
    assert main(["schedule", *args, "-o", str(out)]) == 2
    assert needle in _err_line(capsys)
    assert not out.exists()
    assert os.listdir(tmp_path) == []


def test_check_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nsize: 8\nchunks: 2\nranks:\n- {rank: 0, host: h1, ops: "
                   "[{id: 0, kind: send, peer: 3, chunk: 0, step: 0}]}\n- {rank: 1, host: h2, ops: []}\n")
    assert main(["schedule", "check", str(bad), "--topology", "star:hosts=2"]) == 2
    assert "ranks[0].ops[0].peer" in _err_line(capsys)
    assert main(["schedule", "check", str(tmp_path / "missing.yaml"), "--topology", "star:hosts=2"]) == 2
    assert "cannot read" in _err_line(capsys)
    good = tmp_path / "good.yaml"
    assert main(["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "1KiB",
                 "-o", str(good)]) == 0
    capsys.readouterr()
    assert main(["schedule", "check", str(good), "--topology", "star:hosts=2"]) == 2
    assert "ranks[2].host" in _err_line(capsys)
    assert main(["schedule", "check", str(good), "--routing", "teleport"]) == 2
    assert "teleport" in _err_line(capsys)
    assert main(["schedule", "check", str(good), "--fabric", "alpha_us=-1"]) == 2
    assert "field 'alpha_us'" in _err_line(capsys)
    assert main(["schedule", "check", str(good), "--fabric", "roce9000"]) == 2
    assert "field 'preset'" in _err_line(capsys)


def test_import_msccl_and_chakra(tmp_path, capsys):
    out = str(tmp_path / "m.yaml")
    assert main(["schedule", "import", os.path.join(DATA, "msccl_ring4.xml"), "-o", out, "--size", "64KiB"]) == 0
    capsys.readouterr()
    assert main(["schedule", "check", out, "--topology", "star:hosts=4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 6
    traces = [os.path.join(DATA, f"chakra_ar.{r}.et") for r in range(4)]
    out2 = str(tmp_path / "c.json")
    assert main(["schedule", "import", *traces, "-o", out2, "--index", "1", "--algo", "hd"]) == 0
    capsys.readouterr()
    assert main(["schedule", "check", out2, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] and data["size"] == 1 << 20 and data["algorithm"] == "hd"


@pytest.mark.parametrize("files, extra, needle", [
    (["a.xml", "b.et"], [], "field 'FILE'"),
    (["a.xml", "b.xml"], [], "one MSCCL XML file"),
    (["x.0.et", "x.1.et"], ["--size", "1MiB"], "field 'size'"),
])
def test_import_errors(tmp_path, capsys, files, extra, needle):
    out = tmp_path / "o.yaml"
    assert main(["schedule", "import", *[str(tmp_path / f) for f in files], "-o", str(out), *extra]) == 2
    assert needle in _err_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("args, summary", [
    (["--collective", "allgather", "--algo", "ring", "--topology", "star:hosts=4"], "allgather ring, 4 ranks"),
    (["--collective", "alltoall", "--algo", "direct", "--topology", "star:hosts=6"], "alltoall direct, 6 ranks"),
    (["--collective", "broadcast", "--algo", "dbtree", "--root", "3", "--topology", "star:hosts=5"],
     "broadcast dbtree, 5 ranks"),
    (["--collective", "reduce", "--algo", "hdrm", "--root", "5", "--topology", BIG], "reduce hdrm, 32 ranks"),
    (["--collective", "reduce_scatter", "--algo", "hd", "--topology", "star:hosts=8", "--chunks", "16"],
     "reduce_scatter hd, 8 ranks"),
])
def test_gen_other_collectives_then_check(tmp_path, capsys, args, summary):
    out = str(tmp_path / "s.json")
    assert main(["schedule", "gen", *args, "--size", "96KiB", "-o", out]) == 0
    assert summary in capsys.readouterr().out
    assert main(["schedule", "check", out, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True and data["algorithm"] == args[3]
    with open(out) as fh:
        doc = json.load(fh)
    assert doc["collective"] == args[1]
    if "--root" in args:
        assert doc["root"] == int(args[args.index("--root") + 1])


@pytest.mark.parametrize("args, needle", [
    (["--collective", "gather", "--algo", "ring", "--topology", "star:hosts=4"], "field 'collective'"),
    (["--collective", "p2p", "--algo", "ring", "--topology", "star:hosts=4"], "field 'collective'"),
    (["--collective", "allgather", "--algo", "hd", "--topology", "star:hosts=6"], "power-of-two number of ranks"),
    (["--collective", "alltoall", "--algo", "hd", "--topology", "star:hosts=4"], "halving-doubling has no alltoall"),
    (["--collective", "allgather", "--algo", "dbtree", "--topology", "star:hosts=4"],
     "one of ring, hd, hdrm, direct, hier, nccl for allgather"),
    (["--collective", "broadcast", "--algo", "ring", "--root", "4", "--topology", "star:hosts=4"], "field 'root'"),
    (["--collective", "broadcast", "--algo", "ring", "--root", "-1", "--topology", "star:hosts=4"], "field 'root'"),
    (["--algo", "ring", "--root", "1", "--topology", "star:hosts=4"], "nothing for allreduce"),
])
def test_gen_collective_errors_are_one_line_and_write_nothing(tmp_path, capsys, args, needle):
    out = tmp_path / "out.yaml"
    assert main(["schedule", "gen", *args, "--size", "64KiB", "-o", str(out)]) == 2
    assert needle in _err_line(capsys)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("algo", ["ring", "hd", "dbtree"])
@pytest.mark.parametrize("hosts", [6, 10, 12])
def test_one_mebibyte_on_six_ten_and_twelve_ranks(tmp_path, capsys, algo, hosts):
    out = str(tmp_path / "s.yaml")
    spec = f"star:hosts={hosts}"
    assert main(["schedule", "gen", "--algo", algo, "--topology", spec, "--size", "1MiB", "-o", out]) == 0
    capsys.readouterr()
    assert main(["schedule", "check", out, "--topology", spec, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True
