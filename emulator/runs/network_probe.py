"""The self-check of a network before its cells: is this network as fast as the calibration says?

A network can come up slow and say nothing, and its cells then look trusted
(issue 14; docs/fidelity.md has what was measured). Before an experiment runs a network's cells,
:class:`emulator.study.live.runner.Runner`
replays a short probe on it and compares the measured time with the timing
model's prediction, which already holds this machine's calibrated intrinsic
latency (:mod:`emulator.emulation.session.fidelity`):

* the probe is a 2-rank halving-doubling exchange of :data:`PROBE_BYTES`
  between the first host and the host farthest from it (most switches), so it
  crosses the longest path of the fabric with both a latency-bound and a
  bandwidth-bound round, in both directions at once;
* it passes when the median of :data:`PROBE_REPEAT` repetitions (after
  :data:`PROBE_WARMUP`) takes at most :data:`PROBE_TOLERANCE` times the
  prediction, and every repetition was correct and trusted but for
  ``latency_floor`` (a fabric whose latency target is below this machine's
  own latency, as a scaled training iteration's is, is no unhealthy network);
* a network that fails is rebuilt once; if it fails again, its cells run but
  carry the fidelity flag ``probe_failed`` and are not trusted.

This module is pure: it builds the probe and judges its results; the runner
runs it on the session.
"""

from __future__ import annotations

import statistics

from emulator.model.collectives.generators import pair_exchange
from emulator.model.schedule.format import Schedule
from emulator.model.topology import Topology
from emulator.runs.results import CellResults, ProbeVerdict

#: 32 KiB each way per round: at the default fabric's link rate a round is both latency- and bandwidth-bound, so a
#: slow datapath and a slow kernel path both show (the sizes tried are in docs/fidelity.md).
PROBE_BYTES = 64 * 1024
PROBE_WARMUP = 0
PROBE_REPEAT = 3
#: A probe slower than this times its prediction says the network is not healthy (the timing model's accuracy on
#: a healthy network is in docs/fidelity.md).
PROBE_TOLERANCE = 1.20
#: How many times a network that fails its probe is rebuilt before its cells are flagged.
REBUILDS = 1
FLAG = "probe_failed"
#: Flags a cell under which the network broke (its controller exited, Open vSwitch restarted) though it finished.
DAMAGED_FLAG = "network_damaged"


#: The verdict of one probe: :class:`emulator.runs.results.ProbeVerdict` (``results.json`` holds it under ``probe``).
Verdict = ProbeVerdict


def probe_pair(topo: Topology) -> tuple[str, str]:
    """The first host and the one farthest from it (most switches crossed; the last such host)."""
    hosts = [h.name for h in topo.hosts]
    first = hosts[0]
    far = max(hosts[1:], key=lambda h: (topo.switch_hops(first, h), hosts.index(h)))
    return first, far


def schedule(topo: Topology) -> Schedule:
    """The probe's schedule on ``topo`` (see the module docstring)."""
    a, b = probe_pair(topo)
    return pair_exchange(a, b, PROBE_BYTES)


def judge(results: CellResults, predicted_s: float, pair: tuple[str, str],
          tolerance: float = PROBE_TOLERANCE) -> ProbeVerdict:
    """The verdict on a probe's results (as :meth:`emulator.emulation.session.replay.ReplaySession.run` returns them).

    A probe that raised instead is judged from ``CellResults(status="failed", error=...)``.
    """
    reps = results.repetitions
    times = [r.time_s for r in reps]
    measured = statistics.median(times) if times else None
    ratio = measured / predicted_s if measured is not None and predicted_s > 0 else None
    if results.status != "ok" or not times:
        reason = f"the probe did not finish: {results.error or results.status or 'no repetitions'}"
    elif not all(r.correct for r in reps):
        reason = "the probe computed wrong data"
    elif ratio is not None and ratio > tolerance:
        reason = (f"the probe took {ratio:.2f}x its prediction ({measured:.3f} s against {predicted_s:.3f} s; "
                  f"at most {tolerance:.2f}x passes)")
    else:
        # latency_floor says the fabric's latency target is below this machine's own, not that the network is
        # unhealthy (the prediction holds the machine's intrinsic latency, so a slow network shows in the ratio)
        untrusted = sorted({f for r in reps if r.fidelity is not None and not r.fidelity.trusted
                            for f in r.fidelity.flags} - {"latency_floor"})
        reason = f"the probe's own run was not trusted ({', '.join(untrusted)})" if untrusted else "ok"
    return ProbeVerdict(passed=reason == "ok", pair=pair, measured_s=measured, predicted_s=predicted_s, ratio=ratio,
                        reason=reason)
