"""Fault injection: what a fault plan says, which transfers it hits, and firing it during a replay.

A replay (``emu replay --fault SPEC``, repeatable) or an experiment run
(``faults:`` in the YAML file) can schedule faults. One fault is written

    ``ACTION[:TARGET]@WHEN[,rep=R]``

or as a mapping ``{action: ACTION, target: TARGET, at: SECONDS | step: N, rep: R}``.

``ACTION`` and ``TARGET``
    * ``link_down:A-B`` / ``link_up:A-B`` -- the link between two adjacent
      nodes of the topology (``s1-s5``, ``h3-s2``): every end of it in the
      root namespace (the switch side; both sides of a switch link) is set
      administratively down or up with ``ip link``; the controller sees the
      port change and reroutes.
    * ``controller_kill`` -- SIGKILL to the controller. The switches keep
      forwarding with the entries they hold (fail-mode secure), nobody
      reroutes.
    * ``controller_restart`` -- start it again (killed first if it still
      runs); it points the switches at itself again (else they would wait
      out Open vSwitch's backoff, up to 8 s), and they are resynchronised.
    * ``agent_kill:R`` -- SIGKILL to rank R's agent: the run fails naming the rank.

``WHEN``
    ``1.5s`` (or ``1.5``): seconds after the repetition's common start;
    ``step=N``: when the first rank releases an operation of step N.

``rep``
    Which measured repetition, from 0 (default 0). Warm-up repetitions never
    carry faults, so the faulted repetition is measured like the others.

What the replay records for every fault (``results.json`` ``faults``):
when it fired relative to the repetition's start, how long the action took,
the transfers whose planned path crosses a downed link (by step and rank
pair, with their measured durations), and for a link change or a restart
the time until the controller had every switch confirmed with the new
entries (``reroute_s`` / ``resync_s``). A repetition with a fault that
completes with correct data is ``degraded``; one that does not fails the run.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from emulator.base.errors import FieldError, int_field
from emulator.base.naming import switch_intf
from emulator.model.topology import Topology

ACTIONS = ("link_down", "link_up", "controller_kill", "controller_restart", "agent_kill")
_TARGETED = {"link_down": "link", "link_up": "link", "agent_kill": "rank"}
_KEYS = ("action", "target", "at", "step", "rep")
_SPEC_RE = re.compile(r"^\s*(?P<action>[a-z_]+)(?::(?P<target>[^@]*))?@(?P<when>[^,]*)(?:,(?P<extra>.*))?$")


@dataclass(frozen=True)
class Fault:
    """One planned fault; ``at_s`` xor ``step`` says when."""

    action: str
    target: str | None = None
    at_s: float | None = None
    step: int | None = None
    rep: int = 0

    @property
    def link(self) -> tuple[str, str]:
        a, _, b = (self.target or "").partition("-")
        return a, b

    @property
    def rank(self) -> int:
        return int(self.target or 0)

    @property
    def when(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.at_s:g} s"

    def describe(self) -> str:
        target = f":{self.target}" if self.target is not None else ""
        when = f"step={self.step}" if self.step is not None else f"{_exact(self.at_s)}s"
        return f"{self.action}{target}@{when}" + (f",rep={self.rep}" if self.rep else "")

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.describe(), "action": self.action, "target": self.target, "at_s": self.at_s,
                "step": self.step, "rep": self.rep}


def _exact(seconds: float | None) -> str:
    """``seconds`` short where that reads back exactly (``1.5``), else every digit it needs (``0.001953125``)."""
    short = f"{seconds:g}"
    return short if float(short) == seconds else repr(seconds)


def _seconds(where: str, raw: object) -> float:
    expected = "seconds >= 0 after the repetition's start, e.g. 1.5s"
    if isinstance(raw, bool):
        raise FieldError(where, "at", expected, raw)
    text = str(raw).strip()
    try:
        value = float(raw) if isinstance(raw, (int, float)) else float(text[:-1] if text.endswith("s") else text)
    except (ValueError, OverflowError):
        raise FieldError(where, "at", expected, raw) from None
    if not math.isfinite(value) or value < 0 or value > 86400:
        raise FieldError(where, "at", expected, raw)
    return value


def _from_string(spec: str, where: str) -> dict[str, Any]:
    m = _SPEC_RE.match(spec)
    if m is None:
        raise FieldError(where, "fault", "ACTION[:TARGET]@WHEN[,rep=R], e.g. link_down:s1-s5@1.5s", spec)
    items: dict[str, Any] = {"action": m["action"]}
    if m["target"] is not None:
        items["target"] = m["target"].strip()
    when = m["when"].strip()
    if when.startswith("step="):
        items["step"] = when[len("step="):]
    else:
        items["at"] = when
    if m["extra"] is not None:
        key, eq, value = m["extra"].partition("=")
        if key.strip() != "rep" or not eq:
            raise FieldError(where, "fault", "only ',rep=R' after WHEN", m["extra"])
        items["rep"] = value
    return items


def parse_fault(spec: str | Mapping[str, Any], topo: Topology, ranks: int, steps: int,
                where: str = "fault") -> Fault:
    """Validate one fault against the topology and the schedule (``ranks``, ``steps``)."""
    if isinstance(spec, str):
        items = _from_string(spec, where)
    elif isinstance(spec, Mapping):
        items = dict(spec)
        for key in items:
            if key not in _KEYS:
                raise FieldError(where, str(key), f"a fault key ({', '.join(_KEYS)})", f"unknown key {key}")
    else:
        raise FieldError(where, "fault", "a string ACTION[:TARGET]@WHEN or a mapping", spec)
    action = items.get("action")
    if action not in ACTIONS:
        raise FieldError(where, "action", f"one of {', '.join(ACTIONS)}", action)
    target = items.get("target")
    kind = _TARGETED.get(action)
    if kind is None and target is not None:
        raise FieldError(where, "target", f"nothing after {action}", target)
    if kind == "link":
        a, dash, b = str(target or "").partition("-")
        if not dash or topo.link_between(a.strip(), b.strip()) is None:
            raise FieldError(where, "target", f"a link A-B of {topo.spec} (e.g. {_example_link(topo)})", target)
        target = f"{a.strip()}-{b.strip()}"
    elif kind == "rank":
        target = str(int_field(where, "target", target, 0, text=True) if target is not None else "")
        if not target or int(target) >= ranks:
            raise FieldError(where, "target", f"a rank in 0..{ranks - 1}", items.get("target"))
    if ("at" in items) == ("step" in items):
        raise FieldError(where, "when", "exactly one of at (seconds) and step", "both" if "at" in items else "neither")
    at_s = _seconds(where, items["at"]) if "at" in items else None
    step = int_field(where, "step", items["step"], 0, text=True) if "step" in items else None
    if step is not None and step >= steps:
        raise FieldError(where, "step", f"a step in 0..{steps - 1}", step)
    rep = int_field(where, "rep", items.get("rep", 0), 0, text=True)
    return Fault(action=action, target=target, at_s=at_s, step=step, rep=rep)


def _example_link(topo: Topology) -> str:
    lk = next((lk for lk in topo.links if lk.kind != "host"), topo.links[0])
    return f"{lk.a}-{lk.b}"


def parse_faults(specs: Sequence[str | Mapping[str, Any]], topo: Topology, ranks: int, steps: int, repeat: int,
                 where: str = "fault") -> list[Fault]:
    faults = [parse_fault(s, topo, ranks, steps, f"{where} {i + 1}") for i, s in enumerate(specs)]
    for i, f in enumerate(faults):
        if f.rep >= repeat:
            raise FieldError(f"{where} {i + 1}", "rep", f"a measured repetition in 0..{repeat - 1}", f.rep)
    return faults


def link_ends(topo: Topology, a: str, b: str) -> list[str]:
    """Interfaces of link ``a``-``b`` in the root namespace (host ends live in the host's namespace)."""
    lk = topo.link_between(a, b)
    if lk is None:
        raise KeyError(f"no link {a}-{b}")
    ends = [(lk.a, lk.a_port), (lk.b, lk.b_port)]
    return [switch_intf(node, port) for node, port in ends if topo.is_switch(node)]


def crossing_transfers(transfers: Sequence[Any], a: str, b: str) -> list[dict[str, int]]:
    """The planned transfers (:func:`emulator.model.prediction.cost.transfers`) whose path crosses ``a``-``b``."""
    link = {a, b}
    out = []
    for t in transfers:
        if any({x, y} == link for x, y in zip(t.path, t.path[1:], strict=False)):
            out.append({"step": t.step, "src": t.src, "dst": t.dst})
    return out


@dataclass
class FaultEvent:
    """What happened when a fault fired (times relative to the repetition's start)."""

    fault: Fault
    fired_s: float | None = None
    action_s: float | None = None
    reroute_s: float | None = None
    error: str | None = None
    affected: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**self.fault.to_json(), "fired_s": self.fired_s, "action_s": self.action_s,
                "reroute_s": self.reroute_s, "error": self.error, "affected_transfers": self.affected,
                "note": self.note}


class Injector:
    """Fires the faults of one repetition; ``actions`` maps an action name to ``fn(fault) -> note``.

    Each action returns a short note, and may return the seconds until the
    controller had resynchronised (``(note, seconds)``). Time-triggered faults
    fire from a timer thread, step-triggered ones when :meth:`step_started`
    first sees their step; every action runs in its own thread so that the
    replay keeps reading its agents.
    """

    def __init__(self, faults: Sequence[Fault], actions: Mapping[str, Callable[[Fault], Any]], start_at: float,
                 clock: Callable[[], float] = time.monotonic):
        self.events = [FaultEvent(f) for f in faults]
        self.actions = actions
        self.start_at = start_at
        self.clock = clock
        self.threads: list[threading.Thread] = []
        self._fired: set[int] = set()
        self._lock = threading.Lock()
        self._cancel = threading.Event()

    @property
    def watch_steps(self) -> list[int]:
        return sorted({e.fault.step for e in self.events if e.fault.step is not None})

    def start(self) -> None:
        for i, ev in enumerate(self.events):
            if ev.fault.at_s is not None:
                self._spawn(i, self.start_at + ev.fault.at_s)

    def step_started(self, step: int) -> None:
        for i, ev in enumerate(self.events):
            if ev.fault.step == step:
                self._spawn(i, None)

    def _spawn(self, index: int, not_before: float | None) -> None:
        with self._lock:
            if index in self._fired:
                return
            self._fired.add(index)
        t = threading.Thread(target=self._fire, args=(index, not_before), daemon=True)
        self.threads.append(t)
        t.start()

    def _fire(self, index: int, not_before: float | None) -> None:
        ev = self.events[index]
        if not_before is not None and self._cancel.wait(max(0.0, not_before - self.clock())):
            return
        t0 = self.clock()
        ev.fired_s = round(t0 - self.start_at, 4)
        try:
            outcome = self.actions[ev.fault.action](ev.fault)
            if isinstance(outcome, tuple):
                ev.note, resync = outcome
                ev.reroute_s = None if resync is None else round(resync, 4)
            else:
                ev.note = str(outcome or "")
        except Exception as exc:  # reported in the results, the replay goes on
            ev.error = str(exc) or type(exc).__name__
        ev.action_s = round(self.clock() - t0, 4)

    def finish(self, timeout_s: float = 30.0) -> list[FaultEvent]:
        """Cancel faults that have not fired, wait for running actions; return every event."""
        self._cancel.set()
        deadline = self.clock() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - self.clock()))
        return self.events


def fault_line(rec: Mapping[str, Any]) -> str:
    """One line for a fault record of ``results.json`` (``emu replay`` prints these)."""
    if rec.get("fired_s") is None:
        return f"# fault {rec['spec']}: {rec.get('note') or 'not fired'}"
    parts = [f"# fault {rec['spec']}: fired at {rec['fired_s']:.3f} s"]
    if rec.get("reroute_s") is not None:
        parts.append(f"controller done after {rec['reroute_s'] * 1000:.0f} ms")
    affected = rec.get("affected_transfers") or []
    if affected:
        parts.append(f"{len(affected)} planned transfers crossed the link")
    if rec.get("error"):
        parts.append(f"error: {rec['error']}")
    elif rec.get("note"):
        parts.append(rec["note"])
    return ", ".join(parts)
