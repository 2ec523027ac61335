"""The live loop of ``emu run``: every cell of an experiment on real emulated networks, resumable.

:class:`Runner` owns one results folder (``out``):

* ``experiment.yaml`` (the file as given), ``experiment.json`` (the validated
  experiment and every cell with its prediction), ``run.json`` (status:
  ``running``, ``interrupted``, ``incomplete`` with failed cells, or
  ``complete``), ``state.json`` (every cell's last outcome, wall time and
  error), ``run.log`` (one line per cell: ran, skipped, failed);
* ``cells/<cell-id>/``: what :meth:`emulator.replay.ReplaySession.run` writes
  (``results.json``, ``timeline.jsonl``, ``links.jsonl``, ``schedule.json``,
  ``topology.json``, agent logs).

Cells are run group by group, one network (controller + Mininet) per
(topology, routing, seed), brought up only when the group has unfinished
cells. A cell counts as finished when its ``results.json`` says ``ok`` and
holds this cell's configuration (:func:`emulator.experiment.cell_finished`);
finished cells are skipped, anything else (failed, interrupted, never run) is
run again from an empty directory. A failed cell is recorded and the loop goes
on; Ctrl-C (KeyboardInterrupt) ends the loop after tearing the network down,
with everything finished so far kept.

The session class and the clock are parameters, so the bookkeeping is
unit-tested with a fake session (no root).
"""

from __future__ import annotations

import datetime
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from emulator import experiment as xp
from emulator import faults, probe
from emulator.files import read_json_object, write_atomic, write_json_atomic
from emulator.schedule.check import predict
from emulator.topology import DEFAULT_MTU

#: Until measured: seconds of agent start-up per cell and of bring-up + teardown per network.
DEFAULT_CELL_OVERHEAD_S = 1.5
DEFAULT_BRINGUP_S = 10.0
TEARDOWN_S = 4.0


@dataclass
class Summary:
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


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def progress_bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class Eta:
    """Time left: the model's prediction of the remaining cells, scaled by what was seen so far."""

    def __init__(self, prepared: dict[str, xp.PreparedCell]):
        self.prepared = prepared
        self.cell_s: list[float] = []  # measured wall seconds of run cells
        self.raw_s: list[float] = []  # their prediction-based estimate without overhead
        self.bringup_s: list[float] = []

    def observe_cell(self, cell_id: str, wall_s: float) -> None:
        pc = self.prepared[cell_id]
        self.cell_s.append(wall_s)
        self.raw_s.append(xp.estimate_s(pc, 0.0))

    def observe_bringup(self, seconds: float) -> None:
        self.bringup_s.append(seconds)

    def remaining_s(self, cell_ids: list[str], groups_left: int) -> float:
        if self.cell_s:
            # least-squares fit of wall = overhead + scale * raw is overkill; a ratio of sums with a fixed overhead works
            overhead = min(DEFAULT_CELL_OVERHEAD_S, min(self.cell_s))
            raw = sum(self.raw_s)
            scale = (sum(self.cell_s) - overhead * len(self.cell_s)) / raw if raw > 0 else 1.0
            scale = max(scale, 0.5)
        else:
            overhead, scale = DEFAULT_CELL_OVERHEAD_S, 1.5
        bringup = statistics.mean(self.bringup_s) if self.bringup_s else DEFAULT_BRINGUP_S
        cells = sum(overhead + scale * xp.estimate_s(self.prepared[c], 0.0) for c in cell_ids)
        return cells + groups_left * bringup


class Runner:
    """Run (or resume) an experiment into ``out``. See the module docstring."""

    def __init__(self, exp: xp.Experiment, out: str, *, source_text: str | None = None,
                 session_factory: Callable[..., Any] | None = None, stream: TextIO | None = None,
                 after_cell: Callable[[str, str], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 prepared: list[xp.PreparedCell] | None = None):
        self.exp = exp
        self.out = out
        self.source_text = source_text
        self.session_factory = session_factory
        self.stream = stream or sys.stdout
        self.after_cell = after_cell
        self.clock = clock
        self.prepared = prepared if prepared is not None else xp.prepare(exp)
        self.by_id = {pc.cell.id: pc for pc in self.prepared}
        self.state: dict[str, Any] = {}
        self.started_at = clock()
        self.wall_before_s = 0.0

    # ------------------------------------------------------------ files
    def _log(self, text: str) -> None:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        with open(os.path.join(self.out, "run.log"), "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {text}\n")

    def _say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _write_run(self, status: str) -> None:
        path = os.path.join(self.out, "run.json")
        old = read_json_object(path) or {}
        write_json_atomic(path, {
            "experiment": self.exp.name, "source": self.exp.source, "fingerprint": self.exp.fingerprint(),
            "created": old.get("created") or datetime.datetime.now().isoformat(timespec="seconds"),
            "updated": datetime.datetime.now().isoformat(timespec="seconds"),
            "status": status, "cells": len(self.prepared),
            # wall time of the whole run, resumes included: earlier invocations' plus this one's so far
            "wall_s": round(self.wall_before_s + (self.clock() - self.started_at), 3),
        })

    def _write_state(self) -> None:
        write_json_atomic(os.path.join(self.out, "state.json"), {"cells": self.state})

    def write_plan(self) -> None:
        """``experiment.yaml``, ``experiment.json`` (cells with predictions) and ``run.json``."""
        os.makedirs(os.path.join(self.out, "cells"), exist_ok=True)
        if self.source_text is not None:
            write_atomic(os.path.join(self.out, "experiment.yaml"), self.source_text)
        cells = []
        for pc in self.prepared:
            pred = pc.report.to_json()
            cells.append({**pc.cell.to_json(), "predicted_time_s": pred["predicted_time_s"],
                          "predicted_busbw_mbps": pred["busbw_mbps"],
                          "alpha_beta_time_s": pred["alpha_beta_time_s"],
                          "max_flows_per_link": max(pred["max_flows_per_link"], default=0)})
        write_json_atomic(os.path.join(self.out, "experiment.json"),
                          {"experiment": self.exp.to_json(), "fingerprint": self.exp.fingerprint(), "cells": cells})

    # ------------------------------------------------------------- loop
    def run(self) -> Summary:
        """Run every unfinished cell; returns what happened (never raises KeyboardInterrupt)."""
        start = self.started_at = self.clock()
        self.wall_before_s = float((read_json_object(os.path.join(self.out, "run.json")) or {}).get("wall_s") or 0.0)
        self.write_plan()
        self.state = (read_json_object(os.path.join(self.out, "state.json")) or {}).get("cells", {})
        summary = Summary(out=self.out, total=len(self.prepared))
        todo: list[tuple[tuple[str, str, int, str], list[xp.Cell]]] = []
        for key, cells in xp.groups([pc.cell for pc in self.prepared]):
            left = []
            for cell in cells:
                if xp.cell_finished(self.out, cell):
                    summary.skipped.append(cell.id)
                    self.state.setdefault(cell.id, {})["status"] = "ok"
                    self._log(f"skipped {cell.id} (finished before)")
                else:
                    left.append(cell)
            if left:
                todo.append((key, left))
        self._write_run("running")
        self._write_state()
        done = len(summary.skipped)
        remaining = [c.id for _, cells in todo for c in cells]
        eta = Eta(self.by_id)
        if summary.skipped:
            self._say(f"resuming {self.out}: {done} of {summary.total} cells finished before, skipped")
        self._say(f"{progress_bar(done, summary.total)} {done}/{summary.total} cells, {len(todo)} networks to "
                  f"bring up, ETA {format_duration(eta.remaining_s(remaining, len(todo)))}")
        try:
            for gi, ((spec, policy, seed, _), cells) in enumerate(todo):
                seed_text = f" seed {seed}" if policy == "ecmp" else ""
                self._say(f"network {gi + 1}/{len(todo)}: {spec} ({policy}{seed_text}), {len(cells)} cells")
                runs = self._run_group(spec, policy, seed, cells, eta)
                try:
                    for cell, outcome in runs:
                        remaining.remove(cell.id)
                        done += 1
                        if outcome == "ok":
                            summary.ran.append(cell.id)
                        else:
                            summary.failed[cell.id] = self.state[cell.id].get("error") or "failed"
                        self._say(self._progress_line(cell, outcome, done, summary.total,
                                                      eta.remaining_s(remaining, len(todo) - gi - 1)))
                        if self.after_cell is not None:
                            self.after_cell(cell.id, outcome)
                finally:
                    runs.close()  # tears the network down now, whatever happened
        except KeyboardInterrupt:
            summary.interrupted = True
            self._log("interrupted")
            self._say(f"interrupted: {done} of {summary.total} cells finished and kept in {self.out}; "
                      "run the same command again to finish the rest")
        summary.wall_s = self.clock() - start
        self._write_state()
        self._write_run(summary.status)
        return summary

    def _run_group(self, spec: str, policy: str, seed: int, cells: list[xp.Cell], eta: Eta):
        """Bring the network up once, probe it, run its cells; yields ``(cell, "ok" | "failed")``."""
        first = self.by_id[cells[0].id]
        work = os.path.join(self.out, "sessions",
                            f"{xp.topology_slug(spec, self.exp.link_mbps)}.{policy}-s{seed}")
        t0 = self.clock()
        try:
            session = self._bring_up(first, policy, seed, work)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # the network did not come up: every cell of the group fails
            self._log(f"bring-up of {spec} ({policy}, seed {seed}) failed: {exc}")
            for cell in cells:
                self._record(cell, "failed", 0.0, f"network bring-up failed: {exc}")
                yield cell, "failed"
            return
        # the network's own bring-up time, without waiting for another network to go away (plus a teardown)
        own = getattr(getattr(session, "en", None), "bringup_s", None)
        eta.observe_bringup(own + TEARDOWN_S if isinstance(own, int | float) else self.clock() - t0)
        try:
            try:
                session, verdict = self._probe_network(session, first, policy, seed, work)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # the rebuild after a failed probe did not come up
                self._log(f"rebuild of {spec} ({policy}, seed {seed}) failed: {exc}")
                for cell in cells:
                    self._record(cell, "failed", 0.0, f"network rebuild after a failed probe failed: {exc}")
                    yield cell, "failed"
                return
            for cell in cells:
                outcome = self._run_cell(session, cell, eta)
                if outcome == "ok":
                    self._note_probe(cell, verdict)
                yield cell, outcome
        finally:
            session.stop()

    def _factory(self) -> Callable[..., Any]:
        if self.session_factory is not None:
            return self.session_factory
        from emulator.replay import ReplaySession
        return ReplaySession

    def _bring_up(self, pc: xp.PreparedCell, policy: str, seed: int, work: str) -> Any:
        """A started session of ``pc``'s network, with the latency model its prediction used."""
        session = None
        try:
            session = self._factory()(pc.topo, policy, seed=seed, latency=pc.report.latency, work_dir=work,
                                      echo=self._log)
            session.start()
        except BaseException:
            if session is not None:
                try:
                    session.stop()
                except Exception:
                    pass
            raise
        return session

    def _probe_network(self, session: Any, pc: xp.PreparedCell, policy: str, seed: int,
                       work: str) -> tuple[Any, probe.Verdict]:
        """Probe the network; rebuild it (up to :data:`probe.REBUILDS` times) while it fails.

        Returns the session to run the cells on and the last verdict, which
        is also written to ``<work>/probe.json``.
        """
        sched = probe.schedule(pc.topo)
        report = predict(sched, pc.topo, policy, seed=seed, latency=pc.report.latency,
                         mtu=pc.report.latency.profile.emulated_mtu if pc.report.latency.profile else DEFAULT_MTU,
                         where="network probe")
        verdicts: list[probe.Verdict] = []
        for attempt in range(probe.REBUILDS + 1):
            if attempt:
                self._log(f"rebuilding {pc.cell.topology} ({policy}, seed {seed}): {verdicts[-1].reason}")
                self._say(f"  network failed its probe ({verdicts[-1].reason}): rebuilding it")
                session.stop()
                session = self._bring_up(pc, policy, seed, work)
            verdict = self._run_probe(session, sched, report, os.path.join(work, f"probe-{attempt}"))
            verdicts.append(verdict)
            self._log(f"probe of {pc.cell.topology} ({policy}, seed {seed}), attempt {attempt + 1}: "
                      f"{verdict.reason}" + (f" ({verdict.ratio:.2f}x the model)" if verdict.passed and verdict.ratio
                                             else ""))
            if verdict.passed:
                break
        else:
            self._say(f"  network failed its probe again ({verdict.reason}): its cells are flagged "
                      f"{probe.FLAG} and not trusted")
        write_json_atomic(os.path.join(work, "probe.json"), {"attempts": [v.to_json() for v in verdicts]})
        return session, verdict

    def _run_probe(self, session: Any, sched: Any, report: Any, where: str) -> probe.Verdict:
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
        pair = (sched.ranks[0].host, sched.ranks[1].host)
        try:
            results = session.run(sched, where, repeat=probe.PROBE_REPEAT, warmup=probe.PROBE_WARMUP,
                                  report=report, config={"probe": {"pair": list(pair)}})
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            results = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        return probe.judge(results, report.predicted_time_s, pair)

    def _note_probe(self, cell: xp.Cell, verdict: probe.Verdict) -> None:
        """Record the network's probe in the cell's results; a failed probe flags the cell and makes it untrusted."""
        path = os.path.join(xp.cell_dir(self.out, cell), "results.json")
        res = read_json_object(path)
        if res is None:
            return
        res["probe"] = verdict.to_json()
        if not verdict.passed:
            for rep in [*res.get("warmup", []), *res.get("repetitions", [])]:
                fid = rep.setdefault("fidelity", {})
                fid["flags"] = sorted({*fid.get("flags", []), probe.FLAG})
                fid["trusted"] = False
            res["trusted"] = False
        write_json_atomic(path, res)

    def _run_cell(self, session: Any, cell: xp.Cell, eta: Eta) -> str:
        """Run one cell on the session into its (emptied) directory; ``"ok"`` or ``"failed"`` (recorded)."""
        pc = self.by_id[cell.id]
        where = xp.cell_dir(self.out, cell)
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
        self._record(cell, "running", 0.0, None)
        c0 = self.clock()
        try:
            plan = faults.parse_faults(cell.faults, pc.topo, pc.schedule.p, pc.schedule.steps, cell.repeat)
            session.run(pc.schedule, where, repeat=cell.repeat, warmup=cell.warmup,
                        timeout_s=cell.timeout_s, report=pc.report, fault_plan=plan,
                        config={"cell": cell.to_json(), "experiment": self.exp.name})
        except KeyboardInterrupt:
            self._record(cell, "interrupted", self.clock() - c0, "interrupted")
            raise
        except Exception as exc:
            self._record(cell, "failed", self.clock() - c0, f"{type(exc).__name__}: {exc}")
            return "failed"
        wall = self.clock() - c0
        if xp.cell_finished(self.out, cell):
            eta.observe_cell(cell.id, wall)
            self._record(cell, "ok", wall, None)
            return "ok"
        res = xp.read_results(self.out, cell) or {}
        self._record(cell, "failed", wall, res.get("error") or f"status {res.get('status')!r}")
        return "failed"

    def _record(self, cell: xp.Cell, status: str, wall_s: float, error: str | None) -> None:
        self.state[cell.id] = {"status": status, "wall_s": round(wall_s, 3), "error": error,
                               "at": datetime.datetime.now().isoformat(timespec="seconds")}
        self._write_state()
        if status != "running":
            self._log(f"{'ran' if status == 'ok' else status} {cell.id} in {wall_s:.1f} s"
                      + (f": {error}" if error else ""))

    def _progress_line(self, cell: xp.Cell, outcome: str, done: int, total: int, eta_s: float) -> str:
        head = f"{progress_bar(done, total)} {done}/{total} ETA {format_duration(eta_s)}  {cell.id}: "
        if outcome != "ok":
            return head + f"FAILED ({self.state[cell.id].get('error')})"
        res = xp.read_results(self.out, cell) or {}
        pred = (res.get("prediction") or {}).get("busbw_mbps") or 0.0
        flags = sorted({f for r in res.get("repetitions", []) for f in r.get("fidelity", {}).get("flags", [])
                        if f != "uncalibrated"})
        return (head + f"busbw {res.get('busbw_mbps_median', 0):.2f} Mbit/s (model {pred:.2f}), "
                f"measured/predicted {res.get('measured_over_predicted_median') or 0:.2f}"
                + (f" [fidelity: {', '.join(flags)}]" if flags else ""))


# ----------------------------------------------------------- results folders
def new_out_dir(results_root: str, name: str, now: datetime.datetime | None = None) -> str:
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    path = os.path.join(results_root, f"{name}-{stamp}")
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(results_root, f"{name}-{stamp}-{n}")
    return path


def find_unfinished(results_root: str, exp: xp.Experiment) -> str | None:
    """The newest folder of ``results_root`` holding an unfinished run of this very experiment."""
    try:
        names = sorted(os.listdir(results_root))
    except OSError:
        return None
    best: tuple[str, str] | None = None
    for name in names:
        path = os.path.join(results_root, name)
        if name == "latest" or os.path.islink(path) or not name.startswith(exp.name + "-"):
            continue
        run = read_json_object(os.path.join(path, "run.json"))
        if not run or run.get("fingerprint") != exp.fingerprint() or run.get("status") == "complete":
            continue
        key = (run.get("created") or "", name)
        if best is None or key > best:
            best = (key[0], path)
    return best[1] if best else None


def point_latest(results_root: str, out: str) -> None:
    """Make ``results_root/latest`` a relative symlink to ``out`` (replaced atomically)."""
    link = os.path.join(results_root, "latest")
    if os.path.abspath(os.path.dirname(os.path.abspath(out))) != os.path.abspath(results_root):
        return
    tmp = link + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(os.path.basename(os.path.abspath(out)), tmp)
    os.replace(tmp, link)
