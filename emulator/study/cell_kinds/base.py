"""The cell-kind interface: what the runner, the run folder and the report need of one kind of cell.

:class:`CellKind` is the interface; :mod:`emulator.study.cell_kinds.replay` and
:mod:`emulator.study.cell_kinds.mpi` implement it, and :class:`Kinds` picks a
cell's kind (the first kind of its tuple that claims the cell). The types the
kinds share live here too: :class:`Session` (what a cell runs on),
:class:`Results` (a cell's ``results.json`` as its kind reads it),
:class:`Row` (a cell in the report and in ``cells.csv``, whose columns are
:data:`CSV_FIELDS`) and :class:`PlanDefaults` (what a row falls back on). A plan entry's fabric profile is
parsed once, as its row is made (:func:`read_fabric`), and the row carries the profile.

Pure: nothing here starts a process or touches a network; a kind that needs a
live runner (an MPI program's) is given it when it is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from emulator.base.errors import UserError
from emulator.model import fabric
from emulator.model.fabric import FabricProfile
from emulator.model.prediction.check import CheckReport
from emulator.model.schedule.format import Schedule
from emulator.runs import trust as checks
from emulator.runs.fault_plan import Fault
from emulator.runs.results import CellResults, ProbeVerdict
from emulator.runs.trust import Trust, Verdict
from emulator.study import experiment as xp
from emulator.study.folder.cell_state import CellState

#: The columns of ``cells.csv``, every kind's row (:meth:`Row.csv`) leaving empty those that do not apply.
CSV_FIELDS = ("id", "series", "topology", "kind", "hosts", "routing", "seed", "collective", "algorithm", "placement",
              "size", "workload", "status", "outcome", "busbw_mbps", "busbw_min_mbps", "busbw_max_mbps", "time_s",
              "predicted_time_s", "predicted_busbw_mbps", "alpha_beta_time_s", "measured_over_predicted",
              "iteration_s", "compute_only_s", "scaling_efficiency", "predicted_scaling_efficiency",
              "max_flows_per_link", "trusted", "flags", "qdisc_drops", "tcp_retransmits", "repetitions", "wall_s",
              "error", "program", "ranks", "exit_status")


class Session(Protocol):
    """What a cell runs on: a started network (:class:`emulator.emulation.session.replay.ReplaySession`)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def bringup_s(self) -> float | None: ...

    def damage(self) -> str | None: ...

    def run(self, schedule: Schedule, out: str, *, repeat: int = ..., warmup: int = ...,
            timeout_s: float | None = ..., config: dict[str, Any] | None = ..., report: CheckReport | None = ...,
            fault_plan: Sequence[Fault] = ...) -> CellResults: ...


class Results(Protocol):
    """A cell's ``results.json`` as its kind reads it: ``status`` ``ok`` when the cell finished, ``config['cell']``
    the cell it is of (:meth:`emulator.study.experiment.Cell.to_json`)."""

    status: str
    config: dict[str, Any]
    error: str | None


class Row(Protocol):
    """A planned cell as the report sees it: what every section that lists cells of any kind reads."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...  # ok, failed, interrupted, not run

    @property
    def datapath(self) -> str | None: ...

    @property
    def flags(self) -> list[str]: ...

    @property
    def trust(self) -> Trust | None: ...  # None: not measured

    @property
    def error(self) -> str | None: ...

    def csv(self) -> dict[str, Any]:
        """The row of ``cells.csv``: every column of :data:`CSV_FIELDS`."""
        ...


class TrustedRow:
    """What a row's ``trust`` (None: not measured) says, in the words each reader needs; a row class inherits it."""

    trust: Trust | None

    @property
    def verdict(self) -> Verdict | None:
        return self.trust.verdict if self.trust is not None else None

    @property
    def trusted(self) -> bool | None:
        """Every check had its data and passed (unchecked is not trusted); None when not measured."""
        return self.verdict is Verdict.TRUSTED if self.trust is not None else None

    @property
    def measurement_trusted(self) -> bool:
        """Every check but the model's had its data and passed: the measurement, whatever the model says of it
        (the cells the model's error is measured on)."""
        return self.trust is not None and \
            self.trust.without(checks.MODEL, checks.MODEL_FLAG).verdict is Verdict.TRUSTED

    def trust_text(self) -> str:
        """``trusted``, ``flagged: ...``, ``unchecked: ...`` (:meth:`Trust.text`), ``–`` when not measured."""
        return self.trust.text() if self.trust is not None else "–"

    def trust_word(self) -> str:
        """``cells.csv``'s ``trusted`` column: the verdict's word, empty when not measured."""
        return self.verdict.value if self.verdict is not None else ""


class PlanDefaults(Protocol):
    """What a row falls back on when its cell's results lack it (the report's ``Plan`` has these)."""

    @property
    def link_mbps(self) -> float: ...

    @property
    def fabric(self) -> FabricProfile | None: ...  # None for runs older than fabric profiles


def read_fabric(raw: Any) -> FabricProfile | None:
    """The fabric profile of a file written earlier (a plan entry's ``fabric``); None when it has none (older than
    fabric profiles) or one that does not parse (a damaged file: the row then goes on without it)."""
    if not raw:
        return None
    try:
        return fabric.FabricProfile.from_spec(raw)  # any JSON value: what is not a profile raises FieldError
    except UserError:
        return None


R = TypeVar("R", bound=Results)


class CellKind(Protocol[R]):
    """One kind of cell through every layer: how it runs, how its results are read and flagged, its lines.

    ``name`` names the kind (``replay``, ``mpi``); ``predicted``: the timing model predicts its cells' time, so a
    finished cell's wall time corrects the run's ETA.
    """

    name: str
    predicted: bool

    def claims(self, cell: xp.Cell) -> bool:
        """Whether ``cell`` is of this kind."""
        ...

    def claims_entry(self, entry: Mapping[str, Any]) -> bool:
        """Whether a cell of the plan (``experiment.json``'s ``cells``: a cell's JSON) is of this kind."""
        ...

    def run(self, session: Session, pc: xp.PreparedCell, out: str, *, config: dict[str, Any],
            echo: Callable[[str], None]) -> None:
        """Run the cell on the started ``session`` into ``out`` (an empty directory), writing its
        ``results.json`` as it goes (``config`` added to the results' own); raises when the cell fails."""
        ...

    def read(self, data: Mapping[str, Any]) -> R | None:
        """A ``results.json`` document as results of this kind; None when it is another kind's or unreadable."""
        ...

    def save(self, path: str, res: R, probe: ProbeVerdict | None) -> None:
        """Write ``res`` to ``path`` with its network's ``probe`` (kept as it is when None)."""
        ...

    def failure(self, res: R | None) -> str:
        """Why a cell whose run returned did not finish, from its results (None: it wrote none of this kind)."""
        ...

    def flag(self, res: R, name: str) -> None:
        """Flag the results with the fidelity flag ``name`` (which makes them untrusted)."""
        ...

    def line(self, res: R) -> str:
        """The tail of a finished cell's progress line (after its id)."""
        ...

    def row(self, entry: Mapping[str, Any], res: R | None, state: CellState | None, plan: PlanDefaults,
            cell_dir: str) -> Row:
        """The cell's row in the report from its plan entry, its results and its ``state.json`` entry (either of
        the last two may be missing)."""
        ...


class Kinds:
    """The kinds an experiment's cells may be of, in order: a cell is of the first that claims it."""

    def __init__(self, kinds: Sequence[CellKind[Any]]):
        self.kinds = tuple(kinds)

    def __iter__(self) -> Iterator[CellKind[Any]]:
        return iter(self.kinds)

    def of(self, cell: xp.Cell) -> CellKind[Any]:
        """The kind of ``cell``; LookupError when none claims it."""
        for kind in self.kinds:
            if kind.claims(cell):
                return kind
        raise LookupError(f"cell {cell.id}: no cell kind claims it (kinds: {self.names()})")

    def of_entry(self, entry: Mapping[str, Any]) -> CellKind[Any]:
        """The kind of a cell of the plan (its JSON); LookupError when none claims it."""
        for kind in self.kinds:
            if kind.claims_entry(entry):
                return kind
        raise LookupError(f"cell {entry.get('id')}: no cell kind claims it (kinds: {self.names()})")

    def names(self) -> str:
        return ", ".join(k.name for k in self.kinds)

    def replace(self, kind: CellKind[Any]) -> Kinds:
        """These kinds with ``kind`` in place of the one of the same name."""
        return Kinds([kind if k.name == kind.name else k for k in self.kinds])
