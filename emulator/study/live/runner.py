"""The live loop of ``emu run``: every cell of an experiment on emulated networks, resumable.

:class:`Runner` runs an experiment into one results folder
(:class:`emulator.study.folder.results_folder.ResultsFolder`, which owns the layout and decides
which cells are finished). It

1. writes the plan (``experiment.yaml``, ``experiment.json``) and marks the run
   ``running`` in ``run.json``;
2. skips every finished cell (``run.log`` says ``skipped``) and groups the
   rest by network: one network (controller + Mininet) per (topology,
   routing, seed, fabric), brought up only when it has unfinished cells;
3. runs the networks one after another. Each is brought up, probed
   (:mod:`emulator.runs.network_probe`; rebuilt up to :data:`emulator.runs.network_probe.REBUILDS` times
   while it fails; a network that fails again has its cells flagged
   ``probe_failed``), then runs its cells, each from an empty directory, and
   is torn down whatever happened;
4. records every cell's outcome in ``state.json`` as it goes, and the run's
   status in ``run.json`` at the end.

Every cell, whatever its kind, goes through one path (:meth:`Runner._run_cell`):
its kind (:mod:`emulator.study.cell_kinds`) runs it on its network's session,
after the probe; what it wrote to its ``results.json``, read back as its kind
reads it, decides whether it finished; the probe's verdict and a broken
network flag it through its kind. A replay cell replays its schedule; an MPI
cell (:attr:`emulator.study.experiment.Cell.mpi`) runs its program
(:func:`run_mpi_cell`: :func:`emulator.emulation.mpi.mpi_run.run_in_session` into
the cell's directory), and a program that exits non-zero, times out or cannot
start is a failed cell. A new kind of cell needs no change in this module
(only, if it runs through something live, its runner given to its kind as
:func:`run_mpi_cell` is to the MPI kind).

A failed cell, and a network that does not come up (every cell of it fails),
are recorded and the loop goes on. A failed cell may have broken its network
(Open vSwitch restarted under it with its controller gone): before the next
cell of that network the probe runs again, and a network that fails it is
rebuilt as after a failed first probe (``run.log`` says "after the failed
cell"; the attempts go to ``sessions/<network>/after-<cell id>/``). Ctrl-C (KeyboardInterrupt) ends the loop
after tearing the network down, with everything finished so far kept; the
same command resumes. Console lines are :class:`emulator.study.progress.Progress`'s.

The session factory (:class:`emulator.emulation.session.replay.ReplaySession` in ``emu run``),
the MPI cell runner, the clock and the stream are parameters, so the loop is
unit-tested with a fake session, without root.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from emulator.emulation.mpi import mpi_run as mpirun
from emulator.emulation.session.replay import ReplaySession
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import CheckReport, predict
from emulator.model.schedule.format import Schedule
from emulator.model.topology import DEFAULT_MTU, Topology
from emulator.runs import network_probe as probe
from emulator.runs.mpi_results import MpiResults
from emulator.runs.results import CellResults, ProbeVerdict
from emulator.study import experiment as xp
from emulator.study.cell_kinds import CellKind, Kinds, MpiCellRunner, Results, Session, run_kinds
from emulator.study.folder.cell_state import CellState
from emulator.study.folder.results_folder import ResultsFolder
from emulator.study.progress import TEARDOWN_S, Eta, Progress

__all__ = ["CellOutcome", "MpiCellRunner", "Network", "Runner", "Session", "SessionFactory", "Summary",
           "run_mpi_cell"]


class SessionFactory(Protocol):
    """Makes a (not yet started) session of one network; ``echo`` takes its progress lines."""

    def __call__(self, topo: Topology, policy: str, *, seed: int, latency: LatencyModel, work_dir: str,
                 echo: Callable[[str], None]) -> Session: ...


def run_mpi_cell(session: Session, cell: xp.Cell, out: str, *, config: dict[str, Any],
                 echo: Callable[[str], None]) -> MpiResults:
    """An MPI cell on its network's :class:`~emulator.emulation.session.replay.ReplaySession`: checked as ``emu
    mpirun`` checks its
    input (:func:`emulator.emulation.mpi.mpi_run.prepare`), then run in the session, which stays up."""
    if not isinstance(session, ReplaySession):
        raise TypeError(f"an MPI cell runs on a ReplaySession, not a {type(session).__name__}")
    prep = mpirun.prepare(cell.mpi_config(out))
    return mpirun.run_in_session(prep, session, echo, config=config)


@dataclass
class Summary:
    """What one invocation of :meth:`Runner.run` did: cells skipped, run ok, failed (with their errors)."""

    out: str
    total: int
    skipped: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False
    wall_s: float = 0.0

    @property
    def status(self) -> str:
        if self.interrupted:
            return "interrupted"
        return "incomplete" if self.failed else "complete"


@dataclass(frozen=True)
class Network:
    """The unfinished cells of one network: topology spec, routing policy and ECMP seed."""

    spec: str
    policy: str
    seed: int
    cells: tuple[xp.Cell, ...]

    def describe(self) -> str:
        return f"{self.spec} ({self.policy}, seed {self.seed})"


@dataclass(frozen=True)
class CellOutcome:
    """One cell's end: its ``results`` (of its ``kind``) when it finished ok, else the ``error`` it failed with."""

    cell: xp.Cell
    kind: CellKind[Any]
    results: Results | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.results is not None


class Runner:
    """Run (or resume) an experiment into the folder ``out``. See the module docstring.

    ``after_cell(cell_id, "ok" | "failed")`` is called after every cell (a
    KeyboardInterrupt it raises ends the run as Ctrl-C would); ``prepared``
    (the cells with their predictions) defaults to :func:`emulator.study.experiment.prepare`.
    ``kinds``: how each kind of cell runs (:mod:`emulator.study.cell_kinds`); by default ``emu run``'s, the MPI
    cells' programs run by ``mpi_runner``.
    """

    def __init__(self, exp: xp.Experiment, out: str, *, session_factory: SessionFactory,
                 source_text: str | None = None, stream: TextIO | None = None,
                 after_cell: Callable[[str, str], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 prepared: list[xp.PreparedCell] | None = None, mpi_runner: MpiCellRunner = run_mpi_cell,
                 kinds: Kinds | None = None):
        self.exp = exp
        self.out = out
        self.kinds = kinds if kinds is not None else run_kinds(mpi_runner)
        self.folder = ResultsFolder(out, self.kinds)
        self.source_text = source_text
        self.session_factory = session_factory
        self.stream = stream or sys.stdout
        self.after_cell = after_cell
        self.clock = clock
        self.prepared = prepared if prepared is not None else xp.prepare(exp)
        self.by_id = {pc.cell.id: pc for pc in self.prepared}
        self.states: dict[str, CellState] = {}

    # ------------------------------------------------------------- the loop
    def run(self) -> Summary:
        """Run every unfinished cell; returns what happened (never raises KeyboardInterrupt)."""
        start = self.clock()
        previous = self.folder.read_run()
        wall_before_s = (previous.wall_s if previous is not None else None) or 0.0
        self.folder.write_plan(self.exp, self.prepared, self.source_text)
        self.states = self.folder.read_states()
        summary = Summary(out=self.out, total=len(self.prepared))
        todo = self._unfinished(summary)
        self.folder.write_run(self.exp, "running", len(self.prepared), wall_before_s + self.clock() - start)
        self.folder.write_states(self.states)
        progress = Progress(self.stream, Eta(self.by_id), summary.total)
        progress.begin(self.out, len(summary.skipped), [c.id for net in todo for c in net.cells], len(todo))
        try:
            for net in todo:
                progress.network(net.spec, net.policy, net.seed, len(net.cells))
                self._run_network(net, progress, summary)
        except KeyboardInterrupt:
            summary.interrupted = True
            self.folder.log("interrupted")
            progress.interrupted(self.out)
        summary.wall_s = self.clock() - start
        self.folder.write_states(self.states)
        # wall time of the whole run, resumes included: earlier invocations' plus this one's
        self.folder.write_run(self.exp, summary.status, len(self.prepared), wall_before_s + summary.wall_s)
        return summary

    def _unfinished(self, summary: Summary) -> list[Network]:
        """The networks with unfinished cells, in file order; finished cells go to ``summary.skipped``."""
        todo = []
        for (spec, policy, seed, _), cells in xp.groups([pc.cell for pc in self.prepared]):
            left = []
            for cell in cells:
                if self.folder.cell_finished(cell):
                    summary.skipped.append(cell.id)
                    before = self.states.get(cell.id)
                    self.states[cell.id] = dataclasses.replace(before, status="ok") if before else CellState("ok")
                    self.folder.log(f"skipped {cell.id} (finished before)")
                else:
                    left.append(cell)
            if left:
                todo.append(Network(spec, policy, seed, tuple(left)))
        return todo

    def _cell_done(self, outcome: CellOutcome, progress: Progress, summary: Summary) -> None:
        """Count, print and hand on one cell's outcome."""
        cid = outcome.cell.id
        if outcome.results is not None:
            summary.ran.append(cid)
            progress.cell_ok(cid, outcome.kind.line(outcome.results))
        else:
            summary.failed[cid] = outcome.error or "failed"
            progress.cell_failed(cid, outcome.error)
        if self.after_cell is not None:
            self.after_cell(cid, "ok" if outcome.ok else "failed")

    def _fail_all(self, net: Network, error: str, progress: Progress, summary: Summary) -> None:
        for cell in net.cells:
            self._record(cell, "failed", 0.0, error)
            self._cell_done(CellOutcome(cell, self.kinds.of(cell), error=error), progress, summary)

    # -------------------------------------------------------------- networks
    def _run_network(self, net: Network, progress: Progress, summary: Summary) -> None:
        """Bring the network up once, probe it, run its cells; the network is torn down before this returns."""
        first = self.by_id[net.cells[0].id]
        work = self.folder.session_dir(net.spec, net.policy, net.seed, self.exp.link_mbps)
        t0 = self.clock()
        try:
            session = self._bring_up(first, net, work)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # the network did not come up: every cell of it fails
            self.folder.log(f"bring-up of {net.describe()} failed: {exc}")
            self._fail_all(net, f"network bring-up failed: {exc}", progress, summary)
            return
        # the network's own bring-up time, without waiting for another network to go away (plus a teardown)
        own = session.bringup_s
        progress.eta.observe_bringup(own + TEARDOWN_S if own is not None else self.clock() - t0)
        try:
            try:
                session, verdict = self._probe_network(session, first, net, work, progress)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # the rebuild after a failed probe did not come up
                self.folder.log(f"rebuild of {net.describe()} failed: {exc}")
                self._fail_all(net, f"network rebuild after a failed probe failed: {exc}", progress, summary)
                return
            for n, cell in enumerate(net.cells):
                outcome = self._run_cell(session, cell, progress.eta)
                if outcome.results is not None:
                    self._note_probe(outcome, verdict)
                self._cell_done(outcome, progress, summary)
                rest = net.cells[n + 1:]
                damage = session.damage()
                if damage is not None:
                    self.folder.log(f"{net.describe()} after the cell {cell.id}: {damage}")
                    self._flag_damaged(cell, outcome, verdict)
                if (outcome.ok and damage is None) or not rest:
                    continue
                try:
                    session, verdict = self._probe_network(session, first, net, work, progress, after=cell,
                                                           damage=damage)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # the rebuild did not come up: the cells left fail
                    self.folder.log(f"rebuild of {net.describe()} after the failed cell {cell.id} failed: {exc}")
                    self._fail_all(Network(net.spec, net.policy, net.seed, rest),
                                   f"network rebuild after the failed cell {cell.id} failed: {exc}", progress, summary)
                    return
        finally:
            session.stop()

    def _bring_up(self, pc: xp.PreparedCell, net: Network, work: str) -> Session:
        """A started session of the network, with the latency model ``pc``'s prediction used."""
        session = None
        try:
            session = self.session_factory(pc.topo, net.policy, seed=net.seed, latency=pc.latency_model,
                                           work_dir=work, echo=self.folder.log)
            session.start()
        except BaseException:
            if session is not None:
                try:
                    session.stop()
                except Exception:
                    pass
            raise
        return session

    def _probe_network(self, session: Session, pc: xp.PreparedCell, net: Network, work: str, progress: Progress,
                       after: xp.Cell | None = None, damage: str | None = None) -> tuple[Session, ProbeVerdict]:
        """Probe the network; rebuild it (up to :data:`probe.REBUILDS` times) while it fails.

        Returns the session to run the cells on and the last verdict; every
        attempt's verdict goes to the session directory's ``probe.json``.

        ``after``: the cell that just failed. A failed cell may have left its
        network broken (Open vSwitch restarted under it with its controller
        gone: no flow entries, and nothing to put them back), and every cell
        after it would then fail too; so the network is probed again, and
        rebuilt if the probe fails, before the next cell. Its attempts go to
        ``after-<cell id>/`` in the session directory and ``run.log`` says so.
        ``damage``: what :meth:`Session.damage` found broken under the
        session (its controller exited, Open vSwitch restarted); the network is
        then rebuilt before it is probed.
        """
        where = work if after is None else os.path.join(work, f"after-{after.id}")
        when = "" if after is None else f" after the {'failed ' if damage is None else ''}cell {after.id}"
        sched = probe.schedule(pc.topo)
        latency = pc.latency_model
        report = predict(sched, pc.topo, net.policy, seed=net.seed, latency=latency,
                         mtu=latency.profile.emulated_mtu if latency.profile else DEFAULT_MTU, where="network probe")
        verdicts: list[ProbeVerdict] = []
        for attempt in range(probe.REBUILDS + 1):
            if attempt or damage is not None:
                reason = verdicts[-1].reason if verdicts else f"{damage}"
                self.folder.log(f"rebuilding {net.describe()}{when}: {reason}")
                (progress.rebuilding if verdicts else progress.damaged)(reason)
                session.stop()
                session = self._bring_up(pc, net, work)
            verdict = self._run_probe(session, sched, report, ResultsFolder.empty_probe_dir(where, attempt))
            verdicts.append(verdict)
            ratio = f" ({verdict.ratio:.2f}x the model)" if verdict.passed and verdict.ratio else ""
            self.folder.log(f"probe of {net.describe()}{when}, attempt {attempt + 1}: {verdict.reason}{ratio}")
            if verdict.passed:
                break
        else:
            progress.probe_failed_again(verdicts[-1].reason, probe.FLAG)
        ResultsFolder.write_probes(where, verdicts)
        return session, verdicts[-1]

    @staticmethod
    def _run_probe(session: Session, sched: Schedule, report: CheckReport, where: str) -> ProbeVerdict:
        pair = (sched.ranks[0].host, sched.ranks[1].host)
        try:
            res = session.run(sched, where, repeat=probe.PROBE_REPEAT, warmup=probe.PROBE_WARMUP,
                              report=report, config={"probe": {"pair": list(pair)}})
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            res = CellResults(status="failed", error=f"{type(exc).__name__}: {exc}")
        return probe.judge(res, report.predicted_time_s, pair)

    def _note_probe(self, outcome: CellOutcome, verdict: ProbeVerdict) -> None:
        """Record the network's probe in the cell's results; a failed probe flags the cell and makes it untrusted."""
        assert outcome.results is not None
        if not verdict.passed:
            outcome.kind.flag(outcome.results, probe.FLAG)
        self.folder.save_results(outcome.cell, outcome.results, verdict)

    def _flag_damaged(self, cell: xp.Cell, outcome: CellOutcome, verdict: ProbeVerdict) -> None:
        """A finished cell under which the network broke is flagged :data:`probe.DAMAGED_FLAG` (not trusted)."""
        if outcome.results is not None:
            outcome.kind.flag(outcome.results, probe.DAMAGED_FLAG)
            self.folder.save_results(cell, outcome.results, verdict)

    # ----------------------------------------------------------------- cells
    def _run_cell(self, session: Session, cell: xp.Cell, eta: Eta) -> CellOutcome:
        """Run one cell of any kind on the session into its (emptied) directory; the outcome is recorded in
        ``state.json``. What the cell's run wrote decides (not what it returned): finished results of exactly
        this cell are ok, anything else a failed cell, with its kind's reason."""
        kind = self.kinds.of(cell)
        pc = self.by_id[cell.id]
        where = self.folder.empty_cell_dir(cell)
        config = {"cell": cell.to_json(), "experiment": self.exp.name}
        wall, error = self._attempt(cell, lambda: kind.run(session, pc, where, config=config, echo=self.folder.log))
        if error is not None:
            return CellOutcome(cell, kind, error=error)
        finished = self.folder.finished_results(cell)
        if finished is not None:
            if kind.predicted:
                eta.observe_cell(cell.id, wall)
            self._record(cell, "ok", wall, None)
            return CellOutcome(cell, kind, results=finished)
        error = kind.failure(self.folder.results_of(cell))
        self._record(cell, "failed", wall, error)
        return CellOutcome(cell, kind, error=error)

    def _attempt(self, cell: xp.Cell, run: Callable[[], None]) -> tuple[float, str | None]:
        """Record the cell ``running``, then ``run()`` it: returns its wall seconds and None, or, when it raised,
        the error it was recorded ``failed`` with; Ctrl-C records it ``interrupted`` (its results already say so)
        and goes on up."""
        self._record(cell, "running", 0.0, None)
        c0 = self.clock()
        try:
            run()
        except KeyboardInterrupt:
            self._record(cell, "interrupted", self.clock() - c0, "interrupted")
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._record(cell, "failed", self.clock() - c0, error)
            return 0.0, error
        return self.clock() - c0, None

    def _record(self, cell: xp.Cell, status: str, wall_s: float, error: str | None) -> None:
        self.states[cell.id] = CellState.recorded(status, wall_s, error)
        self.folder.write_states(self.states)
        if status != "running":
            self.folder.log(f"{'ran' if status == 'ok' else status} {cell.id} in {wall_s:.1f} s"
                            + (f": {error}" if error else ""))
