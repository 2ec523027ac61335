"""Replay over real TCP: HDRM on BiGraph near line rate, hd on an ECMP leaf-spine slower, a killed agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from emulator.base.naming import BRIDGE_RE
from emulator.emulation.machine.started import all_runs
from emulator.emulation.machine.system import run
from emulator.emulation.session.replay import ReplayConfig, ReplaySession, prepare, replay
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.prediction.check import check
from emulator.model.schedule import format as sformat

from .measured import band, step_time

pytestmark = pytest.mark.integration

BIGRAPH = "bigraph:upper=4,lower=4,hosts_per_switch=2"
LEAFSPINE = "leafspine:leaves=4,spines=4,hosts_per_leaf=4"
#: Issue 5's target, held where the run is bandwidth-bound (16 MiB per rank:
#: 25 s at 10 Mbit/s), by the median of three repetitions. Measured here with
#: the agents' rendezvous protocol: 0.96-0.99 in every repetition. (Before it,
#: one repetition in three collapsed to 0.68-0.78: a rank running late let its
#: partners' next messages reach it during the current one, two flows met at a
#: switch port, and the lateness fed itself through the lockstep rounds.)
HDRM_MIN_BUSBW = 0.85
BANDWIDTH_BOUND_SIZE = 16 << 20
SIZE = 4 << 20
#: measured/predicted time, the documented accuracy widened by the spread measured here (docs/testing-accuracy.md):
#: hdrm at 4 MiB on BiGraph ran 1.04-1.18x the model over 4 runs with other jobs on the machine; hd on the
#: colliding ECMP seed 0.941-0.949 over 2
HDRM_BAND = band(noise=0.14)
HD_ECMP_BAND = band(noise=0.01)


def write_schedule(tmp_path, algo, spec, placement=None, name=None, size=SIZE):
    topo = topology.build(spec)
    schedule = generators.generate(algo, topo, size, placement=placement)
    path = tmp_path / (name or f"{algo}.json")
    sformat.save(schedule, str(path))
    return str(path), schedule, topo


def colliding_seed(schedule, topo) -> int:
    """The ECMP seed (of the first 40) whose hashing puts the most flows on one link in some step."""
    def worst(seed):
        report = check(schedule, topo, "ecmp", seed=seed)
        return (max(report.costs.max_flows_per_link), report.predicted_time_s)
    return max(range(40), key=worst)


@pytest.fixture(scope="module")
def hdrm_on_bigraph(tmp_path_factory):
    """hdrm on one BiGraph network brought up once for this module's two tests (the network goes down before the
    leaf-spine's comes up): 4 MiB (a warm-up, 2 repetitions) into ``hdrm/``, then 16 MiB (2) into ``hdrm16/``."""
    tmp = tmp_path_factory.mktemp("bigraph")
    path4, schedule, _ = write_schedule(tmp, "hdrm", BIGRAPH)
    path16, _, _ = write_schedule(tmp, "hdrm", BIGRAPH, name="hdrm16.json", size=BANDWIDTH_BOUND_SIZE)
    configs = [ReplayConfig(schedule=path4, network=fabric.rebuild(BIGRAPH), routing="bigraph", out=str(tmp / "hdrm"),
                            repeat=2, warmup=1),
               ReplayConfig(schedule=path16, network=fabric.rebuild(BIGRAPH), routing="bigraph",
                            out=str(tmp / "hdrm16"), repeat=2, warmup=0)]
    preps = [prepare(cfg) for cfg in configs]  # as `emu replay` would, each on the same network
    with ReplaySession(preps[0].topo, "bigraph", latency=preps[0].latency, work_dir=str(tmp / "session")) as session:
        results = [session.run(prep.schedule, cfg.out, repeat=cfg.repeat, warmup=cfg.warmup, config=cfg.to_json(),
                               report=prep.report) for cfg, prep in zip(configs, preps, strict=True)]
    return tmp, schedule, results[0], results[1]


def test_hdrm_on_bigraph_near_line_rate_and_hd_on_ecmp_leafspine_slower(tmp_path, hdrm_on_bigraph):
    folder, schedule, good, _ = hdrm_on_bigraph
    good_summary = good.summary()
    assert good.status == "ok" and good_summary is not None
    assert all(rep.correct for rep in good.repetitions)
    # at 4 MiB the fabric's latency is part of the time: hdrm reaches the model's busbw (0.85 of the link
    # here), which the next test holds where it is bandwidth-bound
    predicted_busbw = good.prediction["busbw_mbps"]
    good_ratio = good_summary.measured_over_predicted
    print(f"hdrm on BiGraph 4 MiB: measured/predicted {good_ratio}")
    assert good_ratio is not None and HDRM_BAND[0] < good_ratio < HDRM_BAND[1], (good_summary.busbw_mbps,
                                                                                  predicted_busbw)
    assert good_summary.busbw_mbps >= 0.75 * good.link_mbps, good_summary.busbw_mbps
    saved = json.loads((folder / "hdrm" / "results.json").read_text())
    assert saved == good.to_json()
    assert saved["busbw_mbps_median"] == good_summary.busbw_mbps
    assert saved["prediction"]["max_flows_per_link"] == [1] * schedule.steps
    timeline = (folder / "hdrm" / "timeline.jsonl").read_text().splitlines()
    sends = sum(1 for r in schedule.ranks for op in r.ops if op.kind == "send")
    assert len(timeline) == sends * 3  # warmup + 2 repetitions
    links = [json.loads(line) for line in (folder / "hdrm" / "links.jsonl").read_text().splitlines()]
    assert {rec["source"] for rec in links} >= {"tc", "tcp", "controller"}

    hd_path, hd_schedule, ls_topo = write_schedule(tmp_path, "hd", LEAFSPINE)
    seed = colliding_seed(hd_schedule, ls_topo)
    bad = replay(ReplayConfig(schedule=hd_path, network=fabric.rebuild(LEAFSPINE), routing="ecmp", seed=seed,
                              out=str(tmp_path / "hd-ecmp"), repeat=2, warmup=1))
    bad_summary = bad.summary()
    assert bad.status == "ok" and bad_summary is not None and all(rep.correct for rep in bad.repetitions)
    flows = bad.prediction["max_flows_per_link"]
    colliding = [step for step, n in enumerate(flows) if n > 1]
    assert colliding, "the chosen seed should make ECMP collide"
    assert bad_summary.busbw_mbps < 0.95 * good_summary.busbw_mbps, (bad_summary.busbw_mbps,
                                                                     good_summary.busbw_mbps)
    # Where the hash collides, the same step (same bytes per transfer in hd and
    # hdrm) is much slower than on BiGraph's direct links.
    assert step_time(bad, colliding) > 1.3 * step_time(good, colliding), (step_time(bad, colliding),
                                                                          step_time(good, colliding))
    # the model predicts ECMP's collisions too: every make bench row is within 10% of it (docs/fidelity.md)
    ratio = bad_summary.measured_over_predicted
    print(f"hd on ECMP leaf-spine seed {seed}: measured/predicted {ratio}")
    assert ratio is not None and HD_ECMP_BAND[0] < ratio < HD_ECMP_BAND[1], ratio


def test_hdrm_on_bigraph_reaches_085_of_the_link_when_bandwidth_bound(hdrm_on_bigraph):
    _, _, _, res = hdrm_on_bigraph
    summary = res.summary()
    assert res.status == "ok" and summary is not None and all(rep.correct for rep in res.repetitions)
    busbw = [rep.busbw_mbps for rep in res.repetitions]
    assert summary.busbw_mbps >= HDRM_MIN_BUSBW * res.link_mbps, busbw


def test_killed_agent_fails_the_run_naming_its_rank(tmp_path):
    path, schedule, topo = write_schedule(tmp_path, "ring", "star:hosts=4")
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "emulator", "replay", path, "--topology", "star:hosts=4",
                             "--routing", "shortest", "--out", str(out), "--repeat", "20", "--warmup", "0",
                             "--timeout", "20"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed: list[int] = []

    def kill_rank_2() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not killed:
            for state in all_runs():
                for rec in state.processes():
                    if rec.get("role") == "agent" and rec.get("rank") == 2:
                        time.sleep(3)  # let it get going
                        try:
                            os.kill(rec["pid"], signal.SIGKILL)
                            killed.append(rec["pid"])
                        except ProcessLookupError:
                            pass
                        return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_2)
    killer.start()
    started = time.monotonic()
    output, _ = proc.communicate(timeout=120)
    killer.join()
    assert killed, "never saw rank 2's agent"
    assert proc.returncode != 0
    assert "rank 2" in output, output
    assert time.monotonic() - started < 100
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "failed" and "rank 2" in results["error"]
    assert not [b for b in run(["ovs-vsctl", "list-br"]).stdout.split() if BRIDGE_RE.match(b)]
    assert not [r for r in all_runs() if (r.owner() or {}).get("pid") == proc.pid], "run state left behind"
