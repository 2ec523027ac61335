"""emu bench as a package prints and writes what the one-module bench did, byte for byte.

``bench()`` runs on fake live edges (:mod:`bench_scenario`: no root, no network); its progress lines, every
JSON document it saves and the report it prints are compared with the golden files the bench wrote from the
same fakes before it became a package (``tests/data/bench/``), as is the admission request.
"""

from __future__ import annotations

import json
import time
import types
from typing import Any

import bench_scenario as sc
import pytest

from emulator.emulation.session import fidelity
from emulator.model import fabric
from emulator.model.latency import LatencyModel
from emulator.runs.dilation import DEFAULT_AGENT_COSTS, Envelope
from emulator.selfcheck import bench
from emulator.selfcheck.bench.cases import DEFAULT_CASES, DEFAULT_SIZES, Size
from emulator.selfcheck.bench.rows import BringupTimes
from emulator.selfcheck.live import bench_bringup, bench_mpi_pairs, bench_replays, bench_run


class _FakeDateTime:
    @staticmethod
    def now() -> Any:
        return types.SimpleNamespace(strftime=lambda fmt: sc.STAMP)


def _times(fake: Any) -> Any:
    def times(*args: Any) -> BringupTimes:
        t = fake(*args)
        return BringupTimes(t["up_s"], t["down_s"], t.get("datapath"))
    return times


def run_bench(mp: pytest.MonkeyPatch, agents: Any, broken: tuple[str, ...], failing: tuple[tuple[str, int], ...],
              bring_ok: bool = True, profile: fabric.FabricProfile | None = None,
              **kwargs: Any) -> tuple[list[str], list[str], str]:
    saves: list[str] = []
    echo: list[str] = []
    mp.setattr(fidelity, "has_netem", lambda: False)
    mp.setattr(bench_run, "datetime", types.SimpleNamespace(datetime=_FakeDateTime))
    mp.setattr(time, "monotonic", sc.clock())
    mp.setattr(bench_run, "write_json_atomic",
               lambda path, data: saves.append(json.dumps(data, indent=1, sort_keys=True) + "\n"))
    mp.setattr(sc.FakeSession, "broken", broken)
    mp.setattr(sc.FakeSession, "failing", failing)
    mp.setattr(bench_replays, "ReplaySession", sc.FakeSession)
    mp.setattr(bench_mpi_pairs, "ReplaySession", sc.FakeSession)
    mp.setattr(bench_mpi_pairs, "prepare_mpirun", lambda cfg: cfg)
    mp.setattr(bench_mpi_pairs, "run_mpirun", sc.fake_mpirun)
    ours, plain = sc.bringup_times()
    mp.setattr(bench_bringup, "our_bringup", _times(ours) if bring_ok else sc.failing)
    mp.setattr(bench_bringup, "plain_mininet_bringup", _times(plain))
    mp.setattr(bench_run, "measure_agents_vs_iperf", agents)
    mp.setattr(bench_run, "measure_agents_aggregate",
               sc.fake_agents_aggregate if agents is sc.fake_agents_vs_iperf else sc.failing)
    mp.setattr(bench_run, "ensure_calibration", lambda profile, datapath, echo: sc.calibration())
    mp.setattr(bench_run, "machine_info", sc.machine_info)
    mp.setattr(bench_run, "choose_datapath", lambda d: "user")
    mp.setattr(bench_run, "load_average", lambda: [0.7, 0.6, 0.5])
    results = bench_run.bench(profile or fabric.default(), out_dir="/bench-out", echo=echo.append, **kwargs)
    return echo, saves, bench.format_report(results)


def assert_golden(name: str, echo: list[str], saves: list[str], report: str) -> None:
    assert "\n".join(echo) + "\n" == sc.golden(f"{name}.echo.txt", "\n".join(echo) + "\n")
    golden_saves = sc.golden(f"{name}.saves.json", "".join(s + "\x1e\n" for s in saves)).split("\x1e\n")[:-1]
    assert len(saves) == len(golden_saves)
    for i, (got, want) in enumerate(zip(saves, golden_saves, strict=True)):
        assert got == want, f"save {i + 1} differs"
    assert report + "\n" == sc.golden(f"{name}.report.txt", report + "\n")


def test_a_full_run_prints_and_writes_what_it_did(monkeypatch):
    echo, saves, report = run_bench(monkeypatch, sc.fake_agents_vs_iperf, ("fattree",), (("dbtree", 1 << 20),))
    assert_golden("full", echo, saves, report)


def test_a_run_whose_sections_fail_prints_and_writes_what_it_did(monkeypatch):
    profile = bench.bench_profile(fabric.PRESETS["bandwidth-only"], 20.0)
    echo, saves, report = run_bench(monkeypatch, sc.failing, ("bigraph",), (), bring_ok=False, profile=profile,
                                    cases=(DEFAULT_CASES[0],), sizes=(Size(64 << 10, 1, 2),), crossovers=(),
                                    bringup_rounds=1)
    assert_golden("failures", echo, saves, report)


def test_the_admission_request_is_unchanged():
    bw_only = bench.bench_profile(fabric.PRESETS["bandwidth-only"], 20.0)
    requests = [bench.admission_request(fabric.default(), DEFAULT_SIZES, LatencyModel(fabric.default()),
                                        Envelope(1500.0, DEFAULT_AGENT_COSTS, 2)),
                bench.admission_request(bw_only, (Size(1 << 20, 1, 3),), LatencyModel(bw_only),
                                        Envelope(None, DEFAULT_AGENT_COSTS, 2),
                                        bringup_rounds=3)]
    text = "".join(repr(r) + "\n" for r in requests)
    assert text == sc.golden("admission.txt", text)
