"""Experiment files: validation with field-named errors, grid expansion; the runner's loop and resume (fake session)."""

from __future__ import annotations

import io
import json
import os

import pytest
import yaml
from fake_session import FakeSession, factory

from emulator.base.errors import FieldError, UserError
from emulator.cli import main as cli
from emulator.model import fabric, topology
from emulator.model.schedule.executor import execute
from emulator.runs.results import CellResults, Fidelity, Repetition
from emulator.study import experiment as xp
from emulator.study.experiment.grid import expand
from emulator.study.folder import results_folder
from emulator.study.folder.results_folder import ResultsFolder
from emulator.study.live import runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GOOD = """
name: t
link_mbps: 20
repeat: 1
warmup: 0
ecmp_seeds: [0, 3]
sizes: [64KiB, 256KiB]
series:
  - name: cmp
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: bigraph
        algorithms: [hdrm, hd]
        placements: [identity, random]
      - topology: "leafspine:leaves=2,spines=2,hosts_per_leaf=2"
        routing: [ecmp, dmodk]
        algorithms: [ring]
        sizes: [64KiB]
  - name: star
    sizes: [32KiB]
    runs:
      - topology: {kind: star, hosts: 4}
        routing: shortest
        algorithms: ring
"""


def parse(text: str, where: str = "experiments/x.yaml") -> xp.Experiment:
    return xp.from_dict(yaml.safe_load(text), where=where)


def test_good_file_expands_to_stable_ids():
    exp = parse(GOOD)
    cells = xp.expand(exp)
    ids = [c.id for c in cells]
    assert ids == [
        "cmp.bigraph-2x2x1.bigraph.hdrm.64KiB", "cmp.bigraph-2x2x1.bigraph.hdrm.256KiB",
        "cmp.bigraph-2x2x1.bigraph.hd.64KiB", "cmp.bigraph-2x2x1.bigraph.hd.256KiB",
        "cmp.bigraph-2x2x1.bigraph.hd-random.64KiB", "cmp.bigraph-2x2x1.bigraph.hd-random.256KiB",
        "cmp.leafspine-2x2x2.ecmp-s0.ring.64KiB", "cmp.leafspine-2x2x2.ecmp-s3.ring.64KiB",
        "cmp.leafspine-2x2x2.dmodk.ring.64KiB",
        "star.star-4.shortest.ring.32KiB",
    ]
    assert ids == [c.id for c in xp.expand(parse(GOOD))]  # stable
    c = cells[0]
    assert c.topology.endswith("bw=20") and c.hosts == 4 and c.placement == "hdrm" and c.repeat == 1
    assert cells[7].seed == 3 and cells[8].seed == 0
    groups = xp.groups(cells)
    f = cells[0].fabric.spec()
    assert [k for k, _ in groups] == [(cells[0].topology, "bigraph", 0, f), (cells[6].topology, "ecmp", 0, f),
                                      (cells[6].topology, "ecmp", 3, f), (cells[6].topology, "dmodk", 0, f),
                                      (cells[9].topology, "shortest", 0, f)]
    assert len(xp.prepare(exp)) == len(cells)


def test_the_fabric_profile_sets_the_link_rate_and_every_cell_records_it():
    exp = parse("fabric: {preset: roce100, dilation: 10000}\n"
                "series: [{name: s, runs: [{topology: 'star:hosts=2', routing: shortest, algorithms: [ring]}]}]")
    assert exp.fabric.dilation == 10000 and exp.link_mbps == 10
    cells = xp.expand(exp)
    assert cells[0].fabric == exp.fabric and ",bw=" not in cells[0].topology  # 10 Mbit/s, the default
    old = parse("link_mbps: 25\n"  # link_mbps alone: the default fabric, dilated onto that rate
                "series: [{name: s, runs: [{topology: 'star:hosts=2', routing: shortest, algorithms: [ring]}]}]")
    assert old.fabric.emulated_link_mbps == pytest.approx(25) and old.fabric.link_gbps == fabric.default().link_gbps
    assert exp.fingerprint() != old.fingerprint()
    named = parse("fabric: bandwidth-only\nlink_mbps: 25\n"  # a preset names the real fabric; link_mbps its dilation
                  "series: [{name: s, runs: [{topology: 'star:hosts=2', routing: shortest, algorithms: [ring]}]}]")
    assert named.fabric.preset == "bandwidth-only" and named.fabric.emulated_link_mbps == pytest.approx(25)
    pc = xp.prepare(exp)[0]
    assert pc.report.latency.profile == exp.fabric and pc.report.real_time_s == pytest.approx(pc.predicted_s / 1e4)


def test_defaults():
    exp = parse("series: [{name: s, runs: [{topology: 'star:hosts=2', routing: shortest, algorithms: [ring]}]}]")
    assert (exp.name, exp.link_mbps, exp.repeat, exp.warmup, exp.ecmp_seeds, exp.sizes) == \
        ("experiment", fabric.default().emulated_link_mbps, 2, 1, (0,), (1 << 20,))
    assert dict(exp.reference) == {"algorithm": "hdrm", "routing": "bigraph"}


@pytest.mark.parametrize("patch, field", [
    ({"colour": 1}, "colour"),
    ({"repeat": 0}, "repeat"),
    ({"warmup": -1}, "warmup"),
    ({"link_mbps": 5000}, "link_mbps"),
    ({"ecmp_seeds": [0, -1]}, "ecmp_seeds[1]"),
    ({"sizes": ["64KiB", "1Mb"]}, "sizes[1]"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"reference": {"algo": "hdrm"}}, "reference.algo"),
    ({"series": []}, "series"),
    ({"fabric": "roce9000"}, "fabric.preset"),
    ({"fabric": {"alpha_us": -1}}, "fabric.alpha_us"),
    ({"fabric": "dilation=10"}, "fabric.dilation"),
    ({"fabric": 7}, "fabric"),
    ({"fabric": "preset=roce100,dilation=5000", "link_mbps": 10}, "link_mbps"),
    ({"max_time": "soon"}, "max_time"),
    ({"max_time": -5}, "max_time"),
    ({"max_time": True}, "max_time"),
])
def test_bad_top_level_fields_are_named(patch, field):
    data = yaml.safe_load(GOOD)
    data.update(patch)
    with pytest.raises(FieldError) as exc:
        xp.from_dict(data, where="experiments/x.yaml")
    assert exc.value.field == field
    assert str(exc.value).startswith(f"experiments/x.yaml: field '{field}': expected")


@pytest.mark.parametrize("path, value, field", [
    (("series", 1, "sizes", 0), "huge", "series[1].sizes[0]"),
    (("series", 0, "runs", 0, "routing"), "ecmp-ish", "series[0].runs[0].routing[0]"),
    (("series", 0, "runs", 1, "routing"), ["ecmp", "bigraph"], "series[0].runs[1].routing[1]"),
    (("series", 0, "runs", 0, "algorithms"), ["hdrm", "magic"], "series[0].runs[0].algorithms[1]"),
    (("series", 0, "runs", 1, "algorithms"), ["hdrm"], "series[0].runs[1].algorithms[0]"),
    (("series", 0, "runs", 0, "topology"), "fattree:k=3", "series[0].runs[0].topology.k"),
    (("series", 0, "runs", 0, "topology"), "torus:n=4", "series[0].runs[0].topology.kind"),
    (("series", 0, "runs", 0, "placements"), ["hdrm-ish"], "series[0].runs[0].placements[0]"),
    (("series", 0, "runs", 1, "placements"), ["hdrm"], "series[0].runs[1].placements[0]"),
    (("series", 0, "runs", 0, "seeds"), ["x"], "series[0].runs[0].seeds[0]"),
    (("series", 0, "runs", 0, "tpology"), "x", "series[0].runs[0].tpology"),
    (("series", 1, "name"), "cmp", "series[1].name"),
    (("series", 1, "name"), "a b", "series[1].name"),
])
def test_bad_nested_fields_are_named(path, value, field):
    data = yaml.safe_load(GOOD)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(FieldError) as exc:
        xp.from_dict(data, where="experiments/x.yaml")
    assert exc.value.field == field, str(exc.value)
    assert str(exc.value).startswith(f"experiments/x.yaml: field '{field}'")


@pytest.mark.parametrize("value, seconds", [(None, None), ("45m", 2700.0), (2700, 2700.0), ("1.5h", 5400.0)])
def test_a_file_says_how_long_it_may_run(value, seconds):
    data = yaml.safe_load(GOOD)
    if value is not None:
        data["max_time"] = value
    assert xp.from_dict(data, where="experiments/x.yaml").max_time_s == seconds


def test_the_files_max_time_is_the_runs_limit_unless_the_command_line_gives_one(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text(GOOD + "max_time: 1s\n")
    assert cli.main(["run", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "field 'max-time': expected a run predicted within --max-time 1 s" in err and "max_time" in err
    assert cli.main(["run", str(path), "--check", "--max-time", "2h"]) == 0
    path.write_text(GOOD + "max_time: 2h\n")
    assert cli.main(["run", str(path), "--check"]) == 0
    assert cli.main(["run", str(path), "--check", "--max-time", "1s"]) == 2


def test_missing_keys_and_duplicate_cells():
    with pytest.raises(FieldError, match="field 'series': .*got nothing"):
        parse("name: x")
    with pytest.raises(FieldError, match=r"field 'series\[0\].runs\[0\].algorithms'.*got nothing"):
        parse("series: [{name: s, runs: [{topology: 'star:hosts=2', routing: shortest}]}]")
    dup = ("series: [{name: s, runs: [{topology: 'star:hosts=2', routing: shortest, algorithms: [ring]}, "
           "{topology: 'star:hosts=2', routing: shortest, algorithms: [ring, hd]}]}]")
    with pytest.raises(FieldError, match=r"field 'series\[0\].runs\[1\]'.*s.star-2.shortest.ring.1MiB"):
        parse(dup)


def test_size_that_does_not_split_is_a_field_error_of_the_cell():
    exp = parse("series: [{name: s, runs: [{topology: 'star:hosts=3', routing: shortest, algorithms: [ring], "
                "sizes: [101B]}]}]")
    with pytest.raises(FieldError, match=r"field 'series\[0\].runs\[0\]'.*s.star-3.shortest.ring.101B"):
        xp.prepare(exp)


def test_shipped_experiment_files_are_valid():
    for name in ("default", "tiny"):
        exp = xp.load(os.path.join(ROOT, "experiments", f"{name}.yaml"))
        assert xp.prepare(exp)
    default = xp.load(os.path.join(ROOT, "experiments", "default.yaml"))
    cells = xp.expand(default)
    sizes = sorted({c.size for c in cells if c.series == "topology"})
    assert len(sizes) >= 3 and sizes[-1] >= 16 * sizes[0]  # from latency-bound to bandwidth-bound
    combos = {(c.kind, c.routing, c.algorithm) for c in cells}
    for kind in ("leafspine", "fattree"):
        for policy in ("ecmp", "dmodk"):
            for algo in ("ring", "hd", "dbtree"):
                assert (kind, policy, algo) in combos
    assert ("bigraph", "bigraph", "hdrm") in combos and any(c.kind == "star" for c in cells)
    assert len({c.seed for c in cells if c.routing == "ecmp"}) >= 2
    assert {c.hosts for c in cells if c.algorithm == "hdrm" and not c.topology.count("servers")} == {8, 16, 32, 64}
    designs = {c.topology.split("nics_per_server=")[1].split(",")[0] for c in cells if c.series == "server"}
    assert designs == {"1", "4"}  # question 1: a shared NIC against one per accelerator


def test_cli_check_and_bad_file(tmp_path, capsys):
    assert cli.main(["run", os.path.join(ROOT, "experiments", "tiny.yaml"), "--check"]) == 0
    assert "3 cells on 1 networks" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("sizes: [32KiB]", "sizes: [32KB, lots]"))
    assert cli.main(["run", str(bad), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"emu: {bad}: field 'series[1].sizes[1]': expected a positive size such as 65536, "
                           "64KiB, 16MiB, 1GiB or 1MB, got 'lots'")
    bad.write_text("series: [unclosed")
    assert cli.main(["run", str(bad), "--check"]) == 2
    assert "not valid YAML" in capsys.readouterr().err


# ------------------------------------------------------------- resume
TINY = """
name: t
repeat: 1
warmup: 0
sizes: [16KiB]
series:
  - name: s
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: bigraph
        algorithms: [hdrm, ring]
      - topology: "star:hosts=4"
        routing: shortest
        algorithms: [ring, hd]
"""


def _runner(exp, out, **options):
    hook = options.pop("after_cell", None)
    return runner.Runner(exp, str(out), session_factory=factory(**options), stream=io.StringIO(), after_cell=hook)


def test_run_then_resume_skips_finished_cells(tmp_path):
    exp = parse(TINY)
    FakeSession.started.clear()
    FakeSession.runs.clear()
    r = _runner(exp, tmp_path)
    s = r.run()
    assert s.status == "complete" and len(s.ran) == 4 and not s.skipped
    assert len(FakeSession.started) == 2  # one network per (topology, routing, seed)
    stat = os.stat(tmp_path / "cells" / s.ran[0] / "results.json").st_mtime_ns
    FakeSession.started.clear()
    FakeSession.runs.clear()
    s2 = _runner(exp, tmp_path).run()
    assert s2.status == "complete" and s2.skipped == s.ran and not s2.ran
    assert FakeSession.started == [] and FakeSession.runs == []  # no network for finished groups
    assert os.stat(tmp_path / "cells" / s.ran[0] / "results.json").st_mtime_ns == stat
    log = (tmp_path / "run.log").read_text()
    assert log.count("skipped ") == 4
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "complete"


def test_interrupt_keeps_finished_cells_and_resume_runs_only_the_rest(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    FakeSession.runs.clear()

    def stop_after_first(cell_id, outcome):
        raise KeyboardInterrupt

    s = _runner(exp, tmp_path, after_cell=stop_after_first).run()
    assert s.interrupted and s.ran == [ids[0]]
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "interrupted"
    assert ResultsFolder(str(tmp_path)).cell_finished(xp.expand(exp)[0])
    FakeSession.runs.clear()
    s2 = _runner(exp, tmp_path).run()
    assert s2.skipped == [ids[0]] and s2.ran == ids[1:] and FakeSession.runs == ids[1:]


def test_interrupt_inside_a_cell_and_failures_are_retried(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    s = _runner(exp, tmp_path, fail={ids[0]}, interrupt={ids[1]}).run()
    assert s.interrupted and s.failed == {ids[0]: "RuntimeError: rank 3 did not report 'done' within 30 s: "
                                                  "agent hung"}
    state = json.loads((tmp_path / "state.json").read_text())["cells"]
    assert state[ids[0]]["status"] == "failed" and state[ids[1]]["status"] == "interrupted"
    s2 = _runner(exp, tmp_path, fail={ids[3]}).run()
    assert s2.ran == ids[:3] and list(s2.failed) == [ids[3]] and s2.status == "incomplete"
    FakeSession.runs.clear()
    s3 = _runner(exp, tmp_path).run()
    assert s3.ran == [ids[3]] and s3.status == "complete" and FakeSession.runs == [ids[3]]


def test_changed_cell_configuration_is_run_again(tmp_path):
    exp = parse(TINY)
    _runner(exp, tmp_path).run()
    changed = parse(TINY.replace("repeat: 1", "repeat: 2"))
    s = _runner(changed, tmp_path).run()
    assert not s.skipped and len(s.ran) == 4


def test_bring_up_failure_fails_the_group_only(tmp_path):
    exp = parse(TINY)

    class Broken(FakeSession):
        def start(self):
            if self.topo.kind == "star":
                raise RuntimeError("ovs-vsctl add-br failed")
            super().start()

    r = runner.Runner(exp, str(tmp_path), session_factory=Broken, stream=io.StringIO())
    s = r.run()
    assert len(s.ran) == 2 and len(s.failed) == 2
    assert all("bring-up failed: ovs-vsctl" in e for e in s.failed.values())


def test_results_folders(tmp_path):
    exp = parse(TINY)
    root = str(tmp_path)
    assert results_folder.find_unfinished(root, exp) is None
    a = results_folder.new_out_dir(root, "t")
    os.makedirs(a)
    r = _runner(exp, a, after_cell=lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    r.run()
    assert results_folder.find_unfinished(root, exp) == a
    assert results_folder.find_unfinished(root, parse(TINY.replace("16KiB", "32KiB"))) is None
    results_folder.point_latest(root, a)
    assert os.readlink(os.path.join(root, "latest")) == os.path.basename(a)
    _runner(exp, a).run()
    assert results_folder.find_unfinished(root, exp) is None


def test_user_error_for_foreign_out_dir(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"fingerprint": "other"}))
    assert cli.main(["run", os.path.join(ROOT, "experiments", "tiny.yaml"), "--out", str(out)]) == 2
    assert "field 'out'" in capsys.readouterr().err
    with pytest.raises(UserError):
        xp.load(str(tmp_path / "missing.yaml"))


# ------------------------------------------------------------------ network probe
def _results(out, cell_id):
    return json.loads((out / "cells" / cell_id / "results.json").read_text())


def _only_the_model_flags(res) -> bool:
    """No flag but ``model_disagrees``: the network is fine. (The fake session stretches max-min step times, which
    puts a ring cell at 1.4 times the model's time, outside the replay's band.)"""
    return set(res["flags"]) <= {"model_disagrees"} and not res["unchecked"]


def test_a_network_that_passes_its_probe_runs_its_cells_trusted(tmp_path):
    exp = parse(TINY)
    FakeSession.started.clear()
    FakeSession.probes.clear()
    s = _runner(exp, tmp_path, flags=(), probe_slowdowns=[1.05, 1.0]).run()
    assert s.status == "complete" and len(FakeSession.started) == 2 and len(FakeSession.probes) == 2
    res = _results(tmp_path, s.ran[0])
    assert res["probe"]["passed"] and res["probe"]["ratio"] == pytest.approx(1.05)
    assert res["trusted"] and "probe_failed" not in res["repetitions"][0]["fidelity"]["flags"]
    attempts = [json.loads((d / "probe.json").read_text())["attempts"] for d in (tmp_path / "sessions").iterdir()]
    assert sorted(len(a) for a in attempts) == [1, 1]


def test_a_network_that_fails_its_probe_once_is_rebuilt_and_then_trusted(tmp_path):
    exp = parse(TINY)
    FakeSession.started.clear()
    FakeSession.probes.clear()
    s = _runner(exp, tmp_path, flags=(), probe_slowdowns=[1.6, 1.02, 1.0]).run()
    assert s.status == "complete"
    first_net = FakeSession.started[0]
    assert FakeSession.started[:2] == [first_net, first_net] and len(FakeSession.started) == 3  # rebuilt once
    res = _results(tmp_path, s.ran[0])
    assert res["probe"]["passed"] and res["trusted"]
    assert "rebuilding" in (tmp_path / "run.log").read_text()


def test_a_network_that_fails_its_probe_twice_flags_its_cells_probe_failed(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    FakeSession.started.clear()
    s = _runner(exp, tmp_path, flags=(), probe_slowdowns=[1.6, 1.5, 1.0]).run()
    assert s.status == "complete" and len(FakeSession.started) == 3
    bad, good = _results(tmp_path, ids[0]), _results(tmp_path, ids[2])  # first network's cell, second's
    assert not bad["probe"]["passed"] and "1.50x its prediction" in bad["probe"]["reason"]
    assert bad["trusted"] is False
    assert all("probe_failed" in r["fidelity"]["flags"] and not r["fidelity"]["trusted"]
               for r in bad["repetitions"])
    assert _only_the_model_flags(good) and good["probe"]["passed"]
    from emulator.study import report

    _, rows = report.load_rows(str(tmp_path))
    flagged = {r.id for r in rows if "probe_failed" in r.flags}
    assert flagged == {ids[0], ids[1]} and all(r.trusted is False for r in rows if r.id in flagged)


def test_a_probe_that_crashes_counts_as_failed():
    from emulator.runs import network_probe as probe

    def rep(correct=True, fidelity=None):
        return Repetition(rep=0, time_s=0.5, algbw_mbps=1.0, busbw_mbps=1.0, correct=correct, fidelity=fidelity)

    verdict = probe.judge(CellResults(status="failed", error="rank 1 hung"), 0.5, ("h1", "h4"))
    assert not verdict.passed and "rank 1 hung" in verdict.reason and verdict.measured_s is None
    wrong = probe.judge(CellResults(status="ok", repetitions=[rep(correct=False)]), 0.5, ("h1", "h4"))
    assert not wrong.passed and "wrong data" in wrong.reason
    saturated = Fidelity(cpu_idle=0.0, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0, flags=["cpu_saturated"],
                         trusted=False)
    untrusted = probe.judge(CellResults(status="ok", repetitions=[rep(fidelity=saturated)]), 0.5, ("h1", "h4"))
    assert not untrusted.passed and "cpu_saturated" in untrusted.reason
    # a fabric whose latency target is below this machine's own is no unhealthy network
    floor = Fidelity(cpu_idle=0.5, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0, flags=["latency_floor"],
                     trusted=False)
    assert probe.judge(CellResults(status="ok", repetitions=[rep(fidelity=floor)]), 0.5, ("h1", "h4")).passed


def test_the_probe_crosses_the_longest_path():
    from emulator.model import topology
    from emulator.runs import network_probe as probe

    topo = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")
    a, b = probe.probe_pair(topo)
    assert a == topo.hosts[0].name and topo.switch_hops(a, b) == 3
    ft = topology.build("fattree:k=4")
    assert ft.switch_hops(*probe.probe_pair(ft)) == 5
    sched = probe.schedule(ft)
    assert sched.p == 2 and [r.host for r in sched.ranks] == list(probe.probe_pair(ft))


def test_run_json_accumulates_wall_time_over_resumes(tmp_path):
    exp = parse(TINY)
    ticks = iter(range(0, 10_000, 5))
    clock = lambda: float(next(ticks))  # noqa: E731 -- each call 5 s later
    r = runner.Runner(exp, str(tmp_path), session_factory=factory(), stream=io.StringIO(), clock=clock,
                      after_cell=lambda cid, outcome: (_ for _ in ()).throw(KeyboardInterrupt))
    r.run()
    first = json.loads((tmp_path / "run.json").read_text())["wall_s"]
    assert first > 0
    runner.Runner(exp, str(tmp_path), session_factory=factory(), stream=io.StringIO(), clock=clock).run()
    assert json.loads((tmp_path / "run.json").read_text())["wall_s"] > first


# ---------------------------------------------------------- per-series fabric
SERIES_FABRIC = """
name: sf
fabric: roce100
repeat: 1
warmup: 0
sizes: [64KiB]
series:
  - name: fast
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: bigraph
        algorithms: [hdrm]
  - name: slow
    link_mbps: 5
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: bigraph
        algorithms: [hdrm]
      - topology: "star:hosts=4"
        routing: shortest
        algorithms: [hd]
        link_mbps: 2
"""


def test_a_series_or_run_can_emulate_at_its_own_dilation():
    exp = parse(SERIES_FABRIC)
    fast, slow, slower = xp.expand(exp)
    assert fast.topology.endswith("bw=20") and slow.topology.endswith("bw=5") and slower.topology.endswith("bw=2")
    assert slow.fabric.dilation == 20000 and slower.fabric.dilation == 50000
    assert slow.fabric.link_gbps == 100  # the same real fabric, dilated further
    assert fast.id == "fast.bigraph-2x2x1.bigraph.hdrm.64KiB" and slow.id == "slow.bigraph-2x2x1.bigraph.hdrm.64KiB"
    assert len(xp.groups([fast, slow, slower])) == 3
    pcs = {pc.cell.id: pc for pc in xp.prepare(exp)}
    pf, ps = pcs[fast.id], pcs[slow.id]
    assert ps.report.latency.profile.dilation == 20000
    # the same real allreduce: the same real time (within the frame arithmetic), 4x the emulated time
    assert ps.report.real_time_s == pytest.approx(pf.report.real_time_s, rel=0.02)
    assert ps.predicted_s == pytest.approx(4 * pf.predicted_s, rel=0.02)
    assert xp.profiles(exp) == [c.fabric for c in (fast, slow, slower)]


@pytest.mark.parametrize("edit, field", [
    (("    link_mbps: 5\n", "    link_mbps: 5000\n"), "series[1].link_mbps"),
    (("    link_mbps: 5\n", "    fabric: {preset: roce100, dilation: 5000}\n    link_mbps: 5\n"), "series[1].link_mbps"),
    (("        link_mbps: 2\n", "        fabric: {dilation: -1}\n"), "series[1].runs[1].fabric.dilation"),
])
def test_bad_series_or_run_fabric_names_its_field(edit, field):
    with pytest.raises(FieldError) as info:
        parse(SERIES_FABRIC.replace(*edit))
    assert info.value.field == field


def second_start_fails(make):
    """A session factory whose second session does not come up (``ovs-vsctl: timed out``): a rebuild that fails."""
    made = []

    def flaky(topo, policy, **kw):
        session = make(topo, policy, **kw)
        made.append(session)
        if len(made) == 2:
            session.start = lambda: (_ for _ in ()).throw(RuntimeError("ovs-vsctl: timed out"))
        return session
    return flaky


def test_a_rebuild_that_does_not_come_up_fails_that_networks_cells_and_the_run_goes_on(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    flaky = second_start_fails(factory(flags=(), probe_slowdowns=[1.6, 1.0]))  # the rebuild of the first network
    s = runner.Runner(exp, str(tmp_path), session_factory=flaky, stream=io.StringIO()).run()
    assert sorted(s.failed) == sorted(ids[:2]) and s.ran == ids[2:]
    assert all("rebuild after a failed probe failed: ovs-vsctl: timed out" in e for e in s.failed.values())


def test_the_console_lines_of_a_run(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    stream = io.StringIO()
    runner.Runner(exp, str(tmp_path), session_factory=factory(fail={ids[3]}), stream=stream).run()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[------------------------] 0/4 cells, 2 networks to bring up, ETA ")
    assert lines[1] == "network 1/2: bigraph:upper=2,lower=2,hosts_per_switch=1,bw=20 (bigraph), 2 cells"
    assert lines[2].startswith("[######------------------] 1/4 ETA ") and f"  {ids[0]}: busbw " in lines[2]
    assert "[fidelity" not in lines[2]  # "uncalibrated" alone is not worth a mention
    assert lines[4] == "network 2/2: star:hosts=4,bw=20 (shortest), 2 cells"
    assert lines[6].startswith("[########################] 4/4 ETA 0s  ") and lines[6].endswith(
        f"{ids[3]}: FAILED (RuntimeError: rank 3 did not report 'done' within 30 s: agent hung)")
    assert len(lines) == 7
    stream = io.StringIO()
    runner.Runner(exp, str(tmp_path), session_factory=factory(), stream=stream).run()
    again = stream.getvalue().splitlines()
    assert again[0] == f"resuming {tmp_path}: 3 of 4 cells finished before, skipped"
    assert again[1].startswith("[##################------] 3/4 cells, 1 networks to bring up, ETA ")
    assert again[2] == "network 1/1: star:hosts=4,bw=20 (shortest), 1 cells" and len(again) == 4


def test_a_session_that_returns_without_an_ok_result_fails_the_cell_with_its_error(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]

    class Quiet(FakeSession):
        def run(self, schedule, out, **kw):
            res = super().run(schedule, out, **kw)
            if "cell" in (kw.get("config") or {}) and kw["config"]["cell"]["id"] == ids[1]:
                res.status, res.error = "failed", "rank 2 computed wrong data"
                res.save(os.path.join(out, "results.json"))
            if "cell" in (kw.get("config") or {}) and kw["config"]["cell"]["id"] == ids[2]:
                os.unlink(os.path.join(out, "results.json"))
            return res

    s = runner.Runner(exp, str(tmp_path), session_factory=Quiet, stream=io.StringIO()).run()
    assert s.failed == {ids[1]: "rank 2 computed wrong data", ids[2]: "status None"}
    assert s.ran == [ids[0], ids[3]] and s.status == "incomplete"
    state = json.loads((tmp_path / "state.json").read_text())["cells"]
    assert state[ids[1]]["status"] == "failed" and state[ids[1]]["error"] == "rank 2 computed wrong data"


# ------------------------------------------------- after a failed cell
def test_after_a_failed_cell_the_network_is_probed_again_and_rebuilt_when_it_fails(tmp_path):
    """A failed cell may leave its network broken: the probe runs again before the next cell; failing, the network
    is rebuilt and the next cell runs on the new one (trusted: the rebuilt network passed)."""
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    FakeSession.started.clear()
    FakeSession.runs.clear()
    FakeSession.probes.clear()
    s = _runner(exp, tmp_path, flags=(), fail={ids[0]}, probe_slowdowns=[1.0, 1.6, 1.0, 1.0]).run()
    assert sorted(s.failed) == [ids[0]] and s.ran == ids[1:]
    assert len(FakeSession.probes) == 4 and len(FakeSession.started) == 3  # first network twice, then the second
    log = (tmp_path / "run.log").read_text()
    assert f"probe of bigraph:upper=2,lower=2,hosts_per_switch=1,bw=20 (bigraph, seed 0) after the failed cell " \
           f"{ids[0]}, attempt 1: the probe took 1.60x its prediction" in log
    assert f"rebuilding bigraph:upper=2,lower=2,hosts_per_switch=1,bw=20 (bigraph, seed 0) after the failed cell " \
           f"{ids[0]}" in log
    assert log.index(f"failed {ids[0]}") < log.index("rebuilding") < log.index(f"ran {ids[1]}")
    after = json.loads((tmp_path / "sessions" / "bigraph-2x2x1.bigraph-s0" / f"after-{ids[0]}" /
                        "probe.json").read_text())
    assert [a["passed"] for a in after["attempts"]] == [False, True]
    first = json.loads((tmp_path / "sessions" / "bigraph-2x2x1.bigraph-s0" / "probe.json").read_text())
    assert [a["passed"] for a in first["attempts"]] == [True]  # the network's first probe is kept
    res = json.loads((tmp_path / "cells" / ids[1] / "results.json").read_text())
    assert res["probe"]["passed"] and _only_the_model_flags(res)


def test_after_a_failed_cell_a_network_that_passes_its_probe_is_kept(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    FakeSession.started.clear()
    FakeSession.probes.clear()
    s = _runner(exp, tmp_path, flags=(), fail={ids[0]}).run()
    assert sorted(s.failed) == [ids[0]] and s.ran == ids[1:]
    assert len(FakeSession.probes) == 3 and len(FakeSession.started) == 2
    assert "rebuilding" not in (tmp_path / "run.log").read_text()


def test_a_failed_last_cell_of_a_network_costs_no_probe(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    FakeSession.probes.clear()
    s = _runner(exp, tmp_path, flags=(), fail={ids[1], ids[3]}).run()
    assert sorted(s.failed) == sorted([ids[1], ids[3]])
    assert len(FakeSession.probes) == 2


def test_a_rebuild_after_a_failed_cell_that_does_not_come_up_fails_the_cells_left(tmp_path):
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    flaky = second_start_fails(factory(flags=(), fail={ids[0]}, probe_slowdowns=[1.0, 1.6]))  # the rebuild after it
    s = runner.Runner(exp, str(tmp_path), session_factory=flaky, stream=io.StringIO()).run()
    assert sorted(s.failed) == sorted(ids[:2]) and s.ran == ids[2:]
    assert s.failed[ids[1]] == f"network rebuild after the failed cell {ids[0]} failed: ovs-vsctl: timed out"


def test_a_network_broken_under_a_cell_that_finished_flags_it_and_is_rebuilt_before_the_next(tmp_path):
    """The controller died (or Open vSwitch restarted) under a cell that still finished: the cell is flagged
    network_damaged (not trusted), and the network is rebuilt before the next cell, which runs trusted."""
    exp = parse(TINY)
    ids = [c.id for c in xp.expand(exp)]
    FakeSession.started.clear()
    FakeSession.probes.clear()
    stream = io.StringIO()
    s = runner.Runner(exp, str(tmp_path), session_factory=factory(flags=(), damaging={ids[0]}), stream=stream).run()
    assert s.ran == ids and not s.failed
    assert len(FakeSession.started) == 3  # the first network, its rebuild, the second network
    first = json.loads((tmp_path / "cells" / ids[0] / "results.json").read_text())
    assert not first["trusted"] and "network_damaged" in first["repetitions"][0]["fidelity"]["flags"]
    assert first["probe"]["passed"]  # the probe it ran after is kept
    second = json.loads((tmp_path / "cells" / ids[1] / "results.json").read_text())
    assert _only_the_model_flags(second)
    log = (tmp_path / "run.log").read_text()
    assert f"after the cell {ids[0]}: its controller exited (killed)" in log
    assert log.index("its controller exited") < log.index("rebuilding") < log.index(f"ran {ids[1]}")
    assert "network broken (its controller exited (killed)): rebuilding it" in stream.getvalue()


def test_a_spec_with_a_rate_of_its_own_keeps_it_and_one_without_takes_the_fabrics():
    assert topology.sets_link_rate("star:hosts=2,host_bw=5") and topology.sets_link_rate({"kind": "star", "bw": 5})
    assert not topology.sets_link_rate("star:hosts=2,pcie_bw=5")
    exp = xp.from_dict({"link_mbps": 20, "series": [{"name": "s", "runs": [
        {"topology": "leafspine:leaves=2,spines=2,hosts_per_leaf=2", "routing": "dmodk", "algorithms": ["ring"]},
        {"topology": "leafspine:leaves=2,spines=2,hosts_per_leaf=2,host_bw=5", "routing": "dmodk",
         "algorithms": ["ring"]}]}]})
    plain, own = (topology.build(r.topology) for r in exp.series[0].runs)
    assert plain.host_bw == plain.switch_bw == 20
    # the experiment names its dilation (link_mbps): the spec's rate is kept, the links it leaves unset take the
    # fabric's (emulator.model.fabric.resolve, as emu replay, emu mpirun and emu schedule check do)
    assert own.host_bw == 5 and own.switch_bw == 20
    assert exp.series[0].runs[1].fabric is None


def test_a_spec_with_a_rate_of_its_own_sets_the_dilation_where_no_level_names_it():
    exp = xp.from_dict({"series": [{"name": "s", "runs": [
        {"topology": "leafspine:leaves=2,spines=2,hosts_per_leaf=2,host_bw=5", "routing": "dmodk",
         "algorithms": ["ring"]}]}]})
    (run,) = exp.series[0].runs
    own = topology.build(run.topology)
    assert own.host_bw == own.switch_bw == 5
    assert run.fabric is not None and run.fabric.emulated_link_mbps == 5
    assert run.fabric.dilation == fabric.default().dilation_for(5)  # the same real fabric, dilated onto 5 Mbit/s
    assert run.fabric.link_gbps == fabric.default().link_gbps


LLM_RUN = ("series: [{{name: s, runs: [{{topology: 'star:hosts=8,servers=2,accels_per_server=4,nics_per_server=4', "
           "routing: shortest, algorithms: [ring], model: llama2-7b{extra}}}]}}]")


def test_a_language_model_run_takes_its_split_and_names_it_in_its_cells():
    exp = parse(LLM_RUN.format(extra=", scale: 1000, llm: {tp: 2, pp: 2, microbatches: 2, accelerator: h100}"))
    (run,) = exp.series[0].runs
    w = run.workload
    assert w is not None and w.is_llm and (w.tp, w.pp, w.dp(8), w.microbatches) == (2, 2, 2, 2)
    assert run.placements == ("megatron",) and w.slug == "llama2-7b-t2p2m2-h100-s1000"
    assert xp.Workload(**json.loads(json.dumps(w.__dict__))) == w  # a plan entry reads back


@pytest.mark.parametrize("extra, field", [
    ("", "llm"),
    (", llm: {tp: 3, pp: 2}", "llm.pp"),
    (", llm: {tp: 2, pp: 2, colour: red}", "llm.colour"),
    (", llm: {tp: 2, pp: 2, accelerator: tpu}", "llm.accelerator"),
    (", llm: {tp: 2, pp: 2, ep: 2}", "llm.ep"),
    (", llm: {tp: 2, pp: 2}, placements: [identity]", "placements"),
])
def test_a_bad_language_model_run_is_named(extra, field):
    with pytest.raises(FieldError, match=rf"field 'series\[0\]\.runs\[0\]\.{field}'"):
        parse(LLM_RUN.format(extra=extra))


def test_llm_beside_a_data_parallel_model_is_refused():
    with pytest.raises(FieldError, match=r"runs\[0\]\.llm'"):
        parse(LLM_RUN.replace("llama2-7b", "resnet50").format(extra=", llm: {tp: 2}"))


def test_a_language_model_cell_builds_its_iteration():
    exp = parse(LLM_RUN.format(extra=", scale: 1000, llm: {tp: 2, pp: 2, microbatches: 2, layers_per_collective: 16, "
                                     "accelerator: h100}"))
    (cell,) = expand(exp)
    schedule = cell.schedule(topology.build(cell.topology))
    assert schedule.meta["generator"] == "llm" and schedule.meta["scale"] == 1000
    assert {seg.name.split()[0] for seg in schedule.segments} == {"tp", "pp", "dp"}
    assert execute(schedule).valid
