"""Whether a measurement can be trusted: three verdicts, the checks behind them, and the model's band.

Every check of a measurement ends one of three ways: it had its data and
passed, it had its data and failed (a flag names it), or it had no data to
decide on (it is *unchecked*, and says what was missing). :class:`Trust` holds
the failed checks' flags and the unchecked checks' names of a repetition, a
cell or a set of cells; its :attr:`Trust.verdict` is

* :attr:`Verdict.FLAGGED` when any check failed,
* else :attr:`Verdict.UNCHECKED` when any check had no data,
* else :attr:`Verdict.TRUSTED`: every check had its data and passed.

The checks, and where they are made: the machine's own (CPU idle, datapath
load, latency, the agents' lag: :func:`emulator.emulation.session.fidelity.assess`),
the clocks of a cluster (:mod:`emulator.runs.clocks`), the measured time
against the model's (:func:`model_check`, with :data:`REPLAY_BAND` or
:data:`MPI_BAND`), the data an MPI benchmark checked
(:func:`emulator.runs.allreduce_bench.data_check`), and flags added after a
cell ran (a failed probe, a damaged network).

Pure: it reads nothing and imports nothing but the standard library.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class Verdict(enum.Enum):
    """A check's, a repetition's or a cell's verdict; its value is the word the report and the files use."""

    TRUSTED = "trusted"
    FLAGGED = "flagged"
    UNCHECKED = "unchecked"


#: Flags that say something about a run without failing a check: ``uncalibrated`` only says the datapath's
#: capacity is the documented default (every other flag makes a repetition flagged).
NOTE_FLAGS = frozenset({"uncalibrated"})

#: The unchecked checks, and what each lacked (the report's words).
NO_FIDELITY = "fidelity"
CPU_IDLE = "cpu_idle"
CLOCKS = "clocks"
MODEL = "model"
DATA = "data"
UNCHECKED_WHY = {
    NO_FIDELITY: "no fidelity data",
    CPU_IDLE: "CPU idle unknown (its counters did not advance)",
    CLOCKS: "clocks not comparable (no per-step prediction, or a server's clock measured once)",
    MODEL: "no model time to compare with",
    DATA: "the benchmark did not check its data",
}

#: The flag of a cell whose measured/model time is outside its band.
MODEL_FLAG = "model_disagrees"


@dataclass(frozen=True)
class Trust:
    """The failed checks (``flags``) and the checks without data (``unchecked``) of a measurement."""

    flags: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()

    @property
    def verdict(self) -> Verdict:
        if self.flags:
            return Verdict.FLAGGED
        return Verdict.UNCHECKED if self.unchecked else Verdict.TRUSTED

    def __add__(self, other: Trust) -> Trust:
        """Both measurements' checks: the flags and the unchecked checks of either."""
        return Trust(tuple(sorted({*self.flags, *other.flags})), tuple(sorted({*self.unchecked, *other.unchecked})))

    def without(self, check: str, flag: str) -> Trust:
        """These checks but one: ``check`` left out of the unchecked ones and ``flag`` out of the flags."""
        return Trust(tuple(f for f in self.flags if f != flag), tuple(u for u in self.unchecked if u != check))

    def text(self) -> str:
        """``trusted``, ``flagged: over_capacity, model_disagrees`` or ``unchecked: no fidelity data``."""
        if self.flags:
            return "flagged: " + ", ".join(self.flags)
        if self.unchecked:
            return "unchecked: " + ", ".join(UNCHECKED_WHY.get(u, u) for u in self.unchecked)
        return Verdict.TRUSTED.value

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "flags": list(self.flags), "unchecked": list(self.unchecked)}


def combine(parts: Iterable[Trust]) -> Trust:
    """Every part's checks together; no part at all is a measurement nothing checked (unchecked)."""
    parts = list(parts)
    if not parts:
        return Trust(unchecked=(NO_FIDELITY,))
    total = Trust()
    for part in parts:
        total += part
    return total


def flags_check(flags: Iterable[str], passed: bool) -> Trust:
    """A repetition's fidelity flags as a check: flagged with every flag but :data:`NOTE_FLAGS`, and
    ``untrusted`` when the record says it did not pass (``passed`` False) without naming a flag that fails."""
    failed = tuple(sorted({f for f in flags if f not in NOTE_FLAGS}))
    return Trust(flags=failed or (() if passed else ("untrusted",)))


@dataclass(frozen=True)
class ModelBand:
    """How far a measured/model time may be from 1 before the cell is flagged :data:`MODEL_FLAG`."""

    accuracy: float  # the ratio must lie within 1 - accuracy .. 1 + accuracy
    source: str  # where the accuracy is documented

    @property
    def low(self) -> float:
        return 1.0 - self.accuracy

    @property
    def high(self) -> float:
        return 1.0 + self.accuracy

    def contains(self, ratio: float) -> bool:
        return self.low <= ratio <= self.high

    def text(self) -> str:
        """``0.90-1.10``."""
        return f"{self.low:.2f}-{self.high:.2f}"


#: A replay's measured/predicted time (a collective, a training or language-model iteration): ±10 %, the accuracy
#: docs/testing-accuracy.md holds every integration check to and docs/fidelity.md states (``make bench``'s replays;
#: the latest experiments' cells: default 0.96-1.08, resnet50 1.01-1.07, scale 1.00-1.04, clusters 1.00-1.08,
#: llm 1.00-1.06). tests/integration/measured.py's ``BENCH_ACCURACY`` is this figure.
REPLAY_BAND = ModelBand(0.10, "docs/testing-accuracy.md: a replay's measured/predicted time, ±10 %")
#: An MPI cell's benchmark time at its largest size over the model of Open MPI's algorithm: ±15 %, what
#: docs/fidelity.md holds Open MPI with the fabric's latency to (issue 29, item 4; the latest grid 0.98-1.08).
MPI_BAND = ModelBand(0.15, "docs/fidelity.md: Open MPI's benchmark with the fabric's latency, ±15 % (issue 29)")


def model_check(ratio: float | None, band: ModelBand) -> Trust:
    """The measured/model time against ``band``: unchecked without a model time, flagged outside the band."""
    if ratio is None:
        return Trust(unchecked=(MODEL,))
    return Trust() if band.contains(ratio) else Trust(flags=(MODEL_FLAG,))


@dataclass(frozen=True)
class Tally:
    """How many measurements are trusted, flagged (with each flag's count) and unchecked (with each reason's)."""

    trusted: int = 0
    flagged: int = 0
    unchecked: int = 0
    flags: dict[str, int] = field(default_factory=dict)
    why_unchecked: dict[str, int] = field(default_factory=dict)

    @property
    def measured(self) -> int:
        return self.trusted + self.flagged + self.unchecked

    def to_json(self) -> dict[str, Any]:
        return {"measured": self.measured, "trusted": self.trusted, "flagged": self.flagged,
                "unchecked": self.unchecked, "flags": dict(self.flags), "why_unchecked": dict(self.why_unchecked)}


def tally(trusts: Iterable[Trust | None]) -> Tally:
    """The verdicts of measured cells counted (None: a cell not measured, left out); an unchecked reason counts
    only for the cells it leaves unchecked (a flagged cell's count is its flags')."""
    verdicts: Counter[Verdict] = Counter()
    flags: Counter[str] = Counter()
    why: Counter[str] = Counter()
    for t in trusts:
        if t is None:
            continue
        verdicts[t.verdict] += 1
        flags.update(t.flags)
        if t.verdict is Verdict.UNCHECKED:
            why.update(t.unchecked)
    return Tally(verdicts[Verdict.TRUSTED], verdicts[Verdict.FLAGGED], verdicts[Verdict.UNCHECKED],
                 dict(sorted(flags.items())), dict(sorted(why.items())))
