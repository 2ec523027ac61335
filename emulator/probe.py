"""The self-check of a network before its cells: is this network as fast as the calibration says?

A network can come up slow and say nothing (issue 14: the first network after
Open vSwitch started ran 1.6-6x slow, and its cells were marked trusted).
Before an experiment runs a network's cells, :class:`emulator.runner.Runner`
replays a short probe on it and compares the measured time with the timing
model's prediction, which already holds this machine's calibrated intrinsic
latency (:mod:`emulator.fidelity`):

* the probe is a 2-rank halving-doubling exchange of :data:`PROBE_BYTES`
  between the first host and the host farthest from it (most switches), so it
  crosses the longest path of the fabric with both a latency-bound and a
  bandwidth-bound round, in both directions at once;
* it passes when the median of :data:`PROBE_REPEAT` repetitions (after
  :data:`PROBE_WARMUP`) takes at most :data:`PROBE_TOLERANCE` times the
  prediction, and every repetition was correct and trusted;
* a network that fails is rebuilt once; if it fails again, its cells run but
  carry the fidelity flag ``probe_failed`` and are not trusted.

This module is pure: it builds the probe and judges its results; the runner
runs it on the session.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from emulator.latency_probe import probe_schedule
from emulator.schedule.format import Schedule
from emulator.topology import Topology

#: 32 KiB each way per round: at the default 20 Mbit/s 13 ms of data against 55 ms of latency per round (the slow
#: first network of issue 14 took 6 times its time at 16 KiB, 1.6 times at 256 KiB).
PROBE_BYTES = 64 * 1024
PROBE_WARMUP = 0
PROBE_REPEAT = 3
#: The timing model is within 10 % of every bench row on a healthy network (docs/fidelity.md); a probe slower than
#: this times its prediction says the network is not healthy.
PROBE_TOLERANCE = 1.20
#: How many times a network that fails its probe is rebuilt before its cells are flagged.
REBUILDS = 1
FLAG = "probe_failed"


@dataclass(frozen=True)
class Verdict:
    """One probe of one network."""

    passed: bool
    pair: tuple[str, str]
    measured_s: float | None  # median over the measured repetitions
    predicted_s: float
    ratio: float | None  # measured / predicted
    reason: str  # one line: why it failed, or "ok"

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "pair": list(self.pair), "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "ratio": self.ratio, "reason": self.reason}


def probe_pair(topo: Topology) -> tuple[str, str]:
    """The first host and the one farthest from it (most switches crossed; the last such host)."""
    hosts = [h.name for h in topo.hosts]
    first = hosts[0]
    far = max(hosts[1:], key=lambda h: (topo.switch_hops(first, h), hosts.index(h)))
    return first, far


def schedule(topo: Topology) -> Schedule:
    """The probe's schedule on ``topo`` (see the module docstring)."""
    a, b = probe_pair(topo)
    return probe_schedule(a, b, PROBE_BYTES)


def judge(results: Mapping[str, Any], predicted_s: float, pair: tuple[str, str],
          tolerance: float = PROBE_TOLERANCE) -> Verdict:
    """The verdict on a probe's ``results.json`` (as :meth:`emulator.replay.ReplaySession.run` returns it)."""
    reps = list(results.get("repetitions") or [])
    times = [float(r["time_s"]) for r in reps if r.get("time_s") is not None]
    measured = statistics.median(times) if times else None
    ratio = measured / predicted_s if measured is not None and predicted_s > 0 else None
    if results.get("status") != "ok" or not times:
        reason = f"the probe did not finish: {results.get('error') or results.get('status') or 'no repetitions'}"
    elif not all(r.get("correct", False) for r in reps):
        reason = "the probe computed wrong data"
    elif ratio is not None and ratio > tolerance:
        reason = (f"the probe took {ratio:.2f}x its prediction ({measured:.3f} s against {predicted_s:.3f} s; "
                  f"at most {tolerance:.2f}x passes)")
    else:
        untrusted = sorted({f for r in reps if not (r.get("fidelity") or {}).get("trusted", True)
                            for f in (r.get("fidelity") or {}).get("flags", [])})
        reason = f"the probe's own run was not trusted ({', '.join(untrusted)})" if untrusted else "ok"
    return Verdict(passed=reason == "ok", pair=pair, measured_s=measured, predicted_s=predicted_s, ratio=ratio,
                   reason=reason)
