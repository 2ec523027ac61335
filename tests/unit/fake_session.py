"""A stand-in for :class:`emulator.replay.ReplaySession`: writes plausible cell results without a network.

Each repetition takes the model's per-step times, stretched by ``slowdown``
(``slowdown_ecmp`` for ECMP routing), so the report has something to show.
"""

from __future__ import annotations

import os
import statistics

from emulator.files import append_jsonl, write_json_atomic
from emulator.schedule import cost
from emulator.schedule import format as sformat


class FakeSession:
    """``probe_slowdowns``: the measured/predicted time of successive network probes (shared by every
    session of a factory, in bring-up order; 1.0 once it runs out)."""

    started: list[tuple[str, str, int]] = []
    runs: list[str] = []
    probes: list[str] = []

    def __init__(self, topo, policy, *, seed=0, latency=None, mtu=9000, work_dir=None, echo=print, fail=(), interrupt=(),
                 slowdown=1.1, slowdown_ecmp=1.6, flags=("uncalibrated",), probe_slowdowns=None):
        self.topo, self.policy, self.seed = topo, policy, seed
        self.latency = latency
        self.probe_slowdowns = probe_slowdowns if probe_slowdowns is not None else []
        self.fail, self.interrupt = set(fail), set(interrupt)
        self.slowdown, self.slowdown_ecmp, self.flags = slowdown, slowdown_ecmp, list(flags)
        self.up = False

    def start(self):
        FakeSession.started.append((self.topo.spec, self.policy, self.seed))
        self.up = True

    def stop(self):
        self.up = False

    def run(self, schedule, out, *, repeat=3, warmup=1, timeout_s=None, pcap=None, config=None, report=None,
            fault_plan=()):
        assert self.up, "run() on a session that is not up"
        if "probe" in (config or {}):
            return self._probe(schedule, repeat, warmup, report)
        cell_id = (config or {})["cell"]["id"]
        FakeSession.runs.append(cell_id)
        sformat.save(schedule, os.path.join(out, "schedule.json"))
        write_json_atomic(os.path.join(out, "topology.json"), self.topo.to_json())
        results = {"config": {**config, "algorithm": schedule.algorithm, "ranks": schedule.p, "size": schedule.size,
                              "topology": self.topo.spec, "routing": self.policy, "seed": self.seed,
                              "repeat": repeat, "warmup": warmup},
                   "link_mbps": self.topo.host_bw, "datapath": "user", "prediction": report.to_json(),
                   "repetitions": [], "warmup": [], "status": "running", "error": None}
        path = os.path.join(out, "results.json")
        write_json_atomic(path, results)
        if cell_id in self.interrupt:
            results["status"] = "interrupted"
            write_json_atomic(path, results)
            raise KeyboardInterrupt
        if cell_id in self.fail:
            results["status"] = "failed"
            results["error"] = "rank 3 did not report 'done' within 30 s: agent hung"
            write_json_atomic(path, results)
            raise RuntimeError(results["error"])
        slow = self.slowdown_ecmp if self.policy == "ecmp" else self.slowdown
        transfers = cost.transfers(schedule, self.topo, self.policy, self.seed)
        for rep in range(warmup + repeat):
            t = 100.0 * rep
            t0 = t
            for st in report.costs.steps:
                dur = st.maxmin_s * slow
                for tr in transfers:
                    if tr.step == st.step:
                        append_jsonl(os.path.join(out, "timeline.jsonl"),
                                     {"rep": rep, "step": st.step, "src": tr.src, "dst": tr.dst,
                                      "src_host": tr.src_host, "dst_host": tr.dst_host, "bytes": tr.bytes,
                                      "start": t, "end": t + dur * (tr.bytes / max(st.bytes, 1))})
                t += dur
            elapsed = t - t0
            p = schedule.p
            algbw = schedule.size / elapsed * 8 / 1e6
            metrics = {"rep": rep, "time_s": elapsed, "algbw_mbps": algbw, "busbw_mbps": algbw * 2 * (p - 1) / p,
                       "correct": True, "measured_over_predicted": slow,
                       "fidelity": {"flags": list(self.flags), "trusted": "over_capacity" not in self.flags,
                                    "qdisc_drops": 0, "tcp_retransmits": 1}}
            (results["warmup"] if rep < warmup else results["repetitions"]).append(metrics)
        reps = results["repetitions"]
        results["busbw_mbps_median"] = statistics.median(r["busbw_mbps"] for r in reps)
        results["time_s_median"] = statistics.median(r["time_s"] for r in reps)
        results["measured_over_predicted_median"] = results["time_s_median"] / report.predicted_time_s
        results["trusted"] = all(r["fidelity"]["trusted"] for r in reps)
        results["faults"] = [{**f.to_json(), "rep_index": warmup + f.rep, "fired_s": 0.5, "action_s": 0.01,
                              "reroute_s": 0.04 if f.action.startswith("link") else None, "error": None,
                              "affected_transfers": [], "note": "fake"} for f in fault_plan]
        results["status"] = "ok"
        results["outcome"] = "degraded" if fault_plan else "ok"
        write_json_atomic(path, results)
        return results

    def _probe(self, schedule, repeat, warmup, report):
        FakeSession.probes.append(self.topo.spec)
        slow = self.probe_slowdowns.pop(0) if self.probe_slowdowns else 1.0
        t = report.predicted_time_s * slow
        reps = [{"rep": r, "time_s": t, "correct": True, "fidelity": {"flags": [], "trusted": True}}
                for r in range(warmup + repeat)]
        return {"status": "ok", "error": None, "warmup": reps[:warmup], "repetitions": reps[warmup:]}


def factory(**options):
    """A session factory for :class:`emulator.runner.Runner` with these FakeSession options."""
    shared = options.pop("probe_slowdowns", None)
    probe_slowdowns = list(shared) if shared is not None else None

    def make(topo, policy, **kw):
        return FakeSession(topo, policy, **kw, **options, probe_slowdowns=probe_slowdowns)
    return make
