"""MPI programs as experiment cells (``mpi:``): parsing and validation with field-named errors, grid expansion and
ids, ``--check``, the runner's loop and resume rule with a fake MPI runner on the fake session, and the report's
"MPI programs" section and ``cells.csv`` rows from fake :class:`~emulator.runs.mpi_results.MpiResults` documents. No
root.
"""

from __future__ import annotations

import csv
import io
import json
import os

import pytest
import yaml
from fake_session import FakeSession, factory

from emulator.base.errors import FieldError, UserError
from emulator.cli import main as cli
from emulator.model import topology
from emulator.model.latency import LatencyModel
from emulator.runs import allreduce_bench as mpi_bench
from emulator.runs.mpi_plan import rank_hosts
from emulator.runs.mpi_results import MpiResults, RankPlace
from emulator.runs.results import CellResults, Fidelity
from emulator.study import experiment as xp
from emulator.study import report
from emulator.study.cell_kinds import DEFAULT_KINDS
from emulator.study.folder.results_folder import ResultsFolder
from emulator.study.live import runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIGRAPH = "bigraph:upper=2,lower=2,hosts_per_switch=2"
LEAFSPINE = "leafspine:leaves=2,spines=2,hosts_per_leaf=4"
BENCH = "[emu-allreduce-bench, --algo, ring, --sizes, '256KiB,1MiB']"

MIXED = f"""
name: mixed
repeat: 1
warmup: 0
sizes: [64KiB]
ecmp_seeds: [0, 3]
series:
  - name: s
    runs:
      - topology: "{BIGRAPH}"
        routing: bigraph
        algorithms: [hdrm]
      - topology: "{BIGRAPH}"
        routing: bigraph
        placements: [identity, hdrm]
        mpi: {{program: {BENCH}}}
      - topology: "{LEAFSPINE}"
        routing: ecmp
        mpi: {{program: "emu-allreduce-bench --algo halving_doubling --sizes 1MiB", np: 4, nice: 10,
               mca: {{coll_tuned_use_dynamic_rules: 1, btl_tcp_links: "2"}}, timeout_s: 60}}
"""
IDS = ["s.bigraph-2x2x2.bigraph.hdrm.64KiB",
       "s.bigraph-2x2x2.bigraph.mpi-emu-allreduce-bench-ring.np8",
       "s.bigraph-2x2x2.bigraph.mpi-emu-allreduce-bench-ring-hdrm.np8",
       "s.leafspine-2x2x4.ecmp-s0.mpi-emu-allreduce-bench-rabenseifner.np4",
       "s.leafspine-2x2x4.ecmp-s3.mpi-emu-allreduce-bench-rabenseifner.np4"]


def parse(text: str, where: str = "experiments/x.yaml") -> xp.Experiment:
    return xp.from_dict(yaml.safe_load(text), where=where)


def one_run(run: str) -> str:
    return f"series: [{{name: s, runs: [{{topology: 'star:hosts=4', routing: shortest, {run}}}]}}]"


# ------------------------------------------------------------------ format
def test_mpi_runs_expand_one_cell_per_topology_routing_seed_placement_with_stable_ids():
    exp = parse(MIXED)
    cells = xp.expand(exp)
    assert [c.id for c in cells] == IDS
    assert [c.id for c in xp.expand(parse(MIXED))] == IDS  # stable
    bench, hdrm, ecmp0, ecmp3 = cells[1:]
    assert isinstance(bench.mpi, xp.MpiProgram) and bench.mpi.program == ("emu-allreduce-bench", "--algo", "ring",
                                                                           "--sizes", "256KiB,1MiB")
    assert bench.mpi.np is None and bench.ranks == bench.hosts == 8 and bench.size == 0
    assert bench.algorithm == "mpi-emu-allreduce-bench-ring" and bench.placement == "identity"
    assert hdrm.placement == "hdrm" and bench.mpi.nice == 19 and bench.mpi.timeout_s == 900
    assert (ecmp0.seed, ecmp3.seed) == (0, 3) and ecmp0.ranks == 4 and ecmp0.hosts == 8
    assert ecmp0.mpi is not None and ecmp0.mpi.mca == (("coll_tuned_use_dynamic_rules", "1"), ("btl_tcp_links", "2"))
    assert ecmp0.mpi.nice == 10 and ecmp0.timeout_s == ecmp0.mpi.timeout_s == 60
    # ids are directory names whose parts split at dots
    assert all(part and "/" not in part for c in cells for part in c.id.split(".")) and \
        all(len(c.id.split(".")) == 5 for c in cells)
    # MPI cells share their topology's network with its replay cells; seeds make networks of their own
    assert [len(g) for _, g in xp.groups(cells)] == [3, 1, 1]
    # the document a cell's results hold reads back equal (lists, not tuples), and only MPI cells have "mpi"
    assert json.loads(json.dumps(ecmp0.to_json())) == ecmp0.to_json()
    assert ecmp0.to_json()["mpi"] == {"program": ["emu-allreduce-bench", "--algo", "halving_doubling", "--sizes",
                                                  "1MiB"], "np": 4,
                                      "mca": [["coll_tuned_use_dynamic_rules", "1"], ["btl_tcp_links", "2"]],
                                      "nice": 10, "timeout_s": 60.0}
    assert "mpi" not in cells[0].to_json()
    runs = exp.to_json()["series"][0]["runs"]
    assert "mpi" not in runs[0] and runs[1]["mpi"]["program"][0] == "emu-allreduce-bench"
    cfg = ecmp3.mpi_config("/tmp/out")
    assert (cfg.topology, cfg.routing, cfg.seed, cfg.placement, cfg.np, cfg.nice, cfg.timeout_s) == \
        (ecmp3.topology, "ecmp", 3, "identity", 4, 10, 60)
    assert cfg.mca == ecmp0.mpi.mca and cfg.fabric == ecmp3.fabric and cfg.out == "/tmp/out"
    with pytest.raises(ValueError):
        cells[0].mpi_config("/tmp/out")
    with pytest.raises(ValueError):
        bench.schedule(topology.build(bench.topology))


def test_a_program_string_is_split_as_a_shell_would_and_other_programs_are_named_by_their_file():
    a = parse(one_run("mpi: {program: \"emu-allreduce-bench --algo ring --sizes '64KiB,1MiB'\"}"))
    b = parse(one_run("mpi: {program: [emu-allreduce-bench, --algo, ring, --sizes, '64KiB,1MiB']}"))
    assert xp.expand(a)[0].mpi == xp.expand(b)[0].mpi
    assert xp.expand(a)[0].fabric == xp.expand(b)[0].fabric and a.fingerprint() == b.fingerprint()
    other = xp.expand(parse(one_run("mpi: {program: 'python3 -c \"print(1)\"', np: 2}")))[0]
    assert other.id == "s.star-4.shortest.mpi-python3.np2" and other.mpi is not None
    assert other.mpi.program == ("python3", "-c", "print(1)") and other.mpi.bench_algorithm is None
    assert other.mpi.command() == "python3 -c 'print(1)'"
    assert xp.MpiProgram(("/opt/my.app",)).slug == "mpi-my-app"  # no dots, no slashes


@pytest.mark.parametrize("run, field, text", [
    ("mpi: {program: no-such-program-here}", "mpi.program", "a program on PATH"),
    ("mpi: {program: [emu-allreduce-bench, --algo, bogus, --sizes, 1MiB]}", "mpi.program", "--algo must be"),
    ("mpi: {program: 'emu-allreduce-bench --algo ring'}", "mpi.program", "--sizes must be"),
    ("mpi: {program: 'emu-allreduce-bench --algo ring --sizes 1MiB --colour red'}", "mpi.program",
     "unrecognized arguments"),
    ("mpi: {program: 'emu-allreduce-bench --he'}", "mpi.program", "not --help"),
    ("mpi: {program: 'emu-allreduce-bench -hb 1'}", "mpi.program", "not --help"),
    ("mpi: {program: 'emu-allreduce-bench --algo ring --sizes 1MiB --json x.json'}", "mpi.program",
     "without --json"),
    ("mpi: {program: 'python3 \"unclosed'}", "mpi.program", "No closing quotation"),
    ("mpi: {program: []}", "mpi.program", "a program and its arguments"),
    ("mpi: {program: [python3, 3]}", "mpi.program", "a program and its arguments"),
    ("mpi: {program: \"python3 \\x01\"}", "mpi.program", "printable words"),
    ("mpi: {np: 2}", "mpi.program", "a program and its arguments"),
    ("mpi: {program: python3, np: 5}", "mpi.np", "1..4"),
    ("mpi: {program: python3, np: 1}", "mpi.np", "an integer >= 2"),
    ("mpi: {program: python3, np: true}", "mpi.np", "an integer >= 2"),
    ("mpi: {program: python3, mca: {plm_rsh_agent: x}}", "mpi.mca.plm_rsh_agent", "does not set itself"),
    ("mpi: {program: python3, mca: {Btl: tcp}}", "mpi.mca.Btl", "an Open MPI parameter name"),
    ("mpi: {program: python3, mca: {btl: ''}}", "mpi.mca.btl", "a non-empty one-line value"),
    ("mpi: {program: python3, mca: {btl: [tcp]}}", "mpi.mca.btl", "a string or a number"),
    ("mpi: {program: python3, mca: [btl, tcp]}", "mpi.mca", "a mapping"),
    ("mpi: {program: python3, nice: 20}", "mpi.nice", "0..19"),
    ("mpi: {program: python3, timeout_s: 0}", "mpi.timeout_s", "seconds > 0"),
    ("mpi: {program: python3, timeout_s: .nan}", "mpi.timeout_s", "seconds > 0"),
    ("mpi: {program: python3, colour: red}", "mpi.colour", "one of the keys program, np, mca, nice, timeout_s"),
    ("mpi: [python3]", "mpi", "a mapping"),
    ("mpi: {program: python3}, placements: [hdrm]", "placements[0]", "a bigraph topology"),
    ("mpi: {program: python3}, algorithms: [ring]", "algorithms", "nothing beside mpi"),
    ("mpi: {program: python3}, collective: allgather", "collective", "nothing beside mpi"),
    ("mpi: {program: python3}, model: resnet50", "model", "nothing beside mpi"),
    ("mpi: {program: python3}, faults: [controller_kill@1s]", "faults", "nothing beside mpi"),
    ("mpi: {program: python3}, sizes: [1MiB]", "sizes", "nothing beside mpi"),
])
def test_a_bad_mpi_value_is_one_error_naming_the_file_and_the_field(run, field, text):
    with pytest.raises(UserError) as info:
        parse(one_run(run))
    msg = str(info.value)
    assert msg.startswith(f"experiments/x.yaml: field 'series[0].runs[0].{field}': ") and text in msg, msg
    assert "\n" not in msg


def test_np_is_checked_against_every_placement_as_rank_hosts_does():
    text = (f"series: [{{name: s, runs: [{{topology: '{BIGRAPH}', routing: bigraph, placements: [identity, hdrm], "
            "mpi: {program: python3, np: 4}}]}]")
    exp = parse(text)
    topo = topology.build(xp.expand(exp)[1].topology)
    assert [c.placement for c in xp.expand(exp)] == ["identity", "hdrm"]
    assert len(rank_hosts(topo, "hdrm", 4)) == 4
    with pytest.raises(FieldError) as info:
        parse(text.replace("np: 4", "np: 9"))
    assert info.value.field == "series[0].runs[0].mpi.np"


def test_two_mpi_runs_that_make_the_same_cell_are_an_error():
    text = ("series: [{name: s, runs: [{topology: 'star:hosts=4', routing: shortest, mpi: {program: "
            "'emu-allreduce-bench --algo ring --sizes 1MiB'}}, {topology: 'star:hosts=4', routing: shortest, "
            "mpi: {program: 'emu-allreduce-bench --algo ring --sizes 4MiB'}}]}]")
    with pytest.raises(FieldError) as info:
        parse(text)
    assert info.value.field == "series[0].runs[1]" and "series of their own" in str(info.value)


def test_prepare_gives_an_mpi_cell_no_schedule_and_no_prediction():
    exp = parse(MIXED)
    pcs = xp.prepare(exp)
    assert [pc.cell.id for pc in pcs] == IDS
    replay, mpi_cell = pcs[0], pcs[1]
    assert replay.schedule is not None and replay.report is not None and replay.predicted_s
    assert mpi_cell.schedule is None and mpi_cell.report is None and mpi_cell.predicted_s is None
    assert isinstance(mpi_cell.latency_model, LatencyModel) and mpi_cell.latency_model.profile is not None
    assert mpi_cell.peak_load_mbps() == 0.0
    assert xp.estimate_s(mpi_cell, 1.5) == xp.MPI_ESTIMATE_S + 1.5


def test_check_says_an_mpi_cell_runs_its_program_and_has_no_prediction(tmp_path, capsys):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    assert cli.main(["run", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith(IDS[3] + ":"))
    assert "runs the MPI program `emu-allreduce-bench --algo halving_doubling --sizes 1MiB` on 4 ranks" in line
    assert "no model prediction" in line
    assert f"{IDS[0]}: predicted " in out
    assert "MPI programs only (no model of their load)" in out  # the leaf-spine networks
    assert "5 cells on 3 networks" in out and f"MPI cells: {xp.MPI_ESTIMATE_S:g} s each" in out
    assert not (tmp_path / "results").exists()


def test_the_bundled_mpi_experiment_checks():
    exp = xp.load(os.path.join(ROOT, "experiments", "mpi.yaml"))
    cells = xp.expand(exp)
    assert [c.id for c in cells] == [
        "mpi.bigraph-2x2x2.bigraph.mpi-emu-allreduce-bench-ring-hdrm.np8",
        "mpi.bigraph-2x2x2.bigraph.mpi-emu-allreduce-bench-rabenseifner-hdrm.np8",
        "mpi.leafspine-2x2x4.ecmp-s1.mpi-emu-allreduce-bench-ring.np8",
        "mpi.leafspine-2x2x4.ecmp-s1.mpi-emu-allreduce-bench-rabenseifner.np8"]
    assert all(c.mpi is not None and mpi_bench.parse_args(list(c.mpi.program[1:])).sizes == (1 << 20, 4 << 20)
               for c in cells)
    assert len(xp.groups(cells)) == 2 and all(pc.report is None for pc in xp.prepare(exp))


# ------------------------------------------------------------------ running
class FakeMpi:
    """Stands in for :func:`emulator.study.live.runner.run_mpi_cell`: writes what
    :func:`emulator.emulation.mpi.mpi_run.run_in_session`
    writes (``results.json`` of kind mpirun, running then final), on the fake session, which must be up.

    ``exit``: cell id -> the program's exit status (default 0); ``interrupt``: cells Ctrl-C hits mid-run;
    ``crash``: cells whose run raises (mpirun's prepare failing, say); ``timeout``: cells stopped at their
    timeout.
    """

    def __init__(self, exit=None, interrupt=(), crash=(), timeout=(), flags=("uncalibrated",)):
        self.exit = dict(exit or {})
        self.interrupt, self.crash, self.timeout = set(interrupt), set(crash), set(timeout)
        self.flags = list(flags)
        self.calls: list[tuple[str, object]] = []

    def __call__(self, session, cell, out, *, config, echo):
        assert session.up, "an MPI cell on a session that is not up"
        assert os.listdir(out) == [], "an MPI cell runs from an empty directory"
        self.calls.append((cell.id, session))
        if cell.id in self.crash:
            raise RuntimeError("missing programs: mpirun: run `make setup`")
        topo = topology.build(cell.topology)
        hosts = rank_hosts(topo, cell.placement, cell.mpi.np, cell.seed)
        res = MpiResults(config={**cell.mpi_config(out).to_json(), **config},
                         ranks=[RankPlace(r, h, topo.host(h).ip) for r, h in enumerate(hosts)],
                         command=["nice", "-n", str(cell.mpi.nice), "mpirun", *cell.mpi.program],
                         link_mbps=topo.host_bw, datapath="user", bringup_s=session.bringup_s)
        path = os.path.join(out, "results.json")
        res.save(path)
        echo("fake mpirun started")
        res.fidelity = Fidelity(cpu_idle=0.3, datapath_load_mbps=40.0, datapath_capacity_mbps=400.0,
                                tcp_retransmits=2, flags=list(self.flags), trusted="over_capacity" not in self.flags)
        res.wall_s = 4.5
        if cell.id in self.interrupt:
            res.status, res.error = "interrupted", "interrupted"
            res.save(path)
            raise KeyboardInterrupt
        res.exit_status = self.exit.get(cell.id, 0)
        res.status = "ok" if res.exit_status == 0 else "failed"
        if cell.id in self.timeout:
            res.exit_status, res.status = 1, "timeout"
            res.error = f"the program ran past --timeout {cell.mpi.timeout_s:g} s and was stopped"
        if cell.mpi.bench_algorithm is not None:
            sizes = mpi_bench.parse_args(list(cell.mpi.program[1:])).sizes
            res.bench = [{"size": s, "count": s // 4, "time_s": s * 8 / 15e6, "algbw_mbps": 8.0 + i,
                          "busbw_mbps": 14.0 + i, "wrong": 0} for i, s in enumerate(sizes)]
            res.predictions = [{"size": s, "algorithm": "ring", "generator": "ring", "measured_s": s * 8 / 15e6,
                                "predicted_s": s * 8 / 16.5e6, "measured_over_predicted": 1.1, "note": ""}
                               for s in sizes]
        res.save(path)
        return res


def _runner(exp, out, mpi=None, **options):
    return runner.Runner(exp, str(out), session_factory=factory(**options), stream=io.StringIO(),
                         mpi_runner=mpi or FakeMpi())


def _doc(out, cid: str) -> dict:
    return json.loads((out / "cells" / cid / "results.json").read_text())


def test_mpi_cells_run_on_their_networks_session_between_its_replays(tmp_path):
    exp = parse(MIXED)
    FakeSession.started.clear()
    FakeSession.runs.clear()
    fake = FakeMpi()
    stream = io.StringIO()
    r = runner.Runner(exp, str(tmp_path), session_factory=factory(), stream=stream, mpi_runner=fake)
    s = r.run()
    assert s.status == "complete" and s.ran == IDS and not s.failed
    assert [cid for cid, _ in fake.calls] == IDS[1:] and FakeSession.runs == [IDS[0]]
    assert len(FakeSession.started) == 3  # one network per group: the MPI cells reuse their group's session
    assert fake.calls[0][1] is fake.calls[1][1]  # both BiGraph MPI cells ran on one session
    doc = _doc(tmp_path, IDS[1])
    assert doc["kind"] == "mpirun" and doc["status"] == "ok" and doc["config"]["cell"] == xp.expand(exp)[1].to_json()
    assert doc["config"]["experiment"] == "mixed" and doc["probe"]["passed"]
    assert [row["size"] for row in doc["bench"]] == [256 << 10, 1 << 20]
    states = json.loads((tmp_path / "state.json").read_text())["cells"]
    assert all(states[cid]["status"] == "ok" for cid in IDS)
    folder = ResultsFolder(str(tmp_path))
    assert all(folder.cell_finished(c) for c in xp.expand(exp))
    text = stream.getvalue()
    assert f"{IDS[1]}: MPI program exited 0 after 4.5 s, busbw 15.00 Mbit/s at 1MiB (measured/predicted 1.10)" in text
    assert "fake mpirun started" in (tmp_path / "run.log").read_text()  # the program's output goes to run.log
    plan = json.loads((tmp_path / "experiment.json").read_text())["cells"]
    assert plan[1]["predicted_time_s"] is None and plan[1]["prediction"].startswith("none: an MPI program")
    assert plan[1]["mpi"]["program"][0] == "emu-allreduce-bench" and plan[0]["predicted_time_s"] > 0


def test_a_program_that_exits_non_zero_fails_its_cell_and_the_run_goes_on(tmp_path):
    exp = parse(MIXED)
    fake = FakeMpi(exit={IDS[1]: 3}, crash={IDS[3]})
    s = _runner(exp, tmp_path, fake).run()
    assert s.status == "incomplete" and set(s.failed) == {IDS[1], IDS[3]}
    assert s.failed[IDS[1]] == "the program exited with status 3"
    assert s.failed[IDS[3]].startswith("RuntimeError: missing programs: mpirun")
    assert s.ran == [IDS[0], IDS[2], IDS[4]]
    states = json.loads((tmp_path / "state.json").read_text())["cells"]
    assert states[IDS[1]]["status"] == "failed" and states[IDS[2]]["status"] == "ok"
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "incomplete"

    # resume: only the failed cells run again, from empty directories
    again = FakeMpi()
    s2 = _runner(exp, tmp_path, again).run()
    assert s2.status == "complete" and sorted(s2.ran) == sorted([IDS[1], IDS[3]])
    assert sorted(s2.skipped) == sorted([IDS[0], IDS[2], IDS[4]])
    assert [cid for cid, _ in again.calls] == [IDS[1], IDS[3]]


def test_a_program_ended_by_a_signal_says_so(tmp_path):
    exp = parse(MIXED)
    s = _runner(exp, tmp_path, FakeMpi(exit={IDS[2]: -9})).run()
    assert s.failed == {IDS[2]: "the program was ended by signal 9"}
    md = open(report.write_report(str(tmp_path))).read()
    line = next(ln for ln in _section(md, "MPI programs").splitlines() if ln.startswith(f"| `{IDS[2]}`"))
    assert "| signal 9 |" in line


def test_a_program_stopped_at_its_timeout_fails_its_cell_and_the_report_says_so(tmp_path):
    exp = parse(MIXED)
    s = _runner(exp, tmp_path, FakeMpi(timeout={IDS[3]})).run()
    assert s.failed == {IDS[3]: "the program ran past --timeout 60 s and was stopped"}
    md = open(report.write_report(str(tmp_path))).read()
    line = next(ln for ln in _section(md, "MPI programs").splitlines() if ln.startswith(f"| `{IDS[3]}`"))
    assert "| 1 (timeout) |" in line
    with open(tmp_path / "cells.csv") as fh:
        row = next(r for r in csv.DictReader(fh) if r["id"] == IDS[3])
    assert (row["status"], row["outcome"], row["exit_status"]) == ("failed", "timeout", "1")


def test_ctrl_c_in_an_mpi_cell_leaves_it_interrupted_and_a_resume_runs_it_again(tmp_path):
    exp = parse(MIXED)
    s = _runner(exp, tmp_path, FakeMpi(interrupt={IDS[2]})).run()
    assert s.interrupted and s.ran == IDS[:2]
    states = json.loads((tmp_path / "state.json").read_text())["cells"]
    assert states[IDS[2]]["status"] == "interrupted" and IDS[3] not in states
    assert _doc(tmp_path, IDS[2])["status"] == "interrupted"
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "interrupted"
    assert not ResultsFolder(str(tmp_path)).cell_finished(xp.expand(exp)[2])

    again = FakeMpi()
    s2 = _runner(exp, tmp_path, again).run()
    assert s2.status == "complete" and s2.skipped == IDS[:2] and s2.ran == IDS[2:]
    assert [cid for cid, _ in again.calls] == IDS[2:]


def test_a_failed_probe_flags_the_mpi_cells_of_its_network(tmp_path):
    exp = parse(MIXED)
    s = _runner(exp, tmp_path, FakeMpi(flags=()), flags=(), probe_slowdowns=[1.6, 1.5, 1.0, 1.0]).run()
    assert s.status == "complete"
    bad = _doc(tmp_path, IDS[1])
    assert not bad["probe"]["passed"] and bad["trusted"] is False and "probe_failed" in bad["fidelity"]["flags"]
    good = _doc(tmp_path, IDS[3])
    assert good["probe"]["passed"] and good["trusted"] is True


def test_run_mpi_cell_refuses_a_session_that_is_not_a_replay_session(tmp_path):
    cell = xp.expand(parse(MIXED))[1]
    with pytest.raises(TypeError):
        runner.run_mpi_cell(FakeSession(topology.build(cell.topology), "bigraph"), cell, str(tmp_path),
                            config={}, echo=print)


# ------------------------------------------------------------- resume rule
def _mpi_doc(cell: xp.Cell, status: str = "ok") -> MpiResults:
    return MpiResults(config={"cell": cell.to_json()}, ranks=[], command=[], link_mbps=20.0, status=status,
                      exit_status=0 if status == "ok" else 1)


def test_an_mpi_cell_is_finished_only_with_ok_mpirun_results_of_exactly_that_cell(tmp_path):
    cells = xp.expand(parse(MIXED))
    replay, cell, other = cells[0], cells[1], cells[2]
    folder = ResultsFolder(str(tmp_path))
    os.makedirs(folder.cell_dir(cell))
    assert not folder.cell_finished(cell)
    for status in ("running", "failed", "timeout", "interrupted"):
        _mpi_doc(cell, status).save(folder.results_path(cell))
        assert not folder.cell_finished(cell), status
    _mpi_doc(other).save(folder.results_path(cell))  # another cell's results
    assert not folder.cell_finished(cell)
    changed = xp.expand(parse(MIXED.replace("nice: 10", "nice: 5")))[3]
    _mpi_doc(cells[3]).save(folder.results_path(changed))
    assert not folder.cell_finished(changed)  # the cell's definition changed in the file
    _mpi_doc(cell).save(folder.results_path(cell))
    assert folder.cell_finished(cell) and isinstance(folder.finished_results(cell), MpiResults)
    # neither kind counts for a cell of the other: the replay kind never reads an mpirun document as its own
    replay_kind, mpi_kind = DEFAULT_KINDS.of(replay), DEFAULT_KINDS.of(cell)
    assert (replay_kind.name, mpi_kind.name) == ("replay", "mpi")
    assert folder.results_of(cell, replay_kind) is None
    os.makedirs(folder.cell_dir(replay))
    CellResults(config={"cell": replay.to_json()}, status="ok").save(folder.results_path(replay))
    assert folder.results_of(replay, mpi_kind) is None and isinstance(folder.results_of(replay), CellResults)
    CellResults(config={"cell": cell.to_json()}, status="ok").save(folder.results_path(cell))
    assert folder.results_of(cell) is None and not folder.cell_finished(cell)  # a replay's document
    with open(folder.results_path(cell), "w") as fh:
        fh.write('{"kind": "mpirun", "ranks": [1]}')  # damaged
    assert folder.results_of(cell) is None and not folder.cell_finished(cell)


# ------------------------------------------------------------------ report
def _report(tmp_path, text=MIXED, **fake):
    out = tmp_path / "r"
    _runner(parse(text), out, FakeMpi(**fake)).run()
    md = open(report.write_report(str(out))).read()
    return out, md


def _section(md: str, heading: str) -> str:
    start = md.index(f"## {heading}")
    end = md.find("\n## ", start + 1)
    return md[start:end if end >= 0 else None]


def test_the_report_has_an_mpi_section_and_keeps_mpi_cells_out_of_every_model_comparison(tmp_path):
    out, md = _report(tmp_path, exit={IDS[4]: 3})
    mpi_md = _section(md, "MPI programs")
    for cid in IDS[1:]:
        assert f"`{cid}`" in mpi_md
    line = next(ln for ln in mpi_md.splitlines() if ln.startswith(f"| `{IDS[1]}`"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:] == ["`emu-allreduce-bench --algo ring --sizes 256KiB,1MiB`", "8", "identity", "0", "4.5",
                         "15.00 at 1MiB", f"{15 / (20 * topology.tcp_goodput_factor(9000)):.2f}", "1.10",
                         "trusted (uncalibrated)"]
    failed = next(ln for ln in mpi_md.splitlines() if ln.startswith(f"| `{IDS[4]}`"))
    assert "| 3 |" in failed
    assert "| 256KiB |" in mpi_md and "measured / model" in mpi_md
    # only the replay cell is in the model's tables and answers
    plan, rows = report.load_rows(str(out))
    assert [r.id for r in rows] == [IDS[0]]
    assert [r.id for r in report.load_mpi_rows(str(out))] == IDS[1:]
    for heading in ("Every cell: measured against the model", "Answers"):
        if f"## {heading}" in md:
            assert "mpi-" not in _section(md, heading), heading
    assert "mpi-" not in _section(md, "Speedup of bigraph + hdrm over every baseline")
    assert "**4 of 5 cells finished**, 1 failed" in md and "MPI programs: 4 cells" in md
    fid = _section(md, "Fidelity flags and failures")
    assert f"`{IDS[4]}`: failed: the program exited with status 3" in fid
    summary = json.loads((out / "summary.json").read_text())
    assert all(not any("mpi-" in c for c in a["cells"]) for a in summary["answers"])


def test_cells_csv_has_a_row_per_mpi_cell_with_the_columns_that_apply(tmp_path):
    out, _ = _report(tmp_path, exit={IDS[4]: 3})
    with open(out / "cells.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == IDS and list(rows[0]) == list(report.CSV_FIELDS)
    replay, bench, ecmp_failed = rows[0], rows[1], rows[4]
    assert replay["program"] == "" and replay["exit_status"] == "" and replay["ranks"] == "8"
    assert bench["program"] == "emu-allreduce-bench --algo ring --sizes 256KiB,1MiB" and bench["ranks"] == "8"
    assert bench["exit_status"] == "0" and bench["status"] == "ok" and bench["size"] == str(1 << 20)
    assert float(bench["busbw_mbps"]) == 15.0 and float(bench["time_s"]) == 4.5 and bench["trusted"] == "trusted"
    assert bench["predicted_time_s"] == "" and bench["collective"] == "" and bench["flags"] == "uncalibrated"
    assert ecmp_failed["status"] == "failed" and ecmp_failed["exit_status"] == "3" and ecmp_failed["ranks"] == "4"
    assert ecmp_failed["error"] == "the program exited with status 3"


def test_a_report_of_mpi_cells_only_has_no_busbw_sections(tmp_path):
    only = MIXED.replace(f"""      - topology: "{BIGRAPH}"
        routing: bigraph
        algorithms: [hdrm]
""", "")
    out, md = _report(tmp_path, only)
    assert "## MPI programs" in md and "**4 of 4 cells finished**" in md
    for heading in ("Speedup of", "Busbw against size", "Every cell", "Paper scale", "Answers"):
        assert f"## {heading}" not in md, heading
    assert (out / "report.html").exists()


def test_a_report_without_mpi_cells_has_no_mpi_section(tmp_path):
    no_mpi = MIXED[:MIXED.index(f"""      - topology: "{BIGRAPH}"
        routing: bigraph
        placements""")]  # the header and the replay run only
    _, md = _report(tmp_path, no_mpi)
    assert "## MPI programs" not in md and "MPI programs:" not in md and "**1 of 1 cells finished**" in md


def test_an_mpi_cell_not_run_yet_is_listed_as_such(tmp_path):
    out = tmp_path / "r"
    exp = parse(MIXED)

    def stop(cell_id, outcome):
        if cell_id == IDS[1]:
            raise KeyboardInterrupt

    runner.Runner(exp, str(out), session_factory=factory(), stream=io.StringIO(), mpi_runner=FakeMpi(),
                  after_cell=stop).run()
    rep = report.build(str(out))
    statuses = {r.id: r.status for r in rep.mpi_rows}
    assert statuses == {IDS[1]: "ok", IDS[2]: "not run", IDS[3]: "not run", IDS[4]: "not run"}
    md = rep.doc.markdown()
    assert "**2 of 5 cells finished**" in md and "Not run yet: 3 cells." in md
