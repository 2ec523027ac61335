"""Fixed inputs for emu bench's golden tests: fake live edges (replay sessions, emu mpirun, bring-ups, agents vs
iperf3) that return made-up but deterministic results documents, so ``bench()`` runs without root or a network.

The golden files under ``tests/data/bench/`` were written from these inputs by the bench as it was before it
became a package (one module, rows as dicts); the tests check that the package prints and writes the same bytes.
They were written again when the section of the agents' aggregate goodput came (``fake_agents_aggregate``): the
lines and saves of the other sections stayed the same.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from test_calibration_file import MINIMAL

from emulator.base.errors import UserError
from emulator.emulation.agents.fleet import ReplayFailed
from emulator.emulation.machine.calibration_file import Calibration
from emulator.model.schedule.format import parse_size

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "bench")
STAMP = "20260101-000000"
MPI_SIZE = 4 << 20
#: (a, b): an algorithm's made-up time at ``n`` bytes is ``a + n / b`` seconds.
SPEED = {"ring": (0.05, 1e7), "hd": (0.02, 5e6), "hdrm": (0.03, 9e6), "dbtree": (0.04, 4e6), "hier": (0.06, 8e6),
         "rd": (0.01, 3e6)}


#: Set to rewrite the golden files from this run (after a deliberate change; review the diff before committing).
UPDATE_GOLDEN = os.environ.get("EF_UPDATE_GOLDEN") == "1"


def golden(name: str, now: str | None = None) -> str:
    """The golden file ``name``; with EF_UPDATE_GOLDEN=1, ``now`` (this run's text) is written to it first."""
    if UPDATE_GOLDEN and now is not None:
        with open(os.path.join(GOLDEN, name), "w", encoding="utf-8") as fh:
            fh.write(now)
    with open(os.path.join(GOLDEN, name), encoding="utf-8") as fh:
        return fh.read()


def replay_results(algo: str, size: int, kind: str) -> dict[str, Any]:
    """A made-up results document of one replay (the keys bench reads of results.json)."""
    a, b = SPEED[algo]
    t = a + size / b
    mp = 1.0 + (len(algo) + len(kind) + size % 7) % 9 / 30 - 0.12
    reps = [{"measured_over_predicted": mp, "fidelity": {"flags": ["uncalibrated", "latency_floor"][:1 + size % 2],
                                                         "datapath_load_mbps": 100.0 + size % 97, "cpu_idle": 0.25,
                                                         "tcp_retransmits": size % 3}},
            {"measured_over_predicted": mp * 1.01, "fidelity": {"flags": [], "datapath_load_mbps": 120.0,
                                                                "cpu_idle": 0.2, "tcp_retransmits": None}}]
    return {"status": "ok", "error": None, "time_s_median": t, "prediction": {"predicted_time_s": t / mp},
            "measured_over_predicted_median": mp, "busbw_mbps_median": 5.5 * size / (size + 1e5),
            "repetitions": reps}


class FakeResults:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def to_json(self) -> dict[str, Any]:
        return self.doc


class FakeSession:
    """ReplaySession's shape: fails to start on the topology kinds in ``broken``; a replay of ``failing``
    (algorithm, size) raises ReplayFailed."""

    broken: tuple[str, ...] = ()
    failing: tuple[tuple[str, int], ...] = ()

    def __init__(self, topo: Any, routing: str, **kwargs: Any) -> None:
        self.topo = topo
        if topo.kind in self.broken:
            raise RuntimeError(f"cannot bring up {topo.kind}")

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, schedule: Any, path: str, repeat: int, warmup: int) -> FakeResults:
        leaf = os.path.basename(path)
        algo, _, size_text = leaf.partition("-")
        size = parse_size(size_text) if size_text else MPI_SIZE
        if (algo, size) in self.failing:
            raise ReplayFailed(f"rank 2 of {algo} hung")
        return FakeResults(replay_results(algo, size, self.topo.kind))


def fake_mpirun(prepared: Any, echo: Any) -> FakeResults:
    """emu mpirun: rabenseifner cannot start; ring runs, with its benchmark's rows."""
    echo(f"mpirun {' '.join(prepared.program)}")
    if "rabenseifner" in prepared.program:
        raise UserError("mpirun: field 'program': expected a program that starts, got 'rabenseifner'")
    return FakeResults({"kind": "mpirun", "status": "ok", "error": None,
                        "bench": [{"size": MPI_SIZE, "busbw_mbps": 5.1, "wrong": 0}],
                        "fidelity": {"cpu_idle": 0.15, "flags": ["cpu_saturated", "uncalibrated"]}})


def fake_agents_vs_iperf(link_mbps: float, **kwargs: Any) -> dict[str, Any]:
    return {"topology": f"star:hosts=2,bw={link_mbps:g}", "link_mbps": link_mbps, "size": 1 << 20, "repeat": 3,
            "agent_mbps": 5.81, "agent_reps_mbps": [5.8, 5.81, 5.82], "iperf3_mbps": 5.93,
            "iperf3": {"received_mbps": 5.92, "reverse_received_mbps": 5.94}, "ratio": 5.81 / 5.93,
            "agent_over_link": 5.81 / link_mbps, "iperf3_over_link": 5.93 / link_mbps}


def fake_agents_aggregate(capacity_mbps: float | None, **kwargs: Any) -> dict[str, Any]:
    return {"topology": "star:hosts=16,bw=120", "link_mbps": 120.0, "flows": 16, "size": 64 << 20, "repeat": 2,
            "capacity_mbps": capacity_mbps, "agent_mbps": 1510.0, "agent_reps_mbps": [1500.0, 1520.0],
            "agent_flags": [], "iperf3_mbps": 1880.0, "iperf3_flows_mbps": [117.5] * 16, "iperf3_cpu_idle": 0.02,
            "ratio": 1510.0 / 1880.0, "agent_over_offered": 1510.0 / 1920.0, "iperf3_over_offered": 1880.0 / 1920.0}


def failing(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("no network today")


def bringup_times() -> Any:
    """Fake bring-ups, ours then plain, alternated, with times that differ per round."""
    counter = itertools.count()

    def ours(topo: Any, datapath: str, mtu: int) -> dict[str, Any]:
        i = next(counter)
        return {"up_s": 4.0 + i, "down_s": 2.0, "total_s": 6.0 + i, "datapath": "user"}

    def plain(topo: Any, datapath: str) -> dict[str, float]:
        return {"up_s": 2.0, "down_s": 1.5, "total_s": 3.5}

    return ours, plain


def calibration() -> Calibration:
    return Calibration.from_json(MINIMAL)


def machine_info(datapath: str, mtu: int) -> dict[str, Any]:
    return {"kernel": "6.1.0-test", "nproc": 2, "datapath": datapath, "mtu": mtu, "date": "2026-01-01T00:00:00+00:00",
            "loadavg_before": [0.5, 0.4, 0.3]}


def clock() -> Any:
    ticks = itertools.count()
    return lambda: 10.0 * next(ticks)
