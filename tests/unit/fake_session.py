"""A stand-in for :class:`emulator.emulation.session.replay.ReplaySession`: writes plausible cell results without a
network.

Each repetition takes the model's per-step times, stretched by ``slowdown``
(``slowdown_ecmp`` for ECMP routing), so the report has something to show.
Like the real session, ``run`` writes ``results.json`` through
:meth:`emulator.runs.results.CellResults.save` as it goes and returns the
:class:`~emulator.runs.results.CellResults`; a probe (``config`` with ``probe``)
writes nothing and returns its results only.
"""

from __future__ import annotations

import os

from emulator.base.files import append_jsonl, write_json_atomic
from emulator.model.prediction import cost
from emulator.model.schedule import format as sformat
from emulator.runs.results import CellResults, Fidelity, Repetition


class FakeSession:
    """``probe_slowdowns``: the measured/predicted time of successive network probes (shared by every
    session of a factory, in bring-up order; 1.0 once it runs out)."""

    started: list[tuple[str, str, int]] = []
    runs: list[str] = []
    probes: list[str] = []

    def __init__(self, topo, policy, *, seed=0, latency=None, mtu=9000, work_dir=None, echo=print, fail=(), interrupt=(),
                 slowdown=1.1, slowdown_ecmp=1.6, flags=("uncalibrated",), probe_slowdowns=None, damaging=()):
        self.topo, self.policy, self.seed = topo, policy, seed
        self.latency = latency
        self.probe_slowdowns = probe_slowdowns if probe_slowdowns is not None else []
        self.fail, self.interrupt = set(fail), set(interrupt)
        self.slowdown, self.slowdown_ecmp, self.flags = slowdown, slowdown_ecmp, list(flags)
        self.up = False
        self.bringup_s = None  # the runner then counts the wall time of start()
        self.damaging = set(damaging)  # cells under which this session's network breaks (its controller dies)
        self.broken: str | None = None

    def start(self):
        FakeSession.started.append((self.topo.spec, self.policy, self.seed))
        self.up = True

    def stop(self):
        self.up = False

    def damage(self):
        return self.broken

    def run(self, schedule, out, *, repeat=3, warmup=1, timeout_s=None, pcap=None, config=None, report=None,
            fault_plan=()):
        assert self.up, "run() on a session that is not up"
        if "probe" in (config or {}):
            return self._probe(schedule, repeat, warmup, report)
        cell_id = (config or {})["cell"]["id"]
        FakeSession.runs.append(cell_id)
        if cell_id in self.damaging:
            self.broken = "its controller exited (killed)"
        sformat.save(schedule, os.path.join(out, "schedule.json"))
        write_json_atomic(os.path.join(out, "topology.json"), self.topo.to_json())
        results = CellResults(config={**config, "algorithm": schedule.algorithm, "ranks": schedule.p,
                                      "size": schedule.size, "topology": self.topo.spec, "routing": self.policy,
                                      "seed": self.seed, "repeat": repeat, "warmup": warmup},
                              link_mbps=self.topo.host_bw, datapath="user", prediction=report.to_json())
        path = os.path.join(out, "results.json")
        results.save(path)
        if cell_id in self.interrupt:
            results.status = results.outcome = "interrupted"
            results.save(path)
            raise KeyboardInterrupt
        if cell_id in self.fail:
            results.status = results.outcome = "failed"
            results.error = "rank 3 did not report 'done' within 30 s: agent hung"
            results.save(path)
            raise RuntimeError(results.error)
        slow = self.slowdown_ecmp if self.policy == "ecmp" else self.slowdown
        self._timeline(schedule, report, out, warmup + repeat, slow)
        for rep in range(warmup + repeat):
            elapsed = sum(st.maxmin_s * slow for st in report.costs.steps)
            p = schedule.p
            algbw = schedule.size / elapsed * 8 / 1e6
            fidelity = Fidelity(cpu_idle=1.0, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0, tcp_retransmits=1,
                                flags=list(self.flags), trusted="over_capacity" not in self.flags)
            metrics = Repetition(rep=rep, time_s=elapsed, algbw_mbps=algbw, busbw_mbps=algbw * 2 * (p - 1) / p,
                                 predicted_time_s=report.predicted_time_s, measured_over_predicted=slow,
                                 fidelity=fidelity)
            (results.warmup if rep < warmup else results.repetitions).append(metrics)
        results.faults = [{**f.to_json(), "rep_index": warmup + f.rep, "fired_s": 0.5, "action_s": 0.01,
                           "reroute_s": 0.04 if f.action.startswith("link") else None, "error": None,
                           "affected_transfers": [], "note": "fake"} for f in fault_plan]
        results.status = "ok"
        results.outcome = "degraded" if fault_plan else "ok"
        results.save(path)
        return results

    def _timeline(self, schedule, report, out, reps, slow):
        """``timeline.jsonl``: every transfer of every repetition, repetitions 100 s apart."""
        transfers = cost.transfers(schedule, self.topo, self.policy, self.seed)
        for rep in range(reps):
            t = 100.0 * rep
            for st in report.costs.steps:
                dur = st.maxmin_s * slow
                for tr in transfers:
                    if tr.step == st.step:
                        append_jsonl(os.path.join(out, "timeline.jsonl"),
                                     {"rep": rep, "step": st.step, "src": tr.src, "dst": tr.dst,
                                      "src_host": tr.src_host, "dst_host": tr.dst_host, "bytes": tr.bytes,
                                      "start": t, "end": t + dur * (tr.bytes / max(st.bytes, 1))})
                t += dur

    def _probe(self, schedule, repeat, warmup, report):
        FakeSession.probes.append(self.topo.spec)
        slow = self.probe_slowdowns.pop(0) if self.probe_slowdowns else 1.0
        t = report.predicted_time_s * slow
        reps = [Repetition(rep=r, time_s=t, algbw_mbps=0.0, busbw_mbps=0.0,
                           fidelity=Fidelity(cpu_idle=1.0, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0))
                for r in range(warmup + repeat)]
        return CellResults(status="ok", outcome="ok", warmup=reps[:warmup], repetitions=reps[warmup:])


def factory(**options):
    """A session factory for :class:`emulator.study.live.runner.Runner` with these FakeSession options."""
    shared = options.pop("probe_slowdowns", None)
    probe_slowdowns = list(shared) if shared is not None else None

    def make(topo, policy, **kw):
        return FakeSession(topo, policy, **kw, **options, probe_slowdowns=probe_slowdowns)
    return make
