"""Fault actions: what each fault of :mod:`emulator.runs.fault_plan` does to the live network, and undoing it.

:class:`FaultActions` acts only on what it is given: the topology (which
interfaces a link has), the controller (anything with the methods of
:class:`Controller`, normally :class:`emulator.emulation.network.controller_process.ControllerProcess`),
a function that kills one rank's agent (:meth:`emulator.emulation.agents.fleet.Fleet.kill`)
and a command runner (:func:`emulator.emulation.machine.system.run`) for the ``ip link``
commands that :func:`link_commands` builds. :meth:`FaultActions.table` is the
action table of :class:`emulator.runs.fault_plan.Injector`; each action returns its
note, and a link change or a restart also the seconds until the controller
had every switch confirmed (``(note, seconds)``, None when it never did).
:meth:`FaultActions.restore` brings every downed link up and the controller
back, so a session stays usable after a run with faults.

:func:`fault_records` and :func:`measure_affected` turn the injector's events
into the fault records of ``results.json`` (:mod:`emulator.runs.fault_plan` describes them).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from emulator.base.waiting import wait_until
from emulator.emulation.machine.system import Runner, run
from emulator.model.prediction.cost import Transfer
from emulator.model.topology import Topology, node_sort_key
from emulator.runs import fault_plan as faults
from emulator.runs.fault_plan import Fault, FaultEvent
from emulator.runs.results import FaultRecord

#: How long a link change waits for the controller to reroute and confirm every switch.
REROUTE_TIMEOUT_S = 15.0
#: How long a restarted controller (or one after :meth:`FaultActions.restore`) has to confirm every switch.
RESYNC_TIMEOUT_S = 30.0
CONFIRM_POLL_S = 0.005


class Controller(Protocol):
    """The controller's process as the fault actions use it."""

    def running(self) -> bool: ...

    def status(self) -> dict[str, Any]: ...

    def kill(self) -> None: ...

    def start(self) -> None: ...

    def wait_installed(self, timeout: float = ..., switches: int | None = ..., no_failures: bool = ...) -> Any: ...


class _Seen(enum.Enum):
    CONFIRMED = "confirmed"
    GONE = "gone"


def link_commands(topo: Topology, a: str, b: str, up: bool) -> list[list[str]]:
    """``ip link set`` of every root-namespace end of link ``a``-``b`` (:func:`emulator.runs.fault_plan.link_ends`)."""
    return [["ip", "link", "set", "dev", intf, "up" if up else "down"] for intf in faults.link_ends(topo, a, b)]


def link_key(a: str, b: str) -> tuple[str, str]:
    """A link's two ends in the topology's node order (``s3-s1`` and ``s1-s3`` are one link)."""
    return (a, b) if node_sort_key(a) <= node_sort_key(b) else (b, a)


class FaultActions:
    """The actions of one run's faults on ``topo``, its ``controller`` and its agents (see the module docstring)."""

    def __init__(self, topo: Topology, controller: Controller, kill_agent: Callable[[int], None],
                 runner: Runner = run, clock: Callable[[], float] = time.monotonic):
        self.topo = topo
        self.controller = controller
        self.kill_agent = kill_agent
        self.runner = runner
        self.clock = clock
        self.downed: set[tuple[str, str]] = set()

    def table(self) -> dict[str, Callable[[Fault], Any]]:
        """Action name -> ``fn(fault)``, for :class:`emulator.runs.fault_plan.Injector`."""
        return {"link_down": lambda f: self.link(f, up=False), "link_up": lambda f: self.link(f, up=True),
                "controller_kill": self.controller_kill, "controller_restart": self.controller_restart,
                "agent_kill": self.agent_kill}

    # ------------------------------------------------------------ actions
    def set_link(self, a: str, b: str, up: bool) -> None:
        """Every root-namespace end of link ``a``-``b`` up or down; a downed link is remembered for :meth:`restore`."""
        for cmd in link_commands(self.topo, a, b, up):
            self.runner(cmd)
        if up:
            self.downed.discard(link_key(a, b))
        else:
            self.downed.add(link_key(a, b))

    def link(self, fault: Fault, up: bool) -> tuple[str, float | None]:
        a, b = fault.link
        name = sorted((a, b), key=node_sort_key)
        self.set_link(a, b, up)
        seconds = self.wait_confirmed(lambda st: (name in st.get("failed_links", [])) != up)
        if seconds is None:
            return f"{a}-{b} {'up' if up else 'down'}; no controller rerouted it", None
        return f"{a}-{b} {'up' if up else 'down'}; controller rerouted", seconds

    def controller_kill(self, fault: Fault) -> str:
        self.controller.kill()
        return "controller killed; switches keep their entries"

    def controller_restart(self, fault: Fault) -> tuple[str, float | None]:
        self.controller.kill()
        t0 = self.clock()
        self.controller.start()
        self.controller.wait_installed(timeout=RESYNC_TIMEOUT_S, no_failures=False)
        return "controller restarted; every switch resynchronised", self.clock() - t0

    def agent_kill(self, fault: Fault) -> str:
        self.kill_agent(fault.rank)
        return f"rank {fault.rank}'s agent killed"

    def wait_confirmed(self, ready: Callable[[Mapping[str, Any]], bool],
                       timeout_s: float = REROUTE_TIMEOUT_S) -> float | None:
        """Seconds until the controller's status satisfies ``ready`` with every switch confirmed;
        None when it does not within ``timeout_s``, or the controller is not running (nobody reroutes)."""
        t0 = self.clock()
        switches = len(self.topo.switches)

        def seen() -> _Seen | None:
            if not self.controller.running():
                return _Seen.GONE
            st = self.controller.status()
            if st and ready(st) and len(st.get("installed", [])) == switches:
                return _Seen.CONFIRMED
            return None

        outcome = wait_until(seen, timeout_s, CONFIRM_POLL_S, clock=self.clock)
        return self.clock() - t0 if outcome is _Seen.CONFIRMED else None

    def restore(self) -> None:
        """Every downed link up, and a running controller with every switch confirmed."""
        for a, b in sorted(self.downed):
            self.set_link(a, b, True)
        if not self.controller.running():
            self.controller.start()
        self.controller.wait_installed(timeout=RESYNC_TIMEOUT_S)


# ------------------------------------------------------------------ records
def fault_records(events: Sequence[FaultEvent], planned: Sequence[Transfer], rep: int) -> list[FaultRecord]:
    """The ``results.json`` records of one repetition's fault events (``rep`` counts warm-ups too).

    A downed link's record lists the planned transfers whose path crosses it.
    """
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


def measure_affected(records: Sequence[FaultRecord], transfers: Sequence[Mapping[str, Any]]) -> None:
    """Add each affected transfer's measured duration (from :func:`emulator.runs.metrics.timeline_records`)
    to the fault records, in place."""
    durations = {(t["step"], t["src"], t["dst"]): round(t["end"] - t["start"], 4) for t in transfers}
    for rec in records:
        for t in rec.get("affected_transfers", []):
            t["time_s"] = durations.get((t["step"], t["src"], t["dst"]))
