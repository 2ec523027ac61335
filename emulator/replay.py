"""``emu replay``: run a schedule over real TCP on an emulated network and measure it.

:func:`replay` checks everything first (schedule, topology, routing, the
fabric profile; the schedule must be a proven allreduce), then brings up the
controller and the network, starts one :mod:`emulator.agent` per rank inside
its host, and runs ``warmup + repeat`` repetitions behind a barrier. After
every repetition it rewrites ``results.json`` atomically, so whatever was
measured survives a failure or Ctrl-C. Files in the output directory:

* ``results.json`` -- configuration, the fabric profile (``fabric``) and the
  latency model (``latency``), ``link_mbps``, the prediction of ``schedule
  check``, ``repetitions`` (``time_s``, ``algbw_mbps``, ``busbw_mbps``,
  per-step times, ``correct``, measured/predicted ratio, fidelity),
  ``busbw_mbps_median``, ``status`` and ``error``;
* ``latency.json`` -- the agents' latency plan: per sending and receiving
  rank, the latency terms of the path (:mod:`emulator.latency`);
* ``timeline.jsonl`` -- every transfer: repetition, step, source and
  destination rank and host, bytes, start and end (CLOCK_MONOTONIC seconds),
  and when the receive was posted, the clear to send came and ``sendall``
  began, and how late that was;
* ``links.jsonl`` -- the controller's port counters over time, tc qdisc
  statistics of every link interface and TCP retransmissions per host, per
  repetition;
* ``agents/rank-R.log`` -- each agent's own log.

Pure helpers (:func:`repetition_metrics`, :func:`timeline_records`,
:func:`send_lateness`, :func:`nccl_table`) are unit-tested without root.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from emulator import fabric, faults, fidelity, routing, topology
from emulator.agent import latency_plan
from emulator.control import ControlError, ControlServer, Msg
from emulator.errors import UserError, int_field
from emulator.faults import Fault, FaultEvent, Injector
from emulator.files import append_jsonl, write_json_atomic
from emulator.latency import LatencyModel, PathLatency
from emulator.launcher import AgentLauncher
from emulator.schedule import check as scheck
from emulator.schedule import cost as scost
from emulator.schedule import format as sformat
from emulator.schedule.format import RECV, RECV_REDUCE, SEND, Schedule, match_transfers
from emulator.system import run
from emulator.tc import SHAPER_BURST_BYTES
from emulator.waiting import wait_until

log = logging.getLogger(__name__)

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Every rank starts a repetition at the same instant on the shared monotonic
#: clock, this long after the "go" message leaves (enough for 16-64 agents on
#: 2 cores to wake, read it and start their worker threads).
START_MARGIN_S = 0.1


@dataclass
class ReplayConfig:
    schedule: str
    topology: str
    routing: str
    out: str
    repeat: int = 3
    warmup: int = 1
    seed: int = 0
    timeout_s: float | None = None  # per repetition; default from the prediction
    pcap: list[str] = field(default_factory=list)
    datapath: str = "auto"
    stats_interval_s: float = 0.5
    fabric: str | None = None  # a fabric profile (emulator.fabric): preset or key=value,...; None: the default
    faults: list[Any] = field(default_factory=list)  # specs, see emulator.faults

    def check(self) -> None:
        for name, value, low in (("repeat", self.repeat, 1), ("warmup", self.warmup, 0), ("seed", self.seed, 0)):
            int_field("replay", name, value, low)
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise UserError(f"replay: field 'timeout': expected seconds > 0, got {self.timeout_s!r}")


class ReplayFailed(Exception):
    """The run failed (an agent died, hung or computed wrong data); the message names the rank."""

    exit_status = 1


# ------------------------------------------------------------------ pure part
def repetition_metrics(schedule: Schedule, op_times: dict[int, dict[int, tuple[float, float]]],
                       predicted: scheck.CheckReport | None = None) -> dict[str, Any]:
    """Time, algbw/busbw (nccl-tests definitions, Mbit/s) and per-step times of one repetition.

    ``op_times[rank][op_id] = (start, end)`` on the shared monotonic clock.
    """
    starts = [t[0] for per_rank in op_times.values() for t in per_rank.values()]
    ends = [t[1] for per_rank in op_times.values() for t in per_rank.values()]
    t0, t1 = min(starts), max(ends)
    elapsed = t1 - t0
    p = schedule.p
    algbw = schedule.size / elapsed * 8 / 1e6 if elapsed > 0 else 0.0
    # A step runs from its first send to its last receive (a receive is
    # posted early and waits, so its start says nothing about the network).
    steps: dict[int, list[float]] = {}
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.id not in op_times.get(prog.rank, {}) or op.kind not in (SEND, RECV, RECV_REDUCE):
                continue
            s, e = op_times[prog.rank][op.id]
            span = steps.setdefault(op.step, [float("inf"), float("-inf")])
            if op.kind == SEND:
                span[0] = min(span[0], s)
            else:
                span[1] = max(span[1], e)
    step_times: list[dict[str, Any]] = [{"step": k, "start_s": v[0] - t0, "time_s": v[1] - v[0]} for k, v in sorted(steps.items())
                  if v[0] != float("inf") and v[1] != float("-inf")]
    out: dict[str, Any] = {
        "time_s": elapsed,
        "algbw_mbps": algbw,
        "busbw_mbps": algbw * 2 * (p - 1) / p,
        "steps": step_times,
        "start_monotonic": t0,
    }
    if predicted is not None:
        out["predicted_time_s"] = predicted.predicted_time_s
        out["measured_over_predicted"] = elapsed / predicted.predicted_time_s if predicted.predicted_time_s else None
        per_step = predicted.step_times()
        for st in step_times:
            pred = per_step.get(st["step"])
            st["predicted_s"] = pred
            st["measured_over_predicted"] = st["time_s"] / pred if pred else None
    return out


def timeline_records(schedule: Schedule, rep: int, op_times: dict[int, dict[int, tuple[float, float]]],
                     sends: dict[int, dict[int, list[float]]] | None = None) -> list[dict]:
    """One record per transfer: its start (the agents' virtual start) to the receive's end at the destination,
    and when the send completed (``send_end``: for a send others wait for, when its last byte was acknowledged).

    With the agents' ``sends`` (per rank, per send op: receive posted, clear to
    send in hand, ``sendall`` begun, lateness) those are added as ``posted``,
    ``cts_at``, ``sent`` and ``late_s``.
    """
    ops = {(prog.rank, op.id): op for prog in schedule.ranks for op in prog.ops}
    out = []
    for a, send_id, b, recv_id in match_transfers(schedule):
        if send_id not in op_times.get(a, {}) or recv_id not in op_times.get(b, {}):
            continue
        op = ops[(a, send_id)]
        rec = {"rep": rep, "step": op.step, "src": a, "dst": b, "src_host": schedule.ranks[a].host,
               "dst_host": schedule.ranks[b].host, "bytes": op.bytes,
               "start": op_times[a][send_id][0], "end": op_times[b][recv_id][1], "send_end": op_times[a][send_id][1]}
        info = (sends or {}).get(a, {}).get(send_id)
        if info is not None:
            rec.update(posted=info[0], cts_at=info[1], sent=info[2], late_s=info[3])
        out.append(rec)
    return out


def send_paths(topo: topology.Topology, planned: list[scost.Transfer], model: LatencyModel,
               mtu: int) -> dict[tuple[int, int], PathLatency]:
    """Per (sending rank, receiving rank): the latency terms of its path (what the agents' plan holds),
    with its links' seconds per byte for what the shapers do not charge (:meth:`PathLatency.unshaped_s`)."""
    out = {}
    goodput = topology.tcp_goodput_factor(mtu)
    for t in planned:
        byte_s = sum(1 / cap for _, cap in scost.physical_links(topo, t.path, goodput))
        out[(t.src, t.dst)] = replace(model.path(len(t.path) - 2), byte_s=byte_s, mss=topology.tcp_payload_bytes(mtu),
                                      burst_bytes=SHAPER_BURST_BYTES)
    return out


def send_lateness(schedule: Schedule, sends: dict[int, dict[int, list[float]]],
                  paths: dict[tuple[int, int], PathLatency]) -> tuple[list[float], list[float]]:
    """Every send's lateness and its path's target message latency, for :func:`emulator.fidelity.lateness`."""
    late, target = [], []
    for prog in schedule.ranks:
        for op in prog.ops:
            info = sends.get(prog.rank, {}).get(op.id)
            if op.kind == SEND and info is not None:
                late.append(info[3])
                target.append(paths[(prog.rank, op.partner)].message_target_s)
    return late, target


def nccl_table(schedule: Schedule, reps: list[dict[str, Any]]) -> str:
    """The nccl-tests layout: one row per measured repetition (in-place, Mbit/s of the emulated fabric)."""
    lines = [
        f"# {schedule.algorithm} allreduce, {schedule.p} ranks, emulated bandwidths in Mbit/s",
        "#",
        f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>8} "
        f"{'busbw':>8} {'#wrong':>6}",
        f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'':>5} {'(us)':>10} {'(Mb/s)':>8} {'(Mb/s)':>8} {'':>6}",
    ]
    for rep in reps:
        lines.append(f"  {schedule.size:>12} {schedule.size // 4:>12} {'float':>6} {'sum':>6} {-1:>5} "
                     f"{rep['time_s'] * 1e6:>10.0f} {rep['algbw_mbps']:>8.2f} {rep['busbw_mbps']:>8.2f} "
                     f"{0 if rep['correct'] else 1:>6}")
    if reps:
        lines.append(f"# Avg bus bandwidth    : {statistics.mean(r['busbw_mbps'] for r in reps):.2f} Mb/s")
    return "\n".join(lines)


# ------------------------------------------------------------- the live part
def _default_timeout(predicted_s: float) -> float:
    return max(30.0, 5 * predicted_s + 15.0)


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` checked and computed, before anything starts."""

    schedule: Schedule
    topo: topology.Topology
    profile: fabric.FabricProfile
    latency: LatencyModel
    report: scheck.CheckReport


def prepare(cfg: ReplayConfig, calibration: dict[str, Any] | None = None) -> Prepared:
    """Every check that can fail on bad input, before anything starts.

    The topology's links default to the fabric profile's emulated rate, the
    network's MTU is the profile's, and the prediction uses the profile with
    ``calibration``'s intrinsic latency (default: this machine's calibration
    at that MTU).
    """
    cfg.check()
    profile = fabric.parse(cfg.fabric, where="replay: fabric")
    schedule = sformat.load(cfg.schedule)
    topo = topology.load(cfg.topology, profile.emulated_link_mbps)
    routing.check_policy(topo, cfg.routing)
    if calibration is None:
        calibration = fidelity.load_calibration(profile.emulated_mtu)
    model = fidelity.latency_model(profile, calibration)
    report = scheck.predict(schedule, topo, cfg.routing, seed=cfg.seed, latency=model, mtu=profile.emulated_mtu,
                            where=f"schedule {cfg.schedule!r}")
    for link in cfg.pcap:
        fidelity.parse_link_name(topo, link)
    faults.parse_faults(cfg.faults, topo, schedule.p, schedule.steps, cfg.repeat, where="replay: fault")
    return Prepared(schedule, topo, profile, model, report)


class ReplaySession:
    """A controller and a network kept up for several schedules (one topology, routing and seed).

    ``with ReplaySession(topo, "bigraph") as session: session.run(schedule, out_dir)``.

    ``latency`` is the fabric profile with this machine's intrinsic latency
    (:func:`emulator.fidelity.latency_model`); the network's MTU is the
    profile's (``mtu`` without a profile), and where the model puts switch
    latency on the links (netem), every switch port delays its packets.
    Without a profile the agents add no latency.
    """

    def __init__(self, topo: topology.Topology, policy: str, *, seed: int = 0, datapath: str = "auto",
                 latency: LatencyModel | None = None, mtu: int = topology.DEFAULT_MTU, stats_interval_s: float = 0.5,
                 work_dir: str | None = None, echo=print, network_options: dict[str, Any] | None = None):
        routing.check_policy(topo, policy)
        self.topo = topo
        self.policy = policy
        self.seed = seed
        self.datapath = datapath
        self.latency = latency or LatencyModel()
        self.mtu = self.latency.profile.emulated_mtu if self.latency.profile is not None else mtu
        self.stats_interval_s = stats_interval_s
        self.echo = echo
        self.work_dir = work_dir
        self.network_options = network_options or {}
        self.ctl: Any = None
        self.en: Any = None
        self.launcher: AgentLauncher | None = None
        self.topo_path = ""
        self.stats_file = ""
        self._downed: set[tuple[str, str]] = set()

    def __enter__(self) -> ReplaySession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        import tempfile

        from emulator.controller_process import ControllerProcess
        from emulator.network import EmulatedNetwork

        self.work_dir = self.work_dir or tempfile.mkdtemp(prefix="ef-replay-")
        os.makedirs(self.work_dir, exist_ok=True)
        self.topo_path = os.path.abspath(os.path.join(self.work_dir, "topology.json"))
        write_json_atomic(self.topo_path, self.topo.to_json())
        self.stats_file = os.path.join(self.work_dir, "controller-ports.jsonl")
        try:
            self.ctl = ControllerProcess.for_network(self.topo_path, self.policy, self.seed, stats_file=self.stats_file,
                                                     stats_interval_s=self.stats_interval_s,
                                                     log_file=os.path.join(self.work_dir, "controller.log"))
            self.ctl.start()
            self.en = EmulatedNetwork(self.topo, controller=self.ctl.address, datapath=self.datapath,
                                      label="replay", mtu=self.mtu,
                                      switch_delay_s=self.latency.link_delay_per_switch_s, **self.network_options)
            self.en.start()
            self.ctl.wait_installed()
            self.launcher = AgentLauncher(dict(os.environ, PYTHONPATH=PROJECT_ROOT), PROJECT_ROOT,
                                          os.path.join(self.work_dir, "launcher.stderr")).start()
            assert self.launcher.proc is not None
            self.en.state.record_process("launcher", self.launcher.proc.pid)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        en, self.en = self.en, None
        ctl, self.ctl = self.ctl, None
        launcher, self.launcher = self.launcher, None
        if launcher is not None:
            launcher.stop()
        if en is not None:
            en.stop()
        if ctl is not None:
            ctl.stop()

    def _stats_offset(self) -> int:
        try:
            return os.path.getsize(self.stats_file)
        except OSError:
            return 0

    def run(self, schedule: Schedule, out: str, *, repeat: int = 3, warmup: int = 1, timeout_s: float | None = None,
            pcap: list[str] | None = None, config: dict[str, Any] | None = None,
            report: scheck.CheckReport | None = None, fault_plan: Sequence[Fault] = ()) -> dict[str, Any]:
        """Replay ``schedule``; write results into ``out`` (see the module docstring) and return them.

        ``fault_plan`` (from :func:`emulator.faults.parse_faults`) fires in
        their measured repetition; the network and the controller are
        restored afterwards, so a session stays usable for the next run.

        Raises :class:`ReplayFailed` naming the rank when an agent fails, hangs
        or computes wrong data; what was measured is in ``out/results.json``.
        """
        topo, en = self.topo, self.en
        out = os.path.abspath(out)  # the agents' working directory is the project's, not ours
        if report is None:
            report = scheck.predict(schedule, topo, self.policy, seed=self.seed, latency=self.latency, mtu=self.mtu)
        os.makedirs(os.path.join(out, "agents"), exist_ok=True)
        sched_path = os.path.join(out, "schedule.json")
        sformat.save(schedule, sched_path)
        write_json_atomic(os.path.join(out, "topology.json"), topo.to_json())
        planned = scost.transfers(schedule, topo, self.policy, self.seed)
        paths = send_paths(topo, planned, self.latency, self.mtu)
        plan_path = os.path.join(out, "latency.json")
        write_json_atomic(plan_path, latency_plan(paths))
        for name in ("timeline.jsonl", "links.jsonl"):
            open(os.path.join(out, name), "w").close()
        results: dict[str, Any] = {
            "config": {**(config or {}), "algorithm": schedule.algorithm, "ranks": schedule.p,
                       "size": schedule.size, "topology": topo.spec, "routing": self.policy, "seed": self.seed,
                       "repeat": repeat, "warmup": warmup, "mtu": self.mtu},
            "fabric": self.latency.profile.to_json() if self.latency.profile is not None else None,
            "latency": self.latency.to_json(),
            "link_mbps": topo.host_bw,
            "switch_link_mbps": topo.switch_bw,
            "datapath": en.datapath,
            "bringup_s": en.bringup_s,
            "prediction": report.to_json(),
            "repetitions": [],
            "warmup": [],
            "status": "running",
            "outcome": "running",
            "error": None,
            "faults": [],
        }
        results_path = os.path.join(out, "results.json")
        write_json_atomic(results_path, results)
        calibration = fidelity.load_calibration(self.mtu)
        floors = report.latency_floors()
        dp_bytes = fidelity.datapath_bytes(planned)
        timeout = timeout_s or _default_timeout(report.predicted_time_s)
        stats_offset = self._stats_offset()
        agents: dict[int, Any] = {}
        control: ControlServer | None = None
        captures: list[Any] = []
        try:
            control = ControlServer(os.path.join(en.state.path, "control.sock"), schedule.p)
            for prog in schedule.ranks:
                host = en.host(prog.host)
                argv = ["--schedule", sched_path, "--topology", self.topo_path, "--rank", str(prog.rank),
                        "--control", control.path, "--log", os.path.join(out, "agents", f"rank-{prog.rank}.log"),
                        "--latency", plan_path]
                assert self.launcher is not None, "run() on a session that is not started"
                proc = self.launcher.spawn(host.pid, argv, os.path.join(out, "agents", f"rank-{prog.rank}.stderr"))
                agents[prog.rank] = proc
                en.state.record_process("agent", proc.pid, rank=prog.rank)
            _wait_for(control, agents, Msg.READY, set(agents), timeout=60.0)
            for link in pcap or []:
                captures.append(fidelity.start_capture(en, topo, link, out))
            for rep in range(warmup + repeat):
                warm = rep < warmup
                before = fidelity.snapshot(en, topo)
                start_at = time.monotonic() + START_MARGIN_S
                mine = [f for f in fault_plan if not warm and f.rep == rep - warmup]
                injector = Injector(mine, self._fault_actions(agents), start_at) if mine else None
                _send_all(control, Msg.GO, rep=rep, start_at=start_at,
                                 watch_steps=injector.watch_steps if injector else [])
                if injector is not None:
                    injector.start()
                try:
                    done = _wait_for(control, agents, Msg.DONE, set(agents), timeout=timeout,
                                     on_step=injector.step_started if injector else None)
                finally:
                    if injector is not None:
                        results["faults"] += self._fault_records(injector.finish(), planned, rep)
                after = fidelity.snapshot(en, topo)
                op_times = {r: {int(i): (st, e) for i, st, e in msg["ops"]} for r, msg in done.items()}
                metrics = repetition_metrics(schedule, op_times, report)
                wrong = {r: msg["wrong"] for r, msg in done.items() if not msg["correct"]}
                metrics["rep"] = rep
                metrics["correct"] = not wrong
                sends = {r: {int(i): v for i, v in msg.get("sends", {}).items()} for r, msg in done.items()}
                transfers = timeline_records(schedule, rep, op_times, sends)
                metrics["faults"] = [f for f in results["faults"] if f["rep_index"] == rep and f["fired_s"] is not None]
                if metrics["faults"]:
                    _measure_affected(metrics["faults"], transfers)
                metrics["fidelity"] = fidelity.assess(before, after, metrics["time_s"], dp_bytes, calibration, floors,
                                                      fidelity.lateness(*send_lateness(schedule, sends, paths)))
                for rec in fidelity.link_records(before, after, rep):
                    append_jsonl(os.path.join(out, "links.jsonl"), rec)
                for rec in transfers:
                    append_jsonl(os.path.join(out, "timeline.jsonl"), rec)
                (results["warmup"] if warm else results["repetitions"]).append(metrics)
                measured = results["repetitions"]
                if measured:
                    results["busbw_mbps_median"] = statistics.median(r["busbw_mbps"] for r in measured)
                    results["time_s_median"] = statistics.median(r["time_s"] for r in measured)
                    results["measured_over_predicted_median"] = results["time_s_median"] / report.predicted_time_s
                    results["trusted"] = all(r["fidelity"]["trusted"] for r in measured)
                write_json_atomic(results_path, results)
                label = "warmup" if warm else f"rep {rep - warmup + 1}/{repeat}"
                self.echo(f"  {label}: {metrics['time_s']:.3f} s, busbw {metrics['busbw_mbps']:.2f} Mbit/s, "
                          f"measured/predicted {metrics.get('measured_over_predicted') or 0:.2f}, "
                          f"{'correct' if not wrong else 'WRONG'}{fidelity.flag_text(metrics['fidelity'])}")
                if wrong:
                    rank = min(wrong)
                    raise ReplayFailed(f"rank {rank} computed wrong data: {wrong[rank]}")
            _send_all(control, Msg.QUIT)
            _reap(agents, 5.0)
            results["status"] = "ok"
            results["outcome"] = "degraded" if any(f["fired_s"] is not None for f in results["faults"]) else "ok"
            return results
        except BaseException as exc:
            results["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            results["outcome"] = results["status"]
            results["error"] = str(exc) or type(exc).__name__
            raise
        finally:
            fidelity.stop_captures(captures)
            _reap(agents, 0.5)
            if fault_plan:
                self._restore()
            if control is not None:
                control.close()
                try:
                    os.unlink(control.path)
                except OSError:
                    pass
            self._copy_port_stats(stats_offset, os.path.join(out, "links.jsonl"))
            write_json_atomic(results_path, results)

    # ------------------------------------------------------------- faults
    def _set_link(self, a: str, b: str, up: bool) -> None:
        for intf in faults.link_ends(self.topo, a, b):
            run(["ip", "link", "set", "dev", intf, "up" if up else "down"])
        key = (a, b) if topology.node_sort_key(a) <= topology.node_sort_key(b) else (b, a)
        if up:
            self._downed.discard(key)
        else:
            self._downed.add(key)

    def _wait_controller(self, ready: Callable[[dict[str, Any]], bool], timeout_s: float = 15.0) -> float | None:
        """Seconds until the controller's status satisfies ``ready`` with every switch confirmed; None if never."""
        t0 = time.monotonic()

        def confirmed() -> bool | None:
            if self.ctl is None or not self.ctl.running():
                raise _Gone
            st = self.ctl.status()
            return st and ready(st) and len(st.get("installed", [])) == len(self.topo.switches)

        try:
            return time.monotonic() - t0 if wait_until(confirmed, timeout_s, 0.005) else None
        except _Gone:
            return None

    def _fault_actions(self, agents: dict[int, Any]) -> dict[str, Callable[[Fault], Any]]:
        def link(fault: Fault, up: bool) -> tuple[str, float | None]:
            a, b = fault.link
            name = sorted((a, b), key=topology.node_sort_key)
            self._set_link(a, b, up)
            t = self._wait_controller(lambda st: (name in st.get("failed_links", [])) != up)
            if t is None:
                return f"{a}-{b} {'up' if up else 'down'}; no controller rerouted it", None
            return f"{a}-{b} {'up' if up else 'down'}; controller rerouted", t

        def controller_kill(fault: Fault) -> str:
            self.ctl.kill()
            return "controller killed; switches keep their entries"

        def controller_restart(fault: Fault) -> tuple[str, float | None]:
            self.ctl.kill()
            t0 = time.monotonic()
            self.ctl.start()
            self.ctl.wait_installed(timeout=30.0, no_failures=False)
            return "controller restarted; every switch resynchronised", time.monotonic() - t0

        def agent_kill(fault: Fault) -> str:
            agents[fault.rank].kill()
            return f"rank {fault.rank}'s agent killed"

        return {"link_down": lambda f: link(f, False), "link_up": lambda f: link(f, True),
                "controller_kill": controller_kill, "controller_restart": controller_restart,
                "agent_kill": agent_kill}

    def _fault_records(self, events: list[FaultEvent], planned: list[Any], rep: int) -> list[dict[str, Any]]:
        out = []
        for ev in events:
            rec = ev.to_json()
            rec["rep_index"] = rep
            if ev.fault.action == "link_down":
                rec["affected_transfers"] = faults.crossing_transfers(planned, *ev.fault.link)
            if ev.fired_s is None:
                rec["note"] = "not fired: the repetition ended first"
            out.append(rec)
        return out

    def _restore(self) -> None:
        """Links up and a running controller with every switch confirmed, after a run with faults."""
        for a, b in sorted(self._downed):
            self._set_link(a, b, True)
        if self.ctl is not None and not self.ctl.running():
            self.ctl.start()
        if self.ctl is not None:
            self.ctl.wait_installed(timeout=30.0)

    def _copy_port_stats(self, offset: int, dest: str) -> None:
        """The controller's port counters written since ``offset``, into this run's links.jsonl."""
        try:
            with open(self.stats_file, encoding="utf-8") as fh:
                fh.seek(offset)
                lines = fh.readlines()
        except OSError:
            return
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            append_jsonl(dest, {"source": "controller", **rec})


def replay(cfg: ReplayConfig, echo=print, prep: Prepared | None = None) -> dict[str, Any]:
    """``emu replay``: check, bring up, run one schedule, tear down. Returns the results.

    Raises :class:`UserError` for bad input (nothing started) and
    :class:`ReplayFailed` when the run fails (results so far are kept).
    """
    prep = prep or prepare(cfg)
    os.makedirs(cfg.out, exist_ok=True)
    with ReplaySession(prep.topo, cfg.routing, seed=cfg.seed, datapath=cfg.datapath, latency=prep.latency,
                       stats_interval_s=cfg.stats_interval_s, work_dir=os.path.join(cfg.out, "session"),
                       echo=echo) as session:
        plan = faults.parse_faults(cfg.faults, prep.topo, prep.schedule.p, prep.schedule.steps, cfg.repeat)
        return session.run(prep.schedule, cfg.out, repeat=cfg.repeat, warmup=cfg.warmup, timeout_s=cfg.timeout_s,
                           pcap=cfg.pcap, config=asdict(cfg), report=prep.report, fault_plan=plan)


def _measure_affected(records: list[dict[str, Any]], transfers: list[dict[str, Any]]) -> None:
    """Add each affected transfer's measured duration (from :func:`timeline_records`) to the fault records."""
    durations = {(t["step"], t["src"], t["dst"]): round(t["end"] - t["start"], 4) for t in transfers}
    for rec in records:
        for t in rec.get("affected_transfers", []):
            t["time_s"] = durations.get((t["step"], t["src"], t["dst"]))


class _Gone(Exception):
    """The controller stopped while we waited for it."""


def _send_all(control: ControlServer, kind: Msg, **fields: Any) -> None:
    try:
        control.send_all(kind, **fields)
    except ControlError as exc:
        raise ReplayFailed(str(exc)) from None


def _wait_for(control: ControlServer, agents: dict[int, Any], kind: Msg, ranks: set[int], *,
              timeout: float, on_step: Callable[[int], None] | None = None) -> dict[int, dict[str, Any]]:
    """Wait for message ``kind`` from every rank; fail naming the rank on error, death or timeout.

    ``step`` messages (an agent released its first operation of a watched
    step) go to ``on_step``.
    """
    got: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while set(got) != ranks:
        for msg in control.poll(0.2):
            rank = int(msg.get("rank", -1))
            if msg["type"] == Msg.ERROR:
                raise ReplayFailed(f"rank {rank} failed: {msg.get('message')}")
            if msg["type"] == Msg.CLOSED and rank not in got:
                raise ReplayFailed(f"rank {rank}: agent exited (status {agents[rank].poll()}) before '{kind}'")
            if msg["type"] == kind:
                got[rank] = msg
            elif msg["type"] == Msg.STEP and on_step is not None:
                on_step(int(msg["step"]))
        for rank, proc in agents.items():
            if rank not in got and proc.poll() is not None:
                raise ReplayFailed(f"rank {rank}: agent exited with status {proc.returncode} before '{kind}'")
        if time.monotonic() > deadline:
            missing = sorted(ranks - set(got))
            raise ReplayFailed(f"rank {missing[0]} (of {len(missing)} missing: {missing[:8]}) did not report "
                               f"'{kind}' within {timeout:.0f} s: agent hung")
    return got


def _reap(agents: dict[int, Any], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for proc in agents.values():
        if proc.poll() is None:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except Exception:
                pass
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(2)
            except Exception:
                pass
