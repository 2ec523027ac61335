"""Flows sharing links max-min fairly as time passes: the timing model's rule 4, one event at a time.

:class:`FluidLinks` holds the flows under way on a set of directed links of
known capacity (bytes/s). A flow starts with its links and bytes at a time;
whenever one starts or drains, every flow's rate is recomputed by progressive
filling (:func:`emulator.model.prediction.cost.maxmin_rates`, the timing
model's own), so a flow drains exactly when the timing model says it does.

The interconnect's arbiter (:mod:`emulator.emulation.agents.interconnect`) runs it in real
time: it calls :meth:`FluidLinks.start` as senders report their transfers,
asks :meth:`FluidLinks.next_drain` when to wake, and :meth:`FluidLinks.advance`
hands it the flows drained by then, each with the time it drained (however
late the arbiter woke).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from emulator.model.prediction.cost import Link, maxmin_rates

#: A flow whose bytes left are below this share of its size has drained (float rounding).
_EPS = 1e-9


@dataclass
class _Flow:
    links: tuple[Link, ...]
    size: float
    left: float
    rate: float = 0.0


@dataclass(frozen=True)
class Drained:
    """A flow whose last byte is through, and when."""

    flow: Hashable
    at: float


class FluidLinks:
    """Flows on directed links of fixed capacities (bytes/s), shared max-min fairly; see the module docstring."""

    def __init__(self, capacity: dict[Link, float]):
        self.capacity = dict(capacity)
        self.now = float("-inf")  # the time the flows' bytes left are counted at
        self._flows: dict[Hashable, _Flow] = {}

    @property
    def active(self) -> int:
        return len(self._flows)

    def start(self, flow: Hashable, links: Sequence[Link], nbytes: float, at: float) -> list[Drained]:
        """Flow ``flow`` starts at ``at`` (not before the last event) over ``links`` with ``nbytes``; return the
        flows that drained before it started."""
        if flow in self._flows:
            raise ValueError(f"flow {flow!r} is already under way")
        unknown = [link for link in links if link not in self.capacity]
        if unknown:
            raise ValueError(f"flow {flow!r}: no link {unknown[0]}")
        drained = self.advance(at)
        if nbytes <= 0:
            return [*drained, Drained(flow, self.now)]
        self._flows[flow] = _Flow(tuple(links), float(nbytes), float(nbytes))
        self._reshare()
        return drained

    def next_drain(self) -> float | None:
        """When the next flow drains at today's rates (None: no flow under way)."""
        if not self._flows:
            return None
        return self.now + min(f.left / f.rate for f in self._flows.values())

    def advance(self, until: float) -> list[Drained]:
        """Move time to ``until`` (never back); return the flows that drained on the way, in order, each at its
        own time (rates change at every drain)."""
        out: list[Drained] = []
        if until <= self.now:
            return out
        if not self._flows:
            self.now = until
            return out
        while self._flows:
            step = min(f.left / f.rate for f in self._flows.values())
            if self.now + step > until:
                break
            self._move(step)
            done = [name for name, f in self._flows.items() if f.left <= _EPS * f.size]
            for name in done:
                del self._flows[name]
                out.append(Drained(name, self.now))
            self._reshare()
        if until > self.now:
            self._move(until - self.now)
        return out

    def _move(self, seconds: float) -> None:
        for f in self._flows.values():
            f.left = max(0.0, f.left - f.rate * seconds)
        self.now += seconds

    def _reshare(self) -> None:
        names = list(self._flows)
        if not names:
            return
        rates = maxmin_rates([list(self._flows[n].links) for n in names], self.capacity)
        for name, rate in zip(names, rates, strict=True):
            self._flows[name].rate = rate
