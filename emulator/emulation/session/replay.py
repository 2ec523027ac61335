"""``emu replay``: run a schedule over real TCP on an emulated network and measure it.

:func:`replay` checks everything first (schedule, topology, routing, the
fabric profile; the schedule must be proven to compute its collective), then
brings up the controller and the network (:class:`ReplaySession`), starts one
:mod:`emulator.emulation.agents.agent` per rank inside its host (:class:`emulator.emulation.agents.fleet.Fleet`),
and runs ``warmup + repeat`` repetitions behind a barrier, firing the faults
of the plan in theirs (:mod:`emulator.emulation.session.fault_injection`). After every
repetition it rewrites ``results.json`` atomically, so whatever was measured
survives a failure or Ctrl-C. Files in the output directory:

* ``results.json`` -- :class:`emulator.runs.results.CellResults`: configuration
  (with ``agent_memory_limit_bytes``, the largest memory limit an agent ran
  under, and ``agent_memory_limits_bytes`` per rank),
  the fabric profile (``fabric``) and the latency model (``latency``),
  ``link_mbps``, the prediction of ``schedule check``, ``repetitions``
  (``time_s``, ``algbw_mbps``, ``busbw_mbps``, per-step times, ``correct``,
  measured/predicted ratio, fidelity), the medians, ``status`` and ``error``;
* ``schedule.json``, ``topology.json`` -- what the agents ran on;
* ``latency.json`` -- the agents' latency plan: per sending and receiving
  rank, the latency terms of the path (:mod:`emulator.model.latency`);
* ``timeline.jsonl`` -- every transfer: repetition, step, source and
  destination rank and host, bytes, start and end (CLOCK_MONOTONIC seconds),
  and when the receive was posted, the clear to send came and ``sendall``
  began, and how late that was (:func:`emulator.runs.metrics.timeline_records`);
  and every compute operation, ``"kind": "compute"``
  (:func:`emulator.runs.metrics.compute_records`);
* ``links.jsonl`` -- the controller's port counters over time, tc qdisc
  statistics of every link interface and TCP retransmissions per host, per
  repetition;
* ``agents/rank-R.log`` -- each agent's own log; ``agents/rank-R.schedule.json``
  the rank's view of the schedule its agent reads (its own operations only).

What one repetition measured is computed by the pure functions of
:mod:`emulator.runs.metrics` (their names are importable from here too).

Every agent runs under a memory limit (``RLIMIT_DATA``,
:mod:`emulator.emulation.machine.confinement`) sized from the admission estimate of its buffers
(:func:`emulator.runs.admission.agent_limit_bytes`; ``agent_memory_limit`` of
:class:`ReplaySession` replaces it): a runaway fails the run naming its rank
and its limit, and never reaches the kernel's out-of-memory killer.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from emulator.base.errors import UserError, int_field
from emulator.base.files import PROJECT_ROOT, append_jsonl, write_json_atomic
from emulator.emulation.agents.agent import latency_plan
from emulator.emulation.agents.agent_launcher import AgentLauncher, LauncherError
from emulator.emulation.agents.fleet import AgentFiles, Fleet, RankReport
from emulator.emulation.agents.fleet import ReplayFailed as ReplayFailed
from emulator.emulation.agents.interconnect import DomainArbiter, check_directory
from emulator.emulation.cluster.cluster_agents import ClusterSpawner, RemoteAgentProcess, ServerClock
from emulator.emulation.cluster.cluster_network import ClusterNetwork
from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.calibration_file import Calibration
from emulator.emulation.network.controller_process import ControllerProcess
from emulator.emulation.network.emulated_network import EmulatedNetwork
from emulator.emulation.network.ovs_sockets import vswitchd_pid
from emulator.emulation.session import captures, fidelity
from emulator.emulation.session.fault_injection import FaultActions, fault_records, measure_affected
from emulator.model import fabric, routing, topology
from emulator.model.cluster_placement import Placement
from emulator.model.fabric import OnNetwork, Resolved
from emulator.model.latency import LatencyModel, PathLatency
from emulator.model.prediction import check as scheck
from emulator.model.prediction import cost as scost
from emulator.model.schedule import format as sformat
from emulator.model.schedule.format import Schedule
from emulator.model.workloads import training
from emulator.runs import admission, clocks
from emulator.runs import fault_plan as faults
from emulator.runs.cluster_file import Cluster, ClusterRun
from emulator.runs.fault_plan import Fault, Injector
from emulator.runs.metrics import (
    agent_lag,
    compute_records,
    repetition_metrics,
    send_lateness,
    send_paths,
    timeline_records,
)
from emulator.runs.results import CellResults, Repetition
from emulator.runs.trust import Verdict

log = logging.getLogger(__name__)

#: Every rank starts a repetition at the same instant on the shared monotonic
#: clock, this long after the "go" message leaves (enough for 16-64 agents on
#: 2 cores to wake, read it and start their worker threads).
START_MARGIN_S = 0.1


@dataclass
class ReplayConfig(OnNetwork):
    """``emu replay``'s input: the schedule file, the network it replays on (the topology and the real fabric it
    stands for, :func:`emulator.model.fabric.resolve`), and how."""

    schedule: str
    network: Resolved
    routing: str
    out: str
    repeat: int = 3
    warmup: int = 1
    seed: int = 0
    timeout_s: float | None = None  # per repetition; default from the prediction
    pcap: list[str] = field(default_factory=list)
    datapath: str = "auto"
    stats_interval_s: float = 0.5
    faults: list[Any] = field(default_factory=list)  # specs, see emulator.runs.fault_plan

    def check(self) -> None:
        for name, value, low in (("repeat", self.repeat, 1), ("warmup", self.warmup, 0), ("seed", self.seed, 0)):
            int_field("replay", name, value, low)
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise UserError(f"replay: field 'timeout': expected seconds > 0, got {self.timeout_s!r}")

    def to_json(self) -> dict[str, Any]:
        """As results.json records it: the topology spec as given, the fabric profile as its canonical spec."""
        return {"schedule": self.schedule, "topology": self.topology, "routing": self.routing, "out": self.out,
                "repeat": self.repeat, "warmup": self.warmup, "seed": self.seed, "timeout_s": self.timeout_s,
                "pcap": list(self.pcap), "datapath": self.datapath, "stats_interval_s": self.stats_interval_s,
                "fabric": self.fabric.spec(), "faults": list(self.faults)}


def default_timeout(predicted_s: float) -> float:
    """A repetition's time limit when none is given: five times the prediction and 15 s, at least 30 s."""
    return max(30.0, 5 * predicted_s + 15.0)


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` checked and computed, before anything starts."""

    schedule: Schedule
    topo: topology.Topology
    profile: fabric.FabricProfile
    latency: LatencyModel
    report: scheck.CheckReport


def prepare(cfg: ReplayConfig, calibration: Calibration | None = None) -> Prepared:
    """Every check that can fail on bad input, before anything starts.

    The network is the config's, resolved at the edge; its MTU is the
    profile's, and the prediction uses the profile with ``calibration``'s
    intrinsic latency (default: this machine's calibration at that MTU).
    """
    cfg.check()
    schedule = sformat.load(cfg.schedule)
    # a scaled training iteration stands for the full one on a fabric with its latencies scaled alike
    profile = fabric.for_workload_scale(cfg.fabric, training.workload_scale(schedule))
    topo = cfg.network.topology
    routing.check_policy(topo, cfg.routing)
    if calibration is None:
        calibration = calibration_file.load_calibration(profile.emulated_mtu)
    model = fidelity.latency_model(profile, calibration)
    report = scheck.predict(schedule, topo, cfg.routing, seed=cfg.seed, latency=model, mtu=profile.emulated_mtu,
                            where=f"schedule {cfg.schedule!r}")
    for link in cfg.pcap:
        captures.parse_link_name(topo, link)
    faults.parse_faults(cfg.faults, topo, schedule.p, schedule.steps, cfg.repeat, where="replay: fault")
    return Prepared(schedule, topo, profile, model, report)


@dataclass(frozen=True)
class RunPlan:
    """One :meth:`ReplaySession.run`: the schedule, where its files go, and what each repetition is judged by."""

    schedule: Schedule
    out: str  # absolute: the agents' working directory is the project's, not ours
    repeat: int
    warmup: int
    report: scheck.CheckReport
    fault_plan: Sequence[Fault]
    timeout_s: float  # per repetition
    planned: list[scost.Transfer]  # every transfer with its routed path
    paths: dict[tuple[int, int], PathLatency]  # per (sending, receiving) rank
    files: AgentFiles
    calibration: Calibration | None
    memory_limits: dict[int, int] = field(default_factory=dict)  # rank -> its agent's RLIMIT_DATA bytes

    @property
    def results_path(self) -> str:
        return os.path.join(self.out, "results.json")

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)

    def label(self, rep: int) -> str:
        """How the console names repetition ``rep`` (warm-ups first)."""
        return "warmup" if rep < self.warmup else f"rep {rep - self.warmup + 1}/{self.repeat}"

    def faults_of(self, rep: int) -> list[Fault]:
        """The faults that fire in repetition ``rep`` (counting warm-ups; they never carry faults)."""
        return [f for f in self.fault_plan if rep >= self.warmup and f.rep == rep - self.warmup]


class ReplaySession:
    """A controller and a network kept up for several schedules (one topology, routing and seed).

    ``with ReplaySession(topo, "bigraph") as session: session.run(schedule, out_dir)``.

    ``latency`` is the fabric profile with this machine's intrinsic latency
    (:func:`emulator.emulation.session.fidelity.latency_model`); the network's MTU is the
    profile's (``mtu`` without a profile), and where the model puts switch
    latency on the links (netem), every switch port delays its packets.
    Without a profile the agents add no latency. With ``agents=False`` no
    agent launcher starts: the session is a controller and a network for
    programs of one's own (``emu mpirun``). ``agent_memory_limit(schedule,
    rank)`` is the ``RLIMIT_DATA`` bytes of each rank's agent (default: the
    admission estimate, :func:`emulator.runs.admission.agent_limit_bytes`; None:
    no limit).
    """

    def __init__(self, topo: topology.Topology, policy: str, *, seed: int = 0, datapath: str = "auto",
                 latency: LatencyModel | None = None, mtu: int = topology.DEFAULT_MTU, stats_interval_s: float = 0.5,
                 work_dir: str | None = None, echo=print, network_options: dict[str, Any] | None = None,
                 lanes: int = 1, agents: bool = True,
                 agent_memory_limit: Callable[[Schedule, int], int | None] = admission.agent_limit_bytes,
                 cluster: Cluster | None = None, placement: Placement | None = None):
        routing.check_policy(topo, policy)
        if cluster is not None and topo.has_domain:
            raise UserError(f"replay: topology {topo.spec}: a servers' interconnect (domain_bw) runs on one "
                            "machine only (its transfers are timed over Unix sockets), not on a cluster")
        self.topo = topo
        self.policy = policy
        self.seed = seed
        self.lanes = lanes
        self.datapath = datapath
        self.latency = latency or LatencyModel()
        self.mtu = self.latency.profile.emulated_mtu if self.latency.profile is not None else mtu
        self.stats_interval_s = stats_interval_s
        self.echo = echo
        self.work_dir = work_dir
        self.network_options = network_options or {}
        self.agents = agents  # False: no agent launcher (emu mpirun runs its own programs in the hosts)
        self.agent_memory_limit = agent_memory_limit
        self.cluster = cluster  # None: this machine alone
        self.placement = placement
        self.clock_offsets: list[ServerClock] = []  # the other servers' clocks at the last fleet's start
        self.ctl: Any = None
        self.en: Any = None
        self.launcher: AgentLauncher | ClusterSpawner | None = None
        self.topo_path = ""
        self.stats_file = ""
        self.vswitchd_pid: int | None = None  # the ovs-vswitchd the network was built on

    @property
    def compute_dilation(self) -> float:
        """What a compute operation's seconds are multiplied by: the fabric profile's dilation (1 without one)."""
        return fabric.dilation_of(self.latency.profile)

    @property
    def bringup_s(self) -> float | None:
        """How long the network took to come up (None before it has)."""
        return self.en.bringup_s if self.en is not None else None

    def __enter__(self) -> ReplaySession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.work_dir = self.work_dir or tempfile.mkdtemp(prefix="ef-replay-")
        os.makedirs(self.work_dir, exist_ok=True)
        self.topo_path = os.path.abspath(os.path.join(self.work_dir, "topology.json"))
        write_json_atomic(self.topo_path, self.topo.to_json())
        if self.cluster is not None:
            write_json_atomic(os.path.join(self.work_dir, "placement.json"), self.cluster_config()["cluster"])
        self.stats_file = os.path.join(self.work_dir, "controller-ports.jsonl")
        try:
            self.ctl = ControllerProcess.for_network(self.topo_path, self.policy, self.seed, stats_file=self.stats_file,
                                                     stats_interval_s=self.stats_interval_s,
                                                     log_file=os.path.join(self.work_dir, "controller.log"),
                                                     lanes=self.lanes, **self._controller_host())
            self.ctl.start()
            self.en = self._network()
            self.en.start()
            self.vswitchd_pid = vswitchd_pid()
            self.ctl.wait_installed()
            if not self.agents:
                return
            launcher = AgentLauncher(dict(os.environ, PYTHONPATH=PROJECT_ROOT), PROJECT_ROOT,
                                     os.path.join(self.work_dir, "launcher.stderr")).start()
            self.launcher = launcher
            assert launcher.proc is not None
            self.en.state.record_process("launcher", launcher.proc.pid)
            if self.cluster is not None:
                spawner = ClusterSpawner(self.cluster, launcher, self.work_dir)
                self.launcher = spawner
                spawner.start()
                for pid in spawner.pids():
                    self.en.state.record_process("ssh", pid)
        except BaseException:
            self.stop()
            raise

    def _collect(self, spawner: ClusterSpawner, results: CellResults) -> None:
        """From the other servers: the agents' logs, and their clocks again (flagged ``clock_offset`` when they
        are not small against the shortest step: :mod:`emulator.runs.clocks`)."""
        for problem in spawner.collect():
            self.echo(f"  warning: {problem}")
        try:
            after = [c.to_json() for c in spawner.clock_offsets()]
        except (LauncherError, OSError):  # a lost server: the cell failed already
            after = []
        results.clocks = clocks.clock_records([c.to_json() for c in self.clock_offsets], after)
        verdict = clocks.check(results.clocks, results.prediction.get("per_step") or []).verdict
        if results.repetitions and verdict is Verdict.FLAGGED:  # unchecked: the results' own summary says so
            results.flag_all(clocks.FLAG)

    def cluster_config(self) -> dict[str, Any]:
        """What a cell's results record of the cluster it ran on (nothing on one machine): the cluster, its head
        and where each node ran."""
        if self.cluster is None or self.placement is None:
            return {}
        return {"cluster": {"name": self.cluster.name, "head": self.cluster.head, **self.placement.to_json()}}

    def _lost_server(self, exc: BaseException) -> str | None:
        """Why a run on a cluster failed when a server was lost under it (the agents saw only their side)."""
        if not isinstance(exc, (ReplayFailed, LauncherError, OSError)) or not isinstance(self.en, ClusterNetwork):
            return None
        lost = self.en.lost()
        return None if lost is None or lost in str(exc) else lost

    def _fault_runner(self) -> dict[str, Any]:
        """Where a fault's link commands run: here, or on a cluster the server of each link end."""
        return {"runner": self.en.interface_runner()} if isinstance(self.en, ClusterNetwork) else {}

    def _controller_host(self) -> dict[str, str]:
        """Where the controller listens: loopback, or on a cluster the head's underlay address."""
        return {} if self.cluster is None else {"host": self.cluster.server(self.cluster.head).underlay}

    def _network(self) -> EmulatedNetwork:
        options = dict(controller=self.ctl.address, datapath=self.datapath, label="replay", mtu=self.mtu,
                       switch_delay_s=self.latency.link_delay_per_switch_s, **self.network_options)
        if self.cluster is None:
            return EmulatedNetwork(self.topo, **options)
        assert self.placement is not None
        return ClusterNetwork(self.topo, self.cluster, self.placement, **options)

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

    def damage(self) -> str | None:
        """What broke under this session since it started, or None: its controller exited, or Open vSwitch was
        restarted (the new ovs-vswitchd has lost the flow entries, the enlarged socket buffers and the controller's
        connection)."""
        if self.ctl is not None and not self.ctl.running():
            return f"its controller exited ({self.ctl.log_tail(1) or 'no log'})"
        now = vswitchd_pid()
        if self.vswitchd_pid is not None and now != self.vswitchd_pid:
            return f"Open vSwitch was restarted under it (ovs-vswitchd pid {self.vswitchd_pid} -> {now})"
        if isinstance(self.en, ClusterNetwork):
            return self.en.lost()
        return None

    def stats_offset(self) -> int:
        """Where the controller's port-counter file ends now (see :meth:`copy_port_stats`)."""
        try:
            return os.path.getsize(self.stats_file)
        except OSError:
            return 0

    def run(self, schedule: Schedule, out: str, *, repeat: int = 3, warmup: int = 1, timeout_s: float | None = None,
            pcap: list[str] | None = None, config: dict[str, Any] | None = None,
            report: scheck.CheckReport | None = None, fault_plan: Sequence[Fault] = ()) -> CellResults:
        """Replay ``schedule``; write results into ``out`` (see the module docstring) and return them.

        ``fault_plan`` (from :func:`emulator.runs.fault_plan.parse_faults`) fires in
        their measured repetition; the network and the controller are
        restored afterwards, so a session stays usable for the next run.

        Raises :class:`ReplayFailed` naming the rank when an agent fails, hangs
        or computes wrong data; what was measured is in ``out/results.json``.
        """
        plan = self._plan(schedule, out, repeat, warmup, timeout_s, report, fault_plan)
        results = self._begin(plan, config)
        stats_offset = self.stats_offset()
        fleet: Fleet | None = None
        actions: FaultActions | None = None
        pcaps: list[Any] = []
        arbiter: DomainArbiter | None = None
        try:
            if plan.files.domain is not None:
                arbiter = DomainArbiter(self.topo, plan.files.domain).start()
            fleet = self._start_fleet(plan)
            if plan.fault_plan:
                actions = FaultActions(self.topo, self.ctl, fleet.kill, **self._fault_runner())
            for link in pcap or []:
                pcaps.append(captures.start_capture(self.en, self.topo, link, plan.out))
            for rep in range(warmup + repeat):
                self._run_repetition(plan, results, fleet, actions, rep)
            fleet.quit()
            results.status = "ok"
            results.outcome = "degraded" if any(f["fired_s"] is not None for f in results.faults) else "ok"
            return results
        except BaseException as exc:
            results.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            results.outcome = results.status
            lost = self._lost_server(exc)
            results.error = lost or str(exc) or type(exc).__name__
            if lost is not None:
                raise ReplayFailed(lost) from exc
            raise
        finally:
            captures.stop_captures(pcaps)
            if fleet is not None:
                fleet.close()
            if arbiter is not None:
                arbiter.close()
                results.domain = {"flows": arbiter.flows, "arbiter_late_max_s": arbiter.late_s,
                                  "error": arbiter.error}
            if isinstance(self.launcher, ClusterSpawner):
                self._collect(self.launcher, results)
            if actions is not None:
                actions.restore()
            self.copy_port_stats(stats_offset, plan.path("links.jsonl"))
            results.save(plan.results_path)

    def _plan(self, schedule: Schedule, out: str, repeat: int, warmup: int, timeout_s: float | None,
              report: scheck.CheckReport | None, fault_plan: Sequence[Fault]) -> RunPlan:
        """What a run needs before anything is written: the prediction, the routed transfers, the agents' files."""
        out = os.path.abspath(out)
        if routing.hashes_five_tuples(self.policy) and lanes_of(schedule) > self.lanes:
            raise UserError(f"replay: schedule {schedule.algorithm!r} uses {lanes_of(schedule)} lanes, but this "
                            f"network's ecmp routes {self.lanes} per host pair exactly: start the session with "
                            f"lanes={lanes_of(schedule)}")
        if report is None:
            report = scheck.predict(schedule, self.topo, self.policy, seed=self.seed, latency=self.latency,
                                    mtu=self.mtu)
        planned = scost.transfers(schedule, self.topo, self.policy, self.seed)
        domain = self.en.state.path if any(t.domain for t in planned) else None
        if domain is not None:
            try:
                check_directory(domain, schedule.p)
            except ValueError as exc:
                raise UserError(f"replay: {exc}") from None
        files = AgentFiles(schedule=os.path.join(out, "schedule.json"), topology=self.topo_path,
                           latency=os.path.join(out, "latency.json"), logs=os.path.join(out, "agents"),
                           domain=domain)
        return RunPlan(schedule=schedule, out=out, repeat=repeat, warmup=warmup, report=report,
                       fault_plan=tuple(fault_plan), timeout_s=timeout_s or default_timeout(report.predicted_time_s),
                       planned=planned, paths=send_paths(self.topo, planned, self.latency, self.mtu), files=files,
                       calibration=calibration_file.load_calibration(self.mtu),
                       memory_limits=self.memory_limits(schedule))

    def memory_limits(self, schedule: Schedule) -> dict[int, int]:
        """Every rank's agent's ``RLIMIT_DATA`` bytes (ranks without one run without a limit)."""
        limits = {prog.rank: self.agent_memory_limit(schedule, prog.rank) for prog in schedule.ranks}
        return {rank: limit for rank, limit in limits.items() if limit is not None}

    def _begin(self, plan: RunPlan, config: dict[str, Any] | None) -> CellResults:
        """The output folder with the agents' files, empty logs, and a ``running`` results.json."""
        schedule, topo = plan.schedule, self.topo
        os.makedirs(plan.files.logs, exist_ok=True)
        plan.files.write_schedule(schedule)
        write_json_atomic(plan.path("topology.json"), topo.to_json())
        write_json_atomic(plan.files.latency, latency_plan(plan.paths, self.compute_dilation))
        for name in ("timeline.jsonl", "links.jsonl"):
            open(plan.path(name), "w").close()
        results = CellResults(
            config={**(config or {}), "algorithm": schedule.algorithm, "collective": schedule.collective,
                    "ranks": schedule.p, "size": schedule.size,
                    "topology": topo.spec, "routing": self.policy, "seed": self.seed, "repeat": plan.repeat,
                    "warmup": plan.warmup, "mtu": self.mtu,
                    "agent_memory_limit_bytes": max(plan.memory_limits.values(), default=None),
                    "agent_memory_limits_bytes": {str(r): v for r, v in sorted(plan.memory_limits.items())},
                    **self.cluster_config()},
            fabric=self.latency.profile.to_json() if self.latency.profile is not None else None,
            latency=self.latency.to_json(), prediction=plan.report.to_json(), link_mbps=topo.host_bw,
            switch_link_mbps=topo.switch_bw, datapath=self.en.datapath, bringup_s=self.en.bringup_s)
        results.save(plan.results_path)
        return results

    def _start_fleet(self, plan: RunPlan) -> Fleet:
        """One agent per rank in its host, every one ready (connected to its peers)."""
        if self.launcher is None:
            raise RuntimeError("ReplaySession.run() on a session that is not started")
        en = self.en
        hosts = {prog.rank: en.host(prog.host).pid for prog in plan.schedule.ranks}
        control_host = None
        if isinstance(self.launcher, ClusterSpawner):
            assert self.cluster is not None and self.placement is not None
            self.launcher.rank_server = {p.rank: self.placement.of[p.host] for p in plan.schedule.ranks}
            control_host = self.cluster.server(self.cluster.head).underlay
        fleet = Fleet.start(os.path.join(en.state.path, "control.sock"), hosts, self.launcher, plan.files,
                            on_spawn=self._record_agent, memory_limits=plan.memory_limits,
                            control_host=control_host)
        if isinstance(en, ClusterNetwork):
            fleet.health = en.lost
        try:
            fleet.wait_ready()
            if isinstance(self.launcher, ClusterSpawner):
                self.clock_offsets = self.launcher.clock_offsets()
                ahead = {c.server: c.offset_s for c in self.clock_offsets}
                fleet.clock_offsets = {rank: ahead[server] for rank, server in self.launcher.rank_server.items()
                                       if server in ahead}
        except BaseException:
            fleet.close()
            raise
        return fleet

    def _record_agent(self, rank: int, proc: Any) -> None:
        """A head's agent in the run state (another server's launcher records its own)."""
        if not isinstance(proc, RemoteAgentProcess):
            self.en.state.record_process("agent", proc.pid, rank=rank)

    def _run_repetition(self, plan: RunPlan, results: CellResults, fleet: Fleet, actions: FaultActions | None,
                        rep: int) -> None:
        """Run repetition ``rep`` (warm-ups first) with its faults, record it, and say how it went.

        Raises :class:`ReplayFailed` when a rank computed wrong data (after the repetition is recorded).
        """
        before = fidelity.snapshot(self.en, self.topo)
        start_at = time.monotonic() + START_MARGIN_S
        mine = plan.faults_of(rep)
        injector = Injector(mine, actions.table(), start_at) if mine and actions is not None else None
        fleet.go(rep, start_at, injector.watch_steps if injector is not None else [])
        if injector is not None:
            injector.start()
        try:
            done = fleet.wait_done(plan.timeout_s, on_step=injector.step_started if injector is not None else None)
        finally:
            if injector is not None:
                results.faults += fault_records(injector.finish(), plan.planned, rep)
        after = fidelity.snapshot(self.en, self.topo)
        measured = self._record(plan, results, rep, done, before, after)
        (results.warmup if rep < plan.warmup else results.repetitions).append(measured)
        results.save(plan.results_path)
        it = measured.iteration
        what = (f"iteration, scaling efficiency {it.scaling_efficiency:.2f}" if it is not None
                else f"busbw {measured.busbw_mbps:.2f} Mbit/s")
        self.echo(f"  {plan.label(rep)}: {measured.time_s:.3f} s, {what}, "
                  f"measured/predicted {measured.measured_over_predicted or 0:.2f}, "
                  f"{'correct' if measured.correct else 'WRONG'}{fidelity.flag_text(measured.fidelity)}")
        wrong = sorted(r for r, d in done.items() if not d.correct)
        if wrong:
            raise ReplayFailed(f"rank {wrong[0]} computed wrong data: {done[wrong[0]].wrong}")

    def _record(self, plan: RunPlan, results: CellResults, rep: int, done: dict[int, RankReport],
                before: fidelity.Snapshot, after: fidelity.Snapshot) -> Repetition:
        """The repetition's metrics, faults and fidelity; its transfers and link counters appended to the logs."""
        schedule = plan.schedule
        op_times = {r: d.ops for r, d in done.items()}
        sends = {r: d.sends for r, d in done.items()}
        measured = repetition_metrics(schedule, op_times, plan.report, rep=rep)
        measured.correct = all(d.correct for d in done.values())
        cpu = [d.cpu_s for d in done.values()]
        measured.agents_cpu_s = sum(c for c in cpu if c is not None) if None not in cpu else None
        transfers = timeline_records(schedule, rep, op_times, sends)
        # the same records as in results.faults: the affected transfers' durations land in both
        measured.faults = [f for f in results.faults if f["rep_index"] == rep and f["fired_s"] is not None]
        if measured.faults:
            measure_affected(measured.faults, transfers)
        lag = agent_lag(op_times, sends, {r: d.arrivals for r, d in done.items()}, measured.time_s)
        measured.fidelity = fidelity.assess(before, after, measured.time_s, fidelity.datapath_bytes(plan.planned),
                                            plan.calibration, plan.report.latency_floors(),
                                            fidelity.lateness(*send_lateness(schedule, sends, plan.paths)), lag)
        for rec in fidelity.link_records(before, after, rep):
            append_jsonl(plan.path("links.jsonl"), rec)
        for rec in transfers + compute_records(schedule, rep, op_times):
            append_jsonl(plan.path("timeline.jsonl"), rec)
        return measured

    def copy_port_stats(self, offset: int, dest: str) -> None:
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


def lanes_of(schedule: Schedule) -> int:
    """How many lanes (connections per ordered pair of ranks) ``schedule`` uses."""
    return 1 + max((op.lane for r in schedule.ranks for op in r.ops if op.is_comm), default=0)


def on_cluster(run: ClusterRun) -> Callable[..., ReplaySession]:
    """A session factory (as ``emu run``'s runner takes one) whose sessions spread over ``run``'s cluster."""

    def factory(topo: topology.Topology, policy: str, **options: Any) -> ReplaySession:
        return ReplaySession(topo, policy, cluster=run.cluster, placement=run.placement(topo), **options)
    return factory


def replay(cfg: ReplayConfig, echo=print, prep: Prepared | None = None,
           cluster: ClusterRun | None = None) -> CellResults:
    """``emu replay``: check, bring up, run one schedule, tear down. Returns the results.

    Raises :class:`UserError` for bad input (nothing started) and
    :class:`ReplayFailed` when the run fails (results so far are kept).
    """
    prep = prep or prepare(cfg)
    os.makedirs(cfg.out, exist_ok=True)
    factory = on_cluster(cluster) if cluster is not None else ReplaySession
    with factory(prep.topo, cfg.routing, seed=cfg.seed, datapath=cfg.datapath, latency=prep.latency,
                 stats_interval_s=cfg.stats_interval_s, work_dir=os.path.join(cfg.out, "session"),
                 echo=echo, lanes=lanes_of(prep.schedule)) as session:
        plan = faults.parse_faults(cfg.faults, prep.topo, prep.schedule.p, prep.schedule.steps, cfg.repeat)
        return session.run(prep.schedule, cfg.out, repeat=cfg.repeat, warmup=cfg.warmup, timeout_s=cfg.timeout_s,
                           pcap=cfg.pcap, config=cfg.to_json(), report=prep.report, fault_plan=plan)
